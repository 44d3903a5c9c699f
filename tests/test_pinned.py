"""Pinned host memory: copies whose host side is already page-locked skip the
staging ring (the schedule's direct form), on each test device: the emulated
one, whose DMAs reach only live page-locked buffers and whose streams enforce
CUDA's ordering rules, and a CUDA device under the ``gpu`` marker. The kinds of
page-locked memory CUDA itself recognises (PyTorch's pin_memory,
cudaHostRegister) are the ``gpu``-only tests at the end."""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import pytest

import interop
from interop.pipeline import trace
from interop.pipeline.ring import cached_rings, free_cached_rings
from interop.testing import EmulatedDeviceError
from tests.helpers import NUMPY_DTYPES, pinned, sample, staged
from tests.helpers.devices import opened
from tests.pipeline.test_schedule import CHUNK, STEPS, check_released, make_device, raw

# ----------------------------------------------------------------- values, no ring


@pytest.mark.parametrize("lib", ["cupy", "torch"])
@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_a_pinned_out_is_filled_by_dmas_alone(device, dtype, lib):
    a = sample((300, 70), dtype)
    d = device.asarray(a, lib)
    step = STEPS[lib]
    for src, expect in ((d, a), (d.T, a.T), (d[step], a[step])):
        with device.pinned(expect.shape, dtype) as out:
            if device.emulated:
                allocs = device.emulated.counts["host_alloc"]
            assert interop.copy_to_host(src, out, chunk_bytes=CHUNK) is out
            assert raw(out) == raw(expect)
            if device.emulated:
                assert device.emulated.counts["host_alloc"] == allocs  # no staging ring
    if device.emulated:
        assert device.staged() == 0  # no host thread touched a slot
    assert cached_rings() == 0  # no ring was borrowed (a staged copy caches its ring)


@pytest.mark.parametrize("lib", ["cupy", "torch"])
@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_a_pinned_source_reaches_the_device_by_dmas_alone(device, dtype, lib):
    a = sample((300, 70), dtype)
    with device.pinned(a.shape, dtype) as src:
        src[...] = a
        out = device.empty(a.shape, dtype, lib)
        assert interop.copy_to_device(src, out, chunk_bytes=CHUNK) is out
        assert raw(device.to_numpy(out)) == raw(a)
        transposed = device.empty((70, 300), dtype, lib)
        interop.copy_to_device(src, transposed.T, chunk_bytes=CHUNK)  # unpacked on the device
        assert raw(device.to_numpy(transposed).T) == raw(a)
    if device.emulated:
        assert device.staged() == 0
    assert cached_rings() == 0


@pytest.mark.parametrize("direction", ["d2h", "h2d"])
def test_chunks_of_unequal_sizes_land_at_their_own_offsets(device, direction):
    """A (3, 100, 700) float64 array in 64 KiB chunks: 11 rows, then 1 row at
    the end of each leading index, so chunk i does not start at i * sizes[0]."""
    a = sample((3, 100, 700), np.float64, seed=4)
    with device.pinned(a.shape, a.dtype) as host:
        if direction == "d2h":
            interop.copy_to_host(device.asarray(a), host, chunk_bytes=CHUNK)
            got = host
        else:
            host[...] = a
            out = device.empty(a.shape, a.dtype)
            interop.copy_to_device(host, out, chunk_bytes=CHUNK)
            got = device.to_numpy(out)
        assert raw(got) == raw(a)
    if device.emulated:
        assert device.staged() == 0
    assert cached_rings() == 0


@pytest.mark.parametrize("name", ["float32", "bfloat16", "complex64"])
def test_a_pinned_cpu_tensor_source_is_copied_directly(device, torch, name):
    t = torch.arange(6000, dtype=torch.float32).reshape(60, 100).to(getattr(torch, name))
    expect = interop.to_numpy(t).copy()
    with device.pinned(expect.shape, expect.dtype) as buf:
        src = torch.from_numpy(buf.view(np.uint8)).view(t.dtype).reshape(t.shape)
        src.copy_(t)
        out = device.empty(expect.shape, expect.dtype, lib="torch")
        interop.copy_to_device(src, out, chunk_bytes=CHUNK)
        assert raw(device.to_numpy(out)) == raw(expect)
    if device.emulated:
        assert device.staged() == 0
    assert cached_rings() == 0


