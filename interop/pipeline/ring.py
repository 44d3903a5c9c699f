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
    """``count`` host buffers of exactly ``nbytes`` each, from ``backend``.

    Parameters
    ----------
    backend : Backend
        Allocates and frees the buffers (``host_alloc`` / ``host_free``).
    count : int
        Number of buffers (slots).
    nbytes : int
        Size of each buffer in bytes.
    reuse : sequence of (int, numpy.ndarray), optional
        Idle buffers of ``nbytes`` from the cache, taken over first; only the
        rest is allocated.

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
        """The first ``n`` bytes of slot ``k``, for a host thread's copy.

        The caller has synchronised the event that ends the last device copy
        of the slot; the backend may check that (the host backend does).
        """
        if self.closed:
            raise RuntimeError("expected a live staging ring (got one already freed)")
        with self.backend.host_access(self, k):
            yield self.arrays[k][:n]

    def free(self) -> None:
        """Free every buffer, once no capture forbids it (:func:`free_pinned`);
        call only once no copy uses them. Idempotent.

        Every buffer is freed even if freeing one fails; the first failure is
        raised afterwards.
        """
        self.arrays.clear()
        while self.ptrs:
            ptr = self.ptrs.pop()
            _waiting.append((self.backend, functools.partial(self.backend.host_free, ptr)))
        free_waiting()

    def release(self) -> list[tuple[int, np.ndarray]]:
        """Hand the buffers over (to the cache) without freeing them; the ring
        is closed afterwards."""
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


# Pinned frees that wait for the end of a capture. In CUDA's global capture
# mode (torch.cuda.graph's) a cudaFreeHost or cudaHostUnregister in any thread
# breaks every capture under way; like PyTorch's allocator, which keeps a
# process-wide count of its captures for this, such a free waits and runs at
# the first ring call or pinned free after the capture.
_waiting = ring_cache.waiting


def free_pinned(backend: Backend, free: Callable[[], None]) -> None:
    """Run ``free`` (freeing or unregistering pinned memory of ``backend``'s)
    now, or once ``backend`` sees no capture under way; the frees already
    waiting go first. Raises the first failure, after trying every free."""
    _waiting.append((backend, free))
    free_waiting()


def free_waiting() -> None:
    """Run the pinned frees that waited for a capture, where none is under way
    now (asked once per backend); raise the first failure after trying all."""
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


# The cache of idle pinned buffers (interop._process's ring_cache). A ring is
# lent for one transfer, made of idle buffers of its size class (the most
# recently returned first) and new ones for the rest; on success its buffers go
# back, each on its own, so that a later ring of any slot count can take them.
# Idle buffers are kept within a budget of twice the largest ring lent since the
# cache was last emptied (its most slots times its largest size class): every
# size class up to that one, at that many slots, fits in it, so one transfer at
# a time over any mix of shapes allocates and frees nothing once each class was
# seen. Over budget, the least recently returned buffers are freed first.

FLOOR = MIN_CHUNK_BYTES
"""The smallest pinned buffer a ring is made of (64 KiB): every smaller slot
shares this class. Never above a transfer's chunk, which is at least as much."""


def size_class(nbytes: int) -> int:
    """The size of the pinned buffers that serve slots of ``nbytes``.

    Slot sizes come rounded up to a power of two by the planner
    (:func:`~interop.pipeline.plan.plan_chunks`), capped at ``chunk_bytes``;
    a slot below :data:`FLOOR` is raised to it. A size above the floor is
    its own class: rounding a capped slot (``chunk_bytes`` not a power of two)
    up again would break the per-transfer bound of ``num_buffers x
    chunk_bytes``.
    """
    return max(int(nbytes), FLOOR)


def borrow_ring(backend: Backend, count: int, nbytes: int) -> StagingRing:
    """A ring of ``count`` buffers of at least ``nbytes`` (its size class,
    :func:`size_class`) for one transfer: idle buffers of that class from the
    cache, and new ones for the rest. A buffer is never lent to two transfers
    at once."""
    if _waiting:
        free_waiting()  # before more pinned memory is taken
    size = size_class(nbytes)
    take = ring_cache.take((backend.ring_key, size), int(count))
    return StagingRing(backend, count, size, reuse=[(buf.ptr, buf.array) for buf in take])


def return_ring(ring: StagingRing, error: BaseException | None = None) -> None:
    """Give a borrowed ring back once no copy uses it.

    After a successful transfer (``error`` None) its buffers go back to the
    cache, which then frees the least recently returned idle buffers beyond
    its budget (twice the largest ring lent). After a failed one it is freed,
    since a failed copy may have left it in an unknown state, and a failure
    to free becomes a note on ``error`` instead of replacing it.
    """
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
    """Rings whose buffers wait in the cache, all or some of them (a ring
    counts until each of its buffers is lent again or freed)."""
    return ring_cache.counts()[0]


def cached_buffers() -> int:
    """Idle pinned buffers in the cache."""
    return ring_cache.counts()[1]


def cached_bytes() -> int:
    """Bytes of the idle pinned buffers in the cache."""
    return ring_cache.counts()[2]


def free_cached_rings() -> None:
    """Free every idle pinned buffer in the cache, and forget the largest ring
    lent so far (the budget starts again from the next one). Rings lent out
    are not affected; they come back to the cache when their transfer ends.
    Frees that a capture under way forbids wait for it to end
    (:func:`free_pinned`); those that waited and may run now run."""
    _free_idle(ring_cache.clear())
