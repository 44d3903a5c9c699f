"""The host backend enforces CUDA's rules: each rule is broken here on purpose
and must be caught, so that the pipeline tests that pass through it mean
something."""

from __future__ import annotations

import mmap
import threading
import time

import numpy as np
import pytest

import interop
from interop.pipeline.ring import StagingRing
from interop.testing import (
    EmulatedCaptureError,
    EmulatedDevice,
    EmulatedDeviceError,
    InvertedArray,
    RuleViolation,
)
from tests.helpers import NUMPY_DTYPES, hold, inverted_bytes, sample

CHUNK = 64 << 10  # the smallest chunk interop uses


@pytest.fixture
def backend():
    b = EmulatedDevice()
    yield b
    b.close()


def test_streams_execute_in_order_and_events_complete_when_reached(backend):
    s = backend.stream()
    order = []
    gate = threading.Event()
    s.enqueue("op", lambda: (gate.wait(5), order.append(1)))
    s.enqueue("op", lambda: order.append(2))
    e = backend.event()
    e.record(s)
    assert order == []
    gate.set()
    e.synchronize()
    assert order == [1, 2]
    s.close()


def test_a_stream_waits_for_an_event_of_another_stream(backend):
    a, b = backend.stream(), backend.stream()
    gate = threading.Event()
    seen = []
    a.enqueue("op", lambda: (gate.wait(5), seen.append("a")))
    e = backend.event()
    e.record(a)
    b.wait(e)
    b.enqueue("op", lambda: seen.append("b"))
    threading.Timer(0.05, gate.set).start()
    b.synchronize()
    assert seen == ["a", "b"]
    a.close()
    b.close()


def test_data_moves_through_device_memory(backend):
    host = np.arange(24, dtype=np.int32).reshape(4, 6)
    dev = backend.asarray(host)
    out = backend.empty((6, 4), np.int32)
    s = backend.current_stream()
    backend.copy_on_device(out, dev.T, s)
    np.testing.assert_array_equal(backend.to_numpy(out), host.T)
    assert backend.violations == []


@pytest.mark.parametrize(
    "host",
    [np.float64(2.5), np.array(-3, np.int16), np.zeros((0,)), np.zeros((2, 0, 3), np.uint8),
     np.arange(6.0).reshape(2, 3).T, np.arange(4, dtype=">f4")],
    ids=["numpy scalar", "0-d", "empty", "empty 3-d", "transposed", "big-endian"],
)  # fmt: skip
def test_asarray_keeps_the_shape_and_dtype_of_what_it_copies(backend, host):
    """A 0-d array stays 0-d (np.ascontiguousarray would make it (1,)); the
    device copy is C-contiguous and independent of the host array."""
    expect = np.array(host)
    dev = backend.asarray(host)
    assert (dev.shape, dev.dtype) == (expect.shape, expect.dtype)
    assert dev.data.flags.c_contiguous
    got = backend.to_numpy(dev)
    assert (got.shape, got.dtype) == (expect.shape, expect.dtype)
    assert got.tobytes() == np.ascontiguousarray(expect).tobytes()
    if isinstance(host, np.ndarray) and host.size:
        host[...] = 0  # the device copy is its own
        assert backend.to_numpy(dev).tobytes() == got.tobytes()
    assert backend.violations == []


def test_a_device_reshape_is_a_view_and_never_a_copy(backend):
    """Staging rows are reshaped views of one block. NumPy 2.5 deprecates setting ``.shape``
    (the old way to get a view or an error), and the suite turns warnings into errors."""
    dev = backend.asarray(np.arange(12, dtype=np.int32))
    square = dev.reshape((3, 4))
    assert square.region is dev.region
    assert np.shares_memory(square.data, dev.data)
    np.testing.assert_array_equal(backend.to_numpy(square), np.arange(12).reshape(3, 4))
    with pytest.raises(ValueError, match="copy"):
        square.T.reshape((12,))  # a transposed view cannot be flattened without a copy
    assert backend.violations == []


def test_memory_used_on_another_stream_without_an_event_is_refused(backend):
    dev = backend.asarray(np.ones(16, np.float32))  # written on the default stream
    other = backend.stream()
    out = backend.empty((16,), np.float32)
    with pytest.raises(RuleViolation, match="before that stream was ordered"):
        backend.copy_on_device(out, dev, other)
    ready = backend.event()
    ready.record(backend.default_stream)
    other.wait(ready)  # now ordered: allowed
    backend.copy_on_device(out, dev, other)
    np.testing.assert_array_equal(backend.to_numpy(out), np.ones(16, np.float32))
    assert len(backend.violations) == 1
    other.close()


def test_misaligned_typed_access_is_refused(backend):
    block = backend.empty((1024,), np.uint8)
    row = block[300 : 300 + 64].view(np.float64)  # 300 is not a multiple of 8
    src = backend.asarray(np.ones(8))
    with pytest.raises(RuleViolation, match="misaligned float64"):
        backend.copy_on_device(row, src, backend.current_stream())


def test_staging_rows_start_on_256_bytes(backend):
    s = backend.stream()
    staging = backend.staging(3, 300)  # rows of 300 bytes are rounded to 512
    like = backend.empty((37,), np.float64)
    addresses = [staging.view(k, like).data.ctypes.data for k in range(3)]
    assert [a % 256 for a in addresses] == [0, 0, 0]
    assert addresses[1] - addresses[0] == 512
    s.synchronize()
    staging.free()
    s.close()


