"""Stream arrays to and from ``.npy`` files in chunks: ``save_npy`` / ``load_npy``.

Neither function holds the whole array in host memory: ``save_npy`` writes the
standard ``.npy`` header (``numpy.lib.format``) and then the data chunk by chunk
in C order, from the transfer pipeline's host buffers; ``load_npy`` reads the
file chunk by chunk into bounded buffers and streams each chunk to its
destination. A file mapping of the whole file is deliberately not used: every
page written through a mapping stays in the process's resident memory.

bfloat16 and float8 arrays are written with their ``ml_dtypes`` name as the
header's ``descr`` (``'bfloat16'``, ``'float8_e4m3fn'``, ...). ``numpy.load``
reads such a file back with the right dtype once ``ml_dtypes`` has been
imported (it registers those names with NumPy); without ``ml_dtypes``
``numpy.load`` refuses the file instead of returning raw bytes. (``numpy.save``
itself writes such arrays as opaque ``'<V2'`` records and loses the dtype.)
"""

from __future__ import annotations

import errno
import io
import math
import os
import stat
import struct
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
from numpy.lib import format as npformat

from .. import _backends, dtypes
from ..arrays import (
    Source,
    array_source,
    check_elements_apart,
    host_values,
    is_device_array,
    numpy_view_of_cpu_tensor,
    parse_device,
)
from ..config import chunk_bytes_or_default, config
from ..errors import (
    BackendUnavailableError,
    InteropError,
    InvalidTypeError,
    InvalidValueError,
    NoDeviceError,
    NpyFormatError,
    PathError,
    TransferError,
    path_error,
)
from ..pipeline.plan import Plan, c_order_chunks, nbytes_of, split_bytes
from ..pipeline.progress import Progress, check_progress
from ..pipeline.schedule import HostTask
from ..pipeline.start import HostStep, device_to_host, host_to_device
from ..transfer import empty_device
from .destination import Destination, checked_path, file_kind, prepare_destination

if TYPE_CHECKING:
    from ..arrays import Target

__all__ = ["NpyHeader", "load_npy", "read_npy_header", "save_npy"]


# ----------------------------------------------------------------------- header


@dataclass(frozen=True)
class NpyHeader:
    """What a ``.npy`` header says, checked against the file's size.

    Attributes
    ----------
    path : pathlib.Path
    shape : tuple of int
    dtype : numpy.dtype
    fortran_order : bool
        True if the data is stored in Fortran (column-major) order.
    offset : int
        Byte offset of the data in the file.
    nbytes : int
        Size of the data in bytes.
    identity : tuple of int
        The file's device, inode, size and modification time (``st_mtime_ns``)
        when the header was read: a reader that finds another identity is
        reading a file replaced or changed since.
    """

    path: Path
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool
    offset: int
    nbytes: int
    identity: tuple[int, int, int, int]


# numpy.load's default max_header_size: a longer header is not parsed (its
# literal_eval could take unbounded memory and time on an untrusted file).
_MAX_HEADER_SIZE = 10_000


def file_identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """Device, inode, size and ``st_mtime_ns``: what changes when a file is replaced or written."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def open_unchanged(
    path: str | os.PathLike[str], identity: tuple[int, ...], what: str, *, same_machine: bool = True
) -> int:
    """Open ``path`` for reading; refuse it if it is not the file of
    ``identity`` (:func:`file_identity`) any more: replaced (``os.replace``)
    or written since. On another machine than the one that took ``identity``
    a shared file has another device number, so the rest is compared."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    now = file_identity(os.fstat(fd))
    first = 0 if same_machine else 1  # the device number holds on one machine only
    if now[first:] != tuple(identity)[first:]:
        os.close(fd)
        raise InvalidValueError(
            f"{what}: expected the file whose header was read, (device, inode, size, mtime_ns) "
            f"{tuple(identity)} (got {now}); it was replaced or changed since: call load_npy "
            "again"
        )
    return fd


def _header_length(f: BinaryIO, version: tuple[int, int]) -> int:
    """The header length a file of ``version`` states (``f`` left where it was)."""
    size = "<H" if version == (1, 0) else "<I"
    raw = f.read(struct.calcsize(size))
    f.seek(-len(raw), os.SEEK_CUR)
    return struct.unpack(size, raw)[0] if len(raw) == struct.calcsize(size) else 0


def _descr(dtype: np.dtype) -> Any:
    if dtypes.is_ml_dtype(dtype):
        return dtype.name  # numpy.load resolves the name once ml_dtypes is imported
    return npformat.dtype_to_descr(dtype)


