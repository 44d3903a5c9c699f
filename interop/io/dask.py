"""Save and load dask arrays of NumPy or CuPy blocks as one ``.npy`` file, on the workers.

``interop.dask`` is imported explicitly (``import interop.dask``); ``import
interop`` never imports dask or distributed. It needs the ``dask`` extra
(``pip install -e '.[dask]'`` in a clone: ``dask[array]`` and ``distributed``).

Dask schedules everything; interop adds one task per block:

* :func:`save_npy`: the caller writes the ``.npy`` header and sizes a
  temporary file next to the destination; one task per block (on the worker
  that holds the block, where Dask puts it) writes the block's bytes at their
  C-order offsets with positioned writes (``os.pwritev``), from the block's own
  memory when it is a C-contiguous host array, else piece by piece through one
  bounded host buffer (a device block through the pinned staging ring of the
  device-to-host pipeline, whose host threads write each slot to the file);
  the temporary file is renamed to the final name only when every block is
  written. A failed save removes it once no task writes it any more (see
  :func:`_abandon`).
* :func:`load_npy`: a dask array whose blocks are read on the workers with
  positioned reads (``os.preadv``) of each block's runs, straight into a new
  NumPy block, or into the pinned staging ring and on to a new CuPy block.

A block's *runs* are the stretches of the file that hold it: a block that spans
whole trailing axes is one run, one that does not is one run per row of its
leading axes. Runs are as long as the layout allows (adjacent ones are merged).
"""

from __future__ import annotations

import contextlib
import errno as _errno
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

from .. import dtypes
from .._backends import install_command
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
from ._format import (
    FileReader,
    FileWriter,
    Layout,
    Runs,
    header_bytes,
    open_unchanged,
    read_into,
    read_npy_header,
    write_all,
    write_from,
)
from .destination import Destination, prepare_destination

try:
    import fcntl
except ImportError:  # pragma: no cover - not a POSIX system: no file locks
    fcntl = None  # type: ignore[assignment]

try:
    import dask
    import dask.array as da
    from dask.base import get_scheduler, tokenize
    from dask.callbacks import Callback
except ImportError as exc:  # pragma: no cover - the test environment installs dask
    raise BackendUnavailableError(
        f"interop.dask needs dask, which cannot be imported ({exc}); "
        f"install it with: {install_command('dask')}"
    ) from exc

__all__ = ["SaveError", "load_npy", "save_npy"]


