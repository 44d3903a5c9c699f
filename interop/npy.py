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

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib import format as npformat

from . import _backends, dtypes
from .config import chunk_bytes_or_default
from .errors import TransferError
from .transfer import Progress, array_source, c_order_chunks, copy_to_host_async

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
    """

    path: Path
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool
    offset: int
    nbytes: int


def _descr(dtype: np.dtype) -> Any:
    if dtypes.is_ml_dtype(dtype):
        return dtype.name  # numpy.load resolves the name once ml_dtypes is imported
    return npformat.dtype_to_descr(dtype)


def _header_bytes(shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    import io

    header = {"descr": _descr(dtype), "fortran_order": False, "shape": tuple(shape)}
    buf = io.BytesIO()
    try:
        npformat.write_array_header_1_0(buf, header)
    except ValueError:  # header longer than 65535 bytes
        buf = io.BytesIO()
        npformat.write_array_header_2_0(buf, header)
    return buf.getvalue()


def read_npy_header(path: str | os.PathLike[str]) -> NpyHeader:
    """Read and check the header of a ``.npy`` file without reading its data.

    Raises
    ------
    ValueError
        The file is not a ``.npy`` file, its header is corrupt, it holds
        Python objects (never unpickled), or its size does not match the
        header (truncated or with trailing bytes). The message names the file.
    FileNotFoundError
        No such file.
    """
    path = Path(os.fspath(path))
    with open(path, "rb") as f:
        try:
            version = npformat.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = npformat.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = npformat.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy format version {version}")
        except (ValueError, SyntaxError, OSError) as exc:
            raise ValueError(f"{str(path)!r} is not a readable .npy file: {exc}") from exc
        offset = f.tell()
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise ValueError(
            f"{str(path)!r} holds Python objects (dtype {dtype!r}); interop never unpickles: "
            "use numpy.load(path, allow_pickle=True) if you trust the file"
        )
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    size = path.stat().st_size
    if size != offset + nbytes:
        state = "truncated" if size < offset + nbytes else "longer than its header says"
        raise ValueError(
            f"{str(path)!r} is {state}: expected {offset + nbytes} bytes "
            f"({offset} header + {nbytes} data for shape {tuple(shape)} {dtype}), got {size}"
        )
    return NpyHeader(path, tuple(shape), dtype, bool(fortran), offset, nbytes)


# ----------------------------------------------------------------------- helpers


def _as_bytes(a: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array (any dtype, ml_dtypes included)."""
    return a.reshape(-1).view(np.uint8).data


