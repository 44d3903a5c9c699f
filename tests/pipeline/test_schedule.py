"""The slot schedule, both directions: the public calls (copy_to_host,
copy_to_device and their async forms) on each test device (tests/helpers/devices.py):
the emulated one, whose streams really move data on threads and enforce CUDA's
rules, and a CUDA device under the ``gpu`` marker. One body per behaviour; what
only one of them can show is said where it is checked (``device.emulated``: rule
violations, operation counts, injected faults)."""

from __future__ import annotations

import contextlib
import gc
import re
import sys
import threading
import time
import weakref

import ml_dtypes
import numpy as np
import pytest

import interop
from interop.pipeline.ring import cached_rings, free_cached_rings
from interop.testing import EmulatedDevice, EmulatedDeviceError
from tests.helpers import (
    NUMPY_DTYPES,
    cancel_on_progress,
    in_threads,
    run_python,
    sample,
    transfer_threads,
)
from tests.helpers.devices import opened

CHUNK = 64 << 10  # the smallest chunk interop uses


def raw(a):
    """Bytes of ``a`` in C order, for exact comparisons of any dtype."""
    return np.ascontiguousarray(a).tobytes()


def make_device(**kwargs):
    """An emulated device for the tests only it can run (injected faults)."""
    return EmulatedDevice(delay=kwargs.pop("delay", 0.0002), **kwargs)


def check_released(device, leaked_ok=False):
    """Every copy stream closed, every ring freed or cached, no rule broken."""
    assert device.violations == []
    assert device._streams == [device.default_stream]  # copy streams closed
    free_cached_rings()
    if not leaked_ok:
        assert device.host_buffers == {}  # every pinned buffer freed


# ----------------------------------------------------------------- values

# PyTorch has no negative steps: a tensor's strided view steps forward
STEPS = {"cupy": np.s_[::-2, 3:50:3], "torch": np.s_[1::2, 3:50:3]}


@pytest.mark.parametrize("lib", ["cupy", "torch"])
@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_device_to_host_every_dtype(device, dtype, lib):
    a = sample((300, 70), dtype)
    d = device.asarray(a, lib)
    step = STEPS[lib]
    for src, expect in ((d, a), (d.T, a.T), (d[step], a[step])):
        out = interop.copy_to_host(src, chunk_bytes=CHUNK)
        assert out.dtype == a.dtype
        assert raw(out) == raw(expect)


@pytest.mark.parametrize("lib", ["cupy", "torch"])
@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_host_to_device_every_dtype(device, dtype, lib):
    a = sample((300, 70), dtype)
    out = device.empty((300, 70), dtype, lib)
    assert interop.copy_to_device(a, out, chunk_bytes=CHUNK) is out
    assert raw(device.to_numpy(out)) == raw(a)
    transposed = device.empty((70, 300), dtype, lib)
    interop.copy_to_device(a, transposed.T, chunk_bytes=CHUNK)  # unpacked on the device
    assert raw(device.to_numpy(transposed).T) == raw(a)


