"""Chunked device-to-host (and host-to-host) copies: ``copy_to_host`` and
``copy_to_host_async``.

Building blocks reused by ``interop.npy`` and ``interop.upload`` (and by any
other pipeline that stages through pinned memory):

``c_order_chunks(shape, itemsize, chunk_bytes) -> Iterator[tuple]``
    Index tuples ``idx`` such that every ``x[idx]`` is a view of at most
    ``max(chunk_bytes, itemsize)`` bytes and the views cover ``x`` in C
    order. Zero-size shapes yield nothing; a 0-d shape yields ``(...,)``.
``array_source(x, func="copy_to_host") -> Source``
    ``Source(obj, shape, dtype, on_device)``: what the engines copy from
    (a NumPy array, a detached tensor or a CuPy array) and its NumPy dtype.
``Progress(progress, total, desc)``
    ``.add(n)`` / ``.close()``: tqdm bar in bytes or ``progress(done, total)``.
``interop.memory.StagingRing(count, nbytes)`` (alias ``PinnedRing``)
    ``count`` pinned buffers of exactly ``nbytes``: ``.ptrs`` (addresses for
    ``cudaMemcpyAsync``), ``.arrays`` (``uint8`` NumPy views), ``.free()``;
    a context manager.
``interop.memory.staging_ring(count, nbytes)`` (alias ``pinned_ring``)
    ``with staging_ring(n, size) as ring:`` borrows a ring from the cache for
    one transfer (returned on success, freed on error).

Two engines share one scheduler (:class:`Transfer` plus an in-order prefix
counter): the host engine copies host sources with a thread pool; the CUDA
engine streams device sources through the pinned ring (see docs/transfer.md).
"""

from __future__ import annotations

import itertools
import threading
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np

from . import _backends, dtypes
from .config import chunk_bytes_or_default, config
from .errors import TransferError
from .memory import StagingRing, staging_ring

__all__ = ["Transfer", "copy_to_host", "copy_to_host_async"]

_D2H = 2  # cudaMemcpyDeviceToHost


# ----------------------------------------------------------------- planning


def c_order_chunks(shape: tuple[int, ...], itemsize: int, chunk_bytes: int) -> Iterator[tuple]:
    """Index tuples whose views cover an array of ``shape`` in C order.

    Each ``x[idx]`` is a view of at most ``max(chunk_bytes, itemsize)`` bytes:
    whole trailing blocks that fit are grouped along the first axis that
    does not fit whole. A zero-size shape yields nothing; a 0-d shape yields
    ``(Ellipsis,)`` once.
    """
    shape = tuple(int(n) for n in shape)
    if any(n == 0 for n in shape):
        return
    if not shape:
        yield (Ellipsis,)  # x[...] is a 0-d view; x[()] would be a scalar
        return
    limit = max(int(chunk_bytes), int(itemsize))
    block = int(itemsize)  # bytes of one step along `axis` (trailing axes whole)
    axis = len(shape) - 1
    while axis >= 0 and block * shape[axis] <= limit:
        block *= shape[axis]
        axis -= 1
    if axis < 0:  # the whole array fits in one chunk
        yield (slice(0, shape[0]),)
        return
    per = max(1, limit // block)
    for prefix in np.ndindex(*shape[:axis]):
        for start in range(0, shape[axis], per):
            yield (*prefix, slice(start, min(start + per, shape[axis])))


def _nbytes(shape: tuple[int, ...], itemsize: int) -> int:
    return int(np.prod(shape, dtype=np.int64)) * itemsize


# ----------------------------------------------------------------- progress


class Progress:
    """Progress in bytes: a tqdm bar (``progress=True``) or a callable
    ``progress(bytes_done, bytes_total)``; nothing for ``False``/``None``."""

    def __init__(self, progress: Any, total: int, desc: str) -> None:
        self._callback: Callable[[int, int], Any] | None = None
        self._bar = None
        self.done = 0
        self.total = total
        if callable(progress):
            self._callback = progress
        elif progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, unit="B", unit_scale=True, desc=desc)

    def add(self, n: int) -> None:
        """Count ``n`` more bytes as done."""
        self.done += n
        if self._callback is not None:
            self._callback(self.done, self.total)
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        """Close the bar, if any."""
        if self._bar is not None:
            self._bar.close()


# ----------------------------------------------------------------- pinned ring

