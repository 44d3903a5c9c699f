"""Cross-stream lifetime and graph capture, on each test device.

PyTorch's and CuPy's pools hand a freed block straight back out to the next
allocation on the stream it belongs to; so does the emulated device's pool,
which also fails a test when a block is handed out again while work queued on
another stream before the free may still use it. Each device copy interop makes
between two streams is exercised in the configuration of a call that uses it:
the source is dropped as soon as the call returns and its block is taken back
at once on its owner's stream and written, while the copy is still held back
on the destination's stream (a gate on the emulated device, a sleep kernel on
CUDA): a copy that did not make the owner's stream wait would read the new
values (CUDA) or break a rule (emulated).

The exchange calls themselves (to_cupy, to_torch, interop.stream) take CuPy
arrays and CUDA tensors only: their tests are the CUDA-only ones at the end.
"""

from __future__ import annotations

import numpy as np
import pytest

import interop
from interop.pipeline import ring
from tests.helpers import in_threads
from tests.helpers.devices import opened

N = 1 << 20  # float32 elements: a 4 MiB block, served from the pools' large blocks
SHAPE = (1024, 1024)
FILL = bytes([0x55])  # what take_back writes

# The device copies of the exchange and transfer calls, as (source library,
# destination library, source view, destination device): each call's copy is
# interop.copy_to_device(x, out) in that configuration.
SITES = {
    # copy_to_device(tensor, cupy_out), and to_cupy(t, copy=True)
    "torch to cupy": ("torch", "cupy", lambda a: a, 0),
    # to_torch(c, copy=True)
    "cupy to torch": ("cupy", "torch", lambda a: a, 0),
    # to_torch(c) of a reversed view: the packing copy
    "cupy to torch, packed": ("cupy", "torch", lambda a: a[::-1, ::-1], 0),
    # to_torch(c, device=other)
    "cupy to torch on another device": ("cupy", "torch", lambda a: a, 1),
    # to_cupy(t, device=other), and a CuPy array's move
    "torch to cupy on another device": ("torch", "cupy", lambda a: a, 1),
    # copy_to_device(x, out) across devices, strided: one peer copy of its span
    "cupy to cupy on another device, strided": ("cupy", "cupy", lambda a: a.T, 1),
    "cupy to cupy on another device, reversed": ("cupy", "cupy", lambda a: a[::-1], 1),
}


def _written_by_take_back(device, taken):
    for t in taken:
        assert device.to_numpy(t).tobytes() == FILL * t.nbytes


@pytest.mark.parametrize("site", list(SITES))
def test_a_copied_source_may_be_dropped_as_soon_as_the_call_returns(device_kind, site):
    src_lib, dst_lib, view, dst_index = SITES[site]
    with opened(device_kind, devices=2, delay=0.0002) as machine:
        machine.need_devices(dst_index + 1)  # on CUDA: two GPUs (multi-GPU policy)
        dx, dout = machine, machine.peer(dst_index)
        a = np.arange(N, dtype=np.float32).reshape(SHAPE)
        expect = view(a)
        owner, consumer = dx.stream(), dout.stream()
        with dx.use_stream(owner, lib=src_lib):
            x = dx.asarray(a, lib=src_lib)  # allocated and written on owner
        with dout.activate(), dout.use_stream(consumer, lib=dst_lib):
            out = dout.empty(expect.shape, expect.dtype, lib=dst_lib)  # on consumer
        release = dout.hold(consumer, 0.5)  # the copy below stays queued behind this
        try:
            with (
                dout.activate(),
                dout.use_stream(consumer, lib=dst_lib),
                dx.use_stream(owner, lib=src_lib),
            ):
                interop.copy_to_device(view(x), out)
                assert not dout.is_done(consumer)  # the copy is still queued
            p = dx.ptr(x)
            del x  # a copying call returned: the caller may drop its source
            with dx.activate(), dx.use_stream(owner, lib=src_lib):
                taken = dx.take_back(p, a.shape, a.dtype, lib=src_lib)  # x's block, written now
        finally:
            release()
        np.testing.assert_array_equal(dout.to_numpy(out), expect)
        _written_by_take_back(dx, taken)