def _file_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a file stores ``dtype``'s values in: itself, but bfloat16 and
    float8 in native byte order (a header names them, with no byte order)."""
    native = dtype.newbyteorder("=")
    return native if dtypes.is_ml_dtype(native) else dtype


def _header_bytes(shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    header = {"descr": _descr(dtype), "fortran_order": False, "shape": tuple(shape)}
    buf = io.BytesIO()
    try:
        npformat.write_array_header_1_0(buf, header)
    except ValueError:  # header longer than 65535 bytes
        buf = io.BytesIO()
        npformat.write_array_header_2_0(buf, header)
    return buf.getvalue()


def _read_array_header_3_0(f: BinaryIO) -> tuple[Any, bool, np.dtype]:
    """Read a format 3.0 header: format 2.0 with the header text in UTF-8.

    ``numpy.lib.format`` reads 3.0 only inside ``numpy.load``; here the text is
    handed to its public 2.0 reader with non-ASCII characters written as
    escapes (they occur only inside the header's string literals, so the
    header means the same), leaving ``f`` at the start of the data.
    """
    size_bytes = f.read(4)
    if len(size_bytes) < 4:
        raise ValueError("EOF while reading the header length")
    (size,) = struct.unpack("<I", size_bytes)
    text = f.read(size)
    if len(text) < size:
        raise ValueError(f"EOF while reading a header of {size} bytes")
    escaped = text.decode("utf-8").encode("ascii", "backslashreplace")
    return npformat.read_array_header_2_0(
        io.BytesIO(struct.pack("<I", len(escaped)) + escaped), max_header_size=len(escaped)
    )


_HEADER_READERS: dict[tuple[int, int], Callable[[BinaryIO], tuple[Any, bool, np.dtype]]] = {
    (1, 0): npformat.read_array_header_1_0,
    (2, 0): npformat.read_array_header_2_0,
    (3, 0): _read_array_header_3_0,
}


def read_npy_header(path: str | os.PathLike[str]) -> NpyHeader:
    """Read and check the header of a ``.npy`` file without reading its data.

    Formats 1.0, 2.0 and 3.0 (a UTF-8 header) are read, as by ``numpy.load``.

    Raises
    ------
    NpyFormatError
        The file is not a ``.npy`` file, its header is corrupt, longer than
        the 10000 bytes ``numpy.load`` parses by default (the message says
        how to map such a file with ``numpy.load`` if it is trusted), or gives
        an impossible shape (a dimension that is negative, not an int, a
        bool, or more bytes than this machine can address), it holds Python
        objects (never unpickled), or its size does not match the header
        (truncated or with trailing bytes). The message names the file. A
        ``ValueError``.
    PathNotFoundError, PathPermissionError, PathIsADirectoryError, PathError
        No such file, a file this process may not read, a directory, a FIFO,
        socket or device (refused without reading from it: the data is read
        at offsets), or another reason the file cannot be opened (also
        ``FileNotFoundError``, ``PermissionError``, ``IsADirectoryError``,
        ``OSError``).
    InvalidTypeError
        ``path`` is not a str or ``os.PathLike`` (a ``TypeError``).
    InvalidValueError
        ``path`` holds a NUL byte (a ``ValueError``).
    """
    path = Path(checked_path(path, "load_npy"))
    shown = repr(str(path))
    try:
        # O_NONBLOCK: opening a FIFO without a writer would wait for one
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        where = ""
        if not path.is_absolute() and isinstance(exc, FileNotFoundError):
            where = f" (relative to the current directory {os.getcwd()!r})"
        raise path_error(
            exc.errno, f"load_npy cannot read {shown}{where}: {exc.strerror}", str(path)
        ) from exc
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        if stat.S_ISDIR(st.st_mode):
            why, code = "pass the path of a .npy file in it", errno.EISDIR
        else:
            why = (
                "load_npy reads a regular file at offsets (nothing was read from it): save "
                "the data to a regular file first and load that"
            )
            code = errno.ESPIPE
        raise path_error(
            code, f"load_npy cannot read {shown}: it is {file_kind(st.st_mode)}; {why}", str(path)
        )
    with open(fd, "rb") as f:
        try:
            version = npformat.read_magic(f)
            if version not in _HEADER_READERS:
                raise ValueError(
                    f"unsupported .npy format version {version[0]}.{version[1]} "
                    "(expected 1.0, 2.0 or 3.0)"
                )
            length = _header_length(f, version)
            if length <= _MAX_HEADER_SIZE:
                shape, fortran, dtype = _HEADER_READERS[version](f)
        except (ValueError, SyntaxError, OSError, UnicodeDecodeError) as exc:
            raise NpyFormatError(f"{shown} is not a readable .npy file: {exc}") from exc
        offset = f.tell()
    if length > _MAX_HEADER_SIZE:
        raise NpyFormatError(
            f"{shown} is not read by load_npy: its header is {length} bytes, more than the "
            f"{_MAX_HEADER_SIZE} bytes numpy.load parses unless told to (a long header is slow "
            "or unsafe to parse). If you trust the file, map it with numpy.load(path, "
            f"mmap_mode='r', max_header_size={length}) and copy from the map: "
            "interop.copy_to_device(mapped) or interop.copy_to_host(mapped, out) streams it "
            "in chunks"
        )
    if any(type(n) is not int for n in shape):  # numpy's reader lets True and False through
        raise NpyFormatError(
            f"{shown} is not a readable .npy file: its header gives shape {shape!r} (expected "
            "a tuple of ints)"
        )
    dtype = np.dtype(dtype)
    shape = tuple(shape)
    if dtype.hasobject:
        raise NpyFormatError(
            f"{str(path)!r} holds Python objects (dtype {dtype!r}); interop never unpickles: "
            "use numpy.load(path, allow_pickle=True) if you trust the file"
        )
    if any(n < 0 for n in shape):
        raise NpyFormatError(
            f"{str(path)!r} is not a readable .npy file: its header gives shape {shape}, "
            "with a negative dimension"
        )
    # NumPy's own limit: the size with zero dimensions counted as 1 must fit
    # (so a zero-size shape with huge dimensions is refused as well).
    if math.prod(max(n, 1) for n in shape) * dtype.itemsize > sys.maxsize:
        raise NpyFormatError(
            f"{str(path)!r} is not a readable .npy file: its header gives shape {shape} of "
            f"{dtype}, more than the {sys.maxsize} bytes an array can have on this machine"
        )
    nbytes = math.prod(shape) * dtype.itemsize
    size = st.st_size
    if size != offset + nbytes:
        state = "truncated" if size < offset + nbytes else "longer than its header says"
        raise NpyFormatError(
            f"{str(path)!r} is {state}: expected {offset + nbytes} bytes "
            f"({offset} header + {nbytes} data for shape {shape} {dtype}), got {size}"
        )
    return NpyHeader(path, shape, dtype, bool(fortran), offset, nbytes, file_identity(st))


# ----------------------------------------------------------------------- helpers


def _as_bytes(a: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array (any dtype, ml_dtypes included)."""
    return a.reshape(-1).view(np.uint8).data