VIEWS = {
    "contiguous": lambda a: a,
    "transposed": lambda a: a.T,
    "negative": lambda a: a[::-1, ::-2],
    "column": lambda a: a[:, 4],
    "steps": lambda a: a[1::3, 2:90:2],
    "sliced": lambda a: a[::-3, 5:60:2],
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
@pytest.mark.parametrize("chunk", [4, CHUNK + 24, 1 << 20, 1 << 22])  # 4: raised to CHUNK
def test_strided_device_sources_into_strided_outs(device, view, layout, chunk):
    a = sample((400, 100), np.float64, seed=1)
    src, expect = view(device.asarray(a)), view(a)
    out = layout(expect.shape)
    assert interop.copy_to_host(src, out, chunk_bytes=chunk) is out
    np.testing.assert_array_equal(out, expect)
    fresh = interop.copy_to_host(src, chunk_bytes=chunk)
    assert fresh.flags.c_contiguous
    np.testing.assert_array_equal(fresh, expect)


@pytest.mark.parametrize("view", VIEWS.values(), ids=VIEWS.keys())
@pytest.mark.parametrize("chunk", [CHUNK, CHUNK + 24])
def test_strided_host_sources_into_strided_device_outs(device, view, chunk):
    a = view(sample((400, 100), np.float64, seed=2))
    whole = device.empty(tuple(2 * n for n in a.shape), np.float64)
    out = whole[(slice(None, None, 2),) * a.ndim]
    interop.copy_to_device(a, out, chunk_bytes=chunk)
    np.testing.assert_array_equal(device.to_numpy(whole)[(slice(None, None, 2),) * a.ndim], a)


@pytest.mark.parametrize("chunk", [8, 100_000, 1 << 22])  # 8 is raised to 64 KiB
def test_memmap_and_strided_host_sources_into_strided_device_outs(device, tmp_path, chunk):
    a = sample((3000, 70), np.float32)  # 840 KB; the strided view 288 KB
    out = device.empty((3000, 24), np.float32)
    assert interop.copy_to_device(a[::-1, ::3], out, chunk_bytes=chunk) is out
    np.testing.assert_array_equal(device.to_numpy(out), a[::-1, ::3])
    mm = np.lib.format.open_memmap(tmp_path / "m.npy", "w+", np.float32, a.shape)
    mm[...] = a
    out2 = device.empty((70, 3000), np.float32).T
    assert interop.copy_to_device(mm, out2, chunk_bytes=chunk) is out2
    np.testing.assert_array_equal(device.to_numpy(out2), a)


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((), np.float64), ((1,), np.int8), ((CHUNK + 1,), np.int8), ((8193,), np.float64),
     ((3, CHUNK // 8 + 5), np.float64), ((2, 3, 4, 5, 6), np.complex64)],
)  # fmt: skip
def test_chunk_edges_both_ways(device, shape, dtype):
    a = sample(shape, dtype)
    got = interop.copy_to_host(device.asarray(a), chunk_bytes=CHUNK)
    assert got.shape == shape
    np.testing.assert_array_equal(got, a)
    out = device.empty(shape, dtype)
    interop.copy_to_device(a, out, chunk_bytes=CHUNK)
    back = device.to_numpy(out)
    assert back.shape == shape
    np.testing.assert_array_equal(back, a)


@pytest.mark.parametrize("shape", [(), (0,), (5, 0), (1,), (3, 0)])
def test_zero_d_and_zero_size(device, shape):
    a = np.full(shape, 3, np.int16)
    d = device.asarray(a)
    out = np.full(shape, 9, np.int16)
    seen = []
    progress = lambda done, total: seen.append((done, total))  # noqa: E731
    assert interop.copy_to_host(d, out, chunk_bytes=1, progress=progress) is out
    assert out.shape == shape
    assert raw(out) == raw(a)
    assert seen[-1] == (a.nbytes, a.nbytes)
    fresh = interop.copy_to_host(d)
    assert (fresh.shape, fresh.dtype, raw(fresh)) == (shape, a.dtype, raw(a))
    back = device.empty(shape, np.int16)
    assert interop.copy_to_device(np.full(shape, 5, np.int16), back, chunk_bytes=1) is back
    assert raw(device.to_numpy(back)) == raw(np.full(shape, 5, np.int16))
    if a.size == 0:
        assert seen == [(0, 0)]
        if device.emulated:  # an empty transfer starts no copy stream
            assert device.emulated._streams == [device.default_stream]


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


def test_large_chunks_are_split_across_host_threads(device):
    """Chunks of several MiB: each slot's host copy is split across threads."""
    a = np.arange(3 << 20, dtype=np.float32).reshape(3 << 10, 1 << 10)  # 12 MiB
    d = device.asarray(a)
    out = np.zeros((1 << 10, 3 << 10), np.float32).T  # strided out
    with interop.config.set(host_threads=4, num_buffers=2):
        assert interop.copy_to_host(d, out, chunk_bytes=4 << 20) is out
        np.testing.assert_array_equal(out, a)
        back = device.empty((1 << 10, 3 << 10), np.float32).T  # unpacked on the device
        interop.copy_to_device(out, back, chunk_bytes=4 << 20)
    np.testing.assert_array_equal(device.to_numpy(back), a)


def test_a_successful_transfer_returns_its_ring_to_the_cache(device):
    free_cached_rings()
    interop.copy_to_host(device.asarray(np.ones(1 << 16)), chunk_bytes=CHUNK)
    assert cached_rings() == 1


# ----------------------------------------------------------------- the defects behind these rules


def test_staging_rows_of_odd_chunk_sizes_stay_aligned(device):
    """A chunk size that is no multiple of the element size: packing row k of
    the device staging must still be aligned for complex128 (16 bytes). Unrounded
    slots would put row 1 at 70_008 bytes: on CUDA a misaligned complex128 pack
    (cudaErrorMisalignedAddress, a sticky error)."""
    a = sample((10_000, 3), np.complex128)
    chunk = 70_008  # chunks of 70_000 bytes: unrounded slots would be 70_008 bytes apart
    got = interop.copy_to_host(device.asarray(a).T, chunk_bytes=chunk)
    np.testing.assert_array_equal(got, a.T)
    out = device.empty((3, 10_000), np.complex128)
    interop.copy_to_device(a, out.T, chunk_bytes=chunk)
    np.testing.assert_array_equal(device.to_numpy(out).T, a)


def test_staging_is_ordered_after_its_allocation_on_a_busy_stream(device):
    """The worker takes device staging from the pool on its current stream (the
    default stream), which is busy: a block freed there while work queued on it
    still writes it must not be packed into before that work is done (the copy
    stream waits for an event recorded there)."""
    a = sample((1024, 1024), np.float32)
    d = device.asarray(a)
    device.synchronize()
    reused = device.emulated.counts["device_reuse"] if device.emulated else 0
    with interop.config.set(num_buffers=4):
        for _ in range(3):
            device.hold(device.default_stream, 0.1)  # busy for a while, on its own
            tmp = device.asarray(np.full(4 << 20, 255, np.uint8))  # the staging block's size
            del tmp  # back to the pool of the default stream, still being written
            with device.use_stream(device.stream()):  # the producer is another stream
                # async: the schedule runs on a thread of its own, whose current
                # stream is the default one (a blocking copy's runs here, on the producer)
                transfer = interop.copy_to_host_async(d.T, chunk_bytes=1 << 20)
            np.testing.assert_array_equal(transfer.result(timeout=60), a.T)
            if device.emulated:  # the staging took the block tmp had, on the default stream
                assert device.emulated.counts["device_reuse"] > reused
                reused = device.emulated.counts["device_reuse"]


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


def test_copy_to_device_into_a_bfloat16_tensor_and_a_wrong_shape(device):
    a = np.arange(12, dtype=np.float32).reshape(3, 4).astype(ml_dtypes.bfloat16)
    out = device.asarray(np.zeros((3, 4), ml_dtypes.bfloat16), lib="torch")
    assert interop.copy_to_device(a, out, chunk_bytes=6) is out
    assert raw(device.to_numpy(out)) == raw(a)
    wrong = device.asarray(np.full((4, 3), 5.0, np.float32), lib="torch")
    with pytest.raises(ValueError, match=r"shape \(3, 4\)"):
        interop.copy_to_device(np.ones((3, 4), np.float32), wrong)
    np.testing.assert_array_equal(device.to_numpy(wrong), np.full((4, 3), 5.0, np.float32))


def test_progress_of_copy_to_device_counts_chunks_on_the_device():
    """Emulated only: the callback reads the device memory directly (host memory
    there), without a synchronisation that would complete the copies first."""
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


def test_progress_of_copy_to_host_counts_chunks_in_out(device_kind):
    a = sample((512, 256), np.float64)
    out = np.zeros_like(a)
    prefixes = []

    def progress(done, total):
        prefixes.append(raw(out)[:done] == raw(a)[:done])

    with opened(device_kind, delay=0.002) as device:
        interop.copy_to_host(device.asarray(a), out, chunk_bytes=CHUNK, progress=progress)
    assert len(prefixes) > 4
    assert all(prefixes)


# ----------------------------------------------------------------- cancel, faults, threads


@pytest.mark.parametrize("memory", ["pageable", "pinned"])  # pinned: DMAs only, no ring
@pytest.mark.parametrize("direction", ["d2h", "h2d"])
def test_cancel_reports_the_complete_prefix_stops_before_returning_and_frees_the_ring(
    device_kind, direction, memory
):
    a = sample((1024, 256), np.float64)  # 2 MiB: 32 chunks
    holder, progress = cancel_on_progress()
    with opened(device_kind, delay=0.003) as device, contextlib.ExitStack() as stack:
        if memory == "pinned":
            host = stack.enter_context(device.pinned(a.shape, a.dtype))
        else:
            host = np.zeros_like(a)
        staged_before = device.staged()
        if direction == "d2h":
            transfer = interop.copy_to_host_async(
                device.asarray(a), host, chunk_bytes=CHUNK, progress=progress
            )
            written = lambda: raw(host)  # noqa: E731
        else:
            host[...] = a
            out = device.asarray(np.zeros_like(a))
            transfer = interop.copy_to_device_async(host, out, chunk_bytes=CHUNK, progress=progress)
            written = lambda: raw(device.to_numpy(out))  # noqa: E731
        holder["t"] = transfer
        with pytest.raises(interop.TransferError, match=r"cancelled; bytes \[0, \d+\)") as info:
            transfer.result(timeout=60)
        assert transfer.done()
        done = info.value.bytes_done
        assert 0 < done < a.nbytes
        assert done % CHUNK == 0
        after = written()
        assert after[:done] == raw(a)[:done]
        assert after[-CHUNK:] == bytes(CHUNK)  # the last chunk was never queued
        time.sleep(0.05)  # many stream delays: no copy is still queued
        assert written() == after
        if device.emulated:  # the pinned copy's DMAs alone: no host thread touched a slot
            assert (device.staged() == staged_before) == (memory == "pinned")
        assert cached_rings() == 0  # a failed transfer's ring is freed, not cached
        # and the device stays usable: the same copy again, whole
        if direction == "d2h":
            host[...] = 0
            interop.copy_to_host(device.asarray(a), host, chunk_bytes=CHUNK)
        else:
            interop.copy_to_device(host, out, chunk_bytes=CHUNK)
        assert written() == raw(a)
        assert cached_rings() == (memory == "pageable")  # the staged copy gave its ring back


@pytest.mark.parametrize("direction", ["d2h", "h2d"])
def test_a_cancel_after_the_last_chunk_is_still_true_and_result_raises(device_kind, direction):
    """``cancel()`` from the last progress call (every chunk copied, none left
    to skip): True, so result() raises the cancellation, with every byte
    complete; every stream and buffer is released as on success."""
    a = sample((256, 256), np.float64)  # 512 KiB: 8 chunks
    holder, given, answers = {}, threading.Event(), []

    def progress(done, total):
        if done == total:
            given.wait(30)
            answers.append(holder["t"].cancel())

    with opened(device_kind, delay=0.001) as device:
        if direction == "d2h":
            host = np.zeros_like(a)
            t = interop.copy_to_host_async(
                device.asarray(a), host, chunk_bytes=CHUNK, progress=progress
            )
            written = lambda: raw(host)  # noqa: E731
        else:
            out = device.asarray(np.zeros_like(a))
            t = interop.copy_to_device_async(a, out, chunk_bytes=CHUNK, progress=progress)
            written = lambda: raw(device.to_numpy(out))  # noqa: E731
        holder["t"] = t
        given.set()
        with pytest.raises(interop.TransferError, match="cancelled") as info:
            t.result(timeout=60)  # today: returned out
        assert answers == [True]
        assert info.value.bytes_done == info.value.nbytes == a.nbytes
        assert written() == raw(a)
        assert t.cancel() is False
        device.check_released()


def _chunked_copy(device, a, direction, layout):
    """A copy of ``a`` in chunks of ``CHUNK``, to the host from ``device`` ("d2h") or
    onto it ("h2d"), "contiguous" or "transposed" (packed or unpacked on the device):
    (the values expected, ``call(progress)`` that copies, ``result()`` that reads the
    destination back)."""
    if direction == "d2h":
        src = device.asarray(a)
        src, expect = (src, a) if layout == "contiguous" else (src.T, a.T)  # .T: packed
        out = np.zeros_like(expect)
        return (
            expect,
            lambda p: interop.copy_to_host(src, out, chunk_bytes=CHUNK, progress=p),
            lambda: out,
        )
    if layout == "contiguous":
        dst = device.empty(a.shape, a.dtype)
    else:
        dst = device.empty(a.T.shape, a.dtype).T  # unpacked on the device
    return (
        a,
        lambda p: interop.copy_to_device(a, dst, chunk_bytes=CHUNK, progress=p),
        lambda: device.to_numpy(dst),
    )


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
    ],
)
def test_a_device_fault_at_each_stage_is_reported_and_everything_released(direction, stage, layout):
    """Emulated only: faults are injected into the emulated device (a progress
    callback's error, on both devices, is the test after this one)."""
    nth = 3 if stage in ("fill", "drain", "copy", "pack") else 1
    device = make_device(faults={stage: nth})
    a = sample((512, 256), np.float64)
    free_cached_rings()
    threads_before = transfer_threads()
    expect, call, result = _chunked_copy(device, a, direction, layout)
    with pytest.raises(
        interop.TransferError, match=r"failed \(\w+: .*\); bytes \[0, \d+\)"
    ) as info:
        call(False)
    cause = info.value.__cause__
    assert isinstance(cause, EmulatedDeviceError)
    bytes_done = info.value.bytes_done
    assert bytes_done % CHUNK == 0
    assert bytes_done < a.nbytes
    if direction == "d2h":  # the complete prefix is right
        assert raw(result())[:bytes_done] == raw(expect)[:bytes_done]
    assert transfer_threads() == threads_before  # host threads and transfer joined
    sticky = stage in ("copy", "pack")
    if sticky:  # like CUDA after an asynchronous error: freeing fails, and says so
        assert "freeing the staging ring also failed" in "\n".join(cause.__notes__)
    assert device.violations == []
    assert device._streams == [device.default_stream]
    assert cached_rings() == 0
    if not sticky:
        assert device.host_buffers == {}
    device.close()


