"""Objects of other libraries as the source of an exchange: ``__dlpack__``
producers (CPU or CUDA) and ``__cuda_array_interface__`` objects, imported
zero-copy as a NumPy or CuPy array, then exchanged as one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _backends
from ..arrays import (
    DL_CPU,
    DL_CUDA,
    DL_CUDA_HOST,
    DL_CUDA_MANAGED,
    Target,
    cupy_from_dlpack,
    dlpack_device,
    host_from_dlpack,
    import_foreign,
    is_array,
    not_an_array,
)
from ..errors import InvalidValueError
from ..streams import cupy_stream, torch_stream_handle
from . import _cupy, _numpy
from ._torch import cuda_context

if TYPE_CHECKING:
    import cupy
    import torch

__all__: list[str] = []


def to_numpy(x: Any, copy: bool | None) -> np.ndarray:
    """``to_numpy`` of a foreign producer (or the error for a non-array)."""
    imported = import_foreign(x, "to_numpy")
    if isinstance(imported, np.ndarray):
        return _numpy.to_numpy(imported, copy)
    return _cupy.to_numpy(imported, copy)


def to_torch(x: Any, target: Target | None, copy: bool | None) -> torch.Tensor:
    """``to_torch`` of a foreign producer: CUDA data is imported on PyTorch's
    current stream (the producer orders its export after its own work)."""
    if not is_array(x):
        raise not_an_array("to_torch", x)
    _backends.torch()  # BackendUnavailableError before any work
    if not (hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__")):
        return _cupy.to_torch(cupy_from_dlpack(x, None, "to_torch"), target, copy)
    kind, index = dlpack_device(x, "to_torch")
    if kind in (DL_CPU, DL_CUDA_HOST):
        # Through NumPy: torch.from_dlpack aborts on negative strides.
        return _numpy.to_torch(host_from_dlpack(x, "to_torch"), target, copy)
    if kind not in (DL_CUDA, DL_CUDA_MANAGED):
        raise InvalidValueError(f"to_torch expected CPU or CUDA data (got DLPack device {kind!r})")
    _backends.require_cupy_device()
    with cuda_context(index), cupy_stream(torch_stream_handle(index), index):
        c = cupy_from_dlpack(x, index, "to_torch")
    return _cupy.to_torch(c, target, copy)


def to_cupy(x: Any, target: Target | None, copy: bool | None) -> cupy.ndarray:
    """``to_cupy`` of a foreign producer (``__cuda_array_interface__``: zero-copy)."""
    if not is_array(x):
        raise not_an_array("to_cupy", x)
    _backends.require_cupy_device()
    if not (hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__")):
        imported = cupy_from_dlpack(x, None, "to_cupy")
    else:
        kind, index = dlpack_device(x, "to_cupy")
        if kind in (DL_CPU, DL_CUDA_HOST):
            imported = host_from_dlpack(x, "to_cupy")
        elif kind in (DL_CUDA, DL_CUDA_MANAGED):
            imported = cupy_from_dlpack(x, index, "to_cupy")
        else:
            raise InvalidValueError(
                f"to_cupy expected CPU or CUDA data (got DLPack device {kind!r})"
            )
    convert = _numpy.to_cupy if isinstance(imported, np.ndarray) else _cupy.to_cupy
    return convert(imported, target, copy)