def _host_chunks(
    x: Any, shape: tuple[int, ...], dtype: np.dtype, chunk: int
) -> Iterator[np.ndarray]:
    """Yield C-contiguous host arrays covering host data ``x`` in C order.

    Each chunk is converted on its own (a tensor's conjugate/negative bit is
    applied chunk by chunk, the byte order converted to ``dtype``'s); a
    contiguous chunk of ``dtype`` is yielded without a copy, any other through
    one chunk buffer, valid until the next one is requested.
    """
    if not nbytes_of(shape, dtype.itemsize):
        return
    buffer = np.empty(max(chunk, dtype.itemsize), np.uint8)
    for idx in c_order_chunks(shape, dtype.itemsize, chunk):
        part = host_values(x[idx])
        if part.flags.c_contiguous and part.dtype == dtype:
            yield part
        else:
            out = buffer[: part.nbytes].view(dtype).reshape(part.shape)
            np.copyto(out, part)
            yield out


def _write_all(fd: int, view: memoryview, offset: int | None) -> None:
    """Write all of ``view`` at ``offset`` (``os.pwrite``), or at the file's
    position when ``offset`` is None (a FIFO or a device)."""
    while len(view):
        n = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        view = view[n:]
        if offset is not None:
            offset += n


def _into_file(
    fd: int, offset: int, positioned: bool, threads: int, failed: list[OSError]
) -> HostStep:
    """Write each slot at its chunk's offset in the file (``os.pwrite``, split
    across host threads); in order with one thread where the file has no
    positions. A write that fails is added to ``failed`` (so the caller can
    tell it from the pipeline's other errors) and re-raised."""

    def write(view: memoryview, at: int | None) -> None:
        try:
            _write_all(fd, view, at)
        except OSError as exc:
            failed.append(exc)
            raise

    def step(plan: Plan) -> Callable[[int], list[HostTask]]:
        def tasks(i: int) -> list[HostTask]:
            base = offset + plan.starts[i]
            if not positioned:
                return [lambda buf: write(buf.data, None)]

            def piece(lo: int, hi: int) -> HostTask:
                return lambda buf: write(buf[lo:hi].data, base + lo)

            return [piece(lo, hi) for lo, hi in split_bytes(plan.sizes[i], threads)]

        return tasks

    return step


