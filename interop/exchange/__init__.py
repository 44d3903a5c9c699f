"""Zero-copy exchange between NumPy, PyTorch and CuPy: ``to_numpy``,
``to_torch``, ``to_cupy``.

The rules (docs/exchange.md), in one place:

* Memory is shared whenever sharing gives the right values. Where it cannot
  (conjugate/negative bits, negative strides into PyTorch, non-native byte
  order, a different device) ``copy=None`` copies and ``copy=False`` raises
  :class:`~interop.errors.CopyRequiredError` before doing any work.
* Inputs that a library would mis-handle are never handed to it: arrays with
  negative strides never reach ``torch.from_dlpack`` (which aborts the process
  on them), tensors with the negative bit never reach ``numpy.from_dlpack``
  (which ignores the bit and returns wrong values).
* ``bfloat16``/``float8`` cross to NumPy as ``ml_dtypes`` dtypes through a
  same-sized integer view, without a copy.
* Stream order (docs/streams.md): device exports go through ``__dlpack__(stream=...)``
  with the consumer's current stream, in the data's device context, so the
  consumer may use the result at once on its current stream. Nothing here calls
  ``cudaDeviceSynchronize``.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _backends, dtypes
from .arrays import (
    DL_CPU,
    DL_CUDA,
    DL_CUDA_HOST,
    DL_CUDA_MANAGED,
    Target,
    array_source,
    check_strided_tensor,
    check_tensor_data,
    cupy_from_dlpack,
    dlpack_device,
    host_from_dlpack,
    is_array,
    not_an_array,
    numpy_view_of_cpu_tensor,
    parse_device,
    plain_cpu_tensor_view,
    target_str,
)
from .errors import (
    BackendUnavailableError,
    CaptureError,
    CopyRequiredError,
    InvalidTypeError,
    InvalidValueError,
    NoDeviceError,
    ReadOnlyWarning,
)
from .pipeline.start import device_to_device
from .streams import (
    PER_THREAD_DEFAULT,
    Unsynchronised,
    capturing,
    cupy_consumer_handle,
    cupy_stream,
    same_stream,
    torch_stream,
    torch_stream_handle,
)
from .transfer import copy_to_device, copy_to_host

if TYPE_CHECKING:
    import cupy
    import torch

__all__ = ["to_cupy", "to_numpy", "to_torch"]


# --------------------------------------------------------------------------- helpers


def _check_copy(copy: object) -> None:
    if copy is not None and not isinstance(copy, bool):
        raise InvalidTypeError(f"expected copy to be None, True or False (got {copy!r})")


def _copy_required(what: str, how: str = "pass copy=None or copy=True") -> CopyRequiredError:
    return CopyRequiredError(f"copy=False, but {what} needs a copy; {how}")


def _negative_strides(strides: tuple[int, ...] | None) -> bool:
    return bool(strides) and min(strides or (0,)) < 0


def _odd_strides(strides: tuple[int, ...] | None, itemsize: int) -> bool:
    """True if a byte stride is not a multiple of the itemsize (a field of a
    structured array, an ``as_strided`` view): PyTorch and DLPack count
    strides in elements, so such a view cannot be shared with them."""
    if not strides or itemsize <= 1:
        return False
    for st in strides:  # noqa: SIM110 (a loop: any() with a generator costs twice as much here)
        if st % itemsize:
            return True
    return False


def _misaligned(a: Any) -> bool:
    """True if ``a``'s first element is not at a multiple of its itemsize.

    PyTorch assumes element alignment (``complex128`` on 16 bytes) and its
    kernels crash the interpreter on such memory (or fault the GPU), where
    NumPy copes: a view at a byte offset into a buffer cannot be shared.
    """
    if not a.size or a.dtype.itemsize <= 1:
        return False
    address = int(a.ctypes.data) if isinstance(a, np.ndarray) else int(a.data.ptr)
    return address % a.dtype.itemsize != 0


def _pytorch_cannot_share(a: Any) -> bool:
    strides, itemsize = a.strides, a.dtype.itemsize
    if _negative_strides(strides) or _odd_strides(strides, itemsize):
        return True
    if isinstance(a, np.ndarray) and a.dtype.alignment == itemsize and a.flags.aligned:
        return False  # NumPy checked the address already (the common, fast case)
    return _misaligned(a)


def _layout_in_words(a: Any) -> str:
    """What PyTorch cannot take about ``a``'s layout, for a message."""
    if _negative_strides(a.strides):
        return f"negative strides {a.strides} (PyTorch has none)"
    if _odd_strides(a.strides, a.dtype.itemsize):
        return (
            f"byte strides {a.strides} that are not multiples of its itemsize "
            f"{a.dtype.itemsize} (PyTorch counts strides in elements)"
        )
    return (
        f"data at a byte offset that is not a multiple of its itemsize {a.dtype.itemsize} "
        "(PyTorch needs aligned elements)"
    )


