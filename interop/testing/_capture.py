"""Graph capture on the emulated device: a stream's work recorded, not run."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from ._machine import EmulatedCaptureError
from ._memory import Region
from ._streams import EmulatedStream

_Device = Any  # an EmulatedDevice (its module is above this one)

_Op = tuple[str, Callable[[], None], tuple[Region, ...], tuple[Region, ...]]


class EmulatedGraph:
    """The work a capture recorded (``cudaGraphExec``), to be replayed."""

    def __init__(self, stream: EmulatedStream) -> None:
        self.stream = stream  # the capturing stream: where a replay runs by default
        self._ops: list[_Op] = []
        self.complete = False  # the capture ended valid

    @property
    def operations(self) -> list[str]:
        """The kinds of the recorded operations, in order."""
        return [kind for kind, _, _, _ in self._ops]

    def replay(self, stream: EmulatedStream | None = None) -> None:
        """Queue the recorded work on ``stream`` (default: the capturing
        stream), in the order it was recorded (``cudaGraphLaunch``).

        Its memory rules are checked again now: memory the capture used must
        still be live (blocks the capture allocated are kept for the graph)
        and ordered as for any other work on ``stream``.
        """
        if not self.complete:
            raise EmulatedCaptureError("a graph replayed whose capture did not end valid")
        s = self.stream if stream is None else stream
        for kind, op, reads, writes in self._ops:
            s.enqueue(kind, op, reads, writes, graph=self)


class Capture:
    """A capture under way: its streams and why it was invalidated, if it was."""

    def __init__(self, origin: EmulatedStream) -> None:
        self.origin = origin
        self.graph = EmulatedGraph(origin)
        self.streams: list[EmulatedStream] = [origin]  # the origin, then the streams that joined
        self.last: dict[int, int] = {}  # stream id -> the seq of its last captured work
        self.invalid: str | None = None
        self.under_way = True

    def invalidate(self, reason: str) -> None:
        """With the lock held: the capture fails when it ends (the first reason is kept)."""
        self.invalid = self.invalid or reason

    def record(self, stream_id: int, seq: int, op: _Op) -> None:
        """With the lock held: work queued as ``seq`` on a stream in the capture."""
        self.graph._ops.append(op)
        self.last[stream_id] = seq

    def join(self, stream: EmulatedStream) -> None:
        """With the lock held: ``stream`` waited on an event recorded in the capture."""
        if stream.legacy:
            self.invalidate(f"the legacy default stream {stream.id} waited on it")
            raise EmulatedCaptureError(
                f"the legacy default stream {stream.id} waits on an event recorded in a "
                "capture: it cannot join one (CUDA fails the wait and invalidates the "
                "capture); wait on a stream of backend.stream()"
            )
        stream.capture = self
        self.streams.append(stream)

    def refuse_outside_wait(self, stream: EmulatedStream) -> None:
        """With the lock held: ``stream``, in it, waited on an event recorded outside it."""
        self.invalidate(f"stream {stream.id} waited on an event recorded outside it")
        raise EmulatedCaptureError(
            f"capturing stream {stream.id} waits on an event recorded outside its capture "
            "(cudaErrorStreamCaptureIsolation; the capture is invalidated): order it "
            "before the capture begins"
        )

    def end(self) -> list[int]:
        """With the lock held: release its streams; return those not joined back
        (the origin did not wait on an event recorded after their last captured work)."""
        unjoined = [
            s.id
            for s in self.streams[1:]
            if self.origin.clock.get(s.id, 0) < self.last.get(s.id, 0)
        ]
        for s in self.streams:
            s.capture = None
        self.under_way = False
        return unjoined


@contextlib.contextmanager
def graph_capture(backend: _Device, stream: EmulatedStream) -> Iterator[EmulatedGraph]:
    """:meth:`EmulatedDevice.capture`."""
    machine = backend.machine
    machine.check_alive(backend.index)
    with machine.lock:
        if stream.backend is not backend:
            raise backend.violation(
                f"capture on device {backend.index} of stream {stream.id} of device "
                f"{stream.backend.index}"
            )
        if stream.closed:
            raise backend.violation(f"capture on stream {stream.id} after it was closed")
        if stream.legacy:
            raise EmulatedCaptureError(
                "capture on the legacy default stream is not permitted "
                "(cudaErrorStreamCaptureUnsupported): capture on a stream of backend.stream()"
            )
        if stream.capture is not None:
            raise EmulatedCaptureError(
                f"capture on stream {stream.id}, which is already capturing (cudaErrorIllegalState)"
            )
        under_way = stream.capture = Capture(stream)
        machine.captures.append(under_way)
    try:
        yield under_way.graph
    finally:  # an error in flight is the one to see: the checks below are skipped
        with machine.lock:
            unjoined = under_way.end()
            machine.captures.remove(under_way)
    if under_way.invalid:
        raise EmulatedCaptureError(
            f"the capture on stream {stream.id} was invalidated: {under_way.invalid} "
            "(cudaErrorStreamCaptureInvalidated)"
        )
    if unjoined:
        raise EmulatedCaptureError(
            f"streams {unjoined} joined the capture on stream {stream.id} and were not joined "
            f"back (cudaErrorStreamCaptureUnjoined): before the capture ends, make stream "
            f"{stream.id} wait on an event recorded on each after its last work"
        )
    under_way.graph.complete = True