def _write_data(f: BinaryIO, src: Source, chunk: int, progress: Any, failed: list[OSError]) -> None:
    """Write the data of ``src`` after the header already in ``f``.

    Host data is written chunk by chunk; device data goes through the
    device-to-host slot pipeline, whose host threads write each pinned slot
    straight into the file at its offset (no host copy of the array); a
    write of theirs that fails is added to ``failed``.
    """
    nbytes = nbytes_of(src.shape, src.dtype.itemsize)
    if not src.on_device:
        bar = Progress(progress, nbytes, "save_npy")
        try:
            for part in _host_chunks(src.obj, src.shape, _file_dtype(src.dtype), chunk):
                f.write(_as_bytes(part))
                bar.add(part.nbytes)
            if not nbytes:
                bar.add(0)
        finally:
            bar.close()
        return
    f.flush()
    fd = f.fileno()
    positioned = stat.S_ISREG(os.fstat(fd).st_mode)
    offset = f.tell() if positioned else 0
    threads = config.host_threads if positioned else 1
    device_to_host(
        src,
        chunk,
        _into_file(fd, offset, positioned, threads, failed),
        result=None,
        progress=progress,
        func="save_npy",
        order="the file's data",
        threads=threads,
    ).result()
    if positioned:
        f.seek(offset + nbytes)


