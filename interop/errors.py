"""Exception classes of interop, each also a built-in exception class (docs/errors.md)."""

from __future__ import annotations

import errno as _errno

__all__ = [
    "BackendUnavailableError",
    "CaptureError",
    "CheckpointFormatError",
    "CheckpointMismatchError",
    "CopyRequiredError",
    "CudaAfterForkError",
    "InteropError",
    "InvalidTypeError",
    "InvalidValueError",
    "MissingFakeError",
    "NoDeviceError",
    "NpyFormatError",
    "PathError",
    "PathExistsError",
    "PathIsADirectoryError",
    "PathNotADirectoryError",
    "PathNotFoundError",
    "PathPermissionError",
    "ReadOnlyWarning",
    "SharedTensorsError",
    "TransferError",
    "TransferTimeoutError",
    "UnknownSettingError",
    "UnsupportedDtypeError",
    "UsageError",
]


class InteropError(Exception):
    """Base class of every error raised by interop."""


class InvalidTypeError(InteropError, TypeError):
    """An argument of a type interop does not take (not an array, a device, a path...)."""


class InvalidValueError(InteropError, ValueError):
    """An argument of the right type whose value interop refuses (an ``out``'s shape...)."""


class UnknownSettingError(InteropError, AttributeError):
    """A name that is not a setting of :data:`interop.config`."""


class CopyRequiredError(InteropError, BufferError):
    """``copy=False`` was asked for, but the right values need a copy."""


class UnsupportedDtypeError(InteropError, TypeError):
    """The dtype cannot be represented by the target library."""


class NpyFormatError(InteropError, ValueError):
    """A file that is not a ``.npy`` file interop can read (corrupt, truncated, objects)."""


class CheckpointFormatError(InteropError, ValueError):
    """A safetensors checkpoint or index interop cannot read (corrupt, truncated, inconsistent)."""


class CheckpointMismatchError(InteropError, ValueError, RuntimeError):
    """A checkpoint whose tensors do not match the ones to fill (as ``load_state_dict``'s)."""


class SharedTensorsError(InteropError, RuntimeError):
    """Tensors that share memory (tied weights) where each must be saved or filled alone."""


class PathError(InteropError, OSError):
    """A path or file that cannot be used; also the ``OSError`` subclass of its ``errno``."""


class PathPermissionError(PathError, PermissionError):
    """The file or its directory may not be written (or read) by this process."""


class PathNotFoundError(PathError, FileNotFoundError):
    """The file, or the directory it would be in, does not exist."""


class PathIsADirectoryError(PathError, IsADirectoryError):
    """A directory where a file was expected."""


class PathNotADirectoryError(PathError, NotADirectoryError):
    """A file where a directory of the path was expected."""


class PathExistsError(PathError, FileExistsError):
    """A file that had to be created exists already."""


_PATH_ERRORS: dict[int, type[PathError]] = {
    _errno.EACCES: PathPermissionError,
    _errno.EPERM: PathPermissionError,
    _errno.ENOENT: PathNotFoundError,
    _errno.EISDIR: PathIsADirectoryError,
    _errno.ENOTDIR: PathNotADirectoryError,
    _errno.EEXIST: PathExistsError,
}


def path_error(code: int | None, message: str, filename: str) -> PathError:
    """A :class:`PathError` of the ``OSError`` subclass ``code`` (an errno) stands for."""
    cls = _PATH_ERRORS.get(code, PathError) if code is not None else PathError
    return cls(code, message, filename)


class BackendUnavailableError(InteropError, ImportError):
    """PyTorch or CuPy is needed but cannot be imported."""


class NoDeviceError(InteropError, RuntimeError):
    """A CUDA device is needed but none is visible."""


class CudaAfterForkError(NoDeviceError):
    """A CUDA device is needed, but this process was forked after CUDA was initialised."""


class CaptureError(InteropError, RuntimeError):
    """A call that cannot run inside CUDA graph capture (refused before anything is queued)."""


class MissingFakeError(InteropError, RuntimeError):
    """An :func:`interop.torch_op` without a fake implementation was traced."""


class TransferError(InteropError, RuntimeError):
    """A chunked transfer failed part-way.

    Attributes
    ----------
    bytes_done : int
        Bytes of the destination's prefix (in source element order) known complete.
    nbytes : int
        Total size of the transfer in bytes.
    """

    def __init__(self, message: str, *, bytes_done: int = 0, nbytes: int = 0) -> None:
        super().__init__(message)
        self.bytes_done = bytes_done
        self.nbytes = nbytes


class UsageError(InteropError, RuntimeError):
    """A call that cannot work whatever its arguments (``config.set(...)`` entered twice...)."""


class TransferTimeoutError(InteropError, TimeoutError):
    """``Transfer.result(timeout=...)`` timed out (the transfer goes on)."""


class ReadOnlyWarning(UserWarning):
    """A read-only array was shared with a library that cannot mark it read-only."""
