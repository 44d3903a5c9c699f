"""The slot schedule's CUDA backend: CuPy runtime calls on a real GPU.

Non-blocking streams, blocking-sync events, portable pinned memory, ``cudaMemcpyAsync``
and CuPy copy kernels; docs/pipeline.md gives the reasons.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import sys
from typing import Any

import numpy as np

from .. import _backends, dtypes
from ..errors import InvalidValueError
from ..streams import Unsynchronised, capture_under_way, capturing, cupy_stream, same_stream
from .backend import DeviceChunk, DeviceData
from .plan import STAGING_ALIGN, round_up

__all__ = ["CudaBackend", "cuda_backend"]

_H2D, _D2H = 1, 2  # cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost
_PORTABLE = 1  # cudaHostAllocPortable, cudaHostRegisterPortable: usable from every device
_NO_CONTEXT = contextlib.nullcontext()


class CudaStream:
    """A CuPy stream of device ``device``, owned (closed by the run that created
    it) or borrowed."""

    def __init__(self, stream: Any, owned: bool, device: int) -> None:
        self.cupy = stream
        self.owned = owned
        self.device = device

    @property
    def ptr(self) -> int:
        return int(self.cupy.ptr)

    @property
    def legacy(self) -> bool:
        return same_stream(self.ptr, 0)

    def same(self, other: Any) -> bool:
        """True if ``other`` is this stream (the same handle on the same device;
        0 and 1 both name the legacy default stream)."""
        return (
            isinstance(other, CudaStream)
            and other.device == self.device
            and same_stream(self.ptr, other.ptr)
        )

    def wait(self, event: CudaEvent) -> None:
        self.cupy.wait_event(event.cupy)

    def synchronize(self) -> None:
        self.cupy.synchronize()

    def close(self) -> None:
        if self.owned:
            self.cupy = None  # cudaStreamDestroy when the last reference goes


class CudaEvent:
    """A CuPy event with blocking synchronisation and no timing."""

    def __init__(self, cp: Any) -> None:
        self.cupy = cp.cuda.Event(block=True, disable_timing=True)

    def record(self, stream: CudaStream) -> None:
        self.cupy.record(stream.cupy)

    def synchronize(self) -> None:
        self.cupy.synchronize()


class CudaTimer:
    """A CuPy event with timing, for tracing a transfer."""

    def __init__(self, cp: Any) -> None:
        self._cp = cp
        self.cupy = cp.cuda.Event(block=True, disable_timing=False)

    def record(self, stream: CudaStream) -> None:
        self.cupy.record(stream.cupy)

    def seconds_since(self, start: CudaTimer) -> float:
        return float(self._cp.cuda.get_elapsed_time(start.cupy, self.cupy)) / 1e3


class CudaStaging:
    """Rows of one CuPy ``uint8`` block, ``stride`` bytes apart (a multiple of 256)."""

    def __init__(self, block: Any, memory: Any, stride: int, stream: CudaStream) -> None:
        self.block = block
        self.memory = memory  # the pool's MemoryPointer under block
        self.stride = stride
        self.stream = stream

    def view(self, k: int, like: Any) -> Any:
        start = k * self.stride
        return self.block[start : start + like.nbytes].view(like.dtype).reshape(like.shape)

    def free(self) -> None:
        """Give the block back to CuPy's pool now, not when its last view goes (a frame
        kept by a profiler could hold one); the copy stream was synchronised."""
        memory, self.memory, self.block = self.memory, None, None
        if memory is not None:
            memory.mem.free()  # PooledMemory.free: idempotent, later releases are no-ops


class CudaBackend:
    """The schedule's device interface on CUDA device ``index``."""

    def __init__(self, index: int) -> None:
        self._cp = _backends.require_cupy_device()
        self.index = int(index)
        self.ring_key = "cuda"  # portable pinned memory serves every device

    def activate(self) -> Any:
        return self._cp.cuda.Device(self.index)

    def use(self) -> None:
        self._cp.cuda.runtime.setDevice(self.index)

    def own_pool(self) -> Any:
        cp = self._cp
        return cp.cuda.using_allocator(cp.get_default_memory_pool().malloc)

    def peer(self, index: int | None) -> CudaBackend:
        """The backend of CUDA device ``index`` (None: the current device)."""
        if index is None:
            index = int(self._cp.cuda.runtime.getDevice())
        return self if index == self.index else cuda_backend(index)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A new uninitialised CuPy array on CuPy's current stream (UnsupportedDtypeError)."""
        dtypes.check_cupy_dtype(np.dtype(dtype))
        with self.activate():
            return self._cp.empty(shape, dtype=dtype)

    def stream(self) -> CudaStream:
        with self.activate():
            return CudaStream(
                self._cp.cuda.Stream(non_blocking=True), owned=True, device=self.index
            )

    def event(self) -> CudaEvent:
        with self.activate():
            return CudaEvent(self._cp)

    def timer(self) -> CudaTimer:
        with self.activate():
            return CudaTimer(self._cp)

    def host_alloc(self, nbytes: int) -> tuple[int, np.ndarray]:
        ptr = int(self._cp.cuda.runtime.hostAlloc(nbytes, _PORTABLE))
        buf = (ctypes.c_uint8 * nbytes).from_address(ptr)
        return ptr, np.ctypeslib.as_array(buf)

    def host_free(self, ptr: int) -> None:
        self._cp.cuda.runtime.freeHost(ptr)

    def host_register(self, ptr: int, nbytes: int) -> None:
        self._cp.cuda.runtime.hostRegister(ptr, nbytes, _PORTABLE)

    def host_unregister(self, ptr: int) -> None:
        self._cp.cuda.runtime.hostUnregister(ptr)

    def is_pinned(self, ptr: int, nbytes: int) -> bool:
        """The range lies in one page-locked allocation or registration: its ends are host
        memory of the same driver buffer ID (False where the driver cannot say)."""
        if nbytes <= 0:
            return False
        runtime = self._cp.cuda.runtime
        ends = (ptr, ptr + nbytes - 1)
        host = runtime.memoryTypeHost
        try:
            with self.activate():
                if any(runtime.pointerGetAttributes(p).type != host for p in ends):
                    return False
                first, last = (_buffer_id(p) for p in ends)
        except runtime.CUDARuntimeError:  # not memory CUDA knows of
            return False
        return first is not None and first == last

    def is_capturing(self, stream: CudaStream) -> bool:
        """``cudaStreamIsCapturing``; a stream the runtime refuses to answer for counts."""
        with self.activate():
            return capturing(stream.cupy.is_capturing)

    def capture_under_way(self, stream: CudaStream | None) -> bool:
        """``stream``, or a current stream of PyTorch, CuPy or ``interop.stream``, captures."""
        if stream is not None and self.is_capturing(stream):
            return True
        th = sys.modules.get("torch")  # no capture of PyTorch's without it
        torch_device = _NO_CONTEXT
        if th is not None and th.cuda.is_initialized():
            torch_device = th.cuda.device(self.index)
        with self.activate(), torch_device:
            return capture_under_way()

    def capture_forbids_allocation(self) -> bool:
        """A capture is under way and CuPy allocates from its default pool."""
        return uses_cupys_pool(self._cp) and self.capture_under_way(None)

    def host_access(self, ring: Any, k: int) -> Any:
        return contextlib.nullcontext()

    def staging(self, count: int, row_bytes: int) -> CudaStaging:
        cp = self._cp
        stride = round_up(row_bytes, STAGING_ALIGN)
        with self.activate():
            memory = cp.get_default_memory_pool().malloc(count * stride)
            block = cp.ndarray((count * stride,), cp.uint8, memptr=memory)
            allocated_on = CudaStream(cp.cuda.get_current_stream(), owned=False, device=self.index)
        return CudaStaging(block, memory, stride, allocated_on)

    def is_contiguous(self, view: Any) -> bool:
        return bool(view.flags.c_contiguous)

    def copy_to_host(self, dst: int, src: Any, nbytes: int, s: CudaStream) -> None:
        self._cp.cuda.runtime.memcpyAsync(dst, src.data.ptr, nbytes, _D2H, s.ptr)

    def copy_to_device(self, dst: Any, src: int, nbytes: int, s: CudaStream) -> None:
        self._cp.cuda.runtime.memcpyAsync(dst.data.ptr, src, nbytes, _H2D, s.ptr)

    def copy_on_device(self, dst: Any, src: Any, s: CudaStream) -> None:
        if not dst.size:
            return
        with self._cp.cuda.Device(int(dst.device.id)), s.cupy:
            if int(src.device.id) != int(dst.device.id):
                src = _peer_copy(self._cp, src, s)
            dst[...] = src

    # -- data, described in the caller's thread (current streams are per thread)
    def source(self, x: Any, dtype: np.dtype | None = None) -> DeviceData:
        """A CuPy array or a detached CUDA tensor, on its library's current stream now."""
        cp = self._cp
        if _backends.is_cupy_array(x):
            with self.activate():
                producer = CudaStream(cp.cuda.get_current_stream(), owned=False, device=self.index)
            if dtype is None or dtype == np.dtype(x.dtype):
                return DeviceData(
                    producer, tuple(x.shape), np.dtype(x.dtype), _chunks_of(_bit_view(x))
                )

            def cast(idx: tuple) -> DeviceChunk:
                with self.activate(), producer.cupy:  # CuPy's kernel on the producer stream
                    return DeviceChunk(_bit_view(x[idx].astype(dtype)), produced_on=producer)

            return DeviceData(producer, tuple(x.shape), dtype, cast)
        th = _backends.torch()
        torch_stream = th.cuda.current_stream(self.index)
        with self.activate():
            producer = CudaStream(
                cupy_stream(int(torch_stream.cuda_stream), self.index),
                owned=False,
                device=self.index,
            )
        own = dtypes.numpy_dtype_of_torch(x.dtype)
        to = None if dtype is None or dtype == own else dtypes.torch_dtype_of_numpy(dtype)
        if x.is_conj() or x.is_neg() or to is not None:

            def resolved(idx: tuple) -> DeviceChunk:
                # a chunk-sized copy with the bit applied (and cast), made on the producer stream
                with th.cuda.device(self.index), th.cuda.stream(torch_stream):
                    part = x[idx].resolve_conj().resolve_neg()
                    if to is not None:
                        part = part.to(to)
                    return DeviceChunk(self._from_torch(part, producer), produced_on=producer)

            values = own if to is None or dtype is None else dtype
            return DeviceData(producer, tuple(x.shape), values, resolved)
        return DeviceData(producer, tuple(x.shape), own, _chunks_of(self._from_torch(x, producer)))

    def target(self, out: Any, func: str) -> DeviceData:
        """A CuPy array or CUDA tensor (InvalidValueError with the conjugate/negative bit)."""
        if _backends.is_torch_tensor(out):
            if out.is_conj() or out.is_neg():
                raise InvalidValueError(
                    f"{func} expected an out without the conjugate/negative bit "
                    "(writes through such a view would be transformed); resolve it first"
                )
            out = out.detach()
        return self.source(out)

    def _from_torch(self, t: Any, producer: CudaStream) -> Any:
        th = _backends.torch()
        ml = dtypes.ml_view_of_torch(t.dtype)
        bits = t if ml is None else t.view(ml[1])
        # Exported without PyTorch's synchronisation: the schedule orders its copy
        # stream after the producer itself (and under CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1
        # CuPy would name the per-thread default stream, which PyTorch refuses).
        with self.activate(), th.cuda.device(self.index), producer.cupy:
            return self._cp.from_dlpack(Unsynchronised(bits))


