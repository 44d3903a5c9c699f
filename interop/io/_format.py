"""The ``.npy`` file: its header, where an array's bytes lie, and the host
stages that move chunks to and from those places.

The header is ``numpy.lib.format``'s (formats 1.0, 2.0 and 3.0 are read, as by
``numpy.load``). bfloat16 and float8 arrays are written under their
``ml_dtypes`` name as ``descr`` (``'bfloat16'``, ...), which ``numpy.load``
reads once ``ml_dtypes`` is imported and refuses before (``numpy.save`` writes
them as opaque ``'<V2'`` records and loses the dtype).

:class:`FileWriter` and :class:`FileReader`, the pipeline's host stages for
files, move each chunk with positioned writes and reads at its offsets; never
through a file mapping, whose written pages stay in the process's memory.
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
from typing import Any, BinaryIO

import numpy as np
from numpy.lib import format as npformat

from .. import dtypes
from ..arrays import Source, array_source, host_values
from ..errors import InvalidValueError, NpyFormatError, path_error
from ..pipeline.plan import Plan, split_bytes
from ..pipeline.request import TransferRequest
from ..pipeline.start import start
from .destination import checked_path, file_kind

__all__ = [
    "FileReader",
    "FileWriter",
    "Layout",
    "NpyHeader",
    "Runs",
    "file_dtype",
    "file_identity",
    "header_bytes",
    "open_unchanged",
    "read_into",
    "read_npy_header",
    "write_all",
    "write_from",
]


# ----------------------------------------------------------------------- header


@dataclass(frozen=True)
class NpyHeader:
    """What a ``.npy`` header says, checked against the file's size."""

    path: Path
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool  # the data is stored in Fortran (column-major) order
    offset: int  # of the data in the file
    nbytes: int  # of the data
    # device, inode, size and st_mtime_ns when the header was read: a reader
    # that finds another identity reads a file replaced or changed since
    identity: tuple[int, int, int, int]

    def runs(self) -> Runs:
        """Where the data lies: one run from :attr:`offset`."""
        return Runs(np.array([self.offset], np.int64), self.nbytes)


# numpy.load's default max_header_size: a longer header is not parsed (its
# literal_eval could take unbounded memory and time on an untrusted file).
_MAX_HEADER_SIZE = 10_000


def file_identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """Device, inode, size and ``st_mtime_ns``: what changes when a file is replaced or written."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def open_unchanged(
    path: str | os.PathLike[str], identity: tuple[int, ...], what: str, *, same_machine: bool = True
) -> int:
    """Open ``path`` for reading, unless it is no longer the file of ``identity``
    (replaced or written since); on another machine the device number is not
    compared (a shared file has another one there)."""
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


def file_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a file stores ``dtype``'s values in: itself, but bfloat16 and
    float8 in native byte order (a header names them, with no byte order)."""
    native = dtype.newbyteorder("=")
    return native if dtypes.is_ml_dtype(native) else dtype