@pytest.mark.parametrize(
    ("direction", "layout"),
    [("d2h", "transposed"), ("h2d", "contiguous"), ("d2h", "contiguous"), ("h2d", "transposed")],
)
def test_a_progress_callbacks_error_is_raised_as_itself_and_everything_released(
    device, direction, layout
):
    """The callback's own error comes back as itself, with a note of the
    complete bytes; the device staging is back in its pool while the error
    lives, and the device stays usable."""
    a = sample((512, 256), np.float64)
    calls = []

    def progress(done, total):
        calls.append(done)
        if len(calls) == 2:
            raise ZeroDivisionError("from the progress callback")

    expect, call, result = _chunked_copy(device, a, direction, layout)
    in_use = device.bytes_in_use()
    threads_before = transfer_threads()
    with pytest.raises(ZeroDivisionError, match="from the progress callback") as info:
        call(progress)
    assert not isinstance(info.value, interop.TransferError)
    bytes_done = note_bytes_done(info.value)
    assert bytes_done == calls[1]
    assert bytes_done % CHUNK == 0
    assert bytes_done < a.nbytes
    if direction == "d2h":  # the complete prefix is right
        assert raw(result())[:bytes_done] == raw(expect)[:bytes_done]
    assert transfer_threads() == threads_before  # host threads and transfer joined
    assert cached_rings() == 0  # a failed transfer's ring is freed, not cached
    assert device.bytes_in_use() == in_use  # device staging released, though the error lives
    call(None)  # the device stays usable
    assert raw(result()) == raw(expect)


