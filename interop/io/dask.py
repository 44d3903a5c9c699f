"""Dask arrays to and from one ``.npy`` file, one task per block (:mod:`interop.dask`)."""

from __future__ import annotations

import contextlib
import errno as _errno
import fcntl
import os
import socket
import sys
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from .. import _backends, dtypes
from ..arrays import array_source, parse_device
from ..config import chunk_bytes_or_default
from ..errors import (
    BackendUnavailableError,
    InvalidTypeError,
    InvalidValueError,
    PathNotFoundError,
    TransferError,
    path_error,
)
from ..pipeline.hostcopy import run_chunk
from ..pipeline.plan import nbytes_of, plan_chunks
from ..pipeline.start import empty_device
from . import _format
from ._format import read_npy_header, write_all
from .destination import Destination, prepare_destination

try:
    import dask
    import dask.array as da
    from dask.base import get_scheduler, tokenize
    from dask.callbacks import Callback
except ImportError as exc:  # pragma: no cover - the test environment installs dask
    raise BackendUnavailableError(
        f"interop.dask needs dask, which cannot be imported ({exc}); "
        f"install it with: {_backends.install_command('dask')}"
    ) from exc

__all__ = ["SaveError", "load_npy", "save_npy"]

_FILLED = "da.ma.filled(darr, fill_value)"


class SaveError(TransferError):
    """:func:`save_npy` failed or was cancelled; no file was left under the path.

    Attributes
    ----------
    blocks_done : tuple of tuple of int
        Indices (``darr.blocks[i, j, ...]``) of the blocks written before the save stopped.
    nblocks : int
        Number of blocks of the array.
    bytes_done, nbytes : int
        0 (nothing is kept under the final name), and the data's size.
    """

    def __init__(
        self,
        message: str,
        *,
        blocks_done: Iterable[tuple[int, ...]] = (),
        nblocks: int = 0,
        nbytes: int = 0,
    ) -> None:
        super().__init__(message, bytes_done=0, nbytes=nbytes)
        self.blocks_done = tuple(sorted(blocks_done))
        self.nblocks = nblocks


def _block(info: dict, layout: _format.Layout, func: str, fortran: bool = False) -> tuple[Any, ...]:
    """A task's block: its first element, shape (in file order) and name for messages."""
    location = [tuple(map(int, loc)) for loc in info["array-location"]]
    if fortran:
        location = location[::-1]  # the file holds the transpose in C order
    origin = tuple(lo for lo, _ in location)
    shape = tuple(hi - lo for lo, hi in location)
    index = tuple(info["chunk-location"])
    where = f"{socket.gethostname()} (pid {os.getpid()})"
    return origin, shape, f"{func}: block {index} of {layout.path!r} on {where}"


def _still_saving(fd: int, what: str) -> None:
    """Raise if the caller gave the save up (it removed the temporary file)."""
    if os.fstat(fd).st_nlink == 0:
        why = "the save failed or was cancelled: this block stopped writing"
        raise PathNotFoundError(_errno.ENOENT, f"{what}: {why}")


def _block_writer(fd: int, runs: _format.Runs, what: str, array: Any = None) -> _format.FileWriter:
    """The file stage writing a block at its runs, stopping once the save was given up."""
    return _format.FileWriter(fd, runs, what, array, check=partial(_still_saving, fd, what))