def _normalise_strides(a: np.ndarray) -> np.ndarray:
    """A zero-copy view whose size-1 axes have stride 0 (a negative or odd
    stride on an axis of length 1 is never used, but PyTorch refuses it); a
    zero-size array becomes a fresh empty one (there is no data to share).
    Called for arrays PyTorch cannot share as they are."""
    if a.size == 0:
        return np.empty(a.shape, a.dtype)
    fixed = tuple(0 if n == 1 else st for st, n in zip(a.strides, a.shape, strict=True))
    if fixed == a.strides:
        return a
    # through a same-sized integer view: as_strided cannot spell ml_dtypes types
    bits = a.view(dtypes.int_view_of_numpy(a.dtype))
    return np.lib.stride_tricks.as_strided(bits, a.shape, fixed, subok=True).view(a.dtype)


def _readonly_if_broadcast(arr: np.ndarray) -> np.ndarray:
    """Mark a zero-stride (broadcast) view read-only, as ``numpy.broadcast_to`` does."""
    if (
        arr.size
        and arr.flags.writeable
        and any(st == 0 and n > 1 for st, n in zip(arr.strides, arr.shape, strict=True))
    ):
        arr = arr.view()
        arr.flags.writeable = False
    return arr


_ALREADY_CURRENT = contextlib.nullcontext()


def _torch_export_context(index: int) -> contextlib.AbstractContextManager[Any]:
    """Device ``index`` current for PyTorch and CuPy while a CUDA tensor of that
    device is exported to CuPy: PyTorch's ``__dlpack__`` refuses another
    device's tensor and orders the current device's stream; CuPy names its
    current device's stream. Usually both are current already, and then nothing
    is switched (two runtime queries, where switching and back costs several
    microseconds)."""
    cp = _backends.cupy()
    if cp.cuda.runtime.getDevice() == index and _backends.torch().cuda.current_device() == index:
        return _ALREADY_CURRENT
    return _cuda_context(index)


@contextlib.contextmanager
def _cuda_context(index: int) -> Iterator[None]:
    """Make device ``index`` current for both PyTorch (if imported) and CuPy."""
    with contextlib.ExitStack() as stack:
        cp = _backends.cupy()
        stack.enter_context(cp.cuda.Device(index))
        if "torch" in sys.modules:
            th = _backends.torch()
            if th.cuda.is_available():
                stack.enter_context(th.cuda.device(index))
        yield


# ----------------------------------------------------------------- host <-> device


def _device_to_host(x: Any) -> np.ndarray:
    """A fresh host copy of a CuPy array or CUDA tensor (bits resolved)."""
    return copy_to_host(x)


def _host_to_cupy(a: Any, index: int | None) -> cupy.ndarray:
    """A new CuPy array holding host data (NumPy or CPU tensor), streamed
    through the pinned ring of :func:`interop.copy_to_device`."""
    return copy_to_device(a, device=index)


def _host_to_torch(t: Any, index: int | None) -> torch.Tensor:
    """A new CUDA tensor holding host data's values (a CPU tensor or a NumPy
    array, any strides; conjugate/negative bits applied chunk by chunk).

    Streams through :func:`interop.copy_to_device` when CuPy can drive the
    copy; with PyTorch alone, falls back to ``Tensor.to`` (which stages the
    whole tensor in pinned memory).
    """
    th = _backends.require_torch_cuda()
    device = th.device("cuda", th.cuda.current_device() if index is None else index)
    try:
        _backends.require_cupy_device()
    except (BackendUnavailableError, NoDeviceError):
        if isinstance(t, np.ndarray):
            t = _torch_from_numpy(t, True)  # a private copy: no read-only warning
        return t.resolve_conj().resolve_neg().to(device)
    dtype = dtypes.torch_dtype_of_numpy(t.dtype) if isinstance(t, np.ndarray) else t.dtype
    out = th.empty(tuple(t.shape), dtype=dtype, device=device)
    return copy_to_device(t, out)


