"""The hybrid form of a device-to-host copy: part of a pageable ``out`` page-locked in place.

A registrar thread registers spans of whole chunks of ``out`` from its back
(``cudaHostRegister``) while the ring copies chunks from its front; a chunk goes by DMA
straight into ``out`` when its bytes lie in one registered span, else through the ring.
The two meet where their rates put them; the ring never waits for the registrar.
docs/pipeline.md gives the rules and reasons.
"""

from __future__ import annotations

import collections
import functools
import math
import mmap
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, NamedTuple

import numpy as np

from ..config import config
from .backend import Backend
from .plan import Plan, round_up
from .ring import free_pinned
from .workers import settle, submit

__all__ = ["FLOOR", "PAGE", "Hybrid", "Rates", "hybrid_form", "rates"]

PAGE = mmap.PAGESIZE
FLOOR = 64 << 20  # bytes: the measured threshold's floor (such a copy is over in milliseconds)
_PROBE = 4 << 20  # bytes registered once per device to measure the rate
_UNSUPPORTED = 801  # cudaErrorNotSupported: no pageable memory is registered here
_MIN_SPAN = 4  # chunks: a span's last chunk shares a page with the next span, so the ring takes it

Span = tuple[int, int, list[int]]  # its first page's address, its end page's, its chunks


class Rates(NamedTuple):
    """What registering costs on a device, and how fast one host thread copies."""

    call: float  # seconds: registering and unregistering one page
    per_byte: float  # seconds per byte beyond that page
    copy: float  # bytes per second one thread copies into pageable memory


_measured: weakref.WeakKeyDictionary[Any, Rates | None] = weakref.WeakKeyDictionary()


def rates(backend: Backend) -> Rates | None:
    """``backend``'s :class:`Rates`, measured on its first use (None: it registers nothing,
    for good where the driver does not support it, else until the next measurement)."""
    if backend not in _measured:  # two first uses at once both measure: harmless
        with backend.activate():  # no context made on another device
            return _measure(backend)
    return _measured[backend]


def _measure(backend: Backend) -> Rates | None:
    """Register and unregister a page (twice: the first warms the driver) and 4 MiB, and
    copy 4 MiB, in untouched pageable memory (as a new ``out``'s: registering faults its
    pages in); keep the rates, or None where registering is unsupported."""
    raw = np.frombuffer(mmap.mmap(-1, 2 * _PROBE), np.uint8)  # new pages, none touched
    probe = raw[:_PROBE]
    seconds = []
    for n in (PAGE, PAGE, _PROBE):
        start = time.perf_counter()
        try:
            backend.host_register(probe.ctypes.data, n)
        except Exception as exc:  # the ring serves this out; every out where unsupported
            if getattr(exc, "status", None) == _UNSUPPORTED:
                _measured[backend] = None
            return None
        backend.host_unregister(probe.ctypes.data)  # its failure is raised, never hidden
        seconds.append(time.perf_counter() - start)
    start = time.perf_counter()
    np.copyto(raw[-_PROBE:], probe)
    copy = _PROBE / max(time.perf_counter() - start, 1e-9)
    measured = Rates(max(seconds[1], 1e-7), max(seconds[2] - seconds[1], 0.0) / _PROBE, copy)
    _measured[backend] = measured
    return measured