def uses_cupys_pool(cp: Any) -> bool:
    """True if CuPy allocates in this thread from its default pool (``cudaMalloc``: illegal
    in a capture), not PyTorch's (``interop.use_torch_allocator``) or another."""
    return bool(cp.cuda.get_allocator() == cp.get_default_memory_pool().malloc)


_BUFFER_ID = 7  # CU_POINTER_ATTRIBUTE_BUFFER_ID: unique per allocation for the process's life


@functools.cache
def _pointer_attribute() -> Any:
    """The driver's ``cuPointerGetAttribute`` (not in CuPy's bindings), or None."""
    try:
        function = ctypes.CDLL("libcuda.so.1").cuPointerGetAttribute
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
    function.restype = ctypes.c_int
    return function


def _buffer_id(ptr: int) -> int | None:
    """The driver's ID of the allocation holding ``ptr``, or None (no error state kept)."""
    function = _pointer_attribute()
    if function is None:
        return None
    value = ctypes.c_uint64()
    if function(ctypes.byref(value), _BUFFER_ID, ptr) != 0:
        return None
    return int(value.value)


def _bit_view(x: Any) -> Any:
    """A CuPy array with bfloat16/float8 viewed as same-sized integers."""
    bits = dtypes.int_view_of_numpy(np.dtype(x.dtype))
    return x if bits == np.dtype(x.dtype) else x.view(bits)