def test_a_resolved_temporary_and_its_source_may_be_dropped_at_once(device):
    """A source with a bit to apply (the emulated inverted view; a CUDA tensor
    with the conjugate bit) is resolved into a temporary on its stream: both it
    and the source may be reused at once on that stream, while the copy on
    another stream still waits."""
    a = (np.arange(N // 2, dtype=np.float32) + 1j).astype(np.complex64)  # 4 MiB
    owner, consumer = device.stream(), device.stream()
    with device.use_stream(owner, lib="torch"):
        x = device.asarray(a, lib="torch")
    with device.use_stream(consumer, lib="cupy"):
        out = device.empty(a.shape, a.dtype)
    release = device.hold(consumer, 0.5)
    try:
        with device.use_stream(consumer, lib="cupy"), device.use_stream(owner, lib="torch"):
            src, expect = device.lazy(x, a)
            assert interop.copy_to_device(src, out) is out
            assert not device.is_done(consumer)
        p = device.ptr(x)
        del x, src
        with device.use_stream(owner, lib="torch"):
            taken = device.take_back(p, a.shape, a.dtype, lib="torch")  # the source's block
            # and another of that size: the temporary's
            taken.append(device.asarray(np.frombuffer(FILL * a.nbytes, a.dtype), lib="torch"))
    finally:
        release()
    assert device.to_numpy(out).tobytes() == expect.tobytes()
    _written_by_take_back(device, taken)


def test_one_stream_needs_no_events(device):
    """Both libraries on one stream: stream order covers both directions, no
    event is made for the copy, and the source may be dropped at once."""
    a = np.arange(N, dtype=np.float32)
    s = device.stream()
    with device.use_stream(s):
        x = device.asarray(a, lib="torch")
        out = device.empty(a.shape, a.dtype)
        if device.emulated:
            before = device.emulated.counts["event"]
        interop.copy_to_device(x, out)
        if device.emulated:  # the emulated device counts the events made
            assert device.emulated.counts["event"] == before
        p = device.ptr(x)
        del x
        taken = device.take_back(p, a.shape, a.dtype, lib="torch")
    np.testing.assert_array_equal(device.to_numpy(out), a)
    _written_by_take_back(device, taken)


# ----------------------------------------------------------------- graph capture


@pytest.mark.parametrize("lib", ["cupy", "torch"])
def test_host_copies_refuse_a_capture_and_keep_it_valid(device, tmp_path, lib):
    a = np.arange(4096.0)
    x = device.asarray(a, lib)
    y = device.asarray(np.zeros(8), lib="torch")  # for work recorded into the capture
    path = tmp_path / "x.npy"
    np.save(path, a[::-1])
    before = path.read_bytes()
    device.synchronize()
    calls = {
        "copy_to_host": lambda: interop.copy_to_host(x),
        "copy_to_host_async": lambda: interop.copy_to_host_async(x),
        "copy_to_device": lambda: interop.copy_to_device(a, x),
        "save_npy": lambda: interop.save_npy(x, path),
        "save_npy, a new file": lambda: interop.save_npy(x, tmp_path / "new.npy"),
        "load_npy": lambda: interop.load_npy(path, x),
    }
    with device.capturing() as capture:
        for name, call in calls.items():
            with pytest.raises(interop.CaptureError, match="capture"):
                call()
            assert capture.active(), name
        if device.emulated:
            assert capture.operations() == []  # nothing of the refused calls recorded
        capture.add_one(y)  # the capture still records work
    assert path.read_bytes() == before  # the save refused before touching it
    assert not (tmp_path / "new.npy").exists()
    for k in range(1, 4):
        capture.replay()
        np.testing.assert_array_equal(device.to_numpy(y), np.full(8, float(k)))
    np.testing.assert_array_equal(device.to_numpy(x), a)


def test_a_capture_elsewhere_on_the_device_refuses_host_copies(device):
    """CUDA's global capture mode: a pinned allocation or a synchronisation
    breaks a capture on any stream, so host copies refuse then too. The copy's
    own stream is not in the capture; PyTorch's current stream is, or (both
    libraries on the other stream) neither: the capture is seen because its
    stream was made current with interop.stream. (The CUDA runtime cannot list
    a process's captures; the emulated device knows them all.)"""
    a = np.arange(1024.0)
    other = device.stream()
    with device.use_stream(other):
        x = device.asarray(a)
    device.synchronize()
    with device.capturing() as capture:
        for lib in ["cupy", None]:
            with (
                device.use_stream(other, lib=lib),
                pytest.raises(interop.CaptureError, match="capture"),
            ):
                interop.copy_to_host(x)
            assert capture.active()
        if device.emulated:
            assert capture.operations() == []
    np.testing.assert_array_equal(device.to_numpy(x), a)


def test_a_device_copy_into_a_capturing_stream_from_outside_it_is_refused(device):
    """The destination's stream captures, the source's does not: waiting on the
    source would break the capture (cudaErrorStreamCaptureIsolation), so the
    copy is refused before anything is queued."""
    a = np.arange(N, dtype=np.float32)
    s = device.stream()
    with device.use_stream(s, lib="torch"):
        x = device.asarray(a, lib="torch")
    out = device.asarray(np.zeros_like(a))
    device.synchronize()
    with device.capturing() as capture:
        # the source's stream (PyTorch's current one) is outside the capture
        with (
            device.use_stream(s, lib="torch"),
            pytest.raises(interop.CaptureError, match="capture"),
        ):
            interop.copy_to_device(x, out)
        assert capture.active()
        if device.emulated:
            assert capture.operations() == []
    np.testing.assert_array_equal(device.to_numpy(out), np.zeros_like(a))


def test_a_result_is_not_allocated_from_cupys_pool_inside_a_capture(device):
    """copy_to_device(x) of device data without out allocates its result from
    CuPy's pool, as to_cupy(t, copy=True) does; the pool grows with cudaMalloc,
    which CUDA's global capture mode (torch.cuda.graph's) forbids: the capture
    was invalidated with a raw error, depending on the pool's state. It is
    refused first, before anything is allocated or queued."""
    a = np.arange(N, dtype=np.float32)
    x = device.asarray(a, lib="torch")
    y = device.asarray(np.zeros(8), lib="torch")
    device.synchronize()
    with device.capturing() as capture:
        allocs = device.emulated.counts["device_alloc"] if device.emulated else None
        with pytest.raises(interop.CaptureError, match="allocates its result"):
            interop.copy_to_device(x)
        assert capture.active()
        if device.emulated:
            assert device.emulated.counts["device_alloc"] == allocs
            assert capture.operations() == []
        capture.add_one(y)
    capture.replay()
    np.testing.assert_array_equal(device.to_numpy(y), np.ones(8))


def test_a_device_copy_out_of_a_capture_onto_the_legacy_stream_is_refused(device):
    """The source's stream captures and the destination's is the legacy default
    stream (CuPy's null stream inside torch.cuda.graph without interop.stream,
    as in to_cupy(t, copy=True)): that stream cannot join the capture (CUDA
    fails its wait on the capture's event and invalidates the capture), so the
    copy is refused before anything is queued, and the capture stays valid."""
    a = np.arange(N, dtype=np.float32)
    x = device.asarray(a, lib="torch")
    out = device.asarray(np.zeros_like(a))
    y = device.asarray(np.zeros(8), lib="torch")
    device.synchronize()
    with device.capturing() as capture:
        with (
            device.use_stream(device.default_stream, lib="cupy"),
            pytest.raises(interop.CaptureError, match="legacy default stream"),
        ):
            interop.copy_to_device(x, out)
        assert capture.active()
        if device.emulated:
            assert capture.operations() == []
        capture.add_one(y)
    capture.replay()
    np.testing.assert_array_equal(device.to_numpy(y), np.ones(8))
    np.testing.assert_array_equal(device.to_numpy(out), np.zeros_like(a))


def test_pinned_frees_in_another_thread_wait_for_a_capture_to_end(device):
    """CUDA's global capture mode (torch.cuda.graph's) forbids freeing pinned
    memory while a capture is under way in any thread: the staging ring a
    transfer left in the cache, freed by another thread during a capture, is
    freed only once the capture has ended (as PyTorch's allocator defers its
    frees), and the capture stays valid. (On CUDA interop sees the capture
    because its stream was made current with interop.stream.)"""
    a = np.arange(N, dtype=np.float32)
    x = device.asarray(a)
    y = device.asarray(np.zeros(8), lib="torch")
    np.testing.assert_array_equal(interop.copy_to_host(x), a)  # its ring stays cached
    assert ring.cached_buffers() > 0
    pinned = len(device.emulated.host_buffers) if device.emulated else None
    device.synchronize()
    with device.capturing() as capture:
        in_threads(lambda i: ring.free_cached_rings(), 1)  # raises what the thread raised
        assert ring.cached_buffers() == 0
        if device.emulated:
            assert len(device.emulated.host_buffers) == pinned  # none freed yet
        assert ring.waiting_frees() > 0
        assert capture.active()
        capture.add_one(y)
    ring.free_cached_rings()  # the capture has ended: the frees that waited run now
    assert ring.waiting_frees() == 0
    capture.replay()
    np.testing.assert_array_equal(device.to_numpy(y), np.ones(8))


def test_an_invalidated_capture_is_refused_with_capture_error(device):
    """A capture that a forbidden call invalidated is under way until it ends,
    and CuPy's query of its stream then raises a plain RuntimeError (so does
    the emulated device's): interop counts it as a capture and refuses with
    CaptureError, instead of letting the query's error out. (CuPy's capture on
    CUDA: PyTorch's cannot end invalidated without breaking its allocator.)"""
    a = np.arange(N, dtype=np.float32)
    other = device.stream()
    with device.use_stream(other, lib="torch"):
        x = device.asarray(a, lib="torch")
    out = device.asarray(np.zeros_like(a))
    device.synchronize()

    def into_the_capture():  # a device copy into the capturing stream from PyTorch's, outside it
        with device.use_stream(other, lib="torch"):
            interop.copy_to_device(x, out)

    calls = {"copy_to_host": lambda: interop.copy_to_host(x), "copy_to_device": into_the_capture}
    got = {}

    def capture_and_call():
        with device.capturing(lib="cupy") as capture:
            capture.invalidate()
            for name, call in calls.items():
                try:
                    call()
                except Exception as exc:  # checked after the capture ended
                    got[name] = exc

    with pytest.raises(RuntimeError, match="StreamCaptureInvalidated"):
        capture_and_call()
    assert {name: type(exc) for name, exc in got.items()} == dict.fromkeys(
        calls, interop.CaptureError
    ), got
    np.testing.assert_array_equal(device.to_numpy(out), np.zeros_like(a))


# ----------------------------------------------------------------- CUDA only: the exchange calls
# to_cupy / to_torch / interop.stream take CuPy arrays and CUDA tensors only (the
# emulated device's arrays are no DLPack producers); the copies they make are the
# SITES above.

HOLD = 400_000_000  # cycles of torch.cuda._sleep: a few hundred milliseconds


def cptr(a):
    return int(a.data.ptr)


def hold(torch, handle, device=None):
    """Queue a long sleep kernel on the stream with raw handle ``handle``."""
    dev = torch.device("cuda", torch.cuda.current_device() if device is None else device)
    with torch.cuda.device(dev), torch.cuda.stream(torch.cuda.ExternalStream(handle, device=dev)):
        torch.cuda._sleep(HOLD)


def warm(cp, torch):
    """Compile the copy kernels the calls below use, before any sleep is queued
    (a compile after the sleep would let the sleep run out)."""
    a = cp.arange(8, dtype=cp.float32)
    b = cp.empty(8, dtype=cp.float32)
    b[...] = a
    b[...] = a[::-1]
    a.fill(7.0)
    t = torch.arange(8, dtype=torch.float32, device="cuda")
    t.fill_(7.0)
    cp.cuda.Device().synchronize()
    cp.get_default_memory_pool().free_all_blocks()  # only the test's blocks come back
    torch.cuda.empty_cache()


def reuse_torch(torch, ptr, device=None):
    """Take the block at ``ptr`` back from PyTorch's pool on its current stream
    (and write it at once); fail if the pool did not hand it out (the premise)."""
    dev = torch.device("cuda", torch.cuda.current_device() if device is None else device)
    taken = []
    for _ in range(3):
        taken.append(torch.empty(N, dtype=torch.float32, device=dev))
        taken[-1].fill_(7.0)
        if taken[-1].data_ptr() == ptr:
            return taken
    raise AssertionError("PyTorch's pool did not hand the freed block out again")


def reuse_cupy(cp, ptr):
    """The same for CuPy's pool, on CuPy's current stream."""
    taken = []
    for _ in range(3):
        taken.append(cp.empty(N, dtype=cp.float32))
        taken[-1].fill(7.0)
        if cptr(taken[-1]) == ptr:
            return taken
    raise AssertionError("CuPy's pool did not hand the freed block out again")


def expect(n=N):
    return np.arange(n, dtype=np.float32)


@pytest.mark.gpu
def test_gpu_to_cupy_copy_source_dropped_at_once(cp, torch):
    warm(cp, torch)
    t = torch.arange(N, dtype=torch.float32, device="cuda")
    consumer = cp.cuda.Stream(non_blocking=True)
    with consumer:
        hold(torch, consumer.ptr)
        c = interop.to_cupy(t, copy=True)
        assert not consumer.done
    p = t.data_ptr()
    del t
    reuse_torch(torch, p)
    consumer.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(c), expect())


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["copy", "packed"])
def test_gpu_to_torch_copy_source_dropped_at_once(cp, torch, case):
    """to_torch(c, copy=True) and the packing copy of a reversed view run on
    PyTorch's stream; CuPy's stream waits for them before reusing c."""
    warm(cp, torch)
    owner = cp.cuda.Stream(non_blocking=True)
    consumer = torch.cuda.Stream()
    with owner:
        c = cp.arange(N, dtype=cp.float32)
        if case == "packed":
            c = c[::-1].copy()[::-1]  # arange again, as a reversed view of its own block
        with torch.cuda.stream(consumer):
            torch.cuda._sleep(HOLD)
            t = interop.to_torch(c, copy=True) if case == "copy" else interop.to_torch(c)
            assert not consumer.query()
        p = cptr(c) if case == "copy" else cptr(c[::-1])
        del c
        reuse_cupy(cp, p)  # CuPy's pool, on the owner's stream
    consumer.synchronize()
    np.testing.assert_array_equal(t.cpu().numpy(), expect())