def test_the_direct_copy_waits_for_the_producer_stream(device):
    """The DMAs are ordered after work queued on the data's stream before the
    call, and the call returns only after they are done."""
    a = sample((512, 256), np.float64)
    producer = device.stream()
    with device.use_stream(producer):
        release = device.hold(producer, 1.0)
        d = device.asarray(a)  # written on the producer stream, after the hold
        with device.pinned(a.shape, a.dtype) as out:
            transfer = interop.copy_to_host_async(d, out, chunk_bytes=CHUNK)
            time.sleep(0.05)
            assert transfer.bytes_done == 0
            assert not out.any()  # nothing copied before the producer's work ran
            release()
            transfer.result(timeout=60)
            assert raw(out) == raw(a)
        # the other way: work queued on the out's stream before the call lands first
        device.hold(producer, 0.2)
        back = device.asarray(np.ones_like(a))  # written on the producer, after the hold
        with device.pinned(a.shape, a.dtype) as src:
            src[...] = a[::-1]
            interop.copy_to_device(src, back, chunk_bytes=CHUNK)
            assert raw(device.to_numpy(back)) == raw(a[::-1])
    if device.emulated:
        assert device.staged() == 0
    assert cached_rings() == 0  # both copies were direct


def test_a_resolved_source_outlives_its_direct_dma(device):
    """A lazily transformed source (the emulated inverted view, a CUDA tensor's
    negative bit) is resolved chunk by chunk into temporaries of its allocator;
    each must stay alive until its DMA into the pinned out has read it."""
    a = np.arange(1 << 20, dtype=np.float32)
    src, expect = device.lazy(device.asarray(a, lib="torch"), a)
    with device.pinned(a.shape, a.dtype) as out:
        for _ in range(3):
            out.fill(0)
            assert interop.copy_to_host(src, out, chunk_bytes=1 << 16) is out
            assert raw(out) == raw(expect)
    assert cached_rings() == 0


# ----------------------------------------------------------------- what goes through the ring


def test_pinned_memory_the_dmas_cannot_use_goes_through_the_ring(device, torch):
    a = sample((300, 70), np.float32)
    d = device.asarray(a)
    z = sample((60, 100), np.complex64)
    seen = [device.staged()]

    def staged_once():
        """The copy just made went through a staging ring (and gave it back)."""
        assert cached_rings() == 1
        free_cached_rings()
        seen.append(device.staged())

    free_cached_rings()
    with device.pinned(a.shape, a.dtype, order="F") as out:  # pinned, not C-contiguous
        interop.copy_to_host(d, out, chunk_bytes=CHUNK)
        np.testing.assert_array_equal(out, a)
    staged_once()
    with device.pinned((600, 70), a.dtype) as whole:  # pinned, strided view
        interop.copy_to_host(d, whole[::2], chunk_bytes=CHUNK)
        np.testing.assert_array_equal(whole[::2], a)
        assert not whole[1::2].any()
    staged_once()
    with device.pinned(a.shape, ">f4") as big:  # pinned, non-native byte order
        big[...] = a
        out = device.empty(a.shape, a.dtype)
        interop.copy_to_device(big, out, chunk_bytes=CHUNK)
        np.testing.assert_array_equal(device.to_numpy(out), a)
    staged_once()
    with device.pinned(z.shape, z.dtype) as buf:  # pinned, with the conjugate bit
        buf[...] = z
        got = device.empty(z.shape, z.dtype)
        interop.copy_to_device(torch.from_numpy(buf).conj(), got, chunk_bytes=CHUNK)
        np.testing.assert_array_equal(device.to_numpy(got), z.conj())
    staged_once()
    out = interop.copy_to_host(d, np.zeros_like(a), chunk_bytes=CHUNK)  # pageable
    np.testing.assert_array_equal(out, a)
    staged_once()
    if device.emulated:  # each copy went through the ring's host threads: its chunks, at least
        assert all(later > earlier for earlier, later in itertools.pairwise(seen))


# ----------------------------------------------------------------- progress, cancel, faults


def test_progress_counts_chunks_the_dmas_completed_into_a_pinned_out(device_kind):
    a = sample((512, 256), np.float64)
    prefixes = []
    with opened(device_kind, delay=0.002) as device:
        d = device.asarray(a)
        with device.pinned(a.shape, a.dtype) as host:

            def progress(done, total):
                prefixes.append((done, raw(host)[:done] == raw(a)[:done]))

            interop.copy_to_host(d, host, chunk_bytes=CHUNK, progress=progress)
        if device.emulated:
            assert device.staged() == 0
        assert cached_rings() == 0
    assert [done for done, _ in prefixes] == list(range(CHUNK, a.nbytes + 1, CHUNK))
    assert all(ok for _, ok in prefixes)