def header_bytes(shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    header = {"descr": _descr(dtype), "fortran_order": False, "shape": tuple(shape)}
    buf = io.BytesIO()
    try:
        npformat.write_array_header_1_0(buf, header)
    except ValueError:  # header longer than 65535 bytes
        buf = io.BytesIO()
        npformat.write_array_header_2_0(buf, header)
    return buf.getvalue()


def _read_array_header_3_0(f: BinaryIO) -> tuple[Any, bool, np.dtype]:
    """Read a format 3.0 header (2.0 with UTF-8 text), leaving ``f`` at the data."""
    # numpy.lib.format reads 3.0 only inside numpy.load: its public 2.0 reader
    # gets the text with non-ASCII characters escaped (they occur only inside
    # string literals, so the header means the same).
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
    """Read and check the header of a ``.npy`` file (format 1.0, 2.0 or 3.0)
    without reading its data.

    Raises
    ------
    NpyFormatError
        Not a ``.npy`` file, a corrupt header or one longer than the 10000
        bytes ``numpy.load`` parses by default (the message says how to map a
        trusted one), an impossible shape (negative, not an int, more bytes
        than this machine addresses), Python objects (never unpickled), or a
        size that does not match the header. A ``ValueError``.
    PathNotFoundError, PathPermissionError, PathIsADirectoryError, PathError
        The file cannot be opened, or is a directory, a FIFO, socket or
        device (refused unread: the data is read at offsets).
    InvalidTypeError, InvalidValueError
        ``path`` is not a str or ``os.PathLike``, or holds a NUL byte.
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


# ----------------------------------------------------------------------- where the bytes lie


@dataclass(frozen=True)
class Runs:
    """The file stretches that hold one block: byte ``b`` of the block (in its
    C order) is at ``offsets[b // nbytes] + b % nbytes``."""

    offsets: np.ndarray
    nbytes: int

    def segments(self, start: int, count: int) -> Iterator[tuple[int, int, int]]:
        """``(file_offset, position, length)`` pieces of block bytes
        ``[start, start + count)``; ``position`` counts from ``start``."""
        if count <= 0:
            return
        run, within = divmod(start, self.nbytes)
        position = 0
        while position < count:
            length = min(self.nbytes - within, count - position)
            yield int(self.offsets[run]) + within, position, length
            position += length
            run += 1
            within = 0


@dataclass(frozen=True)
class Layout:
    """Where the elements of a C-order array lie in a ``.npy`` file.

    A block's *runs* are the stretches of the file that hold it: one for a
    block that spans whole trailing axes, else one per row of its leading
    axes, as long as the layout allows (adjacent ones merged).
    """

    path: str
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int  # where the data starts (the header's length)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def runs(self, start: tuple[int, ...], shape: tuple[int, ...]) -> Runs:
        """The runs of the block at ``start`` (element index) with ``shape``."""
        full = self.shape
        itemsize = self.dtype.itemsize
        strides = [itemsize] * len(full)  # C-order strides of the whole array, in bytes
        for axis in range(len(full) - 2, -1, -1):
            strides[axis] = strides[axis + 1] * full[axis + 1]
        base = self.offset + sum(s * st for s, st in zip(start, strides, strict=True))
        # Axes from `whole` on are spanned entirely by the block: together with
        # the axis before them they form one contiguous run.
        whole = len(full)
        while whole > 0 and shape[whole - 1] == full[whole - 1]:
            whole -= 1
        if whole == 0:
            return Runs(np.array([base], np.int64), int(np.prod(shape, dtype=np.int64)) * itemsize)
        axis = whole - 1
        run = shape[axis] * strides[axis]
        offsets = np.full((), base, np.int64)
        for a in range(axis):
            offsets = np.add.outer(offsets, np.arange(shape[a], dtype=np.int64) * strides[a])
        return Runs(offsets.reshape(-1), int(run))


# ----------------------------------------------------------------------- moving them


def write_all(fd: int, view: memoryview, offset: int | None) -> None:
    """Write all of ``view`` at ``offset`` (``os.pwrite``), or at the file's
    position when ``offset`` is None (a FIFO or a device)."""
    while len(view):
        n = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        view = view[n:]
        if offset is not None:
            offset += n


def _pread_all(fd: int, view: memoryview, offset: int, what: str) -> None:
    """Fill ``view`` from the file at ``offset``; a short file is an error."""
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            raise EOFError(
                f"{what} ended early: expected {len(view)} bytes at offset {offset}, read "
                f"{got}; was it truncated or replaced since its header was read?"
            )
        got += n


class _FileStage:
    """A host stage of chunks that lie at ``runs`` in the file ``fd`` (None: a
    FIFO or device, written in order); ``array``: the host array of a
    host-to-host copy, which the stage reads or writes itself."""

    align = 1  # pieces start on a multiple of this many bytes

    def __init__(self, fd: int, runs: Runs | None, what: str, array: Any = None) -> None:
        self.fd, self.runs, self.what, self.array = fd, runs, what, array
        self._bounce: np.ndarray | None = None

    def pieces(self, plan: Plan, i: int, threads: int) -> list[tuple[int, int]]:
        if self.runs is None:
            return [(0, plan.sizes[i])]  # in order, by one thread
        return split_bytes(plan.sizes[i], threads, self.align)

    def segments(self, plan: Plan, i: int, piece: tuple[int, int]) -> Any:
        """``(file offset, position in the piece, length)`` of a piece."""
        assert self.runs is not None
        lo, hi = piece
        return self.runs.segments(plan.starts[i] + lo, hi - lo)

    def bounce(self, plan: Plan, like: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """One chunk buffer (reused) of ``like``'s shape and ``dtype``: host to
        host, for chunks that are not contiguous in the array."""
        if self._bounce is None:
            self._bounce = np.empty(plan.slot_bytes, np.uint8)
        return self._bounce[: like.size * dtype.itemsize].view(dtype).reshape(like.shape)


class FileWriter(_FileStage):
    """Write each chunk to the file: from its slot, or (host to host) from
    ``array``'s values in ``dtype``. ``check`` runs before each piece; a write
    that fails is added to ``failed`` (to tell it from the pipeline's other
    errors) and re-raised."""

    def __init__(
        self,
        fd: int,
        runs: Runs | None,
        what: str,
        array: Any = None,
        *,
        dtype: np.dtype | None = None,
        check: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(fd, runs, what, array)
        self.dtype, self.check = dtype, check
        self.failed: list[OSError] = []

    def run(self, plan: Plan, i: int, piece: tuple[int, int], buf: np.ndarray | None) -> None:
        if buf is None:
            part = host_values(self.array[plan.chunks[i]])
            dtype = self.dtype or part.dtype
            if not part.flags.c_contiguous or part.dtype != dtype:
                copy = self.bounce(plan, part, dtype)
                np.copyto(copy, part)
                part = copy
            buf = part.reshape(-1).view(np.uint8)
        if self.check is not None:
            self.check()
        try:
            if self.runs is None:
                write_all(self.fd, buf[piece[0] : piece[1]].data, None)
                return
            for offset, at, length in self.segments(plan, i, piece):
                start = piece[0] + at
                write_all(self.fd, buf[start : start + length].data, offset)
        except OSError as exc:
            self.failed.append(exc)
            raise


class FileReader(_FileStage):
    """Read each chunk from the file: into its slot, converting ``dtype``'s
    non-native byte order there, or (host to host) into ``array``, bytes as
    stored."""

    def __init__(
        self, fd: int, runs: Runs, what: str, array: Any = None, *, dtype: np.dtype
    ) -> None:
        super().__init__(fd, runs, what, array)
        self.align = dtype.itemsize
        self.native = dtype.newbyteorder("=")
        self.swap = self.native != dtype

    def run(self, plan: Plan, i: int, piece: tuple[int, int], buf: np.ndarray | None) -> None:
        if buf is not None:  # a slot, on its way to the device: in native byte order
            self.read(plan, i, piece, buf)
            if self.swap:
                buf[piece[0] : piece[1]].view(self.native).byteswap(inplace=True)
            return
        part = self.array[plan.chunks[i]]
        if part.flags.c_contiguous:
            self.read(plan, i, piece, part.reshape(-1).view(np.uint8))
            return
        copy = self.bounce(plan, part, part.dtype)
        self.read(plan, i, piece, copy.reshape(-1).view(np.uint8))
        np.copyto(part, copy)

    def read(self, plan: Plan, i: int, piece: tuple[int, int], buf: np.ndarray) -> None:
        """Read ``piece`` of chunk ``i`` into ``buf``, the chunk's bytes."""
        for offset, at, length in self.segments(plan, i, piece):
            start = piece[0] + at
            _pread_all(self.fd, buf[start : start + length].data, offset, self.what)


def write_from(src: Source, writer: FileWriter, func: str, order: str, **options: Any) -> None:
    """Write ``src`` through ``writer``: device data through the staging ring,
    whose host threads write each slot (``options``: ``chunk_bytes``,
    ``progress``, ``threads``), host data chunk by chunk on this thread."""
    if src.on_device:
        request = TransferRequest(func, "d2h", None, writer, device=src, order=order, **options)
    else:
        shape, itemsize = src.shape, (writer.dtype or src.dtype).itemsize
        options.update(threads=1, inline=True)
        request = TransferRequest(
            func, "h2h", None, writer, shape=shape, itemsize=itemsize, order=order, **options
        )
    start(request).result()


def read_into(target: Any, reader: FileReader, func: str, order: str, **options: Any) -> None:
    """Fill ``target`` (``reader.array``) through ``reader``: a device array
    through the staging ring (host threads read each chunk into a free slot),
    a host array chunk by chunk on this thread (straight into it where it is
    contiguous); ``options``: ``chunk_bytes``, ``progress``."""
    dst = array_source(target, func)
    if dst.on_device:
        request = TransferRequest(func, "h2d", target, reader, device=dst, order=order, **options)
    else:
        shape, itemsize = dst.shape, dst.dtype.itemsize
        options.update(threads=1, inline=True)
        request = TransferRequest(
            func, "h2h", target, reader, shape=shape, itemsize=itemsize, order=order, **options
        )
    start(request).result()
