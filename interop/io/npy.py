"""Stream arrays to and from ``.npy`` files in chunks: ``save_npy`` / ``load_npy``.

Neither holds the whole array in host memory: each chunk goes between the
file (:mod:`interop.io._format`'s stages, at its offset) and the array,
through the staging ring for device data, on the host engine for host data.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _backends
from ..arrays import (
    array_source,
    check_elements_apart,
    is_device_array,
    numpy_view_of_cpu_tensor,
    parse_device,
)
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
from ._format import (
    FileReader,
    FileWriter,
    NpyHeader,
    Runs,
    file_dtype,
    header_bytes,
    open_unchanged,
    read_into,
    read_npy_header,
    write_from,
)
from .destination import Destination, prepare_destination

if TYPE_CHECKING:
    from ..arrays import Target

__all__ = ["NpyHeader", "load_npy", "read_npy_header", "save_npy"]


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
        Destination; ``.npy`` is appended to a name without a suffix, as by
        ``numpy.save`` (``"x.bin"`` is kept), but not to an existing FIFO's or
        character device's. A new or regular file is written to a temporary
        file beside it, renamed to ``path`` once complete: a failed save
        leaves the old file as it was and no partial file (on Linux file
        systems with ``O_TMPFILE`` the temporary has no name until complete,
        so a killed process leaves nothing; elsewhere a killed process leaves
        a hidden ``.NAME.XXXXXXXX.tmp``); a replaced file keeps its mode bits,
        and its owner and group where permitted. A symlink is followed (its
        target replaced, the link kept). A FIFO or character device is
        written into, in order, as by ``numpy.save``. A directory, a socket
        or block device, a file this process may not write (as ``numpy.save``
        refuses it; root may replace a 0444 file, keeping its mode) and a
        file whose directory is not writable (no atomic save there) are
        refused.
    chunk_bytes : int, optional
        Chunk size; default ``interop.config.chunk_bytes`` (at least 64 KiB).
    progress : bool or callable
        ``True`` shows a tqdm bar in bytes; a callable is called as
        ``progress(bytes_done, bytes_total)``.

    Returns
    -------
    pathlib.Path
        The path written: ``path``, with ``.npy`` appended where it was added.

    Notes
    -----
    Copy semantics: the file is a copy, made without a full-size host copy.
    Device data goes through the pinned staging ring of
    :func:`interop.copy_to_host`, ordered after the work queued on the
    producer's current stream, and host threads write each slot into the
    file at its offset; the call returns when the file is complete. Extra
    host memory: one chunk buffer (strided host data) or the staging ring.
    bfloat16/float8 data is written under its ``ml_dtypes`` name (``numpy.load``
    reads it once ``ml_dtypes`` is imported). The file is not synced to disk
    (as ``numpy.save``). A replaced file of 8 MiB or more on a local file
    system is freed by a background thread just after the rename (its disk
    space comes back a moment later).

    Raises
    ------
    InvalidTypeError
        ``x`` is not an array, a masked array (a ``.npy`` file has no room for
        the mask: save ``x.filled(...)``), a nested or sparse tensor, object
        data; ``path`` is not a path. Before any data moves.
    InvalidValueError
        A meta tensor, an empty ``path`` or one with a NUL byte, a
        ``chunk_bytes`` out of bounds. Before any data moves.
    UnsupportedDtypeError
        ``x``'s dtype has no NumPy equivalent (``torch.complex32``, quantized).
    PathIsADirectoryError, PathNotFoundError, PathNotADirectoryError, PathPermissionError
        The destination is refused (see ``path``), before any data moves;
        also ``IsADirectoryError``, ``FileNotFoundError``, ...
    PathError
        The file cannot be written (``errno.ENOSPC``, ``EFBIG``, an I/O
        error), for host and device data alike: an ``OSError`` with the
        failure's ``errno`` and the path as ``filename``; the destination is
        untouched (no temporary left) and the message says so (for a FIFO or
        device: that what was written stays written).
    TransferError
        A device chunk failed otherwise (a CUDA error; the cause is chained):
        the destination is untouched and ``bytes_done`` is 0 (for a FIFO or
        device: the data bytes known to be written).
    """
    check_options(chunk_bytes, progress)  # refused before any file is made
    _refuse_masked(x)
    src = array_source(x, "save_npy")
    if src.dtype.hasobject:
        raise InvalidTypeError(f"save_npy expected numeric data (got dtype {src.dtype!r})")
    dtype = file_dtype(src.dtype)
    header = header_bytes(src.shape, dtype)
    nbytes = nbytes_of(src.shape, dtype.itemsize)
    dest = prepare_destination(path, "save_npy")  # every check before any data moves
    writer: FileWriter | None = None
    try:
        with dest.open() as f:  # commit when complete, discard on any error
            f.write(header)
            f.flush()
            runs = None if dest.streaming else Runs(np.array([len(header)], np.int64), nbytes)
            writer = FileWriter(f.fileno(), runs, repr(str(dest.path)), src.obj, dtype=dtype)
            # a FIFO or device is written in order, by one thread
            threads = 1 if dest.streaming else 0
            options = {"chunk_bytes": chunk_bytes, "progress": progress, "threads": threads}
            write_from(src, writer, "save_npy", "the file's data", **options)
    except TransferError as exc:
        cause = exc.__cause__
        if writer is not None and any(cause is e for e in writer.failed):
            assert isinstance(cause, OSError)  # the file could not be written
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
    """The :class:`PathError` (with its ``errno``) of a write or rename that failed."""
    return path_error(
        exc.errno,
        f"save_npy could not write {str(dest.path)!r}: {exc.strerror or exc}; "
        f"{_what_is_left(dest, data_done)}",
        str(dest.path),
    )


