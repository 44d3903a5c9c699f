"""Memory of the emulated machine: regions whose uses are checked, the
caching pool with its reuse rule, and page-locked host memory."""

from __future__ import annotations

import collections
import contextlib
import ctypes
import time
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..pipeline.plan import STAGING_ALIGN, round_up
from ._machine import EmulatedDeviceError, Machine

# types of the modules above this one (importing them would make a cycle)
_Stream = Any  # an EmulatedStream
_Graph = Any  # an EmulatedGraph
_Device = Any  # an EmulatedDevice
_Array = Any  # a DeviceArray

PAGE = 4096
_BLOCK_ROUND = 512  # PyTorch's caching allocator and CuPy's pool round sizes to 512 bytes


def aligned(nbytes: int, align: int) -> np.ndarray:
    """``nbytes`` of fresh host memory starting on a multiple of ``align``."""
    raw = np.empty(nbytes + align, np.uint8)
    offset = (-raw.ctypes.data) % align
    return raw[offset : offset + nbytes]


class Region:
    """Memory whose uses are checked: one life of a device block, or one pinned
    buffer (so two streams copying into disjoint parts of it at once are
    refused, which CUDA allows: stricter, never looser)."""

    def __init__(
        self,
        name: str,
        kind: str = "pinned",
        stream_id: int = 0,
        graph: _Graph | None = None,
    ) -> None:
        self.name = name
        self.kind = kind  # "pinned", "registered" (host memory page-locked in place) or "device"
        self.last_write: tuple[int, int] | None = None  # (stream id, seq)
        self.reads: dict[int, int] = {}  # stream id -> seq of its last read
        self.host_users = 0
        self.freed = False
        self.stream_id = stream_id  # device: the stream it was allocated on
        self.graph = graph  # device: the graph whose capture allocated it (its private pool)
        self.next_life: Region | None = None  # device: the block's next allocation
        self.started = False  # device: its allocation has run on its stream

    def unordered(self, known: dict[int, int], stream_id: int | None, write: bool) -> int | None:
        """A stream (not ``stream_id``) whose use ``known`` does not order before a new one."""
        uses = [self.last_write] if self.last_write else []
        if write:
            uses += list(self.reads.items())
        for s, seq in uses:
            if s != stream_id and known.get(s, 0) < seq:
                return s
        return None

    def check_use(self, stream: _Stream, write: bool, graph: _Graph | None = None) -> None:
        """With the lock held: may ``stream`` queue a use now (``graph``: in its replay)?"""
        machine = stream.backend.machine
        if self.freed and (graph is None or self.graph is not graph):
            raise machine.violation(f"{self.name} used on stream {stream.id} after it was freed")
        if self.host_users:
            raise machine.violation(
                f"{self.name}: device copy queued on stream {stream.id} while a host thread uses it"
            )
        s = self.unordered(machine.known(stream), stream.id, write)
        if s is not None:
            raise machine.violation(
                f"{self.name} used on stream {stream.id} before that stream was ordered "
                f"after its use on stream {s} (no event waited on)"
            )

    def use(self, stream_id: int, seq: int, write: bool) -> None:
        """With the lock held: record a use queued as ``seq`` on stream ``stream_id``."""
        if write:
            self.last_write, self.reads = (stream_id, seq), {}
        else:
            self.reads[stream_id] = seq

    def check_run(self, machine: Machine, kind: str) -> None:
        """When queued work runs: not freed (pinned), nor handed out again and written."""
        if self.kind != "device" and self.freed:
            raise machine.violation(f"queued {kind} ran on {self.name} after it was freed")
        later = self.next_life
        if later is not None and later.started:
            raise machine.violation(
                f"queued {kind} ran on {self.name} after its block was handed out again "
                f"on stream {later.stream_id} and written there: a use-after-free across "
                "streams"
            )

    def start(self) -> None:
        """Its allocation ran on its stream."""
        self.started = True


