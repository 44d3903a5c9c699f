"""interop: zero-copy exchange and chunked transfers between PyTorch, CuPy and NumPy."""

from __future__ import annotations

from . import errors
from ._torch_op import Array, array_namespace, torch_op
from .allocator import StreamMismatchError, use_torch_allocator
from .config import config
from .errors import *  # noqa: F403 (the error classes, errors.__all__)
from .exchange import to_cupy, to_numpy, to_torch
from .io.npy import load_npy, save_npy
from .pinned import Pinned, empty_pinned, pin
from .streams import stream
from .transfer import (
    Transfer,
    copy_to_device,
    copy_to_device_async,
    copy_to_host,
    copy_to_host_async,
)

__version__ = "0.1.0"

__all__ = [
    *errors.__all__,
    "Array",
    "Pinned",
    "StreamMismatchError",
    "Transfer",
    "__version__",
    "array_namespace",
    "config",
    "copy_to_device",
    "copy_to_device_async",
    "copy_to_host",
    "copy_to_host_async",
    "empty_pinned",
    "load_npy",
    "pin",
    "save_npy",
    "stream",
    "to_cupy",
    "to_numpy",
    "to_torch",
    "torch_op",
    "use_torch_allocator",
]
