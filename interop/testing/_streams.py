"""Streams, events and timing events of the emulated device."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ._machine import EmulatedCaptureError, EmulatedDeviceError
from ._memory import Region

# types of the modules above this one (importing them would make a cycle)
_Capture = Any  # a Capture
_Graph = Any  # an EmulatedGraph
_Device = Any  # an EmulatedDevice
# queued: (seq, kind, op (None: captured, run by a replay), its memory, an injected fault)
_Item = tuple[int, str, Callable[[], None] | None, tuple[Region, ...], bool]

# work that needs its stream's device current (a DMA, a kernel, an allocation)
_DEVICE_WORK = frozenset({"copy", "pack", "alloc", "upload", "peer", "invert", "cast"})
_UNTIMED = frozenset({"timer", "captured", "wait"})  # take no stream time (no delay)


class EmulatedStream:
    """A stream: a worker thread executing queued operations in order. Its vector
    clock orders its work after other streams' (checked at queue time, untimed)."""

    def __init__(self, backend: _Device) -> None:
        self.backend = backend
        machine = backend.machine
        with machine.lock:
            self.id = next(machine.ids)
            machine.streams[self.id] = self
        self.clock: dict[int, int] = {self.id: 0}  # stream id -> last seq ordered before
        self.capture: _Capture | None = None  # the capture it is in
        self.closed = False
        self._done = 0
        self._cond = threading.Condition()
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
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
        reads: Sequence[Region] = (),
        writes: Sequence[Region] = (),
        graph: _Graph | None = None,
    ) -> None:
        """Queue ``op`` after the rules for its memory uses were checked
        (recorded instead, while this stream captures; ``graph``: a replay of it)."""
        machine = self.backend.machine
        machine.check_alive(self.backend.index)
        fails = self.capture is None and kind in ("copy", "pack") and machine.fault(kind)
        with machine.lock:
            self.check_queue(kind)
            for region in reads:
                region.check_use(self, False, graph)
            for region in writes:
                region.check_use(self, True, graph)
            self.clock[self.id] += 1
            seq = self.clock[self.id]
            for region in reads:
                region.use(self.id, seq, write=False)
            for region in writes:
                region.use(self.id, seq, write=True)
            if self.capture is not None and kind != "wait":
                self.capture.record(self.id, seq, (kind, op, tuple(reads), tuple(writes)))
                self._queue.put((seq, "captured", None, (), False))
            else:
                self._queue.put((seq, kind, op, (*reads, *writes), fails))

    def check_queue(self, kind: str) -> None:
        """With the lock held: may work of ``kind`` be queued here now?"""
        b = self.backend
        if self.closed:
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

    def _work(self) -> None:
        machine, index = self.backend.machine, self.backend.index
        while (item := self._queue.get()) is not None:
            seq, kind, op, regions, fails = item
            if machine.delay and kind not in _UNTIMED:
                time.sleep(machine.delay)
            try:
                if op is not None and index not in machine.failures:
                    if fails:
                        raise EmulatedDeviceError(f"injected fault: a device {kind} failed")
                    for region in regions:
                        region.check_run(machine, kind)
                    op()
            except BaseException as exc:  # sticky, as CUDA's asynchronous errors are
                machine.failures.setdefault(index, exc)
            with self._cond:
                self._done = seq
                self._cond.notify_all()

    def reached(self, seq: int) -> None:
        """Block until the operation numbered ``seq`` has executed."""
        with self._cond:
            self._cond.wait_for(lambda: self._done >= seq)

    def done_with(self, seq: int) -> bool:
        """True once the operation numbered ``seq`` has executed (never blocks)."""
        return self._done >= seq

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
        with b.machine.lock:
            if event.point is None:
                raise b.violation(f"stream {self.id} waits on an event that was never recorded")
            stream, seq, clock, recorded_in = event.point
            if self.capture is not None and recorded_in is not self.capture:
                self.capture.refuse_outside_wait(self)
            if self.capture is None and recorded_in is not None and recorded_in.under_way:
                recorded_in.join(self)
            for s, n in clock.items():
                self.clock[s] = max(self.clock.get(s, 0), n)
        self.enqueue("wait", lambda: stream.reached(seq))

    def synchronize(self) -> None:
        machine, capture = self.backend.machine, self.capture
        if capture is not None:
            with machine.lock:
                capture.invalidate(f"stream {self.id} was synchronised")
            raise EmulatedCaptureError(
                f"stream {self.id} synchronised while it captures into a graph "
                "(cudaErrorStreamCaptureUnsupported; the capture is invalidated): synchronise "
                "it after the capture ends"
            )
        with machine.lock:
            seq, clock = self.clock[self.id], dict(self.clock)
        self.reached(seq)
        machine.observed(clock)
        machine.check_alive(self.backend.index)

    def close(self) -> None:
        """Release the stream, whose queued work the host must have seen complete
        (CUDA would still run it, maybe writing memory the caller got back)."""
        machine = self.backend.machine
        with machine.lock:
            unseen = not self.closed and machine.completed.get(self.id, 0) < self.clock[self.id]
        self.stop()
        if unseen:
            raise machine.violation(
                f"stream {self.id} closed with work the host never saw complete"
            )

    def stop(self) -> None:
        """Stop the worker thread after the work queued so far ran."""
        with self.backend.machine.lock:
            if self.closed:
                return
            self.closed = True
            del self.backend.machine.streams[self.id]
            self.backend.pool.free.pop(self.id, None)  # its free blocks go with it
        self._queue.put(None)
        self._thread.join()