@pytest.mark.gpu
def test_gpu_a_copy_to_torch_is_pytorch_memory(cp, torch):
    """The copy of a CuPy array is allocated by PyTorch (counted by
    torch.cuda.memory_allocated, and reused on PyTorch's stream)."""
    c = cp.arange(N, dtype=cp.float32)
    before = torch.cuda.memory_allocated()
    t = interop.to_torch(c, copy=True)
    assert torch.cuda.memory_allocated() - before >= 4 * N
    assert t.is_contiguous()
    assert t.data_ptr() != cptr(c)
    np.testing.assert_array_equal(t.cpu().numpy(), expect())


@pytest.mark.gpu
@pytest.mark.multigpu
def test_gpu_to_torch_on_another_device_source_dropped_at_once(cp, torch):
    warm(cp, torch)
    with cp.cuda.Device(0):
        owner = cp.cuda.Stream(non_blocking=True)
    with torch.cuda.device(1):
        consumer = torch.cuda.Stream()
    with cp.cuda.Device(0), owner:
        c = cp.arange(N, dtype=cp.float32)
        with torch.cuda.device(1), torch.cuda.stream(consumer):
            torch.cuda._sleep(HOLD)
            t = interop.to_torch(c, device=1)
        p = cptr(c)
        del c
        reuse_cupy(cp, p)
    consumer.synchronize()
    assert t.device == torch.device("cuda", 1)
    np.testing.assert_array_equal(t.cpu().numpy(), expect())


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.parametrize("source", ["tensor", "cupy"])
def test_gpu_to_cupy_on_another_device_source_dropped_at_once(cp, torch, source):
    """The peer copy runs on device 1's stream; the source's stream on device 0
    (PyTorch's for a tensor, CuPy's for an array) waits for it."""
    warm(cp, torch)
    with cp.cuda.Device(1):
        consumer = cp.cuda.Stream(non_blocking=True)
    with cp.cuda.Device(0):
        x = (
            torch.arange(N, dtype=torch.float32, device="cuda:0")
            if source == "tensor"
            else cp.arange(N, dtype=cp.float32)
        )
    with cp.cuda.Device(1), consumer:
        hold(torch, consumer.ptr, device=1)
        moved = interop.to_cupy(x, device=1)
    p = x.data_ptr() if source == "tensor" else cptr(x)
    del x
    with cp.cuda.Device(0):
        if source == "tensor":
            reuse_torch(torch, p, device=0)
        else:
            reuse_cupy(cp, p)
    consumer.synchronize()
    with cp.cuda.Device(1):
        np.testing.assert_array_equal(cp.asnumpy(moved), expect())