class Block:
    """A block of a device's caching pool: its memory outlives each allocation of it."""

    def __init__(self, ident: int, size: int) -> None:
        self.id = ident
        self.size = size
        self.buf = aligned(size, STAGING_ALIGN)
        self.stream: _Stream | None = None  # the stream of its current (or last) allocation
        self.region: Region | None = None  # its current (or last) allocation
        self.recorded: list[_Stream] = []  # record_stream of the current allocation
        self.pending: list[tuple[_Stream, int]] = []  # to reach before it is handed out
        self.graph: _Graph | None = None  # allocated in a capture: kept for the graph


class Allocation:
    """What every view of one allocation holds; its block is freed when the
    last of them is gone (CPython frees at once), or by :meth:`free`."""

    def __init__(self, pool: Pool, block: Block, region: Region, lib: str) -> None:
        self.device = pool.device
        self.block = block
        self.region = region
        self.lib = lib
        self._finalizer = weakref.finalize(self, pool.release, block, region)
        self._finalizer.atexit = False

    def free(self) -> None:
        """Give the block back to the pool now (idempotent)."""
        self._finalizer()


class Pool:
    """A device's caching pool, with PyTorch's and CuPy's rule: a freed block is
    handed out again at once on the stream it was allocated on (machine's lock)."""

    def __init__(self, device: _Device) -> None:
        self.device = device
        self.free: dict[int, list[Block]] = {}  # stream id -> free blocks, oldest first
        # freed blocks not yet on a free list (a finalizer may run in any thread)
        self.frees: collections.deque[tuple[Block, list[tuple[_Stream, int]]]] = collections.deque()
        self.bytes_in_use = 0  # of live allocations (freed: counted out at the next)
        self.peak_bytes_in_use = 0  # the most bytes_in_use seen at an allocation

    def allocate(self, nbytes: int, stream: _Stream, lib: str) -> Allocation:
        """A block of at least ``nbytes`` on ``stream`` (a write there): a freed one
        of that stream when one fits, else a new one."""
        device, machine = self.device, self.device.machine
        machine.check_alive(device.index)
        if stream.backend is not device:
            raise machine.violation(
                f"allocation on device {device.index} ordered on stream {stream.id} of device "
                f"{stream.backend.index}"
            )
        size = max(round_up(nbytes, _BLOCK_ROUND), _BLOCK_ROUND)
        with machine.lock:
            stream.check_queue("alloc")
            capture = stream.capture
            self._drain()
            # in a capture: a new block, kept for the graph (its private pool)
            block = self._reuse(stream, size) if capture is None else None
            if block is None:
                if lib == "cupy" or capture is None:  # PyTorch's graph pool: the capture's own
                    machine.refuse_in_capture(f"cudaMalloc (the {lib} pool growing)")
                block = Block(next(machine.blocks), size)
                machine.counts["device_alloc"] += 1
            self.bytes_in_use += block.size
            self.peak_bytes_in_use = max(self.peak_bytes_in_use, self.bytes_in_use)
            graph = None if capture is None else capture.graph
            name = (
                f"device allocation of {nbytes} bytes (block {block.id} of device {device.index})"
            )
            region = Region(name, "device", stream.id, graph)
            if block.region is not None:
                block.region.next_life = region
            block.region, block.stream, block.recorded, block.pending = region, stream, [], []
            block.graph = graph
            owner = Allocation(self, block, region, lib)
            stream.enqueue("alloc", region.start, writes=[region])
        return owner

    def _reuse(self, stream: _Stream, size: int) -> Block | None:
        """With the lock held: the freed block of ``stream`` for ``size`` bytes (same size
        first, else the smallest; most recently freed first), checked; None if none."""
        blocks = self.free.get(stream.id, [])
        best: int | None = None
        for k in range(len(blocks) - 1, -1, -1):
            block = blocks[k]
            if block.size < size or not self._ready(block):
                continue
            if block.size == size:
                best = k
                break
            if best is None or block.size < blocks[best].size:
                best = k
        if best is None:
            return None
        block, machine = blocks[best], self.device.machine
        assert block.region is not None
        # handing it out is a write on stream, after every use of its previous life
        s = block.region.unordered(machine.known(stream), stream.id, write=True)
        if s is not None:
            raise machine.violation(
                f"block {block.id} of device {self.device.index} reused on stream {stream.id} "
                f"while work queued on stream {s} before its free may still use it: a "
                f"use-after-free across streams (before the array is dropped, make stream "
                f"{stream.id} wait on an event recorded on stream {s} after that work, or "
                f"record_stream it on stream {s})"
            )
        del blocks[best]
        machine.counts["device_reuse"] += 1
        return block

    def _ready(self, block: Block) -> bool:
        """With the lock held: the events of its ``record_stream`` were reached (a
        query the host sees, as PyTorch's allocator makes; none during a capture)."""
        machine = self.device.machine
        if not block.pending:
            return True
        if machine.captures or not all(s.done_with(seq) for s, seq in block.pending):
            return False
        machine.observed({s.id: seq for s, seq in block.pending})
        block.pending = []
        return True

    def release(self, block: Block, region: Region) -> None:
        """The allocation ``region`` of ``block`` is gone (in any thread: it only marks)."""
        if region.freed:
            return
        region.freed = True
        if block.graph is not None:
            return  # the graph keeps its memory: never handed out again
        points = [(s, s.clock[s.id]) for s in block.recorded if s is not block.stream]
        self.frees.append((block, points))

    def record_stream(self, owner: Allocation, stream: _Stream) -> None:
        """:meth:`EmulatedDevice.record_stream`."""
        machine = self.device.machine
        with machine.lock:
            if owner.region.freed:
                raise machine.violation(f"record_stream of {owner.region.name} after it was freed")
            if stream not in owner.block.recorded:
                owner.block.recorded.append(stream)

    def reset_peak(self) -> int:
        """Start measuring ``peak_bytes_in_use`` from now; return the bytes in use."""
        with self.device.machine.lock:
            self._drain()
            self.peak_bytes_in_use = self.bytes_in_use
            return self.bytes_in_use

    def _drain(self) -> None:
        """With the lock held: put the blocks freed since on their free lists."""
        while self.frees:
            block, points = self.frees.popleft()
            self.bytes_in_use -= block.size
            stream = block.stream
            assert stream is not None
            block.pending = points
            if not stream.closed:
                self.free.setdefault(stream.id, []).append(block)

    def clear(self) -> None:
        """With the lock held: forget every free block (the device is closed)."""
        self.free.clear()
        self.frees.clear()