# --------------------------------------------------------------------------- fast paths

# The exchange's common cases, answered before the general rules: a writable,
# aligned, C-contiguous NumPy array of a dtype PyTorch shares as it is, to
# torch; a plain CPU tensor, to NumPy. Anything else takes the general path,
# which gives the same result where both apply.
_TENSOR: list[Any] = [None]  # torch.Tensor once torch was imported here
_SHAREABLE: dict[np.dtype, bool] = {}  # native dtypes torch.from_numpy takes as they are


def _torch_fast(a: np.ndarray) -> torch.Tensor | None:
    dtype = a.dtype
    ok = _SHAREABLE.get(dtype)
    if ok is None:
        ok = _SHAREABLE[dtype] = _shareable(dtype)
    flags = a.flags
    if not (ok and flags.c_contiguous and flags.aligned and flags.writeable):
        return None
    shape = a.shape
    if 1 in shape or 0 in shape:  # C-contiguous, yet any stride on such an axis: see the rules
        return None
    th = _backends.torch()
    _TENSOR[0] = th.Tensor
    return th.from_numpy(a)


def _shareable(dtype: np.dtype) -> bool:
    # NumPy's "aligned" means aligned to dtype.alignment, which for complex128 is
    # 8: PyTorch needs the whole itemsize (the general path checks the address)
    if not dtype.isnative or not dtypes.is_standard(dtype) or dtype.alignment != dtype.itemsize:
        return False
    try:
        dtypes.torch_dtype_of_numpy(dtype)
    except Exception:
        return False
    return True


def _numpy_fast(t: torch.Tensor) -> np.ndarray | None:
    a = plain_cpu_tensor_view(t)
    if a is None:
        return None
    return _readonly_if_broadcast(a) if 0 in a.strides else a


# --------------------------------------------------------------------------- to_numpy


def _resolve_bits(t: torch.Tensor, copy: bool | None) -> tuple[torch.Tensor, bool]:
    """Materialise the conjugate/negative bits; return (tensor, copied)."""
    if not (t.is_conj() or t.is_neg()):
        return t, False
    bit = "the conjugate bit" if t.is_conj() else "the negative bit"
    if copy is False:
        raise _copy_required(f"a tensor with {bit} set (its memory holds other values)")
    return t.resolve_conj().resolve_neg(), True


def _numpy_from_torch(t: torch.Tensor, copy: bool | None) -> np.ndarray:
    check_strided_tensor(t, "to_numpy")
    check_tensor_data(t, "to_numpy")
    if t.requires_grad:
        t = t.detach()
    if t.is_cuda:
        if copy is False:
            raise _copy_required(f"a tensor on {t.device} (to_numpy returns host memory)")
        dtypes.numpy_dtype_of_torch(t.dtype)
        return _device_to_host(t)
    t, copied = _resolve_bits(t, copy)
    arr = numpy_view_of_cpu_tensor(t)
    if copy and not copied:
        return arr.copy(order="K")
    return _readonly_if_broadcast(arr)


def _numpy_from_numpy(a: np.ndarray, copy: bool | None) -> np.ndarray:
    if copy:
        return a.copy(order="K")
    return _readonly_if_broadcast(a)


def _numpy_from_cupy(c: cupy.ndarray, copy: bool | None) -> np.ndarray:
    if copy is False:
        raise _copy_required(f"a CuPy array on cuda:{c.device.id} (to_numpy returns host memory)")
    return _device_to_host(c)