def test_waiting_on_an_event_never_recorded_is_refused(backend):
    s = backend.stream()
    with pytest.raises(RuleViolation, match="never recorded"):
        s.wait(backend.event())
    with pytest.raises(RuleViolation, match="never recorded"):
        backend.event().synchronize()
    s.close()


def test_a_slot_touched_before_its_dma_was_seen_complete_is_refused(backend):
    gate = threading.Event()
    s = backend.stream()
    s.enqueue("op", lambda: gate.wait(5))  # the DMA below cannot run yet
    src = backend.asarray(np.ones(32, np.uint8))
    ready = backend.event()
    ready.record(backend.default_stream)
    s.wait(ready)
    with StagingRing(backend, 1, 256) as ring:
        backend.copy_to_host(ring.ptrs[0], src, 32, s)
        with pytest.raises(RuleViolation, match="before the device copy"), ring.host(0, 32):
            pass
        done = backend.event()
        done.record(s)
        gate.set()
        done.synchronize()
        with ring.host(0, 32) as buf:
            assert buf.tolist() == [1] * 32


def test_a_dma_queued_on_a_slot_a_host_thread_uses_is_refused(backend):
    src = backend.asarray(np.ones(16, np.uint8))
    backend.synchronize()
    s = backend.stream()
    with (
        StagingRing(backend, 1, 256) as ring,
        ring.host(0, 16),
        pytest.raises(RuleViolation, match="while a host thread uses it"),
    ):
        backend.copy_to_host(ring.ptrs[0], src, 16, s)
    s.close()


def test_use_after_free_is_refused(backend):
    src = backend.asarray(np.ones(16, np.uint8))
    backend.synchronize()
    s = backend.stream()
    ring = StagingRing(backend, 1, 256)
    ptr = ring.ptrs[0]
    ring.free()
    with pytest.raises(RuleViolation, match="freed"):
        backend.copy_to_host(ptr, src, 16, s)
    staging = backend.staging(1, 16)
    backend.synchronize()
    staging.free()
    with pytest.raises(RuleViolation, match="after it was freed"):
        backend.copy_on_device(staging.view(0, src), src, s)
    s.close()


def test_a_dma_must_copy_a_contiguous_array_of_exactly_its_bytes(backend):
    src = backend.asarray(np.ones((4, 4), np.uint8))
    backend.synchronize()
    with StagingRing(backend, 1, 256) as ring:
        s = backend.stream()
        with pytest.raises(RuleViolation, match="C-contiguous: False"):
            backend.copy_to_host(ring.ptrs[0], src.T, 16, s)
        with pytest.raises(RuleViolation, match="DMA of 8 bytes"):
            backend.copy_to_host(ring.ptrs[0], src, 8, s)
        s.close()


def test_a_dma_reaches_only_live_page_locked_memory(backend):
    src = backend.asarray(np.arange(16, dtype=np.uint8))
    backend.synchronize()
    s = backend.stream()
    pageable = np.zeros(16, np.uint8)
    with pytest.raises(RuleViolation, match="not inside one live page-locked buffer"):
        backend.copy_to_host(pageable.ctypes.data, src, 16, s)
    ptr, buf = backend.host_alloc(64)
    buf[:] = 0
    assert backend.is_pinned(ptr, 64)
    assert backend.is_pinned(ptr + 48, 16)
    assert not backend.is_pinned(ptr + 49, 16)  # runs past the buffer's end
    assert not backend.is_pinned(ptr, 0)
    assert not backend.is_pinned(pageable.ctypes.data, 16)
    with pytest.raises(RuleViolation, match="past the buffer's end"):
        backend.copy_to_host(ptr + 49, src, 16, s)
    backend.copy_to_host(ptr + 48, src, 16, s)  # anywhere inside a pinned buffer
    s.synchronize()
    assert buf[48:].tolist() == list(range(16))
    assert buf[:48].tolist() == [0] * 48
    dst = backend.empty((16,), np.uint8)
    ready = backend.event()
    ready.record(backend.default_stream)  # dst was allocated there
    s.wait(ready)
    backend.copy_to_device(dst, ptr + 40, 16, s)
    s.synchronize()
    assert dst.data.tolist() == [0] * 8 + list(range(8))
    backend.host_free(ptr)
    assert not backend.is_pinned(ptr, 16)
    with pytest.raises(RuleViolation, match="freed"):
        backend.copy_to_device(dst, ptr, 16, s)
    s.close()


def test_a_stream_closed_before_the_host_saw_its_work_complete_is_refused(backend):
    """On CUDA the work of a destroyed stream still runs: a copy closing its
    stream unsynchronised could return while its DMAs write the caller's memory."""
    gate = threading.Event()
    s = backend.stream()
    s.enqueue("op", lambda: gate.wait(5))
    gate.set()
    with pytest.raises(RuleViolation, match="never saw complete"):
        s.close()
    backend.violations.clear()
    s = backend.stream()
    s.enqueue("op", lambda: None)
    s.synchronize()
    s.close()  # seen complete: fine
    s.close()  # and closing twice is a no-op
    assert backend.violations == []


