"""Memory of the emulated device: allocations, blocks and staging rows."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import numpy as np

from ..pipeline.plan import STAGING_ALIGN

if TYPE_CHECKING:
    from ._capture import EmulatedGraph
    from ._device import DeviceArray, EmulatedDevice
    from ._streams import EmulatedStream

_PAGE = 4096
_BLOCK_ROUND = 512  # PyTorch's caching allocator and CuPy's pool round sizes to 512 bytes


class _Region:
    """Memory whose uses are checked: one life of a device block (from its
    allocation to its free), or one pinned buffer (a staging slot, or
    page-locked memory a caller copies to or from).

    A pinned buffer is one region: two streams copying into disjoint parts
    of it at once are refused, which CUDA allows; it is stricter, never looser.
    """

    def __init__(
        self,
        name: str,
        kind: str = "pinned",
        stream_id: int = 0,
        graph: EmulatedGraph | None = None,
    ) -> None:
        self.name = name
        self.kind = kind  # "pinned" or "device"
        self.last_write: tuple[int, int] | None = None  # (stream id, seq)
        self.reads: dict[int, int] = {}  # stream id -> seq of its last read
        self.host_users = 0
        self.freed = False
        self.stream_id = stream_id  # device: the stream it was allocated on
        self.graph = graph  # device: the graph whose capture allocated it (its private pool)
        self.next_life: _Region | None = None  # device: the block's next allocation
        self.started = False  # device: its allocation has run on its stream


def _aligned(nbytes: int, align: int) -> np.ndarray:
    raw = np.empty(nbytes + align, np.uint8)
    offset = (-raw.ctypes.data) % align
    return raw[offset : offset + nbytes]


class _Block:
    """A block of a device's caching pool: its memory outlives each allocation of it."""

    def __init__(self, ident: int, size: int) -> None:
        self.id = ident
        self.size = size
        self.buf = _aligned(size, STAGING_ALIGN)
        self.stream: EmulatedStream | None = None  # the stream of its current (or last) allocation
        self.region: _Region | None = None  # its current (or last) allocation
        self.recorded: list[EmulatedStream] = []  # record_stream of the current allocation
        self.pending: list[tuple[EmulatedStream, int]] = []  # to reach before it is handed out
        self.graph: EmulatedGraph | None = None  # allocated in a capture: kept for the graph


class _Allocation:
    """What every view of one allocation holds; its block is freed when the
    last of them is gone (CPython frees at once), or by :meth:`free`."""

    def __init__(self, device: EmulatedDevice, block: _Block, region: _Region, lib: str) -> None:
        self.device = device
        self.block = block
        self.region = region
        self.lib = lib
        self._finalizer = weakref.finalize(self, device._release, block, region)
        self._finalizer.atexit = False

    def free(self) -> None:
        """Give the block back to the pool now (idempotent)."""
        self._finalizer()


class EmulatedStaging:
    """Device rows for packing, ``stride`` bytes apart (a multiple of 256)."""

    def __init__(self, block: DeviceArray, stride: int, stream: EmulatedStream) -> None:
        self.block = block
        self.stride = stride
        self.stream = stream

    def view(self, k: int, like: DeviceArray) -> DeviceArray:
        start = k * self.stride
        row = self.block[start : start + like.nbytes]
        if row.data.ctypes.data % STAGING_ALIGN:
            raise self.block.backend.violation(f"staging row {k} is not 256-byte aligned")
        return row.view(like.dtype).reshape(like.shape)

    def free(self) -> None:
        """Give the block back to the pool on its stream now, whatever views
        of it are still alive (they must not be used again)."""
        self.block._owner.free()


def _started(region: _Region) -> None:
    region.started = True