def _host_chunks(x: Any, chunk_bytes: int) -> Iterator[np.ndarray]:
    """Yield C-contiguous host arrays covering ``x`` in C order.

    Host sources are sliced and converted one chunk at a time (a contiguous
    chunk is yielded without a copy); device chunks are copied through
    :func:`interop.copy_to_host_async` into two alternating host buffers, the
    next chunk's copy running while the caller writes the previous one. Each
    yielded array is valid until the next one is requested.
    """
    from .exchange import to_numpy

    x, shape, dtype, on_device = array_source(x, "save_npy")
    if int(np.prod(shape, dtype=np.int64)) == 0:
        return
    bounce = [np.empty(max(chunk_bytes, dtype.itemsize), np.uint8) for _ in range(2)]

    def view(k: int, chunk_shape: tuple[int, ...]) -> np.ndarray:
        n = int(np.prod(chunk_shape, dtype=np.int64)) * dtype.itemsize
        return bounce[k][:n].view(dtype).reshape(chunk_shape)

    if not on_device:
        for idx in c_order_chunks(shape, dtype.itemsize, chunk_bytes):
            part = to_numpy(x[idx])
            if part.flags.c_contiguous:
                yield part
            else:
                out = view(0, part.shape)
                np.copyto(out, part)
                yield out
        return

    pending = None
    k = 0
    for idx in c_order_chunks(shape, dtype.itemsize, chunk_bytes):
        part = x[idx]
        out = view(k, tuple(part.shape))
        transfer = copy_to_host_async(part, out, chunk_bytes=chunk_bytes)
        if pending is not None:
            yield pending.result()
        pending = transfer
        k ^= 1
    if pending is not None:
        yield pending.result()


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
        Destination. The data is written to a temporary name in the same
        directory and renamed to ``path`` only when complete, so an
        interrupted save never leaves a truncated file under ``path``.
    chunk_bytes : int, optional
        Chunk size; default ``interop.config.chunk_bytes``.
    progress : bool or callable
        ``True`` shows a tqdm bar in bytes; a callable is called as
        ``progress(bytes_done, bytes_total)``.

    Returns
    -------
    pathlib.Path
        ``path``.

    Notes
    -----
    Copy semantics: the file is a copy; ``x`` is not modified and no
    full-size host copy is made. Device data goes through
    :func:`interop.copy_to_host_async` chunk by chunk, ordered after the work
    queued on the producer's current stream; the call returns when the file
    is complete. Extra host memory: two chunk buffers plus the staging ring.
    bfloat16/float8 data is written under its ``ml_dtypes`` name (see the
    module docstring for reading it with ``numpy.load``).

    Raises
    ------
    TypeError
        ``x`` is not an array.
    UnsupportedDtypeError
        ``x``'s dtype has no NumPy equivalent (``torch.complex32``).
    TransferError
        A device chunk failed; no file is left under ``path``.
    OSError
        The file cannot be written; no file is left under ``path``.
    """
    path = Path(os.fspath(path))
    chunk = chunk_bytes_or_default(chunk_bytes)
    x, shape, dtype, _ = array_source(x, "save_npy")
    if dtype.hasobject:
        raise TypeError(f"save_npy expected numeric data (got dtype {dtype!r})")
    header = _header_bytes(shape, dtype)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.partial")
    bar = Progress(progress, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, "save_npy")
    try:
        with open(tmp, "wb") as f:
            f.write(header)
            for part in _host_chunks(x, chunk):
                f.write(_as_bytes(part))
                bar.add(part.nbytes)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        bar.close()
    return path


# ----------------------------------------------------------------------- load


def _destination(header: NpyHeader, out: Any, device: Any) -> tuple[Any, bool]:
    """Validate or allocate the destination; return (destination, is_host)."""
    where = f"for {str(header.path)!r}"
    if out is None:
        if device is not None and str(device) == "cpu":
            return np.empty(header.shape, header.dtype), True
        from .upload import empty_device

        return empty_device(header.shape, header.dtype, device), False
    if isinstance(out, np.ndarray):
        host = True
        shape, dtype = out.shape, out.dtype
        if not out.flags.writeable:
            raise ValueError(f"expected a writable out {where} (got a read-only array)")
    elif _backends.is_cupy_array(out) or _backends.is_torch_tensor(out):
        _, shape, dtype, on_device = array_source(out, "load_npy")
        host = not on_device
    else:
        raise TypeError(
            f"expected out {where} to be a NumPy array, a CuPy array or a torch tensor "
            f"(got {type(out).__module__}.{type(out).__qualname__})"
        )
    if tuple(shape) != header.shape or np.dtype(dtype) != header.dtype:
        raise ValueError(
            f"expected out {where} with shape {header.shape} and dtype {header.dtype} "
            f"(got shape {tuple(shape)} and dtype {np.dtype(dtype)})"
        )
    if host and not isinstance(out, np.ndarray):
        from .exchange import to_numpy

        out = to_numpy(out, copy=False)  # a CPU tensor: write through a NumPy view
    return out, host


def _pread_into(fd: int, view: memoryview, offset: int, header: NpyHeader, done: int) -> None:
    """Fill ``view`` from the file at ``offset``; a short file is an error."""
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            raise EOFError(
                f"{str(header.path)!r} ended early: expected {len(view)} bytes at offset "
                f"{offset}, read {got}; bytes [0, {done}) of the data are complete"
            )
        got += n


def _load_to_host(header: NpyHeader, target: np.ndarray, chunk: int, progress: Any) -> None:
    """Read the file chunk by chunk into host memory (``target`` in file order)."""
    itemsize = header.dtype.itemsize
    bar = Progress(progress, header.nbytes, "load_npy")
    done = 0
    fd = os.open(header.path, os.O_RDONLY)
    try:
        buf = np.empty(max(chunk, itemsize), np.uint8)
        for idx in c_order_chunks(tuple(target.shape), itemsize, chunk):
            part = target[idx]
            n = part.size * itemsize
            direct = part.flags.c_contiguous
            raw = part.reshape(-1).view(np.uint8) if direct else buf[:n]
            try:
                _pread_into(fd, raw.data, header.offset + done, header, done)
            except EOFError as exc:
                raise TransferError(str(exc), bytes_done=done, nbytes=header.nbytes) from exc
            if not direct:
                np.copyto(part, raw.view(header.dtype).reshape(part.shape))
            done += n
            bar.add(n)
    finally:
        os.close(fd)
        bar.close()


def _load_to_device(header: NpyHeader, result: Any, chunk: int, progress: Any) -> None:
    """Read the file straight into the pinned staging slots (host threads,
    ``os.preadv``) while earlier slots are copied to the device."""
    from .upload import _cupy_bits, h2d_pipeline

    dst, _ = _cupy_bits(result, "load_npy")
    target = _c_order_view(dst, header.fortran_order)
    fd = os.open(header.path, os.O_RDONLY)

    def read(idx: tuple, start: int, slot: np.ndarray) -> int:
        n = target[idx].size * header.dtype.itemsize
        _pread_into(fd, slot[:n].data, header.offset + start, header, start)
        return n

    try:
        h2d_pipeline(result, target, header.dtype.itemsize, read, chunk, progress, "load_npy")
    finally:
        os.close(fd)


def _c_order_view(dest: Any, fortran: bool) -> Any:
    """The destination as seen in the file's storage order (C order)."""
    if not fortran or len(getattr(dest, "shape", ())) < 2:
        return dest
    if _backends.is_torch_tensor(dest):
        return dest.permute(*reversed(range(dest.dim())))
    return dest.transpose()


