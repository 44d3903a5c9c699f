"""Page-locked host buffers for reuse: ``interop.empty_pinned`` and ``interop.pin``.

A page-locked, C-contiguous ``out`` or source is copied by the DMAs alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import operator
import os
import weakref
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _backends
from .errors import InvalidTypeError, InvalidValueError
from .pipeline.ring import free_pinned

if TYPE_CHECKING:
    from .pipeline.backend import Backend

__all__ = ["Pinned", "empty_pinned", "pin"]

_ALREADY_REGISTERED = 712  # cudaErrorHostMemoryAlreadyRegistered


def empty_pinned(shape: Any, dtype: Any = float) -> np.ndarray:
    """A new uninitialised NumPy array in page-locked (pinned) host memory.

    Parameters
    ----------
    shape : int or tuple of int
    dtype : numpy dtype, default float
        Any NumPy or ``ml_dtypes`` dtype (bfloat16, float8).

    Returns
    -------
    numpy.ndarray
        C-contiguous, writable, in portable ``cudaHostAlloc`` memory that every
        device's DMAs reach; freed when the last array using it is gone (never
        during a CUDA graph capture; in a forked child, not at all). Freeing
        waits for the whole device: allocate once and reuse.

    Raises
    ------
    InvalidTypeError, InvalidValueError
        Sizes that are not integers (``3.0`` included), negative or too large,
        or a bad dtype; checked before the device.
    NoDeviceError, BackendUnavailableError
        No CUDA device, or CuPy missing.
    """
    try:
        dt = np.dtype(dtype)
        sizes = shape if np.ndim(shape) else (shape,)
        shape = tuple(operator.index(n) for n in sizes)  # 3.0 and "3" refused, as numpy does
    except (TypeError, ValueError) as exc:
        raise InvalidTypeError(
            f"empty_pinned expected a shape of ints and a NumPy dtype (got shape={shape!r}, "
            f"dtype={dtype!r})"
        ) from exc
    if any(n < 0 for n in shape):
        raise InvalidValueError(f"empty_pinned expected sizes >= 0 (got shape {shape})")
    if dt.hasobject:
        raise InvalidValueError(f"empty_pinned expected a dtype without Python objects (got {dt})")
    nbytes = math.prod(shape) * dt.itemsize
    if nbytes > np.iinfo(np.intp).max:
        raise InvalidValueError(
            f"empty_pinned expected at most {np.iinfo(np.intp).max} bytes (got shape {shape} "
            f"of {dt}: {nbytes} bytes)"
        )
    cp = _backends.require_cupy_device()
    from .pipeline.cuda import cuda_backend

    return pinned_array(cuda_backend(int(cp.cuda.runtime.getDevice())), shape, dt)


def pinned_array(backend: Backend, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A C-contiguous array in ``backend``'s page-locked memory, freed with its last view."""
    nbytes = math.prod(shape) * dtype.itemsize
    ptr, _ = backend.host_alloc(max(nbytes, 1))
    try:
        raw = (ctypes.c_uint8 * max(nbytes, 1)).from_address(ptr)
        weakref.finalize(raw, _free_pinned, backend, ptr, os.getpid())
        return np.frombuffer(memoryview(raw), np.uint8, nbytes).view(dtype).reshape(shape)
    except BaseException:
        backend.host_free(ptr)
        raise


def _free_pinned(backend: Backend, ptr: int, pid: int) -> None:
    # In a child forked since, the parent's pages are not the child's to free (and
    # every CUDA call fails there): the child's copy of them goes with its exit.
    if os.getpid() == pid:
        # freed once no capture under way forbids it (a cudaFreeHost would break it)
        free_pinned(backend, functools.partial(backend.host_free, ptr))


