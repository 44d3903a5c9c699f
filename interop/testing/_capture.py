"""Graph capture on the emulated device."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

from ._machine import EmulatedCaptureError

if TYPE_CHECKING:
    from ._device import EmulatedDevice
    from ._memory import _Region
    from ._streams import EmulatedStream

_Op = tuple[str, Callable[[], None], tuple["_Region", ...], tuple["_Region", ...]]


class _Capture:
    """A capture under way: its streams and why it was invalidated, if it was."""

    def __init__(self, origin: EmulatedStream, graph: EmulatedGraph) -> None:
        self.origin = origin
        self.graph = graph
        self.streams: list[EmulatedStream] = [origin]  # the origin, then the streams that joined
        self.last: dict[int, int] = {}  # stream id -> the seq of its last captured work
        self.invalid: str | None = None
        self.under_way = True

    def invalidate(self, reason: str) -> None:
        self.invalid = self.invalid or reason


class _CaptureBlock:
    """``with backend.capture(stream) as graph:`` (see :meth:`EmulatedDevice.capture`)."""

    def __init__(self, backend: EmulatedDevice, stream: EmulatedStream) -> None:
        self.backend = backend
        self.stream = stream
        self._capture: _Capture | None = None

    def __enter__(self) -> EmulatedGraph:
        b, stream = self.backend, self.stream
        b._check_alive()
        with b._lock:
            if stream.backend is not b:
                raise b.violation(
                    f"capture on device {b.index} of stream {stream.id} of device "
                    f"{stream.backend.index}"
                )
            if stream._closed:
                raise b.violation(f"capture on stream {stream.id} after it was closed")
            if stream is b.default_stream:
                raise EmulatedCaptureError(
                    "capture on the legacy default stream is not permitted "
                    "(cudaErrorStreamCaptureUnsupported): capture on a stream of backend.stream()"
                )
            if stream.capture is not None:
                raise EmulatedCaptureError(
                    f"capture on stream {stream.id}, which is already capturing "
                    "(cudaErrorIllegalState)"
                )
            graph = EmulatedGraph(stream)
            capture = self._capture = _Capture(stream, graph)
            stream.capture = capture
            b.machine.captures.append(capture)
        return graph

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        capture, b = self._capture, self.backend
        assert capture is not None
        origin = capture.origin
        with b._lock:
            unjoined = [
                s.id
                for s in capture.streams[1:]
                if origin.clock.get(s.id, 0) < capture.last.get(s.id, 0)
            ]
            for s in capture.streams:
                s.capture = None
            capture.under_way = False
            b.machine.captures.remove(capture)
        if exc is not None:
            return  # the error in flight is the one to see
        if capture.invalid:
            raise EmulatedCaptureError(
                f"the capture on stream {origin.id} was invalidated: {capture.invalid} "
                "(cudaErrorStreamCaptureInvalidated)"
            )
        if unjoined:
            raise EmulatedCaptureError(
                f"streams {unjoined} joined the capture on stream {origin.id} and were not joined "
                f"back (cudaErrorStreamCaptureUnjoined): before the capture ends, make stream "
                f"{origin.id} wait on an event recorded on each after its last work"
            )
        capture.graph.complete = True


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
            s._enqueue(kind, op, reads, writes, graph=self)