def load_npy(
    path: str | os.PathLike[str],
    /,
    out: Any = None,
    *,
    device: Any = None,
    chunk_bytes: int | None = None,
    progress: Any = False,
) -> Any:
    """Read a ``.npy`` file chunk by chunk into device (or host) memory.

    Parameters
    ----------
    path : str or os.PathLike
        A ``.npy`` file (format 1.0 or 2.0, C or Fortran order).
    out : cupy.ndarray, torch.Tensor or numpy.ndarray, optional
        Preallocated destination with the file's shape and dtype, any strides.
        Checked, with the header and the file size, before anything is read.
    device : optional
        Without ``out``: the CUDA device of the new CuPy array (default: the
        current device), or ``"cpu"`` for a NumPy array.
    chunk_bytes : int, optional
        Chunk size; default ``interop.config.chunk_bytes``.
    progress : bool or callable
        ``True`` shows a tqdm bar in bytes; a callable is called as
        ``progress(bytes_done, bytes_total)``.

    Returns
    -------
    cupy.ndarray, torch.Tensor or numpy.ndarray
        ``out`` itself when given, else a new CuPy array (NumPy for
        ``device="cpu"``).

    Notes
    -----
    The file is never read whole. For device memory, host threads read each
    chunk (``os.preadv``) straight into a free pinned staging slot while
    earlier slots are copied to the device — the pipeline of
    :func:`interop.copy_to_device`, ordered after the destination library's
    current stream; the call returns when the data is on the device. For host
    memory, contiguous chunks are read straight into ``out``, others through
    one chunk buffer. Extra host memory is the staging ring (device) or one
    chunk buffer (host).

    Raises
    ------
    ValueError
        Corrupt, truncated or object-dtype file (the message names the file),
        or an ``out`` of the wrong shape/dtype or read-only; nothing is written.
    TypeError
        ``out`` is not an array.
    TransferError
        Reading or copying failed part-way; the message says which byte range
        of ``out`` (in file order) is complete. The call never reports a
        partly written ``out`` as success.
    """
    header = read_npy_header(path)
    chunk = chunk_bytes_or_default(chunk_bytes)
    dest, host = _destination(header, out, device)
    result = dest if out is None else out
    if host:
        _load_to_host(header, _c_order_view(dest, header.fortran_order), chunk, progress)
    else:
        _load_to_device(header, result, chunk, progress)
    return result