@pytest.mark.gpu
def test_gpu_one_stream_needs_no_events(cp, torch):
    """Under interop.stream both libraries use one stream: nothing to order, and
    the copy is still right when the source is dropped at once."""
    s = torch.cuda.Stream()
    with interop.stream(s):
        x = torch.arange(N, dtype=torch.float32, device="cuda")
        c = interop.to_cupy(x, copy=True)
        del x
        torch.full((N,), 7.0, device="cuda")
    s.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(c), expect())


# ----------------------------------------------------------------- graph capture


@pytest.mark.gpu
def test_gpu_exchanges_through_the_host_refuse_capture_and_keep_it_valid(cp, torch, tmp_path):
    """to_numpy of a CUDA tensor, a host array to a new CUDA array or tensor:
    each copies through the host, refused inside a capture that stays valid.
    Those that make a CuPy array refuse before allocating it: CuPy's pool grows
    with cudaMalloc, which the capture forbids (CUDA only: the result is a CuPy
    array; the emulated device's copy is test_a_result_is_not_allocated_…)."""
    x = torch.arange(N, dtype=torch.float32, device="cuda")
    y = torch.zeros(8, device="cuda")
    host = np.arange(8, dtype=np.float32)
    np.save(tmp_path / "h.npy", host)
    cp.get_default_memory_pool().free_all_blocks()  # a CuPy allocation must grow the pool
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        calls = {
            "to_numpy": lambda: interop.to_numpy(x),
            "copy_to_device": lambda: interop.copy_to_device(host),
            "to_torch_cuda": lambda: interop.to_torch(host, device="cuda"),
            "to_cupy": lambda: interop.to_cupy(host),
            "load_npy": lambda: interop.load_npy(tmp_path / "h.npy", device="cuda"),
            # a device copy, its result from CuPy's pool (CuPy on its null stream)
            "to_cupy_copy": lambda: interop.to_cupy(x, copy=True),
        }
        for name, call in calls.items():
            with pytest.raises(interop.CaptureError, match="capture"):
                call()
            assert torch.cuda.is_current_stream_capturing(), name
        y.add_(1.0)  # the capture still records work
    for k in range(1, 4):
        g.replay()
        torch.cuda.synchronize()
        assert y.tolist() == [float(k)] * 8


