"""The devices the transfer and pipeline tests run on, behind one small API.

The ``device`` fixture (conftest.py) is an :class:`Emulated` device always, and a
:class:`Cuda` one under the ``gpu`` marker (skipped without a CUDA device usable by
both CuPy and PyTorch, failing instead with ``INTEROP_REQUIRE_GPU=1``). A test
written against this API is one body for both: its ids end in ``[emulated]`` and
``[cuda]``. Checks only one of them can make are explicit: ``device.emulated`` is
the :class:`~interop.testing.EmulatedDevice` (its rule violations, operation
counts, injected faults), None on CUDA.

Arrays are made by the test's device library, never by interop: ``lib="cupy"`` (a
CuPy array on CUDA) or ``lib="torch"`` (a CUDA tensor); on the emulated device the
library names whose current stream an array follows. The CUDA side writes new
arrays with ``cudaMemcpyAsync``/``cudaMemsetAsync`` on the library's current stream,
so they queue behind a :meth:`hold` like any kernel and compile nothing.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import interop
from interop.pipeline.ring import free_cached_rings
from interop.streams import cupy_stream
from interop.testing import EmulatedCaptureError, EmulatedDevice
from tests import helpers

KINDS = ("emulated", "cuda")
LIBS = ("cupy", "torch")
_ML = {"bfloat16", "float8_e4m3fn", "float8_e5m2"}
_FILL = 0x55  # the byte take_back writes


def open_device(kind: str, **emulated: Any) -> Emulated | Cuda:
    """A test device of ``kind``; ``emulated`` are EmulatedDevice's arguments
    (ignored on CUDA, where two devices are :meth:`Cuda.peer` on two GPUs)."""
    if kind == "emulated":
        return Emulated(**emulated)
    if kind == "cuda":
        return Cuda()
    raise ValueError(f"expected a device kind in {KINDS} (got {kind!r})")


@contextlib.contextmanager
def opened(kind: str, **emulated: Any) -> Iterator[Emulated | Cuda]:
    """:func:`open_device` for the block, with no staging ring cached at its
    start; checked released after it (when it did not raise), then closed."""
    free_cached_rings()
    d = open_device(kind, **emulated)
    try:
        yield d
        d.check_released()
    finally:
        d.close()


class Peak:
    """Device memory measured by :meth:`measure_peak`: ``bytes`` above the start."""

    bytes = 0


class Emulated:
    """The emulated device (interop.testing), with the test API."""

    name = "emulated"
    cuda = False

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("delay", 0.0002)
        dev = EmulatedDevice(**kwargs)
        self._set(dev, [])

    def _set(self, dev: EmulatedDevice, own: list[Any]) -> None:
        self.emulated = dev  # for checks only the emulated device can make
        self.backend = dev  # the pipeline's device interface
        self.index = dev.index
        self._own = own  # streams the test made, closed by check_released

    # -- arrays
    def asarray(self, host: Any, lib: str = "cupy") -> Any:
        """A device copy of ``host`` (same shape and dtype), written on ``lib``'s
        current stream."""
        return self.emulated.asarray(host, lib=lib)

    def empty(self, shape: Any, dtype: Any, lib: str = "cupy") -> Any:
        return self.emulated.empty(shape, dtype, lib=lib)

    def to_numpy(self, x: Any) -> np.ndarray:
        """``x``'s values on the host, after every stream of the device is done."""
        return self.emulated.to_numpy(x)

    def as_strided(self, x: Any, shape: tuple[int, ...], strides: tuple[int, ...]) -> Any:
        """A writable view of ``x``'s memory with ``strides`` in bytes (overlapping ones too)."""
        return x.as_strided(shape, strides)

    def ptr(self, x: Any) -> int:
        return int(x.data.ctypes.data)

    def lazy(self, x: Any, a: np.ndarray) -> tuple[Any, np.ndarray]:
        """``x`` (holding ``a``) lazily transformed, as a CUDA tensor with the
        negative bit: a transfer resolves it chunk by chunk into temporaries on
        its producer's stream. Returns it and the values it stands for."""
        flipped = np.frombuffer(helpers.inverted_bytes(a), a.dtype).reshape(a.shape)
        return self.emulated.inverted(x), flipped

    def take_back(self, ptr: int, shape: Any, dtype: Any, lib: str = "cupy") -> list[Any]:
        """Allocate ``shape``/``dtype`` on ``lib``'s current stream and write it
        (bytes 0x55) until the pool hands out the block at ``ptr`` again (it
        must, within three tries); return what was taken."""
        dtype = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        host = np.full(n, _FILL, np.uint8).view(dtype).reshape(shape)
        taken = []
        for _ in range(3):
            taken.append(self.asarray(host, lib))
            if self.ptr(taken[-1]) == ptr:
                return taken
        raise AssertionError(f"the {lib} pool did not hand the freed block out again")

    # -- streams
    @property
    def default_stream(self) -> Any:
        return self.emulated.default_stream

    def stream(self) -> Any:
        s = self.emulated.stream()
        self._own.append(s)
        return s

    def current_stream(self, lib: str = "cupy") -> Any:
        return self.emulated.current_stream(lib)

    def use_stream(self, stream: Any, lib: str | None = None) -> Any:
        """Make ``stream`` ``lib``'s current stream in the block (None: both)."""
        return self.emulated.use_stream(stream, lib)

    def activate(self) -> Any:
        return self.emulated.activate()

    def torch_allocator(self) -> Any:
        """CuPy allocating from PyTorch's pool in every thread, in the block
        (``interop.use_torch_allocator()``)."""
        return self.emulated.torch_allocator()

    def hold(self, stream: Any, seconds: float = 0.3) -> Callable[[], None]:
        """Keep ``stream`` busy: work queued on it after this waits about
        ``seconds``, or until the returned function is called."""
        return helpers.hold(stream, seconds).set

    def is_done(self, stream: Any) -> bool:
        """The work queued on ``stream`` so far has run (never blocks)."""
        return bool(stream._done >= stream.clock[stream.id])

    def synchronize(self) -> None:
        self.emulated.synchronize()

    # -- host memory
    def pinned(self, shape: Any, dtype: Any, order: str = "C") -> Any:
        """A zeroed NumPy array in page-locked memory, for the block."""
        return helpers.pinned(self.emulated, shape, dtype, order)

    def staged(self) -> int:
        """Host-thread accesses to staging slots so far (the emulated device counts them)."""
        return helpers.staged(self.emulated)

    # -- memory
    def bytes_in_use(self) -> int:
        """Device memory held by live arrays (the pools' used bytes)."""
        return int(self.emulated.reset_peak())

    @contextlib.contextmanager
    def measure_peak(self, lib: str | None = None) -> Iterator[Peak]:
        """The most device memory in use during the block, above its start
        (every allocation: ``lib`` matters on CUDA only)."""
        peak = Peak()
        base = self.emulated.reset_peak()
        yield peak
        peak.bytes = self.emulated.peak_bytes_in_use - base

    # -- graph capture
    @contextlib.contextmanager
    def capturing(self, lib: str = "torch") -> Iterator[_EmulatedCapture]:
        """A capture into a graph on a new stream, current for both libraries
        in the block (on CUDA: ``torch.cuda.graph``, or CuPy's capture for
        ``lib="cupy"``; see :meth:`Cuda.capturing`)."""
        _check_lib(lib)
        s = self.stream()
        with self.use_stream(s), self.emulated.capture(s) as graph:
            yield _EmulatedCapture(s, graph)

    # -- devices
    def need_devices(self, n: int) -> None:
        assert len(self.emulated.devices) >= n, "open the emulated device with devices=n"

    def peer(self, index: int) -> Emulated:
        other = object.__new__(Emulated)
        other._set(self.emulated.peer(index), self._own)
        return other

    # -- after the test
    def check_released(self) -> None:
        """No rule broken, interop's copy streams closed, every pinned buffer freed."""
        for s in self._own:
            s.synchronize()
            s.close()
        self._own.clear()
        assert self.emulated.violations == []
        for dev in self.emulated.devices:
            assert dev._streams == [dev.default_stream]  # copy streams closed
        free_cached_rings()
        assert self.emulated.host_buffers == {}  # every pinned buffer freed
        assert self.emulated.machine.registered == {}  # every registration undone

    def close(self) -> None:
        self.emulated.close()


