"""The hybrid form of copy_to_host (interop.pipeline.hybrid): part of a pageable ``out``
page-locked in place while the ring copies the rest. One body per behaviour on each test
device; the emulated one also counts the DMAs that went straight into ``out``
(``"registered_copy"``) and tracks every registration, so "nothing stays registered"
is checked there (the ``[cuda]`` halves check the values)."""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np
import pytest

import interop
from interop.pipeline import hybrid
from interop.pipeline.plan import plan_chunks
from interop.testing import EmulatedDevice
from tests.helpers import sample
from tests.helpers.devices import opened

CHUNK = 64 << 10
HYBRID = {"register_min_bytes": 1, "chunk_bytes": CHUNK}  # every pageable out tries it


def raw(a):
    return np.ascontiguousarray(a).tobytes()


def direct(device):
    """DMAs into registered memory so far (emulated), None on CUDA (not counted there)."""
    return device.emulated.counts["registered_copy"] if device.emulated else None


def registered(device):
    """The emulated device's registrations now (addresses), None on CUDA."""
    return sorted(device.emulated.machine.registered) if device.emulated else None


@contextlib.contextmanager
def user_registered(device, ptr, nbytes):
    """``[ptr, ptr + nbytes)`` page-locked by the user for the block (cudaHostRegister)."""
    if device.emulated:
        register, unregister = device.emulated.host_register, device.emulated.host_unregister
    else:
        import cupy

        runtime = cupy.cuda.runtime
        register = lambda p, n: runtime.hostRegister(p, n, 0)  # noqa: E731
        unregister = runtime.hostUnregister
    register(ptr, nbytes)
    try:
        yield
    finally:
        unregister(ptr)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "fresh"])
def test_a_pageable_out_goes_partly_direct_and_partly_through_the_ring(device_kind, layout):
    """transposed: packed on the device, into rows of the staging for both kinds of chunk;
    fresh: copy_to_host(x) makes out, its ring chunks' pages touched by the host threads."""
    a = sample((1024, 512), np.float64)  # 4 MiB: 64 chunks
    with opened(device_kind, delay=0.0005) as device, interop.config.set(**HYBRID):
        src, expect = device.asarray(a), a
        if layout == "transposed":
            src, expect = src.T, a.T
        out = np.zeros(expect.shape, expect.dtype)
        before, staged = direct(device), device.staged()
        got = interop.copy_to_host(src) if layout == "fresh" else interop.copy_to_host(src, out)
        assert raw(got) == raw(expect)
        if device.emulated:
            assert 4 <= direct(device) - before < 64  # the back's spans went direct...
            assert device.staged() > staged  # ...and the front through the ring
            assert registered(device) == []  # every span unregistered


@pytest.mark.parametrize("how", ["cancel", "drain", "progress"])
def test_after_a_cancel_or_an_error_nothing_stays_registered(device_kind, how):
    """drain (emulated only): a host thread's copy out of a slot fails; progress: the
    callback raises; cancel: from the callback. On the emulated device each stops once
    a span was registered. The complete prefix is right."""
    if how == "drain" and device_kind != "emulated":
        pytest.skip("faults are injected into the emulated device")
    a = sample((1024, 512), np.float64)
    holder, given = {}, threading.Event()
    faults = {"drain": 8} if how == "drain" else None
    with opened(device_kind, delay=0.002, faults=faults) as device:

        def progress(done, total):
            given.wait(30)
            if device.emulated:  # a span registered (the rates' measurement made 3)
                for _ in range(10_000):
                    if device.emulated.counts["host_register"] > 3:
                        break
                    time.sleep(0.001)
            if how == "progress":
                raise KeyError("stop")
            holder["t"].cancel()

        out = np.zeros_like(a)
        with interop.config.set(**HYBRID):
            call = progress if how != "drain" else None
            holder["t"] = t = interop.copy_to_host_async(device.asarray(a), out, progress=call)
            given.set()
            expect = KeyError if how == "progress" else interop.TransferError
            with pytest.raises(expect, match=r"stop|cancelled|drain failed"):
                t.result(timeout=60)
        done = t.bytes_done
        assert done < a.nbytes
        assert raw(out)[:done] == raw(a)[:done]
        assert registered(device) in ([], None)
        if device.emulated:
            assert device.emulated.counts["host_register"] > 3  # spans were registered
        # and the same out again, whole
        with interop.config.set(**HYBRID):
            interop.copy_to_host(device.asarray(a), out)
        assert raw(out) == raw(a)