def test_progress_counts_chunks_the_dmas_completed_from_a_pinned_source():
    """Emulated only: the callback reads the device memory directly (host memory
    there), without a synchronisation that would complete the copies first."""
    device = make_device(delay=0.002)
    a = sample((512, 256), np.float64)
    prefixes = []
    with pinned(device, a.shape, a.dtype) as host:
        host[...] = a
        out = device.empty(a.shape, a.dtype)

        def progress(done, total):  # out's chunks up to done were seen complete
            prefixes.append((done, raw(out.data)[:done] == raw(a)[:done]))

        interop.copy_to_device(host, out, chunk_bytes=CHUNK, progress=progress)
    assert [done for done, _ in prefixes] == list(range(CHUNK, a.nbytes + 1, CHUNK))
    assert all(ok for _, ok in prefixes)
    assert staged(device) == 0
    check_released(device)
    device.close()


@pytest.mark.parametrize(
    ("direction", "stage"), [("d2h", "copy"), ("h2d", "copy"), ("d2h", "pack")]
)
def test_a_failed_dma_is_reported_and_everything_released(direction, stage):
    """Emulated only: the DMA or pack fault is injected into the emulated device."""
    device = make_device(faults={stage: 3})
    a = sample((512, 256), np.float64)
    threads_before = threading.active_count()
    ptr, buf = device.host_alloc(a.nbytes)  # not freed: after a device fault freeing fails
    buf[:] = 0
    if direction == "d2h":
        src = device.asarray(a)
        src, expect = (src, a) if stage == "copy" else (src.T, a.T)
        host = buf.view(a.dtype).reshape(expect.shape)
        call = lambda: interop.copy_to_host(src, host, chunk_bytes=CHUNK)  # noqa: E731
    else:
        host = buf.view(a.dtype).reshape(a.shape)
        host[...] = a
        out = device.empty(a.shape, a.dtype)
        call = lambda: interop.copy_to_device(host, out, chunk_bytes=CHUNK)  # noqa: E731
    with pytest.raises(
        interop.TransferError, match=r"failed \(\w+: .*\); bytes \[0, \d+\)"
    ) as info:
        call()
    err = info.value
    assert isinstance(err.__cause__, EmulatedDeviceError)
    assert err.bytes_done < a.nbytes
    if direction == "d2h":
        assert raw(host)[: err.bytes_done] == raw(expect)[: err.bytes_done]
    assert threading.active_count() == threads_before  # the transfer thread joined, no pool
    assert device.violations == []
    assert device._streams == [device.default_stream]  # the copy stream closed
    assert cached_rings() == 0
    assert list(device.host_buffers) == [ptr]  # the caller's buffer only: no ring
    assert staged(device) == 0
    device.close()


def test_a_traced_direct_copy_says_no_host_threads_ran(device):
    a = sample((512, 256), np.float64)
    d = device.asarray(a)
    with device.pinned(a.shape, a.dtype) as out, trace.recording() as traces:
        interop.copy_to_host(d, out, chunk_bytes=CHUNK)
    (summary,) = [t.summary() for t in traces]
    assert summary["threads"] == 0
    assert summary["host_seconds"] == 0
    assert summary["chunks"] == a.nbytes // CHUNK
    assert summary["bytes"] == a.nbytes
    assert len(traces[0].device_seconds) == a.nbytes // CHUNK


# ----------------------------------------------------------------- CUDA only
# The kinds of page-locked memory the CUDA driver recognises: PyTorch's
# pin_memory, cudaHostRegister (the emulated device has one kind, its host_alloc).


