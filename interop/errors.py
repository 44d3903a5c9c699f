"""Exception classes of interop.

Every error derives from :class:`InteropError` and from the built-in exception
a user would already catch (``BufferError``, ``TypeError``, ``ImportError``,
``RuntimeError``), so code written for NumPy/PyTorch/CuPy errors keeps working.
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailableError",
    "CopyRequiredError",
    "InteropError",
    "NoDeviceError",
    "ReadOnlyWarning",
    "TransferError",
    "UnsupportedDtypeError",
]


class InteropError(Exception):
    """Base class of every error raised by interop."""


class CopyRequiredError(InteropError, BufferError):
    """``copy=False`` was asked for, but the right values need a copy."""


class UnsupportedDtypeError(InteropError, TypeError):
    """The dtype cannot be represented by the target library."""


class BackendUnavailableError(InteropError, ImportError):
    """PyTorch or CuPy is needed but cannot be imported."""


class NoDeviceError(InteropError, RuntimeError):
    """A CUDA device is needed but none is visible."""


class TransferError(InteropError, RuntimeError):
    """A chunked transfer failed part-way.

    Attributes
    ----------
    bytes_done : int
        Length of the prefix of the destination (in source element order, in
        bytes) known to be complete and correct.
    nbytes : int
        Total size of the transfer in bytes.
    """

    def __init__(self, message: str, *, bytes_done: int = 0, nbytes: int = 0) -> None:
        super().__init__(message)
        self.bytes_done = bytes_done
        self.nbytes = nbytes


class ReadOnlyWarning(UserWarning):
    """A read-only array was shared with a library that cannot mark it read-only."""
