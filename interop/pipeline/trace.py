"""Where a slot transfer's time goes: device copies, host steps, or the schedule.

:func:`recording` collects a :class:`SlotTrace` of every transfer run inside it
(two timing events per chunk: for diagnosis, not timed runs).
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
    """Timings of one slot transfer; times are ``time.perf_counter()`` values."""

    direction: str  # "d2h" or "h2d"
    threads: int  # host threads (0: DMAs to pinned memory directly, no host step)
    chunk_bytes: list[int] = field(default_factory=list)
    device_seconds: list[float] = field(default_factory=list)  # per chunk, between timers
    # per host piece: (chunk, submitted to the pool, its event wait over, copy done)
    pieces: list[tuple[int, float, float, float]] = field(default_factory=list)
    issuer_wait_seconds: float = 0.0  # the issuing thread waiting for host pieces
    start: float = 0.0
    end: float = 0.0
    error: str | None = None  # why the device times could not be read (the copy succeeded)

    def summary(self, call_seconds: float | None = None) -> dict[str, Any]:
        """Rates (GB/s) and busy fractions of the run, and the side it was ``limited_by``.

        ``call_seconds``, the whole call's wall time, adds the time spent outside
        the transfer (``save_npy``: creating and renaming the file).
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
    """The side a run waited on, from its busy fractions (``outside``: of the wall time)."""
    if outside > 1:
        return "the call's work outside the slot pipeline"
    if max(device_busy, host_busy) < 0.75:
        return "schedule (neither side busy: more slots or larger chunks)"
    return "device copies" if device_busy >= host_busy else "host threads"


@contextlib.contextmanager
def recording() -> Iterator[list[SlotTrace]]:
    """Yield a list that gets a trace of every slot transfer run inside the block (nests)."""
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


now = time.perf_counter  # the trace's host timestamps