def hybrid_form(backend: Backend, out: Any, plan: Plan) -> Callable[[], Hybrid] | None:
    """The hybrid form of a device-to-host copy into ``out`` (its :meth:`Hybrid.start`
    starts the registrar), or None: the ring alone."""
    at_least = config.register_min_bytes  # -1: measured, 0: never
    if (
        at_least == 0
        or not isinstance(out, np.ndarray)
        or not out.flags.c_contiguous
        or out.nbytes != plan.nbytes
        or out.nbytes < (FLOOR if at_least < 0 else at_least)
        or _mapped(out)
        or backend.capture_under_way(None)  # cudaHostRegister would break the capture
        or (measured := rates(backend)) is None
    ):
        return None
    count, chunk = len(plan.sizes), max(plan.sizes)
    # A span: at least 4 chunks, and long enough that the fixed cost of a registration
    # is at most an eighth of it; at most an eighth of the array, so the two ends meet
    # within a span of where the rates put them.
    fixed = math.ceil(8 * measured.call / max(measured.per_byte * chunk, 1e-12))
    span = max(_MIN_SPAN, min(fixed, count // 8))
    seconds = measured.call + span * chunk * measured.per_byte  # registering one span
    # measured: worth it where, at one thread's pace, the ring leaves room for two spans
    if at_least < 0 and count < 2 * (span + math.ceil(measured.copy * seconds / chunk)):
        return None
    return functools.partial(Hybrid, backend, out, plan, span, seconds)


def _mapped(a: Any) -> bool:
    """True for memory of a ``numpy.memmap`` or an ``mmap``: a file's pages may be refused."""
    while a is not None and not isinstance(a, np.memmap | mmap.mmap):
        a = getattr(a, "base", None)
    return a is not None


class Hybrid:
    """Which chunk goes where, as the registrar (from the back) and the ring (from the
    front) meet; the spans registered, unregistered once their chunks are copied."""

    def __init__(self, backend: Backend, out: Any, plan: Plan, span: int, seconds: float) -> None:
        self.backend, self.plan, self.base = backend, plan, int(out.ctypes.data)
        self.span, self.seconds, self.began = span, seconds, time.perf_counter()
        self.lock = threading.Lock()  # guards every attribute below
        self.front, self.low = 0, len(plan.sizes)  # the ring's next chunk; the lowest claimed
        self.ring: collections.deque[int] = collections.deque()  # claimed, for the ring
        self.direct: collections.deque[tuple[int, int]] = collections.deque()  # (chunk, address)
        self.pending: list[int] = []  # the claimed span's chunks, until it is registered
        self.live: dict[int, int] = {}  # a registered span's address -> its chunks not copied
        self.span_of: dict[int, int] = {}  # a direct chunk -> its span's address
        self.done: list[int] = []  # registered spans whose chunks were all copied
        self.stop = self.turn = False  # turn: the last chunk taken went direct
        self.first = self._claim()  # before the ring's first chunk
        self.registrar: Future[None] | None = None

    def start(self, pool: Executor) -> None:
        """Start the registrar on ``pool``: it has a thread more than the ring's pieces use
        (at interpreter exit: run here, first)."""
        if self.first is not None:
            self.registrar = submit(pool, self._run, self.first)

    def _claim(self) -> Span | None:
        """With the lock held (or no registrar yet): the next span from the back (its chunks
        not wholly inside its pages go to the ring), or None: the ring would reach it before
        it is registered (at its pace so far, at most ``nslots`` chunks too fast), or the
        copy stopped."""
        hi = self.low
        lo = hi - self.span
        pace = self.front / max(time.perf_counter() - self.began, 1e-9)  # chunks a second
        if self.stop or lo < self.front + pace * self.seconds:
            return None
        self.low = lo
        base, starts, sizes = self.base, self.plan.starts, self.plan.sizes
        # whole pages inside out; the page a span ends in is the next span's first
        first = max((base + starts[lo]) // PAGE * PAGE, round_up(base, PAGE))
        end = (base + starts[hi - 1] + sizes[hi - 1]) // PAGE * PAGE
        inside = [k for k in range(lo, hi) if first <= base + starts[k] <= end - sizes[k]]
        self.ring.extend(k for k in range(lo, hi) if k not in inside)
        self.pending = inside.copy()
        return first, end, inside

    def _run(self, span: Span | None) -> None:
        """The registrar: register each span claimed (its chunks then go direct, or through
        the ring where the driver refused) and unregister the spans copied meanwhile."""
        while span is not None:
            first, end, inside = span
            ok = bool(inside)
            try:
                self.backend.use()  # in the try: a claimed span is always answered
                ok = ok and not self.backend.capture_under_way(None)
                if ok:
                    self.backend.host_register(first, end - first)
            except Exception:  # refused (712: the user registered part of out): the ring's
                ok = False
            with self.lock:
                left, self.pending = self.pending, []  # the chunks the ring did not take
                if ok and left:
                    self.live[first] = len(left)
                    self.span_of.update(dict.fromkeys(left, first))
                    self.direct.extend((k, self.base + self.plan.starts[k]) for k in left)
                elif ok:  # the ring took them all meanwhile: unregistered at once
                    self.done.append(first)
                else:
                    self.ring.extend(left)
                copied, self.done = self.done, []
            self._unregister(copied)  # no span claimed: an error here leaves none unanswered
            with self.lock:
                span = self._claim()

    def take(self, prefer_direct: bool) -> tuple[int, int | None] | None:
        """The next chunk to issue and its address in ``out`` (None: through the ring);
        None once every chunk was taken. Ring and direct chunks alternate, but a direct
        one goes first where ``prefer_direct`` (the ring's next slot is busy). Never
        waits: with nothing else left, the ring takes the claimed span's chunks."""
        with self.lock:
            ring = bool(self.ring) or self.front < self.low
            if self.direct and (prefer_direct or not self.turn or not ring):
                self.turn = True
                return self.direct.popleft()
            self.turn = False
            if self.ring:
                return self.ring.popleft(), None
            if self.front < self.low:
                self.front += 1
                return self.front - 1, None
            return (self.pending.pop(0), None) if self.pending else None

    def copied(self, i: int) -> None:
        """Direct chunk ``i``'s DMA is complete (its event was seen)."""
        with self.lock:
            first = self.span_of.pop(i)
            self.live[first] -= 1
            if not self.live[first]:
                del self.live[first]
                self.done.append(first)

    def _unregister(self, ptrs: list[int]) -> None:
        """Unregister each (after a capture under way); raise the first failure after all."""
        failures = []
        for ptr in ptrs:
            try:
                free_pinned(self.backend, functools.partial(self.backend.host_unregister, ptr))
            except Exception as exc:
                failures.append(exc)
        if failures:
            raise failures[0]

    def close(self) -> None:
        """Stop the registrar and unregister every span left (the copy stream was
        synchronised); raise the registrar's error, if any, after."""
        with self.lock:
            self.stop = True
        if self.registrar is not None:
            settle([self.registrar])
        with self.lock:
            ptrs, self.done = [*self.done, *self.live], []
            self.live.clear()
        self._unregister(ptrs)
        registrar = self.registrar
        if registrar is not None and not registrar.cancelled() and registrar.exception():
            raise registrar.exception()  # type: ignore[misc]
