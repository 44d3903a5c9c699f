"""Pinned (page-locked) host staging buffers for the transfer pipelines.

:class:`StagingRing` owns ``count`` buffers of exactly ``nbytes`` each and
frees them when it is closed (it is a context manager). :func:`staging_ring`
lends a ring from a process-wide cache for one transfer: a ring is never lent
to two transfers at once, goes back to the cache after a successful transfer,
and is freed after a failed one.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator
from types import TracebackType

import numpy as np

from . import _backends

__all__ = ["StagingRing", "staging_ring"]

_HOST_ALLOC_PORTABLE = 1  # cudaHostAllocPortable: usable from every device's context


class StagingRing:
    """``count`` page-locked host buffers of exactly ``nbytes`` each.

    Allocated with ``cudaHostAlloc`` (portable, so one ring serves every
    device) at exact size -- not through CuPy's pinned pool, which rounds up
    to powers of two -- and freed with ``cudaFreeHost`` by :meth:`free` or on
    leaving a ``with`` block.

    Parameters
    ----------
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
    NoDeviceError, BackendUnavailableError
        No usable CUDA device or CuPy.
    cupy.cuda.runtime.CUDARuntimeError
        Pinned memory is exhausted; buffers allocated so far are freed first.
    """

    def __init__(self, count: int, nbytes: int) -> None:
        self._cp = _backends.require_cupy_device()
        self.count = int(count)
        self.nbytes = int(nbytes)
        self.ptrs: list[int] = []
        self.arrays: list[np.ndarray] = []
        try:
            for _ in range(self.count):
                ptr = int(self._cp.cuda.runtime.hostAlloc(self.nbytes, _HOST_ALLOC_PORTABLE))
                self.ptrs.append(ptr)
                buf = (ctypes.c_uint8 * self.nbytes).from_address(ptr)
                self.arrays.append(np.ctypeslib.as_array(buf))
        except BaseException:
            self.free()
            raise

    def free(self) -> None:
        """Free every buffer; call only once no copy uses them. Idempotent."""
        self.arrays.clear()
        while self.ptrs:
            self._cp.cuda.runtime.freeHost(self.ptrs.pop())

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
        self.free()


_ring_lock = threading.Lock()
_ring_cache: dict[tuple[int, int], list[StagingRing]] = {}
_ring_order: list[StagingRing] = []  # idle rings, least recently returned first
_RINGS_KEPT = 2  # idle rings kept per (count, nbytes), for concurrent transfers
_RINGS_KEPT_TOTAL = 4  # idle rings kept in all: sizes seen once do not pin memory forever


@contextlib.contextmanager
def staging_ring(count: int, nbytes: int) -> Iterator[StagingRing]:
    """Borrow a ring of ``count`` buffers of ``nbytes`` for one transfer.

    The ring comes from the cache when one of that size is idle, else it is
    allocated. It is never lent to two transfers at once. It goes back to the
    cache when the block exits normally (at most two idle rings per size and
    four in all are kept, the least recently used is freed first); when the
    block raises it is freed, since a failed copy may have left it in an
    unknown state. The caller must have waited for every copy
    that uses the ring before the block exits.

    Rings are portable pinned memory, so the cache key is ``(count, nbytes)``,
    not the device.
    """
    key = (int(count), int(nbytes))
    with _ring_lock:
        idle = _ring_cache.get(key)
        ring = idle.pop() if idle else None
        if ring is not None:
            _ring_order.remove(ring)
    if ring is None:
        ring = StagingRing(count, nbytes)
    try:
        yield ring
    except BaseException:
        ring.free()
        raise
    evicted: list[StagingRing] = []
    with _ring_lock:
        idle = _ring_cache.setdefault(key, [])
        if len(idle) < _RINGS_KEPT:
            idle.append(ring)
            _ring_order.append(ring)
            ring = None
            while len(_ring_order) > _RINGS_KEPT_TOTAL:
                oldest = _ring_order.pop(0)
                oldest_key = (oldest.count, oldest.nbytes)
                _ring_cache[oldest_key].remove(oldest)
                if not _ring_cache[oldest_key]:
                    del _ring_cache[oldest_key]
                evicted.append(oldest)
    if ring is not None:
        evicted.append(ring)
    for spare in evicted:  # freed outside the lock: cudaFreeHost can take a while
        spare.free()


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
    for ring in rings:
        ring.free()