# ----------------------------------------------------------------------- save


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
        A NumPy array (memmaps included), a PyTorch tensor (CPU or CUDA) or a
        CuPy array, any strides.
    path : str or os.PathLike
        Destination. ``.npy`` is appended when the name has no suffix, as
        ``numpy.save`` does (``"weights"`` is written as ``"weights.npy"``;
        ``"x.bin"`` is kept), except for an existing FIFO or character device.
        What happens at the path:

        - a new or regular file: the data is written to a temporary file in
          the same directory, renamed to ``path`` only when complete, so an
          interrupted or failed save never leaves a partial file under
          ``path`` (an existing file stays as it was, byte for byte). On
          Linux file systems with ``O_TMPFILE`` (tmpfs, ext4, xfs, btrfs...)
          the temporary file has no name until the data is complete, so even
          a process killed mid-save leaves nothing behind; elsewhere it is a
          short hidden file (``.NAME.XXXXXXXX.tmp``), which a killed process
          leaves. A replaced file keeps its mode bits, and its owner and group
          where this process may set them;
        - a symlink: followed; the file it points to is replaced (the
          temporary is made beside that file) and the link stays;
        - a FIFO or character device: written into, in order, as
          ``numpy.save`` writes it (no temporary, no rename; what was written
          before an error stays written);
        - a directory (or a path ending in a separator): ``IsADirectoryError``;
          a socket or block device: ``OSError``.

        A file this process may not write is refused with ``PermissionError``,
        as ``numpy.save`` refuses it (root may write a 0444 file, as with
        ``numpy.save``; it keeps mode 0444). So is a file in a directory
        where the temporary cannot be created (``numpy.save`` would overwrite
        such a file in place; a save that cannot be atomic is refused).
    chunk_bytes : int, optional
        Chunk size; default ``interop.config.chunk_bytes`` (at least 64 KiB
        is used).
    progress : bool or callable
        ``True`` shows a tqdm bar in bytes; a callable is called as
        ``progress(bytes_done, bytes_total)``.

    Returns
    -------
    pathlib.Path
        The path written: ``path``, with ``.npy`` appended where it was added.

    Notes
    -----
    Copy semantics: the file is a copy; ``x`` is not modified and no
    full-size host copy is made. Device data goes through the pinned staging
    ring of :func:`interop.copy_to_host`, ordered after the work queued on the
    producer's current stream, and host threads write each slot straight into
    the file at its offset; the call returns when the file is complete. Extra
    host memory: one chunk buffer (strided host data) or the staging ring.
    bfloat16/float8 data is written under its ``ml_dtypes`` name (see the
    module docstring for reading it with ``numpy.load``). The file is not
    synced to disk (``numpy.save`` does not either). A replaced file of 8 MiB
    or more on a local file system is freed by a background thread just
    after the rename: the name is the new file's when the call returns, and
    the old file's disk space comes back a moment later.

    Raises
    ------
    InvalidTypeError
        ``x`` is not an array, or a masked array (a ``.npy`` file has no room
        for the mask: save ``x.filled(...)``, or ``x.data`` and its mask
        apart), a nested or sparse tensor, object data; or ``path`` is not a
        path. A ``TypeError``, raised before any data moves.
    InvalidValueError
        A meta tensor, an empty ``path`` or one with a NUL byte, or a
        ``chunk_bytes`` out of bounds (a ``ValueError``, before any data
        moves).
    UnsupportedDtypeError
        ``x``'s dtype has no NumPy equivalent (``torch.complex32``, quantized).
    PathIsADirectoryError, PathNotFoundError, PathNotADirectoryError, PathPermissionError
        The destination is refused (see ``path``), before any data moves; each
        is also the ``OSError`` subclass of its name (``IsADirectoryError``, ...).
    PathError
        The file cannot be written (a full disk: ``errno.ENOSPC``, a file
        size limit: ``EFBIG``, an I/O error), for host and device sources
        alike: an ``OSError`` with the failure's ``errno`` and the path as
        ``filename``. The destination is untouched (an existing file keeps its
        contents, a new one is not created, no temporary file is left), and
        the message says so; for a FIFO or device it says instead that what
        was written stays written.
    TransferError
        A device chunk failed otherwise (a CUDA error, a ``progress`` callable
        that raised, chained as ``__cause__``): the destination is untouched
        as above and ``bytes_done`` is 0 (for a FIFO or device: the data bytes
        known to be written).
    """
    chunk = chunk_bytes_or_default(chunk_bytes)
    check_progress(progress)
    _refuse_masked(x)
    src = array_source(x, "save_npy")
    if src.dtype.hasobject:
        raise InvalidTypeError(f"save_npy expected numeric data (got dtype {src.dtype!r})")
    header = _header_bytes(src.shape, _file_dtype(src.dtype))
    dest = prepare_destination(path, "save_npy")  # every check before any data moves
    failed: list[OSError] = []  # writes of the device pipeline's host threads that failed
    try:
        with dest.open() as f:  # commit when complete, discard on any error
            f.write(header)
            _write_data(f, src, chunk, progress, failed)
    except TransferError as exc:
        cause = exc.__cause__
        if any(cause is e for e in failed):  # the file could not be written: as for host data
            assert isinstance(cause, OSError)
            raise _write_failed(dest, cause, exc.bytes_done) from cause
        raise _transfer_failed(dest, exc) from cause
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
    """The :class:`PathError` (with the failure's ``errno``) of a write or
    rename that failed: a full disk, a file size limit, an I/O error."""
    return path_error(
        exc.errno,
        f"save_npy could not write {str(dest.path)!r}: {exc.strerror or exc}; "
        f"{_what_is_left(dest, data_done)}",
        str(dest.path),
    )


def _transfer_failed(dest: Destination, exc: TransferError) -> TransferError:
    """The pipeline's error (a device error, a ``progress`` callable that
    raised, a cancel) restated for the file: nothing of an atomic save is
    kept, so no byte of the destination counts as done."""
    cause = exc.__cause__
    what = "was cancelled" if cause is None else f"failed ({type(cause).__name__}: {cause})"
    done = exc.bytes_done if dest.streaming else 0
    return TransferError(
        f"save_npy {what}; {_what_is_left(dest, done)}",
        bytes_done=done,
        nbytes=exc.nbytes,
    )


def _refuse_masked(x: Any) -> None:
    """Refuse a ``numpy.ma.MaskedArray``: a ``.npy`` file has no room for its mask."""
    ma = sys.modules.get("numpy.ma")
    if ma is not None and isinstance(x, ma.MaskedArray):
        raise InvalidTypeError(
            "save_npy expected an array without a mask (got a numpy.ma.MaskedArray: a .npy "
            "file holds no mask, and numpy.save refuses it too); save x.filled(fill_value) "
            "for the values with the masked ones replaced, or x.data and "
            "numpy.ma.getmaskarray(x) as two files"
        )


# ----------------------------------------------------------------------- load


_DEVICES = (
    "None or 'cpu' (a NumPy array), or 'cuda', 'cuda:N', an int, a torch.device or a "
    "cupy.cuda.Device (a CuPy array on that device)"
)


def _load_target(device: Any) -> Target | None:
    """``device`` as ``("cpu", None)`` / ``("cuda", index or None)``, or None."""
    try:
        return parse_device(device)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"load_npy expected device to be {_DEVICES} (got {device!r})") from None


def _out_place(out: Any, host: bool) -> Target:
    if host:
        return ("cpu", None)
    if _backends.is_cupy_array(out):
        return ("cuda", int(out.device.id))
    return ("cuda", out.device.index)


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
    if isinstance(out, np.ndarray):
        host = True
        shape, dtype = out.shape, out.dtype
        if not out.flags.writeable:
            raise InvalidValueError(f"expected a writable out {where} (got a read-only array)")
    elif _backends.is_torch_tensor(out) or is_device_array(out):
        if getattr(out, "requires_grad", False):
            raise InvalidValueError(
                f"expected an out {where} that does not require grad (got a tensor with "
                "requires_grad=True: writing into it in place would bypass autograd, and "
                "PyTorch refuses it for a leaf); pass out.detach() (the same memory) or "
                "load into a new tensor, then copy under torch.no_grad()"
            )
        if _backends.is_torch_tensor(out) and (out.is_conj() or out.is_neg()):
            raise InvalidValueError(
                f"expected an out {where} without the conjugate/negative bit (got one "
                "with it: writes through such a view would be transformed); resolve it first"
            )
        described = array_source(out, "load_npy")
        shape, dtype, host = described.shape, described.dtype, not described.on_device
    else:
        raise InvalidTypeError(
            f"expected out {where} to be a NumPy array, a CuPy array or a torch tensor "
            f"(got {type(out).__module__}.{type(out).__qualname__})"
        )
    if target is not None:
        place = _out_place(out, host)
        if target[0] != place[0] or target[1] not in (None, place[1]):
            shown = "cpu" if place[0] == "cpu" else f"cuda:{place[1]}"
            raise InvalidValueError(
                f"expected device to match out {where} (got device={target[0]}"
                f"{'' if target[1] is None else f':{target[1]}'} and out on {shown}); "
                "out decides where the data goes: pass out or device, not both"
            )
    want = header.dtype if host else header.dtype.newbyteorder("=")
    got = np.dtype(dtype)
    if tuple(shape) != header.shape or got != want:
        if (
            host
            and tuple(shape) == header.shape
            and got.newbyteorder("=") == want.newbyteorder("=")
        ):
            raise _byte_order_error(where, want, got, isinstance(out, np.ndarray))
        raise InvalidValueError(
            f"expected out {where} with shape {header.shape} and dtype {want} "
            f"(got shape {tuple(shape)} and dtype {got})"
        )
    check_elements_apart(out, "load_npy", f" {where}")
    if host and not isinstance(out, np.ndarray):
        out = numpy_view_of_cpu_tensor(out)  # a CPU tensor: write through a NumPy view
    if host:
        _refuse_a_map_of_the_file(header, out)
    return out, host


def _byte_order_error(where: str, want: np.dtype, got: np.dtype, numpy: bool) -> InvalidValueError:
    """A host out whose dtype is the file's in the other byte order."""
    target = "out" if numpy else "out.numpy()"
    return InvalidValueError(
        f"expected out {where} in the file's byte order, dtype {want.str!r} (got {got.str!r}): "
        "load_npy copies the bytes as stored into host memory, it does not swap them; copy "
        f"through a memory map of the file, which converts them, numpy.copyto({target}, "
        "numpy.load(path, mmap_mode='r')), or load into new memory, interop.load_npy(path), "
        f"and convert with .astype({got.str!r})"
    )


