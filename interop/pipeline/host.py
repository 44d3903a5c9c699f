"""A device emulated on the CPU: the slot schedule's second backend.

Like kvikio's compatibility mode, it runs the same code paths as the CUDA
backend on a machine without a GPU. It is a real engine, not a mock: every
stream is a worker thread that executes its queued copies in order, events
complete when their stream reaches them, "device" memory is host memory, and
data really moves. What it adds is CUDA's rules, checked on every call, so a
schedule bug fails loudly on a CPU instead of corrupting data on a GPU:

* typed device accesses (pack/unpack) are naturally aligned, and staging rows
  start on 256-byte boundaries;
* a DMA copies a C-contiguous device array of exactly the bytes asked;
* no memory is used on a stream before that stream is ordered after the last
  conflicting use on another stream (its allocation counts as a use: memory
  from a stream-ordered pool may still be busy on the allocating stream);
* a host thread touches a staging slot only after an event or stream
  synchronisation showed the device copies of that slot complete, and no
  device copy is queued on a slot while a host thread uses it;
* nothing is used after it was freed, and no event is waited on before it
  was recorded.

A broken rule raises :class:`RuleViolation` where it happens and is kept in
:attr:`HostBackend.violations`. Faults can be injected by operation count
(``faults={"copy": 3}`` fails the third DMA); a fault in device work is sticky,
as CUDA's asynchronous errors are: every later call on that backend fails.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .. import dtypes
from .backend import DeviceChunk, DeviceData
from .plan import STAGING_ALIGN, round_up

__all__ = ["DeviceArray", "HostBackend", "HostDeviceError", "RuleViolation"]

_PAGE = 4096


class RuleViolation(AssertionError):
    """A CUDA rule was broken (a bug in the caller, not in the data)."""


class HostDeviceError(RuntimeError):
    """An injected device failure (the emulated ``CUDARuntimeError``)."""


class _Region:
    """Memory whose uses are checked: a device allocation, or one pinned buffer
    (a staging slot, or page-locked memory a caller copies to or from).

    A pinned buffer is one region: two streams copying into disjoint parts
    of it at once are refused, which CUDA allows; it is stricter, never looser.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.last_write: tuple[int, int] | None = None  # (stream id, seq)
        self.reads: dict[int, int] = {}  # stream id -> seq of its last read
        self.host_users = 0
        self.freed = False


def _aligned(nbytes: int, align: int) -> np.ndarray:
    raw = np.empty(nbytes + align, np.uint8)
    offset = (-raw.ctypes.data) % align
    return raw[offset : offset + nbytes]


