"""CuPy arrays as the source of an exchange."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _backends, dtypes
from ..arrays import Target, target_str
from ..streams import cupy_consumer_handle, same_stream, torch_stream_handle
from ..transfer import copy_to_device, copy_to_host
from . import _numpy
from ._layout import copy_required, layout_in_words, pytorch_cannot_share
from ._torch import ALREADY_CURRENT, cupy_index, refuse_split_capture, same_cuda

if TYPE_CHECKING:
    import cupy
    import torch

__all__: list[str] = []


def to_numpy(c: cupy.ndarray, copy: bool | None) -> np.ndarray:
    """``to_numpy`` of a CuPy array: always a host copy."""
    if copy is False:
        raise copy_required(f"a CuPy array on cuda:{c.device.id} (to_numpy returns host memory)")
    return copy_to_host(c)


def to_torch(c: cupy.ndarray, target: Target | None, copy: bool | None) -> torch.Tensor:
    """``to_torch`` of a CuPy array: shared on its device, else copied."""
    _backends.torch()  # BackendUnavailableError before any work
    if target is None or same_cuda(c.device.id, target):
        return _share_with_torch(c, copy)
    if copy is False:
        raise copy_required(f"moving a CuPy array to {target_str(target)}")
    if target[0] == "cpu":
        return _numpy.share_with_torch(copy_to_host(c), None)
    th = _backends.require_torch_cuda()
    return _torch_copy_of(c, th.cuda.current_device() if target[1] is None else target[1])


def _share_with_torch(c: cupy.ndarray, copy: bool | None) -> torch.Tensor:
    """A CUDA tensor sharing ``c``'s memory where PyTorch can, else a copy."""
    th = _backends.require_torch_cuda()
    index = int(c.data.device_id)
    shape = c.shape
    plain = (  # the common case, answered first: what PyTorch takes as it is
        c.flags.c_contiguous and 0 not in shape and 1 not in shape and not c.data.ptr % c.itemsize
    )
    pack = not plain and c.size > 0 and pytorch_cannot_share(c)
    if pack and copy is False:
        raise copy_required(f"an array with {layout_in_words(c)}")
    if pack or (copy and c.size > 0):
        return _torch_copy_of(c, index)  # a C-contiguous, aligned result
    cp = _backends.cupy()
    # CuPy's device only: torch.from_dlpack names the array's device itself
    # (so PyTorch's current stream there is the consumer it names to
    # __dlpack__), and CuPy's __dlpack__ orders that stream after CuPy's
    # current stream (the producer's) of the current device. Usually that
    # device is current already: then nothing is switched.
    here = cp.cuda.runtime.getDevice() == index
    with ALREADY_CURRENT if here else cp.cuda.Device(index):
        if c.size == 0 and (copy or pytorch_cannot_share(c)):
            c = cp.empty(c.shape, c.dtype)  # nothing to share: no strides to export
        current = cp.cuda.get_current_stream()
        if not same_stream(cupy_consumer_handle(current), torch_stream_handle(index)):
            refuse_split_capture("to_torch", current)
        return th.from_dlpack(c)


def _torch_copy_of(x: Any, index: int) -> torch.Tensor:
    """A new C-contiguous CUDA tensor on device ``index`` holding device array
    ``x``'s values: allocated by PyTorch on its current stream there and filled
    by one copy ordered both ways with ``x``'s library's current stream (so
    ``x`` may be dropped as soon as this returns)."""
    th = _backends.torch()
    dtype = dtypes.torch_dtype_of_numpy(np.dtype(x.dtype))
    out = th.empty(tuple(x.shape), dtype=dtype, device=th.device("cuda", index))
    return copy_to_device(x, out)


def to_cupy(c: cupy.ndarray, target: Target | None, copy: bool | None) -> cupy.ndarray:
    """``to_cupy`` of a CuPy array: itself, or a copy (on ``target``'s device).
    A copy is allocated on CuPy's current stream there (refused inside a
    capture that forbids it) and filled by one copy ordered both ways with
    CuPy's current stream, across devices by a peer copy."""
    _backends.require_cupy_device()
    index = int(c.device.id)
    if target is not None and cupy_index(target[1]) != index:  # never 'cpu': refused before
        if copy is False:
            raise copy_required(f"moving a CuPy array to {target_str(target)}")
        index = cupy_index(target[1])
    elif not copy:
        return c
    return copy_to_device(c, device=index)