# ----------------------------------------------------------------------- an out that maps the file


def _may_map_a_file(a: np.ndarray) -> bool:
    """False where ``a``'s memory is certainly not a file mapping: its base
    chain ends in an array that allocated its own memory (``numpy.empty``)."""
    obj: Any = a
    while isinstance(obj, np.ndarray):
        if obj.base is None:
            return not obj.flags.owndata
        obj = obj.base
    return True  # an mmap.mmap (numpy.memmap, numpy.load(mmap_mode=...)), a tensor, a buffer


def _mapped_file_ranges(lo: int, hi: int) -> list[tuple[int, int, int, str, int, int]] | None:
    """The shared file mappings of this process under addresses ``[lo, hi)``,
    from Linux's ``/proc/self/maps``: ``(major, minor, inode, path, start,
    end)``, where ``[start, end)`` are the file offsets of the part inside
    ``[lo, hi)``. A private (copy-on-write) mapping never writes the file and
    is left out. None where there is no such table (another system)."""
    found = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                if len(fields) < 5 or fields[4] == "0" or not fields[1].endswith("s"):
                    continue  # anonymous or private memory
                first, _, last = fields[0].partition("-")
                start, end = int(first, 16), int(last, 16)
                if end <= lo or start >= hi:
                    continue
                major, _, minor = fields[3].partition(":")
                offset = int(fields[2], 16)
                name = fields[5].rstrip("\n") if len(fields) > 5 else ""
                found.append(
                    (
                        int(major, 16),
                        int(minor, 16),
                        int(fields[4]),
                        name,
                        offset + max(lo, start) - start,
                        offset + min(hi, end) - start,
                    )
                )
    except (OSError, ValueError):
        return None
    return found


def _memmap_file_ranges(
    a: np.ndarray, lo: int, hi: int
) -> list[tuple[str | os.PathLike[str], int, int]]:
    """Where ``/proc/self/maps`` is missing: the ``numpy.memmap`` at the root
    of ``a``'s base chain, as ``(filename, start, end)`` file offsets of
    ``[lo, hi)``."""
    root: Any = None
    obj: Any = a
    while isinstance(obj, np.ndarray):
        if isinstance(obj, np.memmap) and not isinstance(obj.base, np.ndarray):
            root = obj  # the memmap made on the mapping itself: offset is its first byte
        obj = obj.base
    if root is None or not getattr(root, "filename", None) or root.mode == "c":
        return []  # no memmap, or a copy-on-write one (it never writes the file)
    first = root.ctypes.data
    return [(root.filename, root.offset + lo - first, root.offset + hi - first)]