def test_an_injected_device_fault_is_sticky():
    faulty = EmulatedDevice(faults={"pack": 1})
    a = faulty.asarray(np.ones(4))
    b = faulty.empty((4,), np.float64)
    faulty.copy_on_device(b, a, faulty.current_stream())
    with pytest.raises(EmulatedDeviceError, match="injected fault"):
        faulty.synchronize()
    with pytest.raises(EmulatedDeviceError, match="failed earlier"):
        faulty.stream()
    faulty.close()


def test_work_queued_on_a_closed_stream_is_refused(backend):
    s = backend.stream()
    s.close()
    with pytest.raises(RuleViolation, match="after it was closed"):
        s.enqueue("op", lambda: None)


def raw(a):
    """Bytes of ``a`` in C order, for exact comparisons of any dtype."""
    return np.ascontiguousarray(a).tobytes()


def address(x):
    return x.data.ctypes.data


# ----------------------------------------------------------------- the caching pool


def test_a_freed_block_is_handed_out_again_only_on_its_own_stream(backend):
    other = backend.stream()
    a = backend.empty((1000,), np.float32)
    where = address(a)
    del a  # back to the default stream's free list at once
    with backend.use_stream(other):
        b = backend.empty((1000,), np.float32)  # other's pool has nothing: a new block
    c = backend.empty((1000,), np.float32)  # the default stream's: the block just freed
    assert address(b) != where
    assert address(c) == where
    assert (backend.counts["device_alloc"], backend.counts["device_reuse"]) == (2, 1)
    backend.synchronize()
    other.close()
    assert backend.violations == []


def test_the_pool_hands_out_the_same_size_first_then_the_most_recently_freed(backend):
    x1, x2 = backend.empty((4096,), np.uint8), backend.empty((4096,), np.uint8)
    big = backend.empty((8192,), np.uint8)
    where = {"x1": address(x1), "x2": address(x2), "big": address(big)}
    del x1, x2, big  # freed in this order: big most recently
    first = backend.empty((1000,), np.int32)  # 4000 bytes, rounded to 4096: a block of its size
    second = backend.empty((4096,), np.uint8)
    third = backend.empty((100,), np.uint8)  # none of its size left: the smallest that fits
    fourth = backend.empty((100,), np.uint8)  # nothing left: a new block
    assert [address(x) for x in (first, second, third)] == [where["x2"], where["x1"], where["big"]]
    assert address(fourth) not in where.values()
    assert backend.counts["device_reuse"] == 3


def test_every_view_of_an_array_keeps_its_block(backend):
    a = backend.empty((64, 64), np.float32)
    where = address(a)
    view = a.T[3:].view(np.int32)
    del a
    b = backend.empty((64, 64), np.float32)
    assert address(b) != where  # the view still holds the block
    del view
    c = backend.empty((64, 64), np.float32)
    assert address(c) == where


def _read_on_another_stream(backend, values):
    """``(a, reader, gate, out)``: ``a`` holds ``values`` (default stream), and a
    copy of it into ``out`` is queued on ``reader``, held there by ``gate``."""
    a = backend.asarray(values)
    reader = backend.stream()
    gate = hold(reader)
    ready = backend.event()
    ready.record(backend.default_stream)
    reader.wait(ready)
    with backend.use_stream(reader):
        out = backend.empty(values.shape, values.dtype)
    backend.copy_on_device(out, a, reader)  # queued behind the gate: not read yet
    return a, reader, gate, out


def test_a_block_reused_while_another_stream_may_still_read_it_is_refused(backend):
    values = np.arange(256, dtype=np.float32)
    a, reader, gate, out = _read_on_another_stream(backend, values)
    del a  # dropped while the copy on reader may still read it
    s, r = backend.default_stream.id, reader.id
    message = (
        f"reused on stream {s} while work queued on stream {r} before its free may still use "
        "it: a use-after-free across streams"
    )
    with pytest.raises(RuleViolation, match=message):
        backend.asarray(np.zeros(256, np.float32))  # same size, same stream: that block
    gate.set()
    np.testing.assert_array_equal(backend.to_numpy(out), values)  # nothing was overwritten
    assert len(backend.violations) == 1
    reader.close()


def test_a_block_is_reused_once_its_stream_waited_for_the_other_streams_work(backend):
    values = np.arange(256, dtype=np.float32)
    a, reader, gate, out = _read_on_another_stream(backend, values)
    where = address(a)
    done = backend.event()
    done.record(reader)
    backend.default_stream.wait(done)  # the reuse below is ordered after the read
    del a
    b = backend.asarray(np.full(256, 7, np.float32))  # that block, written at once
    assert address(b) == where
    gate.set()
    np.testing.assert_array_equal(backend.to_numpy(out), values)  # read before the rewrite
    np.testing.assert_array_equal(backend.to_numpy(b), np.full(256, 7))
    assert backend.violations == []
    reader.close()


def test_a_block_is_reused_once_the_host_saw_the_other_streams_work_complete(backend):
    values = np.arange(256, dtype=np.float32)
    a, reader, gate, out = _read_on_another_stream(backend, values)
    where = address(a)
    gate.set()
    reader.synchronize()
    del a
    b = backend.asarray(np.full(256, 7, np.float32))
    assert address(b) == where
    np.testing.assert_array_equal(backend.to_numpy(out), values)
    np.testing.assert_array_equal(backend.to_numpy(b), np.full(256, 7))
    assert backend.violations == []
    reader.close()


