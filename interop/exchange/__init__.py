"""Zero-copy exchange between NumPy, PyTorch and CuPy (docs/exchange.md)."""

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

# (library, array type) -> the module exchanging its arrays (else _foreign), via sys.modules
_SOURCES: dict[tuple[str, str], ModuleType] = {
    ("numpy", "ndarray"): _numpy,
    ("torch", "Tensor"): _torch,
    ("cupy", "ndarray"): _cupy,
}
_BY_TYPE: dict[type, ModuleType] = {np.ndarray: _numpy}  # the answers so far
_TENSOR: list[Any] = [None]  # torch.Tensor, once torch was imported: to_numpy's fast path


def _checked(x: Any, copy: object) -> Any:
    """``x`` once ``copy`` is valid; a NumPy scalar as a 0-d array, as numpy.asarray gives."""
    if copy is not None and not isinstance(copy, bool):
        raise InvalidTypeError(f"expected copy to be None, True or False (got {copy!r})")
    return np.asarray(x) if isinstance(x, np.generic) else x


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
        NumPy, PyTorch, CuPy, or ``__dlpack__`` / ``__cuda_array_interface__`` data.
    copy : bool or None
        ``None``: share where correct, else copy; ``False``: share or raise; ``True``: copy.

    Notes
    -----
    Copy semantics: CPU data is shared (read-only where the source is); device data
    and a conjugate/negative bit are copied. Stream order: as :func:`interop.copy_to_host`.

    Raises
    ------
    CopyRequiredError
        ``copy=False`` where a copy is needed.
    UnsupportedDtypeError
        NumPy and ``ml_dtypes`` cannot hold the dtype (``complex32``, quantized).
    InvalidTypeError, InvalidValueError
        ``x`` is not an array (or a tensor without strided data), ``copy`` not None/bool.
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
    x = _checked(x, copy)
    return _source(x).to_numpy(x, copy)


def to_torch(x: Any, /, *, device: Any = None, copy: bool | None = None) -> torch.Tensor:
    """Return ``x`` as a PyTorch tensor, sharing memory when that is correct.

    Parameters
    ----------
    x, copy
        See :func:`interop.to_numpy`.
    device : str, int, torch.device, cupy.cuda.Device or None
        ``None`` keeps the data on its device; another device gets a copy.

    Notes
    -----
    Copy semantics: what PyTorch cannot share (negative strides, misaligned, swapped
    bytes) is copied; a read-only array is shared with :class:`interop.ReadOnlyWarning`.
    Stream order: CUDA data is exported on PyTorch's current stream; no host wait.

    Raises
    ------
    CopyRequiredError
        ``copy=False`` where a copy is needed.
    UnsupportedDtypeError
        PyTorch has no such dtype (object, string, datetime).
    BackendUnavailableError, NoDeviceError
        PyTorch (for CUDA data: CuPy) is not installed, or no CUDA device is usable.
    InvalidTypeError, InvalidValueError
        As for :func:`interop.to_numpy`; a ``device`` of the wrong type or naming none.
    """
    if device is None and copy is None and type(x) is np.ndarray:
        shared = plain_torch_view(x)  # the common case, checked first: a plain shareable array
        if shared is not None:
            return shared
    x = _checked(x, copy)
    return _source(x).to_torch(x, parse_device(device), copy)


def to_cupy(x: Any, /, *, device: Any = None, copy: bool | None = None) -> cupy.ndarray:
    """Return ``x`` as a CuPy array, sharing memory when that is correct.

    Parameters
    ----------
    x, copy
        See :func:`interop.to_numpy`.
    device : str, int, torch.device, cupy.cuda.Device or None
        As for :func:`interop.to_torch` (host data goes to the current device); not ``'cpu'``.

    Notes
    -----
    Copy semantics: host data is always copied. Stream order: on CuPy's current
    stream of the data's device (usable there at once; the host is not blocked).

    Raises
    ------
    CopyRequiredError
        ``copy=False`` where a copy is needed (host data, bits, another device).
    UnsupportedDtypeError
        CuPy cannot hold the dtype (``bfloat16`` before CuPy 14, ``float8``, ``complex32``).
    BackendUnavailableError, NoDeviceError, InvalidTypeError, InvalidValueError
        As for :func:`interop.to_torch`, for CuPy; ``device='cpu'``.
    CaptureError
        Inside CUDA graph capture: a copy CuPy's pool would allocate, or two current streams.
    """
    x = _checked(x, copy)
    target = parse_device(device)
    if target is not None and target[0] == "cpu":
        raise InvalidValueError(
            "to_cupy expected a CUDA device (got 'cpu'); use interop.to_numpy for host data"
        )
    return _source(x).to_cupy(x, target, copy)