def _refuse_a_map_of_the_file(header: NpyHeader, out: np.ndarray) -> None:
    """Refuse an ``out`` that maps bytes of the file being read (a
    ``numpy.memmap`` of it, ``numpy.load(path, mmap_mode="r+")``, any view of
    one): each chunk written into ``out`` would change bytes of the file that
    later chunks read, so the result would be wrong (a reversed view leaves a
    palindrome). Two mappings of one file have different addresses, so
    nothing else can see the overlap. Conservative: any byte of the file
    under ``out``'s extent is refused; a mapping of another file, of an older
    file that was since replaced under the same name, or a copy-on-write one
    (``mmap_mode="c"``: it never writes the file) is not."""
    if not out.size or not _may_map_a_file(out):
        return
    lo, hi = np.lib.array_utils.byte_bounds(out)
    try:
        st = os.stat(header.path)
    except OSError:
        return  # the read that follows reports it
    size = header.offset + header.nbytes
    hits: list[tuple[int, int]] = []
    mapped = _mapped_file_ranges(lo, hi)
    if mapped is not None:
        for major, minor, inode, name, start, end in mapped:
            if inode != st.st_ino:
                continue
            same = os.makedev(major, minor) == st.st_dev  # btrfs and overlayfs name another device
            if not same and name.startswith("/"):
                try:
                    same = os.path.samefile(name, header.path)
                except (OSError, ValueError):
                    same = False
            if same:
                hits.append((start, end))
    else:
        for filename, start, end in _memmap_file_ranges(out, lo, hi):
            try:
                if os.path.samefile(filename, header.path):
                    hits.append((start, end))
            except (OSError, ValueError):
                continue
    for start, end in hits:
        if start < size and end > 0:
            raise InvalidValueError(
                f"expected out for {str(header.path)!r} not to be a memory map of that file "
                f"(got an array over bytes [{max(start, 0)}, {min(end, size)}) of it, which "
                "load_npy would read after writing into them: the values would come out "
                "wrong); load into new memory and copy, out[...] = interop.load_npy(path), or "
                "use the file's data as it is, numpy.load(path, mmap_mode='r')"
            )


def _pread_into(fd: int, view: memoryview, offset: int, path: Path) -> None:
    """Fill ``view`` from the file at ``offset``; a short file is an error."""
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            raise EOFError(
                f"{str(path)!r} ended early: expected {len(view)} bytes at offset "
                f"{offset}, read {got}"
            )
        got += n


def _load_to_host(header: NpyHeader, target: np.ndarray, chunk: int, progress: Any) -> None:
    """Read the file chunk by chunk into host memory (``target`` in file order)."""
    itemsize = header.dtype.itemsize
    bar = Progress(progress, header.nbytes, "load_npy")
    done = 0
    fd = open_unchanged(header.path, header.identity, "load_npy")
    try:
        buf = np.empty(max(chunk, itemsize), np.uint8)
        for idx in c_order_chunks(tuple(target.shape), itemsize, chunk):
            part = target[idx]
            n = part.size * itemsize
            direct = part.flags.c_contiguous
            raw = part.reshape(-1).view(np.uint8) if direct else buf[:n]
            try:
                _pread_into(fd, raw.data, header.offset + done, header.path)
            except EOFError as exc:
                raise TransferError(
                    f"load_npy failed ({exc}); bytes [0, {done}) of {header.nbytes} (in the "
                    "file's data) are complete, the rest of the destination is unspecified",
                    bytes_done=done,
                    nbytes=header.nbytes,
                ) from exc
            if not direct:
                np.copyto(part, raw.view(header.dtype).reshape(part.shape))
            done += n
            bar.add(n)
    finally:
        os.close(fd)
        bar.close()


def _from_file(fd: int, header: NpyHeader, threads: int) -> HostStep:
    """Read each chunk of the file straight into its pinned slot (``os.preadv``,
    split across host threads), converting non-native byte order there."""
    native = header.dtype.newbyteorder("=")
    swap = native != header.dtype

    def step(plan: Plan) -> Callable[[int], list[HostTask]]:
        def tasks(i: int) -> list[HostTask]:
            base = header.offset + plan.starts[i]

            def piece(lo: int, hi: int) -> HostTask:
                def read(buf: np.ndarray) -> None:
                    _pread_into(fd, buf[lo:hi].data, base + lo, header.path)
                    if swap:
                        buf[lo:hi].view(native).byteswap(inplace=True)

                return read

            ranges = split_bytes(plan.sizes[i], threads, header.dtype.itemsize)
            return [piece(lo, hi) for lo, hi in ranges]

        return tasks

    return step