def test_record_stream_keeps_a_block_until_that_stream_reached_the_free(backend):
    values = np.arange(256, dtype=np.float32)
    a, reader, gate, out = _read_on_another_stream(backend, values)
    where = address(a)
    read = backend.event()
    read.record(reader)
    backend.record_stream(a, reader)
    del a  # an event on reader at the free: the block waits for it
    held_back = backend.asarray(np.full(256, 7, np.float32))  # not that block: a new one
    assert address(held_back) != where
    gate.set()
    while not read.query():  # no synchronisation the host could learn from
        time.sleep(0.001)
    again = backend.asarray(np.full(256, 8, np.float32))  # the event is reached: that block
    assert address(again) == where
    np.testing.assert_array_equal(backend.to_numpy(out), values)
    np.testing.assert_array_equal(backend.to_numpy(again), np.full(256, 8))
    assert backend.counts["device_reuse"] == 1
    assert backend.violations == []
    staging = backend.staging(1, 64)
    backend.synchronize()
    staging.free()
    with pytest.raises(RuleViolation, match=r"record_stream of .* after it was freed"):
        backend.record_stream(staging.block, reader)
    reader.close()


def test_queued_work_on_a_block_handed_out_again_fails_when_it_runs(backend):
    """The second line: a queued copy that runs after its block was handed out
    again and written on another stream. The stream clocks leave no way to get
    there, so the test lies to them (the host "saw" the reader's work complete)."""
    values = np.arange(256, dtype=np.float32)
    a, reader, gate, _ = _read_on_another_stream(backend, values)
    backend.machine.observed(dict(reader.clock))  # false: the copy is held by the gate
    del a
    b = backend.asarray(np.zeros(256, np.float32))  # handed out again and written ...
    backend.default_stream.synchronize()  # ... before the copy on reader runs
    gate.set()
    with pytest.raises(
        EmulatedDeviceError, match=f"handed out again on stream {b.allocated_on.id}"
    ):
        reader.synchronize()
    assert "use-after-free across streams" in backend.violations[-1]


# ----------------------------------------------------------------- two libraries' current streams


def test_each_library_has_its_own_current_stream_per_thread(backend):
    s = backend.stream()
    default = backend.default_stream
    with backend.use_stream(s, lib="torch"):
        assert backend.current_stream("torch") is s
        assert backend.current_stream("cupy") is backend.current_stream() is default
        t = backend.empty((8,), np.float32, lib="torch")
        c = backend.empty((8,), np.float32)
        assert (t.lib, t[2:].lib, c.lib) == ("torch", "torch", "cupy")
        assert (t.allocated_on, c.allocated_on) == (s, default)
        assert backend.source(t[2:]).stream is s  # a tensor's producer: torch's stream
        assert backend.target(c, "f").stream is default  # a CuPy array's: CuPy's
        seen = []
        worker = threading.Thread(target=lambda: seen.append(backend.current_stream("torch")))
        worker.start()
        worker.join()
        assert seen == [default]  # another thread has its own
    with backend.use_stream(s):  # no lib: both, like interop.stream
        assert backend.current_stream("torch") is backend.current_stream("cupy") is s
    assert backend.current_stream("torch") is backend.current_stream("cupy") is default
    with pytest.raises(ValueError, match="expected lib 'torch' or 'cupy' \\(got 'jax'\\)"):
        backend.empty((1,), np.uint8, lib="jax")
    s.synchronize()
    s.close()


def test_an_array_used_on_another_librarys_stream_needs_an_event(backend):
    a = np.arange(16, dtype=np.float32)
    s = backend.stream()
    with backend.use_stream(s, lib="torch"):
        gate = hold(s)
        t = backend.asarray(a, lib="torch")  # written on s, behind the gate
        out = backend.empty((16,), np.float32)  # CuPy's: on the default stream
        with pytest.raises(RuleViolation, match="before that stream was ordered"):
            backend.copy_on_device(out, t, backend.default_stream)  # a bare copy: not ordered
        interop.copy_to_device(t, out)  # out's stream first waits on t's producer (s)
    gate.set()
    np.testing.assert_array_equal(backend.to_numpy(out), a)
    assert len(backend.violations) == 1
    s.close()


# ----------------------------------------------------------------- two devices


@pytest.fixture
def machine():
    d0 = EmulatedDevice(devices=2)
    yield d0, d0.peer(1)
    d0.close()


def test_a_machine_of_two_devices(machine):
    d0, d1 = machine
    assert (d0.index, d1.index) == (0, 1)
    assert d0.devices == (d0, d1)
    assert d1.peer(0) is d0
    assert len(EmulatedDevice().devices) == 1
    assert d0.ring_key is d1.ring_key  # pinned memory serves both
    assert d1.default_stream.backend is d1
    assert d0.current_device() == 0
    with d1.activate():
        assert d0.current_device() == 1
        with d0.activate():
            assert d0.current_device() == 0
        seen = []
        worker = threading.Thread(target=lambda: seen.append(d0.current_device()))
        worker.start()
        worker.join()
        assert seen == [0]  # the current device is per thread
        assert d1.current_device() == 1
    assert d0.current_device() == 0
    with (
        pytest.raises(RuleViolation, match="use_stream of device 0 given stream"),
        d0.use_stream(d1.default_stream),
    ):
        pass
    with pytest.raises(ValueError, match=r"expected a device index in \[0, 2\) \(got 2\)"):
        d0.peer(2)
    with pytest.raises(ValueError, match="expected devices >= 1"):
        EmulatedDevice(devices=0)