class HostBackend:
    """An emulated device: streams, events, memory and copies on the CPU.

    Parameters
    ----------
    delay : float
        Seconds each stream waits before executing an operation, to widen
        the windows in which a missing synchronisation shows.
    faults : dict, optional
        Operation kind -> the count at which it fails: ``"copy"`` (a DMA),
        ``"pack"`` (a device element-wise copy), ``"staging"`` (device staging
        allocation), ``"host_alloc"``, ``"host_free"``, ``"fill"`` / ``"drain"``
        (a host thread's access to a slot, host-to-device / device-to-host),
        ``"timer_read"`` (reading a timing event; not sticky).
    """

    def __init__(self, *, delay: float = 0.0, faults: dict[str, int] | None = None) -> None:
        self.ring_key = self
        self.delay = float(delay)
        self.faults = dict(faults or {})
        self.counts: Counter[str] = Counter()
        self.violations: list[str] = []
        self.host_buffers: dict[int, np.ndarray] = {}  # live pinned buffers by address
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._completed: dict[int, int] = {}  # stream id -> last seq the host saw complete
        self._sticky: BaseException | None = None
        self._slots: dict[int, _Region] = {}
        self._streams: list[HostStream] = []
        self._local = threading.local()
        self.default_stream = HostStream(self)

    # -- rules
    def violation(self, message: str) -> RuleViolation:
        with self._lock:
            self.violations.append(message)
        return RuleViolation(message)

    def _fault(self, kind: str) -> bool:
        with self._lock:
            self.counts[kind] += 1
            return self.faults.get(kind) == self.counts[kind]

    def _check_alive(self) -> None:
        if self._sticky is not None:
            raise HostDeviceError(f"the device failed earlier: {self._sticky}") from self._sticky

    def _check_use(self, stream: HostStream, region: _Region, write: bool) -> None:
        """With the lock held: may ``stream`` queue a use of ``region`` now?"""
        if region.freed:
            raise self.violation(f"{region.name} used on stream {stream.id} after it was freed")
        if region.host_users:
            raise self.violation(
                f"{region.name}: device copy queued on stream {stream.id} while a host thread "
                "uses it"
            )
        known = dict(self._completed)
        for s, seq in stream.clock.items():
            known[s] = max(known.get(s, 0), seq)
        earlier = [region.last_write] if region.last_write else []
        if write:
            earlier += list(region.reads.items())
        for s, seq in earlier:
            if s != stream.id and known.get(s, 0) < seq:
                raise self.violation(
                    f"{region.name} used on stream {stream.id} before that stream was ordered "
                    f"after its use on stream {s} (no event waited on)"
                )

    def _observed(self, clock: dict[int, int]) -> None:
        """The host saw everything ``clock`` covers complete."""
        with self._lock:
            for s, seq in clock.items():
                self._completed[s] = max(self._completed.get(s, 0), seq)

    # -- the Backend interface
    def activate(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def stream(self) -> HostStream:
        self._check_alive()
        return HostStream(self)

    def event(self) -> HostEvent:
        return HostEvent(self)

    def timer(self) -> HostTimer:
        return HostTimer(self)

    def host_alloc(self, nbytes: int) -> tuple[int, np.ndarray]:
        self._check_alive()
        if self._fault("host_alloc"):
            raise HostDeviceError("injected fault: pinned host allocation failed")
        array = _aligned(nbytes, _PAGE)
        ptr = int(array.ctypes.data)
        with self._lock:
            self.host_buffers[ptr] = array
            self._slots[ptr] = _Region(f"pinned buffer {ptr:#x}")
        return ptr, array

    def host_free(self, ptr: int) -> None:
        self._check_alive()
        if self._fault("host_free"):
            raise HostDeviceError(f"injected fault: freeing pinned buffer {ptr:#x} failed")
        with self._lock:
            del self.host_buffers[ptr]
            self._slots.pop(ptr).freed = True

    @contextlib.contextmanager
    def host_access(self, ring: Any, k: int) -> Iterator[None]:
        region = self._slots[ring.ptrs[k]]
        with self._lock:
            for s, seq in [
                *([region.last_write] if region.last_write else []),
                *region.reads.items(),
            ]:
                if self._completed.get(s, 0) < seq:
                    raise self.violation(
                        f"{region.name} touched by a host thread before the device copy on "
                        f"stream {s} was seen complete (no event synchronised)"
                    )
            region.host_users += 1
        try:
            kind = "drain" if region.last_write and not region.reads else "fill"
            if self._fault(kind):
                raise HostDeviceError(f"injected fault in a host thread's {kind}")
            yield
        finally:
            with self._lock:
                region.host_users -= 1

    def staging(self, count: int, row_bytes: int) -> HostStaging:
        if self._fault("staging"):
            raise HostDeviceError("injected fault: device staging allocation failed")
        stride = round_up(row_bytes, STAGING_ALIGN)
        block = self.empty((count * stride,), np.uint8)  # on the current stream, like a pool
        return HostStaging(block, stride, self.current_stream())

    def is_capturing(self, stream: HostStream) -> bool:
        return False

    def is_contiguous(self, view: DeviceArray) -> bool:
        return bool(view.data.flags.c_contiguous)

    def is_pinned(self, ptr: int, nbytes: int) -> bool:
        """The range lies inside one live buffer of :meth:`host_alloc`."""
        return nbytes > 0 and self._pinned(ptr, nbytes) is not None

    def _pinned(self, ptr: int, nbytes: int) -> tuple[np.ndarray, _Region] | None:
        """The bytes ``[ptr, ptr + nbytes)`` of the live pinned buffer holding
        them, and that buffer's region; None where no buffer holds them all."""
        with self._lock:
            for base, array in self.host_buffers.items():
                if base <= ptr and ptr + nbytes <= base + array.nbytes:
                    return array[ptr - base : ptr - base + nbytes], self._slots[base]
        return None

    def copy_to_host(self, dst: int, src: DeviceArray, nbytes: int, s: HostStream) -> None:
        host, region = self._check_dma(src, dst, nbytes)
        data = src.data
        s.enqueue(
            "copy", lambda: np.copyto(host, data.reshape(-1).view(np.uint8)),
            reads=[src.region], writes=[region],
        )  # fmt: skip

    def copy_to_device(self, dst: DeviceArray, src: int, nbytes: int, s: HostStream) -> None:
        host, region = self._check_dma(dst, src, nbytes)
        data = dst.data
        s.enqueue(
            "copy", lambda: np.copyto(data.reshape(-1).view(np.uint8), host),
            reads=[region], writes=[dst.region],
        )  # fmt: skip

    def _check_dma(self, view: DeviceArray, ptr: int, nbytes: int) -> tuple[np.ndarray, _Region]:
        if not view.data.flags.c_contiguous or view.nbytes != nbytes:
            raise self.violation(
                f"DMA of {nbytes} bytes for a device array of {view.nbytes} bytes "
                f"(C-contiguous: {view.data.flags.c_contiguous})"
            )
        pinned = self._pinned(ptr, nbytes)
        if pinned is None:
            raise self.violation(
                f"DMA of {nbytes} bytes at host address {ptr:#x}, which is not inside one live "
                "page-locked buffer (freed, pageable, or past the buffer's end)"
            )
        return pinned

    def copy_on_device(self, dst: DeviceArray, src: DeviceArray, s: HostStream) -> None:
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
        d, v = dst.data, src.data
        s.enqueue("pack", lambda: np.copyto(d, v), reads=[src.region], writes=[dst.region])

    # -- device memory and data, for callers and tests
    def current_stream(self) -> HostStream:
        """The calling thread's current stream (the default stream unless set)."""
        return getattr(self._local, "stream", None) or self.default_stream

    @contextlib.contextmanager
    def use_stream(self, stream: HostStream) -> Iterator[HostStream]:
        """Make ``stream`` the calling thread's current stream inside the block."""
        previous = getattr(self._local, "stream", None)
        self._local.stream = stream
        try:
            yield stream
        finally:
            self._local.stream = previous

    def empty(self, shape: tuple[int, ...], dtype: Any) -> DeviceArray:
        """Uninitialised device memory (256-byte aligned), allocated on the
        current stream: using it on another stream needs an event."""
        self._check_alive()
        dtype = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        buf = _aligned(max(n, 1), STAGING_ALIGN)[:n]
        region = _Region(f"device allocation of {n} bytes")
        self.current_stream().enqueue("alloc", lambda: None, writes=[region])
        return DeviceArray(self, region, buf.view(dtype).reshape(shape))

    def asarray(self, host: np.ndarray) -> DeviceArray:
        """A device copy of ``host``, written on the current stream."""
        host = np.ascontiguousarray(host).copy()
        out = self.empty(host.shape, host.dtype)
        data = out.data
        self.current_stream().enqueue("upload", lambda: np.copyto(data, host), writes=[out.region])
        return out

    def synchronize(self) -> None:
        """Wait for every stream (``cudaDeviceSynchronize``)."""
        with self._lock:
            streams = list(self._streams)
        for s in streams:
            s.synchronize()

    def to_numpy(self, x: DeviceArray) -> np.ndarray:
        """A host copy of ``x`` after a device-wide synchronisation."""
        self.synchronize()
        return x.data.copy()

    def source(self, x: DeviceArray) -> DeviceData:
        """``x`` as the device side of a transfer (its producer: the current stream)."""
        bits = dtypes.int_view_of_numpy(x.dtype)
        view = x if bits == x.dtype else x.view(bits)
        return DeviceData(
            self.current_stream(), x.shape, x.dtype, lambda idx: DeviceChunk(view[idx])
        )

    def target(self, x: DeviceArray, func: str = "") -> DeviceData:
        """``x`` as the destination of a transfer (its consumer: the current stream)."""
        return self.source(x)

    def close(self) -> None:
        """Stop every stream's worker thread (after its queued work ran)."""
        with self._lock:
            streams = list(self._streams)
        for s in streams:
            s.stop()


class HostStream:
    """A stream: a worker thread executing queued operations in order."""

    def __init__(self, backend: HostBackend) -> None:
        self.backend = backend
        with backend._lock:
            self.id = next(backend._ids)
            backend._streams.append(self)
        self.clock: dict[int, int] = {self.id: 0}  # what queued work is ordered after
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

    def enqueue(
        self,
        kind: str,
        op: Callable[[], None],
        reads: list[_Region] | tuple[()] = (),
        writes: list[_Region] | tuple[()] = (),
    ) -> None:
        """Queue ``op`` after the rules for its memory uses were checked."""
        b = self.backend
        b._check_alive()
        fails = kind in ("copy", "pack") and b._fault(kind)
        with b._lock:
            if self._closed:
                raise b.violation(f"work queued on stream {self.id} after it was closed")
            for region in reads:
                b._check_use(self, region, write=False)
            for region in writes:
                b._check_use(self, region, write=True)
            self.clock[self.id] += 1
            seq = self.clock[self.id]
            for region in reads:
                region.reads[self.id] = seq
            for region in writes:
                region.last_write, region.reads = (self.id, seq), {}
            self._queue.put(
                (seq, kind, _failing(kind) if fails else _guarded(b, kind, op, (*reads, *writes)))
            )

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            seq, kind, op = item
            if self.backend.delay and kind != "timer":  # a timing event takes no stream time
                time.sleep(self.backend.delay)
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

    def wait(self, event: HostEvent) -> None:
        b = self.backend
        with b._lock:
            if event.point is None:
                raise b.violation(f"stream {self.id} waits on an event that was never recorded")
            stream, seq, clock = event.point
            for s, n in clock.items():
                self.clock[s] = max(self.clock.get(s, 0), n)
        self.enqueue("wait", lambda: stream.reached(seq))

    def synchronize(self) -> None:
        with self.backend._lock:
            seq, clock = self.clock[self.id], dict(self.clock)
        self.reached(seq)
        self.backend._observed(clock)
        self.backend._check_alive()

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
        self._queue.put(None)
        self._thread.join()


def _guarded(
    backend: HostBackend, kind: str, op: Callable[[], None], regions: tuple[_Region, ...]
) -> Callable[[], None]:
    """``op``, refusing to run on memory freed after it was queued."""

    def run() -> None:
        for region in regions:
            if region.freed:
                raise backend.violation(f"queued {kind} ran on {region.name} after it was freed")
        op()

    return run


def _failing(kind: str) -> Callable[[], None]:
    def op() -> None:
        raise HostDeviceError(f"injected fault: a device {kind} failed")

    return op


class HostEvent:
    """An event: a point in one stream's queue."""

    def __init__(self, backend: HostBackend) -> None:
        self.backend = backend
        self.point: tuple[HostStream, int, dict[int, int]] | None = None

    def record(self, stream: HostStream) -> None:
        self.backend._check_alive()
        with self.backend._lock:
            self.point = (stream, stream.clock[stream.id], dict(stream.clock))

    def query(self) -> bool:
        """True once the recorded point was reached (never blocks)."""
        point = self.point
        if point is None:
            raise self.backend.violation("host queries an event that was never recorded")
        stream, seq, _ = point
        return stream._done >= seq

    def synchronize(self) -> None:
        point = self.point
        if point is None:
            raise self.backend.violation("host synchronises an event that was never recorded")
        stream, seq, clock = point
        stream.reached(seq)
        self.backend._observed(clock)
        self.backend._check_alive()


class HostTimer:
    """A timing event: the time the stream's worker reached it."""

    def __init__(self, backend: HostBackend) -> None:
        self.backend = backend
        self.at: float | None = None

    def record(self, stream: HostStream) -> None:
        self.at = None
        stream.enqueue("timer", self._stamp)

    def _stamp(self) -> None:
        self.at = time.perf_counter()

    def seconds_since(self, start: HostTimer) -> float:
        if self.backend._fault("timer_read"):
            raise HostDeviceError("injected fault: reading a timing event failed")
        if self.at is None or start.at is None:
            raise self.backend.violation(
                "a timer read before its stream reached it (synchronise the stream first)"
            )
        return self.at - start.at


class HostStaging:
    """Device rows for packing, ``stride`` bytes apart (a multiple of 256)."""

    def __init__(self, block: DeviceArray, stride: int, stream: HostStream) -> None:
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
        self.block.region.freed = True


class DeviceArray:
    """An array in an emulated device's memory (strided views share a region)."""

    __interop_backend__ = True  # recognised by interop.arrays as device data

    def __init__(self, backend: HostBackend, region: _Region, data: np.ndarray) -> None:
        self.backend = backend
        self.region = region
        self.data = data  # touched by stream workers only, or after a synchronisation

    def __getitem__(self, idx: Any) -> DeviceArray:
        idx = idx if isinstance(idx, tuple) else (idx,)
        view = self.data[idx]
        if not isinstance(view, np.ndarray):  # all-integer index: keep a 0-d view
            view = self.data[idx + (Ellipsis,)]  # noqa: RUF005 (Python 3.10 syntax)
        return DeviceArray(self.backend, self.region, view)

    def view(self, dtype: Any) -> DeviceArray:
        return DeviceArray(self.backend, self.region, self.data.view(dtype))

    def reshape(self, shape: tuple[int, ...]) -> DeviceArray:
        # never a copy: raises if the view cannot be reshaped in place
        view = np.reshape(self.data, shape, copy=False)
        return DeviceArray(self.backend, self.region, view)

    @property
    def T(self) -> DeviceArray:
        return DeviceArray(self.backend, self.region, self.data.T)

    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
    strides = property(lambda self: self.data.strides)
    size = property(lambda self: self.data.size)
    nbytes = property(lambda self: self.data.nbytes)
    ndim = property(lambda self: self.data.ndim)

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, strides={self.strides})"