def _check_same_device(backend: _Device, stream: EmulatedStream, what: str) -> None:
    """With the lock held: ``what`` of ``backend`` may be recorded on ``stream``."""
    if stream.backend is not backend:
        raise backend.violation(
            f"{what} of device {backend.index} recorded on stream {stream.id} of device "
            f"{stream.backend.index} (CUDA fails with an invalid resource handle): use one of "
            "the stream's device"
        )


class EmulatedEvent:
    """An event: a point in one stream's queue, on one device."""

    def __init__(self, backend: _Device) -> None:
        self.backend = backend
        # (stream, seq, its clock, the capture it was recorded in)
        self.point: tuple[EmulatedStream, int, dict[int, int], _Capture | None] | None = None

    def record(self, stream: EmulatedStream) -> None:
        b = self.backend
        b.machine.check_alive(b.index)
        with b.machine.lock:
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
        point, machine = self.point, self.backend.machine
        if point is None:
            raise machine.violation("host queries an event that was never recorded")
        machine.refuse_in_capture("an event queried (cudaEventQuery)")
        machine.touch()
        return point[0].done_with(point[1])

    def synchronize(self) -> None:
        point, machine = self.point, self.backend.machine
        if point is None:
            raise machine.violation("host synchronises an event that was never recorded")
        machine.refuse_in_capture("an event synchronised (cudaEventSynchronize)")
        stream, seq, clock, _ = point
        stream.reached(seq)
        machine.observed(clock)
        machine.check_alive(self.backend.index)


class EmulatedTimer:
    """A timing event: the time the stream's worker reached it."""

    def __init__(self, backend: _Device) -> None:
        self.backend = backend
        self.at: float | None = None

    def record(self, stream: EmulatedStream) -> None:
        with self.backend.machine.lock:
            _check_same_device(self.backend, stream, "a timing event")
        self.at = None
        stream.enqueue("timer", self._stamp)

    def _stamp(self) -> None:
        self.at = time.perf_counter()

    def seconds_since(self, start: EmulatedTimer) -> float:
        machine = self.backend.machine
        machine.inject("timer_read", "reading a timing event")
        if self.at is None or start.at is None:
            raise machine.violation(
                "a timer read before its stream reached it (synchronise the stream first)"
            )
        return self.at - start.at