# The ring lives in interop.memory; these names stay for the other pipelines.
PinnedRing = StagingRing
pinned_ring = staging_ring


# ----------------------------------------------------------------- Transfer


class Transfer:
    """A running chunked copy, returned by :func:`copy_to_host_async`.

    Attributes
    ----------
    nbytes : int
        Total bytes to copy.
    """

    def __init__(self, out: np.ndarray, nbytes: int, sizes: list[int], progress: Progress):
        self.nbytes = nbytes
        self._out = out
        self._sizes = sizes
        self._progress = progress
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._cancelled = threading.Event()
        self._complete = [False] * len(sizes)
        self._next = 0
        self._bytes_done = 0
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    # -- used by the engines (from the transfer's own thread only)
    def _chunk_done(self, i: int) -> None:
        with self._lock:
            self._complete[i] = True
            advanced = 0
            while self._next < len(self._sizes) and self._complete[self._next]:
                advanced += self._sizes[self._next]
                self._next += 1
            self._bytes_done += advanced
        if advanced:  # outside the lock: a slow callback must not block bytes_done readers
            self._progress.add(advanced)

    def _check_cancel(self) -> None:
        if self._cancelled.is_set():
            raise _Cancelled

    def _start(self, run: Callable[[Transfer], None]) -> None:
        def target() -> None:
            try:
                run(self)
            except BaseException as exc:  # re-raised in the caller by result()
                self._error = _detached(exc)
            finally:
                self._progress.close()
                self._finished.set()

        self._thread = threading.Thread(target=target, name="interop-transfer", daemon=True)
        self._thread.start()

    # -- public
    @property
    def bytes_done(self) -> int:
        """Bytes of the completed prefix (in the source's C order)."""
        with self._lock:
            return self._bytes_done

    def done(self) -> bool:
        """True once the transfer has finished, failed or been cancelled."""
        return self._finished.is_set()

    def cancel(self) -> bool:
        """Ask the transfer to stop after the chunks in flight.

        Returns
        -------
        bool
            False if it had already finished.
        """
        self._cancelled.set()
        return not self._finished.is_set()

    def result(self, timeout: float | None = None) -> np.ndarray:
        """Wait for the transfer and return ``out``.

        Raises
        ------
        TimeoutError
            Not finished within ``timeout`` seconds (the transfer goes on).
        TransferError
            A chunk failed or the transfer was cancelled; the message says
            which byte range is complete. Every staging buffer, stream and
            thread has been released.
        KeyboardInterrupt
            Interrupted while waiting: the transfer is cancelled and its
            resources released before this is re-raised.
        """
        try:
            if not self._finished.wait(timeout):
                raise TimeoutError(
                    f"transfer not finished after {timeout} s "
                    f"({self.bytes_done} of {self.nbytes} bytes done)"
                )
        except KeyboardInterrupt:
            self.cancel()
            self._finished.wait()
            self._join()
            raise
        self._join()
        if self._error is not None:
            raise self._failure(self._error)
        return self._out

    def _join(self) -> None:
        # Finished: the thread is past its last statement; joining it means
        # it (and everything its frames referenced) is gone when result() ends.
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _failure(self, exc: BaseException) -> BaseException:
        if isinstance(exc, TransferError | KeyboardInterrupt):
            return exc
        done = self.bytes_done
        if isinstance(exc, _Cancelled):
            what = "was cancelled"
        else:
            what = f"failed ({type(exc).__name__}: {exc})"
        err = TransferError(
            f"copy_to_host {what}; bytes [0, {done}) of {self.nbytes} (in the source's "
            "C order) are complete, the rest of out is unspecified",
            bytes_done=done,
            nbytes=self.nbytes,
        )
        err.__cause__ = None if isinstance(exc, _Cancelled) else exc
        return err


class _Cancelled(Exception):
    pass


def _detached(exc: BaseException) -> BaseException:
    """``exc`` without live worker frames, its traceback kept as text.

    A traceback keeps every frame of the worker alive, and with them the
    engine's closures: streams, events, device staging memory, the source.
    The caller may hold the error for long (a notebook's ``sys.last_exc``),
    so the frames are cleared and dropped; the worker's traceback is added as
    a note (Python >= 3.11) so it is still shown.
    """
    text = "".join(traceback.format_exception(exc)).rstrip()
    add_note = getattr(exc, "add_note", None)
    if add_note is not None and text:
        add_note("in the transfer's worker thread:\n" + text)
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        traceback.clear_frames(link.__traceback__)
        link.__traceback__ = None
        link = link.__cause__ or link.__context__
    return exc