def _write_block(
    block: Any, *, layout: _format.Layout, chunk_bytes: int | None, block_info: Any = None
) -> np.ndarray:
    """Task: write one block at its offsets (idempotent); return its byte count as a block."""
    func = "interop.dask.save_npy"
    origin, shape, what = _block(block_info[0], layout, func)
    _format.refuse_masked(block, f"{what}: expected a block", _FILLED)  # meta showed no mask
    src = array_source(block, func)
    got_shape, got_dtype = tuple(int(n) for n in src.shape), src.dtype
    if got_shape != shape or got_dtype != layout.dtype:
        raise InvalidValueError(
            f"{what}: expected a block of shape {shape} and dtype {layout.dtype} (got shape "
            f"{got_shape} and dtype {got_dtype}); fix the function that makes the blocks"
        )
    result = np.full((1,) * len(shape), 0, np.int64)
    if 0 in shape:
        return result
    chunk = chunk_bytes_or_default(chunk_bytes)
    try:
        fd = os.open(layout.path, os.O_WRONLY | os.O_CLOEXEC)  # never creates: see save_npy
    except FileNotFoundError as exc:
        why = "the save failed or was cancelled, or the worker sees another file system"
        raise PathNotFoundError(_errno.ENOENT, f"{what}: temporary file gone ({why})") from exc
    try:
        # a shared lock until the close: _abandon's exclusive one waits for it
        with contextlib.suppress(OSError):  # ENOLCK, EOPNOTSUPP: no locks here
            fcntl.flock(fd, fcntl.LOCK_SH)
        _still_saving(fd, what)
        writer = _block_writer(fd, layout.runs(origin, shape), what, src.obj)
        if src.on_device:  # through the staging ring, whose host threads write each slot
            _format.move(src, writer, func, "the block's C order", chunk_bytes=chunk)
        else:  # chunk by chunk on this thread, the block's errors raised as they are
            plan = plan_chunks(src.shape, layout.dtype.itemsize, chunk, 1)
            for i in range(len(plan.chunks)):
                run_chunk(writer, plan, i)
    finally:
        os.close(fd)
    result[...] = nbytes_of(shape, layout.dtype.itemsize)
    return result


def _create(destination: Destination, header: bytes, size: int) -> None:
    """The temporary file with its header, sized (by the caller: a task may run twice)."""
    fd = destination.create()
    try:
        write_all(fd, memoryview(header), 0)
        os.ftruncate(fd, size)
        # Writes into one file hold its inode lock in turn; reserved blocks keep allocation
        # out of them (ext4, 256 MiB: 64 ms sparse, 44 ms reserved), and a full disk shows now.
        fallocate = getattr(os, "posix_fallocate", None)
        if fallocate is not None and size:
            try:
                fallocate(fd, 0, size)
            except OSError as exc:  # not supported here: the file is only sized
                if exc.errno not in (_errno.EOPNOTSUPP, _errno.EINVAL, _errno.ENOSYS):
                    raise
    except BaseException as exc:
        os.close(fd)
        destination.discard()
        if isinstance(exc, OSError) and exc.errno in (_errno.ENOSPC, _errno.EFBIG, _errno.EDQUOT):
            raise path_error(
                exc.errno,
                f"interop.dask.save_npy could not reserve the {size} bytes of the file "
                f"({os.strerror(exc.errno)}); nothing was written and the destination is "
                "untouched: free space, or save elsewhere",
                str(destination.path),
            ) from exc
        raise
    os.close(fd)


def _abandon(destination: Destination) -> None:
    """Remove the temporary file; return once no block task writes it any more."""
    # tasks stop at a link count of 0; truncating frees the space a stopped one still holds
    fd = -1
    if destination.temporary is not None:
        with contextlib.suppress(OSError):
            fd = os.open(destination.temporary, os.O_WRONLY | os.O_CLOEXEC)
    try:
        destination.discard()
        if fd >= 0:
            with contextlib.suppress(OSError):  # no locks here: nothing to wait for
                fcntl.flock(fd, fcntl.LOCK_EX)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
    finally:
        if fd >= 0:
            os.close(fd)


def _commit(destination: Destination, written: Any) -> Path:
    """Task (``compute=False``): rename once every block is ``written``."""
    destination.commit()
    return destination.path


def _blocks(keys: list[tuple[int, ...]], limit: int = 8) -> str:
    shown = ", ".join(str(b) for b in sorted(keys)[:limit])
    return f"[{shown}{f', ... {len(keys) - limit} more' if len(keys) > limit else ''}]"


def _run(writes: Any) -> tuple[list, list, BaseException | None] | None:
    """Run the writes: None once all are written, else (blocks written, failed, cause)."""
    scheduler = get_scheduler(collections=[writes])
    client = getattr(scheduler, "__self__", None)  # a distributed Client's client.get
    distributed = sys.modules.get("distributed")  # imported where a Client exists
    if distributed is None or not isinstance(client, distributed.Client):
        done: list[tuple[int, ...]] = []

        def posttask(key: Any, result: Any, dsk: Any, state: Any, worker_id: Any) -> None:
            if isinstance(key, tuple) and key and key[0] == writes.name:
                done.append(tuple(key[1:]))

        try:
            with Callback(posttask=posttask):  # called by dask's local schedulers only
                dask.compute(writes, scheduler=scheduler)
        except Exception as exc:
            return done, [], exc
        return None
    futures = distributed.futures_of(client.persist(writes))
    try:
        for future in distributed.as_completed(futures):
            if future.status != "finished":
                break  # the first failure (or cancellation) ends the save
        else:
            return None
        states = [(tuple(f.key[1:]), f.status, f) for f in futures]
        erred = [f for _, status, f in states if status == "error"]
        cause = erred[0].exception() if erred else None  # before cancelling, which forgets it
    finally:  # a KeyboardInterrupt while waiting too: nothing else may run
        client.cancel(futures)
    done = [key for key, status, _ in states if status == "finished"]
    return done, [key for key, status, _ in states if status == "error"], cause