@pytest.mark.gpu
def test_gpu_zero_copy_exchange_inside_capture(cp, torch):
    x = torch.ones(N, device="cuda")
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), interop.stream(torch.cuda.current_stream()):
        c = interop.to_cupy(x)
        c *= 2.0  # CuPy's kernel, captured on the same stream
        back = interop.to_torch(c)
        back.add_(1.0)
    assert cptr(c) == x.data_ptr() == back.data_ptr()
    g.replay()
    torch.cuda.synchronize()
    assert x[:4].tolist() == [3.0] * 4
    g.replay()
    torch.cuda.synchronize()
    assert x[:4].tolist() == [7.0] * 4


@pytest.mark.gpu
def test_gpu_exchange_across_streams_refuses_capture(cp, torch):
    """Inside torch.cuda.graph without interop.stream, CuPy's current stream is
    not the capturing one: ordering it would break the capture, so the
    exchange refuses before queuing anything, and the capture stays valid."""
    x = torch.ones(8, device="cuda")
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    side = cp.cuda.Stream(non_blocking=True)
    with torch.cuda.graph(g):
        with side, pytest.raises(interop.CaptureError, match=r"interop\.stream"):
            interop.to_cupy(x)
        x.add_(1.0)
    g.replay()
    torch.cuda.synchronize()
    assert x.tolist() == [2.0] * 8