class Pinned:
    """An array registered as page-locked memory by :func:`pin`; kept alive until unpinned.

    Attributes
    ----------
    array : numpy.ndarray
        The registered array (None once unpinned).
    """

    def __init__(self, array: np.ndarray, ptr: int, backend: Backend) -> None:
        self.array: np.ndarray | None = array
        # unregistered once no capture under way forbids it; the array lives until then
        unregister = functools.partial(_unregister, backend, ptr, array)
        self._unpin = weakref.finalize(self, free_pinned, backend, unregister)

    @property
    def pinned(self) -> bool:
        """True until :meth:`unpin` (or the end of the ``with`` block)."""
        return self._unpin.alive

    def unpin(self) -> None:
        """Unregister the memory (after any CUDA graph capture); idempotent. The array stays
        valid as pageable memory."""
        self._unpin()
        self.array = None

    def __enter__(self) -> np.ndarray:
        assert self.array is not None, "expected a pinned handle (got one already unpinned)"
        return self.array

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.unpin()

    def __repr__(self) -> str:
        if self.array is None:
            return "<interop.Pinned: unpinned>"
        return f"<interop.Pinned: {self.array.nbytes} bytes at {self.array.ctypes.data:#x}>"


def _unregister(backend: Backend, ptr: int, array: np.ndarray) -> None:
    """``cudaHostUnregister`` of ``array``'s memory at ``ptr`` (kept alive until now)."""
    with contextlib.suppress(Exception):  # a dead context at exit: the pages go with it
        backend.host_unregister(ptr)


def pin(array: np.ndarray) -> Pinned:
    """Register an existing NumPy array's memory as page-locked, in place.

    Parameters
    ----------
    array : numpy.ndarray
        Writable and contiguous (C or Fortran order), not empty.

    Returns
    -------
    Pinned
        A handle that unpins at the end of ``with interop.pin(a) as a:``, at
        ``h.unpin()``, or when dropped. Nothing is copied; registering costs
        about a copy of the bytes: pin buffers you reuse.

    Raises
    ------
    InvalidTypeError
        Not a NumPy array.
    InvalidValueError
        Read-only, not contiguous, empty, of Python objects, page-locked already, or
        refused by the driver; nothing stays registered.
    NoDeviceError, BackendUnavailableError
        No CUDA device, or CuPy missing.
    """
    if not isinstance(array, np.ndarray):
        raise InvalidTypeError(
            f"pin expected a NumPy array (got {type(array).__module__}.{type(array).__qualname__}"
            "); for new buffers use interop.empty_pinned(shape, dtype)"
        )
    if not array.flags.writeable:
        raise InvalidValueError("pin expected a writable array (got a read-only one)")
    if not (array.flags.c_contiguous or array.flags.f_contiguous):
        raise InvalidValueError(
            "pin expected a contiguous array (got strides "
            f"{array.strides}); pin the array the view was taken from"
        )
    if array.nbytes == 0:
        raise InvalidValueError("pin expected an array with data (got an empty one)")
    if array.dtype.hasobject:  # pointers to Python objects: no device copy reads them
        raise InvalidValueError(f"pin expected a dtype without Python objects (got {array.dtype})")
    cp = _backends.require_cupy_device()
    from .pipeline.cuda import cuda_backend

    runtime = cp.cuda.runtime
    ptr = int(array.ctypes.data)
    backend = cuda_backend(int(runtime.getDevice()))
    if backend.is_pinned(ptr, array.nbytes):
        raise InvalidValueError(
            "pin expected pageable memory (got an array that is page-locked already); it is "
            "copied by DMA as it is"
        )
    try:
        backend.host_register(ptr, array.nbytes)
    except runtime.CUDARuntimeError as exc:
        already = getattr(exc, "status", None) == _ALREADY_REGISTERED
        raise InvalidValueError(
            "pin expected memory the CUDA driver can page-lock (got "
            f"{'memory registered already, in part' if already else 'a refusal'}: {exc}); "
            "copy into interop.empty_pinned(shape, dtype) instead"
        ) from exc
    return Pinned(array, ptr, backend)
