"""Zero-copy exchange between NumPy, PyTorch and CuPy: ``to_numpy``,
``to_torch``, ``to_cupy`` (the rules: docs/exchange.md).

Each function checks its arguments, then hands ``x`` to the module of its
source library, chosen by ``type(x)`` in the table ``_SOURCES`` (``_foreign``
for ``__dlpack__`` / ``__cuda_array_interface__`` objects): adding a library
is a new module and a row there. The layout rules they share are in ``_layout``.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from ..arrays import parse_device
from ..errors import InvalidTypeError, InvalidValueError
from . import _cupy, _foreign, _numpy, _torch
from ._numpy import plain_torch_view as plain_torch_view

if TYPE_CHECKING:
    import cupy
    import torch

__all__ = ["to_cupy", "to_numpy", "to_torch"]

# (library, its array type) -> the module that exchanges its arrays, with
# to_numpy(x, copy), to_torch(x, target, copy) and to_cupy(x, target, copy);
# anything else goes to _foreign. Found through sys.modules: nothing is imported.
_SOURCES: dict[tuple[str, str], ModuleType] = {
    ("numpy", "ndarray"): _numpy,
    ("torch", "Tensor"): _torch,
    ("cupy", "ndarray"): _cupy,
}
_BY_TYPE: dict[type, ModuleType] = {np.ndarray: _numpy}  # the answers so far
_TENSOR: list[Any] = [None]  # torch.Tensor, once torch was imported: to_numpy's fast path


def _check_copy(copy: object) -> None:
    if copy is not None and not isinstance(copy, bool):
        raise InvalidTypeError(f"expected copy to be None, True or False (got {copy!r})")


def _source(x: object) -> ModuleType:
    """The module that exchanges ``x``, by its type (a dict lookup once seen)."""
    cls = type(x)
    module = _BY_TYPE.get(cls)
    if module is not None:
        return module
    for (library, name), module in _SOURCES.items():
        lib = sys.modules.get(library)
        if lib is not None and issubclass(cls, getattr(lib, name)):
            _BY_TYPE[cls] = module
            return module
    return _foreign


def to_numpy(x: Any, /, *, copy: bool | None = None) -> np.ndarray:
    """Return ``x`` as a NumPy array, sharing memory when that is correct.

    Parameters
    ----------
    x : array
        A NumPy array (or scalar), a PyTorch tensor (CPU, pinned or CUDA), a
        CuPy array, or any object with ``__dlpack__`` or
        ``__cuda_array_interface__``.
    copy : bool or None
        ``None``: share memory when that gives the right values, else copy.
        ``False``: share memory or raise. ``True``: always an independent copy.

    Returns
    -------
    numpy.ndarray
        A shared result keeps ``x``'s memory alive. ``bfloat16`` and ``float8``
        tensors give the ``ml_dtypes`` dtype of the same name, without a copy.
        Broadcast (zero-stride) views and read-only sources give read-only
        results. A tensor with ``requires_grad`` gives a view of its detached
        data: writes bypass autograd.

    Notes
    -----
    Copy semantics: CPU data is shared; a tensor's conjugate/negative bit is
    applied into a copy. Device data is always copied, by
    :func:`interop.copy_to_host`: ordered after the work queued on the
    producer's current stream, and complete when the call returns.

    Raises
    ------
    CopyRequiredError
        ``copy=False`` where a copy is needed (device data, conjugate/negative bit).
    UnsupportedDtypeError
        NumPy and ``ml_dtypes`` cannot hold the dtype (``torch.complex32``,
        quantized tensors).
    InvalidTypeError
        ``x`` is not an array (or a nested or sparse tensor), or ``copy`` is
        not None/bool (a ``TypeError``).
    InvalidValueError
        A meta tensor, a device other than CPU or CUDA, a tensor without data
        (a FakeTensor, or one inside ``torch.func.grad`` or ``vmap``), or a
        foreign producer whose export fails (a ``ValueError``).
    """
    tensor = _TENSOR[0]
    if tensor is None:
        th = sys.modules.get("torch")
        if th is not None:
            tensor = _TENSOR[0] = th.Tensor
    if copy is None and type(x) is tensor:
        shared = _torch.plain_numpy_view(x)  # the common case, checked first: a plain CPU tensor
        if shared is not None:
            return shared
    _check_copy(copy)
    if isinstance(x, np.generic):  # a NumPy scalar: a 0-d array, as numpy.asarray gives
        x = np.asarray(x)
    return _source(x).to_numpy(x, copy)


def to_torch(x: Any, /, *, device: Any = None, copy: bool | None = None) -> torch.Tensor:
    """Return ``x`` as a PyTorch tensor, sharing memory when that is correct.

    Parameters
    ----------
    x : array
        As for :func:`interop.to_numpy`.
    device : str, int, torch.device, cupy.cuda.Device or None
        ``None`` keeps the data where it is (a CuPy array on ``cuda:1`` gives a
        tensor on ``cuda:1``). Anything else moves the data there (a copy).
    copy : bool or None
        As for :func:`interop.to_numpy`.

    Returns
    -------
    torch.Tensor
        A shared result keeps ``x``'s memory alive. A tensor with
        ``requires_grad`` gives its detached data (writes bypass autograd).
        ``ml_dtypes`` arrays (bfloat16, float8) give the torch dtype of the
        same name, without a copy.

    Notes
    -----
    Stream order: a CUDA source is exported with PyTorch's current stream on
    the data's device, so the result can be used at once on that stream, even
    while the producer's kernels are still running; the host is not blocked.
    A copy of CuPy data is made on PyTorch's current stream, after the work
    queued on CuPy's current stream.
    Copy semantics: what PyTorch cannot hold as it is is copied: negative
    strides (``torch.from_dlpack`` aborts the process on them), byte strides
    that are not multiples of the itemsize (a field of a structured array), a
    first element at a byte offset that is not a multiple of the itemsize (on
    which PyTorch's kernels crash), and non-native byte order. A stride on an
    axis of length 1 is never used and forces no copy. A read-only NumPy array
    is shared with an :class:`interop.ReadOnlyWarning`, as ``torch.from_numpy`` warns.

    Raises
    ------
    CopyRequiredError
        ``copy=False`` where a copy is needed (negative or odd strides, a
        misaligned array, byte order, another device).
    UnsupportedDtypeError
        PyTorch has no such dtype (object, string, datetime arrays).
    BackendUnavailableError
        PyTorch (or, for CUDA data, CuPy) is not installed.
    NoDeviceError
        CUDA data or ``device='cuda'`` without a usable CUDA device.
    InvalidTypeError, InvalidValueError
        As for :func:`interop.to_numpy`, or a ``device`` of the wrong type (a
        ``TypeError``) or that names no device (a ``ValueError``).
    CudaAfterForkError
        CUDA data or ``device='cuda'`` in a process forked after its parent
        initialised CUDA.
    """
    if device is None and copy is None and type(x) is np.ndarray:
        shared = plain_torch_view(x)  # the common case, checked first: a plain shareable array
        if shared is not None:
            return shared
    _check_copy(copy)
    if isinstance(x, np.generic):  # a NumPy scalar: a 0-d array, as numpy.asarray gives
        x = np.asarray(x)
    return _source(x).to_torch(x, parse_device(device), copy)


def to_cupy(x: Any, /, *, device: Any = None, copy: bool | None = None) -> cupy.ndarray:
    """Return ``x`` as a CuPy array, sharing memory when that is correct.

    Parameters
    ----------
    x : array
        As for :func:`interop.to_numpy`.
    device : str, int, torch.device, cupy.cuda.Device or None
        ``None`` keeps CUDA data on its device (host data goes to the current
        device). Another CUDA device copies the data there; ``'cpu'`` is
        refused (CuPy arrays live on a GPU).
    copy : bool or None
        As for :func:`interop.to_numpy`.

    Returns
    -------
    cupy.ndarray
        A shared result keeps ``x``'s memory alive.

    Notes
    -----
    Stream order: a PyTorch CUDA tensor is exported with CuPy's current stream
    of the tensor's device (``__dlpack__(stream=...)``), so the result may be
    used at once on that stream while PyTorch's kernels are still running;
    the host is not blocked. Host data is always copied to the device,
    ordered on CuPy's current stream.

    Raises
    ------
    CopyRequiredError
        ``copy=False`` where a copy is needed (host data, conjugate/negative
        bit, another device).
    UnsupportedDtypeError
        CuPy cannot hold the dtype (``bfloat16`` before CuPy 14, ``float8``,
        ``complex32``); the message names what to install or do.
    BackendUnavailableError
        CuPy is not installed.
    NoDeviceError
        No CUDA device is visible (:class:`~interop.CudaAfterForkError` in a
        process forked after its parent initialised CUDA).
    InvalidTypeError, InvalidValueError
        As for :func:`interop.to_torch`; ``device='cpu'`` (a ``ValueError``).
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
    return _source(x).to_cupy(x, target, copy)