def to_numpy(x: Any, /, *, copy: bool | None = None) -> np.ndarray:
    """Return ``x`` as a NumPy array, sharing memory when that is correct.

    Parameters
    ----------
    x : array
        A NumPy array, a PyTorch tensor (CPU, pinned or CUDA), a CuPy array, or
        any object with ``__dlpack__`` or ``__cuda_array_interface__``.
    copy : bool or None
        ``None``: share memory when that gives the right values, else copy.
        ``False``: share memory or raise. ``True``: always an independent copy.

    Returns
    -------
    numpy.ndarray
        Host data. A shared result keeps ``x``'s memory alive. ``bfloat16`` and
        ``float8`` tensors give the ``ml_dtypes`` dtype of the same name without
        a copy. Broadcast (zero-stride) views and read-only sources give
        read-only results. A tensor with ``requires_grad`` gives a view of its
        detached data: writes bypass autograd.

    Notes
    -----
    Copy semantics: CPU data is shared; conjugate/negative-bit tensors are
    copied with the bit applied. Device data is always copied to the host,
    through the chunked pipeline of :func:`interop.copy_to_host`, ordered after
    the work queued on the producer's current stream; the call returns when the
    host copy is complete.

    Raises
    ------
    CopyRequiredError
        ``copy=False`` and the right values need a copy (device data,
        conjugate/negative bit).
    UnsupportedDtypeError
        NumPy and ``ml_dtypes`` cannot hold the dtype (``torch.complex32``,
        quantized tensors).
    InvalidTypeError
        ``x`` is not an array (or a nested or sparse tensor), or ``copy`` is
        not None/bool (a ``TypeError``).
    InvalidValueError
        ``x`` is a meta tensor or on a device other than CPU or CUDA, a
        tensor without data (a FakeTensor, or one inside ``torch.func.grad``
        or ``vmap``), or a foreign producer's export fails (a ``ValueError``).
    """
    tensor = _TENSOR[0]
    if tensor is None:
        th = sys.modules.get("torch")
        if th is not None:
            tensor = _TENSOR[0] = th.Tensor
    if copy is None and type(x) is tensor:
        shared = _numpy_fast(x)  # the common case, checked first: a plain CPU tensor
        if shared is not None:
            return shared
    _check_copy(copy)
    if isinstance(x, np.ndarray):
        return _numpy_from_numpy(x, copy)
    if isinstance(x, np.generic):  # a NumPy scalar: a 0-d array, as numpy.asarray gives
        return _numpy_from_numpy(np.asarray(x), copy)
    if _backends.is_torch_tensor(x):
        return _numpy_from_torch(x, copy)
    if _backends.is_cupy_array(x):
        return _numpy_from_cupy(x, copy)
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        kind, index = dlpack_device(x, "to_numpy")
        if kind in (DL_CPU, DL_CUDA_HOST):
            return _numpy_from_numpy(host_from_dlpack(x, "to_numpy"), copy)
        if kind in (DL_CUDA, DL_CUDA_MANAGED):
            return _numpy_from_cupy(cupy_from_dlpack(x, index, "to_numpy"), copy)
        raise InvalidValueError(f"to_numpy expected CPU or CUDA data (got DLPack device {kind!r})")
    if hasattr(x, "__cuda_array_interface__"):
        return _numpy_from_cupy(cupy_from_dlpack(x, None, "to_numpy"), copy)
    raise not_an_array("to_numpy", x)


# --------------------------------------------------------------------------- to_torch


def _torch_from_numpy(a: np.ndarray, copy: bool | None) -> torch.Tensor:
    th = _backends.torch()
    native = a.dtype if a.dtype.isnative else a.dtype.newbyteorder("=")
    dtypes.torch_dtype_of_numpy(native)  # UnsupportedDtypeError before any copy
    copied = False
    if not a.dtype.isnative:
        if a.dtype.itemsize == 1:
            a = a.view(native)  # one byte has no byte order (ml_dtypes' float8 keep a flag)
        elif copy is False:
            shown = a.dtype.str if dtypes.is_standard(native) else a.dtype.byteorder + native.name
            raise _copy_required(f"an array in non-native byte order ({shown!r})")
        else:
            a = a.astype(native)
            copied = True
    if _pytorch_cannot_share(a):  # rare: checked once in the common case
        a = _normalise_strides(a)
        if _pytorch_cannot_share(a):
            if copy is False:
                raise _copy_required(f"an array with {_layout_in_words(a)}")
            a = a.copy(order="C")  # a fresh, aligned C array (0-d stays 0-d)
            copied = True
    if copy and not copied:
        a = a.copy(order="K")
        copied = True
    ml = dtypes.ml_view_of_numpy(a.dtype)
    src = a if ml is None else a.view(ml[1])
    if src.flags.writeable:
        t = th.from_numpy(src)
    else:
        warnings.warn(
            "to_torch shares a read-only NumPy array; PyTorch cannot mark tensors "
            "read-only, so writing to the result writes into memory NumPy marked "
            "read-only. Pass copy=True for a writable copy.",
            ReadOnlyWarning,
            stacklevel=3,
        )
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            t = th.from_numpy(src)
    return t if ml is None else t.view(ml[0])


