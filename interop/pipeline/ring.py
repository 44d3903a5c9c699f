"""Host staging rings: ``count`` page-locked buffers a transfer copies through.

:class:`StagingRing` owns its buffers (allocated by a backend: pinned memory
from ``cudaHostAlloc`` for CUDA) and frees every one of them when it is
closed. :func:`borrow_ring` / :func:`return_ring` (and the context manager
:func:`staging_ring`) lend rings for one transfer at a time, made of buffers
from a process-wide cache of idle pinned buffers kept by size class, so that
transfers of many shapes neither allocate nor free pinned memory once warm
(freeing it, ``cudaFreeHost``, synchronises the whole device). Pinned memory
is never freed while a CUDA graph capture is under way (:func:`free_pinned`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING

import numpy as np

from .._process import Idle, ring_cache
from ..config import MIN_CHUNK_BYTES

if TYPE_CHECKING:
    from .backend import Backend

__all__ = [
    "StagingRing",
    "borrow_ring",
    "cached_buffers",
    "cached_bytes",
    "cached_rings",
    "free_cached_rings",
    "free_pinned",
    "free_waiting",
    "return_ring",
    "size_class",
    "staging_ring",
    "waiting_frees",
]


class StagingRing:
    """``count`` host buffers of ``nbytes`` from ``backend``: the ``reuse`` ones, then new.

    ``ptrs`` are their addresses, ``arrays`` ``uint8`` views of them. An
    allocation error is raised after the buffers allocated so far were freed.
    """

    def __init__(
        self,
        backend: Backend,
        count: int,
        nbytes: int,
        *,
        reuse: Sequence[tuple[int, np.ndarray]] = (),
    ) -> None:
        self.backend = backend
        self.count = int(count)
        self.nbytes = int(nbytes)
        self.ptrs: list[int] = [ptr for ptr, _ in reuse]
        self.arrays: list[np.ndarray] = [array for _, array in reuse]
        try:
            for _ in range(self.count - len(self.ptrs)):
                ptr, array = backend.host_alloc(self.nbytes)
                self.ptrs.append(ptr)
                self.arrays.append(array)
        except BaseException as exc:
            _free_keeping(self, exc)
            raise

    @contextlib.contextmanager
    def host(self, k: int, n: int) -> Iterator[np.ndarray]:
        """The first ``n`` bytes of slot ``k``, once its last device copy was synchronised."""
        if self.closed:
            raise RuntimeError("expected a live staging ring (got one already freed)")
        with self.backend.host_access(self, k):
            yield self.arrays[k][:n]

    def free(self) -> None:
        """Free every buffer once no copy uses them (:func:`free_pinned`). Idempotent."""
        self.arrays.clear()
        while self.ptrs:
            ptr = self.ptrs.pop()
            _waiting.append((self.backend, functools.partial(self.backend.host_free, ptr)))
        free_waiting()

    def release(self) -> list[tuple[int, np.ndarray]]:
        """Hand the buffers over (to the cache) unfreed; the ring is closed afterwards."""
        buffers = list(zip(self.ptrs, self.arrays, strict=True))
        self.ptrs = []
        self.arrays = []
        return buffers

    @property
    def closed(self) -> bool:
        """True once the buffers have been freed or handed over."""
        return not self.ptrs

    def __enter__(self) -> StagingRing:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.free()
        else:
            _free_keeping(self, exc)


def _free_keeping(ring: StagingRing, error: BaseException) -> None:
    """Free ``ring`` while ``error`` propagates: a failure here becomes a note."""
    try:
        ring.free()
    except Exception as exc:
        note(error, f"freeing the staging ring also failed: {type(exc).__name__}: {exc}")


# Pinned frees that wait for the end of a capture: in CUDA's global capture mode
# a cudaFreeHost or cudaHostUnregister in any thread breaks every capture (as in
# PyTorch's allocator).
_waiting = ring_cache.waiting


def free_pinned(backend: Backend, free: Callable[[], None]) -> None:
    """Run ``free`` (of ``backend``'s pinned memory) after the waiting ones, once no
    capture is under way; raise the first failure after trying every free."""
    _waiting.append((backend, free))
    free_waiting()


def free_waiting() -> None:
    """Run the waiting frees whose backend sees no capture now; raise the first failure."""
    under_way: dict[int, bool] = {}
    first: BaseException | None = None
    for _ in range(len(_waiting)):
        try:
            backend, free = _waiting.popleft()
        except IndexError:  # another thread took the rest
            break
        key = id(backend)
        if key not in under_way:
            under_way[key] = backend.capture_under_way(None)
        if under_way[key]:
            _waiting.append((backend, free))
            continue
        try:
            free()
        except Exception as exc:
            first = first or exc
    if first is not None:
        raise first


def waiting_frees() -> int:
    """Pinned frees waiting for the end of a capture."""
    return len(_waiting)


def note(error: BaseException, text: str) -> None:
    """Add ``text`` to ``error`` as a note (shown with its traceback)."""
    add_note = getattr(error, "add_note", None)
    if add_note is not None:
        add_note(text)


# The cache of idle pinned buffers (interop._process's ring_cache), by size class:
# a ring takes the most recently returned ones; on success each buffer goes back on
# its own. Idle bytes stay within twice the largest ring lent since the cache was
# emptied (LRU eviction). docs/pipeline.md says why.

FLOOR = MIN_CHUNK_BYTES
"""The smallest pinned buffer a ring is made of (64 KiB): every smaller slot
shares this class. Never above a transfer's chunk, which is at least as much."""


def size_class(nbytes: int) -> int:
    """The buffer size serving slots of ``nbytes``: at least :data:`FLOOR`, else itself.

    Slots come as powers of two from the planner; rounding a capped one up again
    would break the per-transfer bound of ``num_buffers x chunk_bytes``.
    """
    return max(int(nbytes), FLOOR)


def borrow_ring(backend: Backend, count: int, nbytes: int) -> StagingRing:
    """A ring of ``count`` buffers of ``size_class(nbytes)`` for one transfer: idle ones
    from the cache, new ones for the rest."""
    if _waiting:
        free_waiting()  # before more pinned memory is taken
    size = size_class(nbytes)
    take = ring_cache.take((backend.ring_key, size), int(count))
    return StagingRing(backend, count, size, reuse=[(buf.ptr, buf.array) for buf in take])


def return_ring(ring: StagingRing, error: BaseException | None = None) -> None:
    """Give a borrowed ring back once no copy uses it: to the cache (evicting beyond the
    budget), or freed after a failed transfer (``error``: a free failing is a note on it)."""
    if error is not None:
        _free_keeping(ring, error)
        return
    if ring.nbytes != size_class(ring.nbytes):  # not made by borrow_ring
        ring.free()
        return
    key = (ring.backend.ring_key, ring.nbytes)
    evicted = ring_cache.put(ring.backend, key, ring.release(), ring.count)
    _free_idle(evicted)  # outside the cache's lock: cudaFreeHost can take a while


def _free_idle(buffers: list[Idle]) -> None:
    """Free every buffer (:func:`free_pinned`), and the frees that waited for a
    capture, even if freeing one fails; raise the first failure."""
    for buf in buffers:
        _waiting.append((buf.backend, functools.partial(buf.backend.host_free, buf.ptr)))
    free_waiting()


@contextlib.contextmanager
def staging_ring(backend: Backend, count: int, nbytes: int) -> Iterator[StagingRing]:
    """:func:`borrow_ring` for the block, then :func:`return_ring` (copies waited for)."""
    ring = borrow_ring(backend, count, nbytes)
    try:
        yield ring
    except BaseException as exc:
        return_ring(ring, exc)
        raise
    return_ring(ring)


def cached_rings() -> int:
    """Rings with a buffer waiting in the cache."""
    return ring_cache.counts()[0]


def cached_buffers() -> int:
    """Idle pinned buffers in the cache."""
    return ring_cache.counts()[1]


def cached_bytes() -> int:
    """Bytes of the idle pinned buffers in the cache."""
    return ring_cache.counts()[2]


def free_cached_rings() -> None:
    """Free every idle buffer (:func:`free_pinned`) and restart the budget; lent rings stay."""
    _free_idle(ring_cache.clear())
