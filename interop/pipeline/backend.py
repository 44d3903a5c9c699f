"""The small device interface the slot schedule talks to.

Two implementations: :mod:`interop.pipeline.cuda` (CuPy runtime calls on a
real GPU) and the emulated device of :mod:`interop.testing` (streams of the
CPU: worker threads that execute queued copies in order and enforce CUDA's
rules), which plugs in by registering its array types
(:func:`interop.arrays.register_device_type`). The schedule
(:mod:`interop.pipeline.schedule`) is written once against this interface,
for both directions. Its host end is a :class:`HostStage`: a copy into or
out of a host array (:mod:`interop.pipeline.hostcopy`), or a file writer or
reader (:mod:`interop.io`).
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
        """Seconds between ``start`` and this timer, both recorded on one stream
        and reached (after that stream was synchronised)."""


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
        """Make this device the calling thread's current one, for good: in threads
        interop owns, before any device call there (CUDA makes a context on a
        thread's current device, 0 unless chosen; restoring one makes it too)."""

    def own_pool(self) -> AbstractContextManager[Any]:
        """Inside the block, the device library's allocations in this thread come
        from its own pool, never from an allocator the user installed (interop's
        temporaries: they are ordered on the stream they are made on, whatever
        the other library's current stream is in this thread)."""

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

    def is_pinned(self, ptr: int, nbytes: int) -> bool:
        """True if the host bytes ``[ptr, ptr + nbytes)`` are page-locked memory
        this device can DMA to and from (a copy then needs no staging)."""

    def host_access(self, ring: Any, k: int) -> AbstractContextManager[Any]:
        """Bracket a host thread's access to slot ``k`` of ``ring``."""

    def staging(self, count: int, row_bytes: int) -> Staging:
        """``count`` device rows of at least ``row_bytes``, each starting on a
        256-byte boundary, from a pool ordered on the calling thread's current
        stream (``Staging.stream``): another stream must wait for an event
        recorded there before it uses them."""

    def is_contiguous(self, view: Any) -> bool:
        """True if the device array is C-contiguous (one DMA copies it)."""

    def copy_to_host(self, dst: int, src: Any, nbytes: int, s: Any) -> None:
        """Queue a DMA of the contiguous device array ``src`` to the page-locked
        host address ``dst`` (a staging slot, or a pinned destination)."""

    def copy_to_device(self, dst: Any, src: int, nbytes: int, s: Any) -> None:
        """Queue a DMA from the page-locked host address ``src`` into the
        contiguous device array ``dst``."""

    def copy_on_device(self, dst: Any, src: Any, s: Any) -> None:
        """Queue an element-wise copy between device arrays of one shape and dtype."""

    def is_capturing(self, stream: Any) -> bool:
        """True while ``stream`` is capturing work into a CUDA graph
        (``cudaStreamIsCapturing``: a capture begun on it, or one it joined by
        waiting on an event recorded in it; invalidated or not, until it ends).

        Work queued on such a stream is recorded, not run, and calls that need
        the host (synchronising a stream or an event, querying an event,
        allocating or freeing pinned memory) are illegal while any capture is
        under way: they fail and invalidate the capture. A caller that needs
        them checks first and refuses before queuing anything.
        """

    def capture_under_way(self, stream: Any) -> bool:
        """True if a capture is under way that a host call now (a pinned
        allocation or free, a synchronisation, an event query) would break:
        one on ``stream`` (if not None), or wherever this device can tell."""

    def capture_forbids_allocation(self) -> bool:
        """True if a new array of :meth:`empty` now could break a capture under
        way (a pool growing with ``cudaMalloc``, which CUDA's global capture
        mode forbids)."""

    def source(self, x: Any, dtype: np.dtype | None = None) -> DeviceData:
        """Device array ``x`` as a transfer's source, described in the caller's
        thread: its stream is the producing library's current stream now.
        With ``dtype`` (another floating dtype), its chunks are cast into
        chunk-sized temporaries on that stream (``DeviceChunk.produced_on``)."""

    def target(self, out: Any, func: str) -> DeviceData:
        """Device array ``out`` as a transfer's destination (its stream: the
        consuming library's current stream now); refuses what cannot be written."""


class HostStage(Protocol):
    """The host end of a chunked copy: moves chunk ``i`` of a plan between a
    host buffer holding its bytes in C order (a staging slot) and where it
    lives on the host (an array, a file)."""

    def pieces(self, plan: Plan, i: int, threads: int) -> Sequence[Any]:
        """Chunk ``i``'s host work as at most ``threads`` independent pieces."""

    def run(self, plan: Plan, i: int, piece: Any, buf: np.ndarray | None) -> None:
        """Do ``piece`` of chunk ``i`` with ``buf``, the chunk's bytes in its
        slot; ``buf`` None: host to host, the stage moves the chunk itself."""