class EmulatedStaging:
    """Device rows for packing, ``stride`` bytes apart (a multiple of 256)."""

    def __init__(self, block: _Array, owner: Allocation, stride: int, stream: _Stream) -> None:
        self.block = block
        self.stride = stride
        self.stream = stream
        self._owner = owner

    def view(self, k: int, like: _Array) -> _Array:
        start = k * self.stride
        row = self.block[start : start + like.nbytes]
        if row.data.ctypes.data % STAGING_ALIGN:
            raise self.block.backend.violation(f"staging row {k} is not 256-byte aligned")
        return row.view(like.dtype).reshape(like.shape)

    def free(self) -> None:
        """Give the block back now (its views must not be used again)."""
        self._owner.free()


class HostMemory:
    """The machine's page-locked memory: ``host_alloc`` buffers, ``host_register`` ranges."""

    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self.buffers: dict[int, np.ndarray] = {}  # live buffers by address
        self.regions: dict[int, Region] = {}  # their regions by address
        self.registered: dict[int, tuple[int, int]] = {}  # address -> its pages [first, end)
        self.locked: dict[int, tuple[np.ndarray, Region]] = {}  # address -> its bytes, region

    def alloc(self, nbytes: int) -> tuple[int, np.ndarray]:
        """``cudaHostAlloc``: a new page-aligned buffer, its address and bytes."""
        machine = self.machine
        machine.refuse_in_capture("cudaHostAlloc (a pinned host allocation)")
        machine.inject("host_alloc", "pinned host allocation")
        array = aligned(nbytes, PAGE)
        ptr = int(array.ctypes.data)
        with machine.lock:
            self.buffers[ptr] = array
            self.regions[ptr] = Region(f"pinned buffer {ptr:#x}")
        return ptr, array

    def free(self, ptr: int) -> None:
        """``cudaFreeHost`` of a buffer of :meth:`alloc`."""
        machine = self.machine
        machine.refuse_in_capture("cudaFreeHost (freeing a pinned host buffer)")
        machine.inject("host_free", f"freeing pinned buffer {ptr:#x}")
        with machine.lock:
            del self.buffers[ptr]
            self.regions.pop(ptr).freed = True

    def register(self, ptr: int, nbytes: int) -> None:
        """``cudaHostRegister``: by whole pages, so a page is registered once; it takes
        the machine's ``register`` cost. DMAs reach ``[ptr, ptr + nbytes)``."""
        machine = self.machine
        machine.refuse_in_capture("cudaHostRegister (page-locking host memory)")
        machine.inject("host_register", "cudaHostRegister")  # counted: the split's tests
        first, end = ptr // PAGE, -(-(ptr + nbytes) // PAGE)
        with machine.lock:
            for lo, hi in self.registered.values():
                if lo < end and first < hi:
                    raise EmulatedDeviceError(
                        f"host memory at {ptr:#x} ({nbytes} bytes) shares a page with a "
                        "registration already made (cudaErrorHostMemoryAlreadyRegistered, 712)"
                    )
            self.registered[ptr] = (first, end)
            raw = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))
            self.locked[ptr] = (raw, Region(f"registered host memory {ptr:#x}", "registered"))
        if machine.register is not None:  # a call, and the driver walks and locks every page
            time.sleep(machine.register[0] + nbytes / (machine.register[1] * 1e9))

    def unregister(self, ptr: int) -> None:
        """``cudaHostUnregister`` of what :meth:`register` locked at ``ptr``."""
        self.machine.refuse_in_capture("cudaHostUnregister (unlocking host memory)")
        self.machine.inject("host_unregister", "cudaHostUnregister")
        with self.machine.lock:
            if self.registered.pop(ptr, None) is None:
                raise EmulatedDeviceError(
                    f"host memory at {ptr:#x} is not registered (cudaErrorHostMemoryNotRegistered)"
                )
            self.locked.pop(ptr)[1].freed = True

    def find(self, ptr: int, nbytes: int) -> tuple[np.ndarray, Region] | None:
        """The bytes ``[ptr, ptr + nbytes)`` of one live buffer or one registration, and
        its region (or None)."""
        with self.machine.lock:
            for base, array in self.buffers.items():
                if base <= ptr and ptr + nbytes <= base + array.nbytes:
                    return array[ptr - base : ptr - base + nbytes], self.regions[base]
            for base, (array, region) in self.locked.items():
                if base <= ptr and ptr + nbytes <= base + array.nbytes:
                    return array[ptr - base : ptr - base + nbytes], region
        return None

    @contextlib.contextmanager
    def access(self, ptr: int) -> Iterator[None]:
        """A host thread's use of a staging slot, after it saw its device copies complete."""
        machine, region = self.machine, self.regions[ptr]
        with machine.lock:
            s = region.unordered(machine.completed, None, write=True)
            if s is not None:
                raise machine.violation(
                    f"{region.name} touched by a host thread before the device copy on "
                    f"stream {s} was seen complete (no event synchronised)"
                )
            region.host_users += 1
        try:
            kind = "drain" if region.last_write and not region.reads else "fill"
            machine.inject(kind, f"a host thread's {kind}")
            yield
        finally:
            with machine.lock:
                region.host_users -= 1
