"""Pinned host memory: copies whose host side is already page-locked skip the
staging ring (the schedule's direct form), through the host backend, whose
DMAs reach only live page-locked buffers and whose streams enforce CUDA's
ordering rules. The same on a GPU: ``test_gpu_pinned_*`` in test_transfer."""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import pytest

import interop
from interop.pipeline import trace
from interop.pipeline.ring import cached_rings
from interop.testing import EmulatedDeviceError

from . import test_schedule
from .helpers import NUMPY_DTYPES, pinned, sample, staged
from .test_schedule import CHUNK, check_released, make_device, raw

device = test_schedule.device  # the fixture: an emulated device, checked after each test


# ----------------------------------------------------------------- values, no ring


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_a_pinned_out_is_filled_by_dmas_alone(device, dtype):
    a = sample((300, 70), dtype)
    d = device.asarray(a)
    for src, expect in ((d, a), (d.T, a.T), (d[::-2, 3:50:3], a[::-2, 3:50:3])):
        with pinned(device, expect.shape, dtype) as out:
            allocs = device.counts["host_alloc"]
            assert interop.copy_to_host(src, out, chunk_bytes=CHUNK) is out
            assert raw(out) == raw(expect)
            assert device.counts["host_alloc"] == allocs  # no staging ring
    assert staged(device) == 0  # no host thread touched a slot
    assert cached_rings() == 0


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_a_pinned_source_reaches_the_device_by_dmas_alone(device, dtype):
    a = sample((300, 70), dtype)
    with pinned(device, a.shape, dtype) as src:
        src[...] = a
        out = device.empty(a.shape, dtype)
        assert interop.copy_to_device(src, out, chunk_bytes=CHUNK) is out
        assert raw(device.to_numpy(out)) == raw(a)
        transposed = device.empty((70, 300), dtype)
        interop.copy_to_device(src, transposed.T, chunk_bytes=CHUNK)  # unpacked on the device
        assert raw(device.to_numpy(transposed).T) == raw(a)
    assert staged(device) == 0
    assert cached_rings() == 0


@pytest.mark.parametrize("direction", ["d2h", "h2d"])
def test_chunks_of_unequal_sizes_land_at_their_own_offsets(device, direction):
    """A (3, 100, 700) float64 array in 64 KiB chunks: 11 rows, then 1 row at
    the end of each leading index, so chunk i does not start at i * sizes[0]."""
    a = sample((3, 100, 700), np.float64, seed=4)
    with pinned(device, a.shape, a.dtype) as host:
        if direction == "d2h":
            interop.copy_to_host(device.asarray(a), host, chunk_bytes=CHUNK)
            got = host
        else:
            host[...] = a
            out = device.empty(a.shape, a.dtype)
            interop.copy_to_device(host, out, chunk_bytes=CHUNK)
            got = device.to_numpy(out)
        assert raw(got) == raw(a)
    assert staged(device) == 0


@pytest.mark.parametrize("name", ["float32", "bfloat16", "complex64"])
def test_a_pinned_cpu_tensor_source_is_copied_directly(device, torch, name):
    t = torch.arange(6000, dtype=torch.float32).reshape(60, 100).to(getattr(torch, name))
    expect = interop.to_numpy(t).copy()
    with pinned(device, expect.shape, expect.dtype) as buf:
        src = torch.from_numpy(buf.view(np.uint8)).view(t.dtype).reshape(t.shape)
        src.copy_(t)
        out = device.empty(expect.shape, expect.dtype)
        interop.copy_to_device(src, out, chunk_bytes=CHUNK)
        assert raw(device.to_numpy(out)) == raw(expect)
    assert staged(device) == 0


def test_the_direct_copy_waits_for_the_producer_stream(device):
    """The DMAs are ordered after work queued on the data's stream before the
    call, and the call returns only after they are done (delayed streams)."""
    a = sample((512, 256), np.float64)
    gate = threading.Event()
    producer = device.stream()
    with device.use_stream(producer):
        producer.enqueue("op", lambda: gate.wait(5))
        d = device.asarray(a)  # uploaded on the producer stream, after the gate
        with pinned(device, a.shape, a.dtype) as out:
            transfer = interop.copy_to_host_async(d, out, chunk_bytes=CHUNK)
            time.sleep(0.05)
            assert transfer.bytes_done == 0
            assert not out.any()  # nothing copied before the producer's work ran
            gate.set()
            transfer.result(timeout=60)
            assert raw(out) == raw(a)
        back = device.empty(a.shape, a.dtype)
        with pinned(device, a.shape, a.dtype) as src:
            src[...] = a[::-1]
            interop.copy_to_device(src, back, chunk_bytes=CHUNK)
            assert raw(device.to_numpy(back)) == raw(a[::-1])
    producer.synchronize()
    producer.close()
    assert staged(device) == 0


