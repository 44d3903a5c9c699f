"""NumPy arrays (and NumPy scalars, as 0-d arrays) as the source of an exchange."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _backends, dtypes
from ..arrays import target_str
from ..errors import BackendUnavailableError, NoDeviceError, ReadOnlyWarning
from ..transfer import copy_to_device
from ._layout import copy_required, normalise_strides, readonly_if_broadcast, unshareable

if TYPE_CHECKING:
    import cupy
    import torch

    from ..arrays import Target

# to_torch's common case, answered before the general rules (which give the same result)
_SHAREABLE: dict[np.dtype, bool] = {}  # native dtypes torch.from_numpy takes as they are


def plain_torch_view(a: np.ndarray) -> torch.Tensor | None:
    """``torch.from_numpy(a)`` for a plain array PyTorch shares as it is, else None."""
    dtype = a.dtype
    ok = _SHAREABLE.get(dtype)
    if ok is None:
        ok = _SHAREABLE[dtype] = _shareable(dtype)
    flags = a.flags
    if not (ok and flags.c_contiguous and flags.aligned and flags.writeable):
        return None
    shape = a.shape
    if 1 in shape or 0 in shape:  # C-contiguous, yet any stride on such an axis: the rules
        return None
    return _backends.torch().from_numpy(a)


def _shareable(dtype: np.dtype) -> bool:
    # NumPy's "aligned" is to dtype.alignment (8 for complex128); PyTorch needs the itemsize
    if not dtype.isnative or not dtypes.is_standard(dtype) or dtype.alignment != dtype.itemsize:
        return False
    try:
        dtypes.torch_dtype_of_numpy(dtype)
    except Exception:
        return False
    return True


def to_numpy(a: np.ndarray, copy: bool | None) -> np.ndarray:
    if copy:
        return a.copy(order="K")
    return readonly_if_broadcast(a)


def to_torch(a: np.ndarray, target: Target | None, copy: bool | None) -> torch.Tensor:
    _backends.torch()  # BackendUnavailableError before any work
    if target is not None and target[0] == "cuda":
        if copy is False:
            raise copy_required(f"moving a NumPy array to {target_str(target)}")
        return torch_copy(a, target[1])
    return share_with_torch(a, copy)


def share_with_torch(a: np.ndarray, copy: bool | None) -> torch.Tensor:
    """A CPU tensor sharing ``a``'s memory where PyTorch can, else holding a copy."""
    th = _backends.torch()
    native = a.dtype if a.dtype.isnative else a.dtype.newbyteorder("=")
    dtypes.torch_dtype_of_numpy(native)  # UnsupportedDtypeError before any copy
    copied = False
    if not a.dtype.isnative:
        if a.dtype.itemsize == 1:
            a = a.view(native)  # one byte has no byte order (ml_dtypes' float8 keep a flag)
        elif copy is False:
            shown = a.dtype.str if dtypes.is_standard(native) else a.dtype.byteorder + native.name
            raise copy_required(f"an array in non-native byte order ({shown!r})")
        else:
            a = a.astype(native)
            copied = True
    if unshareable(a):  # rare: checked once in the common case
        a = normalise_strides(a)
        problem = unshareable(a)
        if problem:
            if copy is False:
                raise copy_required(f"an array with {problem}")
            a = a.copy(order="C")  # a fresh, aligned C array (0-d stays 0-d)
            copied = True
    if copy and not copied:
        a = a.copy(order="K")
    ml = dtypes.ml_view_of_numpy(a.dtype)
    src = a if ml is None else a.view(ml[1])
    if src.flags.writeable:
        t = th.from_numpy(src)
    else:
        warnings.warn(
            "to_torch shares a read-only NumPy array, which PyTorch cannot mark read-only; "
            "pass copy=True for a writable copy",
            ReadOnlyWarning,
            stacklevel=4,  # the caller of interop.to_torch
        )
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            t = th.from_numpy(src)
    return t if ml is None else t.view(ml[0])


def torch_copy(x: Any, index: int | None) -> torch.Tensor:
    """A new CUDA tensor on device ``index`` (None: current) holding NumPy, CuPy or CPU ``x``."""
    # copy_to_device where CuPy can drive the copy (bits applied chunk by chunk), else Tensor.to
    th = _backends.require_torch_cuda()
    device = th.device("cuda", th.cuda.current_device() if index is None else index)
    try:
        _backends.require_cupy_device()
    except (BackendUnavailableError, NoDeviceError):  # host data only: CuPy data has a device
        if isinstance(x, np.ndarray):
            x = share_with_torch(x, True)  # a private copy: no read-only warning
        return x.resolve_conj().resolve_neg().to(device)
    dtype = x.dtype if _backends.is_torch_tensor(x) else dtypes.torch_dtype_of_numpy(x.dtype)
    return copy_to_device(x, th.empty(tuple(x.shape), dtype=dtype, device=device))


def to_cupy(a: np.ndarray, target: Target | None, copy: bool | None) -> cupy.ndarray:
    """``to_cupy`` of a NumPy array: always a copy, through the pinned ring."""
    _backends.require_cupy_device()
    if copy is False:
        raise copy_required("a NumPy array (to_cupy returns device memory)")
    # copy_to_device refuses a dtype CuPy cannot hold, before any work
    return copy_to_device(a, device=None if target is None else target[1])