def test_device_work_is_queued_only_while_its_device_is_current(machine):
    d0, d1 = machine
    with pytest.raises(RuleViolation, match=r"alloc.* of device 1 while device 0 is current"):
        d1.empty((16,), np.float32)
    with d1.activate():
        x = d1.asarray(np.arange(16, dtype=np.float32))
        y = d1.empty((16,), np.float32)
    with pytest.raises(RuleViolation, match=r"pack.* of device 1 while device 0 is current"):
        d1.copy_on_device(y, x, d1.default_stream)
    with d1.activate():
        d1.copy_on_device(y, x, d1.default_stream)
    np.testing.assert_array_equal(d1.to_numpy(y), np.arange(16))
    assert len(d0.violations) == 2


def test_an_event_is_recorded_only_on_a_stream_of_its_device(machine):
    d0, d1 = machine
    with pytest.raises(
        RuleViolation, match=r"an event of device 0 recorded on stream \d+ of device 1"
    ):
        d0.event().record(d1.default_stream)
    with pytest.raises(RuleViolation, match="a timing event of device 1 recorded on stream"):
        d1.timer().record(d0.default_stream)
    # a stream may wait on an event of another device: it orders the work
    with d1.activate():
        gate = hold(d1.default_stream)
        x = d1.asarray(np.arange(16, dtype=np.float32))  # behind the gate
    s = d0.stream()
    ready = d1.event()
    ready.record(d1.default_stream)
    s.wait(ready)
    with d0.use_stream(s):
        out = d0.empty((16,), np.float32)
    d0.copy_on_device(out, x, s)  # a peer copy, after x was written
    gate.set()
    np.testing.assert_array_equal(d0.to_numpy(out), np.arange(16))
    assert len(d0.violations) == 2
    s.close()


def test_a_peer_copy_is_ordered_like_any_read_and_reads_the_bytes_its_view_spans(machine):
    d0, d1 = machine
    a = sample((40, 30), np.complex64)
    with d1.activate():
        gate = hold(d1.default_stream)
        x = d1.asarray(a)  # written behind the gate
    view, expect = x[::-2, 5:25:3].T, a[::-2, 5:25:3].T  # negative and odd strides
    s = d0.stream()
    with d0.use_stream(s):
        out = d0.empty(expect.shape, expect.dtype)
    with pytest.raises(RuleViolation, match="before that stream was ordered"):
        d0.copy_on_device(out, view, s)  # the peer read is not ordered after the write
    with pytest.raises(RuleViolation, match=r"queued on stream \d+ of device 1"):
        d0.copy_on_device(out, view, d1.default_stream)  # out is on device 0
    ready = d1.event()
    ready.record(d1.default_stream)
    s.wait(ready)
    alloc = d0.counts["device_alloc"]
    d0.copy_on_device(out, view, s)
    assert d0.counts["device_alloc"] == alloc + 1  # the temporary, from the pool on s
    gate.set()
    np.testing.assert_array_equal(d0.to_numpy(out), expect)
    assert len(d0.violations) == 2
    s.close()


def test_transfers_of_data_on_a_second_device(machine):
    d0, d1 = machine
    a = sample((300, 70), np.float64)
    with d1.activate():
        x = d1.asarray(a)
        back = d1.empty(a.shape, a.dtype)
    np.testing.assert_array_equal(interop.copy_to_host(x.T, chunk_bytes=CHUNK), a.T)
    interop.copy_to_device(a[::-1], back, chunk_bytes=CHUNK)
    np.testing.assert_array_equal(d1.to_numpy(back), a[::-1])
    out = d0.empty((70, 300), np.float64)
    assert interop.copy_to_device(x.T, out) is out  # device 1 to device 0: a peer copy
    np.testing.assert_array_equal(d0.to_numpy(out), a.T)
    assert d0.violations == []


# ----------------------------------------------------------------- lazily transformed chunks


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_a_lazily_inverted_source_is_made_chunk_by_chunk_on_its_producer_stream(backend, dtype):
    a = sample((300, 70), dtype)
    producer = backend.stream()
    with backend.use_stream(producer, lib="torch"):
        gate = hold(producer)
        x = backend.asarray(a, lib="torch")  # written on the producer, behind the gate
        lazy, lazy_t = backend.inverted(x), backend.inverted(x.T)
        assert isinstance(lazy, InvertedArray)
        assert (lazy.shape, lazy.dtype) == (a.shape, a.dtype)
        transfer = interop.copy_to_host_async(lazy, chunk_bytes=CHUNK)
        time.sleep(0.02)
        assert transfer.bytes_done == 0  # nothing before the producer's work ran
        gate.set()
        got = transfer.result(timeout=60)
        out = np.zeros(a.T.shape, a.dtype)
        assert interop.copy_to_host(lazy_t, out, chunk_bytes=CHUNK) is out
    assert raw(got) == inverted_bytes(a)
    assert raw(out) == inverted_bytes(a.T)
    assert raw(backend.to_numpy(x)) == raw(a)  # the base is left as it was
    assert backend.violations == []
    producer.close()


def test_inverted_chunks_reuse_their_temporaries_without_breaking_a_rule(backend):
    a = sample((512, 256), np.float64)  # 16 chunks through 2 slots
    x = backend.asarray(a)
    with interop.config.set(num_buffers=2):
        got = interop.copy_to_host(backend.inverted(x[:, ::-1]), chunk_bytes=CHUNK)
    assert raw(got) == inverted_bytes(a[:, ::-1])
    assert backend.counts["device_reuse"] >= 10  # a chunk's temporary went to a later chunk
    assert backend.violations == []


