"""interop.use_torch_allocator: one pool for CuPy and PyTorch."""

from __future__ import annotations

import gc
import threading
import types

import pytest

import interop
from interop import allocator, streams
from interop.testing import EmulatedCaptureError, EmulatedDevice
from tests.helpers import in_threads, run_python


def test_is_a_runtime_error_and_an_interop_error():
    assert issubclass(interop.StreamMismatchError, RuntimeError)
    assert issubclass(interop.StreamMismatchError, interop.InteropError)


def test_without_a_device(torch):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    with pytest.raises(interop.NoDeviceError, match=r"torch.cuda.is_available\(\) is False"):
        interop.use_torch_allocator()


def test_without_torch():
    proc = run_python(
        """
        import sys
        sys.modules["torch"] = None
        import interop
        try:
            interop.use_torch_allocator()
        except interop.BackendUnavailableError as exc:
            print(exc)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "needs torch" in proc.stdout
    assert "torch-cupy-interop[torch]" in proc.stdout


# ----------------------------------------------------------------- GPU

GiB = 1 << 30


@pytest.mark.gpu
def test_cupy_memory_is_counted_by_torch(cp, torch):
    before = torch.cuda.memory_allocated()
    with interop.use_torch_allocator():
        a = cp.empty(256 << 20, dtype=cp.uint8)
        assert torch.cuda.memory_allocated() - before >= 256 << 20
        del a
    assert torch.cuda.memory_allocated() == before


@pytest.mark.gpu
def test_two_pools_become_one(cp, torch):
    torch.cuda.empty_cache()
    cp.get_default_memory_pool().free_all_blocks()
    with interop.use_torch_allocator():
        a = cp.ones(GiB, dtype=cp.uint8)
        assert int(a[-1]) == 1
        del a
    reserved = torch.cuda.memory_reserved()
    t = torch.empty(GiB, dtype=torch.uint8, device="cuda")
    assert torch.cuda.memory_reserved() == reserved  # reused the block CuPy freed
    del t


@pytest.mark.gpu
def test_out_of_memory_is_cupys_error(cp, torch):
    with interop.use_torch_allocator(), pytest.raises(cp.cuda.memory.OutOfMemoryError) as info:
        cp.empty(1 << 50, dtype=cp.uint8)  # a PiB
    assert isinstance(info.value.__cause__, torch.cuda.OutOfMemoryError)


@pytest.mark.gpu
def test_previous_allocator_restored(cp, torch):
    previous = cp.cuda.get_allocator()
    with pytest.raises(RuntimeError, match="x"), interop.use_torch_allocator():  # noqa: PT012
        assert cp.cuda.get_allocator() is not previous
        raise RuntimeError("x")
    assert cp.cuda.get_allocator() == previous


@pytest.mark.gpu
def test_allocation_on_a_different_stream_is_refused(cp, torch):
    with interop.use_torch_allocator():
        s = cp.cuda.Stream(non_blocking=True)
        with s, pytest.raises(interop.StreamMismatchError, match=r"interop\.stream"):
            cp.empty(1024, dtype=cp.float32)
        side = torch.cuda.Stream()
        with interop.stream(side):
            ok = cp.arange(10, dtype=cp.float32)
            assert float(ok.sum()) == 45.0


# ------------------------------------------------- the two forms, on CuPy's real settings
# CuPy's allocator settings (process-wide and thread-local) work without a device.


def _fake_malloc(size):  # never called: nothing allocates in these tests
    raise AssertionError("no allocation expected")


def _other_malloc(size):
    raise AssertionError("no allocation expected")


@pytest.fixture
def cupy_settings():
    """CuPy's allocator settings restored after a test (no device needed)."""
    import cupy

    local = cupy.cuda.memory._get_thread_local_allocator()
    cupy.cuda.memory._set_thread_local_allocator(None)
    before = cupy.cuda.get_allocator()
    yield cupy
    cupy.cuda.memory._set_thread_local_allocator(None)
    cupy.cuda.set_allocator(before)
    cupy.cuda.memory._set_thread_local_allocator(local)


def _seen_by_another_thread(cp):
    seen = []
    t = threading.Thread(target=lambda: seen.append(cp.cuda.get_allocator()))
    t.start()
    t.join()
    return seen[0]


def test_plain_call_installs_for_every_thread(cupy_settings):
    cp = cupy_settings
    allocator.AllocatorScope(cp, _fake_malloc)  # dropped at once: the plain form
    assert cp.cuda.get_allocator() is _fake_malloc
    assert _seen_by_another_thread(cp) is _fake_malloc
    # the calling thread follows the process-wide setting again: it has none of its own,
    # so CuPy lets it change the process-wide one
    assert cp.cuda.memory._get_thread_local_allocator() is None
    cp.cuda.set_allocator(_other_malloc)
    assert _seen_by_another_thread(cp) is _other_malloc


def test_block_form_is_this_threads_only(cupy_settings):
    cp = cupy_settings
    base = cp.cuda.get_allocator()
    with allocator.AllocatorScope(cp, _fake_malloc):
        assert cp.cuda.get_allocator() is _fake_malloc
        assert _seen_by_another_thread(cp) == base  # not process-wide
        with allocator.AllocatorScope(cp, _fake_malloc):  # nested
            assert cp.cuda.get_allocator() is _fake_malloc
        assert cp.cuda.get_allocator() is _fake_malloc
    assert cp.cuda.get_allocator() == base
    assert _seen_by_another_thread(cp) == base


def test_a_block_is_never_seen_by_another_thread_not_even_before_it_is_entered(cupy_settings):
    """Between ``use_torch_allocator()`` and its ``with``, another thread allocating
    under its own CuPy stream must keep its own allocator (PyTorch's would refuse
    its stream with StreamMismatchError)."""
    cp = cupy_settings
    base = cp.cuda.get_allocator()
    scope = allocator.AllocatorScope(cp, _fake_malloc)
    assert cp.cuda.get_allocator() is _fake_malloc  # this thread's at once
    assert _seen_by_another_thread(cp) == base
    with scope:
        assert _seen_by_another_thread(cp) == base
    assert cp.cuda.get_allocator() == base
    del scope  # entered: not a plain call
    assert cp.cuda.get_allocator() == base
    assert _seen_by_another_thread(cp) == base


def test_another_thread_never_sees_blocks_opening_and_closing(cupy_settings):
    cp = cupy_settings
    base = cp.cuda.get_allocator()
    stop = threading.Event()
    seen = set()

    def watch():
        while not stop.is_set():
            seen.add(cp.cuda.get_allocator() == base)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for _ in range(2000):
            with allocator.AllocatorScope(cp, _fake_malloc):
                pass
    finally:
        stop.set()
        watcher.join()
    assert seen == {True}


def test_overlapping_blocks_in_threads_restore_nothing_of_each_other(cupy_settings):
    cp = cupy_settings
    base = cp.cuda.get_allocator()
    barrier = threading.Barrier(4)
    inside = []

    def work(_):
        barrier.wait(5)
        with allocator.AllocatorScope(cp, _fake_malloc):
            barrier.wait(5)  # all four blocks open at once
            inside.append(cp.cuda.get_allocator() is _fake_malloc)
            barrier.wait(5)
        inside.append(cp.cuda.get_allocator() == base)

    in_threads(work, 4)
    assert inside == [True] * 8
    assert cp.cuda.get_allocator() == base  # the process-wide setting came back


def test_a_plain_call_during_a_block_stays_process_wide(cupy_settings):
    cp = cupy_settings
    block = allocator.AllocatorScope(cp, _fake_malloc)
    allocator.AllocatorScope(cp, _fake_malloc)  # a plain call, meanwhile
    with block:
        pass
    assert cp.cuda.get_allocator() is _fake_malloc
    assert _seen_by_another_thread(cp) is _fake_malloc


def test_a_plain_call_inside_cupys_own_block_installs_process_wide_and_keeps_the_block(
    cupy_settings,
):
    cp = cupy_settings
    with cp.cuda.using_allocator(_other_malloc):
        allocator.AllocatorScope(cp, _fake_malloc)  # the plain call
        assert cp.cuda.get_allocator() is _other_malloc  # the user's block still holds here
        assert _seen_by_another_thread(cp) is _fake_malloc
    assert cp.cuda.get_allocator() is _fake_malloc


def test_a_scope_may_be_entered_again_and_nested(cupy_settings):
    cp = cupy_settings
    base = cp.cuda.get_allocator()
    scope = allocator.AllocatorScope(cp, _fake_malloc)
    with scope:
        with scope:
            assert cp.cuda.get_allocator() is _fake_malloc
        assert cp.cuda.get_allocator() is _fake_malloc
    assert cp.cuda.get_allocator() == base
    with scope:
        assert cp.cuda.get_allocator() is _fake_malloc
    assert cp.cuda.get_allocator() == base
    del scope
    assert _seen_by_another_thread(cp) == base


def test_a_block_entered_in_another_thread_is_refused(cupy_settings):
    cp = cupy_settings
    base = cp.cuda.get_allocator()
    scope = allocator.AllocatorScope(cp, _fake_malloc)
    errors = []

    def enter():
        try:
            with scope:
                pass
        except RuntimeError as exc:
            errors.append(str(exc))
        errors.append(cp.cuda.get_allocator() == base)  # nothing changed there

    t = threading.Thread(target=enter)
    t.start()
    t.join()
    assert "expected `with interop.use_torch_allocator():` in the thread that called" in errors[0]
    assert errors[1] is True
    with scope:  # still usable where it was made
        assert cp.cuda.get_allocator() is _fake_malloc
    assert cp.cuda.get_allocator() == base


_GC_SCRIPT = """
import faulthandler, gc, sys
faulthandler.dump_traceback_later(60, exit=True)  # a deadlock fails with the stacks
import cupy
from interop import allocator

def fake(size):
    raise AssertionError

class Cycle:
    def __init__(self):
        self.scope = allocator.AllocatorScope(cupy, fake)  # made, never entered: a plain call
        self.me = self  # garbage only the collector finds

kept = [Cycle() for _ in range(400)]

def collect_inside_the_allocator(frame, event, arg):
    # The collector runs at allocations, so in the middle of anything: here at
    # every step of the allocator module, each time dropping one of the scopes.
    if kept and frame.f_code.co_filename == allocator.__file__:
        kept.pop()
        gc.collect()

sys.setprofile(collect_inside_the_allocator)
for _ in range(20):
    with allocator.AllocatorScope(cupy, fake):
        pass
    allocator.AllocatorScope(cupy, fake)
sys.setprofile(None)
gc.collect()
import threading
seen = []
t = threading.Thread(target=lambda: seen.append(cupy.cuda.get_allocator() is fake))
t.start()
t.join()
print(len(kept), seen[0])  # every dropped scope went process-wide
"""


def test_a_scope_dropped_by_the_garbage_collector_never_deadlocks():
    """A plain-call scope in a reference cycle is dropped by the collector,
    which runs at any allocation: also in the middle of the allocator module."""
    proc = run_python(_GC_SCRIPT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "True"]
    assert proc.stderr == ""  # nothing was printed by a finalizer


def test_a_scope_dropped_at_interpreter_exit_lets_nothing_out():
    proc = run_python(
        """
        import cupy
        from interop import allocator

        def fake(size):
            raise AssertionError

        KEPT = allocator.AllocatorScope(cupy, fake)  # made, never entered, dropped at exit
        KEPT.me = KEPT
        print(cupy.cuda.get_allocator() is fake)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True"]
    assert proc.stderr == ""


# ----------------------------------------------------------------- deferred frees, on host streams


def test_a_block_used_on_another_stream_is_freed_after_that_stream_reaches_the_free():
    device = EmulatedDevice()
    by_id = {}
    deleted = []

    def record(dev, handle):
        event = device.event()
        event.record(by_id[handle])
        return event

    frees = allocator.DeferredFrees(record, deleted.append)
    a, b = device.stream(), device.stream()
    by_id.update({a.id: a, b.id: b})
    frees.allocated(0x1000, 0, a.id)  # allocated on stream a
    frees.allocated(0x2000, 0, a.id)
    streams.stream_uses.enter((0, b.id))  # `with interop.stream(b):` ...
    gate = threading.Event()
    b.enqueue("op", lambda: gate.wait(5))  # ... work on b still reads the block
    streams.stream_uses.leave((0, b.id))
    frees.free(0x1000)
    assert deleted == []  # not back in the pool while b may still read it
    assert frees.deferred == 1
    gate.set()
    b.synchronize()
    frees.collect()
    assert deleted == [0x1000]
    frees.allocated(0x3000, 0, a.id)  # allocated after b was last entered
    frees.free(0x3000)
    assert deleted == [0x1000, 0x3000]  # no other stream since: freed at once
    a.close()
    b.close()
    device.close()


def test_a_block_this_pool_never_allocated_is_left_alone():
    deleted = []
    frees = allocator.DeferredFrees(lambda dev, handle: None, deleted.append)
    frees.free(0x1000)  # e.g. the parent's block, freed in a forked child
    frees.allocated(0x2000, 0, 0)
    frees.free(0x2000)
    assert deleted == [0x2000]
    assert frees.deferred == 0


class _FakeTensor:
    """What ``torch.empty(size, dtype=torch.uint8, ...)`` gives: a block of PyTorch's pool."""

    def __init__(self, size, ptr):
        self.size, self._ptr = size, ptr

    def data_ptr(self):
        return self._ptr


def _fake_libraries(current):
    """Stand-ins for torch and cupy as TorchAllocator sees them: CuPy's current
    stream is ``current["cupy"]``, PyTorch's ``current["torch"]``, on device 0."""
    made = []

    class TorchOOM(RuntimeError):
        pass

    def empty(shape, dtype, device):
        if shape[0] > 1 << 40:
            raise TorchOOM("CUDA out of memory")
        made.append(_FakeTensor(shape[0], 0x1000 * (len(made) + 1) if shape[0] else 0))
        return made[-1]

    class CupyOOM(MemoryError):
        def __init__(self, size, total):
            super().__init__(size, total)

    ns = types.SimpleNamespace
    torch = ns(
        empty=empty,
        uint8="uint8",
        device=lambda kind, index: f"{kind}:{index}",
        cuda=ns(OutOfMemoryError=TorchOOM, memory_allocated=lambda device: 0),
    )
    cuda = ns(
        runtime=ns(getDevice=lambda: 0),
        get_current_stream=lambda: ns(ptr=current["cupy"]),
        UnownedMemory=lambda ptr, size, owner, device: ns(ptr=ptr, size=size, _owner=owner),
        MemoryPointer=lambda mem, offset: ns(mem=mem, ptr=mem.ptr + offset),
        memory=ns(OutOfMemoryError=CupyOOM),
    )
    backends = ns(torch=lambda: torch, cupy=lambda: ns(cuda=cuda))
    return backends, made


def test_the_torch_allocator_serves_cupy_with_pytorch_tensors_given_back_after_their_streams(
    monkeypatch,
):
    """The one PyTorch-backed CuPy allocator (use_torch_allocator's, and each
    torch_op call's, pinned to the call's stream): each allocation is a uint8
    tensor of PyTorch's pool whose storage torch_storage_of finds. CuPy's free
    hands use_torch_allocator's tensor to the deferred frees, which let it go
    once the streams it was used on reached the free; a torch_op call's goes
    at once. Allocations on another stream are refused before anything is
    allocated. Stand-ins for torch and cupy; streams and events of the
    emulated device."""
    device = EmulatedDevice()
    a, b = device.stream(), device.stream()
    by_id = {a.id: a, b.id: b}

    def record(dev, handle):
        event = device.event()
        event.record(by_id[handle])
        return event

    current = {"cupy": a.id, "torch": a.id}
    backends, made = _fake_libraries(current)
    monkeypatch.setattr(allocator, "_backends", backends)
    monkeypatch.setattr(allocator.streams, "torch_stream_handle", lambda index: current["torch"])
    frees = allocator.DeferredFrees(record, allocator._release)
    monkeypatch.setattr(allocator, "_frees", frees)

    process = allocator.TorchAllocator()  # use_torch_allocator's: PyTorch's current stream
    p = process(256)
    [tensor] = made
    assert (tensor.size, p.ptr) == (256, tensor.data_ptr())
    assert allocator.torch_storage_of(p.mem) is tensor
    assert allocator.torch_storage_of(p.mem, process) is tensor
    assert allocator.torch_storage_of(p.mem, allocator.TorchAllocator()) is None
    gate = threading.Event()
    _used_on(b, gate)  # `with interop.stream(b):` reads the block, still queued
    del p  # CuPy frees it
    assert frees.deferred == 1
    assert allocator._held == {tensor.data_ptr(): tensor}  # not back in PyTorch's pool yet
    gate.set()
    b.synchronize()
    frees.collect()
    assert allocator._held == {}  # the last reference gone: PyTorch's pool has it again
    q = process(0)  # size 0: a tensor of no memory, nothing to give back
    assert (made[-1].size, q.ptr) == (0, 0)
    del q
    assert frees.deferred == 0

    pinned = allocator.TorchAllocator((0, a.id))  # a torch_op call's, on stream a
    r = pinned(64)
    assert allocator.torch_storage_of(r.mem, pinned) is made[-1]
    del r  # given back at once, not through the deferred frees
    assert (frees.deferred, allocator._held) == (0, {})
    current["cupy"] = b.id  # the function switched CuPy's stream
    with pytest.raises(interop.StreamMismatchError, match="do not switch CuPy's device"):
        pinned(64)
    with pytest.raises(interop.StreamMismatchError, match=r"interop\.stream"):
        process(64)
    assert len(made) == 3  # nothing allocated for the refused ones
    current["torch"] = b.id
    s = process(64)
    assert allocator.torch_storage_of(s.mem, process) is made[-1]
    with pytest.raises(MemoryError) as info:  # CuPy's own error, chained to PyTorch's
        process(1 << 41)
    assert isinstance(info.value.__cause__, RuntimeError)
    del s
    assert allocator._held == {}
    assert frees.deferred == 0  # b was the block's own stream: given back at once
    for stream in (a, b):
        stream.close()
    device.close()


class _Counted:
    """A host event whose queries are counted in ``log``."""

    def __init__(self, event, log, on_query=None):
        self.event = event
        self.log = log
        self.on_query = on_query

    def query(self):
        self.log.append("query")
        if self.on_query is not None:
            self.on_query()
        return self.event.query()


def _pool_on(device, log, **kwargs):
    """DeferredFrees over ``device``'s streams: ``(frees, deleted, by_id)``."""
    by_id = {}
    deleted = []
    on_query = kwargs.pop("on_query", None)

    def record(dev, handle):
        log.append(("record", handle))
        event = device.event()
        event.record(by_id[handle])
        return _Counted(event, log, on_query)

    return allocator.DeferredFrees(record, deleted.append, **kwargs), deleted, by_id


def _used_on(stream, gate):
    """``with interop.stream(stream):`` queuing work that waits for ``gate``."""
    streams.stream_uses.enter((0, stream.id))
    stream.enqueue("op", lambda: gate.wait(5))
    streams.stream_uses.leave((0, stream.id))


def test_during_a_capture_a_free_records_and_queries_no_event_and_waits_for_its_end():
    """CUDA forbids event record/query while a graph capture is under way (and
    the capture would be invalidated): the free is set aside without an event,
    and gets its events once no capture is under way."""
    device = EmulatedDevice()
    log = []
    capture = {"on": False}
    frees, deleted, by_id = _pool_on(device, log, capturing=lambda: capture["on"])
    a, b = device.stream(), device.stream()
    by_id.update({a.id: a, b.id: b})
    for ptr in (0x1000, 0x2000):
        frees.allocated(ptr, 0, a.id)
    gate = threading.Event()
    _used_on(b, gate)
    frees.free(0x1000)  # before the capture: an event on b, not complete yet
    assert log == [("record", b.id), "query"]
    assert deleted == []

    capture["on"] = True
    log.clear()
    frees.free(0x2000)  # used on b too
    frees.collect()
    assert log == []  # nothing recorded, nothing queried
    assert (frees.deferred, frees.set_aside) == (2, 1)
    frees.allocated(0x3000, 0, b.id)  # allocated and freed on one stream: no event needed
    frees.free(0x3000)
    assert deleted == [0x3000]
    assert log == []

    capture["on"] = False
    frees.collect()  # the set-aside free gets its event now
    assert log == [("record", b.id), "query", "query"]
    assert (frees.deferred, frees.set_aside) == (2, 0)
    assert deleted == [0x3000]  # b has not reached either free
    gate.set()
    b.synchronize()
    frees.collect()
    assert sorted(deleted) == [0x1000, 0x2000, 0x3000]
    assert frees.deferred == 0
    for s in (a, b):
        s.close()
    device.close()


@pytest.mark.parametrize("paused", [True, False])
def test_deferred_frees_under_the_emulated_capture_mode(paused):
    """The same rule against the emulated device's capture mode, which fails an
    event query made while a capture is under way (and invalidates the
    capture): paused while capturing, the pool queries nothing until the
    capture ends; told no capture is under way, it breaks the capture."""
    device = EmulatedDevice()
    log = []
    capturing = (lambda: bool(device.machine.captures)) if paused else (lambda: False)
    frees, deleted, by_id = _pool_on(device, log, capturing=capturing)
    a, b, c = device.stream(), device.stream(), device.stream()
    by_id.update({s.id: s for s in (a, b, c)})
    frees.allocated(0x1000, 0, a.id)
    gate = threading.Event()
    _used_on(b, gate)
    frees.free(0x1000)  # an event on b, pending
    gate.set()
    b.synchronize()
    if paused:
        with device.capture(c):
            frees.collect()  # would query the pending event: paused instead
            assert deleted == []
        frees.collect()  # the capture is over: queried now, complete
        assert deleted == [0x1000]
    else:
        with pytest.raises(EmulatedCaptureError, match="capture"), device.capture(c):
            frees.collect()
    for s in (a, b, c):
        s.close()
    device.close()


def test_capture_is_asked_only_when_an_event_is_to_be_recorded_or_queried():
    device = EmulatedDevice()
    asked = []
    frees, deleted, _ = _pool_on(device, [], capturing=lambda: asked.append(1) or False)
    s = device.stream()
    frees.allocated(0x1000, 0, s.id)
    frees.free(0x1000)
    frees.collect()
    assert deleted == [0x1000]
    assert asked == []  # the allocation path stays cheap: nothing pending, nothing asked
    s.close()
    device.close()


def test_a_capture_check_tells_pytorchs_pool_from_cupys():
    """What a call inside a capture asks before CuPy allocates its result:
    CuPy's own pool grows with cudaMalloc (the capture forbids it); PyTorch's,
    installed here, serves the capture from its graph's pool."""
    cp = pytest.importorskip("cupy")
    from interop.pipeline.cuda import uses_cupys_pool

    assert uses_cupys_pool(cp)
    with cp.cuda.using_allocator(allocator.TorchAllocator()):
        assert not uses_cupys_pool(cp)
        with cp.cuda.using_allocator(cp.get_default_memory_pool().malloc):
            assert uses_cupys_pool(cp)
    assert uses_cupys_pool(cp)


def test_a_free_run_by_the_garbage_collector_inside_the_pool_never_waits():
    """CuPy frees from destructors, which the collector may run while this
    thread is inside the pool with its lock held (here: while it queries)."""
    device = EmulatedDevice()
    log = []
    frees, deleted, by_id = _pool_on(device, log, on_query=gc.collect)
    a, b = device.stream(), device.stream()
    by_id.update({a.id: a, b.id: b})
    frees.allocated(0x1000, 0, a.id)
    frees.allocated(0x2000, 0, a.id)
    gate = threading.Event()
    _used_on(b, gate)
    frees.free(0x1000)  # waits for an event on b

    class Array:  # a CuPy array in a reference cycle, freed by the collector
        def __init__(self):
            self.me = self

        def __del__(self):
            frees.free(0x2000)

    gc.disable()  # the collector runs where the query runs it, not before
    try:
        Array()
        worker = threading.Thread(target=frees.collect, daemon=True)  # queries: it collects
        worker.start()
        worker.join(20)
    finally:
        gc.enable()
    assert not worker.is_alive(), "the free run by the collector waited for the pool's lock"
    assert frees.deferred == 2  # the re-entrant free was handed on after the lock was released
    gate.set()
    b.synchronize()
    frees.collect()
    assert sorted(deleted) == [0x1000, 0x2000]
    for s in (a, b):
        s.close()
    device.close()


def test_a_block_whose_event_cannot_be_recorded_is_dropped_and_the_others_go_on():
    device = EmulatedDevice()
    log = []
    frees, deleted, by_id = _pool_on(device, log)
    a, b = device.stream(), device.stream()
    by_id.update({a.id: a})  # b unknown to record(): recording on it fails
    frees.allocated(0x1000, 0, a.id)
    frees.allocated(0x2000, 0, b.id)
    streams.stream_uses.enter((0, b.id))
    streams.stream_uses.leave((0, b.id))
    with pytest.raises(KeyError):
        frees.free(0x1000)  # used on b: its event cannot be recorded
    assert frees.deferred == 0  # dropped: never handed out while b may use it
    frees.free(0x2000)  # the pool goes on
    assert deleted == [0x2000]
    for s in (a, b):
        s.close()
    device.close()


@pytest.mark.gpu
def test_gpu_block_form_is_per_thread_with_torch_memory(cp, torch):
    """Overlapping blocks in two threads: each thread's CuPy memory comes from
    PyTorch's pool inside its block; the main thread's never does."""
    barrier = threading.Barrier(2)
    counted = []

    def work(_):
        with interop.use_torch_allocator():
            barrier.wait(10)
            before = torch.cuda.memory_allocated()
            a = cp.empty(64 << 20, dtype=cp.uint8)
            counted.append(torch.cuda.memory_allocated() - before >= 64 << 20)
            barrier.wait(10)
            del a

    in_threads(work, 2)
    assert counted == [True, True]
    before = torch.cuda.memory_allocated()
    b = cp.empty(64 << 20, dtype=cp.uint8)  # outside any block: CuPy's own pool
    assert torch.cuda.memory_allocated() == before
    del b


@pytest.mark.gpu
def test_gpu_a_block_used_on_another_stream_is_not_reused_early(cp, torch):
    warm = cp.zeros(1 << 20, dtype=cp.uint8)
    warm += 1  # compile the kernel before the sleep: `a += 1` below must queue behind it
    del warm
    side = torch.cuda.Stream()
    with interop.use_torch_allocator():
        a = cp.zeros(1 << 20, dtype=cp.uint8)  # allocated on the default stream
        ptr = a.data.ptr
        with interop.stream(side):
            torch.cuda._sleep(500_000_000)  # side is busy for a while ...
            a += 1  # ... then reads and writes a
        del a  # freed on the default stream while side still needs it
        b = cp.full(1 << 20, 7, dtype=cp.uint8)  # same size, default stream
        assert b.data.ptr != ptr  # not handed out again before side reached the free
        side.synchronize()
        assert int(b.sum()) == 7 << 20
        del b


@pytest.mark.gpu
def test_gpu_per_thread_default_stream_is_mapped_or_refused_clearly():
    proc = run_python(
        """
        import torch, cupy as cp, interop
        # ones: every partial float32 sum is an exact integer, in any order
        t = torch.zeros(1 << 20, dtype=torch.float32, device="cuda")
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)
            t.add_(1)
            c = interop.to_cupy(t)  # CuPy's current stream is the per-thread default
            print("sum", int(c.sum()) == 1 << 20)
            torch.cuda._sleep(200_000_000)
            t.add_(1)
            with cp.cuda.Stream.null:  # CuPy names it the per-thread default stream too
                c = interop.to_cupy(t)
                print("null", int(c.sum()) == 2 << 20)
        try:
            with interop.use_torch_allocator():
                cp.empty(16, dtype=cp.float32)
        except interop.StreamMismatchError as exc:
            print("refused", "CUPY_CUDA_PER_THREAD_DEFAULT_STREAM" in str(exc))
        s = torch.cuda.Stream()
        with interop.use_torch_allocator(), interop.stream(s):
            print("inside", float(cp.ones(16, dtype=cp.float32).sum()))
        """,
        env={"CUPY_CUDA_PER_THREAD_DEFAULT_STREAM": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [
        *("sum", "True", "null", "True"),
        *("refused", "True", "inside", "16.0"),
    ]


@pytest.mark.gpu
def test_gpu_another_thread_keeps_its_own_pool_while_a_block_is_being_opened(cp, torch):
    """Between ``use_torch_allocator()`` and its ``with``, a thread allocating on
    its own CuPy stream gets CuPy's pool, not PyTorch's (which would refuse its
    stream with StreamMismatchError)."""
    scope = interop.use_torch_allocator()  # made, not entered yet
    try:

        def other(_):
            with cp.cuda.Stream(non_blocking=True):
                before = torch.cuda.memory_allocated()
                a = cp.ones(1 << 20, dtype=cp.uint8)
                return int(a.sum()), torch.cuda.memory_allocated() - before

        assert in_threads(other, 1) == [(1 << 20, 0)]
    finally:
        with scope:  # entered: a block, never a plain call for the rest of the session
            pass


@pytest.mark.gpu
def test_gpu_a_graph_capture_stays_valid_and_nothing_leaks_after_it(cp, torch):
    """CuPy allocates from PyTorch's pool inside ``torch.cuda.graph`` and frees
    there a block used on the capture stream: no event is recorded or queried
    during the capture (CUDA would invalidate it), and after the capture the
    block goes back to the pool."""
    n = 1 << 20
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    g = torch.cuda.CUDAGraph()
    with interop.use_torch_allocator():
        x = cp.arange(n, dtype=cp.float32)  # on the default stream
        out = cp.empty(n, dtype=cp.float32)
        old = cp.ones(n, dtype=cp.float32)
        s.wait_stream(torch.cuda.current_stream())
        with interop.stream(s):
            old += 1  # used on s: its free needs an event on s
            tmp = x * 2  # the captured work, once outside the capture: kernels compiled
            cp.add(tmp, 1, out=out)
            del tmp
            torch.cuda.synchronize()
            with torch.cuda.graph(g, stream=s):
                del old  # freed during the capture
                tmp = x * 2  # allocated during the capture, from the graph's pool
                cp.add(tmp, 1, out=out)
                del tmp
            assert allocator._frees.set_aside == 1  # no event recorded for it yet
            out.fill(0)
            g.replay()
            expected = cp.arange(n, dtype=cp.float32) * 2 + 1
            assert bool(cp.array_equal(out, expected))
        del x, out, expected
    torch.cuda.synchronize()
    allocator._frees.collect()  # after the capture: events recorded, then seen complete
    torch.cuda.synchronize()
    allocator._frees.collect()
    assert allocator._frees.deferred == 0
    del g
    assert torch.cuda.memory_allocated() == before
