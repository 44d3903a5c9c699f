"""The emulated machine: what its devices share (the rule book, the host's
view of the streams, the current device of each thread), and its errors."""

from __future__ import annotations

import itertools
import os
import threading
from collections import Counter
from typing import Any


class RuleViolation(AssertionError):
    """A CUDA rule was broken (a bug in the caller, not in the data)."""


class EmulatedDeviceError(RuntimeError):
    """An injected device failure (the emulated ``CUDARuntimeError``)."""


class EmulatedCaptureError(EmulatedDeviceError):
    """A call CUDA refuses while a stream captures into a graph (the emulated
    ``cudaErrorStreamCaptureUnsupported`` / ``...Invalidated`` /
    ``...Isolation`` / ``...Unjoined``). Not sticky: the device stays usable."""


class Machine:
    """What the devices of one emulated machine share. ``lock`` guards its
    state and that of every region, pool, stream clock and capture on it."""

    def __init__(
        self,
        delay: float,
        faults: dict[str, int] | None,
        link_gbps: float | None,
        register: tuple[float, float] | None = None,
    ) -> None:
        self.delay = float(delay)
        self.link_gbps = link_gbps
        self.register = register  # host_register's cost: (seconds a call, GB/s)
        self.faults = dict(faults or {})
        self.counts: Counter[str] = Counter()
        self.violations: list[str] = []
        self.lock = threading.RLock()
        self.ids = itertools.count(1)  # stream ids
        self.blocks = itertools.count(1)  # pool block ids
        self.completed: dict[int, int] = {}  # stream id -> last seq the host saw complete
        self.local = threading.local()  # .device: the thread's current one; .own: own_pool
        self.devices: list[Any] = []  # its EmulatedDevices, by index
        self.streams: dict[int, Any] = {}  # live EmulatedStreams by id
        self.captures: list[Any] = []  # Captures under way
        self.failures: dict[int, BaseException] = {}  # device index -> its sticky fault
        self.pid = os.getpid()  # a child forked from this process cannot use the device
        self.torch_pool = False  # CuPy allocates from PyTorch's pool (torch_allocator)
        self.contexts: set[int] = set()  # devices with a context (EmulatedDevice.contexts)
        self.host: Any = None  # its HostMemory (made by its first device)

    @property
    def registered(self) -> dict[int, tuple[int, int]]:
        """The ranges ``host_register`` locked, by address."""
        return self.host.registered

    def current_device(self) -> int:
        """The calling thread's current device index (0 unless one was chosen)."""
        return int(getattr(self.local, "device", 0))

    def select(self, index: int) -> None:
        """``cudaSetDevice``: since CUDA 12 it makes the device's context at once."""
        self.local.device = index
        self.contexts.add(index)

    def violation(self, message: str) -> RuleViolation:
        """Record a broken rule; return the error to raise."""
        with self.lock:
            self.violations.append(message)
        return RuleViolation(message)

    def fault(self, kind: str) -> bool:
        """Count an operation of ``kind``; True if it is the one to fail."""
        with self.lock:
            self.counts[kind] += 1
            return self.faults.get(kind) == self.counts[kind]

    def inject(self, kind: str, what: str) -> None:
        """Raise the injected fault of ``kind`` when this operation is the one to fail."""
        if self.fault(kind):
            raise EmulatedDeviceError(f"injected fault: {what} failed")

    def touch(self) -> None:
        """A device call in this thread: CUDA makes its current device's context."""
        self.contexts.add(self.current_device())

    def check_alive(self, index: int) -> None:
        """Every host call on device ``index`` starts here."""
        self.touch()
        if os.getpid() != self.pid:
            raise EmulatedDeviceError(
                "initialization error (cudaErrorInitializationError): CUDA cannot be used in "
                f"process {os.getpid()}, forked from process {self.pid} that used it"
            )
        failure = self.failures.get(index)
        if failure is not None:
            raise EmulatedDeviceError(f"the device failed earlier: {failure}") from failure

    def known(self, stream: Any) -> dict[int, int]:
        """With the lock held: how far each stream's work is ordered before
        work queued on ``stream`` now (its waits, and what the host saw complete)."""
        known = dict(self.completed)
        for s, seq in stream.clock.items():
            known[s] = max(known.get(s, 0), seq)
        return known

    def observed(self, clock: dict[int, int]) -> None:
        """The host saw everything ``clock`` covers complete."""
        with self.lock:
            for s, seq in clock.items():
                self.completed[s] = max(self.completed.get(s, 0), seq)

    def refuse_in_capture(self, what: str) -> None:
        """``what`` is illegal while any capture is under way (CUDA's global
        capture mode): invalidate them all and raise."""
        with self.lock:
            live = list(self.captures)
            for capture in live:
                capture.invalidate(f"{what} while it was under way")
        if live:
            raise EmulatedCaptureError(
                f"{what} while a graph capture is under way on stream {live[0].origin.id} "
                "(illegal in CUDA's global capture mode; the capture is invalidated): do it "
                "before the capture begins or after it ends"
            )