def _load_to_device(header: NpyHeader, result: Any, chunk: int, progress: Any) -> None:
    """Read the file straight into the pinned staging slots (host threads,
    ``os.preadv``) while earlier slots are copied to the device."""
    target = _c_order_view(result, header.fortran_order)
    fd = open_unchanged(header.path, header.identity, "load_npy")
    try:
        host_to_device(
            array_source(target, "load_npy"),
            chunk,
            _from_file(fd, header, config.host_threads),
            result=result,
            progress=progress,
            func="load_npy",
            order="the file's data",
        ).result()
    finally:
        os.close(fd)


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
        Preallocated destination with the file's shape and dtype, any strides.
        Checked, with the header and the file size, before anything is read.
    device : optional
        Where a new array goes when ``out`` is not given. None (the default)
        or ``"cpu"``: a NumPy array in host memory, like ``numpy.load`` (a
        file's natural home is host memory; no GPU is needed). ``"cuda"``,
        ``"cuda:N"``, an int, a ``torch.device`` or a ``cupy.cuda.Device``: a
        CuPy array on that CUDA device (``"cuda"``: the current device).
        With ``out``, ``device`` may be given only if it names where ``out``
        is.
    chunk_bytes : int, optional
        Chunk size; default ``interop.config.chunk_bytes`` (at least 64 KiB
        is used).
    progress : bool or callable
        ``True`` shows a tqdm bar in bytes; a callable is called as
        ``progress(bytes_done, bytes_total)``.

    Returns
    -------
    numpy.ndarray, cupy.ndarray or torch.Tensor
        ``out`` itself when given, else a new NumPy array, or a new CuPy array
        for a CUDA ``device``.

    Notes
    -----
    The file is never read whole. For host memory, contiguous chunks are read
    straight into the destination, others through one chunk buffer. For
    device memory, host threads read each chunk (``os.preadv``) straight into
    a free pinned staging slot while earlier slots are copied to the device —
    the pipeline of :func:`interop.copy_to_device`, ordered after the
    destination library's current stream; the call returns when the data is
    on the device. Extra host memory is one chunk buffer (host) or the
    staging ring (device).

    Raises
    ------
    NpyFormatError
        Corrupt, truncated or object-dtype file, a header with an impossible
        shape, or one longer than ``numpy.load`` parses by default (see
        :func:`read_npy_header`; the message names the file). A
        ``ValueError``; nothing is written.
    InvalidValueError
        An ``out`` of the wrong shape/dtype or read-only, or a ``device`` that
        is not where ``out`` is; a ``device`` string that is not ``"cpu"``,
        ``"cuda"`` or ``"cuda:N"`` (the message lists what to pass); a host
        ``out`` in the other byte order than the file's (the bytes are not
        swapped into host memory; the message says how to convert); an
        ``out`` whose elements may share memory (a stride of 0, an
        ``as_strided`` view); an ``out`` that is a shared memory map of the
        file being read (a ``numpy.memmap`` or ``numpy.load(path,
        mmap_mode="r+")`` of it, any view of one, a tensor over one: writing
        it would change bytes still to be read; load into new memory and
        copy, ``out[...] = load_npy(path)``); a file replaced or written
        between reading its header and its data; a ``path`` with a NUL byte.
        A ``ValueError``; nothing is written.
    InvalidTypeError
        ``out`` is not an array, ``device`` is not a device, or ``path`` is
        not a path (a ``TypeError``).
    BackendUnavailableError, NoDeviceError
        A CUDA ``device`` without CuPy or without a visible GPU; the message
        says that ``device="cpu"`` (or no ``device``) reads into NumPy.
    CaptureError
        A device destination inside CUDA graph capture (nothing is allocated
        or read).
    PathNotFoundError, PathPermissionError, PathIsADirectoryError, PathError
        No such file, a file this process may not read, a directory (also
        ``FileNotFoundError``, ``PermissionError``, ``IsADirectoryError``),
        or a FIFO, socket or device (a ``PathError``, an ``OSError``; nothing
        is read from it).
    TransferError
        Reading or copying failed part-way; the message says which byte range
        of ``out`` (in file order) is complete. The call never reports a
        partly written ``out`` as success.
    """
    target = _load_target(device)
    chunk = chunk_bytes_or_default(chunk_bytes)
    header = read_npy_header(path)
    dest, host = _destination(header, out, target)
    result = dest if out is None else out
    if host:
        _load_to_host(header, _c_order_view(dest, header.fortran_order), chunk, progress)
    else:
        _load_to_device(header, result, chunk, progress)
    return result