class SaveError(TransferError):
    """:func:`save_npy` failed or was cancelled; no file was left under the path.

    Attributes
    ----------
    blocks_done : tuple of tuple of int
        Indices (``darr.blocks[i, j, ...]``) of the blocks whose bytes were
        written before the save stopped, sorted.
    nblocks : int
        Number of blocks of the array.
    bytes_done : int
        0: nothing is kept under the final name.
    nbytes : int
        Size of the array's data in bytes.
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


def _where() -> str:
    return f"{socket.gethostname()} (pid {os.getpid()})"


# ------------------------------------------------------------------ save


def _refuse_masked(x: Any, what: str) -> None:
    """Refuse masked blocks (a ``numpy.ma.MaskedArray`` meta or block): a
    ``.npy`` file has no room for the mask."""
    if isinstance(x, np.ma.MaskedArray):
        raise InvalidTypeError(
            f"{what} expected blocks without a mask (got numpy.ma.MaskedArray blocks: a .npy "
            "file holds no mask, and numpy.save refuses masked arrays too); save "
            "da.ma.filled(darr, fill_value) for the values with the masked ones replaced, or "
            "da.ma.getdata(darr) and da.ma.getmaskarray(darr) as two files"
        )


def _lock_shared(fd: int) -> None:
    """Hold a shared lock on the temporary file while this task writes it: the
    caller, giving the save up, takes the exclusive lock to know that no task
    writes any more. Where the file system has no locks, nothing is held."""
    if fcntl is not None:
        with contextlib.suppress(OSError):  # ENOLCK, EOPNOTSUPP: no locks here
            fcntl.flock(fd, fcntl.LOCK_SH)


def _still_saving(fd: int, what: str) -> None:
    """Raise if the caller gave the save up (it removed the temporary file):
    checked before each piece is written, so a task stops writing soon after
    the save failed elsewhere or was cancelled."""
    if os.fstat(fd).st_nlink == 0:
        raise PathNotFoundError(
            _errno.ENOENT,
            f"{what}: the save failed or was cancelled (its temporary file was removed); "
            "this block stopped writing",
        )


def _write_block(
    block: Any,
    *,
    layout: Layout,
    chunk_bytes: int | None,
    block_info: Any = None,
) -> np.ndarray:
    """Task: write one block at its offsets; return its byte count (as a block).

    Idempotent: run twice (a retry, or a task Dask chose to recompute), it
    writes the same bytes to the same offsets.
    """
    info = block_info[0]
    location = [tuple(map(int, loc)) for loc in info["array-location"]]
    origin = tuple(lo for lo, _ in location)
    shape = tuple(hi - lo for lo, hi in location)
    index = tuple(info["chunk-location"])
    what = f"interop.dask.save_npy: block {index} of {layout.path!r} on {_where()}"
    _refuse_masked(block, what)  # a mask its array's meta did not show
    src = array_source(block, "interop.dask.save_npy")
    got_shape, got_dtype = tuple(int(n) for n in src.shape), src.dtype
    if got_shape != shape or got_dtype != layout.dtype:
        raise InvalidValueError(
            f"{what}: expected a block of shape {shape} and dtype {layout.dtype} "
            f"(got shape {got_shape} and dtype {got_dtype}); the dask array's chunks or dtype "
            "do not describe its blocks: fix the function that makes them"
        )
    result = np.full((1,) * len(shape), 0, np.int64)
    if 0 in shape:
        return result
    chunk = chunk_bytes_or_default(chunk_bytes)
    runs = layout.runs(origin, shape)
    try:
        fd = os.open(layout.path, os.O_WRONLY | os.O_CLOEXEC)  # never creates: see save_npy
    except FileNotFoundError as exc:
        raise PathNotFoundError(
            _errno.ENOENT,
            f"{what}: the temporary file is gone (the save failed or was cancelled), or this "
            "worker does not share the client's file system",
        ) from exc
    try:
        _lock_shared(fd)  # released by the close
        _still_saving(fd, what)
        _write_block_data(fd, src, runs, layout, chunk, what)
    finally:
        os.close(fd)
    result[...] = nbytes_of(shape, layout.dtype.itemsize)
    return result


def _block_writer(fd: int, runs: Runs, what: str, array: Any = None) -> FileWriter:
    """The file stage writing a block at its runs, once the save is seen to
    go on before each piece."""
    return FileWriter(fd, runs, what, array, check=partial(_still_saving, fd, what))


def _write_block_data(fd: int, src: Any, runs: Runs, layout: Layout, chunk: int, what: str) -> None:
    """A device block through the pinned staging ring (ordered after the work
    queued on the block's library's current stream), whose host threads write
    each slot at its offsets; a host block chunk by chunk on this thread (its
    own memory where contiguous, else through one chunk buffer), its errors
    raised as they are."""
    writer = _block_writer(fd, runs, what, src.obj)
    if src.on_device:
        write_from(src, writer, "interop.dask.save_npy", "the block's C order", chunk_bytes=chunk)
        return
    plan = plan_chunks(src.shape, layout.dtype.itemsize, chunk, 1)
    for i in range(len(plan.chunks)):
        run_chunk(writer, plan, i)


def _create(destination: Destination, header: bytes, size: int) -> None:
    """Create the temporary file (on the caller): the header, then the file
    sized to ``size``. Never a task: Dask may run a task more than once."""
    fd = destination.create()
    try:
        write_all(fd, memoryview(header), 0)
        _allocate(fd, size)
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


def _allocate(fd: int, size: int) -> None:
    """Size the file to ``size`` bytes with its blocks allocated where the file
    system can (``posix_fallocate``): positioned writes from several workers
    into allocated blocks go on in parallel (on ext4, writes into a sparse
    file take the inode's lock in turn: measured 64 ms against 44 ms for
    256 MiB from two processes). Elsewhere the file is only sized."""
    os.ftruncate(fd, size)
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is None or not size:
        return
    try:
        fallocate(fd, 0, size)
    except OSError as exc:  # a full disk is an error here, before any block is written
        if exc.errno not in (_errno.EOPNOTSUPP, _errno.EINVAL, _errno.ENOSYS):
            raise


def _abandon(destination: Destination) -> None:
    """Remove the temporary file once no block task writes it any more.

    Removing it first tells the running tasks to stop (each checks, before
    every piece, that the file still has its name) and keeps tasks that start
    later from opening it. The exclusive lock is granted once every task that
    holds its shared lock has closed the file; truncating the removed file
    then gives its space back at once, even while a task that stopped still
    has it open. Where the file system has no locks the truncation alone
    frees the space, and a task that was writing stops at its next piece.
    """
    fd = -1
    if destination.temporary is not None:
        with contextlib.suppress(OSError):
            fd = os.open(destination.temporary, os.O_WRONLY | os.O_CLOEXEC)
    try:
        destination.discard()
        if fd >= 0:
            if fcntl is not None:
                with contextlib.suppress(OSError):  # no locks here: nothing to wait for
                    fcntl.flock(fd, fcntl.LOCK_EX)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
    finally:
        if fd >= 0:
            os.close(fd)


def _commit(destination: Destination, written: np.ndarray, nbytes: int) -> Path:
    """Task (``compute=False``): rename once every block is written."""
    total = int(np.sum(written))
    if total != nbytes:
        destination.discard()
        raise SaveError(
            f"interop.dask.save_npy: expected {nbytes} bytes written to "
            f"{str(destination.path)!r} (got {total}); no file was left under that name",
            nbytes=nbytes,
        )
    destination.commit()
    return destination.path


def _writes(darr: Any, layout: Layout, chunk_bytes: int | None, name: str) -> Any:
    """The dask array of write tasks: one element per block (its byte count)."""
    out_chunks = tuple((1,) * n for n in darr.numblocks)
    return da.map_blocks(
        _write_block,
        darr,
        name=name,
        chunks=out_chunks,
        dtype=np.int64,
        meta=np.empty((0,) * darr.ndim, np.int64),
        layout=layout,
        chunk_bytes=chunk_bytes,
    )


def _distributed_client(scheduler: Any) -> Any:
    """The distributed Client behind ``scheduler`` (``client.get``), or None."""
    if "distributed" not in sys.modules:
        return None
    from distributed import Client

    client = getattr(scheduler, "__self__", None)
    return client if isinstance(client, Client) else None


def _describe_blocks(blocks: list[tuple[int, ...]], limit: int = 8) -> str:
    shown = ", ".join(str(b) for b in blocks[:limit])
    more = f", ... {len(blocks) - limit} more" if len(blocks) > limit else ""
    return f"[{shown}{more}]"


def _failure(
    path: Path,
    nblocks: int,
    nbytes: int,
    done: list[tuple[int, ...]],
    culprit: str,
    cause: BaseException | None,
) -> SaveError:
    done = sorted(done)
    reason = "was cancelled" if cause is None else f"failed ({type(cause).__name__}: {cause})"
    err = SaveError(
        f"interop.dask.save_npy of {str(path)!r} {reason}; {culprit}{len(done)} of {nblocks} "
        f"blocks were written {_describe_blocks(done)}; no file was left under "
        f"{str(path)!r} (an existing one is untouched)",
        blocks_done=done,
        nblocks=nblocks,
        nbytes=nbytes,
    )
    err.__cause__ = cause
    return err


def _run_distributed(client: Any, writes: Any, path: Path, nbytes: int) -> int:
    from distributed import as_completed, futures_of

    nblocks = int(np.prod(writes.numblocks, dtype=np.int64))
    persisted = client.persist(writes)
    futures = futures_of(persisted)
    try:
        for future in as_completed(futures):
            if future.status != "finished":
                break  # the first failure (or cancellation) ends the save
        statuses = [f.status for f in futures]
        if all(s == "finished" for s in statuses):
            return int(sum(int(np.sum(r)) for r in client.gather(futures)))
    except BaseException:  # KeyboardInterrupt while waiting: nothing else may run
        client.cancel(futures)
        raise
    done = [tuple(f.key[1:]) for f, s in zip(futures, statuses, strict=True) if s == "finished"]
    erred = [f for f, s in zip(futures, statuses, strict=True) if s == "error"]
    cause: BaseException | None = None
    culprit = ""
    if erred:
        cause = erred[0].exception()  # before cancelling, which forgets it
        failed = sorted(tuple(f.key[1:]) for f in erred)
        culprit = f"block(s) {_describe_blocks(failed)} could not be written; "
    client.cancel(futures)
    raise _failure(path, nblocks, nbytes, done, culprit, cause)


def _run_local(scheduler: Any, writes: Any, path: Path, nbytes: int) -> int:
    name = writes.name
    nblocks = int(np.prod(writes.numblocks, dtype=np.int64))
    done: list[tuple[int, ...]] = []

    def posttask(key: Any, result: Any, dsk: Any, state: Any, worker_id: Any) -> None:
        if isinstance(key, tuple) and key and key[0] == name:
            done.append(tuple(key[1:]))

    try:
        with Callback(posttask=posttask):  # called by dask's local schedulers only
            (written,) = dask.compute(writes, scheduler=scheduler)
    except Exception as exc:
        raise _failure(path, nblocks, nbytes, done, "", exc) from exc
    return int(np.sum(written))


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
        Blocks may be NumPy or CuPy arrays (any strides), of any dtype
        ``interop.save_npy`` accepts (bfloat16/float8 under their
        ``ml_dtypes`` names), with any chunking. Chunk sizes must be known.
    path : str or os.PathLike
        Destination, on a file system that every worker shares with the
        caller; ``.npy`` is appended to a name without a suffix, as
        ``numpy.save`` does. The data goes to a hidden temporary file in the
        same directory, renamed to ``path`` only when every block is written.
        A symlink is followed and its target replaced; an existing file's mode
        (and owner, where permitted) is kept. Checked before any block is
        computed.
    chunk_bytes : int, optional
        Largest piece a worker copies at once for a block that is not a
        C-contiguous host array; default: each worker's
        ``interop.config.chunk_bytes``.
    compute : bool
        True: write now and return the path. False: create the temporary
        file now and return a ``dask.delayed.Delayed`` that writes the blocks
        and renames the file when computed (with ``dask.compute`` or
        ``client.compute``, alone or with other collections), and returns the
        path.

    Returns
    -------
    pathlib.Path or dask.delayed.Delayed
        The path written (``.npy`` appended where ``numpy.save`` appends
        it), or the delayed save.

    Notes
    -----
    Copy semantics: the file is a copy; ``darr`` is computed once, each block
    on the worker that makes it, and never gathered on the caller. The caller
    writes the header and sizes the file (nothing of the data); each block's
    task writes its bytes at their C-order offsets with ``os.pwritev``,
    straight from a C-contiguous NumPy block, else piece by piece through one
    host buffer of at most ``chunk_bytes``. A CuPy block (or CUDA tensor)
    goes through the device-to-host pipeline's pinned staging slots, written
    from there to the file by its host threads, ordered after the work
    queued on the block's library's current stream in the task's thread.
    Extra host memory per running task: at most ``chunk_bytes`` for a host
    block, the staging ring (``num_buffers * chunk_bytes``, pinned and
    reused) for a device block. A task that runs twice (Dask retries it
    after a worker died) writes the same bytes.

    Scheduling is Dask's: the distributed client in use, else the scheduler
    dask would pick (threads by default). With ``compute=False`` the caller
    still writes the header and sizes the temporary file now (Dask may run a
    task more than once, so creating a file is never a task); the rename is
    the graph's last task. A delayed save that is never computed, or whose
    computation fails or is cancelled, leaves that hidden temporary file
    (``.NAME.XXXXXXXX.tmp``) beside ``path``, for the caller to delete; the
    final name never appears.

    Raises
    ------
    TypeError
        ``darr`` is not a dask array, holds Python objects, or is a masked
        array (a ``.npy`` file has no room for the mask: save
        ``da.ma.filled(darr, fill_value)``, or ``da.ma.getdata`` and
        ``da.ma.getmaskarray`` as two files); masked blocks under an
        unmasked meta are refused by their tasks (a :class:`SaveError`).
    ValueError
        Unknown chunk sizes (``darr.compute_chunk_sizes()`` first), a bad
        ``chunk_bytes``, a ``path`` with a NUL byte, or ``path`` is a FIFO
        or a character device (the blocks are written at their offsets,
        which needs a regular file: save to a file, or use
        ``interop.save_npy``).
    IsADirectoryError, PermissionError, FileNotFoundError, OSError
        ``path`` is a directory, may not be written (or its directory may
        not), its directory does not exist, or it is a socket or block
        device. Raised before any block is computed; nothing is created.
    PathError
        The file system cannot hold the array (``errno.ENOSPC``, ``EFBIG``,
        ``EDQUOT``): the file's blocks are reserved before any block is
        computed, where the file system can (``posix_fallocate``), so a full
        disk is found at once; nothing is left, the destination is untouched.
    SaveError
        A block raised (a full disk, where blocks could not be reserved: its
        ``OSError`` with ``errno.ENOSPC``),
        a worker died too often, or the compute was cancelled: no file is
        left under ``path`` (an existing one is untouched); ``blocks_done``
        lists the blocks that were written and the block's own error is the
        ``__cause__``. It is raised once no block task writes the file any
        more: tasks still writing stop before their next piece, and the
        temporary file's space is free when the call returns. A
        ``KeyboardInterrupt`` cancels the tasks, removes the temporary file
        and is re-raised, after the same wait.
    """
    func = "interop.dask.save_npy"
    if not isinstance(darr, da.Array):
        raise InvalidTypeError(
            f"{func} expected a dask.array.Array (got {type(darr).__module__}."
            f"{type(darr).__qualname__}); for one in-memory array use interop.save_npy"
        )
    _refuse_masked(darr._meta, func)
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
            "FIFO or character device); the blocks are written at their offsets, which needs a "
            "regular file: save to a file and copy it, or use interop.save_npy"
        )
    path = destination.path
    shape = tuple(int(n) for n in darr.shape)
    header = header_bytes(shape, dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    size = len(header) + nbytes
    # A save has side effects: its keys are new for every call.
    token = tokenize(darr.name, str(destination.target), chunk_bytes, uuid.uuid4().hex)
    name = f"interop-save-npy-{token}"

    _create(destination, header, size)
    try:
        layout = Layout(str(destination.temporary), shape, dtype, len(header))
        writes = _writes(darr, layout, chunk_bytes, name)
        if not compute:
            return dask.delayed(_commit, pure=False)(
                destination, writes, nbytes, dask_key_name=f"interop-save-npy-commit-{token}"
            )
        scheduler = get_scheduler(collections=[writes])
        client = _distributed_client(scheduler)
        if client is not None:
            total = _run_distributed(client, writes, path, nbytes)
        else:
            total = _run_local(scheduler, writes, path, nbytes)
        if total != nbytes:  # every block checks its shape: a bug if reached
            raise SaveError(
                f"{func}: expected {nbytes} bytes written to {str(path)!r} (got {total})",
                nbytes=nbytes,
            )
        destination.commit()
    except BaseException:
        _abandon(destination)  # returns once no block task writes the file any more
        raise
    return path


# ------------------------------------------------------------------ load


@dataclass(frozen=True)
class _Source:
    """What the read tasks need to know about the file (its identity checked by each)."""

    layout: Layout  # in file order (a Fortran-order file: the transposed shape)
    fortran: bool
    identity: tuple[int, int, int, int]  # npy.file_identity when the header was read
    host: str  # the machine that read the header (where the device number holds)


def _read_block(*, source: _Source, device: Any, block_info: Any = None) -> Any:
    """Task: read one block from the file."""
    info = block_info[None]
    location = [tuple(map(int, loc)) for loc in info["array-location"]]
    if source.fortran:
        location = location[::-1]  # the file holds the transpose in C order
    origin = tuple(lo for lo, _ in location)
    shape = tuple(hi - lo for lo, hi in location)
    layout = source.layout
    what = (
        f"interop.dask.load_npy: block {tuple(info['chunk-location'])} of "
        f"{layout.path!r} on {_where()}"
    )
    # Every task checks that the file is still the one load_npy described: a
    # file replaced in between would give blocks of two files, silently.
    same_machine = source.host == socket.gethostname()
    fd = open_unchanged(layout.path, source.identity, what, same_machine=same_machine)
    try:
        if device is None or device[0] != "cuda":
            block = np.empty(shape, layout.dtype)
        else:  # non-native byte order is converted in the slots
            block = empty_device(shape, layout.dtype.newbyteorder("="), device[1])
        reader = FileReader(fd, layout.runs(origin, shape), what, block, dtype=layout.dtype)
        read_into(block, reader, "interop.dask.load_npy", "the block's C order")
    finally:
        os.close(fd)
    return block.T if source.fortran else block


def _meta(ndim: int, dtype: np.dtype, device: Any) -> Any:
    if device is None or device[0] != "cuda":
        return np.empty((0,) * ndim, dtype)
    from .. import _backends

    cp = _backends.require_cupy_device()
    dtypes.check_cupy_dtype(dtype)
    return cp.empty((0,) * ndim, dtype)


def load_npy(path: str | os.PathLike[str], /, *, chunks: Any = "auto", device: Any = None) -> Any:
    """A dask array whose blocks are read from a ``.npy`` file on the workers.

    Parameters
    ----------
    path : str or os.PathLike
        A ``.npy`` file (format 1.0, 2.0 or 3.0, C or Fortran order) on a file
        system every worker shares with the caller.
    chunks : int, tuple, dict or "auto", default "auto"
        Block shape, as ``dask.array.from_array`` takes it (``"auto"``: dask's
        choice, blocks of about ``array.chunk-size``); any chunking, including
        blocks that do not span whole trailing axes. Every block size must be
        positive.
    device : optional
        ``"cuda"``, ``"cuda:N"`` or an int: CuPy blocks, each on that device
        of the worker that reads it (``"cuda"``: the worker's current device).
        ``None`` or ``"cpu"``: NumPy blocks.

    Returns
    -------
    dask.array.Array
        Lazy: nothing is read until it is computed.

    Notes
    -----
    Copy semantics: every block is a new array, read from the file by the task
    that makes it; no block is read on the caller, which reads only the
    header (and checks the file's size). Each task opens the file, checks
    that it is still the file whose header was read (its device, inode,
    size and modification time; the device only on the caller's machine,
    since a shared file system numbers its device per machine), and reads
    the block's runs with ``os.preadv``: straight into a new NumPy block, or
    into the pinned staging ring of ``interop.config.num_buffers`` slots of
    at most the worker's ``interop.config.chunk_bytes``, copied to a new
    CuPy block on a dedicated stream; a task returns once its block is on
    the device. A
    Fortran-order file gives Fortran-ordered blocks (as ``numpy.load``).
    Extra host memory per running task: none for NumPy blocks, the staging
    ring for CuPy blocks. The caller needs a CUDA device for
    ``device="cuda"`` (the array's metadata is an empty CuPy array).

    Raises
    ------
    ValueError
        Not a readable ``.npy`` file (corrupt, truncated, object dtype), a
        bad ``chunks`` or ``device``, a ``path`` with a NUL byte; and, from a
        task, a file replaced (``os.replace``) or written since this call:
        the compute fails rather than mix blocks of two files.
    FileNotFoundError, OSError
        No such file; a directory, a FIFO or a device (refused, nothing read).
    NoDeviceError, BackendUnavailableError, UnsupportedDtypeError
        ``device="cuda"`` without a usable CUDA device or CuPy, or a dtype
        CuPy cannot hold (float8).
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
    # Device blocks are made in native byte order (CuPy holds no other), host
    # blocks keep the file's.
    on_device = target is not None and target[0] == "cuda"
    dtype = header.dtype.newbyteorder("=") if on_device else header.dtype
    meta = _meta(len(header.shape), dtype, target)
    file_shape = header.shape[::-1] if header.fortran_order else header.shape
    resolved = str(header.path.resolve())
    source = _Source(
        Layout(resolved, file_shape, header.dtype, header.offset),
        header.fortran_order,
        header.identity,
        socket.gethostname(),
    )
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