def test_an_inverted_source_copied_on_the_device_leaves_its_temporary_safe_to_reuse(backend):
    """The temporary goes back to the producer's pool while the copy on out's
    stream may still be queued: the producer's stream waits for the copy."""
    a = sample((64, 32), np.int32)
    s, c = backend.stream(), backend.stream()
    with backend.use_stream(s, lib="torch"), backend.use_stream(c, lib="cupy"):
        x = backend.asarray(a, lib="torch")  # on s
        out = backend.empty(a.shape, a.dtype)  # on c
        gate = hold(c)  # the copy waits behind it
        assert interop.copy_to_device(backend.inverted(x), out) is out
        reused = backend.counts["device_reuse"]
        y = backend.asarray(np.full_like(a, 7), lib="torch")  # the temporary's block, written
        assert backend.counts["device_reuse"] == reused + 1
        gate.set()
        assert raw(backend.to_numpy(out)) == inverted_bytes(a)
        np.testing.assert_array_equal(backend.to_numpy(y), np.full_like(a, 7))
    assert backend.violations == []
    s.close()
    c.close()


def test_a_lazily_inverted_array_is_refused_as_a_destination(backend):
    x = backend.asarray(np.zeros((8, 8), np.float32))
    lazy = backend.inverted(x)
    message = "copy_to_device expected an out that is not lazily inverted"
    with pytest.raises(interop.InvalidValueError, match=message):
        interop.copy_to_device(np.ones((8, 8), np.float32), lazy)
    with pytest.raises(interop.InvalidValueError, match=message):
        interop.copy_to_device(backend.asarray(np.ones((8, 8), np.float32)), lazy)
    assert not backend.to_numpy(x).any()  # nothing was written
    assert backend.violations == []


# ----------------------------------------------------------------- capture


def test_captured_work_runs_only_when_the_graph_is_replayed(backend):
    s = backend.stream()
    with backend.use_stream(s):
        src = backend.asarray(np.arange(32, dtype=np.int64))
        dst = backend.asarray(np.zeros(32, np.int64))
    s.synchronize()
    with backend.capture(s) as graph:
        assert backend.is_capturing(s)
        assert not backend.is_capturing(backend.default_stream)
        backend.copy_on_device(dst, src[::-1], s)
    assert not backend.is_capturing(s)
    assert graph.operations == ["pack"]
    assert not backend.to_numpy(dst).any()  # recorded, not run
    graph.replay()
    np.testing.assert_array_equal(backend.to_numpy(dst), np.arange(32)[::-1])
    with backend.use_stream(s):
        fresh = backend.asarray(np.arange(32, dtype=np.int64) * 10)
    backend.copy_on_device(src, fresh, s)
    graph.replay()  # each replay reads the values of now
    np.testing.assert_array_equal(backend.to_numpy(dst), (np.arange(32) * 10)[::-1])
    assert backend.violations == []
    s.close()


def test_device_copies_through_interop_are_captured_and_replayed(backend):
    a = sample((64, 48), np.float32)
    s = backend.stream()
    with backend.use_stream(s):
        x = backend.asarray(a, lib="torch")  # its inverted view's temporary: the graph's pool
        out = backend.asarray(np.zeros(a.T.shape, a.dtype))
        flipped = backend.asarray(np.zeros(a.shape, a.dtype))
        s.synchronize()
        with backend.capture(s) as graph:
            interop.copy_to_device(x.T, out)
            interop.copy_to_device(backend.inverted(x), flipped)  # a temporary of the graph
        assert not backend.to_numpy(out).any()
        for k in range(2):
            b = a + k
            backend.copy_on_device(x, backend.asarray(b), s)
            graph.replay()
            np.testing.assert_array_equal(backend.to_numpy(out), b.T)
            assert raw(backend.to_numpy(flipped)) == inverted_bytes(b)
    assert backend.violations == []
    s.close()


def test_memory_rules_are_checked_when_work_is_captured(backend):
    s = backend.stream()
    src = backend.asarray(np.ones(8))  # written on the default stream
    with backend.use_stream(s):
        dst = backend.empty((8,), np.float64)
    with backend.capture(s), pytest.raises(RuleViolation, match="before that stream was ordered"):
        backend.copy_on_device(dst, src, s)


def test_replaying_a_graph_whose_memory_was_freed_is_refused(backend):
    s = backend.stream()
    with backend.use_stream(s):
        src = backend.asarray(np.ones(8))
        dst = backend.empty((8,), np.float64)
    with backend.capture(s) as graph:
        backend.copy_on_device(dst, src, s)
    del src
    with pytest.raises(RuleViolation, match=r"used on stream .* after it was freed"):
        graph.replay()


def _forbidden(name, backend, s, outside, ptr):
    """Each call CUDA's global capture mode forbids while a capture is under way."""
    return {
        "stream synchronize": lambda: s.synchronize(),
        "event synchronize": lambda: outside.synchronize(),
        "event query": lambda: outside.query(),
        "host_alloc": lambda: backend.host_alloc(64),
        "host_free": lambda: backend.host_free(ptr),
        "device synchronize": lambda: backend.synchronize(),
        "wait on an event recorded outside": lambda: s.wait(outside),
    }[name]


