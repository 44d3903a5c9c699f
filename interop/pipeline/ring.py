"""Host staging rings of page-locked buffers, lent from a process-wide cache of idle ones.

The cache's policy is described in docs/transfer.md ("Pinned buffers are cached").
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np

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
        ptrs, self.ptrs = self.ptrs, []
        _free_all([(self.backend, ptr) for ptr in reversed(ptrs)])

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
# PyTorch's allocator). A deque: finalizers append from any thread at any time.
_waiting: collections.deque[tuple[Backend, Callable[[], None]]] = collections.deque()


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


# The cache of idle pinned buffers, by size class: a ring takes the most recently
# returned ones; on success each buffer goes back on its own. Idle bytes stay
# within twice the largest ring lent since the cache was emptied (LRU eviction).

FLOOR = MIN_CHUNK_BYTES  # the smallest buffer (64 KiB), never above a transfer's chunk


def size_class(nbytes: int) -> int:
    """The buffer size serving slots of ``nbytes``: at least :data:`FLOOR`, else itself.

    Slots come as powers of two from the planner; rounding a capped one up again
    would break the per-transfer bound of ``num_buffers x chunk_bytes``.
    """
    return max(int(nbytes), FLOOR)


@dataclass(eq=False, slots=True)  # hashed by identity: a key of _lru
class _Idle:
    """A pinned buffer waiting in the cache."""

    backend: Backend
    key: tuple[Any, int]  # (ring key, size class)
    ptr: int
    array: np.ndarray
    nbytes: int
    group: int  # the ring it came back with


_ring_lock = threading.Lock()
_ring_cache: dict[tuple[Any, int], list[_Idle]] = {}  # (backend key, size) -> idle, oldest first
_lru: dict[_Idle, None] = {}  # every idle buffer, least recently returned first
_idle_bytes = 0
_most_slots = 0  # the most slots of a ring lent since the cache was emptied
_largest = 0  # the largest size class lent since then
_groups = itertools.count(1)


def _lent(count: int, size: int) -> None:
    global _most_slots, _largest
    _most_slots = max(_most_slots, count)
    _largest = max(_largest, size)


def borrow_ring(backend: Backend, count: int, nbytes: int) -> StagingRing:
    """A ring of ``count`` buffers of ``size_class(nbytes)`` for one transfer: idle ones
    from the cache, new ones for the rest."""
    global _idle_bytes
    if _waiting:
        free_waiting()  # before more pinned memory is taken
    size = size_class(nbytes)
    key = (backend.ring_key, size)
    count = int(count)
    with _ring_lock:
        idle = _ring_cache.get(key, [])
        take = idle[len(idle) - min(count, len(idle)) :]  # the most recently returned
        del idle[len(idle) - len(take) :]
        if not idle:
            _ring_cache.pop(key, None)
        for buf in take:
            del _lru[buf]
            _idle_bytes -= buf.nbytes
        _lent(count, size)
    return StagingRing(backend, count, size, reuse=[(buf.ptr, buf.array) for buf in take])


def return_ring(ring: StagingRing, error: BaseException | None = None) -> None:
    """Give a borrowed ring back once no copy uses it: to the cache (evicting beyond the
    budget), or freed after a failed transfer (``error``: a free failing is a note on it)."""
    global _idle_bytes
    if error is not None:
        _free_keeping(ring, error)
        return
    if ring.nbytes != size_class(ring.nbytes):  # not made by borrow_ring
        ring.free()
        return
    key = (ring.backend.ring_key, ring.nbytes)
    group = next(_groups)
    evicted: list[_Idle] = []
    with _ring_lock:
        for ptr, array in ring.release():
            buf = _Idle(ring.backend, key, ptr, array, ring.nbytes, group)
            _ring_cache.setdefault(key, []).append(buf)
            _lru[buf] = None
            _idle_bytes += buf.nbytes
        _lent(ring.count, ring.nbytes)  # the cache may have been emptied while it was lent
        while _idle_bytes > 2 * _most_slots * _largest:  # twice the largest ring lent
            oldest = next(iter(_lru))
            del _lru[oldest]
            same = _ring_cache[oldest.key]
            same.remove(oldest)
            if not same:
                del _ring_cache[oldest.key]
            _idle_bytes -= oldest.nbytes
            evicted.append(oldest)
    _free_all([(buf.backend, buf.ptr) for buf in evicted])  # unlocked: cudaFreeHost is slow


def _free_all(buffers: list[tuple[Backend, int]]) -> None:
    """Free every buffer (:func:`free_pinned`), trying all; raise the first failure."""
    for backend, ptr in buffers:
        _waiting.append((backend, functools.partial(backend.host_free, ptr)))
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
    with _ring_lock:
        return len({buf.group for buf in _lru})


def cached_buffers() -> int:
    """Idle pinned buffers in the cache."""
    with _ring_lock:
        return len(_lru)


def cached_bytes() -> int:
    """Bytes of the idle pinned buffers in the cache."""
    with _ring_lock:
        return _idle_bytes


def free_cached_rings() -> None:
    """Free every idle buffer (:func:`free_pinned`) and restart the budget; lent rings stay."""
    global _idle_bytes, _most_slots, _largest
    with _ring_lock:
        buffers = list(_lru)
        _ring_cache.clear()
        _lru.clear()
        _idle_bytes = _most_slots = _largest = 0
    _free_all([(buf.backend, buf.ptr) for buf in buffers])


def _after_fork_in_child() -> None:
    # The cache's lock may have been held by another thread at the fork; the
    # cached pinned buffers belong to the parent's CUDA context.
    global _ring_lock, _idle_bytes, _most_slots, _largest
    _ring_lock = threading.Lock()
    _ring_cache.clear()
    _lru.clear()
    _waiting.clear()
    _idle_bytes = _most_slots = _largest = 0


os.register_at_fork(after_in_child=_after_fork_in_child)
