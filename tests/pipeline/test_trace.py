"""Tracing a slot transfer: device-step times from timing events on the copy
stream, host-piece times from the threads, on each test device (the emulated
one, each of its queued operations delayed; CUDA under the ``gpu`` marker)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import interop
from interop.errors import TransferError
from interop.pipeline import trace
from interop.pipeline.plan import c_order_chunks
from interop.pipeline.ring import free_cached_rings
from interop.testing import EmulatedDevice, RuleViolation
from tests.helpers import in_threads, sample
from tests.helpers.devices import opened

CHUNK = 64 << 10
DELAY = 0.002  # seconds the host stream sleeps before each queued operation


@pytest.fixture
def device(device_kind):
    """The test device, the emulated one delaying each queued operation."""
    with opened(device_kind, delay=DELAY) as d:
        yield d


def _check_consistent(t: trace.SlotTrace, nbytes: int, chunks: int, device) -> None:
    assert sum(t.chunk_bytes) == nbytes
    assert len(t.chunk_bytes) == len(t.device_seconds) == chunks
    assert all(0 < s < t.end - t.start for s in t.device_seconds)
    if device.emulated:  # each device step waits at least one queued operation's delay
        assert all(s >= DELAY * 0.9 for s in t.device_seconds)
    assert {i for i, *_ in t.pieces} == set(range(chunks))
    for _, submitted, waited, ended in t.pieces:
        assert t.start <= submitted <= waited <= ended <= t.end
    assert sum(t.device_seconds) <= t.end - t.start  # one stream: steps do not overlap


def test_device_to_host_is_traced_chunk_by_chunk(device):
    a = sample((256, 512), np.float32)  # 512 KiB: 8 chunks
    d = device.asarray(a)
    with trace.recording() as traces, interop.config.set(num_buffers=3, host_threads=2):
        out = interop.copy_to_host(d, chunk_bytes=CHUNK)
    np.testing.assert_array_equal(out, a)
    assert len(traces) == 1
    t = traces[0]
    assert (t.direction, t.threads) == ("d2h", 2)
    _check_consistent(t, a.nbytes, 8, device)
    s = t.summary()
    assert s["bytes"] == a.nbytes
    assert s["chunks"] == 8
    assert s["threads"] == 2
    assert s["rate_gbps"] == pytest.approx(a.nbytes / s["wall_seconds"] / 1e9)
    assert s["device_gbps"] == pytest.approx(a.nbytes / sum(t.device_seconds) / 1e9)
    assert 0 < s["device_busy"] <= 1
    assert 0 < s["host_busy"] <= 1


def test_host_to_device_is_traced_and_strided_outs_time_their_unpack(device):
    a = sample((128, 512), np.float64)  # 512 KiB: 8 chunks
    out = device.empty((512, 128), np.float64)
    with trace.recording() as traces, interop.config.set(num_buffers=2):
        interop.copy_to_device(a, out.T, chunk_bytes=CHUNK)
    np.testing.assert_array_equal(device.to_numpy(out).T, a)
    (t,) = traces
    assert t.direction == "h2d"
    _check_consistent(t, a.nbytes, 8, device)
    if device.emulated:  # DMA and unpack: two queued operations between the timers of each step
        assert all(s >= 2 * DELAY * 0.9 for s in t.device_seconds)


def test_transfers_are_timed_by_events_on_the_copy_stream(device):
    """Timing events around each device step; strided sources time their pack."""
    a = np.arange(3 << 20, dtype=np.float32).reshape(3 << 10, 1 << 10)  # 12 MiB
    x = device.asarray(a)
    with trace.recording() as traces:
        out = interop.copy_to_host(x, chunk_bytes=1 << 20)
        interop.copy_to_host(x.T, chunk_bytes=1 << 20)
        back = interop.copy_to_device(out, device.empty(a.shape, a.dtype), chunk_bytes=1 << 20)
    np.testing.assert_array_equal(out, a)
    np.testing.assert_array_equal(device.to_numpy(back), a)
    assert [t.direction for t in traces] == ["d2h", "d2h", "h2d"]
    for t, shape in zip(traces, [a.shape, a.T.shape, a.shape], strict=True):
        # whole rows per chunk: 256 rows of 4 KiB, or 85 of a.T's 12 KiB rows (13 chunks)
        chunks = len(list(c_order_chunks(shape, 4, 1 << 20)))
        assert chunks == (12 if shape == a.shape else 13)
        assert sum(t.chunk_bytes) == a.nbytes
        assert len(t.device_seconds) == len(t.chunk_bytes) == chunks
        assert all(0 < s < t.end - t.start for s in t.device_seconds)
        for _, submitted, waited, ended in t.pieces:
            assert t.start <= submitted <= waited <= ended <= t.end
        assert sum(t.device_seconds) <= t.end - t.start


def test_untraced_runs_are_not_collected_and_nested_recordings_each_see_a_run(device):
    a = sample((64, 1024), np.uint8)
    d = device.asarray(a)
    interop.copy_to_host(d, chunk_bytes=CHUNK)  # before any recording
    assert not trace.active()
    with trace.recording() as outer:
        assert trace.active()
        with trace.recording() as inner:
            interop.copy_to_host(d, chunk_bytes=CHUNK)
        interop.copy_to_host(d, chunk_bytes=CHUNK)
    assert not trace.active()
    assert len(inner) == 1
    assert len(outer) == 2
    assert inner[0] is outer[0]


def test_transfers_from_other_threads_are_recorded(device):
    a = sample((64, 1024), np.int16)
    d = device.asarray(a)
    with trace.recording() as traces:
        outs = in_threads(lambda _: interop.copy_to_host(d, chunk_bytes=CHUNK), 3)
    assert all(np.array_equal(out, a) for out in outs)
    assert len(traces) == 3
    assert all(sum(t.chunk_bytes) == a.nbytes for t in traces)


def test_a_failed_transfer_publishes_no_trace():
    device = EmulatedDevice(delay=0.0, faults={"copy": 2})
    try:
        d = device.asarray(sample((64, 1024), np.float32))
        with (
            trace.recording() as traces,
            pytest.raises(TransferError, match="injected fault"),
        ):
            interop.copy_to_host(d, chunk_bytes=CHUNK)
        assert traces == []
    finally:
        free_cached_rings()
        device.close()


def test_timers_that_cannot_be_read_leave_the_transfer_whole_and_say_why():
    device = EmulatedDevice(delay=0.0, faults={"timer_read": 3})
    try:
        a = sample((64, 1024), np.float32)  # 256 KiB: 4 chunks
        with trace.recording() as traces:
            out = interop.copy_to_host(device.asarray(a), chunk_bytes=CHUNK)
        np.testing.assert_array_equal(out, a)
        (t,) = traces
        assert t.summary() == {
            "error": "reading the timing events failed: EmulatedDeviceError: "
            "injected fault: reading a timing event failed"
        }
    finally:
        free_cached_rings()
        device.close()


def test_a_timer_read_before_its_stream_reached_it_breaks_a_rule():
    """Emulated only: the emulated device's rule (on CUDA the read would fail
    with cudaErrorNotReady)."""
    device = EmulatedDevice(delay=DELAY)
    stream = device.stream()
    gate = threading.Event()
    stream.enqueue("wait", gate.wait)
    start, end = device.timer(), device.timer()
    start.record(stream)
    end.record(stream)
    with pytest.raises(RuleViolation, match="timer read before its stream reached it"):
        end.seconds_since(start)
    gate.set()
    stream.synchronize()
    assert end.seconds_since(start) >= 0
    stream.close()
    device.violations.clear()
    device.close()


@pytest.mark.parametrize(
    ("device_s", "copying_s", "threads", "limit"),
    [
        (0.95, 0.5, 2, "device copies"),  # stream busy 95 % of the second
        (0.4, 3.6, 4, "host threads"),  # 4 threads busy 90 %
        (0.3, 0.5, 2, "schedule (neither side busy: more slots or larger chunks)"),
    ],
)
def test_summary_names_the_busy_side(device_s, copying_s, threads, limit):
    t = trace.SlotTrace("d2h", threads, chunk_bytes=[10**9], device_seconds=[device_s])
    t.pieces = [(0, 0.0, 0.25, 0.25 + copying_s)]
    t.issuer_wait_seconds, t.start, t.end = 0.5, 0.0, 1.0
    s = t.summary()
    assert s["limited_by"] == limit
    assert s["device_busy"] == pytest.approx(device_s)
    assert s["host_busy"] == pytest.approx(copying_s / threads)
    assert s["device_gbps"] == pytest.approx(1 / device_s)
    assert s["host_gbps_per_thread"] == pytest.approx(1 / copying_s)
    assert s["host_event_wait_seconds"] == pytest.approx(0.25)
    assert s["rate_gbps"] == pytest.approx(1.0)
    assert "call_seconds" not in s
    assert "outside_seconds" not in s


@pytest.mark.parametrize(
    ("call_s", "limit"),
    [
        (1.8, "host threads"),  # 0.8 s outside a 1 s transfer: the busy side still limits
        (2.5, "the call's work outside the slot pipeline"),  # 1.5 s outside: that limits
    ],
)
def test_summary_with_the_call_time_names_work_outside_the_transfer(call_s, limit):
    t = trace.SlotTrace("d2h", 4, chunk_bytes=[10**9], device_seconds=[0.4])
    t.pieces = [(0, 0.0, 0.25, 3.85)]  # 4 threads busy 90 % of the second
    t.start, t.end = 0.0, 1.0
    s = t.summary(call_seconds=call_s)
    assert s["limited_by"] == limit
    assert s["call_seconds"] == call_s
    assert s["outside_seconds"] == pytest.approx(call_s - 1.0)
    assert s["rate_gbps"] == pytest.approx(1.0)  # the transfer's own rate, as without