FORBIDDEN = [
    ("stream synchronize", "synchronised while it captures"),
    ("event synchronize", "an event synchronised"),
    ("event query", "an event queried"),
    ("host_alloc", "cudaHostAlloc"),
    ("host_free", "cudaFreeHost"),
    ("device synchronize", "cudaDeviceSynchronize"),
    ("wait on an event recorded outside", "StreamCaptureIsolation"),
]


@pytest.mark.parametrize(("name", "message"), FORBIDDEN, ids=[n for n, _ in FORBIDDEN])
def test_what_capture_forbids_fails_and_invalidates_it(backend, name, message):
    s = backend.stream()
    ptr, _ = backend.host_alloc(64)
    outside = backend.event()
    outside.record(backend.default_stream)
    call = _forbidden(name, backend, s, outside, ptr)

    def capture():
        with backend.capture(s) as graph:
            with pytest.raises(EmulatedCaptureError, match=message):
                call()
            with pytest.raises(EmulatedCaptureError, match="after its capture was invalidated"):
                s.enqueue("op", lambda: None)
        return graph

    with pytest.raises(EmulatedCaptureError, match=r"invalidated: .*StreamCaptureInvalidated"):
        capture()
    assert not backend.is_capturing(s)
    assert not backend.machine.captures
    call()  # fine once the capture has ended: the device is usable
    s.synchronize()
    for p in list(backend.host_buffers):
        backend.host_free(p)
    s.close()
    assert backend.violations == []


def test_a_capture_leaves_other_streams_alone(backend):
    s, other = backend.stream(), backend.stream()
    with backend.use_stream(other):
        backend.asarray(np.zeros(8))  # freed at once: a block the pool reuses in the capture
    with backend.capture(s) as graph:
        with backend.use_stream(other):
            x = backend.asarray(np.arange(8.0))  # not captured: runs now
        other.synchronize()  # a stream outside the capture may be synchronised
        np.testing.assert_array_equal(x.data, np.arange(8.0))
        backend.copy_on_device(x, x, s)  # ordered: the host saw other complete
    assert graph.operations == ["pack"]
    graph.replay()
    s.synchronize()
    assert backend.violations == []
    s.close()
    other.close()


def test_a_stream_waiting_on_an_event_of_a_capture_joins_it(backend):
    s, side = backend.stream(), backend.stream()
    x = backend.asarray(np.arange(16.0))
    with backend.use_stream(s):
        out = backend.asarray(np.zeros(16))
    backend.synchronize()
    with backend.capture(s) as graph:
        fork = backend.event()
        fork.record(s)
        side.wait(fork)
        assert backend.is_capturing(side)
        backend.copy_on_device(out, x, side)  # recorded, on the side stream
        join = backend.event()
        join.record(side)
        s.wait(join)
    assert not backend.is_capturing(side)
    assert graph.operations == ["pack"]
    assert not backend.to_numpy(out).any()
    graph.replay()
    np.testing.assert_array_equal(backend.to_numpy(out), np.arange(16.0))
    assert backend.violations == []
    s.close()
    side.close()


def test_a_stream_that_joined_a_capture_must_be_joined_back(backend):
    s, side = backend.stream(), backend.stream()
    with backend.use_stream(side):
        out = backend.asarray(np.zeros(16))
    side.synchronize()

    def capture():
        with backend.capture(s):
            fork = backend.event()
            fork.record(s)
            side.wait(fork)
            backend.copy_on_device(out, out, side)  # and s never waits for it

    with pytest.raises(EmulatedCaptureError, match=r"streams \[\d+\] joined .* not joined back"):
        capture()
    assert not backend.is_capturing(side)


def test_a_capture_begins_only_on_a_stream_of_its_own_that_is_not_capturing(backend):
    s = backend.stream()
    with pytest.raises(EmulatedCaptureError, match="legacy default stream"):
        backend.capture(backend.default_stream).__enter__()
    with backend.capture(s), pytest.raises(EmulatedCaptureError, match="already capturing"):
        backend.capture(s).__enter__()
    assert not backend.is_capturing(s)
    s.close()


# ----------------------------------------------------------------- library lifetime bugs


@pytest.mark.parametrize("where", ["same device", "peer device"])
def test_a_source_dropped_after_copy_to_device_is_not_overwritten_early(where):
    machine = EmulatedDevice(devices=2)
    try:
        dx = machine if where == "same device" else machine.peer(1)
        a = sample((64, 32), np.float32)
        s, c = dx.stream(), machine.stream()
        with dx.activate(), dx.use_stream(s, lib="torch"):
            x = dx.asarray(a, lib="torch")  # allocated and written on s
        with machine.use_stream(c, lib="cupy"):
            out = machine.empty(a.shape, a.dtype)  # on c
        gate = hold(c)  # the copy below stays queued
        try:
            with machine.use_stream(c, lib="cupy"), dx.use_stream(s, lib="torch"):
                interop.copy_to_device(x, out)
            del x  # the caller may drop a source once a copying call returned
            with dx.activate(), dx.use_stream(s, lib="torch"):
                fresh = dx.asarray(np.zeros_like(a), lib="torch")  # same size on s, written now
        finally:
            gate.set()
        np.testing.assert_array_equal(machine.to_numpy(out), a)
        np.testing.assert_array_equal(dx.to_numpy(fresh), np.zeros_like(a))
        assert machine.violations == []
    finally:
        machine.close()