# ----------------------------------------------------------------- validation


class Source(NamedTuple):
    """An array of SPEC §1 as the transfer engines see it."""

    obj: Any  # what chunk views are taken of: ndarray, detached tensor or CuPy array
    shape: tuple[int, ...]
    dtype: np.dtype  # the NumPy (or ml_dtypes) dtype of its values
    on_device: bool


def array_source(x: Any, func: str = "copy_to_host") -> Source:
    """Describe ``x`` without moving data; foreign ``__dlpack__`` /
    ``__cuda_array_interface__`` objects are wrapped zero-copy.

    Raises
    ------
    TypeError
        ``x`` is not an array (the message names ``func``), or is a
        non-strided tensor.
    ValueError
        A tensor on a device other than CPU or CUDA.
    UnsupportedDtypeError
        No NumPy dtype holds its values.
    """
    if isinstance(x, np.ndarray):
        return Source(x, x.shape, x.dtype, False)
    if _backends.is_torch_tensor(x):
        if x.layout != _backends.torch().strided:
            raise TypeError(f"{func} expected a dense (strided) tensor (got layout {x.layout})")
        if x.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{func} expected a CPU or CUDA tensor (got device {str(x.device)!r})")
        dtype = dtypes.numpy_dtype_of_torch(x.dtype)
        return Source(x.detach(), tuple(x.shape), dtype, x.device.type == "cuda")
    if _backends.is_cupy_array(x):
        return Source(x, tuple(x.shape), np.dtype(x.dtype), True)
    if hasattr(x, "__dlpack__") or hasattr(x, "__cuda_array_interface__"):
        from .exchange import to_cupy, to_numpy

        if hasattr(x, "__dlpack_device__") and x.__dlpack_device__()[0] in (1, 3):
            return array_source(to_numpy(x), func)
        return array_source(to_cupy(x), func)
    raise TypeError(
        f"{func} expected a NumPy array, a PyTorch tensor, a CuPy array, or an object "
        f"with __dlpack__ or __cuda_array_interface__ (got {type(x).__module__}."
        f"{type(x).__qualname__})"
    )


def _check_out(out: Any, shape: tuple[int, ...], dtype: np.dtype, src: Any, kind: str) -> None:
    if not isinstance(out, np.ndarray):
        raise TypeError(
            "copy_to_host expected out to be a writable NumPy array (numpy.memmap included) "
            f"(got {type(out).__module__}.{type(out).__qualname__}); use interop.copy_to_device "
            "for device destinations"
        )
    if out.shape != tuple(shape):
        raise ValueError(f"copy_to_host expected out of shape {tuple(shape)} (got {out.shape})")
    if out.dtype != dtype:
        raise ValueError(
            f"copy_to_host expected out of dtype {dtype} (got {out.dtype}); bfloat16/float8 "
            "sources need the ml_dtypes dtype of the same name"
        )
    if not out.flags.writeable:
        raise ValueError("copy_to_host expected a writable out (got a read-only array)")
    if kind == "host" and out.size:
        host = src if isinstance(src, np.ndarray) else _host_view(src)
        if np.may_share_memory(out, host):
            try:
                overlap = np.shares_memory(out, host, max_work=100_000)  # type: ignore[arg-type]
            except np.exceptions.TooHardError:
                overlap = True
            if overlap:
                raise ValueError(
                    "copy_to_host expected out not to overlap the source (got overlapping "
                    "memory); copy into a separate array"
                )


def _host_view(t: Any) -> np.ndarray:
    """The raw memory of a CPU tensor as NumPy, zero-copy (for overlap checks).

    A conjugate/negative bit is flipped off by a view first, so the check
    sees the memory the lazy tensor reads.
    """
    from .exchange import to_numpy

    th = _backends.torch()
    if t.is_conj():
        t = t.conj()  # a view without the bit, same memory
    if t.is_neg():
        t = th._neg_view(t)
    return to_numpy(t)


def _check_progress(progress: Any) -> None:
    if progress is None or isinstance(progress, bool) or callable(progress):
        return
    raise TypeError(
        "expected progress to be True, False or a callable progress(bytes_done, bytes_total) "
        f"(got {progress!r})"
    )