@pytest.mark.gpu
def test_gpu_pytorchs_refused_query_beside_a_blocking_capture_counts_as_capturing(cp, torch):
    """CUDA only (the emulated device has no blocking streams): while a blocking
    stream captures, the legacy default stream cannot be queried
    (cudaErrorStreamCaptureImplicit), and PyTorch's is_current_stream_capturing()
    raises when its current stream is that one. An exchange between CuPy's and
    PyTorch's current streams, and a host copy, count that as a capture: they
    raise CaptureError before queuing anything, and the capture ends valid."""
    t = torch.arange(8, dtype=torch.float32, device="cuda")
    c = cp.arange(8, dtype=cp.float32)
    y = cp.zeros(8, dtype=cp.float32)
    y += 1  # the captured kernel, compiled before the capture
    torch.cuda.synchronize()
    blocking = cp.cuda.Stream()  # not non_blocking: it synchronises with the legacy stream
    side = cp.cuda.Stream(non_blocking=True)
    assert torch.cuda.current_stream().cuda_stream == 0  # PyTorch on the legacy stream
    with blocking:
        blocking.begin_capture()
        try:
            with pytest.raises(RuntimeError):
                torch.cuda.is_current_stream_capturing()  # the premise
            with side:  # CuPy's current stream: neither capturing nor PyTorch's
                for call in (lambda: interop.to_cupy(t), lambda: interop.copy_to_host(c)):
                    with pytest.raises(interop.CaptureError, match="capture"):
                        call()
            y += 1  # captured
        finally:
            graph = blocking.end_capture()  # raises if the capture was invalidated
    graph.launch(blocking)
    blocking.synchronize()
    assert y.tolist() == [3.0] * 8


