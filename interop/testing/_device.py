"""The emulated device: the pipeline's Backend interface over the machine,
the pool, the streams and capture, and the device arrays it hands out."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from .. import dtypes
from ..allocator import StreamMismatchError
from ..arrays import register_device_type
from ..errors import InvalidValueError
from ..pipeline.backend import DeviceChunk, DeviceData
from ..pipeline.plan import STAGING_ALIGN, round_up
from ..streams import capturing
from ._capture import EmulatedGraph, graph_capture
from ._machine import Machine, RuleViolation
from ._memory import Allocation, EmulatedStaging, HostMemory, Pool
from ._streams import EmulatedEvent, EmulatedStream, EmulatedTimer

__all__ = ["DeviceArray", "EmulatedDevice", "InvertedArray"]

_LIBS = ("torch", "cupy")


def _check_lib(lib: str) -> str:
    """``lib`` if it names a device library."""
    if lib not in _LIBS:
        raise ValueError(f"expected lib 'torch' or 'cupy' (got {lib!r})")
    return lib


class EmulatedDevice:
    """An emulated device: streams, events, memory and copies on the CPU.

    ``EmulatedDevice()`` is a machine with one device (index 0);
    ``EmulatedDevice(devices=2)`` returns device 0 of a machine with two, the
    other reached with :meth:`peer`. The devices share the machine's pinned
    host memory, its ``counts``, ``violations`` and ``faults``; each has its
    own streams, events, memory pool and current streams.

    Parameters
    ----------
    delay : float
        Seconds each stream waits before executing an operation, to widen
        the windows in which a missing synchronisation shows.
    faults : dict, optional
        Operation kind -> the count at which it fails: ``"copy"`` (a DMA),
        ``"pack"`` (a device element-wise copy), ``"staging"`` (device staging
        allocation), ``"host_alloc"``, ``"host_free"``, ``"host_register"``,
        ``"host_unregister"``, ``"fill"`` / ``"drain"`` (a host thread's access to
        a slot, host-to-device / device-to-host),
        ``"timer_read"`` (reading a timing event; not sticky). A fault in
        device work is sticky, as CUDA's asynchronous errors are: every later
        call on that device fails.
    devices : int
        How many devices the machine has (default 1).
    link_gbps : float, optional
        Emulate a link of this many GB/s: each DMA takes at least its bytes
        at that rate (the stream's worker waits out the rest). With the host
        copies running at the machine's own speed, a transfer's overlap of
        DMA and host copies can then be measured as a ratio on a CPU.
    register : tuple of float, optional
        ``(seconds, gbps)``: each ``host_register`` takes ``seconds`` and its bytes
        at ``gbps`` GB/s (default: no time). A DMA into registered memory counts
        as ``"registered_copy"``.

    Attributes
    ----------
    index : int
        This device's index on its machine.
    counts : collections.Counter
        Operations by kind; the pool adds ``"device_alloc"`` (a new block)
        and ``"device_reuse"`` (a freed block handed out again).
    violations : list of str
        Every rule broken so far, on any device of the machine.
    """

    def __init__(
        self,
        *,
        delay: float = 0.0,
        faults: dict[str, int] | None = None,
        devices: int = 1,
        link_gbps: float | None = None,
        register: tuple[float, float] | None = None,
    ) -> None:
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
            raise ValueError(f"EmulatedDevice expected devices >= 1 (got {devices!r})")
        if link_gbps is not None and not link_gbps > 0:
            raise ValueError(f"EmulatedDevice expected link_gbps > 0 (got {link_gbps!r})")
        if register is not None and not (register[0] >= 0 and register[1] > 0):
            raise ValueError(f"EmulatedDevice expected register=(s, GB/s > 0) (got {register!r})")
        machine = Machine(delay, faults, link_gbps, register)
        machine.host = HostMemory(machine)
        self._attach(machine, 0)
        for index in range(1, devices):
            object.__new__(EmulatedDevice)._attach(machine, index)

    def _attach(self, machine: Machine, index: int) -> None:
        self.machine = machine
        self.index = index
        machine.devices.append(self)
        self.ring_key: Any = machine  # pinned memory is portable: one ring cache per machine
        self.delay = machine.delay
        self.faults = machine.faults
        self.counts = machine.counts
        self.violations = machine.violations
        self.host_buffers = machine.host.buffers  # live pinned buffers by address
        self.pool = Pool(self)
        self._local = threading.local()  # .streams: lib -> the thread's current stream here
        self.default_stream = EmulatedStream(self)

    # -- the machine
    def peer(self, index: int | None) -> EmulatedDevice:
        """Device ``index`` of this machine (None: the calling thread's current one)."""
        devices = self.machine.devices
        if index is None:
            index = self.machine.current_device()
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(devices):
            raise ValueError(f"expected a device index in [0, {len(devices)}) (got {index!r})")
        return devices[index]

    @property
    def devices(self) -> tuple[EmulatedDevice, ...]:
        """Every device of this machine, by index."""
        return tuple(self.machine.devices)

    def current_device(self) -> int:
        """The calling thread's current device index (0 unless activated)."""
        return self.machine.current_device()

    @property
    def contexts(self) -> set[int]:
        """The devices with a context: made current once, or current in a thread
        that made a device call (CUDA makes the current device's context then)."""
        return set(self.machine.contexts)

    def violation(self, message: str) -> RuleViolation:
        return self.machine.violation(message)

    @property
    def _streams(self) -> list[EmulatedStream]:  # live, oldest first
        return [s for s in self.machine.streams.values() if s.backend is self]

    # -- the Backend interface
    @contextlib.contextmanager
    def activate(self) -> Iterator[EmulatedDevice]:
        """Make this device the calling thread's current one inside the block."""
        machine = self.machine
        previous = machine.current_device()
        machine.select(self.index)
        try:
            yield self
        finally:
            machine.select(previous)

    def use(self) -> None:
        """Make this device the calling thread's current device, for good."""
        self.machine.select(self.index)

    def stream(self) -> EmulatedStream:
        self.machine.check_alive(self.index)
        return EmulatedStream(self)

    def event(self) -> EmulatedEvent:
        with self.machine.lock:
            self.counts["event"] += 1  # for tests: how many events a call made
        return EmulatedEvent(self)

    def timer(self) -> EmulatedTimer:
        return EmulatedTimer(self)

    def host_alloc(self, nbytes: int) -> tuple[int, np.ndarray]:
        self.machine.check_alive(self.index)
        return self.machine.host.alloc(nbytes)

    def host_free(self, ptr: int) -> None:
        self.machine.check_alive(self.index)
        self.machine.host.free(ptr)

    def host_register(self, ptr: int, nbytes: int) -> None:
        """Page-lock host memory in place (``cudaHostRegister``, by whole pages)."""
        self.machine.check_alive(self.index)
        self.machine.host.register(ptr, nbytes)

    def host_unregister(self, ptr: int) -> None:
        """Unlock what :meth:`host_register` locked at ``ptr`` (``cudaHostUnregister``)."""
        self.machine.check_alive(self.index)
        self.machine.host.unregister(ptr)

    def host_access(self, ring: Any, k: int) -> AbstractContextManager[None]:
        return self.machine.host.access(ring.ptrs[k])

    def is_pinned(self, ptr: int, nbytes: int) -> bool:  # inside one live host_alloc buffer
        return nbytes > 0 and self.machine.host.find(ptr, nbytes) is not None

    def staging(self, count: int, row_bytes: int) -> EmulatedStaging:
        """Rows from the pool on CuPy's current stream (CUDA's: from CuPy's pool)."""
        self.machine.inject("staging", "device staging allocation")
        stride = round_up(row_bytes, STAGING_ALIGN)
        stream = self.current_stream("cupy")
        block = self._array((count * stride,), np.uint8, "cupy", stream)
        return EmulatedStaging(block, block._owner, stride, stream)

    def is_contiguous(self, view: DeviceArray) -> bool:
        return bool(view.data.flags.c_contiguous)

    def copy_to_host(self, dst: int, src: DeviceArray, nbytes: int, s: EmulatedStream) -> None:
        self._dma(src, dst, nbytes, s, to_host=True)

    def copy_to_device(self, dst: DeviceArray, src: int, nbytes: int, s: EmulatedStream) -> None:
        self._dma(dst, src, nbytes, s, to_host=False)

    def _dma(
        self, view: DeviceArray, ptr: int, nbytes: int, s: EmulatedStream, to_host: bool
    ) -> None:
        """Queue a DMA between ``view`` and pinned ``ptr`` (at least the link's time)."""
        if not view.data.flags.c_contiguous or view.nbytes != nbytes:
            raise self.violation(
                f"DMA of {nbytes} bytes for a device array of {view.nbytes} bytes "
                f"(C-contiguous: {view.data.flags.c_contiguous})"
            )
        pinned = self.machine.host.find(ptr, nbytes)
        if pinned is None:
            raise self.violation(
                f"DMA of {nbytes} bytes at host address {ptr:#x}, which is not inside one live "
                "page-locked buffer (freed, pageable, or past the buffer's end)"
            )
        host, region = pinned
        if region.kind == "registered":
            with self.machine.lock:
                self.counts["registered_copy"] += 1
        device = view.data.reshape(-1).view(np.uint8)
        dst, src = (host, device) if to_host else (device, host)
        gbps = self.machine.link_gbps

        def dma() -> None:
            start = time.perf_counter()
            np.copyto(dst, src)
            rest = 0.0 if gbps is None else nbytes / (gbps * 1e9) - (time.perf_counter() - start)
            if rest > 0:
                time.sleep(rest)

        reads, writes = ([view.region], [region]) if to_host else ([region], [view.region])
        s.enqueue("copy", dma, reads, writes)

    def copy_on_device(self, dst: DeviceArray, src: DeviceArray, s: EmulatedStream) -> None:
        """Queue ``dst[...] = src`` on ``s``; ``src`` on another device is first
        read whole into a temporary on ``s``, as the CUDA backend does."""
        if dst.shape != src.shape or dst.dtype != src.dtype:
            raise self.violation(
                f"device copy between {src.shape} {src.dtype} and {dst.shape} {dst.dtype}"
            )
        for view in (dst, src):
            align = view.dtype.itemsize
            misaligned = view.data.ctypes.data % align or any(
                st % align for st, n in zip(view.strides, view.shape, strict=True) if n > 1
            )
            if view.size and misaligned:
                raise self.violation(
                    f"misaligned {view.dtype} access at {view.data.ctypes.data:#x} with strides "
                    f"{view.strides} (the GPU faults with cudaErrorMisalignedAddress)"
                )
        if dst.backend is not s.backend:
            raise self.violation(
                f"device copy into an array of device {dst.backend.index} queued on stream "
                f"{s.id} of device {s.backend.index} (queue it on a stream of the array's device)"
            )
        if src.backend is not dst.backend:
            if not dst.size:
                return
            with self.machine.lock:  # refused before its temporary is allocated
                s.check_queue("peer")
                src.region.check_use(s, write=False)
            src = s.backend._peer_copy(src, s)
        d, v = dst.data, src.data
        s.enqueue("pack", lambda: np.copyto(d, v), reads=[src.region], writes=[dst.region])

    def _peer_copy(self, src: DeviceArray, s: EmulatedStream) -> DeviceArray:
        """``src`` of another device in a temporary here (one peer read on ``s``)."""
        lo, span = _byte_extent(src.shape, src.strides, src.dtype.itemsize)
        temp = self._array((span,), np.uint8, "cupy", s)  # CuPy's own pool, on s
        block = src._owner.block
        start = src.data.ctypes.data + lo - block.buf.ctypes.data
        raw, into = block.buf[start : start + span], temp.data
        s.enqueue("peer", lambda: np.copyto(into, raw), reads=[src.region], writes=[temp.region])
        view = np.ndarray(src.shape, src.dtype, buffer=into, offset=-lo, strides=src.strides)
        return DeviceArray(temp._owner, view)

    def is_capturing(self, stream: EmulatedStream) -> bool:
        """:meth:`EmulatedStream.is_capturing` read as the CUDA backend reads CuPy's."""
        return capturing(stream.is_capturing)

    def capture_under_way(self, stream: EmulatedStream | None) -> bool:
        """``stream`` captures, or any capture is under way on the machine."""
        return (stream is not None and self.is_capturing(stream)) or bool(self.machine.captures)

    def capture_forbids_allocation(self) -> bool:
        """Any capture is under way: :meth:`empty` (CuPy's pool) may not grow."""
        return bool(self.machine.captures)

    # -- device memory and data, for callers and tests
    def current_stream(self, lib: str = "cupy") -> EmulatedStream:
        """The calling thread's current stream of ``lib`` (default: the default stream)."""
        streams = getattr(self._local, "streams", None) or {}
        return streams.get(_check_lib(lib)) or self.default_stream

    @contextlib.contextmanager
    def use_stream(
        self, stream: EmulatedStream, lib: str | None = None
    ) -> Iterator[EmulatedStream]:
        """Make ``stream`` current for ``lib`` in the block (None: both, as ``interop.stream``)."""
        libs = _LIBS if lib is None else (_check_lib(lib),)
        if stream.backend is not self:
            raise self.violation(
                f"use_stream of device {self.index} given stream {stream.id} of device "
                f"{stream.backend.index} (use that device's use_stream)"
            )
        streams = getattr(self._local, "streams", None)
        if streams is None:
            streams = self._local.streams = {}
        previous = {name: streams.get(name) for name in libs}
        streams.update(dict.fromkeys(libs, stream))
        try:
            yield stream
        finally:
            streams.update(previous)

    def empty(self, shape: tuple[int, ...], dtype: Any, lib: str = "cupy") -> DeviceArray:
        """Uninitialised device memory of ``lib`` (256-byte aligned), from the pool on
        its current stream: using it on another stream needs an event."""
        return self._array(shape, dtype, lib, self._pool_stream(lib))

    def _pool_stream(self, lib: str) -> EmulatedStream:
        """``lib``'s current stream, which must be PyTorch's under :meth:`torch_allocator`."""
        stream = self.current_stream(lib)
        machine = self.machine
        if lib == "cupy" and machine.torch_pool and not getattr(machine.local, "own", False):
            torch = self.current_stream("torch")
            if torch is not stream:
                raise StreamMismatchError(
                    f"expected CuPy and PyTorch to share the current stream on device "
                    f"{self.index} while CuPy allocates from PyTorch's pool (got CuPy stream "
                    f"{stream.id}, PyTorch stream {torch.id})"
                )
        return stream

    @contextlib.contextmanager
    def torch_allocator(self) -> Iterator[None]:
        """CuPy allocates from PyTorch's pool in the block, machine-wide, as under
        ``interop.use_torch_allocator()``: refused where their streams differ."""
        self.machine.torch_pool = True
        try:
            yield
        finally:
            self.machine.torch_pool = False

    @contextlib.contextmanager
    def own_pool(self) -> Iterator[None]:
        """CuPy's allocations in this thread come from its own pool in the block."""
        local = self.machine.local
        previous = getattr(local, "own", False)
        local.own = True
        try:
            yield
        finally:
            local.own = previous

    def asarray(self, host: np.ndarray, lib: str = "cupy") -> DeviceArray:
        """A device copy of ``host`` (its shape, 0-d included, and dtype, byte order
        included), written on ``lib``'s current stream."""
        host = np.array(host, order="C", copy=True)  # ascontiguousarray would make 0-d 1-d
        stream = self._pool_stream(lib)
        out = self._array(host.shape, host.dtype, lib, stream)
        data = out.data
        stream.enqueue("upload", lambda: np.copyto(data, host), writes=[out.region])
        return out

    def inverted(self, x: DeviceArray) -> InvertedArray:
        """``x`` lazily inverted (see :class:`InvertedArray`)."""
        if not isinstance(x, DeviceArray):
            raise TypeError(f"inverted expected a DeviceArray (got {type(x).__name__})")
        return InvertedArray(x)

    def record_stream(self, x: DeviceArray, stream: EmulatedStream) -> None:
        """``Tensor.record_stream``: ``x``'s block, once freed, is not handed out
        again before ``stream`` finished the work queued on it by then."""
        self.pool.record_stream(x._owner, stream)

    bytes_in_use = property(lambda self: self.pool.bytes_in_use)
    peak_bytes_in_use = property(lambda self: self.pool.peak_bytes_in_use)

    def reset_peak(self) -> int:
        """Start measuring ``peak_bytes_in_use`` from now; return the bytes in use."""
        return self.pool.reset_peak()

    def synchronize(self) -> None:
        """Wait for every stream of this device (``cudaDeviceSynchronize``)."""
        self.machine.refuse_in_capture("cudaDeviceSynchronize")
        with self.machine.lock:
            streams = self._streams
        for s in streams:
            s.synchronize()

    def to_numpy(self, x: DeviceArray) -> np.ndarray:
        """A host copy of ``x`` after a synchronisation of its device."""
        x.backend.synchronize()
        return x.data.copy()

    def source(self, x: DeviceArray | InvertedArray, dtype: Any = None) -> DeviceData:
        """``x`` as a transfer's source; with ``dtype`` (or inverted) each chunk
        is made into a temporary from the pool on the producer's stream."""
        base = x.base if isinstance(x, InvertedArray) else x
        cast = None if dtype is None or np.dtype(dtype) == base.dtype else np.dtype(dtype)
        producer = self.current_stream(base.lib)
        if cast is None and not isinstance(x, InvertedArray):
            bits = dtypes.int_view_of_numpy(x.dtype)
            view = x if bits == x.dtype else x.view(bits)
            return DeviceData(producer, x.shape, x.dtype, lambda idx: DeviceChunk(view[idx]))
        inverted = isinstance(x, InvertedArray)
        out_dtype = base.dtype if cast is None else cast
        bits = dtypes.int_view_of_numpy(base.dtype)
        out_bits = dtypes.int_view_of_numpy(out_dtype)

        def chunk(idx: tuple) -> DeviceChunk:
            # a chunk-sized temporary with the transform applied, made on the producer stream
            part = base[idx]
            with self.use_stream(producer, base.lib):  # as CuPy's astype allocates: there
                temp = self.empty(part.shape, out_dtype, base.lib)
            into, values = temp.data, part.data

            def materialise() -> None:
                if not inverted:
                    np.copyto(into, values, casting="unsafe")
                elif cast is None:
                    _invert(into.view(bits), values.view(bits))
                else:
                    flipped = np.empty_like(values)
                    _invert(flipped.view(bits), values.view(bits))
                    np.copyto(into, flipped, casting="unsafe")

            kind = "invert" if inverted else "cast"
            producer.enqueue(kind, materialise, reads=[part.region], writes=[temp.region])
            return DeviceChunk(temp if out_bits == temp.dtype else temp.view(out_bits), producer)

        return DeviceData(producer, base.shape, out_dtype, chunk)

    def target(self, x: DeviceArray | InvertedArray, func: str = "") -> DeviceData:
        """``x`` as a transfer's destination (never an :class:`InvertedArray`)."""
        if isinstance(x, InvertedArray):
            raise InvalidValueError(
                f"{func or 'a transfer'} expected an out that is not lazily inverted (writes "
                "through such a view would be transformed); write into its base array"
            )
        return self.source(x)

    def capture(self, stream: EmulatedStream) -> AbstractContextManager[EmulatedGraph]:
        """``with backend.capture(stream) as graph:`` captures into ``graph``.

        Work queued on ``stream`` (and on every stream that joins the capture by
        waiting on an event recorded in it) is recorded, not run; its memory
        rules are checked when it is queued. Illegal while a capture is under
        way, raising :class:`EmulatedCaptureError` and invalidating every
        capture: synchronising a capturing stream, :meth:`synchronize`,
        synchronising or querying any event, ``host_alloc`` / ``host_free``, a
        new block from the pool (but PyTorch's on a capturing stream), a
        capturing stream waiting on an event recorded outside its capture, and
        the legacy stream waiting on one recorded in it. Leaving the block
        raises it too when the capture was invalidated or a stream that joined
        it was not joined back; otherwise ``graph.replay()`` queues the work.
        """
        return graph_capture(self, stream)

    def close(self) -> None:
        """Stop every stream's worker of the machine (after its queued work ran)."""
        for device in self.machine.devices:
            with self.machine.lock:
                streams = device._streams
            for s in streams:
                s.stop()
            with self.machine.lock:
                device.pool.clear()

    def _array(self, shape: Any, dtype: Any, lib: str, stream: EmulatedStream) -> DeviceArray:
        dtype = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        owner = self.pool.allocate(n, stream, _check_lib(lib))
        return DeviceArray(owner, owner.block.buf[:n].view(dtype).reshape(shape))


def _invert(into: np.ndarray, values: np.ndarray) -> None:
    """``into[...] = values`` with every byte XOR 0xFF."""
    np.copyto(into, values)
    flat = into.reshape(-1).view(np.uint8)
    np.bitwise_xor(flat, 0xFF, out=flat)


def _byte_extent(
    shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int
) -> tuple[int, int]:
    """``(lo, span)``: a non-empty strided array's elements start ``lo`` bytes
    from its data pointer (``lo <= 0``) and span ``span`` bytes."""
    lo = sum(st * (n - 1) for st, n in zip(strides, shape, strict=True) if st < 0)
    hi = sum(st * (n - 1) for st, n in zip(strides, shape, strict=True) if st > 0)
    return lo, hi - lo + itemsize


class DeviceArray:
    """An array in an emulated device's memory. Strided views share one
    allocation, freed (back to its stream's pool) when the last is gone."""

    def __init__(self, owner: Allocation, data: np.ndarray) -> None:
        self._owner = owner
        self.backend = owner.device
        self.region = owner.region
        self.lib = owner.lib  # "torch" or "cupy": whose current stream it follows
        self.data = data  # touched by stream workers only, or after a synchronisation

    @property
    def allocated_on(self) -> EmulatedStream:
        """The stream whose pool the memory came from (where it is freed to)."""
        stream = self._owner.block.stream
        assert stream is not None
        return stream

    def __getitem__(self, idx: Any) -> DeviceArray:
        idx = idx if isinstance(idx, tuple) else (idx,)
        view = self.data[idx]
        if not isinstance(view, np.ndarray):  # all-integer index: keep a 0-d view
            view = self.data[idx + (Ellipsis,)]  # noqa: RUF005 (Python 3.10 syntax)
        return DeviceArray(self._owner, view)

    def view(self, dtype: Any) -> DeviceArray:
        return DeviceArray(self._owner, self.data.view(dtype))

    def reshape(self, shape: tuple[int, ...]) -> DeviceArray:
        # never a copy: raises if the view cannot be reshaped in place
        view = np.reshape(self.data, shape, copy=False)
        return DeviceArray(self._owner, view)

    @property
    def T(self) -> DeviceArray:
        return DeviceArray(self._owner, self.data.T)

    def as_strided(self, shape: tuple[int, ...], strides: tuple[int, ...]) -> DeviceArray:
        """A view with ``strides`` in bytes, unchecked (elements may overlap), as
        ``cupy.lib.stride_tricks.as_strided`` and ``torch.as_strided`` make."""
        return DeviceArray(self._owner, np.lib.stride_tricks.as_strided(self.data, shape, strides))

    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
    strides = property(lambda self: self.data.strides)
    size = property(lambda self: self.data.size)
    nbytes = property(lambda self: self.data.nbytes)
    ndim = property(lambda self: self.data.ndim)

    def __repr__(self) -> str:
        return (
            f"DeviceArray(shape={self.shape}, dtype={self.dtype}, strides={self.strides}, "
            f"device={self.backend.index}, lib={self.lib!r})"
        )


class InvertedArray:
    """A device array read lazily transformed: its values are ``base``'s bytes
    XOR 0xFF (any dtype). Like a CUDA tensor with the conjugate/negative bit, a
    transfer materialises it chunk by chunk into temporaries on its producer's
    stream; it cannot be a transfer's destination."""

    def __init__(self, base: DeviceArray) -> None:
        self.base = base
        self.backend = base.backend
        self.lib = base.lib

    shape = property(lambda self: self.base.shape)
    dtype = property(lambda self: self.base.dtype)
    strides = property(lambda self: self.base.strides)  # as a tensor with the negative bit has
    size = property(lambda self: self.base.size)
    nbytes = property(lambda self: self.base.nbytes)
    ndim = property(lambda self: self.base.ndim)

    def __repr__(self) -> str:
        return f"InvertedArray({self.base!r})"


# Arrays of the emulated device are device data to interop's transfers, through
# the same interface as CUDA's (interop.pipeline.backend.Backend).
register_device_type(DeviceArray, lambda x: x.backend)
register_device_type(InvertedArray, lambda x: x.backend)