def _bits(a: np.ndarray) -> np.ndarray:
    """``a`` viewed with a same-sized integer dtype for ml_dtypes types."""
    view = dtypes.int_view_of_numpy(a.dtype)
    return a if view == a.dtype else a.view(view)


# ----------------------------------------------------------------- host engine

_HOST_CHUNK_MAX = 256 << 20


def _host_chunk_bytes(nbytes: int, chunk: int, threads: int) -> int:
    """Default chunk size of the host engine.

    A host-to-host copy needs no staging buffer, so the chunk size only sets
    the progress/cancel granularity and the parallelism. Measured on a 2-core
    machine: copying 256 MiB in 32 MiB pieces was 1.5x slower than one
    ``numpy.copyto`` (the C library's large-copy strategy works per call),
    while one piece per thread beat it. So: one chunk per thread, at least
    ``chunk_bytes`` and at most 256 MiB.
    """
    per_thread = -(-nbytes // max(1, threads))
    return max(chunk, min(per_thread, _HOST_CHUNK_MAX))


def _host_engine(src: Any, out: np.ndarray, chunks: list[tuple], threads: int):
    from .exchange import to_numpy

    def copy(i: int) -> None:
        idx = chunks[i]
        part = to_numpy(src[idx])  # per chunk: conj/neg bits resolved on this chunk only
        np.copyto(_bits(out[idx]), _bits(part))

    def run(transfer: Transfer) -> None:
        window = max(1, threads) * 2
        with ThreadPoolExecutor(max(1, threads), thread_name_prefix="interop-host") as pool:
            pending: dict[int, Future[None]] = {}
            try:
                for i in range(len(chunks)):
                    transfer._check_cancel()
                    pending[i] = pool.submit(copy, i)
                    if len(pending) >= window:
                        first = min(pending)
                        pending.pop(first).result()
                        transfer._chunk_done(first)
                for i in sorted(pending):
                    transfer._check_cancel()
                    pending.pop(i).result()
                    transfer._chunk_done(i)
            finally:
                for f in pending.values():
                    f.cancel()

    return run


# ----------------------------------------------------------------- CUDA engine


def _cuda_source(src: Any) -> tuple[Any, int, Any, Any]:
    """Called in the caller's thread (current streams are per thread).

    Returns the CuPy bit view of the whole source (None for a tensor whose
    conjugate/negative bit is resolved chunk by chunk), the device index, the
    producer's current stream as a CuPy stream, and PyTorch's current stream
    object for a tensor source (else None).
    """
    cp = _backends.require_cupy_device()
    if _backends.is_cupy_array(src):
        index = int(src.device.id)
        with cp.cuda.Device(index):
            return src, index, cp.cuda.get_current_stream(), None
    from .streams import cupy_stream

    th = _backends.torch()
    index = int(src.device.index)
    torch_stream = th.cuda.current_stream(index)
    with cp.cuda.Device(index):
        producer = cupy_stream(int(torch_stream.cuda_stream), index)
    if src.is_conj() or src.is_neg():
        return None, index, producer, torch_stream
    ml = dtypes.ml_view_of_torch(src.dtype)
    bits = src if ml is None else src.view(ml[1])
    with cp.cuda.Device(index), th.cuda.device(index), producer:
        return cp.from_dlpack(bits), index, producer, torch_stream


def _cuda_engine(src: Any, out: np.ndarray, chunks: list[tuple], chunk_bytes: int, threads: int):
    cp = _backends.require_cupy_device()
    whole, index, producer, torch_stream = _cuda_source(src)
    itemsize = out.dtype.itemsize
    nslots = max(1, min(config.num_buffers, len(chunks)))
    # Slots as large as the largest chunk, so a small array never pins a full
    # chunk, rounded up to a power of two (at most the chunk size) so that
    # arrays of many sizes share a few cached rings instead of each pinning
    # its own.
    largest = max(out[idx].size for idx in chunks) * itemsize
    slot_bytes = max(largest, min(1 << (largest - 1).bit_length(), chunk_bytes))
    with cp.cuda.Device(index):
        # Ordered after the work queued so far on the producer's stream: the
        # event is recorded here, in the caller's thread, at the call.
        stream = cp.cuda.Stream(non_blocking=True)
        start = cp.cuda.Event(disable_timing=True)
        start.record(producer)
        stream.wait_event(start)

    def chunk_on_device(idx: tuple) -> Any:
        if whole is not None:
            return whole[idx]
        th = _backends.torch()
        with th.cuda.device(index), th.cuda.stream(torch_stream):
            part = src[idx].resolve_conj().resolve_neg()  # chunk-sized, on the producer stream
            ml = dtypes.ml_view_of_torch(part.dtype)
            part = part if ml is None else part.view(ml[1])
            with producer:
                return cp.from_dlpack(part)

    def run(transfer: Transfer) -> None:
        with cp.cuda.Device(index):
            events = [cp.cuda.Event(disable_timing=True) for _ in range(nslots)]
            staging = None
            # The host copies of each slot (one future per piece).
            drains: list[list[Future[None]]] = [[] for _ in range(nslots)]
            # A resolved chunk's memory belongs to PyTorch's caching allocator:
            # keep it until its DMA is known complete, or it could be reused
            # while the copy stream still reads it.
            held: list[Any] = [None] * nslots
            pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="interop-d2h")
            failing = False
            with pinned_ring(nslots, slot_bytes) as ring:
                try:

                    def drain(i: int, k: int, piece: tuple) -> None:
                        events[k].synchronize()  # releases the GIL
                        dst = _bits(out[chunks[i]])
                        n = dst.size * itemsize
                        view = ring.arrays[k][:n].view(dst.dtype).reshape(dst.shape)
                        np.copyto(dst[piece], view[piece])

                    def wait_slot(k: int) -> bool:
                        busy = bool(drains[k])
                        for f in drains[k]:
                            f.result()
                        drains[k] = []
                        return busy

                    for i, idx in enumerate(chunks):
                        k = i % nslots
                        if wait_slot(k):  # slot k is free again
                            transfer._chunk_done(i - nslots)
                            held[k] = None
                        transfer._check_cancel()
                        part = chunk_on_device(idx)
                        held[k] = part
                        n = part.size * itemsize
                        if whole is None:  # produced on the producer stream just now
                            ready = cp.cuda.Event(disable_timing=True)
                            ready.record(producer)
                            stream.wait_event(ready)
                        if part.flags.c_contiguous:
                            src_ptr = part.data.ptr
                        else:
                            if staging is None:
                                staging = cp.empty((nslots, ring.nbytes), dtype=cp.uint8)
                            packed = staging[k, :n].view(part.dtype).reshape(part.shape)
                            with stream:
                                packed[...] = part  # device-side pack, on the copy stream
                            src_ptr = packed.data.ptr
                        cp.cuda.runtime.memcpyAsync(ring.ptrs[k], src_ptr, n, _D2H, stream.ptr)
                        events[k].record(stream)
                        drains[k] = [
                            pool.submit(drain, i, k, piece)
                            for piece in drain_pieces(part.shape, n, threads)
                        ]
                    first = len(chunks) - nslots
                    for j in range(max(0, first), len(chunks)):
                        if wait_slot(j % nslots):
                            transfer._chunk_done(j)
                except BaseException:
                    failing = True
                    raise
                finally:
                    # Nothing may touch the ring once it is released: stop the
                    # host threads, then drain the copy stream.
                    for futures in drains:
                        for f in futures:
                            f.cancel()
                    pool.shutdown(wait=True, cancel_futures=True)
                    _drain(stream, failing)
                    # Device memory goes back now, not when the frame dies.
                    held.clear()
                    staging = part = packed = None

    return run