def _peer_copy(cp: Any, src: Any, s: CudaStream) -> Any:
    """``src`` (on another device) here with its strides: one peer DMA on ``s`` of the
    bytes it spans, into CuPy's own pool on ``s`` (``src.copy()`` would pack on a
    stream ordered neither after the producer nor before ``s``)."""
    lo, span = byte_extent(src.shape, src.strides, src.itemsize)
    memory = cp.get_default_memory_pool().malloc(span)  # on the current stream: s
    memory.copy_from_device_async(src.data + lo, span, s.cupy)
    return cp.ndarray(src.shape, src.dtype, memory - lo, strides=src.strides)


def byte_extent(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """``(lo, span)``: the bytes a non-empty strided array's elements occupy
    start ``lo`` bytes from its data pointer (``lo <= 0``) and span ``span``."""
    lo = sum(st * (n - 1) for st, n in zip(strides, shape, strict=True) if st < 0)
    hi = sum(st * (n - 1) for st, n in zip(strides, shape, strict=True) if st > 0)
    return lo, hi - lo + itemsize


def _chunks_of(view: Any) -> Any:
    return lambda idx: DeviceChunk(view[idx])


_backends_by_index: dict[int, CudaBackend] = {}


def cuda_backend(index: int) -> CudaBackend:
    """The backend of CUDA device ``index``, made on first use (NoDeviceError,
    BackendUnavailableError, or CudaAfterForkError in a child forked after CUDA)."""
    _backends.check_not_forked()
    backend = _backends_by_index.get(index)
    if backend is None:
        backend = _backends_by_index.setdefault(index, CudaBackend(index))
    return backend
