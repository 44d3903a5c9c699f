"""Which memory PyTorch can share as it is, and read-only broadcast views."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import dtypes
from ..errors import CopyRequiredError


def copy_required(what: str) -> CopyRequiredError:
    return CopyRequiredError(f"copy=False, but {what} needs a copy; pass copy=None or copy=True")


def unshareable(a: Any) -> str | None:
    """What keeps PyTorch from sharing NumPy or CuPy ``a`` as it is, in words; or None."""
    strides, itemsize = a.strides, a.dtype.itemsize
    if strides and min(strides) < 0:
        return f"negative strides {strides} (PyTorch has none)"
    if itemsize > 1:
        for st in strides:  # a loop: any() with a generator costs twice as much here
            if st % itemsize:
                return (
                    f"byte strides {strides} that are not multiples of its itemsize "
                    f"{itemsize} (PyTorch counts strides in elements)"
                )
    if isinstance(a, np.ndarray) and a.dtype.alignment == itemsize and a.flags.aligned:
        return None  # NumPy checked the address already (the common, fast case)
    if not a.size or itemsize <= 1:
        return None
    address = int(a.ctypes.data) if isinstance(a, np.ndarray) else int(a.data.ptr)
    if address % itemsize:
        return (
            f"data at a byte offset that is not a multiple of its itemsize {itemsize} "
            "(PyTorch needs aligned elements)"
        )
    return None


def normalise_strides(a: np.ndarray) -> np.ndarray:
    """A zero-copy view of ``a`` whose size-1 axes have stride 0 (zero-size: a new array)."""
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