_DRAIN_PIECE_MIN = 1 << 20  # bytes; smaller pieces cost more in scheduling than they gain


def drain_pieces(shape: tuple[int, ...], nbytes: int, threads: int) -> list[tuple]:
    """Split one chunk's host copy (``shape``, ``nbytes``) for ``threads`` threads.

    Returns index tuples that cover an array of ``shape`` exactly once,
    splitting its first axis longer than 1 into at most ``threads`` runs of
    at least about 1 MiB each. One slot's copy out of pinned memory is then
    shared by several threads: one thread's ``memcpy`` into pageable memory
    is slower than the DMA that fills the slot.
    """
    axis = next((a for a, n in enumerate(shape) if n > 1), None)
    count = 0 if axis is None else min(threads, shape[axis], nbytes // _DRAIN_PIECE_MIN)
    if axis is None or count <= 1:
        return [(...,)]
    edges = [shape[axis] * j // count for j in range(count + 1)]
    lead = (slice(None),) * axis
    return [(*lead, slice(lo, hi)) for lo, hi in itertools.pairwise(edges)]


def _nothing(transfer: Transfer) -> None:
    transfer._progress.add(0)  # a callback still sees (0, 0): it ends at the total


def _drain(stream: Any, failing: bool) -> None:
    """Wait for ``stream``; while another error propagates, keep that one."""
    try:
        stream.synchronize()
    except Exception:
        if not failing:
            raise


# ----------------------------------------------------------------- public API


def copy_to_host_async(
    x: Any,
    /,
    out: np.ndarray | None = None,
    *,
    chunk_bytes: int | None = None,
    progress: Any = False,
) -> Transfer:
    """Start a chunked copy of ``x`` into host memory; return a :class:`Transfer`.

    Parameters
    ----------
    x : array
        A CuPy array, a PyTorch tensor (CUDA or CPU) or a NumPy array
        (memmaps included), any strides. bfloat16/float8 tensors are copied
        bit for bit into the ``ml_dtypes`` dtype of the same name; tensors
        with the conjugate/negative bit give the values they represent.
    out : numpy.ndarray, optional
        Writable destination (``numpy.memmap`` included) with exactly
        ``x.shape`` and the matching dtype, any strides. Without it a new
        (pageable) array is allocated.
    chunk_bytes : int, optional
        Chunk (staging buffer) size; default ``interop.config.chunk_bytes``.
    progress : bool or callable
        ``True`` shows a tqdm bar in bytes; a callable is called as
        ``progress(bytes_done, bytes_total)`` from the transfer's thread.

    Returns
    -------
    Transfer
        ``result()`` returns ``out``.

    Notes
    -----
    Copy semantics: always a copy into ``out``. Device sources go through a
    ring of ``interop.config.num_buffers`` pinned buffers on a dedicated
    non-blocking stream that waits (an event, not a device-wide sync) on the
    producer's current stream of the data's device, so the copy sees all work
    queued before the call. Non-contiguous device chunks are packed on the
    device into ring-sized staging buffers (no full-size temporary). Host
    sources are copied chunk by chunk by ``interop.config.host_threads``
    threads.

    Raises
    ------
    TypeError, ValueError
        ``x`` is not an array, or ``out`` has the wrong type, shape or dtype,
        is read-only or overlaps the source. Raised here, before anything is
        written.
    UnsupportedDtypeError
        The dtype has no NumPy equivalent (``torch.complex32``).
    NoDeviceError, BackendUnavailableError
        Device data without a usable CUDA device or CuPy.
    """
    chunk = chunk_bytes_or_default(chunk_bytes)
    _check_progress(progress)
    src, shape, dtype, on_device = array_source(x)
    kind = "cuda" if on_device else "host"
    if out is None:
        out = np.empty(shape, dtype)
    else:
        _check_out(out, shape, dtype, src, kind)
    threads = config.host_threads
    if kind == "host" and chunk_bytes is None:
        chunk = _host_chunk_bytes(_nbytes(shape, dtype.itemsize), chunk, threads)
    chunks = list(c_order_chunks(shape, dtype.itemsize, chunk))
    sizes = [_nbytes(out[idx].shape, dtype.itemsize) for idx in chunks]
    if not chunks:
        run = _nothing  # zero-size: nothing to copy, no ring, no stream
    elif kind == "cuda":
        run = _cuda_engine(src, out, chunks, chunk, threads)
    else:
        run = _host_engine(src, out, chunks, threads)
    transfer = Transfer(out, sum(sizes), sizes, Progress(progress, sum(sizes), "copy_to_host"))
    transfer._start(run)
    return transfer


def copy_to_host(
    x: Any,
    /,
    out: np.ndarray | None = None,
    *,
    chunk_bytes: int | None = None,
    progress: Any = False,
) -> np.ndarray:
    """Copy ``x`` into host memory in chunks; ``copy_to_host_async(...).result()``.

    See :func:`copy_to_host_async` for the parameters, copy semantics and
    stream order.

    Returns
    -------
    numpy.ndarray
        ``out`` itself when given, else a new array.

    Raises
    ------
    TypeError, ValueError
        Bad ``x`` or ``out`` (before anything is written).
    TransferError
        A chunk failed or the copy was cancelled; the message says which byte
        range is complete.
    KeyboardInterrupt
        Interrupted: the copy is cancelled and every resource released first.
    """
    return copy_to_host_async(x, out, chunk_bytes=chunk_bytes, progress=progress).result()
