"""Process-wide state, and the one fork handler resetting it and what :func:`at_fork` got."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

from . import _backends

__all__: list[str] = []

# The resets in a forked child, in order: deferred frees first (later steps allocate, and
# CuPy's destructors must find no parent's block), replaced files (which call the OS) last.
ORDER = (
    "deferred frees",
    "stream uses",
    "transfers",
    "host pool",
    "ring cache",
    "cupy streams",
    "config",
    "replaced files",
)
_resets: dict[str, list[Callable[[], None]]] = {step: [] for step in ORDER}


def at_fork(step: str, reset: Callable[[], None]) -> None:
    """Have a forked child call ``reset()`` at ``step``'s place in :data:`ORDER`."""
    _resets[step].append(reset)


def _reset_in_child() -> None:
    for step in ORDER:
        for reset in _resets[step]:
            reset()


os.register_at_fork(before=_backends.note_if_driver_initialised, after_in_child=_reset_in_child)


class HostPool:
    """The host threads every transfer shares, grown to the most threads asked for."""

    def __init__(self) -> None:
        self.reset()
        at_fork("host pool", self.reset)

    def reset(self) -> None:
        """No pool: a forked child has none of its parent's threads."""
        self._lock = threading.Lock()  # guards _pool and _size: one caller replaces the pool
        self._pool: ThreadPoolExecutor | None = None
        self._size = 0

    def at_least(self, threads: int) -> Executor:
        """The pool, with at least ``threads`` threads and one more, for a hybrid copy's
        registrar, so such a copy replaces no pool (a larger one replaces it)."""
        threads = max(1, int(threads)) + 1
        with self._lock:
            if self._pool is None or self._size < threads:
                old, self._pool = self._pool, ThreadPoolExecutor(threads, "interop-host")
                self._size = threads
                if old is not None:
                    old.shutdown(wait=False)
            return self._pool


@dataclasses.dataclass(eq=False, slots=True)  # eq=False: the LRU map's keys, by identity
class Idle:
    """A pinned buffer waiting in the ring cache; ``group``: the ring it came back with."""

    backend: Any
    key: tuple[Any, int]  # (backend key, size class)
    ptr: int
    array: Any
    group: int


class RingCache:
    """Idle pinned buffers by (backend key, size class), lent as rings (pipeline/ring.py)."""

    def __init__(self) -> None:
        # pinned frees waiting for a capture to end (no lock: finalizers append anywhere)
        self.waiting: collections.deque[tuple[Any, Callable[[], None]]] = collections.deque()
        self.reset()
        at_fork("ring cache", self.reset)

    def reset(self) -> None:
        """Empty: a forked child's idle buffers belong to its parent's CUDA context."""
        # guards every attribute below: a buffer is in both maps or in neither
        self._lock = threading.Lock()
        self._by_key: dict[tuple[Any, int], list[Idle]] = {}  # idle, oldest first
        self._lru: dict[Idle, None] = {}  # every idle buffer, least recently returned first
        self._idle_bytes = 0
        self._most_slots = 0  # the most slots of a ring lent since the cache was emptied
        self._largest = 0  # the largest size class lent since then
        self._groups = itertools.count(1)
        self.waiting.clear()

    def _lent(self, count: int, size: int) -> None:
        self._most_slots = max(self._most_slots, count)
        self._largest = max(self._largest, size)

    def take(self, key: tuple[Any, int], count: int) -> list[Idle]:
        """Up to ``count`` idle buffers of ``key``, the most recently returned."""
        with self._lock:
            idle = self._by_key.get(key, [])
            take = idle[len(idle) - min(count, len(idle)) :]
            del idle[len(idle) - len(take) :]
            if not idle:
                self._by_key.pop(key, None)
            for buf in take:
                del self._lru[buf]
                self._idle_bytes -= buf.key[1]
            self._lent(count, key[1])
        return take

    def put(
        self, backend: Any, key: tuple[Any, int], buffers: Iterable[Any], count: int
    ) -> list[Idle]:
        """Keep a ring's ``(ptr, array)`` buffers; return those beyond the budget, to free."""
        group = next(self._groups)
        evicted: list[Idle] = []
        with self._lock:
            for ptr, array in buffers:
                buf = Idle(backend, key, ptr, array, group)
                self._by_key.setdefault(key, []).append(buf)
                self._lru[buf] = None
                self._idle_bytes += buf.key[1]
            self._lent(count, key[1])  # the cache may have been emptied while it was lent
            while self._idle_bytes > 2 * self._most_slots * self._largest:
                oldest = next(iter(self._lru))
                del self._lru[oldest]
                same = self._by_key[oldest.key]
                same.remove(oldest)
                if not same:
                    del self._by_key[oldest.key]
                self._idle_bytes -= oldest.key[1]
                evicted.append(oldest)
        return evicted

    def clear(self) -> list[Idle]:
        """Forget every idle buffer and the largest ring lent; return them to free."""
        with self._lock:
            buffers = list(self._lru)
            self._by_key.clear()
            self._lru.clear()
            self._idle_bytes = self._most_slots = self._largest = 0
        return buffers

    def counts(self) -> tuple[int, int, int]:
        """(rings with buffers here, idle buffers, their bytes)."""
        with self._lock:
            return len({buf.group for buf in self._lru}), len(self._lru), self._idle_bytes


class StreamUses:
    """Which streams ``interop.stream`` made current, and since when (asked by frees)."""

    def __init__(self) -> None:
        self.reset()
        at_fork("stream uses", self.reset)

    def reset(self) -> None:
        """No stream entered: a forked child's streams are its parent's CUDA context's."""
        self._lock = threading.Lock()  # guards the stores of enter and leave
        self._clock = itertools.count(1)
        self.last_entered: dict[tuple[int, int], int] = {}  # (device, handle) -> tick
        self.active: dict[tuple[int, int], int] = {}  # (device, handle) -> blocks open
        self.latest = 0  # the tick of the last stream entered

    def now(self) -> int:
        """A tick: streams entered after it have a larger one."""
        return next(self._clock)  # atomic under the GIL: no lock on the allocation path

    def enter(self, key: tuple[int, int]) -> None:
        with self._lock:
            self.last_entered[key] = self.latest = next(self._clock)
            self.active[key] = self.active.get(key, 0) + 1

    def leave(self, key: tuple[int, int]) -> None:
        with self._lock:
            self.active[key] -= 1
            if not self.active[key]:
                del self.active[key]

    def since(self, tick: int, device: int) -> set[int]:
        """Handles of ``device``'s streams entered after ``tick`` or still open (no lock)."""
        if self.latest <= tick and not self.active:  # the common case, answered first
            return set()
        entered = list(self.last_entered.items())
        return {h for (d, h), t in entered if d == device and t > tick} | {
            h for d, h in list(self.active) if d == device
        }


host_pool = HostPool()
ring_cache = RingCache()
stream_uses = StreamUses()
