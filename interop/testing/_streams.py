"""Streams, events and timing events of the emulated device."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._machine import EmulatedCaptureError, EmulatedDeviceError

if TYPE_CHECKING:
    from ._capture import EmulatedGraph, _Capture
    from ._device import EmulatedDevice
    from ._memory import _Region

# work that needs its stream's device current (a DMA, a kernel, an allocation)
_DEVICE_WORK = frozenset({"copy", "pack", "alloc", "upload", "peer", "invert", "cast"})


class EmulatedStream:
    """A stream: a worker thread executing queued operations in order."""

    def __init__(self, backend: EmulatedDevice) -> None:
        self.backend = backend
        with backend._lock:
            self.id = next(backend._ids)
            backend._streams.append(self)
        self.clock: dict[int, int] = {self.id: 0}  # what queued work is ordered after
        self.capture: _Capture | None = None  # the capture it is in
        self._done = 0
        self._cond = threading.Condition()
        self._queue: queue.SimpleQueue[tuple[int, str, Callable[[], None]] | None] = (
            queue.SimpleQueue()
        )
        self._closed = False
        self._thread = threading.Thread(
            target=self._work, name=f"host-stream-{self.id}", daemon=True
        )
        self._thread.start()

    def __repr__(self) -> str:
        return f"EmulatedStream(id={self.id}, device={self.backend.index})"

    def enqueue(
        self,
        kind: str,
        op: Callable[[], None],
        reads: list[_Region] | tuple[()] = (),
        writes: list[_Region] | tuple[()] = (),
    ) -> None:
        """Queue ``op`` after the rules for its memory uses were checked
        (recorded instead, while this stream captures)."""
        self._enqueue(kind, op, tuple(reads), tuple(writes))

    def _check_queue(self, kind: str) -> None:
        """With the lock held: may work of ``kind`` be queued here now?"""
        b = self.backend
        if self._closed:
            raise b.violation(f"work queued on stream {self.id} after it was closed")
        current = b.machine.current_device()
        if kind in _DEVICE_WORK and current != b.index:
            raise b.violation(
                f"device work ({kind}) queued on stream {self.id} of device {b.index} while "
                f"device {current} is current (CUDA fails with an invalid resource handle, or "
                "allocates on the wrong device): make the device current first "
                "(backend.activate())"
            )
        if self.capture is not None and self.capture.invalid:
            raise EmulatedCaptureError(
                f"work queued on stream {self.id} after its capture was invalidated "
                f"({self.capture.invalid})"
            )

    def _enqueue(
        self,
        kind: str,
        op: Callable[[], None],
        reads: tuple[_Region, ...],
        writes: tuple[_Region, ...],
        graph: EmulatedGraph | None = None,
    ) -> None:
        b = self.backend
        b._check_alive()
        fails = self.capture is None and kind in ("copy", "pack") and b._fault(kind)
        with b._lock:
            self._check_queue(kind)
            for region in reads:
                b._check_use(self, region, False, graph)
            for region in writes:
                b._check_use(self, region, True, graph)
            self.clock[self.id] += 1
            seq = self.clock[self.id]
            for region in reads:
                region.reads[self.id] = seq
            for region in writes:
                region.last_write, region.reads = (self.id, seq), {}
            capture = self.capture
            if capture is not None and kind != "wait":
                capture.graph._ops.append((kind, op, reads, writes))
                capture.last[self.id] = seq
                self._queue.put((seq, "captured", _nothing))
            else:
                run = _failing(kind) if fails else _guarded(b, kind, op, (*reads, *writes))
                self._queue.put((seq, kind, run))

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            seq, kind, op = item
            if self.backend.delay and kind not in ("timer", "captured", "wait"):
                time.sleep(self.backend.delay)  # a timing event takes no stream time
            try:
                if self.backend._sticky is None:
                    op()
            except BaseException as exc:
                self.backend._sticky = self.backend._sticky or exc
            with self._cond:
                self._done = seq
                self._cond.notify_all()

    def reached(self, seq: int) -> None:
        """Block until the operation numbered ``seq`` has executed."""
        with self._cond:
            self._cond.wait_for(lambda: self._done >= seq)

    def same(self, other: Any) -> bool:
        """True if ``other`` is this stream."""
        return other is self

    @property
    def legacy(self) -> bool:
        """True for the device's default stream, CUDA's legacy one (never in a capture)."""
        return self is self.backend.default_stream

    def is_capturing(self) -> bool:
        """``cudaStreamIsCapturing`` as CuPy's ``Stream.is_capturing`` asks it:
        raises a plain ``RuntimeError`` while its capture is invalidated."""
        capture = self.capture
        if capture is not None and capture.invalid:
            raise RuntimeError(
                "the stream was capturing, but an error has invalidated the capture sequence"
            )
        return capture is not None

    def wait(self, event: EmulatedEvent) -> None:
        b = self.backend
        with b._lock:
            if event.point is None:
                raise b.violation(f"stream {self.id} waits on an event that was never recorded")
            stream, seq, clock, recorded_in = event.point
            mine = self.capture
            if mine is not None and recorded_in is not mine:
                mine.invalidate(f"stream {self.id} waited on an event recorded outside it")
                raise EmulatedCaptureError(
                    f"capturing stream {self.id} waits on an event recorded outside its capture "
                    "(cudaErrorStreamCaptureIsolation; the capture is invalidated): order it "
                    "before the capture begins"
                )
            if mine is None and recorded_in is not None and recorded_in.under_way:
                if self.legacy:
                    recorded_in.invalidate(f"the legacy default stream {self.id} waited on it")
                    raise EmulatedCaptureError(
                        f"the legacy default stream {self.id} waits on an event recorded in a "
                        "capture: it cannot join one (CUDA fails the wait and invalidates the "
                        "capture); wait on a stream of backend.stream()"
                    )
                self.capture = recorded_in  # joins the capture
                recorded_in.streams.append(self)
            for s, n in clock.items():
                self.clock[s] = max(self.clock.get(s, 0), n)
        self._enqueue("wait", lambda: stream.reached(seq), (), ())

    def synchronize(self) -> None:
        b = self.backend
        capture = self.capture
        if capture is not None:
            with b._lock:
                capture.invalidate(f"stream {self.id} was synchronised")
            raise EmulatedCaptureError(
                f"stream {self.id} synchronised while it captures into a graph "
                "(cudaErrorStreamCaptureUnsupported; the capture is invalidated): synchronise "
                "it after the capture ends"
            )
        with b._lock:
            seq, clock = self.clock[self.id], dict(self.clock)
        self.reached(seq)
        b._observed(clock)
        b._check_alive()

    def close(self) -> None:
        """Release the stream: the host must have seen its queued work complete.

        On CUDA a destroyed stream's queued work still runs: a copy that
        closed its stream without synchronising it could return while its
        DMAs still write the caller's memory. Here that is a rule violation
        (recorded, raised after the worker stopped).
        """
        b = self.backend
        with b._lock:
            unseen = not self._closed and b._completed.get(self.id, 0) < self.clock[self.id]
        self.stop()
        if unseen:
            raise b.violation(f"stream {self.id} closed with work the host never saw complete")

    def stop(self) -> None:
        """Stop the worker thread after the work queued so far ran."""
        with self.backend._lock:
            if self._closed:
                return
            self._closed = True
            self.backend._streams.remove(self)
            self.backend._pool.pop(self.id, None)  # its free blocks go with it
        self._queue.put(None)
        self._thread.join()


def _nothing() -> None:
    """The stream's place of work it captured (run later, by a replay)."""