def test_an_out_of_another_stream_is_the_callers_to_record(backend):
    """The destination is written on its library's current stream: memory the
    caller allocated on another stream and then wrote under this one is the
    caller's to order, as with PyTorch's ``Tensor.copy_`` (``record_stream``).
    With that done, dropping ``out`` at once is safe; without it the emulated
    pool flags the reuse."""
    a = sample((64, 32), np.float32)
    for recorded in (True, False):
        owner, c = backend.stream(), backend.stream()
        x = backend.asarray(a, lib="torch")  # on the default stream
        with backend.use_stream(owner, lib="cupy"):
            out = backend.empty(a.shape, a.dtype)  # belongs to owner
        allocated = backend.event()
        allocated.record(owner)
        c.wait(allocated)
        gate = hold(c)
        try:
            with backend.use_stream(c, lib="cupy"):
                interop.copy_to_device(x, out)  # written on c
            if recorded:
                backend.record_stream(out, c)
            del out
            with backend.use_stream(owner, lib="cupy"):
                if recorded:
                    fresh = backend.asarray(np.zeros_like(a))  # a new block: out's is held
                else:
                    with pytest.raises(RuleViolation, match="reused on stream"):
                        backend.asarray(np.zeros_like(a))
        finally:
            gate.set()
        if recorded:
            np.testing.assert_array_equal(backend.to_numpy(fresh), np.zeros_like(a))
            assert backend.violations == []
        backend.synchronize()
        backend.violations.clear()


def test_copy_to_device_of_data_on_another_device_allocates_on_the_current_device(machine):
    d0, d1 = machine
    a = sample((16, 8), np.int16)
    with d1.activate():
        x = d1.asarray(a)
    fresh = interop.copy_to_device(x)  # device 0 is current
    assert fresh.backend is d0
    np.testing.assert_array_equal(d0.to_numpy(fresh), a)
    assert d0.violations == []


def test_a_device_copy_between_two_streams_can_be_captured(backend):
    a = sample((64, 32), np.float32)
    s, c = backend.stream(), backend.stream()
    with backend.use_stream(s, lib="torch"), backend.use_stream(c, lib="cupy"):
        x = backend.asarray(a, lib="torch")
        out = backend.asarray(np.zeros_like(a))
        backend.synchronize()
        with backend.capture(s) as graph:
            interop.copy_to_device(x, out)
        graph.replay()
        np.testing.assert_array_equal(backend.to_numpy(out), a)


@pytest.mark.parametrize("direction", ["d2h", "h2d"])
def test_a_transfer_that_needs_the_host_is_refused_in_a_capture_that_stays_valid(
    backend, direction
):
    a = np.arange(1024.0)
    s = backend.stream()
    with backend.use_stream(s):
        x = backend.asarray(a)
        s.synchronize()
        if direction == "d2h":
            call = lambda: interop.copy_to_host(x)  # noqa: E731
        else:
            call = lambda: interop.copy_to_device(a, x)  # noqa: E731

        def capture():
            with backend.capture(s) as graph, pytest.raises(interop.InteropError):
                call()
            return graph

        graph = capture()  # the capture ends valid
    assert graph.operations == []  # refused before queuing anything
    assert backend.violations == []


def test_registered_host_memory_takes_its_cost_locks_whole_pages_once_and_is_dma_reachable():
    """host_register as cudaHostRegister: (seconds, GB/s) of time; whole pages, none twice
    (712); a DMA reaches one registered range, never across two, and counts as a
    registered_copy; one that runs after its range was unregistered is a violation."""
    dev = EmulatedDevice(register=(0.02, 1.0))
    page = mmap.PAGESIZE
    raw = np.zeros(10 * page, np.uint8)
    base = -(-raw.ctypes.data // page) * page
    start = time.perf_counter()
    dev.host_register(base, 4 * page)
    assert time.perf_counter() - start >= 0.02 + 4 * page / 1e9
    with pytest.raises(EmulatedDeviceError, match="712"):
        dev.host_register(base + 3 * page + 10, page)  # shares page 3
    dev.host_register(base + 4 * page, 4 * page)  # the next page on: allowed
    x = dev.asarray(np.arange(2 * page, dtype=np.uint8) % 251)
    dev.synchronize()
    s = dev.stream()
    dev.copy_to_host(base + page, x, 2 * page, s)
    s.synchronize()
    offset = base - raw.ctypes.data
    assert raw[offset + page : offset + 3 * page].tobytes() == dev.to_numpy(x).tobytes()
    assert dev.counts["registered_copy"] == 1
    with pytest.raises(RuleViolation, match="not inside one live page-locked"):
        dev.copy_to_host(base + 3 * page, x, 2 * page, s)  # across the two ranges
    dev.host_unregister(base + 4 * page)
    gate = hold(s)
    dev.copy_to_host(base, x, 2 * page, s)  # queued, then unregistered before it runs
    dev.host_unregister(base)
    assert dev.machine.registered == {}
    gate.set()
    with pytest.raises(EmulatedDeviceError):  # sticky, as an asynchronous error
        s.synchronize()
    assert any("copy ran on registered host memory" in v for v in dev.violations)
    with pytest.raises(ValueError, match=r"expected register=\(s, GB/s > 0\)"):
        EmulatedDevice(register=(0.0, 0.0))
    dev.close()