def _torch_from_cupy(c: cupy.ndarray, copy: bool | None) -> torch.Tensor:
    th = _backends.require_torch_cuda()
    index = int(c.data.device_id)
    shape = c.shape
    plain = (  # the common case, answered first: what PyTorch takes as it is
        c.flags.c_contiguous and 0 not in shape and 1 not in shape and not c.data.ptr % c.itemsize
    )
    pack = not plain and c.size > 0 and _pytorch_cannot_share(c)
    if pack and copy is False:
        raise _copy_required(f"an array with {_layout_in_words(c)}")
    if pack or (copy and c.size > 0):
        # PyTorch's memory on PyTorch's current stream, filled by a copy ordered
        # both ways with CuPy's current stream (a C-contiguous, aligned result)
        return _torch_copy_of(c, index)
    cp = _backends.cupy()
    # CuPy's device only: torch.from_dlpack names the array's device itself
    # (so PyTorch's current stream there is the consumer it names to
    # __dlpack__), and CuPy's __dlpack__ orders that stream after CuPy's
    # current stream (the producer's) of the current device. Usually that
    # device is current already: then nothing is switched.
    here = cp.cuda.runtime.getDevice() == index
    with _ALREADY_CURRENT if here else cp.cuda.Device(index):
        if c.size == 0 and (copy or _pytorch_cannot_share(c)):
            c = cp.empty(c.shape, c.dtype)  # nothing to share: no strides to export
        current = cp.cuda.get_current_stream()
        if not same_stream(cupy_consumer_handle(current), torch_stream_handle(index)):
            _refuse_split_capture("to_torch", current)
        return th.from_dlpack(c)


def _torch_copy_of(x: Any, index: int) -> torch.Tensor:
    """A new C-contiguous CUDA tensor on device ``index`` holding device array
    ``x``'s values: allocated by PyTorch on its current stream there and filled
    by one copy ordered both ways with ``x``'s library's current stream (so
    ``x`` may be dropped as soon as this returns)."""
    th = _backends.torch()
    dtype = dtypes.torch_dtype_of_numpy(np.dtype(x.dtype))
    out = th.empty(tuple(x.shape), dtype=dtype, device=th.device("cuda", index))
    device_to_device(array_source(x, "to_torch"), array_source(out, "to_torch"))
    return out


def _cupy_copy_of(x: Any, index: int) -> cupy.ndarray:
    """A new C-contiguous CuPy array on device ``index`` holding device array
    ``x``'s values (a CuPy array, or a CUDA tensor with any bits): allocated on
    CuPy's current stream there (refused inside a capture that forbids it) and
    filled by one copy ordered both ways with ``x``'s library's current stream,
    across devices by a peer copy (so ``x`` may be dropped as soon as this
    returns): ``copy_to_device(x, device=index)``."""
    return copy_to_device(x, device=index)


def _torch_from_torch(t: torch.Tensor, copy: bool | None, target: Target | None) -> torch.Tensor:
    check_strided_tensor(t, "to_torch")
    if t.is_cuda or (target is not None and target[0] == "cuda"):
        _backends.check_not_forked()  # PyTorch's own error would not say what to do
    t = t.detach() if t.requires_grad else t
    if target is None or _same_torch_device(t, target):
        return t.clone() if copy else t
    if copy is False:
        raise _copy_required(f"moving a tensor from {t.device} to {target_str(target)}")
    if target[0] == "cpu":  # bits are applied chunk by chunk by copy_to_host
        return _torch_from_numpy(_device_to_host(t), None)
    if t.device.type == "cpu":
        return _host_to_torch(t, target[1])
    return t.to(_backends.torch().device("cuda", target[1]))


def _same_torch_device(t: torch.Tensor, target: Target) -> bool:
    kind, index = target
    if t.device.type != kind:
        return False
    if kind == "cpu":
        return True
    current = _backends.torch().cuda.current_device() if index is None else index
    return t.device.index == current


