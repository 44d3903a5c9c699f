"""The device interface the slot schedule talks to, and the host end of a copy.

Implemented by :mod:`interop.pipeline.cuda` and by the emulated device of
:mod:`interop.testing`; docs/pipeline.md describes both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

if TYPE_CHECKING:
    from .plan import Plan

__all__ = [
    "Backend",
    "DeviceChunk",
    "DeviceData",
    "Event",
    "HostStage",
    "Staging",
    "Stream",
    "Timer",
]


class Stream(Protocol):
    """An in-order queue of device work."""

    @property
    def legacy(self) -> bool:
        """True for the legacy default stream (CUDA's 0 or 1): it joins no capture."""

    def wait(self, event: Any) -> None:
        """Work queued on this stream from now on starts after ``event``."""

    def synchronize(self) -> None:
        """Block the calling thread until every queued operation has completed."""

    def same(self, other: Any) -> bool:
        """True if ``other`` names this stream (of this device)."""

    def close(self) -> None:
        """Release an owned stream (after :meth:`synchronize`); no-op for a reference."""


class Event(Protocol):
    """A point in a stream's work; waited on by streams or by the host."""

    def record(self, stream: Any) -> None:
        """Mark the current end of ``stream``'s queue."""

    def synchronize(self) -> None:
        """Block the calling thread (without spinning) until the recorded point is reached."""


class Timer(Protocol):
    """A timing event: a point in a stream's work whose time can be read."""

    def record(self, stream: Any) -> None:
        """Mark the current end of ``stream``'s queue."""

    def seconds_since(self, start: Any) -> float:
        """Seconds from ``start`` to this timer, both reached on one synchronised stream."""


class Staging(Protocol):
    """Device rows for packing non-contiguous chunks, one per slot."""

    stream: Any  # the stream the rows were allocated on (from a stream-ordered pool)

    def view(self, k: int, like: Any) -> Any:
        """Row ``k`` as a C-contiguous device array of ``like``'s shape and dtype."""

    def free(self) -> None:
        """Give the rows back (after the copy stream was synchronised)."""


class DeviceChunk(NamedTuple):
    """One chunk of device data as the schedule copies it."""

    view: Any  # a device array of the chunk, in a dtype the backend copies (bit view)
    produced_on: Any = None  # a Stream  # made just now on this stream: copy after it


class DeviceData(NamedTuple):
    """Device data seen by a transfer (described in the caller's thread)."""

    stream: Any  # a Stream: the owning library's current stream at the call (not owned)
    shape: tuple[int, ...]
    dtype: np.dtype  # NumPy (or ml_dtypes) dtype of its values
    chunk: Callable[[tuple], DeviceChunk]  # the chunk for an index tuple of the plan


class Backend(Protocol):
    """What the slot schedule needs from a device."""

    ring_key: Any  # staging rings are cached per key (CUDA: portable pinned memory)

    def activate(self) -> AbstractContextManager[Any]:
        """Make this device current for the calling thread."""

    def use(self) -> None:
        """Make this device current for good, in a thread interop owns, before any device call."""

    def own_pool(self) -> AbstractContextManager[Any]:
        """Inside the block, allocate from the device library's own pool, not the user's."""

    def peer(self, index: int | None) -> Backend:
        """Device ``index`` of this kind (None: the calling thread's current one)."""

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A new uninitialised array on this device (a transfer's result)."""

    def stream(self) -> Stream:
        """A new non-blocking stream, owned by the caller."""

    def event(self) -> Event:
        """A new event whose host synchronisation blocks instead of spinning."""

    def timer(self) -> Timer:
        """A new timing event (used only when a transfer is traced)."""

    def host_alloc(self, nbytes: int) -> tuple[int, np.ndarray]:
        """A page-locked host buffer: its address and a ``uint8`` view."""

    def host_free(self, ptr: int) -> None:
        """Free a buffer of :meth:`host_alloc`."""

    def host_register(self, ptr: int, nbytes: int) -> None:
        """Page-lock host bytes ``[ptr, ptr + nbytes)`` in place for every device
        (``cudaHostRegister``: whole pages, none registered twice)."""

    def host_unregister(self, ptr: int) -> None:
        """Undo :meth:`host_register` at ``ptr``."""

    def is_pinned(self, ptr: int, nbytes: int) -> bool:
        """True if host bytes ``[ptr, ptr + nbytes)`` are page-locked memory this device DMAs."""

    def host_access(self, ring: Any, k: int) -> AbstractContextManager[Any]:
        """Bracket a host thread's access to slot ``k`` of ``ring``."""

    def staging(self, count: int, row_bytes: int) -> Staging:
        """``count`` 256-byte-aligned device rows from a pool on the current stream."""

    def is_contiguous(self, view: Any) -> bool:
        """True if the device array is C-contiguous (one DMA copies it)."""

    def copy_to_host(self, dst: int, src: Any, nbytes: int, s: Any) -> None:
        """Queue a DMA of contiguous device ``src`` to page-locked host address ``dst``."""

    def copy_to_device(self, dst: Any, src: int, nbytes: int, s: Any) -> None:
        """Queue a DMA from page-locked host address ``src`` into contiguous device ``dst``."""

    def copy_on_device(self, dst: Any, src: Any, s: Any) -> None:
        """Queue an element-wise copy between device arrays of one shape and dtype."""

    def is_capturing(self, stream: Any) -> bool:
        """True while ``stream`` captures into a CUDA graph (``cudaStreamIsCapturing``)."""

    def capture_under_way(self, stream: Any) -> bool:
        """True if a capture (on ``stream``, or any this device sees) forbids host calls now."""

    def capture_forbids_allocation(self) -> bool:
        """True if a new array of :meth:`empty` now could break a capture under way."""

    def source(self, x: Any, dtype: np.dtype | None = None) -> DeviceData:
        """Device array ``x`` as a transfer's source (chunks cast to ``dtype`` if given)."""

    def target(self, out: Any, func: str) -> DeviceData:
        """Device array ``out`` as a transfer's destination; refuses what cannot be written."""


class HostStage(Protocol):
    """The host end of a chunked copy: moves chunk ``i`` between a slot and the host."""

    def pieces(self, plan: Plan, i: int, threads: int) -> Sequence[Any]:
        """Chunk ``i``'s host work as at most ``threads`` independent pieces."""

    def run(self, plan: Plan, i: int, piece: Any, buf: np.ndarray | None) -> None:
        """Do ``piece`` of chunk ``i`` with ``buf``, its slot's bytes (None: host to host)."""
