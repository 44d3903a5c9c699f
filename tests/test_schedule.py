"""The slot schedule, both directions, through the host backend: the public calls
(copy_to_host, copy_to_device and their async forms) on an emulated device
whose streams really move data on threads and enforce CUDA's rules. What this
cannot show (real DMA, kernels, speed) is for the ``gpu`` tests."""

from __future__ import annotations

import contextlib
import re
import threading
import time
import weakref

import ml_dtypes
import numpy as np
import pytest

import interop
from interop.pipeline.ring import cached_rings, free_cached_rings
from interop.testing import EmulatedDevice, EmulatedDeviceError

from .helpers import (
    NUMPY_DTYPES,
    cancel_on_progress,
    in_threads,
    inverted_bytes,
    pinned,
    sample,
    staged,
)

CHUNK = 64 << 10  # the smallest chunk interop uses


def raw(a):
    """Bytes of ``a`` in C order, for exact comparisons of any dtype."""
    return np.ascontiguousarray(a).tobytes()


def make_device(**kwargs):
    return EmulatedDevice(delay=kwargs.pop("delay", 0.0002), **kwargs)


def check_released(device, leaked_ok=False):
    """Every copy stream closed, every ring freed or cached, no rule broken."""
    assert device.violations == []
    assert device._streams == [device.default_stream]  # copy streams closed
    free_cached_rings()
    if not leaked_ok:
        assert device.host_buffers == {}  # every pinned buffer freed


@pytest.fixture
def device():
    b = make_device()
    free_cached_rings()  # ring counts start from none cached
    yield b
    check_released(b)
    b.close()


# ----------------------------------------------------------------- values


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_device_to_host_every_dtype(device, dtype):
    a = sample((300, 70), dtype)
    d = device.asarray(a)
    for src, expect in ((d, a), (d.T, a.T), (d[::-2, 3:50:3], a[::-2, 3:50:3])):
        out = interop.copy_to_host(src, chunk_bytes=CHUNK)
        assert out.dtype == a.dtype
        assert raw(out) == raw(expect)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_host_to_device_every_dtype(device, dtype):
    a = sample((300, 70), dtype)
    out = device.empty((300, 70), dtype)
    assert interop.copy_to_device(a, out, chunk_bytes=CHUNK) is out
    assert raw(device.to_numpy(out)) == raw(a)
    transposed = device.empty((70, 300), dtype)
    interop.copy_to_device(a, transposed.T, chunk_bytes=CHUNK)  # unpacked on the device
    assert raw(device.to_numpy(transposed).T) == raw(a)


VIEWS = {
    "contiguous": lambda a: a,
    "transposed": lambda a: a.T,
    "negative": lambda a: a[::-1, ::-2],
    "column": lambda a: a[:, 4],
    "steps": lambda a: a[1::3, 2:90:2],
}
OUTS = {
    "C": lambda shape: np.zeros(shape),
    "F": lambda shape: np.zeros(shape, order="F"),
    "strided": lambda shape: np.zeros(tuple(2 * n for n in shape))[
        (slice(None, None, -2),) * len(shape)
    ],
}


@pytest.mark.parametrize("view", VIEWS.values(), ids=VIEWS.keys())
@pytest.mark.parametrize("layout", OUTS.values(), ids=OUTS.keys())
@pytest.mark.parametrize("chunk", [CHUNK, CHUNK + 24, 1 << 20])
def test_strided_device_sources_into_strided_outs(device, view, layout, chunk):
    a = sample((400, 100), np.float64, seed=1)
    src, expect = view(device.asarray(a)), view(a)
    out = layout(expect.shape)
    assert interop.copy_to_host(src, out, chunk_bytes=chunk) is out
    np.testing.assert_array_equal(out, expect)


