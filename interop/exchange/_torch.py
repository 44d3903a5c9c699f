"""PyTorch tensors as the source of an exchange, and CUDA exchanges' device and stream rules."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _backends, arrays, dtypes, streams
from ..errors import CaptureError
from ..transfer import copy_to_device, copy_to_host
from ._layout import copy_required, readonly_if_broadcast
from ._numpy import share_with_torch, torch_copy

if TYPE_CHECKING:
    import cupy
    import torch

    from ..arrays import Target


def plain_numpy_view(t: torch.Tensor) -> np.ndarray | None:
    """``t.numpy()`` for a plain CPU tensor (to_numpy's common case, answered first), else None."""
    if t.requires_grad or t.is_conj() or t.is_neg() or not t.is_cpu:
        return None
    try:
        a = t.numpy()  # refuses what it cannot share: bfloat16, sparse, nested, ...
    except (TypeError, RuntimeError):
        return None
    return readonly_if_broadcast(a) if 0 in a.strides else a


def _resolve_bits(t: torch.Tensor, copy: bool | None) -> tuple[torch.Tensor, bool]:
    """Materialise the conjugate/negative bits; return (tensor, copied)."""
    if not (t.is_conj() or t.is_neg()):
        return t, False
    bit = "the conjugate bit" if t.is_conj() else "the negative bit"
    if copy is False:
        raise copy_required(f"a tensor with {bit} set (its memory holds other values)")
    return t.resolve_conj().resolve_neg(), True


def to_numpy(t: torch.Tensor, copy: bool | None) -> np.ndarray:
    """``to_numpy`` of a tensor: CPU data shared, device data copied."""
    arrays.check_tensor(t, "to_numpy")
    t = t.detach() if t.requires_grad else t
    if t.is_cuda:
        if copy is False:
            raise copy_required(f"a tensor on {t.device} (to_numpy returns host memory)")
        return copy_to_host(t)  # which refuses a dtype NumPy cannot hold before any work
    t, copied = _resolve_bits(t, copy)
    arr = dtypes.numpy_view_of_cpu_tensor(t)
    if copy and not copied:
        return arr.copy(order="K")
    return readonly_if_broadcast(arr)


def to_torch(t: torch.Tensor, target: Target | None, copy: bool | None) -> torch.Tensor:
    """``to_torch`` of a tensor: itself (detached), a clone, or a move."""
    arrays.check_tensor(t, "to_torch", data=False)
    if t.is_cuda or (target is not None and target[0] == "cuda"):
        _backends.check_not_forked()  # PyTorch's own error would not say what to do
    t = t.detach() if t.requires_grad else t
    if target is None or _same_device(t, target):
        return t.clone() if copy else t
    if copy is False:
        raise copy_required(f"moving a tensor from {t.device} to {arrays.target_str(target)}")
    if target[0] == "cpu":  # bits are applied chunk by chunk by copy_to_host
        return share_with_torch(copy_to_host(t), None)
    if t.device.type == "cpu":
        return torch_copy(t, target[1])
    return t.to(_backends.torch().device("cuda", target[1]))


def _same_device(t: torch.Tensor, target: Target) -> bool:
    kind, index = target
    if t.device.type != kind or kind == "cpu":
        return t.device.type == kind
    return t.device.index == (_backends.torch().cuda.current_device() if index is None else index)


def to_cupy(t: torch.Tensor, target: Target | None, copy: bool | None) -> cupy.ndarray:
    """``to_cupy`` of a tensor: CUDA data shared on its device, anything else copied."""
    arrays.check_tensor(t, "to_cupy")  # before the device: a bad argument anywhere
    _backends.require_cupy_device()
    dtypes.check_cupy_dtype(t.dtype)  # before DLPack, whose error would not say what to do
    t = t.detach() if t.requires_grad else t
    if t.is_cuda and (target is None or t.get_device() == cupy_index(target[1])):
        if not copy or t.is_conj() or t.is_neg():  # bits are applied into a copy, shared
            return _export_to_cupy(t, copy)
        index = t.get_device()
    elif copy is False:
        if t.is_cuda and target is not None:
            raise copy_required(f"moving a tensor from {t.device} to {arrays.target_str(target)}")
        raise copy_required(f"a tensor on {t.device} (to_cupy returns device memory)")
    else:
        index = cupy_index(None if target is None else target[1])
    return copy_to_device(t, device=index)  # ordered both ways: t may be dropped at once


def _export_to_cupy(t: torch.Tensor, copy: bool | None) -> cupy.ndarray:
    """A CuPy array sharing a CUDA tensor's memory, on CuPy's current stream."""
    index = t.get_device()
    t, copied = _resolve_bits(t, copy)
    with export_context(index):
        cp = _backends.cupy()
        handle = cupy_stream_handle("to_cupy", index)
        if handle == streams.PER_THREAD_DEFAULT:
            # PyTorch's __dlpack__ refuses the per-thread default stream: ordered here
            ready = cp.cuda.Event(disable_timing=True)
            ready.record(streams.cupy_stream(streams.torch_stream_handle(index), index))
            streams.cupy_stream(handle, index).wait_event(ready)
            c = cp.from_dlpack(streams.Unsynchronised(t))
        else:
            c = cp.from_dlpack(t)
        if copied:
            # not reused by PyTorch's pool before the work CuPy queued on it is done
            t.record_stream(streams.torch_stream(handle, index))
        return c


ALREADY_CURRENT = contextlib.nullcontext()


def export_context(index: int) -> contextlib.AbstractContextManager[Any]:
    """Device ``index`` current for PyTorch and CuPy while one of its tensors is exported."""
    # PyTorch's __dlpack__ refuses another device's tensor; a switch costs microseconds
    cp = _backends.cupy()
    if cp.cuda.runtime.getDevice() == index and _backends.torch().cuda.current_device() == index:
        return ALREADY_CURRENT
    return cuda_context(index)


@contextlib.contextmanager
def cuda_context(index: int) -> Iterator[None]:
    """Make device ``index`` current for both PyTorch (if imported) and CuPy."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(_backends.cupy().cuda.Device(index))
        if "torch" in sys.modules and _backends.torch().cuda.is_available():
            stack.enter_context(_backends.torch().cuda.device(index))
        yield


def cupy_stream_handle(func: str, index: int) -> int:
    """CuPy's current stream's handle on the current device ``index``; refuses a split capture."""
    current = _backends.cupy().cuda.get_current_stream()
    # CuPy's null stream is the per-thread one under CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1
    handle = streams.cupy_consumer_handle(current)
    if streams.same_stream(handle, streams.torch_stream_handle(index)):
        return handle
    # ordering one after the other would break the capture; called before anything is queued
    th, capturing = _backends.torch(), streams.capturing
    if capturing(current.is_capturing) or capturing(th.cuda.is_current_stream_capturing):
        raise CaptureError(
            f"{func} expected PyTorch and CuPy to use one stream inside CUDA graph capture (got "
            "two); run the block under `with interop.stream(s):`, s the capturing stream"
        )
    return handle


def cupy_index(index: int | None) -> int:
    """``index``, or CuPy's current device for None."""
    return _backends.cupy().cuda.runtime.getDevice() if index is None else index