@pytest.mark.parametrize("nth", [1, 4])
def test_an_injected_registration_failure_falls_back_to_the_ring(nth):
    """Emulated: 1, the rates' measurement fails: the ring alone; 4, the first span is
    refused: its chunks go through the ring, the later spans direct."""
    dev = EmulatedDevice(faults={"host_register": nth})
    a = sample((1024, 512), np.float64)
    out = np.zeros_like(a)
    with interop.config.set(**HYBRID):
        interop.copy_to_host(dev.asarray(a), out)
    assert raw(out) == raw(a)
    assert hybrid.rates(dev) is not None  # 1: measured again (a failure is not kept)
    assert (dev.counts["registered_copy"] > 0) == (nth == 4)
    assert dev.machine.registered == {}
    assert dev.violations == []
    dev.close()


def test_a_span_the_driver_refuses_goes_through_the_ring(device):
    """Pages of out the user page-locked (cudaHostRegister: 712 for a span over them):
    those chunks go through the ring; the user's registration stays, and only it."""
    a = sample((1024, 512), np.float64)
    out = np.zeros_like(a)
    ptr = -(-(out.ctypes.data + a.nbytes * 7 // 8) // 4096) * 4096  # in the last spans
    with user_registered(device, ptr, 4096), interop.config.set(**HYBRID):
        mine, before = registered(device), direct(device)
        interop.copy_to_host(device.asarray(a), out)
        assert raw(out) == raw(a)
        assert registered(device) == mine
        if device.emulated:  # the spans below it went direct
            assert direct(device) > before


def test_a_page_locked_out_keeps_dma_alone(device):
    """empty_pinned's memory: DMAs only, no ring, nothing registered."""
    a = sample((1024, 512), np.float64)
    with device.pinned(a.shape, a.dtype) as out, interop.config.set(**HYBRID):
        staged, before = device.staged(), direct(device)
        interop.copy_to_host(device.asarray(a), out)
        assert raw(out) == raw(a)
        assert device.staged() == staged
        assert direct(device) == before
        assert registered(device) in ([], None)


def test_a_memmap_out_is_served_by_the_ring(device, tmp_path):
    a = sample((1024, 512), np.float64)
    out = np.lib.format.open_memmap(tmp_path / "out.npy", "w+", a.dtype, a.shape)
    with interop.config.set(**HYBRID):
        before = direct(device)
        interop.copy_to_host(device.asarray(a), out)
    assert raw(out) == raw(a)
    assert direct(device) == before
    del out


def test_register_min_bytes_0_and_small_outs_keep_the_ring(device):
    a = sample((1024, 512), np.float64)
    for settings in ({"register_min_bytes": 0}, {"register_min_bytes": a.nbytes + 1}):
        out = np.zeros_like(a)
        before = direct(device)
        with interop.config.set(chunk_bytes=CHUNK, **settings):
            interop.copy_to_host(device.asarray(a), out)
        assert raw(out) == raw(a)
        assert direct(device) == before


# ----------------------------------------------------------------- the split, emulated


def test_the_emulated_registration_cost_is_measured_per_call_and_per_byte():
    dev = EmulatedDevice(register=(0.001, 0.25))  # 1 ms a call, then 0.25 GB/s
    rates = hybrid.rates(dev)
    assert rates is not None
    assert rates is hybrid.rates(dev)  # measured once
    assert 0.001 <= rates.call < 0.02
    assert 2e-9 < rates.per_byte < 12e-9  # 4e-9, give or take a loaded machine's sleeps
    assert rates.copy > 0
    assert dev.machine.registered == {}
    dev.close()


@pytest.mark.parametrize(
    ("rates", "expect"),
    [
        # cheap calls: spans of 8 chunks (a call is 1/8 of them), 0.94 ms to register
        (hybrid.Rates(call=1e-4, per_byte=1e-10, copy=1e9), (8, 1e-4 + 8 * 0.1048576e-3)),
        # a slow call: spans of an eighth of the array (16 chunks), 51.7 ms to register
        (hybrid.Rates(call=5e-2, per_byte=1e-10, copy=1e8), (16, 5e-2 + 16 * 0.1048576e-3)),
        # registering far slower than one thread copies: the ring alone (measured); a
        # span of 4 chunks takes 43 ms, in which one thread copies 410 of them
        (hybrid.Rates(call=1e-3, per_byte=1e-8, copy=1e10), None),
    ],
)
def test_the_threshold_and_split_follow_the_rates(rates, expect):
    dev = EmulatedDevice()
    hybrid._measured[dev] = rates
    out = np.empty(128 << 20, np.uint8)  # untouched: no pages
    plan = plan_chunks(out.shape, 1, 1 << 20, 4)  # 128 chunks of 1 MiB
    form = hybrid.hybrid_form(dev, out, plan)
    if expect is None:
        assert form is None
    else:
        assert form.args[3] == expect[0]  # chunks a span
        assert form.args[4] == pytest.approx(expect[1])  # seconds to register one
    with interop.config.set(register_min_bytes=0):
        assert hybrid.hybrid_form(dev, out, plan) is None
    with interop.config.set(register_min_bytes=1):  # set: no rate check, only the size
        assert hybrid.hybrid_form(dev, out, plan) is not None
        assert hybrid.hybrid_form(dev, out[::2], plan) is None  # not contiguous
    dev.close()


def test_the_ring_copies_while_a_span_is_registered():
    """Emulated: a registration takes 50 ms; the ring's DMAs go on meanwhile (overlap).
    Its rates are given, not measured: spans of 8 chunks, 50 ms each; the ring's 56
    chunks take longer (2 ms a DMA)."""
    dev = EmulatedDevice(delay=0.002, register=(0.05, 10.0))
    hybrid._measured[dev] = hybrid.Rates(call=0.05, per_byte=0.0, copy=1e6)
    register, during = dev.host_register, []

    def timed(ptr, nbytes):
        before = dev.counts["copy"]
        register(ptr, nbytes)
        during.append(dev.counts["copy"] - before)

    dev.host_register = timed
    a = sample((1024, 512), np.float64)
    out = np.zeros_like(a)
    with interop.config.set(**HYBRID):
        interop.copy_to_host(dev.asarray(a), out)
    assert raw(out) == raw(a)
    assert during  # spans were registered...
    assert max(during) > 0  # ...while ring DMAs ran
    assert dev.counts["registered_copy"] > 0
    assert dev.machine.registered == {}
    dev.close()


def test_a_new_outs_pages_are_touched_by_the_threads_that_fill_them(device, monkeypatch):
    """copy_to_host(x): each ring piece's pages are faulted in by the host thread that
    later fills it, before it waits for the chunk's DMA; a given out is not touched."""
    from interop.pipeline.hostcopy import CopyOut

    seen: dict[str, dict] = {"touch": {}, "run": {}}

    def spy(name):
        original = getattr(CopyOut, name)

        def call(self, plan, i, piece, *rest):
            seen[name][i, str(piece)] = threading.get_ident()
            return original(self, plan, i, piece, *rest)

        return call

    for name in seen:
        monkeypatch.setattr(CopyOut, name, spy(name))
    a = sample((512, 256), np.float64)  # 16 chunks
    assert raw(interop.copy_to_host(device.asarray(a), chunk_bytes=CHUNK)) == raw(a)
    assert len(seen["run"]) >= 16
    assert seen["touch"] == seen["run"]  # every piece, on its own thread
    seen["touch"].clear()
    out = np.zeros_like(a)
    interop.copy_to_host(device.asarray(a), out, chunk_bytes=CHUNK)
    assert raw(out) == raw(a)
    assert seen["touch"] == {}


# ------------------------------------------------------------------ the review's fixes


class _CountingCondition:
    """threading.Condition for hybrid.py alone, counting the waits in take()."""

    waits = 0

    def __init__(self):
        self.cv = threading.Condition()

    def __enter__(self):
        return self.cv.__enter__()

    def __exit__(self, *exc):
        return self.cv.__exit__(*exc)

    def notify_all(self):
        self.cv.notify_all()

    def wait(self, timeout=None):
        type(self).waits += 1
        return self.cv.wait(timeout)


def test_the_ring_never_waits_on_a_registration_slower_than_measured(monkeypatch):
    """Emulated: registering takes 300 ms, 100 times the measured rate (untouched pages
    cost more than the probe's): the ring takes the pending span's chunks itself rather
    than wait for the registrar, which unregisters that span at once."""
    import types

    monkeypatch.setattr(_CountingCondition, "waits", 0)
    counting = types.SimpleNamespace(Condition=_CountingCondition, Lock=threading.Lock)
    monkeypatch.setattr(hybrid, "threading", counting)
    dev = EmulatedDevice(delay=0.0005, register=(0.3, 10.0))
    hybrid._measured[dev] = hybrid.Rates(call=0.003, per_byte=0.0, copy=1e6)
    a = sample((1024, 512), np.float64)  # 64 chunks
    out = np.empty_like(a)
    with interop.config.set(**HYBRID):
        interop.copy_to_host(dev.asarray(a), out)
    assert raw(out) == raw(a)
    assert dev.counts["host_register"] >= 1  # a span was registered...
    assert _CountingCondition.waits == 0  # ...and the ring never waited for it
    assert dev.machine.registered == {}
    assert dev.violations == []
    dev.close()


def test_the_measurement_runs_on_the_datas_device_and_a_failure_is_measured_again():
    """Two emulated devices, the data on device 1 while device 0 is current: every
    registration, the measurement's too, is made with device 1 current (CUDA would make
    a context on device 0). An injected registration failure is not kept."""
    with opened("emulated", devices=2) as d0:
        one = d0.peer(1)
        register, current = one.emulated.host_register, []

        def spy(ptr, nbytes):
            current.append(one.emulated.machine.current_device())
            register(ptr, nbytes)

        one.emulated.host_register = spy
        with one.activate():
            a = sample((1024, 512), np.float64)
            x = one.asarray(a)
        out = np.empty((1024, 512))
        with interop.config.set(**HYBRID):
            interop.copy_to_host(x, out)
        assert raw(out) == raw(a)
        assert len(current) > 3  # the measurement's 3, and spans
        assert set(current) == {1}
    dev = EmulatedDevice(faults={"host_register": 1})
    assert hybrid.rates(dev) is None  # failed: the ring alone this time...
    assert hybrid.rates(dev) is not None  # ...measured again on the next use
    dev.close()


def test_a_failed_unregister_of_the_probe_is_raised():
    dev = EmulatedDevice(faults={"host_unregister": 1})
    with pytest.raises(interop.testing.EmulatedDeviceError, match="cudaHostUnregister"):
        hybrid.rates(dev)
    dev.close()


def test_an_interrupt_as_the_hybrid_form_is_made_leaves_nothing_registered(monkeypatch):
    """A KeyboardInterrupt right after the Hybrid is made, before the run holds it: no
    registrar was started, so nothing is registered behind the run's back."""
    made, init = [], hybrid.Hybrid.__init__

    def interrupted(self, *args):
        init(self, *args)
        made.append(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(hybrid.Hybrid, "__init__", interrupted)
    dev = EmulatedDevice(register=(0.01, 10.0))
    a = sample((1024, 512), np.float64)
    with interop.config.set(**HYBRID), pytest.raises(KeyboardInterrupt):
        interop.copy_to_host(dev.asarray(a), np.empty_like(a))
    if made[0].registrar is not None:
        made[0].registrar.result(timeout=60)
    assert dev.machine.registered == {}
    dev.close()


def test_a_transposed_hybrid_copy_stages_n_rows_on_the_device():
    """Pack and DMA share the copy stream: ring and direct chunks share n staging rows."""
    dev = EmulatedDevice(delay=0.0005)
    staging, rows = dev.staging, []

    def spy(count, row_bytes):
        rows.append(count * row_bytes)
        return staging(count, row_bytes)

    dev.staging = spy
    a = sample((1024, 512), np.float64)
    out = np.empty(a.T.shape)  # C order (empty_like(a.T) would keep a.T's)
    with interop.config.set(**HYBRID):
        interop.copy_to_host(dev.asarray(a).T, out)
    plan = plan_chunks(out.shape, out.itemsize, CHUNK, interop.config.num_buffers)
    assert raw(out) == raw(a.T)
    assert dev.counts["registered_copy"] > 0
    assert rows == [plan.nslots * plan.slot_bytes]
    assert dev.violations == []
    dev.close()


def test_a_hybrid_copy_keeps_the_shared_host_pool():
    """The registrar's thread was in the pool from the start: a hybrid copy replaces no
    pool under a transfer running on it."""
    from interop import _process
    from interop.pipeline.workers import host_pool

    dev = EmulatedDevice(delay=0.0005)
    a = sample((1024, 512), np.float64)
    threads = _process.host_pool._size + 1  # more than any copy asked so far: a new pool
    with interop.config.set(host_threads=threads):
        interop.copy_to_host(dev.asarray(a), np.empty_like(a), chunk_bytes=CHUNK)
        pool = host_pool(threads)
        with interop.config.set(**HYBRID):
            interop.copy_to_host(dev.asarray(a), np.empty_like(a))
    assert host_pool(threads) is pool
    assert not pool._shutdown
    dev.close()
