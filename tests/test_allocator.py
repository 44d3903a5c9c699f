"""interop.use_torch_allocator: one pool for CuPy and PyTorch."""

from __future__ import annotations

import threading

import pytest

import interop
from interop import allocator, streams
from interop.pipeline.host import HostBackend

from .helpers import in_threads, run_python


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


def _fake_malloc(size):  # never called: nothing allocates in these tests
    raise AssertionError("no allocation expected")


@pytest.fixture
def cupy_settings():
    """CuPy's allocator settings restored after a test (no device needed)."""
    import cupy

    before = cupy.cuda.get_allocator()
    state = (allocator._pending, allocator._plain, allocator._base)
    yield cupy
    cupy.cuda.set_allocator(before)
    allocator._pending, allocator._plain, allocator._base = state


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
    allocator.AllocatorScope(cp, _fake_malloc)  # another thread's plain call, meanwhile
    with block:
        pass
    assert cp.cuda.get_allocator() is _fake_malloc
    assert _seen_by_another_thread(cp) is _fake_malloc


# ----------------------------------------------------------------- deferred frees, on host streams


def test_a_block_used_on_another_stream_is_freed_after_that_stream_reaches_the_free():
    device = HostBackend()
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