def _guarded(
    backend: EmulatedDevice, kind: str, op: Callable[[], None], regions: tuple[_Region, ...]
) -> Callable[[], None]:
    """``op``, refusing to run on a pinned buffer freed after it was queued,
    or on a device block handed out again (and written) after it was queued."""

    def run() -> None:
        for region in regions:
            if region.kind == "pinned" and region.freed:
                raise backend.violation(f"queued {kind} ran on {region.name} after it was freed")
            later = region.next_life
            if later is not None and later.started:
                raise backend.violation(
                    f"queued {kind} ran on {region.name} after its block was handed out again "
                    f"on stream {later.stream_id} and written there: a use-after-free across "
                    "streams"
                )
        op()

    return run


def _failing(kind: str) -> Callable[[], None]:
    def op() -> None:
        raise EmulatedDeviceError(f"injected fault: a device {kind} failed")

    return op


class EmulatedEvent:
    """An event: a point in one stream's queue, on one device."""

    def __init__(self, backend: EmulatedDevice) -> None:
        self.backend = backend
        # (stream, seq, its clock, the capture it was recorded in)
        self.point: tuple[EmulatedStream, int, dict[int, int], _Capture | None] | None = None

    def record(self, stream: EmulatedStream) -> None:
        b = self.backend
        b._check_alive()
        with b._lock:
            _check_same_device(b, stream, "an event")
            capture = stream.capture
            if capture is not None and capture.invalid:
                raise EmulatedCaptureError(
                    f"event recorded on stream {stream.id} after its capture was invalidated "
                    f"({capture.invalid})"
                )
            self.point = (stream, stream.clock[stream.id], dict(stream.clock), capture)

    def query(self) -> bool:
        """True once the recorded point was reached (never blocks)."""
        point = self.point
        if point is None:
            raise self.backend.violation("host queries an event that was never recorded")
        self.backend._refuse_in_capture("an event queried (cudaEventQuery)")
        machine = self.backend.machine
        machine.contexts.add(machine.current_device())
        stream, seq, _, _ = point
        return stream._done >= seq

    def synchronize(self) -> None:
        point = self.point
        if point is None:
            raise self.backend.violation("host synchronises an event that was never recorded")
        self.backend._refuse_in_capture("an event synchronised (cudaEventSynchronize)")
        stream, seq, clock, _ = point
        stream.reached(seq)
        self.backend._observed(clock)
        self.backend._check_alive()


def _check_same_device(backend: EmulatedDevice, stream: EmulatedStream, what: str) -> None:
    if stream.backend is not backend:
        raise backend.violation(
            f"{what} of device {backend.index} recorded on stream {stream.id} of device "
            f"{stream.backend.index} (CUDA fails with an invalid resource handle): use one of "
            "the stream's device"
        )


class EmulatedTimer:
    """A timing event: the time the stream's worker reached it."""

    def __init__(self, backend: EmulatedDevice) -> None:
        self.backend = backend
        self.at: float | None = None

    def record(self, stream: EmulatedStream) -> None:
        with self.backend._lock:
            _check_same_device(self.backend, stream, "a timing event")
        self.at = None
        stream.enqueue("timer", self._stamp)

    def _stamp(self) -> None:
        self.at = time.perf_counter()

    def seconds_since(self, start: EmulatedTimer) -> float:
        if self.backend._fault("timer_read"):
            raise EmulatedDeviceError("injected fault: reading a timing event failed")
        if self.at is None or start.at is None:
            raise self.backend.violation(
                "a timer read before its stream reached it (synchronise the stream first)"
            )
        return self.at - start.at
