"""The ``.npy`` header, where an array's bytes lie, and host stages moving them by pread/pwrite."""

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
from typing import Any, BinaryIO, Literal

import numpy as np
from numpy.lib import format as npformat

from .. import dtypes
from ..arrays import Source, host_values
from ..errors import InvalidTypeError, InvalidValueError, NpyFormatError, path_error
from ..pipeline.plan import Plan, split_bytes
from ..pipeline.request import TransferRequest
from ..pipeline.start import start
from .destination import checked_path, file_kind

__all__: list[str] = []  # internal, as _backends: used by npy, dask and safetensors


@dataclass(frozen=True)
class NpyHeader:
    """What a ``.npy`` header says, checked against the file's size."""

    path: Path
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool  # the data is stored in Fortran (column-major) order
    offset: int  # of the data in the file
    nbytes: int  # of the data
    identity: tuple[int, int, int, int]  # file_identity() when the header was read


# numpy.load's default max_header_size (literal_eval of an untrusted header)
_MAX_HEADER_SIZE = 10_000


def file_identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """Device, inode, size and ``st_mtime_ns``: what changes when a file is replaced or written."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def open_unchanged(
    path: str | os.PathLike[str], identity: tuple[int, ...], what: str, *, same_machine: bool = True
) -> int:
    """Open ``path`` for reading unless it is no longer the file of ``identity``."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    now = file_identity(os.fstat(fd))
    first = 0 if same_machine else 1
    if now[first:] != tuple(identity)[first:]:
        os.close(fd)
        raise InvalidValueError(
            f"{what}: expected the file whose header was read (device, inode, size, mtime_ns "
            f"{tuple(identity)}, got {now}); it was replaced or changed since: call load_npy again"
        )
    return fd


def file_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a file stores ``dtype``'s values in (bfloat16 and float8: native order)."""
    native = dtype.newbyteorder("=")
    return native if dtypes.is_ml_dtype(native) else dtype