def _transfer_failed(dest: Destination, exc: TransferError) -> TransferError:
    """The pipeline's error restated for the file: no byte of an atomic save is kept."""
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
    """False where ``a``'s base chain ends in memory of its own (not a file mapping)."""
    obj: Any = a
    while isinstance(obj, np.ndarray):
        if obj.base is None:
            return not obj.flags.owndata
        obj = obj.base
    return True  # an mmap.mmap (numpy.memmap, numpy.load(mmap_mode=...)), a tensor, a buffer


def _mapped_file_ranges(lo: int, hi: int) -> list[tuple[int, int, int, str, int, int]] | None:
    """This process's shared file mappings under addresses ``[lo, hi)`` (Linux's
    ``/proc/self/maps``; None elsewhere), as ``(major, minor, inode, path,
    start, end)`` with the file offsets inside ``[lo, hi)``."""
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
    """Without ``/proc/self/maps``: the ``numpy.memmap`` under ``a``, as
    ``(filename, start, end)`` file offsets of ``[lo, hi)``."""
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
    """Refuse an ``out`` over a shared mapping of bytes of the file being read."""
    # Each chunk written into out would change bytes later chunks read (a
    # reversed view leaves a palindrome), and two mappings of one file have
    # different addresses, so no overlap check sees it. Any byte of the file
    # under out's extent is refused; a mapping of another (or a since
    # replaced) file, or a copy-on-write one, is not.
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
        Where a new array goes without ``out``: None (default) or ``"cpu"``,
        a NumPy array, like ``numpy.load``; ``"cuda"``, ``"cuda:N"``, an int,
        a ``torch.device`` or a ``cupy.cuda.Device``, a CuPy array on that
        device. With ``out``, only where ``out`` is.
    chunk_bytes, progress
        As for :func:`save_npy`.

    Returns
    -------
    numpy.ndarray, cupy.ndarray or torch.Tensor
        ``out`` itself when given, else a new NumPy array, or a new CuPy array
        for a CUDA ``device``.

    Notes
    -----
    The file is never read whole. Host memory: contiguous chunks are read
    straight into the destination, others through one chunk buffer. Device
    memory: host threads read each chunk (``os.preadv``) into a free pinned
    slot while earlier slots are copied to the device (the pipeline of
    :func:`interop.copy_to_device`, ordered after the destination library's
    current stream); the call returns when the data is on the device.

    Raises
    ------
    NpyFormatError
        Corrupt, truncated or object-dtype file, an impossible shape, a
        header longer than ``numpy.load`` parses by default (see
        :func:`read_npy_header`). A ``ValueError``; nothing is written.
    InvalidValueError
        An ``out`` of the wrong shape or dtype, read-only, with elements that
        may share memory, elsewhere than ``device``, or (host) in the other
        byte order than the file's (the message says how to convert); an
        ``out`` that is a shared memory map of the file itself (writing it
        would change bytes still to be read: ``out[...] = load_npy(path)``);
        a bad ``device`` string; a file replaced or written between reading
        its header and its data; a ``path`` with a NUL byte. Nothing is
        written.
    InvalidTypeError
        ``out`` is not an array, ``device`` not a device, ``path`` not a path.
    BackendUnavailableError, NoDeviceError
        A CUDA ``device`` without CuPy or a visible GPU (the message says
        that ``device="cpu"`` reads into NumPy).
    CaptureError
        A device destination inside CUDA graph capture (nothing done).
    PathNotFoundError, PathPermissionError, PathIsADirectoryError, PathError
        No such file, a file this process may not read, a directory, a FIFO,
        socket or device (nothing read from it).
    TransferError
        Reading or copying failed part-way; the message says which byte range
        of ``out`` (in file order) is complete.
    """
    target = _load_target(device)
    check_options(chunk_bytes, progress)
    header = read_npy_header(path)
    dest, host = _destination(header, out, target)
    result = dest if out is None else out
    view = _c_order_view(dest if host else result, header.fortran_order)
    fd = open_unchanged(header.path, header.identity, "load_npy")
    try:
        reader = FileReader(fd, header.runs(), repr(str(header.path)), view, dtype=header.dtype)
        options = {"chunk_bytes": chunk_bytes, "progress": progress}
        read_into(view, reader, "load_npy", "the file's data", **options)
    finally:
        os.close(fd)
    return result
