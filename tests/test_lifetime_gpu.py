"""Cross-stream lifetime and graph capture on a real GPU.

Both pools hand a freed block straight back out to the next allocation on the
stream it belongs to. Each test here frees a source as soon as the copying
call returns, takes its block back at once from the owner's stream and writes
it, while the stream that does interop's copy is still held back by a sleep
kernel: a copy that did not make the owner's stream wait would read the new
values. The same rules run on CPU through the emulated device
(tests/test_lifetime.py).
"""

from __future__ import annotations

import numpy as np
import pytest

import interop

pytestmark = pytest.mark.gpu

N = 1 << 20  # float32 elements: a 4 MiB block, served from the large pools
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


# ----------------------------------------------------------------- the copying calls


def test_gpu_copy_to_device_source_dropped_at_once(cp, torch):
    """copy_to_device(tensor, cupy out): the tensor's stream waits for the copy."""
    warm(cp, torch)
    x = torch.arange(N, dtype=torch.float32, device="cuda")  # PyTorch's default stream
    consumer = cp.cuda.Stream(non_blocking=True)
    with consumer:
        out = cp.empty(N, dtype=cp.float32)
        hold(torch, consumer.ptr)
        interop.copy_to_device(x, out)  # queued on consumer, behind the sleep
        assert not consumer.done
    p = x.data_ptr()
    del x
    reuse_torch(torch, p)  # written at once, while the copy still waits
    consumer.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(out), expect())


def test_gpu_copy_to_device_conj_temporary_dropped_at_once(cp, torch):
    """A conjugated tensor is resolved into a temporary on PyTorch's stream; both
    it and the source are safe to reuse as soon as the call returns."""
    warm(cp, torch)
    real = torch.arange(N, dtype=torch.float32, device="cuda")
    z = torch.complex(real, torch.ones_like(real)).conj()
    del real
    consumer = cp.cuda.Stream(non_blocking=True)
    with consumer:
        out = cp.empty(N, dtype=cp.complex64)
        out[...] = out  # compile the complex copy
        consumer.synchronize()
        hold(torch, consumer.ptr)
        interop.copy_to_device(z, out)
    del z
    torch.full((N,), 7.0, dtype=torch.complex64, device="cuda")
    torch.full((N,), 7.0, dtype=torch.complex64, device="cuda")
    consumer.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(out), expect() - 1j)


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


@pytest.mark.multigpu
def test_gpu_copy_to_device_peer_copy_source_dropped_at_once(cp, torch):
    warm(cp, torch)
    with cp.cuda.Device(0):
        x = cp.arange(N, dtype=cp.float32)
    with cp.cuda.Device(1):
        consumer = cp.cuda.Stream(non_blocking=True)
        with consumer:
            out = cp.empty(N, dtype=cp.float32)
            hold(torch, consumer.ptr, device=1)
            interop.copy_to_device(x[::-1], out)  # strided: one peer DMA of its span
    p = cptr(x)
    del x
    with cp.cuda.Device(0):
        reuse_cupy(cp, p)
    consumer.synchronize()
    with cp.cuda.Device(1):
        np.testing.assert_array_equal(cp.asnumpy(out), expect()[::-1])


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


def test_gpu_host_copies_refuse_capture_and_keep_it_valid(cp, torch, tmp_path):
    x = torch.arange(N, dtype=torch.float32, device="cuda")
    y = torch.zeros(8, device="cuda")
    host = np.arange(8, dtype=np.float32)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        calls = {
            "copy_to_host": lambda: interop.copy_to_host(x),
            "to_numpy": lambda: interop.to_numpy(x),
            "copy_to_device": lambda: interop.copy_to_device(host),
            "to_torch_cuda": lambda: interop.to_torch(host, device="cuda"),
            "save_npy": lambda: interop.save_npy(x, tmp_path / "x.npy"),
        }
        for name, call in calls.items():
            with pytest.raises(interop.CaptureError, match="capture"):
                call()
            assert torch.cuda.is_current_stream_capturing(), name
        y.add_(1.0)  # the capture still records work
    assert not (tmp_path / "x.npy").exists()
    for k in range(1, 4):
        g.replay()
        torch.cuda.synchronize()
        assert y.tolist() == [float(k)] * 8


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
