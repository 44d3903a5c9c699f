"""Host staging rings: ``count`` page-locked buffers a transfer copies through.

:class:`StagingRing` owns its buffers (allocated by a backend: pinned memory
from ``cudaHostAlloc`` for CUDA) and frees every one of them when it is
closed. :func:`borrow_ring` / :func:`return_ring` (and the context manager
:func:`staging_ring`) lend rings from a small process-wide cache for one
transfer at a time.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .backend import Backend

__all__ = [
    "StagingRing",
    "borrow_ring",
    "cached_rings",
    "free_cached_rings",
    "return_ring",
    "staging_ring",
]


class StagingRing:
    """``count`` host buffers of exactly ``nbytes`` each, from ``backend``.

    Parameters
    ----------
    backend : Backend
        Allocates and frees the buffers (``host_alloc`` / ``host_free``).
    count : int
        Number of buffers (slots).
    nbytes : int
        Size of each buffer in bytes.

    Attributes
    ----------
    ptrs : list of int
        Host addresses of the buffers, for ``cudaMemcpyAsync``.
    arrays : list of numpy.ndarray
        The same buffers as 1-d ``uint8`` NumPy arrays (views, no copy).

    Raises
    ------
    Exception
        The backend's allocation error (pinned memory exhausted, no device);
        the buffers allocated so far are freed first.
    """

    def __init__(self, backend: Backend, count: int, nbytes: int) -> None:
        self.backend = backend
        self.count = int(count)
        self.nbytes = int(nbytes)
        self.ptrs: list[int] = []
        self.arrays: list[np.ndarray] = []
        try:
            for _ in range(self.count):
                ptr, array = backend.host_alloc(self.nbytes)
                self.ptrs.append(ptr)
                self.arrays.append(array)
        except BaseException as exc:
            _free_keeping(self, exc)
            raise

    @contextlib.contextmanager
    def host(self, k: int, n: int) -> Iterator[np.ndarray]:
        """The first ``n`` bytes of slot ``k``, for a host thread's copy.

        The caller has synchronised the event that ends the last device copy
        of the slot; the backend may check that (the host backend does).
        """
        if self.closed:
            raise RuntimeError("expected a live staging ring (got one already freed)")
        with self.backend.host_access(self, k):
            yield self.arrays[k][:n]

    def free(self) -> None:
        """Free every buffer; call only once no copy uses them. Idempotent.

        Every buffer is freed even if freeing one fails; the first failure is
        raised afterwards.
        """
        self.arrays.clear()
        first: BaseException | None = None
        while self.ptrs:
            ptr = self.ptrs.pop()
            try:
                self.backend.host_free(ptr)
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first

    @property
    def closed(self) -> bool:
        """True once the buffers have been freed."""
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


def note(error: BaseException, text: str) -> None:
    """Add ``text`` to ``error`` as a note (shown with its traceback)."""
    add_note = getattr(error, "add_note", None)
    if add_note is not None:
        add_note(text)


_ring_lock = threading.Lock()
_ring_cache: dict[tuple[Any, int, int], list[StagingRing]] = {}
_ring_order: list[StagingRing] = []  # idle rings, least recently returned first
_RINGS_KEPT = 2  # idle rings kept per (backend, count, nbytes), for concurrent transfers
_RINGS_KEPT_TOTAL = 4  # idle rings kept in all: sizes seen once do not pin memory forever


def _key(ring_or_backend: Any, count: int, nbytes: int) -> tuple[Any, int, int]:
    backend = getattr(ring_or_backend, "backend", ring_or_backend)
    return (backend.ring_key, int(count), int(nbytes))


def borrow_ring(backend: Backend, count: int, nbytes: int) -> StagingRing:
    """A ring of ``count`` buffers of ``nbytes`` for one transfer: an idle one
    from the cache, else a new one. Never lent to two transfers at once."""
    key = _key(backend, count, nbytes)
    with _ring_lock:
        idle = _ring_cache.get(key)
        ring = idle.pop() if idle else None
        if ring is not None:
            _ring_order.remove(ring)
    return ring if ring is not None else StagingRing(backend, count, nbytes)


def return_ring(ring: StagingRing, error: BaseException | None = None) -> None:
    """Give a borrowed ring back once no copy uses it.

    After a successful transfer (``error`` None) it goes back to the cache
    (at most two idle rings per size and four in all are kept; the least
    recently used is freed first). After a failed one it is freed, since a
    failed copy may have left it in an unknown state, and a failure to free
    becomes a note on ``error`` instead of replacing it.
    """
    if error is not None:
        _free_keeping(ring, error)
        return
    evicted: list[StagingRing] = []
    key = _key(ring, ring.count, ring.nbytes)
    with _ring_lock:
        idle = _ring_cache.setdefault(key, [])
        if len(idle) < _RINGS_KEPT:
            idle.append(ring)
            _ring_order.append(ring)
            while len(_ring_order) > _RINGS_KEPT_TOTAL:
                oldest = _ring_order.pop(0)
                oldest_key = _key(oldest, oldest.count, oldest.nbytes)
                _ring_cache[oldest_key].remove(oldest)
                if not _ring_cache[oldest_key]:
                    del _ring_cache[oldest_key]
                evicted.append(oldest)
        else:
            evicted.append(ring)
    _free_all(evicted)  # outside the lock: cudaFreeHost can take a while


def _free_all(rings: list[StagingRing]) -> None:
    first: BaseException | None = None
    for ring in rings:
        try:
            ring.free()
        except Exception as exc:
            first = first or exc
    if first is not None:
        raise first


@contextlib.contextmanager
def staging_ring(backend: Backend, count: int, nbytes: int) -> Iterator[StagingRing]:
    """``with staging_ring(backend, n, size) as ring:`` borrows a ring for one
    transfer (:func:`borrow_ring`), returned to the cache on success and freed
    on error (:func:`return_ring`). The caller must have waited for every copy
    that uses the ring before the block exits."""
    ring = borrow_ring(backend, count, nbytes)
    try:
        yield ring
    except BaseException as exc:
        return_ring(ring, exc)
        raise
    return_ring(ring)


def cached_rings() -> int:
    """Number of idle rings in the cache (for tests and diagnostics)."""
    with _ring_lock:
        return sum(len(v) for v in _ring_cache.values())


def free_cached_rings() -> None:
    """Free every idle ring in the cache (rings lent out are not affected)."""
    with _ring_lock:
        rings = list(_ring_order)
        _ring_cache.clear()
        _ring_order.clear()
    _free_all(rings)


def _after_fork_in_child() -> None:
    # The cache's lock may have been held by another thread at the fork; the
    # cached pinned buffers belong to the parent's CUDA context.
    global _ring_lock
    _ring_lock = threading.Lock()
    _ring_cache.clear()
    _ring_order.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