def save_npy(
    darr: Any,
    path: str | os.PathLike[str],
    /,
    *,
    chunk_bytes: int | None = None,
    compute: bool = True,
) -> Any:
    """Write a dask array to one standard ``.npy`` file, block by block on the workers.

    Parameters
    ----------
    darr : dask.array.Array
        NumPy or CuPy blocks with known chunk sizes.
    path : str or os.PathLike
        On a file system every worker shares; the rules of :func:`interop.save_npy`.
    chunk_bytes : int, optional
        Largest piece a task copies at once; default: each worker's config.
    compute : bool
        False: return a ``dask.delayed.Delayed`` that writes and renames when computed.

    Returns
    -------
    pathlib.Path or dask.delayed.Delayed
        The path written (``.npy`` appended as by ``numpy.save``), or the save.

    Notes
    -----
    Each block is written by the task that makes it (device blocks through the staging
    ring, after their library's current stream), then a temporary file is renamed.

    Raises
    ------
    TypeError, ValueError
        Not a dask array, object, masked, unknown chunk sizes, a FIFO ``path``.
    OSError
        ``path`` is refused or too small (``PathError``), before any block is computed.
    SaveError
        A block raised (the ``__cause__``) or it was cancelled; no file is left.
    """
    func = "interop.dask.save_npy"
    if not isinstance(darr, da.Array):
        raise InvalidTypeError(
            f"{func} expected a dask.array.Array (got {type(darr).__module__}."
            f"{type(darr).__qualname__}); for one in-memory array use interop.save_npy"
        )
    _format.refuse_masked(darr._meta, f"{func} expected blocks", _FILLED)
    dtype = np.dtype(darr.dtype)
    if dtype.hasobject:
        raise InvalidTypeError(f"{func} expected numeric data (got dtype {dtype!r})")
    if any(np.isnan(c) for sizes in darr.chunks for c in sizes):
        raise InvalidValueError(
            f"{func} expected known chunk sizes (got {darr.chunks!r}); "
            "call darr.compute_chunk_sizes() first"
        )
    if chunk_bytes is not None:
        chunk_bytes_or_default(chunk_bytes)  # validated here, used on the workers
    destination = prepare_destination(path, func)
    if destination.streaming:
        raise InvalidValueError(
            f"{func} expected a regular file or a new path (got {str(destination.path)!r}, a "
            "FIFO or character device): writing at offsets needs a regular file"
        )
    path = destination.path
    shape = tuple(int(n) for n in darr.shape)
    header = _format.header_bytes(shape, dtype)
    nbytes = nbytes_of(shape, dtype.itemsize)
    # A save has side effects: its keys are new for every call.
    token = tokenize(darr.name, str(destination.target), chunk_bytes, uuid.uuid4().hex)
    _create(destination, header, len(header) + nbytes)
    try:
        layout = _format.Layout(str(destination.temporary), shape, dtype, len(header))
        writes = da.map_blocks(  # one element per block: its byte count
            _write_block,
            darr,
            name=f"interop-save-npy-{token}",
            chunks=tuple((1,) * n for n in darr.numblocks),
            dtype=np.int64,
            meta=np.empty((0,) * darr.ndim, np.int64),
            layout=layout,
            chunk_bytes=chunk_bytes,
        )
        if not compute:
            return dask.delayed(_commit, pure=False)(
                destination, writes, dask_key_name=f"interop-save-npy-commit-{token}"
            )
        stopped = _run(writes)
        if stopped is not None:
            done, failed, cause = stopped
            nblocks = int(np.prod(darr.numblocks, dtype=np.int64))
            reason = (
                "was cancelled" if cause is None else f"failed ({type(cause).__name__}: {cause})"
            )
            culprit = f"block(s) {_blocks(failed)} could not be written; " if failed else ""
            raise SaveError(
                f"{func} of {str(path)!r} {reason}; {culprit}{len(done)} of {nblocks} blocks "
                f"were written {_blocks(done)}; no file was left under {str(path)!r} (an "
                "existing one is untouched)",
                blocks_done=done,
                nblocks=nblocks,
                nbytes=nbytes,
            ) from cause
        destination.commit()
    except BaseException:
        _abandon(destination)  # returns once no block task writes the file any more
        raise
    return path