@pytest.mark.parametrize("fails", [False, True], ids=["completes", "fails"])
def test_device_staging_is_freed_while_frames_of_the_schedule_live_on(device, fails):
    """The staging block goes back to its pool when the transfer ends, even
    while something else keeps the schedule's frames (and their views of the
    rows) alive: here a profiler that holds every frame. Under
    compute-sanitizer such frames were seen to outlive the call, held by
    something unidentified, and the block stayed in use (256 KiB)."""
    a = np.arange(1 << 20, dtype=np.float32).reshape(1024, 1024)
    src = device.asarray(a).T  # packed on the device
    gc.collect()  # earlier tests' garbage, which the profiler's allocations could collect
    before = device.bytes_in_use()
    frames = []

    def keep(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "device_step":
            frames.append(frame)

    def progress(done, total):
        if fails:
            raise ZeroDivisionError

    previous = threading.getprofile(), sys.getprofile()
    # the calling thread (a blocking copy's schedule runs there) and any thread
    # started from now
    threading.setprofile(keep)
    sys.setprofile(keep)
    try:
        if fails:
            with pytest.raises(ZeroDivisionError):
                interop.copy_to_host(src, chunk_bytes=1 << 16, progress=progress)
        else:
            out = interop.copy_to_host(src, chunk_bytes=1 << 16, progress=progress)
            np.testing.assert_array_equal(out, a.T)
    finally:
        sys.setprofile(previous[1])
        threading.setprofile(previous[0])
    assert any("row" in f.f_locals for f in frames)  # views of the rows outlived the call
    assert device.bytes_in_use() == before
    frames.clear()
    gc.collect()
    assert device.bytes_in_use() == before  # and the views going later frees nothing twice
    np.testing.assert_array_equal(interop.copy_to_host(src, chunk_bytes=1 << 16), a.T)


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
        into = np.zeros((96, 256), np.float32)
        assert interop.copy_to_host(d.T, into, chunk_bytes=CHUNK) is into
        fresh = interop.copy_to_host(d.T, chunk_bytes=CHUNK)
        np.testing.assert_array_equal(fresh, into)
        return into.T

    results = in_threads(work, 8)
    for s, r in zip(sources, results, strict=True):
        np.testing.assert_array_equal(r, s)


def test_an_error_held_after_a_failed_drain_keeps_neither_source_nor_destination_alive():
    """Emulated only: the drain fault is injected into the emulated device."""
    device = make_device(faults={"drain": 2})
    a = sample((256, 256), np.float64)
    src = device.asarray(a)
    out = np.zeros_like(a)
    refs = weakref.ref(src), weakref.ref(out)
    try:
        interop.copy_to_host(src, out, chunk_bytes=CHUNK)
    except interop.TransferError as exc:
        held = exc
    del src, out
    assert [r() for r in refs] == [None, None]
    assert isinstance(held, interop.TransferError)
    assert isinstance(held.__cause__, EmulatedDeviceError)
    device.close()


def test_a_callbacks_error_held_keeps_neither_source_nor_destination_alive(device):
    a = sample((256, 256), np.float64)
    src = device.asarray(a)
    out = np.zeros_like(a)
    refs = weakref.ref(src), weakref.ref(out)

    def progress(done, total):
        raise ZeroDivisionError

    try:
        interop.copy_to_host(src, out, chunk_bytes=CHUNK, progress=progress)
    except ZeroDivisionError as exc:
        held = exc
    del src, out
    assert [r() for r in refs] == [None, None]
    assert isinstance(held, ZeroDivisionError)


def test_device_to_device_copies_on_the_destination_stream(device):
    a = sample((64, 32), np.int32)
    src = device.asarray(a)
    out = device.empty((32, 64), np.int32)
    assert interop.copy_to_device(src.T, out) is out
    np.testing.assert_array_equal(device.to_numpy(out), a.T)
    fresh = interop.copy_to_device(src)
    np.testing.assert_array_equal(device.to_numpy(fresh), a)


def test_device_to_device_waits_for_the_source_stream(device):
    """The copy is queued on the destination's stream (CuPy's current one),
    after the work queued on the source's (PyTorch's current one, busy) before
    the call."""
    a = sample((1024, 1024), np.float32)
    out = device.empty(a.shape, a.dtype)  # CuPy's current stream: the default one
    side = device.stream()
    with device.use_stream(side, lib="torch"):  # PyTorch's current stream: the producer
        device.hold(side, 0.2)
        src = device.asarray(a, lib="torch")  # written on side, after the hold
        assert interop.copy_to_device(src, out) is out
    np.testing.assert_array_equal(device.to_numpy(out), a)


def test_device_to_host_waits_for_the_producer_stream(device):
    """No explicit synchronisation: the copy is ordered after the work queued
    on the source's stream (PyTorch's current one, busy) before the call."""
    a = sample((1024, 1024), np.float32)
    side = device.stream()
    with device.use_stream(side, lib="torch"):
        device.hold(side, 0.1)
        x = device.asarray(a, lib="torch")  # written on side, after the hold
        out = interop.copy_to_host(x, chunk_bytes=1 << 20)
    np.testing.assert_array_equal(out, a)


def test_host_to_device_is_ordered_after_work_queued_on_the_outs_stream(device):
    """Work queued on the current stream before the copy (here: writing out)
    lands first, and is never written over later."""
    side = device.stream()
    with device.use_stream(side, lib="torch"):
        device.hold(side, 0.1)
        out = device.asarray(np.ones(1 << 20, np.float32), lib="torch")  # after the hold
        interop.copy_to_device(np.full(1 << 20, 2.0, np.float32), out, chunk_bytes=1 << 18)
    np.testing.assert_array_equal(device.to_numpy(out), np.full(1 << 20, 2.0, np.float32))


def test_device_to_device_across_devices_is_ordered_after_the_producer(device_kind):
    """A strided source on another device is read on the copy's stream, after
    the producer's work (not packed on an unordered stream of its device)."""
    a = sample((2048, 2048), np.float32)
    with opened(device_kind, devices=2) as d0:
        d0.need_devices(2)
        d1 = d0.peer(1)
        out = d0.empty((2048, 1024), np.float32)
        side = d1.stream()
        with d1.activate(), d1.use_stream(side, lib="torch"):
            d1.hold(side, 0.2)
            src = d1.asarray(a, lib="torch")  # written on side, after the hold
            assert interop.copy_to_device(src[:, ::2], out) is out
        np.testing.assert_array_equal(d0.to_numpy(out), a[:, ::2])


def copies_on_one_device(upload):
    """Both directions, blocking and asynchronous (the transfer's own thread), with
    the host pool's threads, on the device ``upload`` puts arrays on (the test's
    current one); values checked."""
    a = sample((512, 256), np.float32)  # 8 chunks: every slot, several host threads
    x = upload(a)
    np.testing.assert_array_equal(interop.copy_to_host(x, chunk_bytes=CHUNK), a)
    got = interop.copy_to_host_async(x, chunk_bytes=CHUNK).result(timeout=60)
    np.testing.assert_array_equal(got, a)
    y = upload(np.zeros_like(a))
    interop.copy_to_device_async(a, y, chunk_bytes=CHUNK).result(timeout=60)
    np.testing.assert_array_equal(interop.copy_to_host(y, chunk_bytes=CHUNK), a)


def test_transfers_on_the_second_device_make_no_context_on_the_first():
    """The host pool's threads and a transfer's own thread select the transfer's
    device before any device call: CUDA would make a context (hundreds of MiB)
    on device 0, the current device of a thread that never chose one."""
    with opened("emulated", devices=2) as d0:
        one = d0.peer(1)
        with one.activate():
            copies_on_one_device(one.asarray)
            assert d0.emulated.contexts == {1}


# The [cuda] half: a process that uses GPU 1 alone (pytest's own has a context on GPU 0).
_SECOND_GPU_ONLY = """
import ctypes
import cupy

cupy.cuda.Device(1).use()
from tests.pipeline.test_schedule import copies_on_one_device

copies_on_one_device(cupy.asarray)
driver = ctypes.CDLL("libcuda.so.1")


def has_context(index):
    device, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
    assert driver.cuDeviceGet(ctypes.byref(device), index) == 0
    assert driver.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags), ctypes.byref(active)) == 0
    return bool(active.value)


print("contexts", has_context(0), has_context(1))
"""


@pytest.mark.gpu
@pytest.mark.multigpu
def test_gpu_transfers_on_the_second_device_make_no_context_on_the_first():
    proc = run_python(_SECOND_GPU_ONLY, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["contexts", "False", "True"]


def test_a_transposed_source_needs_no_more_device_memory_than_the_ring(device):
    """Packing on the device takes one staging row per slot, nothing of the source's size."""
    a = np.ones((2048, 4096), np.float32)  # 32 MiB
    d = device.asarray(a)
    chunk = 1 << 20
    # the staging comes from CuPy's pool
    with interop.config.set(chunk_bytes=chunk, num_buffers=3), device.measure_peak("cupy") as peak:
        out = interop.copy_to_host(d.T, chunk_bytes=chunk)
    assert out.sum() == a.size
    assert out.shape == (4096, 2048)
    assert 0 < peak.bytes <= 3 * chunk


# ----------------------------------------------------------------- casting on the way


@pytest.mark.parametrize("view", ["contiguous", "transposed", "negative"])
@pytest.mark.parametrize("memory", ["pageable", "pinned"])
def test_device_data_is_cast_on_the_device_chunk_by_chunk(device, view, memory):
    """bfloat16 reaches the host as float32, cast chunk by chunk on the device:
    no full-size float32 temporary, unlike ``t.float().cpu()``."""
    a = sample((1024, 512), ml_dtypes.bfloat16)  # 2 MiB as float32: 32 chunks
    lib = "cupy" if view == "negative" else "torch"  # PyTorch has no negative steps
    d = device.asarray(a, lib)
    src, expect = VIEWS[view](d), VIEWS[view](a).astype(np.float32)
    with contextlib.ExitStack() as stack:
        out = None
        if memory == "pinned":
            out = stack.enter_context(device.pinned(expect.shape, np.float32))
        # the temporaries come from the source library's allocator (on the
        # emulated device: every allocation, packing rows included)
        with device.measure_peak(lib) as peak:
            got = interop.copy_to_host(src, out, dtype=np.float32, chunk_bytes=CHUNK)
        if memory == "pinned":
            assert got is out
        assert got.dtype == np.float32
        assert raw(got) == raw(expect)
    if memory == "pinned":  # straight into the pinned out
        assert cached_rings() == 0
        if device.emulated:
            assert device.staged() == 0
    # chunk-sized float32 temporaries (and packing rows), never a full-size one
    assert 0 < peak.bytes <= 2 * interop.config.num_buffers * CHUNK < expect.nbytes


def test_a_cast_in_the_transfers_thread_comes_from_the_librarys_own_pool(device):
    """``copy_to_host_async(x, dtype=...)`` of a CuPy array made on a stream of its own,
    with CuPy allocating from PyTorch's pool in every thread: the transfer's thread
    casts each chunk on that stream, where PyTorch's current stream is another one.
    The temporaries come from CuPy's own pool (as the staging rows do), so no
    StreamMismatchError: the cast values come back."""
    a = sample((512, 256), np.float16)  # 512 KiB as float32: 8 chunks
    s = device.stream()
    with device.use_stream(s):
        d = device.asarray(a)
        with device.torch_allocator():
            transfer = interop.copy_to_host_async(d, dtype=np.float32, chunk_bytes=CHUNK)
            got = transfer.result(timeout=60)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, a.astype(np.float32))


def test_a_strided_float16_array_is_cast_on_the_way(device):
    a = np.linspace(-3, 3, 1 << 20, dtype=np.float16).reshape(1024, 1024)
    d = device.asarray(a)
    got = interop.copy_to_host(d[::2, ::3], dtype=np.float32)
    np.testing.assert_array_equal(got, a[::2, ::3].astype(np.float32))


def test_a_lazily_transformed_source_is_resolved_then_cast(device):
    """The emulated device's inverted view, or a CUDA tensor's negative bit:
    applied chunk by chunk on the device, then cast."""
    a = sample((256, 64), np.float16)
    src, values = device.lazy(device.asarray(a, lib="torch"), a)
    out = interop.copy_to_host(src, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(out, values.astype(np.float64))
