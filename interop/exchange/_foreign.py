"""``__dlpack__`` / ``__cuda_array_interface__`` objects, exchanged as NumPy or CuPy arrays."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _backends, arrays, streams
from . import _cupy, _numpy
from ._torch import cuda_context

if TYPE_CHECKING:
    import cupy
    import torch

    from ..arrays import Target


def to_numpy(x: Any, copy: bool | None) -> np.ndarray:
    a = arrays.import_foreign(x, "to_numpy")
    return (_numpy if isinstance(a, np.ndarray) else _cupy).to_numpy(a, copy)


def to_torch(x: Any, target: Target | None, copy: bool | None) -> torch.Tensor:
    a = arrays.import_foreign(x, "to_torch", _backends.torch, _on_torch_stream)
    return (_numpy if isinstance(a, np.ndarray) else _cupy).to_torch(a, target, copy)


def to_cupy(x: Any, target: Target | None, copy: bool | None) -> cupy.ndarray:
    a = arrays.import_foreign(x, "to_cupy", _backends.require_cupy_device)
    return (_numpy if isinstance(a, np.ndarray) else _cupy).to_cupy(a, target, copy)


@contextlib.contextmanager
def _on_torch_stream(index: int) -> Iterator[None]:
    """Device ``index`` current, CuPy on PyTorch's current stream there (the consumer)."""
    with cuda_context(index), streams.cupy_stream(streams.torch_stream_handle(index), index):
        yield
