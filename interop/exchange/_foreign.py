"""Objects of other libraries as the source of an exchange: ``__dlpack__``
producers (CPU or CUDA) and ``__cuda_array_interface__`` objects, imported
zero-copy as a NumPy or CuPy array, then exchanged as one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _backends, arrays, streams
from ..errors import InvalidValueError
from . import _cupy, _numpy
from ._torch import cuda_context

if TYPE_CHECKING:
    import cupy
    import torch

    from ..arrays import Target

__all__: list[str] = []


def to_numpy(x: Any, copy: bool | None) -> np.ndarray:
    """``to_numpy`` of a foreign producer (or the error for a non-array)."""
    imported = arrays.import_foreign(x, "to_numpy")
    convert = _numpy.to_numpy if isinstance(imported, np.ndarray) else _cupy.to_numpy
    return convert(imported, copy)


def to_torch(x: Any, target: Target | None, copy: bool | None) -> torch.Tensor:
    """``to_torch`` of a foreign producer (CPU data through NumPy, as
    ``torch.from_dlpack`` aborts on negative strides)."""
    imported = _import(x, "to_torch", for_torch=True)
    convert = _numpy.to_torch if isinstance(imported, np.ndarray) else _cupy.to_torch
    return convert(imported, target, copy)


def to_cupy(x: Any, target: Target | None, copy: bool | None) -> cupy.ndarray:
    """``to_cupy`` of a foreign producer (``__cuda_array_interface__``: zero-copy)."""
    imported = _import(x, "to_cupy", for_torch=False)
    convert = _numpy.to_cupy if isinstance(imported, np.ndarray) else _cupy.to_cupy
    return convert(imported, target, copy)


def _import(x: Any, func: str, *, for_torch: bool) -> Any:
    """``x`` imported zero-copy as a NumPy or CuPy array; CUDA data for PyTorch
    on PyTorch's current stream (the producer orders its export after its work)."""
    if not arrays.is_array(x):
        raise arrays.not_an_array(func, x)
    if for_torch:
        _backends.torch()  # BackendUnavailableError before any work
    else:
        _backends.require_cupy_device()
    if not (hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__")):
        return arrays.cupy_from_dlpack(x, None, func)  # __cuda_array_interface__
    kind, index = arrays.dlpack_device(x, func)
    if kind in (arrays.DL_CPU, arrays.DL_CUDA_HOST):
        return arrays.host_from_dlpack(x, func)
    if kind not in (arrays.DL_CUDA, arrays.DL_CUDA_MANAGED):
        raise InvalidValueError(f"{func} expected CPU or CUDA data (got DLPack device {kind!r})")
    if not for_torch:
        return arrays.cupy_from_dlpack(x, index, func)
    _backends.require_cupy_device()
    with cuda_context(index), streams.cupy_stream(streams.torch_stream_handle(index), index):
        return arrays.cupy_from_dlpack(x, index, func)
