"""``save_npy`` / ``load_npy``: chunks between the file and the array (docs/npy.md)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _backends
from ..arrays import array_source, check_elements_apart, is_device_array, parse_device, target_str
from ..dtypes import numpy_view_of_cpu_tensor
from ..errors import (
    BackendUnavailableError,
    InteropError,
    InvalidTypeError,
    InvalidValueError,
    NoDeviceError,
    PathError,
    TransferError,
    path_error,
)
from ..pipeline.plan import nbytes_of
from ..pipeline.request import check_options
from ..pipeline.start import empty_device
from . import _format
from ._format import NpyHeader, read_npy_header
from .destination import Destination, prepare_destination, same_file

if TYPE_CHECKING:
    from ..arrays import Target

__all__ = ["NpyHeader", "load_npy", "read_npy_header", "save_npy"]


def save_npy(
    x: Any,
    path: str | os.PathLike[str],
    /,
    *,
    chunk_bytes: int | None = None,
    progress: Any = False,
) -> Path:
    """Write ``x`` to a standard ``.npy`` file, streaming chunk by chunk.

    Parameters
    ----------
    x : array
        A NumPy array, a PyTorch tensor or a CuPy array, any strides.
    path : str or os.PathLike
        Replaced atomically (a FIFO: written into); ``.npy`` added as by ``numpy.save``.
    chunk_bytes, progress
        As for :func:`interop.copy_to_host_async`.

    Returns
    -------
    pathlib.Path
        The path written.

    Notes
    -----
    Device data goes through the pinned staging ring, ordered after the
    producer's current stream; returns when the file is complete (not synced).

    Raises
    ------
    InvalidTypeError, InvalidValueError, UnsupportedDtypeError
        ``x`` is not an array (masked, object or ``torch.complex32`` data), a bad ``path``.
    PathError
        The destination is refused, or cannot be written (``ENOSPC``); it is untouched.
    TransferError
        A device chunk failed otherwise; the destination is untouched.
    """
    check_options(chunk_bytes, progress)  # refused before any file is made
    _format.refuse_masked(x, "save_npy expected an array", "x.filled(fill_value)")
    src = array_source(x, "save_npy")
    if src.dtype.hasobject:
        raise InvalidTypeError(f"save_npy expected numeric data (got dtype {src.dtype!r})")
    dtype = _format.file_dtype(src.dtype)
    header = _format.header_bytes(src.shape, dtype)
    nbytes = nbytes_of(src.shape, dtype.itemsize)
    dest = prepare_destination(path, "save_npy")  # every check before any data moves
    writer: _format.FileWriter | None = None
    try:
        with dest.open() as f:  # commit when complete, discard on any error
            f.write(header)
            f.flush()
            runs = (
                None if dest.streaming else _format.Runs(np.array([len(header)], np.int64), nbytes)
            )
            writer = _format.FileWriter(
                f.fileno(), runs, repr(str(dest.path)), src.obj, dtype=dtype
            )
            threads = 1 if dest.streaming else 0  # a FIFO or device: in order, by one thread
            options = {"chunk_bytes": chunk_bytes, "progress": progress, "threads": threads}
            _format.move(src, writer, "save_npy", "the file's data", **options)
    except TransferError as exc:
        cause = exc.__cause__
        if writer is not None and any(cause is e for e in writer.failed):
            assert isinstance(cause, OSError)  # the file could not be written
            raise _write_failed(dest, cause, exc.bytes_done) from cause
        what = "was cancelled" if cause is None else f"failed ({type(cause).__name__}: {cause})"
        done = exc.bytes_done if dest.streaming else 0  # no byte of an atomic save is kept
        message = f"save_npy {what}; {_what_is_left(dest, done)}"
        raise TransferError(message, bytes_done=done, nbytes=exc.nbytes) from cause
    except OSError as exc:
        if isinstance(exc, InteropError):
            raise
        raise _write_failed(dest, exc) from exc
    return dest.path


def _what_is_left(dest: Destination, data_done: int | None = None) -> str:
    """What a failed save left at its destination, for a message."""
    shown = repr(str(dest.path))
    if dest.streaming:
        done = "" if data_done is None else f" (the header and at least {data_done} data bytes)"
        return (
            f"{shown} is written into in place, not replaced: what was written before the "
            f"error{done} stays written, and a reader sees a truncated .npy file"
        )
    if os.path.lexists(dest.target):
        return f"the destination is untouched: {shown} still holds the file it held before"
    return f"the destination is untouched: no file was left under {shown}"


def _write_failed(dest: Destination, exc: OSError, data_done: int | None = None) -> PathError:
    """The :class:`PathError` (with its ``errno``) of a write or rename that failed."""
    shown, left = str(dest.path), _what_is_left(dest, data_done)
    message = f"save_npy could not write {shown!r}: {exc.strerror or exc}; {left}"
    return path_error(exc.errno, message, shown)


def _destination(header: NpyHeader, out: Any, target: Target | None) -> tuple[Any, bool]:
    """Validate or allocate the destination; return (destination, is_host)."""
    where = f"for {str(header.path)!r}"
    if out is None:
        if target is None or target[0] == "cpu":
            return np.empty(header.shape, header.dtype), True
        try:
            native = header.dtype.newbyteorder("=")
            return empty_device(header.shape, native, target[1], "load_npy"), False
        except (BackendUnavailableError, NoDeviceError) as exc:
            raise type(exc)(
                f"{exc}. load_npy(path) without device=, or with device='cpu', reads "
                f"{str(header.path)!r} into a NumPy array"
            ) from exc
    if not (isinstance(out, np.ndarray) or _backends.is_torch_tensor(out) or is_device_array(out)):
        raise InvalidTypeError(
            f"expected out {where} to be a NumPy array, a CuPy array or a torch tensor "
            f"(got {type(out).__module__}.{type(out).__qualname__})"
        )
    if getattr(out, "requires_grad", False):
        raise InvalidValueError(
            f"expected an out {where} that does not require grad (got a tensor with "
            "requires_grad=True); pass out.detach(), the same memory"
        )
    if _backends.is_torch_tensor(out) and (out.is_conj() or out.is_neg()):
        raise InvalidValueError(f"expected an out {where} without the conjugate/negative bit")
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        raise InvalidValueError(f"expected a writable out {where} (got a read-only array)")
    dst = array_source(out, "load_npy")
    host = not dst.on_device
    place: Target = ("cpu", None) if host else ("cuda", dst.cuda)
    if target is not None and (target[0] != place[0] or target[1] not in (None, place[1])):
        raise InvalidValueError(
            f"expected device to match out {where} (got device={target_str(target)} and out "
            f"on {target_str(place)}); pass out or device, not both"
        )
    want = header.dtype if host else header.dtype.newbyteorder("=")
    if dst.shape != header.shape or dst.dtype != want:
        swapped = dst.dtype.newbyteorder("=") == want.newbyteorder("=")
        if host and dst.shape == header.shape and swapped:
            name = "out" if isinstance(out, np.ndarray) else "out.numpy()"
            raise InvalidValueError(
                f"expected out {where} in the file's byte order, dtype {want.str!r} (got "
                f"{dst.dtype.str!r}); load_npy does not swap bytes in host memory: "
                f"numpy.copyto({name}, numpy.load(path, mmap_mode='r')) converts them"
            )
        raise InvalidValueError(
            f"expected out {where} with shape {header.shape} and dtype {want} "
            f"(got shape {dst.shape} and dtype {dst.dtype})"
        )
    check_elements_apart(out, "load_npy", f" {where}")
    if host:
        out = dst.obj if isinstance(out, np.ndarray) else numpy_view_of_cpu_tensor(out)
        _refuse_a_map_of_the_file(header, out)
    return out, host


def _may_map_a_file(a: np.ndarray) -> bool:
    """False where ``a``'s base chain ends in memory of its own (not a file mapping)."""
    obj: Any = a
    while isinstance(obj, np.ndarray):
        if obj.base is None:
            return not obj.flags.owndata
        obj = obj.base
    return True  # an mmap.mmap (numpy.memmap, numpy.load(mmap_mode=...)), a tensor, a buffer