def to_torch(x: Any, /, *, device: Any = None, copy: bool | None = None) -> torch.Tensor:
    """Return ``x`` as a PyTorch tensor, sharing memory when that is correct.

    Parameters
    ----------
    x : array
        A NumPy array, a PyTorch tensor, a CuPy array, or any object with
        ``__dlpack__`` or ``__cuda_array_interface__``.
    device : str, int, torch.device, cupy.cuda.Device or None
        ``None`` keeps the data where it is (a CuPy array on ``cuda:1`` gives a
        tensor on ``cuda:1``). Anything else moves the data there (a copy).
    copy : bool or None
        ``None``: share memory when that gives the right values, else copy.
        ``False``: share memory or raise. ``True``: always an independent copy.

    Returns
    -------
    torch.Tensor
        A shared result keeps ``x``'s memory alive. A tensor with
        ``requires_grad`` gives its detached data (writes bypass autograd).
        ``ml_dtypes`` arrays (bfloat16, float8) give the torch dtype of the
        same name without a copy.

    Notes
    -----
    Stream order: a CUDA source is exported with PyTorch's current stream on
    the data's device, so the result can be used at once on that stream, even
    while the producer's kernels are still running; the host is not blocked.
    A copy of CuPy data is made on PyTorch's current stream, after the work
    queued on CuPy's current stream.
    Copy semantics: arrays PyTorch cannot represent as they are are copied:
    negative strides (``torch.from_dlpack`` aborts the process on them), byte
    strides that are not multiples of the itemsize (a field of a structured
    array), a first element that is not at a multiple of the itemsize (a view
    at a byte offset into a buffer, on which PyTorch's kernels crash), and
    non-native byte order. A stride on an axis of length 1 is never used and
    does not force a copy. A read-only NumPy array is shared with an
    :class:`interop.ReadOnlyWarning`, as ``torch.from_numpy`` warns.

    Raises
    ------
    CopyRequiredError
        ``copy=False`` and a copy is needed (negative or odd strides, a
        misaligned array, byte order, another device).
    UnsupportedDtypeError
        PyTorch has no such dtype (object, string, datetime arrays).
    BackendUnavailableError
        PyTorch (or, for CUDA data, CuPy) is not installed.
    NoDeviceError
        CUDA data or ``device='cuda'`` without a usable CUDA device.
    InvalidTypeError
        ``x`` is not an array (or a nested or sparse tensor), or
        ``device``/``copy`` have the wrong type (a ``TypeError``).
    InvalidValueError
        ``device`` names no device, ``x`` is a meta tensor, or a foreign
        producer's export fails (a ``ValueError``).
    CudaAfterForkError
        CUDA data or ``device='cuda'`` in a process forked after its parent
        initialised CUDA.
    """
    if device is None and copy is None and type(x) is np.ndarray:
        shared = _torch_fast(x)  # the common case, checked first: a plain shareable array
        if shared is not None:
            return shared
    _check_copy(copy)
    if isinstance(x, np.generic):  # a NumPy scalar: a 0-d array, as numpy.asarray gives
        x = np.asarray(x)
    target = parse_device(device)
    if not is_array(x):
        raise not_an_array("to_torch", x)
    _backends.torch()  # BackendUnavailableError before any work
    if _backends.is_torch_tensor(x):
        return _torch_from_torch(x, copy, target)
    if isinstance(x, np.ndarray):
        if target is not None and target[0] == "cuda":
            if copy is False:
                raise _copy_required(f"moving a NumPy array to {target_str(target)}")
            return _host_to_torch(x, target[1])
        return _torch_from_numpy(x, copy)
    if _backends.is_cupy_array(x):
        if target is not None and not _same_cuda(x.device.id, target):
            if copy is False:
                raise _copy_required(f"moving a CuPy array to {target_str(target)}")
            if target[0] == "cpu":
                return _torch_from_numpy(_device_to_host(x), None)
            th = _backends.require_torch_cuda()
            index = th.cuda.current_device() if target[1] is None else target[1]
            return _torch_copy_of(x, index)
        return _torch_from_cupy(x, copy)
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        kind, index = dlpack_device(x, "to_torch")
        if kind in (DL_CPU, DL_CUDA_HOST):
            # Through NumPy: torch.from_dlpack aborts on negative strides.
            return to_torch(host_from_dlpack(x, "to_torch"), device=device, copy=copy)
        if kind in (DL_CUDA, DL_CUDA_MANAGED):
            _backends.require_cupy_device()
            # imported on PyTorch's current stream: the producer orders it
            with _cuda_context(index), cupy_stream(torch_stream_handle(index), index):
                c = cupy_from_dlpack(x, index, "to_torch")
            return to_torch(c, device=device, copy=copy)
        raise InvalidValueError(f"to_torch expected CPU or CUDA data (got DLPack device {kind!r})")
    return to_torch(cupy_from_dlpack(x, None, "to_torch"), device=device, copy=copy)