def header_bytes(shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    """The header of a C-order file; bfloat16 and float8 under their ``ml_dtypes`` name."""
    descr = dtype.name if dtypes.is_ml_dtype(dtype) else npformat.dtype_to_descr(dtype)
    header = {"descr": descr, "fortran_order": False, "shape": tuple(shape)}
    buf = io.BytesIO()
    try:
        npformat.write_array_header_1_0(buf, header)
    except ValueError:  # header longer than 65535 bytes
        buf = io.BytesIO()
        npformat.write_array_header_2_0(buf, header)
    return buf.getvalue()


def _header_text(f: BinaryIO, shown: str) -> bytes:
    """The header after the magic, as a format 2.0 header (``f`` left at the data)."""
    version = npformat.read_magic(f)
    if version not in ((1, 0), (2, 0), (3, 0)):
        raise ValueError(
            f"unsupported .npy format version {version[0]}.{version[1]} (expected 1.0, 2.0 or 3.0)"
        )
    size = "<H" if version == (1, 0) else "<I"
    raw = f.read(struct.calcsize(size))
    if len(raw) < struct.calcsize(size):
        raise ValueError("EOF while reading the header length")
    (length,) = struct.unpack(size, raw)
    if length > _MAX_HEADER_SIZE:
        raise NpyFormatError(
            f"{shown} is not read by load_npy: its header is {length} bytes, more than "
            f"{_MAX_HEADER_SIZE}; if you trust the file, copy from "
            f"numpy.load(path, mmap_mode='r', max_header_size={length})"
        )
    text = f.read(length)
    if len(text) < length:
        raise ValueError(f"EOF while reading a header of {length} bytes")
    if version == (3, 0):  # UTF-8, which numpy reads only inside numpy.load: escaped, the
        text = text.decode("utf-8").encode("ascii", "backslashreplace")  # same literals
    return struct.pack("<I", len(text)) + text


def open_regular(
    path: Any, func: str, in_directory: str, otherwise: str
) -> tuple[int, os.stat_result, Path]:
    """Open ``path`` for reading at offsets: its descriptor, status and path; a PathError,
    ending with the fix ``in_directory`` or ``otherwise``, for a directory or another
    file that is not regular (a FIFO, socket or device)."""
    path = Path(checked_path(path, func))
    shown = repr(str(path))
    try:  # O_NONBLOCK: opening a FIFO without a writer would wait for one
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        where = ""
        if not path.is_absolute() and isinstance(exc, FileNotFoundError):
            where = f" (relative to the current directory {os.getcwd()!r})"
        raise path_error(
            exc.errno, f"{func} cannot read {shown}{where}: {exc.strerror}", str(path)
        ) from exc
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        directory = stat.S_ISDIR(st.st_mode)
        raise path_error(
            errno.EISDIR if directory else errno.ESPIPE,
            f"{func} cannot read {shown}: it is {file_kind(st.st_mode)}; "
            + (in_directory if directory else otherwise),
            str(path),
        )
    return fd, st, path


def read_npy_header(path: str | os.PathLike[str]) -> NpyHeader:
    """Read and check the header of a ``.npy`` file and its size (or raise NpyFormatError)."""
    fd, st, path = open_regular(
        path,
        "load_npy",
        "pass the path of a .npy file in it",
        "load_npy reads regular files: save the data to one",
    )
    shown = repr(str(path))
    with open(fd, "rb") as f:
        try:
            text = io.BytesIO(_header_text(f, shown))
            shape, fortran, dtype = npformat.read_array_header_2_0(
                text, max_header_size=sys.maxsize
            )
        except NpyFormatError:
            raise
        except (ValueError, SyntaxError, OSError, UnicodeDecodeError) as exc:
            raise NpyFormatError(f"{shown} is not a readable .npy file: {exc}") from exc
        offset = f.tell()
    bad = f"{shown} is not a readable .npy file: its header gives shape {shape!r}"
    if any(type(n) is not int for n in shape):  # numpy's reader lets True and False through
        raise NpyFormatError(f"{bad} (expected a tuple of ints)")
    dtype = np.dtype(dtype)
    shape = tuple(shape)
    if dtype.hasobject:
        raise NpyFormatError(
            f"{shown} holds Python objects (dtype {dtype!r}); interop never unpickles: "
            "use numpy.load(path, allow_pickle=True) if you trust the file"
        )
    if any(n < 0 for n in shape):
        raise NpyFormatError(f"{bad}, with a negative dimension")
    # NumPy's own limit: the size with zero dimensions counted as 1 must fit
    if math.prod(max(n, 1) for n in shape) * dtype.itemsize > sys.maxsize:
        raise NpyFormatError(
            f"{bad} of {dtype}, more than the {sys.maxsize} bytes an array can have here"
        )
    nbytes = math.prod(shape) * dtype.itemsize
    if st.st_size != offset + nbytes:
        state = "truncated" if st.st_size < offset + nbytes else "longer than its header says"
        raise NpyFormatError(
            f"{shown} is {state}: expected {offset + nbytes} bytes "
            f"({offset} header + {nbytes} data for shape {shape} {dtype}), got {st.st_size}"
        )
    return NpyHeader(path, shape, dtype, bool(fortran), offset, nbytes, file_identity(st))


def refuse_masked(x: Any, expected: str, filled: str) -> None:
    """Refuse a ``numpy.ma.MaskedArray``: a ``.npy`` file holds no mask."""
    ma = sys.modules.get("numpy.ma")  # no masked array exists before numpy.ma is imported
    if ma is not None and isinstance(x, ma.MaskedArray):
        raise InvalidTypeError(
            f"{expected} without a mask (got a numpy.ma.MaskedArray: a .npy file holds no "
            f"mask); save {filled}, or the data and the mask as two files"
        )


@dataclass(frozen=True)
class Runs:
    """Where a block lies: its C-order byte ``b`` at ``offsets[b // nbytes] + b % nbytes``."""

    offsets: np.ndarray
    nbytes: int

    def segments(self, start: int, count: int) -> Iterator[tuple[int, int, int]]:
        """``(file_offset, position from start, length)`` of block bytes from ``start`` on."""
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
    """Where the elements of a C-order array lie in a ``.npy`` file."""

    path: str
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int  # where the data starts (the header's length)

    def runs(self, start: tuple[int, ...], shape: tuple[int, ...]) -> Runs:
        """The runs of the block at ``start`` (element index) with ``shape``."""
        full = self.shape
        itemsize = self.dtype.itemsize
        strides = [itemsize] * len(full)  # C-order strides of the whole array, in bytes
        for axis in range(len(full) - 2, -1, -1):
            strides[axis] = strides[axis + 1] * full[axis + 1]
        base = self.offset + sum(s * st for s, st in zip(start, strides, strict=True))
        # axes from `whole` on are spanned by the block: with the one before, one run
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


def write_all(fd: int, view: memoryview, offset: int | None) -> None:
    """Write all of ``view`` at ``offset``, or at the file's position when it is None."""
    while len(view):
        n = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        view = view[n:]
        if offset is not None:
            offset += n


class _FileStage:
    """A host stage of chunks at ``runs`` in ``fd`` (None: in order); ``array``: a host source."""

    align = 1  # pieces start on a multiple of this many bytes

    def __init__(self, fd: int, runs: Runs | None, what: str, array: Any = None) -> None:
        self.fd, self.runs, self.what, self.array = fd, runs, what, array
        self._bounce: np.ndarray | None = None

    def pieces(self, plan: Plan, i: int, threads: int) -> list[tuple[int, int]]:
        if self.runs is None:
            return [(0, plan.sizes[i])]  # in order, by one thread
        return split_bytes(plan.sizes[i], threads, self.align)

    def segments(
        self, plan: Plan, i: int, piece: tuple[int, int]
    ) -> Iterator[tuple[int, int, int]]:
        assert self.runs is not None
        lo, hi = piece
        for offset, at, length in self.runs.segments(plan.starts[i] + lo, hi - lo):
            yield offset, lo + at, length

    def bounce(self, plan: Plan, like: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """A reused chunk buffer of ``like``'s shape and ``dtype`` (for non-contiguous chunks)."""
        if self._bounce is None:
            self._bounce = np.empty(plan.slot_bytes, np.uint8)
        return self._bounce[: like.size * dtype.itemsize].view(dtype).reshape(like.shape)


class FileWriter(_FileStage):
    """Write each chunk from its slot or ``array``; ``check`` runs before each piece."""

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
                write_all(self.fd, buf[at : at + length].data, offset)
        except OSError as exc:
            self.failed.append(exc)
            raise


class FileReader(_FileStage):
    """Read each chunk into its slot, in native byte order, or into ``array`` as stored."""

    def __init__(self, fd: int, runs: Runs, what: str, array: Any, *, dtype: np.dtype) -> None:
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
            view, got = buf[at : at + length].data, 0
            while got < length:
                n = os.preadv(self.fd, [view[got:]], offset + got)
                if n == 0:
                    raise EOFError(
                        f"{self.what} ended early: expected {length} bytes at offset {offset}, "
                        f"read {got}; was it truncated since its header was read?"
                    )
                got += n


def move(
    arr: Source, stage: FileWriter | FileReader, func: str, order: str, **options: Any
) -> None:
    """Move ``arr``'s chunks through ``stage`` (device data via the staging ring)."""
    to: Literal["d2h", "h2d", "h2h"] = "d2h" if isinstance(stage, FileWriter) else "h2d"
    if arr.on_device:
        options["device"] = arr
    else:
        to = "h2h"
        options.update(threads=1, inline=True, shape=arr.shape, itemsize=arr.dtype.itemsize)
    start(TransferRequest(func, to, None, stage, order=order, **options)).result()
