"""The host backend enforces CUDA's rules: each rule is broken here on purpose
and must be caught, so that the pipeline tests that pass through it mean
something."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from interop.pipeline.host import HostBackend, HostDeviceError, RuleViolation
from interop.pipeline.ring import StagingRing


@pytest.fixture
def backend():
    b = HostBackend()
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
    faulty = HostBackend(faults={"pack": 1})
    a = faulty.asarray(np.ones(4))
    b = faulty.empty((4,), np.float64)
    faulty.copy_on_device(b, a, faulty.current_stream())
    with pytest.raises(HostDeviceError, match="injected fault"):
        faulty.synchronize()
    with pytest.raises(HostDeviceError, match="failed earlier"):
        faulty.stream()
    faulty.close()


def test_work_queued_on_a_closed_stream_is_refused(backend):
    s = backend.stream()
    s.close()
    with pytest.raises(RuleViolation, match="after it was closed"):
        s.enqueue("op", lambda: None)
