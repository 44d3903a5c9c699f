"""What the devices of one emulated machine share, and the errors it raises."""

from __future__ import annotations

import itertools
import os
import threading
from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ._capture import _Capture
    from ._device import EmulatedDevice
    from ._memory import _Region


class RuleViolation(AssertionError):
    """A CUDA rule was broken (a bug in the caller, not in the data)."""


class EmulatedDeviceError(RuntimeError):
    """An injected device failure (the emulated ``CUDARuntimeError``)."""


class EmulatedCaptureError(EmulatedDeviceError):
    """A call CUDA refuses while a stream captures into a graph (the emulated
    ``cudaErrorStreamCaptureUnsupported`` / ``...Invalidated`` /
    ``...Isolation`` / ``...Unjoined``). Not sticky: the device stays usable."""


class _Machine:
    """What the devices of one emulated machine share: host memory (pinned
    buffers serve every device), the stream ids and what the host saw
    complete, the current device of each thread, and the captures under way."""

    def __init__(self, delay: float, faults: dict[str, int] | None) -> None:
        self.delay = float(delay)
        self.link_gbps: float | None = None
        self.faults = dict(faults or {})
        self.counts: Counter[str] = Counter()
        self.violations: list[str] = []
        self.host_buffers: dict[int, np.ndarray] = {}
        self.slots: dict[int, _Region] = {}
        self.lock = threading.RLock()
        self.ids = itertools.count(1)
        self.blocks = itertools.count(1)
        self.completed: dict[int, int] = {}  # stream id -> last seq the host saw complete
        self.local = threading.local()  # .device: the thread's current device
        self.devices: list[EmulatedDevice] = []
        self.captures: list[_Capture] = []
        self.registered: dict[int, tuple[int, int]] = {}  # host_register: address -> pages
        self.pid = os.getpid()  # a child forked from this process cannot use the device
        self.torch_pool = False  # CuPy allocates from PyTorch's pool (torch_allocator)
        self.contexts: set[int] = set()  # devices with a context (see EmulatedDevice.contexts)

    def current_device(self) -> int:
        return int(getattr(self.local, "device", 0))

    def select(self, index: int) -> None:
        """``cudaSetDevice``: since CUDA 12 it makes the device's context at once."""
        self.local.device = index
        self.contexts.add(index)
