"""Where a slot transfer's time goes: device copies against host steps.

A transfer that misses its throughput target is limited by one of three
things: the device copies (the link, or pack/unpack kernels), the host steps
(threads copying between staging slots and ``out`` or a file), or the issuing
thread waiting for a free slot with neither side busy. :func:`recording`
collects, for every transfer that runs inside it:

- per chunk, the time the copy stream spent on it, between two timing events
  recorded around its device step (the DMA, with its pack or unpack);
- per host piece, when it was submitted, when its wait for the slot's event
  ended and when its copy ended (host timestamps in the threads);
- the time the issuing thread spent waiting for host pieces, and the wall time.

:meth:`SlotTrace.summary` turns them into rates and busy fractions. Tracing adds
two timing events per chunk and is meant for diagnosis (``python -m interop
bench`` traces one extra, untimed run of each transfer row), not for timed runs.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SlotTrace", "active", "recording"]

_lock = threading.Lock()
_recorders: list[list[SlotTrace]] = []


@dataclass
class SlotTrace:
    """Timings of one slot transfer (see the module docstring).

    Attributes
    ----------
    direction : str
        ``"d2h"`` or ``"h2d"``.
    threads : int
        Host threads of the run (0: the DMAs used pinned host memory
        directly, with no staging ring and no host step).
    chunk_bytes : list of int
        Bytes of each chunk.
    device_seconds : list of float
        Per chunk, the copy stream's time on its device step (timing events).
    pieces : list of (chunk, submitted, waited, ended)
        Per host piece, ``time.perf_counter()`` values: submitted to the pool,
        its wait for the slot's event over (when it started copying), done.
    issuer_wait_seconds : float
        Time the issuing thread spent waiting for host pieces to finish.
    start, end : float
        ``time.perf_counter()`` when the run started and when it finished.
    error : str or None
        Why the device times could not be read (the transfer succeeded).
    """

    direction: str
    threads: int
    chunk_bytes: list[int] = field(default_factory=list)
    device_seconds: list[float] = field(default_factory=list)
    pieces: list[tuple[int, float, float, float]] = field(default_factory=list)
    issuer_wait_seconds: float = 0.0
    start: float = 0.0
    end: float = 0.0
    error: str | None = None

    def summary(self, call_seconds: float | None = None) -> dict[str, Any]:
        """Rates (GB/s, 1e9 bytes a second) and busy fractions of the run.

        ``device_busy`` is the copy stream's busy time over the wall time;
        ``host_busy`` the host threads' copying time over ``threads`` times the
        wall time; ``host_event_wait_seconds`` the time pieces spent waiting for
        their slot's device copy. A run whose ``device_busy`` is near 1 is
        limited by the device side; one whose ``host_busy`` is near 1 by the
        host threads; one with both low by the schedule (too few slots).
        A trace whose timers could not be read gives only ``error``.

        With ``call_seconds``, the wall time of the whole call that ran the
        transfer, the summary also gives ``call_seconds`` and
        ``outside_seconds`` (the call's time outside the transfer: for
        ``save_npy``, creating and renaming the file); a call that spent more
        time outside the transfer than in it is limited by that work.
        """
        if self.error is not None:
            return {"error": self.error}
        wall = max(self.end - self.start, 1e-12)
        total = sum(self.chunk_bytes)
        device = sum(self.device_seconds)
        copying = sum(end - waited for _, _, waited, end in self.pieces)
        waiting = sum(waited - submitted for _, submitted, waited, _ in self.pieces)
        threads = max(1, self.threads)  # a divisor: 0 threads copied nothing
        timed: dict[str, float] = {}
        if call_seconds is not None:
            timed = {"call_seconds": call_seconds, "outside_seconds": max(0.0, call_seconds - wall)}
        return {
            "direction": self.direction,
            "bytes": total,
            "chunks": len(self.chunk_bytes),
            "threads": self.threads,
            "wall_seconds": wall,
            "rate_gbps": total / wall / 1e9,
            "device_seconds": device,
            "device_gbps": total / device / 1e9 if device > 0 else None,
            "device_busy": device / wall,
            "host_seconds": copying,
            "host_gbps_per_thread": total / copying / 1e9 if copying > 0 else None,
            "host_busy": copying / (threads * wall),
            "host_event_wait_seconds": waiting,
            "issuer_wait_seconds": self.issuer_wait_seconds,
            **timed,
            "limited_by": _limit(
                device / wall, copying / (threads * wall), timed.get("outside_seconds", 0.0) / wall
            ),
        }


def _limit(device_busy: float, host_busy: float, outside: float = 0.0) -> str:
    """The side a run waited on, from its busy fractions (and the call's time
    outside the transfer, as a fraction of the transfer's)."""
    if outside > 1:
        return "the call's work outside the slot pipeline"
    if max(device_busy, host_busy) < 0.75:
        return "schedule (neither side busy: more slots or larger chunks)"
    return "device copies" if device_busy >= host_busy else "host threads"


@contextlib.contextmanager
def recording() -> Iterator[list[SlotTrace]]:
    """Trace every slot transfer that runs, in any thread, inside the block.

    Yields the list the traces are appended to (one per transfer, when it
    finishes). Blocks may nest; each sees the transfers run inside it.
    """
    traces: list[SlotTrace] = []
    with _lock:
        _recorders.append(traces)
    try:
        yield traces
    finally:
        with _lock:
            _recorders[:] = [r for r in _recorders if r is not traces]  # by identity


def active() -> bool:
    """Whether a :func:`recording` block is open."""
    return bool(_recorders)


def publish(trace: SlotTrace) -> None:
    """Hand a finished run's trace to every open recording."""
    with _lock:
        for traces in _recorders:
            traces.append(trace)


def now() -> float:
    return time.perf_counter()