@pytest.mark.gpu
def test_gpu_to_torch_copy_out_of_a_cupy_capture_onto_the_legacy_stream_is_refused(cp, torch):
    """CUDA only (the exchange calls take CuPy arrays and CUDA tensors; the
    copy itself is test_a_device_copy_out_of_a_capture_onto_the_legacy_stream_…):
    to_torch(c, copy=True) inside CuPy's capture, with PyTorch on its default
    (legacy) stream, is refused before anything is queued; the capture ends valid."""
    c = cp.arange(N, dtype=cp.float32)
    torch.empty(N, device="cuda")  # freed at once: cached, PyTorch's result needs no cudaMalloc
    y = cp.zeros(8, dtype=cp.float32)
    y += 1  # the captured kernel, compiled before the capture
    torch.cuda.synchronize()
    s = cp.cuda.Stream(non_blocking=True)
    assert torch.cuda.current_stream().cuda_stream == 0
    with s:
        s.begin_capture(cp.cuda.runtime.streamCaptureModeGlobal)
        try:
            with pytest.raises(interop.CaptureError, match="legacy default stream"):
                interop.to_torch(c, copy=True)
            y += 1  # captured
        finally:
            graph = s.end_capture()  # raises if the capture was invalidated
    graph.launch(s)
    s.synchronize()
    assert y.tolist() == [3.0] * 8


@pytest.mark.gpu
def test_gpu_a_copy_inside_a_capture_may_allocate_from_pytorchs_graph_pool(cp, torch):
    """Under use_torch_allocator CuPy's result comes from PyTorch's pool, which
    serves a capture from the graph's private pool (no cudaMalloc the capture
    forbids): to_cupy(t, copy=True) inside torch.cuda.graph is captured and
    replayed."""
    x = torch.arange(8, dtype=torch.float32, device="cuda")
    with interop.use_torch_allocator():
        interop.to_cupy(x, copy=True)  # the copy kernel, compiled before the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with (
        torch.cuda.graph(g),
        interop.stream(torch.cuda.current_stream()),
        interop.use_torch_allocator(),
    ):
        c = interop.to_cupy(x, copy=True)
    x.add_(1.0)
    g.replay()
    torch.cuda.synchronize()
    assert cp.asnumpy(c).tolist() == (np.arange(8) + 1.0).tolist()


@pytest.mark.gpu
def test_gpu_pinned_frees_and_unpins_in_another_thread_wait_for_a_capture(cp, torch):
    """CUDA only (empty_pinned and pin are CUDA's page-locked memory; the ring's
    frees are test_pinned_frees_in_another_thread_wait_…): an empty_pinned
    buffer dropped and a pinned array unpinned in another thread during a
    capture (global mode, seen through interop.stream) are freed and
    unregistered once it has ended; the capture stays valid."""
    from interop.pipeline.cuda import cuda_backend

    assert ring.waiting_frees() == 0
    box = [interop.empty_pinned(1 << 20, np.uint8)]
    b = np.zeros(1 << 20, np.uint8)
    handle = interop.pin(b)
    y = torch.zeros(8, device="cuda")
    torch.cuda.synchronize()

    def in_another_thread(i):
        box.pop()  # the last reference: its finalizer runs here
        handle.unpin()

    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), interop.stream(torch.cuda.current_stream()):
        in_threads(in_another_thread, 1)
        assert ring.waiting_frees() == 2
        y.add_(1.0)
    g.replay()
    torch.cuda.synchronize()
    assert y.tolist() == [1.0] * 8
    assert cuda_backend(0).is_pinned(b.ctypes.data, b.nbytes)  # not unregistered yet
    ring.free_waiting()  # the capture has ended
    assert ring.waiting_frees() == 0
    assert not cuda_backend(0).is_pinned(b.ctypes.data, b.nbytes)