_MAPS = "/proc/self/maps"
_Map = tuple[int, int, str, int, int]  # device, inode, name, start and end file offsets


def _shared_file_maps(out: np.ndarray, lo: int, hi: int) -> Iterator[_Map]:
    """The shared file mappings under addresses ``[lo, hi)`` (no :data:`_MAPS`: the memmap)."""
    try:
        with open(_MAPS) as f:
            lines = f.readlines()
    except OSError:
        yield from _memmap_of(out, lo, hi)
        return
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 5 or fields[4] == "0" or not fields[1].endswith("s"):
            continue  # anonymous or private memory
        start, end = (int(n, 16) for n in fields[0].split("-"))
        if start < hi and end > lo:
            major, minor = (int(n, 16) for n in fields[3].split(":"))
            name = fields[5].rstrip("\n") if len(fields) > 5 else ""
            at = int(fields[2], 16) - start  # file offset of an address
            dev, inode = os.makedev(major, minor), int(fields[4])
            yield dev, inode, name, at + max(lo, start), at + min(hi, end)


def _memmap_of(out: np.ndarray, lo: int, hi: int) -> Iterator[_Map]:
    """As :func:`_shared_file_maps`, from the ``numpy.memmap`` under ``out``."""
    root: Any = None
    obj: Any = out
    while isinstance(obj, np.ndarray):
        if isinstance(obj, np.memmap) and not isinstance(obj.base, np.ndarray):
            root = obj  # the memmap made on the mapping itself: offset is its first byte
        obj = obj.base
    if root is None or not getattr(root, "filename", None) or root.mode == "c":
        return  # no memmap, or a copy-on-write one (it never writes the file)
    try:
        st = os.stat(root.filename)
    except OSError:
        return
    at = root.offset - root.ctypes.data
    yield st.st_dev, st.st_ino, root.filename, at + lo, at + hi