def _same_cuda(index: int, target: Target) -> bool:
    kind, want = target
    if kind != "cuda":
        return False
    if want is None:
        want = _backends.cupy().cuda.runtime.getDevice()
    return index == want


# --------------------------------------------------------------------------- to_cupy


def _cupy_from_torch_cuda(t: torch.Tensor, copy: bool | None) -> cupy.ndarray:
    index = t.get_device()
    dtypes.check_cupy_dtype(t.dtype)
    if copy and not (t.is_conj() or t.is_neg()):
        return _cupy_copy_of(t, index)  # t may be dropped at once: ordered both ways
    t, copied = _resolve_bits(t, copy)
    with _torch_export_context(index):
        # Inside the device context: torch's __dlpack__ refuses tensors of
        # another device, and both libraries' current streams are this device's.
        cp = _backends.cupy()
        # The stream CuPy works on and names to producers: its null stream is the
        # legacy or (CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1) the per-thread one.
        current = cp.cuda.get_current_stream()
        handle = cupy_consumer_handle(current)
        if not same_stream(handle, torch_stream_handle(index)):
            _refuse_split_capture("to_cupy", current)
        if handle == PER_THREAD_DEFAULT:
            # PyTorch's __dlpack__ refuses the per-thread default stream: order it
            # ourselves, on that stream itself (handle 2 names this thread's).
            ready = cp.cuda.Event(disable_timing=True)
            ready.record(cupy_stream(torch_stream_handle(index), index))
            cupy_stream(handle, index).wait_event(ready)
            c = cp.from_dlpack(Unsynchronised(t))
        else:
            c = cp.from_dlpack(t)
        if copied:
            # The resolved copy goes back to PyTorch's pool when CuPy drops it:
            # not for reuse before the work CuPy queued on it is done. (Under
            # the per-thread default stream this is the stream of the thread
            # that frees it: drop such arrays in the thread that made them.)
            t.record_stream(torch_stream(handle, index))
        return c


def _refuse_split_capture(func: str, cupy_current: Any) -> None:
    """Refuse an exchange between PyTorch's and CuPy's current streams (which
    differ) while either is being captured into a CUDA graph: ordering one
    after the other would wait across the capture's boundary and invalidate
    it. Called in the data's device context, before anything is queued.

    Raises
    ------
    CaptureError
        A capture is under way on either stream.
    """
    th = _backends.torch()
    if capturing(cupy_current.is_capturing) or capturing(th.cuda.is_current_stream_capturing):
        raise CaptureError(
            f"{func} expected PyTorch and CuPy to use one stream inside CUDA graph capture (got "
            "two different current streams; ordering one after the other would break the "
            "capture); run the block under `with interop.stream(s):` with s the capturing "
            "stream (torch.cuda.current_stream() inside torch.cuda.graph). Nothing was queued"
        )


