"""The layout rules of the exchange: which memory PyTorch can share as it is.

PyTorch counts strides in elements, has no negative strides
(``torch.from_dlpack`` aborts the process on them) and needs each element at
a multiple of its itemsize (its kernels crash the interpreter, or fault the
GPU, on other memory); NumPy and CuPy allow all three. A stride on an axis
of length 1 is never used. A broadcast (zero-stride) view is read-only, as
``numpy.broadcast_to`` makes it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import dtypes
from ..errors import CopyRequiredError, InvalidTypeError

__all__: list[str] = []


def check_copy(copy: object) -> None:
    """Refuse a ``copy`` argument other than None, True or False."""
    if copy is not None and not isinstance(copy, bool):
        raise InvalidTypeError(f"expected copy to be None, True or False (got {copy!r})")


def copy_required(what: str) -> CopyRequiredError:
    """The error for ``copy=False`` where ``what`` needs a copy."""
    return CopyRequiredError(f"copy=False, but {what} needs a copy; pass copy=None or copy=True")


def _negative_strides(strides: tuple[int, ...] | None) -> bool:
    return bool(strides) and min(strides or (0,)) < 0


def _odd_strides(strides: tuple[int, ...] | None, itemsize: int) -> bool:
    """True if a byte stride is not a multiple of the itemsize (a field of a
    structured array, an ``as_strided`` view)."""
    if not strides or itemsize <= 1:
        return False
    for st in strides:  # noqa: SIM110 (a loop: any() with a generator costs twice as much here)
        if st % itemsize:
            return True
    return False


def _misaligned(a: Any) -> bool:
    """True if ``a``'s first element is not at a multiple of its itemsize (a
    view at a byte offset into a buffer)."""
    if not a.size or a.dtype.itemsize <= 1:
        return False
    address = int(a.ctypes.data) if isinstance(a, np.ndarray) else int(a.data.ptr)
    return address % a.dtype.itemsize != 0


def pytorch_cannot_share(a: Any) -> bool:
    """True if PyTorch cannot share the NumPy or CuPy array ``a`` as it is."""
    strides, itemsize = a.strides, a.dtype.itemsize
    if _negative_strides(strides) or _odd_strides(strides, itemsize):
        return True
    if isinstance(a, np.ndarray) and a.dtype.alignment == itemsize and a.flags.aligned:
        return False  # NumPy checked the address already (the common, fast case)
    return _misaligned(a)


def layout_in_words(a: Any) -> str:
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


def normalise_strides(a: np.ndarray) -> np.ndarray:
    """A zero-copy view of ``a`` whose size-1 axes have stride 0; a fresh empty
    array for a zero-size one (there is no data to share)."""
    if a.size == 0:
        return np.empty(a.shape, a.dtype)
    fixed = tuple(0 if n == 1 else st for st, n in zip(a.strides, a.shape, strict=True))
    if fixed == a.strides:
        return a
    # through a same-sized integer view: as_strided cannot spell ml_dtypes types
    bits = a.view(dtypes.int_view_of_numpy(a.dtype))
    return np.lib.stride_tricks.as_strided(bits, a.shape, fixed, subok=True).view(a.dtype)


def readonly_if_broadcast(arr: np.ndarray) -> np.ndarray:
    """``arr``, as a read-only view where it is a broadcast (zero-stride) one."""
    if (
        arr.size
        and arr.flags.writeable
        and any(st == 0 and n > 1 for st, n in zip(arr.strides, arr.shape, strict=True))
    ):
        arr = arr.view()
        arr.flags.writeable = False
    return arr