def _refuse_a_map_of_the_file(header: NpyHeader, out: np.ndarray) -> None:
    """Refuse an ``out`` over a shared mapping of bytes of the file being read."""
    # later chunks would read changed bytes; no overlap check sees two mappings of one file
    if not out.size or not _may_map_a_file(out):
        return
    lo, hi = np.lib.array_utils.byte_bounds(out)
    try:
        st = os.stat(header.path)
    except OSError:
        return  # the read that follows reports it
    size = header.offset + header.nbytes
    for dev, inode, name, start, end in _shared_file_maps(out, lo, hi):
        if inode != st.st_ino or start >= size or end <= 0:
            continue
        # btrfs and overlayfs show another device number in the maps
        if dev == st.st_dev or (name.startswith("/") and same_file(Path(name), st)):
            raise InvalidValueError(
                f"expected out for {str(header.path)!r} not to be a memory map of that file "
                f"(got an array over bytes [{max(start, 0)}, {min(end, size)}) of it); load "
                "into new memory and copy: out[...] = interop.load_npy(path)"
            )


def _c_order_view(dest: Any, fortran: bool) -> Any:
    """The destination as seen in the file's storage order (C order)."""
    if not fortran or len(getattr(dest, "shape", ())) < 2:
        return dest
    if _backends.is_torch_tensor(dest):
        return dest.permute(*reversed(range(dest.dim())))
    return dest.T


def load_npy(
    path: str | os.PathLike[str],
    /,
    out: Any = None,
    *,
    device: Any = None,
    chunk_bytes: int | None = None,
    progress: Any = False,
) -> Any:
    """Read a ``.npy`` file chunk by chunk into host (or device) memory.

    Parameters
    ----------
    path : str or os.PathLike
        A ``.npy`` file (format 1.0, 2.0 or 3.0, C or Fortran order).
    out : numpy.ndarray, cupy.ndarray or torch.Tensor, optional
        The file's shape and dtype, any strides.
    device : optional
        Without ``out``: None or ``"cpu"`` (NumPy), or a CUDA device (CuPy).
    chunk_bytes, progress
        As for :func:`interop.copy_to_host_async`.

    Returns
    -------
    numpy.ndarray, cupy.ndarray or torch.Tensor
        ``out`` itself when given, else a new array.

    Notes
    -----
    Chunks go straight into host memory, or through the pinned staging ring
    after the destination library's current stream; returns when the data is there.

    Raises
    ------
    NpyFormatError
        A corrupt, truncated or object-dtype file, or a header ``numpy.load`` would not parse.
    InvalidValueError, InvalidTypeError
        A wrong ``out``, ``device`` or ``path``; a file replaced since its header was read.
    BackendUnavailableError, NoDeviceError, CaptureError
        A CUDA ``device`` without CuPy or a visible GPU, or inside CUDA graph capture.
    PathError
        The file cannot be opened, or is no regular file.
    TransferError
        Reading failed part-way; the message says which byte range is complete.
    """
    try:
        target = parse_device(device)
    except (TypeError, ValueError) as exc:
        raise type(exc)(
            "load_npy expected device to be None or 'cpu' (a NumPy array), or 'cuda', 'cuda:N', "
            f"an int, a torch.device or a cupy.cuda.Device (a CuPy array) (got {device!r})"
        ) from None
    check_options(chunk_bytes, progress)
    header = read_npy_header(path)
    dest, host = _destination(header, out, target)
    result = dest if out is None else out
    view = _c_order_view(dest if host else result, header.fortran_order)
    fd = _format.open_unchanged(header.path, header.identity, "load_npy")
    try:
        runs = _format.Runs(np.array([header.offset], np.int64), header.nbytes)
        reader = _format.FileReader(fd, runs, repr(str(header.path)), view, dtype=header.dtype)
        options = {"chunk_bytes": chunk_bytes, "progress": progress}
        _format.move(
            array_source(view, "load_npy"), reader, "load_npy", "the file's data", **options
        )
    finally:
        os.close(fd)
    return result