def to_cupy(x: Any, /, *, device: Any = None, copy: bool | None = None) -> cupy.ndarray:
    """Return ``x`` as a CuPy array, sharing memory when that is correct.

    Parameters
    ----------
    x : array
        A NumPy array, a PyTorch tensor, a CuPy array, or any object with
        ``__dlpack__`` or ``__cuda_array_interface__``.
    device : str, int, torch.device, cupy.cuda.Device or None
        ``None`` keeps CUDA data on its device (host data goes to the current
        device). Another CUDA device copies the data there; ``'cpu'`` is
        refused (CuPy arrays live on a GPU).
    copy : bool or None
        ``None``: share memory when that gives the right values, else copy.
        ``False``: share memory or raise. ``True``: always an independent copy.

    Returns
    -------
    cupy.ndarray
        A shared result keeps ``x``'s memory alive.

    Notes
    -----
    Stream order: a PyTorch CUDA tensor is exported with CuPy's current stream
    of the tensor's device (``__dlpack__(stream=...)``), so the result may be
    used at once on that stream while PyTorch's kernels are still running;
    the host is not blocked. Host data is copied to the device (a copy is
    always needed), ordered on CuPy's current stream.

    Raises
    ------
    CopyRequiredError
        ``copy=False`` and a copy is needed (host data, conjugate/negative
        bit, another device).
    UnsupportedDtypeError
        CuPy cannot hold the dtype (``bfloat16`` before CuPy 14, ``float8``,
        ``complex32``); the message names what to install or do.
    BackendUnavailableError
        CuPy is not installed.
    NoDeviceError
        No CUDA device is visible (:class:`~interop.CudaAfterForkError` in a
        process forked after its parent initialised CUDA).
    InvalidTypeError
        ``x`` is not an array (or a nested or sparse tensor), or
        ``device``/``copy`` have the wrong type (a ``TypeError``).
    InvalidValueError
        ``device='cpu'``, a meta tensor, or a foreign producer's export fails
        (a ``ValueError``).
    CaptureError
        Inside CUDA graph capture: a copy (host data, ``copy=True``, another
        device) whose result CuPy's own pool would allocate (it grows with
        ``cudaMalloc``; fine under :func:`interop.use_torch_allocator`), or an
        exchange between two different current streams. Nothing is queued.
    """
    _check_copy(copy)
    if isinstance(x, np.generic):  # a NumPy scalar: a 0-d array, as numpy.asarray gives
        x = np.asarray(x)
    target = parse_device(device)
    if target is not None and target[0] == "cpu":
        raise InvalidValueError(
            "to_cupy expected a CUDA device (got 'cpu'); CuPy arrays live on a GPU: "
            "use interop.to_numpy for host data"
        )
    if not is_array(x):
        raise not_an_array("to_cupy", x)
    if _backends.is_torch_tensor(x):
        check_strided_tensor(x, "to_cupy")  # before the device: a bad argument on any machine
        check_tensor_data(x, "to_cupy")
    _backends.require_cupy_device()
    want = None if target is None else target[1]

    if _backends.is_torch_tensor(x):
        t = x.detach() if x.requires_grad else x
        if t.is_cuda:
            if target is not None and not _same_cuda(t.get_device(), target):
                if copy is False:
                    raise _copy_required(f"moving a tensor from {t.device} to {target_str(target)}")
                dtypes.check_cupy_dtype(t.dtype)
                return _cupy_copy_of(t, _cupy_index(want))
            return _cupy_from_torch_cuda(t, copy)
        if copy is False:
            raise _copy_required(f"a tensor on {t.device} (to_cupy returns device memory)")
        dtypes.check_cupy_dtype(t.dtype)
        return _host_to_cupy(t, want)
    if isinstance(x, np.ndarray):
        if copy is False:
            raise _copy_required("a NumPy array (to_cupy returns device memory)")
        dtypes.check_cupy_dtype(x.dtype)
        return _host_to_cupy(x, want)
    if _backends.is_cupy_array(x):
        c = x
    elif hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        kind, index = dlpack_device(x, "to_cupy")
        if kind in (DL_CPU, DL_CUDA_HOST):
            return to_cupy(host_from_dlpack(x, "to_cupy"), device=device, copy=copy)
        if kind not in (DL_CUDA, DL_CUDA_MANAGED):
            raise InvalidValueError(
                f"to_cupy expected CPU or CUDA data (got DLPack device {kind!r})"
            )
        c = cupy_from_dlpack(x, index, "to_cupy")
    else:
        c = cupy_from_dlpack(x, None, "to_cupy")  # __cuda_array_interface__: zero-copy
    if target is not None and not _same_cuda(int(c.device.id), target):
        if copy is False:
            raise _copy_required(f"moving a CuPy array to {target_str(target)}")
        return _cupy_copy_of(c, _cupy_index(want))
    if copy:
        return _cupy_copy_of(c, int(c.device.id))
    return c


def _cupy_index(index: int | None) -> int:
    """``index``, or CuPy's current device for None."""
    return _backends.cupy().cuda.runtime.getDevice() if index is None else index