@pytest.mark.gpu
def test_gpu_pinned_outs_and_sources_skip_the_ring(cp, torch):
    """Page-locked host memory (CuPy's pinned pool, PyTorch's pin_memory,
    cudaHostRegister) is copied to and from by the DMAs alone: no staging
    ring is borrowed, so none is cached afterwards; pageable memory is."""
    import cupyx

    from interop.pipeline.ring import free_cached_rings

    a = cp.arange(3 << 20, dtype=cp.float32).reshape(3 << 10, 1 << 10)  # 12 MiB
    expect = cp.asnumpy(a)
    free_cached_rings()
    pinned = cupyx.empty_pinned(a.shape, np.float32)
    pinned.fill(-1)
    assert interop.copy_to_host(a, pinned, chunk_bytes=1 << 20) is pinned
    np.testing.assert_array_equal(pinned, expect)
    transposed = cupyx.empty_pinned((1 << 10, 3 << 10), np.float32)
    interop.copy_to_host(a.T, transposed, chunk_bytes=1 << 20)  # packed on the device
    np.testing.assert_array_equal(transposed, expect.T)
    page_locked = torch.empty(a.shape, dtype=torch.float32, pin_memory=True)
    interop.copy_to_host(a, page_locked.numpy(), chunk_bytes=1 << 20)
    np.testing.assert_array_equal(page_locked.numpy(), expect)
    back = interop.copy_to_device(pinned, chunk_bytes=1 << 20)
    assert bool(cp.array_equal(back, a))
    into_t = torch.empty((1 << 10, 3 << 10), device="cuda").T  # unpacked on the device
    interop.copy_to_device(page_locked, into_t, chunk_bytes=1 << 20)
    assert bool((into_t.cpu() == page_locked).all())
    registered = np.zeros(a.shape, np.float32)
    runtime = cp.cuda.runtime
    runtime.hostRegister(registered.ctypes.data, registered.nbytes, 0)
    try:
        interop.copy_to_host(a, registered, chunk_bytes=1 << 20)
        np.testing.assert_array_equal(registered, expect)
    finally:
        runtime.hostUnregister(registered.ctypes.data)
    assert cached_rings() == 0  # no copy above borrowed a ring
    pageable = np.zeros(a.shape, np.float32)
    interop.copy_to_host(a, pageable, chunk_bytes=1 << 20)
    np.testing.assert_array_equal(pageable, expect)
    assert cached_rings() == 1  # the staged copy borrowed one and gave it back


@pytest.mark.gpu
def test_gpu_pinned_memory_is_recognised_by_address(cp):
    import cupyx

    from interop.pipeline.cuda import _buffer_id, cuda_backend

    backend = cuda_backend(cp.cuda.runtime.getDevice())
    pinned = cupyx.empty_pinned(1 << 16, np.uint8)
    base = pinned.ctypes.data
    assert backend.is_pinned(base, pinned.nbytes)
    assert backend.is_pinned(base + 100, 1000)
    assert not backend.is_pinned(base, 0)
    other = cupyx.empty_pinned(1 << 16, np.uint8)
    assert _buffer_id(base) == _buffer_id(base + pinned.nbytes - 1)
    assert _buffer_id(base) != _buffer_id(other.ctypes.data)
    pageable = np.ones(1 << 16, np.uint8)
    assert not backend.is_pinned(pageable.ctypes.data, pageable.nbytes)
    runtime = cp.cuda.runtime
    runtime.hostRegister(pageable.ctypes.data, pageable.nbytes, 0)
    try:  # a registration is one buffer to the driver too
        assert _buffer_id(pageable.ctypes.data) is not None
        assert backend.is_pinned(pageable.ctypes.data, pageable.nbytes)
    finally:
        runtime.hostUnregister(pageable.ctypes.data)
    assert not backend.is_pinned(pageable.ctypes.data, pageable.nbytes)


@pytest.mark.gpu
def test_gpu_an_out_pinned_only_at_its_ends_goes_through_the_ring(cp):
    """Both ends registered, the middle pageable: a DMA over the whole range
    would fail, so the copy is staged (and right)."""
    import mmap

    from interop.pipeline.ring import free_cached_rings

    page = mmap.PAGESIZE
    memory = mmap.mmap(-1, 64 * page)  # page-aligned
    out = np.frombuffer(memory, np.float32)
    a = cp.arange(out.size, dtype=cp.float32)
    runtime = cp.cuda.runtime
    base = out.ctypes.data
    runtime.hostRegister(base, page, 0)
    runtime.hostRegister(base + out.nbytes - page, page, 0)
    try:
        free_cached_rings()
        interop.copy_to_host(a, out, chunk_bytes=4 * page)
        np.testing.assert_array_equal(out, cp.asnumpy(a))
        assert cached_rings() == 1  # staged
    finally:
        runtime.hostUnregister(base)
        runtime.hostUnregister(base + out.nbytes - page)
    del out
    memory.close()
