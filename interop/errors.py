"""Exception classes of interop.

Every error derives from :class:`InteropError` and from the built-in exception
a user would already catch (``TypeError``, ``ValueError``, ``OSError`` and its
subclasses, ``BufferError``, ``ImportError``, ``RuntimeError``), so code
written for NumPy/PyTorch/CuPy errors keeps working and ``except
interop.InteropError`` catches everything interop raises on purpose.
"""

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


# ----------------------------------------------------------------- bad arguments


class InvalidTypeError(InteropError, TypeError):
    """An argument of a type interop does not take: not an array (or a masked,
    nested or sparse one), not a device, not a path, ``copy`` not a bool, an
    ``out`` of the wrong kind."""


class InvalidValueError(InteropError, ValueError):
    """An argument of the right type whose value interop refuses: an ``out`` of
    the wrong shape or dtype, read-only or overlapping the source; a device
    string that names no device; a setting outside its bounds."""


class UnknownSettingError(InteropError, AttributeError):
    """A name that is not a setting of :data:`interop.config`."""


class CopyRequiredError(InteropError, BufferError):
    """``copy=False`` was asked for, but the right values need a copy."""


class UnsupportedDtypeError(InteropError, TypeError):
    """The dtype cannot be represented by the target library."""


# ----------------------------------------------------------------- files


class NpyFormatError(InteropError, ValueError):
    """A file that is not a ``.npy`` file interop can read: corrupt, truncated,
    with an impossible header, or holding Python objects."""


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
    """A path :func:`save_npy` or :func:`load_npy` cannot use, or a file that could not
    be written or read. Each instance is also the ``OSError`` subclass its
    ``errno`` stands for (``PermissionError`` for ``EACCES``, ...), through the
    ``Path*Error`` classes; :func:`path_error` picks the class."""


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
    """A :class:`PathError` of the ``OSError`` subclass that ``code`` (an
    ``errno``) stands for, as ``OSError(code, ...)`` itself picks one."""
    cls = _PATH_ERRORS.get(code, PathError) if code is not None else PathError
    return cls(code, message, filename)


# ----------------------------------------------------------------- the machine


class BackendUnavailableError(InteropError, ImportError):
    """PyTorch or CuPy is needed but cannot be imported."""


class NoDeviceError(InteropError, RuntimeError):
    """A CUDA device is needed but none is visible."""


class CudaAfterForkError(NoDeviceError):
    """A CUDA device is needed, but this process was forked after CUDA was
    initialised in its parent, and CUDA cannot be used after ``fork``."""


class CaptureError(InteropError, RuntimeError):
    """A call that cannot run inside CUDA graph capture (it needs the host, pinned
    memory or an order between streams the capture cannot hold), refused before
    anything was queued: the capture stays valid."""


class MissingFakeError(InteropError, RuntimeError):
    """An :func:`interop.torch_op` without a fake implementation was traced
    (``torch.compile``, ``torch.export``, ``opcheck``): PyTorch needs its
    outputs' shapes and dtypes without running it. Pass ``like=`` to
    :func:`interop.torch_op`, or register one with ``op.register_fake``."""


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
    """A call that cannot work whatever its arguments: one ``config.set(...)``
    object entered twice, a setting deleted, ``Transfer.result()`` called by
    the transfer's own progress callback (it would wait for itself)."""


class TransferTimeoutError(InteropError, TimeoutError):
    """``Transfer.result(timeout=...)`` returned before the transfer finished
    (the transfer goes on)."""


class ReadOnlyWarning(UserWarning):
    """A read-only array was shared with a library that cannot mark it read-only."""