# ----------------------------------------------------------------- what goes through the ring


def test_pinned_memory_the_dmas_cannot_use_goes_through_the_ring(device, torch):
    a = sample((300, 70), np.float32)
    d = device.asarray(a)
    z = sample((60, 100), np.complex64)
    seen = [staged(device)]
    with pinned(device, a.shape, a.dtype, order="F") as out:  # pinned, not C-contiguous
        interop.copy_to_host(d, out, chunk_bytes=CHUNK)
        np.testing.assert_array_equal(out, a)
    seen.append(staged(device))
    with pinned(device, (600, 70), a.dtype) as whole:  # pinned, strided view
        interop.copy_to_host(d, whole[::2], chunk_bytes=CHUNK)
        np.testing.assert_array_equal(whole[::2], a)
        assert not whole[1::2].any()
    seen.append(staged(device))
    with pinned(device, a.shape, ">f4") as big:  # pinned, non-native byte order
        big[...] = a
        out = device.empty(a.shape, a.dtype)
        interop.copy_to_device(big, out, chunk_bytes=CHUNK)
        np.testing.assert_array_equal(device.to_numpy(out), a)
    seen.append(staged(device))
    with pinned(device, z.shape, z.dtype) as buf:  # pinned, with the conjugate bit
        buf[...] = z
        got = device.empty(z.shape, z.dtype)
        interop.copy_to_device(torch.from_numpy(buf).conj(), got, chunk_bytes=CHUNK)
        np.testing.assert_array_equal(device.to_numpy(got), z.conj())
    seen.append(staged(device))
    out = interop.copy_to_host(d, np.zeros_like(a), chunk_bytes=CHUNK)  # pageable
    np.testing.assert_array_equal(out, a)
    seen.append(staged(device))
    # each copy went through the ring's host threads: its chunks, at least
    assert all(later > earlier for earlier, later in itertools.pairwise(seen))


# ----------------------------------------------------------------- progress, cancel, faults


@pytest.mark.parametrize("direction", ["d2h", "h2d"])
def test_progress_counts_chunks_the_dmas_completed(direction):
    device = make_device(delay=0.002)
    a = sample((512, 256), np.float64)
    prefixes = []
    with pinned(device, a.shape, a.dtype) as host:
        if direction == "d2h":
            d, got = device.asarray(a), (lambda: host)

            def call(progress):
                interop.copy_to_host(d, host, chunk_bytes=CHUNK, progress=progress)
        else:
            host[...] = a
            out = device.empty(a.shape, a.dtype)
            got = lambda: out.data  # noqa: E731 (read only after its chunks were seen done)

            def call(progress):
                interop.copy_to_device(host, out, chunk_bytes=CHUNK, progress=progress)

        def progress(done, total):
            prefixes.append((done, raw(got())[:done] == raw(a)[:done]))

        call(progress)
    assert [done for done, _ in prefixes] == list(range(CHUNK, a.nbytes + 1, CHUNK))
    assert all(ok for _, ok in prefixes)
    assert staged(device) == 0
    check_released(device)
    device.close()


@pytest.mark.parametrize(
    ("direction", "stage"), [("d2h", "copy"), ("h2d", "copy"), ("d2h", "pack")]
)
def test_a_failed_dma_is_reported_and_everything_released(direction, stage):
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
    with pinned(device, a.shape, a.dtype) as out, trace.recording() as traces:
        interop.copy_to_host(d, out, chunk_bytes=CHUNK)
    (summary,) = [t.summary() for t in traces]
    assert summary["threads"] == 0
    assert summary["host_seconds"] == 0
    assert summary["chunks"] == a.nbytes // CHUNK
    assert summary["bytes"] == a.nbytes
    assert len(traces[0].device_seconds) == a.nbytes // CHUNK