@pytest.mark.parametrize("view", VIEWS.values(), ids=VIEWS.keys())
@pytest.mark.parametrize("chunk", [CHUNK, CHUNK + 24])
def test_strided_host_sources_into_strided_device_outs(device, view, chunk):
    a = view(sample((400, 100), np.float64, seed=2))
    whole = device.empty(tuple(2 * n for n in a.shape), np.float64)
    out = whole[(slice(None, None, 2),) * a.ndim]
    interop.copy_to_device(a, out, chunk_bytes=chunk)
    np.testing.assert_array_equal(device.to_numpy(whole)[(slice(None, None, 2),) * a.ndim], a)


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((), np.float64), ((1,), np.int8), ((CHUNK + 1,), np.int8), ((8193,), np.float64),
     ((3, CHUNK // 8 + 5), np.float64), ((2, 3, 4, 5, 6), np.complex64)],
)  # fmt: skip
def test_chunk_edges_both_ways(device, shape, dtype):
    a = sample(shape, dtype)
    np.testing.assert_array_equal(interop.copy_to_host(device.asarray(a), chunk_bytes=CHUNK), a)
    out = device.empty(shape, dtype)
    interop.copy_to_device(a, out, chunk_bytes=CHUNK)
    np.testing.assert_array_equal(device.to_numpy(out), a)


@pytest.mark.parametrize("shape", [(0,), (3, 0)])
def test_zero_size_starts_no_stream(device, shape):
    seen = []
    d = device.empty(shape, np.float32)
    out = interop.copy_to_host(d, progress=lambda done, total: seen.append((done, total)))
    assert out.shape == shape
    interop.copy_to_device(np.ones(shape, np.float32), d)
    assert seen == [(0, 0)]
    assert device._streams == [device.default_stream]


@pytest.mark.parametrize(("num_buffers", "host_threads"), [(1, 1), (2, 4), (5, 2)])
def test_ring_sizes_and_thread_counts(device, num_buffers, host_threads):
    a = sample((1024, 130), np.float32, seed=3)
    with interop.config.set(num_buffers=num_buffers, host_threads=host_threads):
        np.testing.assert_array_equal(
            interop.copy_to_host(device.asarray(a).T, chunk_bytes=CHUNK), a.T
        )
        out = device.empty((130, 1024), np.float32)
        interop.copy_to_device(a, out.T, chunk_bytes=CHUNK)
    np.testing.assert_array_equal(device.to_numpy(out).T, a)


def test_a_successful_transfer_returns_its_ring_to_the_cache(device):
    free_cached_rings()
    interop.copy_to_host(device.asarray(np.ones(1 << 16)), chunk_bytes=CHUNK)
    assert cached_rings() == 1


# ----------------------------------------------------------------- the defects behind these rules


def test_staging_rows_of_odd_chunk_sizes_stay_aligned(device):
    """A chunk size that is no multiple of the element size: packing row k of
    the device staging must still be aligned for complex128 (16 bytes)."""
    a = sample((10_000, 3), np.complex128)
    chunk = 70_008  # chunks of 70_000 bytes: unrounded slots would be 70_008 bytes apart
    got = interop.copy_to_host(device.asarray(a).T, chunk_bytes=chunk)
    np.testing.assert_array_equal(got, a.T)
    out = device.empty((3, 10_000), np.complex128)
    interop.copy_to_device(a, out.T, chunk_bytes=chunk)
    np.testing.assert_array_equal(device.to_numpy(out).T, a)


def test_staging_is_ordered_after_its_allocation_on_a_busy_stream(device):
    """The staging rows come from the worker's current stream, which is busy:
    the copy stream must wait for an event recorded there."""
    a = sample((512, 64), np.float64)
    d = device.asarray(a)
    device.synchronize()
    gate = threading.Event()
    device.default_stream.enqueue("op", lambda: gate.wait(5))
    transfer = interop.copy_to_host_async(d.T, chunk_bytes=CHUNK)
    threading.Timer(0.05, gate.set).start()
    np.testing.assert_array_equal(transfer.result(timeout=30), a.T)


def test_non_native_byte_order_is_converted_while_filling_slots(device):
    a = sample((300, 70), np.float32).astype(">f4")
    out = device.empty(a.shape, np.float32)
    interop.copy_to_device(a, out, chunk_bytes=CHUNK)
    np.testing.assert_array_equal(device.to_numpy(out), a)
    fresh = interop.copy_to_device(a, device.empty(a.shape, "<f4"), chunk_bytes=CHUNK)
    assert fresh.dtype == np.dtype("<f4")
    with pytest.raises(ValueError, match=r"dtype float32 \(got float64\)"):
        interop.copy_to_device(a, device.empty(a.shape, np.float64))
    big_endian_out = np.zeros(a.shape, ">f4")
    with pytest.raises(ValueError, match="byte order differs: allocate out with dtype '<f4'"):
        interop.copy_to_host(out, big_endian_out)


def test_progress_of_copy_to_device_counts_chunks_on_the_device():
    device = make_device(delay=0.002)
    a = sample((512, 256), np.float64)
    out = device.empty(a.shape, a.dtype)
    prefixes = []

    def progress(done, total):
        # runs after the chunks up to `done` were seen complete on the device
        landed = out.data.reshape(-1).view(np.uint8)[:done]
        prefixes.append(bool((landed == a.reshape(-1).view(np.uint8)[:done]).all()))

    interop.copy_to_device(a, out, chunk_bytes=CHUNK, progress=progress)
    assert len(prefixes) > 4
    assert all(prefixes)
    check_released(device)
    device.close()


def test_progress_of_copy_to_host_counts_chunks_in_out():
    device = make_device(delay=0.002)
    a = sample((512, 256), np.float64)
    out = np.zeros_like(a)
    prefixes = []

    def progress(done, total):
        prefixes.append(raw(out)[:done] == raw(a)[:done])

    interop.copy_to_host(device.asarray(a), out, chunk_bytes=CHUNK, progress=progress)
    assert len(prefixes) > 4
    assert all(prefixes)
    check_released(device)
    device.close()


# ----------------------------------------------------------------- cancel, faults, threads


@pytest.mark.parametrize("memory", ["pageable", "pinned"])  # pinned: DMAs only, no ring
@pytest.mark.parametrize("direction", ["d2h", "h2d"])
def test_cancel_reports_the_complete_prefix_and_stops_before_returning(direction, memory):
    device = make_device(delay=0.003)
    a = sample((1024, 256), np.float64)  # 2 MiB: 32 chunks
    holder, progress = cancel_on_progress()

    free_cached_rings()
    with contextlib.ExitStack() as stack:
        if memory == "pinned":
            host = stack.enter_context(pinned(device, a.shape, a.dtype))
        else:
            host = np.zeros_like(a)
        if direction == "d2h":
            transfer = interop.copy_to_host_async(
                device.asarray(a), host, chunk_bytes=CHUNK, progress=progress
            )
            written = lambda: raw(host)  # noqa: E731
        else:
            host[...] = a
            out = device.asarray(np.zeros_like(a))
            transfer = interop.copy_to_device_async(host, out, chunk_bytes=CHUNK, progress=progress)
            written = lambda: raw(out.data)  # noqa: E731 (the run synchronised its stream)
        holder["t"] = transfer
        with pytest.raises(interop.TransferError, match=r"cancelled; bytes \[0, \d+\)") as info:
            transfer.result(timeout=60)
        done = info.value.bytes_done
        assert 0 < done < a.nbytes
        assert done % CHUNK == 0
        after = written()
        assert after[:done] == raw(a)[:done]
        assert after[-CHUNK:] == bytes(CHUNK)  # the last chunk was never queued
        time.sleep(0.05)  # many stream delays: no copy is still queued
        assert written() == after
    assert (staged(device) == 0) == (memory == "pinned")
    assert cached_rings() == 0  # a failed transfer's ring is freed, not cached
    check_released(device)
    device.close()


@pytest.mark.parametrize(
    ("direction", "stage", "layout"),
    [
        ("h2d", "fill", "contiguous"),
        ("d2h", "drain", "contiguous"),
        ("d2h", "copy", "contiguous"),
        ("h2d", "copy", "contiguous"),
        ("d2h", "pack", "transposed"),
        ("h2d", "pack", "transposed"),
        ("d2h", "staging", "transposed"),
        ("h2d", "host_alloc", "contiguous"),
        ("d2h", "progress", "transposed"),
        ("h2d", "progress", "contiguous"),
    ],
)
def test_an_error_at_each_stage_is_reported_and_everything_released(direction, stage, layout):
    nth = 3 if stage in ("fill", "drain", "copy", "pack") else 1
    device = make_device(faults={} if stage == "progress" else {stage: nth})
    a = sample((512, 256), np.float64)
    calls = []

    def progress(done, total):
        calls.append(done)
        if stage == "progress" and len(calls) == 2:
            raise ZeroDivisionError("from the progress callback")

    free_cached_rings()
    threads_before = threading.active_count()
    if direction == "d2h":
        src = device.asarray(a)
        src, expect = (src, a) if layout == "contiguous" else (src.T, a.T)
        out = np.zeros_like(expect)
        call = lambda: interop.copy_to_host(src, out, chunk_bytes=CHUNK, progress=progress)  # noqa: E731
    else:
        expect = a
        if layout == "contiguous":
            dst = device.empty(a.shape, a.dtype)
        else:
            dst = device.empty(a.T.shape, a.dtype).T  # unpacked on the device
        call = lambda: interop.copy_to_device(expect, dst, chunk_bytes=CHUNK, progress=progress)  # noqa: E731
    if stage == "progress":  # the callback's own error comes back as itself, with a note
        with pytest.raises(ZeroDivisionError, match="from the progress callback") as info:
            call()
        cause = info.value
        bytes_done = note_bytes_done(cause)
        assert bytes_done == calls[1]
    else:
        with pytest.raises(
            interop.TransferError, match=r"failed \(\w+: .*\); bytes \[0, \d+\)"
        ) as info:
            call()
        cause = info.value.__cause__
        assert isinstance(cause, EmulatedDeviceError)
        bytes_done = info.value.bytes_done
    assert bytes_done % CHUNK == 0
    assert bytes_done < a.nbytes
    if direction == "d2h":  # the complete prefix is right
        assert raw(out)[:bytes_done] == raw(expect)[:bytes_done]
    assert threading.active_count() == threads_before  # host threads and transfer joined
    sticky = stage in ("copy", "pack")
    if sticky:  # like CUDA after an asynchronous error: freeing fails, and says so
        assert "freeing the staging ring also failed" in "\n".join(cause.__notes__)
    assert device.violations == []
    assert device._streams == [device.default_stream]
    assert cached_rings() == 0
    if not sticky:
        assert device.host_buffers == {}
    device.close()


def note_bytes_done(exc):
    """The end of the complete byte range a transfer noted on an error it
    re-raised as itself (a progress callback's)."""
    notes = "\n".join(getattr(exc, "__notes__", []))
    found = re.search(r"raised by the progress callback of \w+; bytes \[0, (\d+)\) of", notes)
    assert found, notes
    return int(found.group(1))


def test_a_failing_free_frees_every_other_buffer_and_keeps_the_first_error():
    device = make_device(faults={"host_free": 1})
    a = sample((512, 256), np.float64)

    def progress(done, total):
        raise ZeroDivisionError("first")

    free_cached_rings()
    with interop.config.set(num_buffers=4), pytest.raises(ZeroDivisionError) as info:
        interop.copy_to_host(device.asarray(a), chunk_bytes=CHUNK, progress=progress)
    cause = info.value
    assert any("freeing the staging ring also failed" in n for n in cause.__notes__)
    assert device.counts["host_free"] == 4  # every buffer was tried
    assert len(device.host_buffers) == 1  # only the one whose free failed is left
    device.close()


def test_concurrent_transfers_both_ways_from_threads(device):
    sources = [sample((256, 96), np.float32, seed=s) for s in range(8)]

    def work(i):
        if i % 2:
            out = device.empty((96, 256), np.float32)
            interop.copy_to_device(sources[i], out.T, chunk_bytes=CHUNK)
            return device.to_numpy(out).T
        d = device.asarray(sources[i])
        return interop.copy_to_host(d.T, chunk_bytes=CHUNK).T

    results = in_threads(work, 8)
    for s, r in zip(sources, results, strict=True):
        np.testing.assert_array_equal(r, s)


@pytest.mark.parametrize("how", ["a drain fails", "the callback raises"])
def test_a_held_error_keeps_neither_source_nor_destination_alive(how):
    device = make_device(faults={"drain": 2} if how == "a drain fails" else {})
    a = sample((256, 256), np.float64)
    src = device.asarray(a)
    out = np.zeros_like(a)
    refs = weakref.ref(src), weakref.ref(out)

    def progress(done, total):
        if how == "the callback raises":
            raise ZeroDivisionError

    try:
        interop.copy_to_host(src, out, chunk_bytes=CHUNK, progress=progress)
    except (interop.TransferError, ZeroDivisionError) as exc:
        held = exc
    del src, out
    assert [r() for r in refs] == [None, None]
    if how == "a drain fails":
        assert isinstance(held, interop.TransferError)
        assert isinstance(held.__cause__, EmulatedDeviceError)
    else:
        assert isinstance(held, ZeroDivisionError)
    device.close()


def test_device_to_device_copies_on_the_destination_stream(device):
    a = sample((64, 32), np.int32)
    src = device.asarray(a)
    out = device.empty((32, 64), np.int32)
    assert interop.copy_to_device(src.T, out) is out
    np.testing.assert_array_equal(device.to_numpy(out), a.T)
    fresh = interop.copy_to_device(src)
    np.testing.assert_array_equal(device.to_numpy(fresh), a)


# ----------------------------------------------------------------- casting on the way


@pytest.mark.parametrize("view", ["contiguous", "transposed", "negative"])
@pytest.mark.parametrize("memory", ["pageable", "pinned"])
def test_device_data_is_cast_on_the_device_chunk_by_chunk(device, view, memory):
    a = sample((1024, 512), ml_dtypes.bfloat16)  # 2 MiB as float32: 32 chunks
    d = device.asarray(a)
    src, expect = VIEWS[view](d), VIEWS[view](a).astype(np.float32)
    base = device.reset_peak()
    if memory == "pinned":
        with pinned(device, expect.shape, np.float32) as out:
            got = interop.copy_to_host(src, out, dtype=np.float32, chunk_bytes=CHUNK)
            assert got is out
            assert raw(out) == raw(expect)
        assert staged(device) == 0  # straight into the pinned out
    else:
        out = interop.copy_to_host(src, dtype=np.float32, chunk_bytes=CHUNK)
        assert out.dtype == np.float32
        assert raw(out) == raw(expect)
    # chunk-sized float32 temporaries (and packing rows), never a full-size one
    extra = device.peak_bytes_in_use - base
    assert 0 < extra <= 2 * interop.config.num_buffers * CHUNK < expect.nbytes


def test_an_inverted_source_is_resolved_then_cast(device):
    a = sample((256, 64), np.float16)
    flipped = np.frombuffer(inverted_bytes(a), np.float16).reshape(a.shape)
    out = interop.copy_to_host(device.inverted(device.asarray(a)), dtype=np.float64)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(out, flipped.astype(np.float64))