@dataclass(frozen=True)
class _Source:
    layout: _format.Layout  # in file order (a Fortran-order file: the transposed shape)
    fortran: bool
    identity: tuple[int, int, int, int]  # npy.file_identity when the header was read
    host: str  # the machine that read the header (where the device number holds)


def _read_block(*, source: _Source, device: Any, block_info: Any = None) -> Any:
    layout = source.layout
    origin, shape, what = _block(block_info[None], layout, "interop.dask.load_npy", source.fortran)
    # a file replaced in between would give blocks of two files, silently
    same_machine = source.host == socket.gethostname()
    fd = _format.open_unchanged(layout.path, source.identity, what, same_machine=same_machine)
    try:
        if device is None or device[0] != "cuda":
            block = np.empty(shape, layout.dtype)
        else:  # non-native byte order is converted in the slots
            block = empty_device(shape, layout.dtype.newbyteorder("="), device[1])
        reader = _format.FileReader(fd, layout.runs(origin, shape), what, block, dtype=layout.dtype)
        dst = array_source(block, "interop.dask.load_npy")
        _format.move(dst, reader, "interop.dask.load_npy", "the block's C order")
    finally:
        os.close(fd)
    return block.T if source.fortran else block


def load_npy(path: str | os.PathLike[str], /, *, chunks: Any = "auto", device: Any = None) -> Any:
    """A dask array whose blocks are read from a ``.npy`` file on the workers.

    Parameters
    ----------
    path : str or os.PathLike
        A ``.npy`` file on a file system every worker shares.
    chunks : int, tuple, dict or "auto", default "auto"
        Block shape, as ``dask.array.from_array`` takes it.
    device : optional
        ``"cuda"``, ``"cuda:N"`` or an int: CuPy blocks; ``None`` or ``"cpu"``: NumPy.

    Returns
    -------
    dask.array.Array
        Lazy: the caller reads only the header, each task its block.

    Raises
    ------
    ValueError
        Not a readable ``.npy`` file, bad ``chunks`` or ``device``, a file changed since.
    OSError
        No such file, or no regular file.
    NoDeviceError, BackendUnavailableError, UnsupportedDtypeError
        ``device="cuda"`` without CuPy or a device on the caller, or a dtype CuPy cannot hold.
    TransferError
        From a task: the file came up short.
    """
    header = read_npy_header(path)
    target = parse_device(device)
    try:
        normalized = da.core.normalize_chunks(chunks, header.shape, dtype=header.dtype)
        if any(n == 0 for axis, size in zip(normalized, header.shape, strict=True) if size
               for n in axis):  # fmt: skip
            raise ValueError("a block size of 0 along an axis that has data")
    except (ValueError, TypeError, ZeroDivisionError) as exc:
        why = "a block size of 0" if isinstance(exc, ZeroDivisionError) else str(exc)
        raise InvalidValueError(
            f"interop.dask.load_npy expected chunks for shape {header.shape} (got {chunks!r}: "
            f"{why}); pass positive block sizes (-1 for a whole axis), or chunks='auto'"
        ) from exc
    dtype, xp = header.dtype, np
    if target is not None and target[0] == "cuda":  # native byte order: CuPy holds no other
        xp = _backends.require_cupy_device()
        dtype = header.dtype.newbyteorder("=")
        dtypes.check_cupy_dtype(dtype)
    meta = xp.empty((0,) * len(header.shape), dtype)  # the empty block describing the blocks
    file_shape = header.shape[::-1] if header.fortran_order else header.shape
    layout = _format.Layout(str(header.path.resolve()), file_shape, header.dtype, header.offset)
    source = _Source(layout, header.fortran_order, header.identity, socket.gethostname())
    name = f"interop-load-npy-{tokenize(source, normalized, target)}"
    return da.map_blocks(
        _read_block,
        name=name,
        chunks=normalized,
        dtype=dtype,
        meta=meta,
        source=source,
        device=target,
    )