_warmed: set[int] = set()


class _Uploads:
    """Device buffers that copies queued on some stream may still read: each is
    let go by the first device synchronisation that began after it was added
    (threads may add while another thread synchronises)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[Any] = []

    def add(self, buf: Any) -> None:
        with self._lock:
            self._held.append(buf)

    def before_sync(self) -> list[Any]:
        with self._lock:
            return list(self._held)

    def after_sync(self, done: list[Any]) -> None:
        ids = {id(buf) for buf in done}
        with self._lock:
            self._held = [buf for buf in self._held if id(buf) not in ids]


class Cuda:
    """A CUDA device through CuPy and PyTorch, with the test API."""

    name = "cuda"
    cuda = True
    emulated = None

    def __init__(self, index: int = 0, uploads: _Uploads | None = None) -> None:
        import cupy
        import torch

        from interop.pipeline.cuda import cuda_backend

        self.cp, self.torch = cupy, torch
        self.index = index
        self.backend = cuda_backend(index)
        self._uploads = _Uploads() if uploads is None else uploads
        with self.activate():
            self._upload = cupy.cuda.Stream(non_blocking=True)
            # the SM clock torch.cuda._sleep counts (CUDA 13 dropped clockRate:
            # 2 GHz then, an H100's boost clock; a hold need only be about right)
            rate_khz = cupy.cuda.runtime.getDeviceProperties(index).get("clockRate") or 2e6
        self._hz = float(rate_khz) * 1e3
        if index not in _warmed:
            self._warm()
            _warmed.add(index)

    def _warm(self) -> None:
        """Compile the copy and fill kernels interop's copies use before any test
        queues a hold (a compile while a hold runs would let it run out)."""
        cp, th = self.cp, self.torch
        with self.activate():
            for dtype in (cp.float32, cp.float64, cp.complex64, cp.complex128, cp.int32):
                a = cp.arange(64, dtype=dtype).reshape(8, 8)
                b = cp.empty_like(a)
                b[...] = a.T
                b[...] = a[::-1]
                b.fill(0)
            for dtype in (th.float32, th.bfloat16, th.complex64):
                t = th.ones(64, dtype=dtype, device=self._torch_device)
                t.fill_(2)
                th._neg_view(t).resolve_neg()
            cp.cuda.Device(self.index).synchronize()

    @property
    def _torch_device(self) -> Any:
        return self.torch.device("cuda", self.index)

    @contextlib.contextmanager
    def activate(self) -> Iterator[Cuda]:
        with self.cp.cuda.Device(self.index), self.torch.cuda.device(self.index):
            yield self

    @contextlib.contextmanager
    def torch_allocator(self) -> Iterator[None]:
        """``interop.use_torch_allocator()`` (every thread) in the block; CuPy's
        previous process-wide allocator after it."""
        import interop

        before = self.cp.cuda.get_allocator()
        interop.use_torch_allocator()  # the plain call: process-wide
        try:
            yield
        finally:
            self.cp.cuda.set_allocator(before)

    # -- arrays
    def _current_ptr(self, lib: str) -> int:
        if lib == "cupy":
            return int(self.cp.cuda.get_current_stream().ptr)
        return int(self.torch.cuda.current_stream(self.index).cuda_stream)

    def empty(self, shape: Any, dtype: Any, lib: str = "cupy") -> Any:
        """Uninitialised memory of ``lib`` from its pool on its current stream.
        A dtype CuPy cannot hold skips the test (for ``lib="cupy"``)."""
        _check_lib(lib)
        dtype = np.dtype(dtype)
        with self.activate():
            if lib == "cupy":
                from interop import dtypes
                from interop.errors import UnsupportedDtypeError

                try:
                    dtypes.check_cupy_dtype(dtype)
                except UnsupportedDtypeError as exc:
                    pytest.skip(f"this CuPy cannot hold {dtype}: {exc}")
                return self.cp.empty(shape, dtype=dtype)
            return self.torch.empty(
                shape, dtype=_torch_dtype(self.torch, dtype), device=self._torch_device
            )

    def asarray(self, host: Any, lib: str = "cupy") -> Any:
        """A device copy of ``host`` (same shape and dtype), written on ``lib``'s
        current stream: uploaded on a stream of its own first, then one
        device-to-device ``cudaMemcpyAsync`` queued on the current stream."""
        host = np.array(host, order="C", copy=True)
        out = self.empty(host.shape, host.dtype, lib)
        if host.nbytes:
            cp = self.cp
            with self.activate():
                with self._upload:
                    staged = cp.asarray(host.reshape(-1).view(np.uint8))
                self._upload.synchronize()
                cp.cuda.runtime.memcpyAsync(
                    self.ptr(out), int(staged.data.ptr), host.nbytes,
                    cp.cuda.runtime.memcpyDeviceToDevice, self._current_ptr(lib),
                )  # fmt: skip
            self._uploads.add(staged)  # until the device was synchronised
        return out

    def as_strided(self, x: Any, shape: tuple[int, ...], strides: tuple[int, ...]) -> Any:
        """A writable view of ``x``'s memory with ``strides`` in bytes (overlapping ones too)."""
        if isinstance(x, self.cp.ndarray):
            return self.cp.lib.stride_tricks.as_strided(x, shape, strides)
        return x.as_strided(shape, [s // x.element_size() for s in strides])

    def to_numpy(self, x: Any) -> np.ndarray:
        """``x``'s values on the host, after every stream of the device is done
        (its bytes, read back as its dtype: bfloat16 and float8 included)."""
        self.synchronize()
        if isinstance(x, self.cp.ndarray):
            with self.cp.cuda.Device(x.device.id):
                flat = x.copy(order="C").reshape(-1)
                return flat.view(self.cp.uint8).get().view(x.dtype).reshape(x.shape)
        t = x.detach().resolve_conj().resolve_neg()
        shape = tuple(t.shape)
        flat = t.contiguous().reshape(-1)
        if t.dtype == self.torch.bool:
            return flat.cpu().numpy().reshape(shape)
        raw = flat.view(self.torch.uint8).cpu().numpy()
        return raw.view(_numpy_dtype(t.dtype)).reshape(shape)

    def ptr(self, x: Any) -> int:
        if isinstance(x, self.cp.ndarray):
            return int(x.data.ptr)
        return int(x.data_ptr())

    def lazy(self, x: Any, a: np.ndarray) -> tuple[Any, np.ndarray]:
        """The tensor ``x`` (holding ``a``) with the conjugate bit (complex) or
        the negative bit: a transfer resolves it chunk by chunk into
        temporaries of PyTorch's allocator."""
        assert isinstance(x, self.torch.Tensor), "lazy needs device.asarray(a, lib='torch')"
        if a.dtype.kind == "c":
            return x.conj(), a.conj()
        return self.torch._neg_view(x), -a

    def take_back(self, ptr: int, shape: Any, dtype: Any, lib: str = "cupy") -> list[Any]:
        """Allocate ``shape``/``dtype`` on ``lib``'s current stream and write it
        (bytes 0x55, ``cudaMemsetAsync``) until the pool hands out the block at
        ``ptr`` again (it must, within three tries); return what was taken."""
        taken = []
        for _ in range(3):
            x = self.empty(shape, dtype, lib)
            n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            with self.activate():
                self.cp.cuda.runtime.memsetAsync(self.ptr(x), _FILL, n, self._current_ptr(lib))
            taken.append(x)
            if self.ptr(x) == ptr:
                return taken
        raise AssertionError(f"the {lib} pool did not hand the freed block out again")

    # -- streams (CuPy stream objects; use_stream makes them PyTorch's too)
    @property
    def default_stream(self) -> Any:
        return self.cp.cuda.Stream.null

    def stream(self) -> Any:
        with self.activate():
            return self.cp.cuda.Stream(non_blocking=True)

    def current_stream(self, lib: str = "cupy") -> Any:
        _check_lib(lib)
        if lib == "cupy":
            return self.cp.cuda.get_current_stream()
        with self.activate():  # Stream.from_external takes the current device as the stream's
            return cupy_stream(self._current_ptr(lib), self.index)

    def _torch_stream(self, stream: Any) -> Any:
        th = self.torch
        if int(stream.ptr) == 0:
            return th.cuda.default_stream(self.index)
        return th.cuda.ExternalStream(int(stream.ptr), device=self._torch_device)

    @contextlib.contextmanager
    def use_stream(self, stream: Any, lib: str | None = None) -> Iterator[Any]:
        """Make ``stream`` ``lib``'s current stream in the block (None: both)."""
        with contextlib.ExitStack() as stack:
            if lib in (None, "cupy"):
                stack.enter_context(self._cupy_stream(stream))
            if lib in (None, "torch"):
                stack.enter_context(self.torch.cuda.stream(self._torch_stream(stream)))
            yield stream

    @contextlib.contextmanager
    def _cupy_stream(self, stream: Any) -> Iterator[None]:
        """``stream`` CuPy's current stream of this device in the block, whichever
        device is current (CuPy enters a stream only while its device is current)."""
        with self.cp.cuda.Device(self.index):
            stream.__enter__()
        try:
            yield
        finally:
            with self.cp.cuda.Device(self.index):
                stream.__exit__(None, None, None)

    def hold(self, stream: Any, seconds: float = 0.3) -> Callable[[], None]:
        """Keep ``stream`` busy: a sleep kernel of about ``seconds`` is queued
        on it. The returned function does nothing (the kernel ends by itself)."""
        with self.activate(), self.torch.cuda.stream(self._torch_stream(stream)):
            self.torch.cuda._sleep(int(seconds * self._hz))
        return lambda: None

    def is_done(self, stream: Any) -> bool:
        return bool(stream.done)

    def synchronize(self) -> None:
        done = self._uploads.before_sync()
        with self.activate():
            self.cp.cuda.Device(self.index).synchronize()
        self._uploads.after_sync(done)

    # -- host memory
    @contextlib.contextmanager
    def pinned(self, shape: Any, dtype: Any, order: str = "C") -> Iterator[np.ndarray]:
        """A zeroed NumPy array in page-locked memory (CuPy's pinned pool), for the block."""
        import cupyx

        a = cupyx.empty_pinned(shape, np.dtype(dtype), order=order)
        a.fill(0)
        yield a

    def staged(self) -> None:
        """CUDA counts no host-thread slot accesses: None (see Emulated.staged)."""
        return None

    # -- memory
    def bytes_in_use(self) -> int:
        """Device memory held by live arrays: CuPy's pool and PyTorch's allocator."""
        self.synchronize()
        with self.activate():
            used = self.cp.get_default_memory_pool().used_bytes()
            return int(used + self.torch.cuda.memory_allocated(self.index))

    @contextlib.contextmanager
    def measure_peak(self, lib: str | None = None) -> Iterator[Peak]:
        """The most device memory ``lib``'s allocator (None: both, summed) had
        in use during the block, above its start. PyTorch: its peak statistic.
        CuPy's pool keeps none: what the pool had to add to its memory during
        the block, its cached free blocks released at the start (never less
        than the peak in use: a freed block is reused or kept, never returned)."""
        th = self.torch
        peak = Peak()
        self.synchronize()
        with self.activate():
            pool = self.cp.get_default_memory_pool()
            pool.free_all_blocks()
            th.cuda.reset_peak_memory_stats(self.index)
            torch_base = th.cuda.memory_allocated(self.index)
            cupy_base = pool.total_bytes()
        yield peak
        self.synchronize()
        with self.activate():
            torch_peak = th.cuda.max_memory_allocated(self.index) - torch_base
            cupy_peak = pool.total_bytes() - cupy_base
        peak.bytes = int({"torch": torch_peak, "cupy": cupy_peak}.get(lib, torch_peak + cupy_peak))

    # -- graph capture
    @contextlib.contextmanager
    def capturing(self, lib: str = "torch") -> Iterator[_CudaCapture]:
        """A capture into a graph on its own stream, CUDA's global capture mode,
        that stream both libraries' current one in the block:
        ``torch.cuda.graph``, or for ``lib="cupy"`` CuPy's
        ``Stream.begin_capture``; made current with ``interop.stream``, as users
        are told to, which lets interop see the capture from other threads.
        Only the latter may end invalidated (:meth:`_CudaCapture.invalidate`):
        PyTorch's ``capture_end`` raises before it restores its current stream
        and its allocator's bookkeeping. CuPy's pool starts with no cached
        block, so an allocation from it in the capture needs ``cudaMalloc``."""
        _check_lib(lib)
        th = self.torch
        with self.activate():  # CuPy's pool must grow (cudaMalloc) to serve it in the capture
            self.cp.get_default_memory_pool().free_all_blocks()
        if lib == "torch":
            graph = th.cuda.CUDAGraph()
            with (
                self.activate(),
                th.cuda.graph(graph),
                interop.stream(th.cuda.current_stream(self.index)),
            ):
                yield _CudaCapture(self, self.cp.cuda.get_current_stream(), lib, graph.replay)
            return
        s = self.stream()
        with self.activate(), interop.stream(s):
            s.begin_capture(self.cp.cuda.runtime.streamCaptureModeGlobal)
            capture = _CudaCapture(self, s, lib)
            try:
                yield capture
            except BaseException:
                with contextlib.suppress(RuntimeError):  # the error in flight is the one to see
                    s.end_capture()
                raise
            graph = s.end_capture()  # raises if the capture was invalidated
        capture._replay = lambda: graph.launch(s)

    # -- devices
    def need_devices(self, n: int) -> None:
        from tests.conftest import _require

        if n > 1:
            _require("INTEROP_REQUIRE_MULTIGPU", n, "multi-GPU test")

    def peer(self, index: int) -> Cuda:
        self.need_devices(index + 1)
        return Cuda(index, self._uploads)

    # -- after the test
    def check_released(self) -> None:
        """Every queued copy done (an asynchronous CUDA error raises here)."""
        self.synchronize()
        free_cached_rings()

    def close(self) -> None:
        self.synchronize()


class _EmulatedCapture:
    """A capture under way on the emulated device (see Emulated.capturing)."""

    def __init__(self, stream: Any, graph: Any) -> None:
        self.stream = stream
        self.graph = graph

    def active(self) -> bool:
        """The capture goes on (it was not ended by an illegal call)."""
        return bool(self.stream.backend.is_capturing(self.stream))

    def operations(self) -> list[str]:
        """The kinds of work recorded so far."""
        return self.graph.operations

    def add_one(self, y: Any) -> None:
        """Record ``y += 1`` into the capture (``y`` of this device)."""
        data = y.data
        self.stream.enqueue("op", lambda: np.add(data, 1, out=data), writes=[y.region])

    def replay(self) -> None:
        self.graph.replay()

    def invalidate(self) -> None:
        """Invalidate the capture as a forbidden call does (its stream synchronised)."""
        with pytest.raises(EmulatedCaptureError):
            self.stream.synchronize()


class _CudaCapture:
    """A capture under way on CUDA (see Cuda.capturing)."""

    def __init__(
        self, device: Cuda, stream: Any, lib: str, replay: Callable[[], None] | None = None
    ) -> None:
        self._device = device
        self.stream = stream  # a CuPy stream: the capturing one
        self.lib = lib  # whose capture it is
        self._replay = replay  # CuPy's: set when the capture ended

    def active(self) -> bool:
        """The capture goes on, not invalidated (CuPy's query raises then)."""
        try:
            return bool(self._device.cp.cuda.runtime.streamIsCapturing(self.stream.ptr))
        except RuntimeError:
            return False

    def operations(self) -> None:
        """Not known on CUDA: None."""
        return None

    def add_one(self, y: Any) -> None:
        """Record ``y += 1`` into the capture (``y`` a tensor: PyTorch's kernel)."""
        y.add_(1)

    def replay(self) -> None:
        assert self._replay is not None, "a graph is replayed after its capture ended"
        self._replay()

    def invalidate(self) -> None:
        """Invalidate the capture as a forbidden call does (its stream
        synchronised); only a capture of ``capturing(lib="cupy")``."""
        assert self.lib == "cupy", "PyTorch's capture cannot end invalidated: use lib='cupy'"
        with pytest.raises(RuntimeError):
            self.stream.synchronize()


def _check_lib(lib: str) -> None:
    if lib not in LIBS:
        raise ValueError(f"expected lib 'cupy' or 'torch' (got {lib!r})")


def _torch_dtype(torch: Any, dtype: np.dtype) -> Any:
    if not dtype.isnative:
        raise ValueError(f"a CUDA tensor has native byte order (got {dtype.str!r})")
    return getattr(torch, dtype.name)


def _numpy_dtype(torch_dtype: Any) -> np.dtype:
    name = str(torch_dtype).removeprefix("torch.")
    return np.dtype(getattr(ml_dtypes, name)) if name in _ML else np.dtype(name)
