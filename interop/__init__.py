"""interop: zero-copy, stream-ordered exchange and chunked transfers between
PyTorch, CuPy and NumPy.

``import interop`` imports neither torch nor cupy; each is imported the first
time a call needs it.
"""

from __future__ import annotations

from .errors import (
    BackendUnavailableError,
    CopyRequiredError,
    InteropError,
    NoDeviceError,
    ReadOnlyWarning,
    TransferError,
    UnsupportedDtypeError,
)
from .exchange import to_cupy, to_numpy, to_torch

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailableError",
    "CopyRequiredError",
    "InteropError",
    "NoDeviceError",
    "ReadOnlyWarning",
    "TransferError",
    "UnsupportedDtypeError",
    "__version__",
    "to_cupy",
    "to_numpy",
    "to_torch",
]
