"""Exception classes of interop: each derives from :class:`InteropError` and from
the built-in exception a user would already catch (docs/errors.md)."""

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
    """An argument of the right type whose value interop refuses (an ``out`` of the
    wrong shape, a device that does not exist, a setting out of bounds...)."""


class UnknownSettingError(InteropError, AttributeError):
    """A name that is not a setting of :data:`interop.config`."""


class CopyRequiredError(InteropError, BufferError):
    """``copy=False`` was asked for, but the right values need a copy."""


class UnsupportedDtypeError(InteropError, TypeError):
    """The dtype cannot be represented by the target library."""


class NpyFormatError(InteropError, ValueError):
    """A file that is not a ``.npy`` file interop can read (corrupt, truncated, objects)."""


class CheckpointFormatError(InteropError, ValueError):
    """A file that is not a safetensors checkpoint (or index) interop can read:
    a header that lies about the file, corrupt or truncated, or an index that
    disagrees with its shards. Refused before anything is allocated from it."""


class CheckpointMismatchError(InteropError, ValueError, RuntimeError):
    """A checkpoint whose tensors do not match the ones to fill (names, shapes,
    dtypes); refused before a byte is written. Also a ``RuntimeError``, as
    PyTorch's ``load_state_dict`` raises it."""


class SharedTensorsError(InteropError, RuntimeError):
    """Tensors that share memory (tied weights) where each must be saved or
    filled on its own; a ``RuntimeError``, as the safetensors package raises."""


class PathError(InteropError, OSError):
    """A path that cannot be used, or a file that could not be written or read; each
    instance is also the ``OSError`` subclass its ``errno`` stands for."""


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
    """A CUDA device is needed, but this process was forked after its parent
    initialised CUDA."""


class CaptureError(InteropError, RuntimeError):
    """A call that cannot run inside CUDA graph capture, refused before anything was
    queued (the capture stays valid)."""


class MissingFakeError(InteropError, RuntimeError):
    """An :func:`interop.torch_op` without a fake implementation was traced: pass
    ``like=`` or register one with ``op.register_fake``."""


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


class UsageError(InteropError, RuntimeError):
    """A call that cannot work whatever its arguments (a ``config.set(...)`` entered
    twice, ``Transfer.result()`` from its own progress callback...)."""


class TransferTimeoutError(InteropError, TimeoutError):
    """``Transfer.result(timeout=...)`` timed out (the transfer goes on)."""


class ReadOnlyWarning(UserWarning):
    """A read-only array was shared with a library that cannot mark it read-only."""
