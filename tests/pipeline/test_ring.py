"""Staging rings and the cache of idle pinned buffers: on each test device where
the test needs only the pipeline's device interface (the emulated device's
pinned buffers, and CUDA's under the ``gpu`` marker); on the emulated device
alone where it counts or injects what only it can."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import interop
from interop._process import ring_cache
from interop.config import MIN_CHUNK_BYTES, chunk_bytes_or_default
from interop.pipeline import ring as rings
from interop.pipeline.plan import STAGING_ALIGN, plan_chunks, round_up
from interop.pipeline.ring import (
    StagingRing,
    borrow_ring,
    cached_buffers,
    cached_bytes,
    cached_rings,
    free_cached_rings,
    return_ring,
    size_class,
    staging_ring,
)
from interop.testing import EmulatedDevice, EmulatedDeviceError
from tests.helpers import in_threads, run_python

KiB, MiB = 1 << 10, 1 << 20


@pytest.fixture
def backend():
    free_cached_rings()
    b = EmulatedDevice()
    yield b
    free_cached_rings()
    assert b.host_buffers == {}
    b.close()


def pinned_bytes(backend):
    """Pinned memory the backend holds: lent rings and idle cached buffers."""
    return sum(a.nbytes for a in backend.host_buffers.values())


def test_a_ring_holds_exact_buffers_and_frees_them(device):
    with StagingRing(device.backend, 3, 1000) as ring:
        assert len(ring.ptrs) == 3
        assert [a.nbytes for a in ring.arrays] == [1000] * 3
        ring.arrays[2][:] = 7
        assert not ring.closed
    assert ring.closed
    ring.free()  # idempotent


# ----------------------------------------------------------------- size classes


def test_size_classes_have_a_floor_and_keep_the_planners_powers_of_two():
    assert rings.FLOOR == MIN_CHUNK_BYTES == 64 * KiB
    assert [size_class(n) for n in (1, 256, 4096, 64 * KiB)] == [64 * KiB] * 4
    assert [size_class(n) for n in (128 * KiB, 32 * MiB)] == [128 * KiB, 32 * MiB]
    # a slot capped at a chunk_bytes that is not a power of two keeps its size:
    # rounding it up again would pin more than num_buffers x chunk_bytes
    assert size_class(48 * MiB) == 48 * MiB


@pytest.mark.parametrize("chunk", [1, 64 * KiB, 100_000, 1 * MiB, 3 * MiB, 32 * MiB])
def test_a_slots_buffer_never_exceeds_its_transfers_chunk(chunk):
    """The per-transfer bound (num_buffers x chunk_bytes pinned) holds after rounding."""
    effective = chunk_bytes_or_default(chunk)  # raised to 64 KiB when below
    for shape, itemsize in [
        ((1,), 1),
        ((10,), 8),
        ((3, 1000), 4),
        ((70_000,), 4),
        ((5, 333_333), 2),
        ((9, 7, 1_000_001), 1),
        ((257, 4099), 8),
    ]:
        plan = plan_chunks(shape, itemsize, effective, 4)
        size = size_class(plan.slot_bytes)
        assert size >= plan.slot_bytes
        # the planner's rows are 256-byte aligned, so a chunk_bytes that is not a
        # multiple of 256 may be exceeded by the alignment only
        assert size <= round_up(effective, STAGING_ALIGN), (shape, chunk)


# ----------------------------------------------------------------- lending


def test_the_cache_lends_each_buffer_once_and_reuses_it(device):
    backend = device.backend
    with staging_ring(backend, 2, 64) as a, staging_ring(backend, 2, 64) as b:
        assert a is not b
        assert a.nbytes == b.nbytes == 64 * KiB  # the floor class
        assert not set(a.ptrs) & set(b.ptrs)  # concurrent transfers never share a buffer
        lent = set(a.ptrs) | set(b.ptrs)
    assert a.closed  # handed back: the rings own nothing any more
    assert b.closed
    assert cached_buffers() == 4
    assert cached_rings() == 2
    counts = device.emulated.counts if device.emulated else None  # the emulated device counts
    allocs = counts["host_alloc"] if counts else None
    with staging_ring(backend, 3, 5000) as c:  # another slot size and count, same class
        assert set(c.ptrs) <= lent
    with staging_ring(backend, 4, 64 * KiB) as d:
        assert set(d.ptrs) == lent
    if counts:
        assert counts["host_alloc"] == allocs  # nothing new was pinned
        frees = counts["host_free"]
    with pytest.raises(RuntimeError), staging_ring(backend, 3, 64) as failed:
        raise RuntimeError
    assert failed.closed
    if counts:
        assert counts["host_free"] == frees + 3  # a failed transfer's ring is freed
    assert cached_buffers() == 1
    assert not set(failed.ptrs) & {buf.ptr for v in ring_cache._by_key.values() for buf in v}
    free_cached_rings()
    assert (cached_buffers(), cached_bytes(), cached_rings()) == (0, 0, 0)


def test_a_returned_rings_buffers_are_cached_by_size_class_and_a_failed_one_is_freed(device):
    backend = device.backend
    key = (backend.ring_key, 64 * KiB)
    with staging_ring(backend, 2, 4096) as lent:
        ptrs = set(lent.ptrs)
        assert lent.nbytes == 64 * KiB
        lent.arrays[1][:] = 7  # host-writable
    assert {buf.ptr for buf in ring_cache._by_key[key]} == ptrs
    with staging_ring(backend, 2, 4096) as again:
        assert set(again.ptrs) == ptrs  # reused, and not lent twice meanwhile
        assert key not in ring_cache._by_key
    with pytest.raises(RuntimeError, match="boom"), staging_ring(backend, 2, 4096) as failed:
        raise RuntimeError("boom")
    assert failed.closed
    assert key not in ring_cache._by_key  # freed, not cached
    free_cached_rings()


def test_concurrent_borrowers_get_disjoint_buffers(backend):
    with staging_ring(backend, 4, 100 * KiB):
        pass  # four idle buffers of the 128 KiB class
    barrier = threading.Barrier(6)

    def borrow(_):
        barrier.wait(10)
        ring = borrow_ring(backend, 2, 100 * KiB)
        barrier.wait(10)  # all six lent at once
        ptrs = list(ring.ptrs)
        return_ring(ring)
        return ptrs

    lent = [p for ptrs in in_threads(borrow, 6) for p in ptrs]
    assert len(lent) == len(set(lent)) == 12


def test_many_shapes_pin_and_free_nothing_once_warm(device):
    """Copies over eleven shapes of CuPy arrays and three of tensors, twice, then
    the same again: the second round neither allocates nor frees pinned memory
    (cudaFreeHost would stall the whole device on CUDA): the same idle buffers."""
    shapes = [
        (3,),
        (1000,),
        (20_000,),
        (70_000,),
        (300, 1000),
        (1_000_000,),
        (5, 7, 999),
        (129_000,),
        (2, 600_000),
        (33_333,),
        (3, 1 << 20),
    ]
    arrays = [np.arange(np.prod(s), dtype=np.float32).reshape(s) for s in shapes]
    sources = [(a, device.asarray(a)) for a in arrays]
    sources += [(a, device.asarray(a, lib="torch")) for a in arrays[:3]]

    def one_round():
        for a, x in sources * 2:
            np.testing.assert_array_equal(interop.copy_to_host(x, chunk_bytes=1 * MiB), a)

    one_round()
    idle = sorted(buf.ptr for buf in ring_cache._lru)
    before = dict(device.emulated.counts) if device.emulated else None
    one_round()
    assert sorted(buf.ptr for buf in ring_cache._lru) == idle  # the same buffers, none new or freed
    if device.emulated:  # the emulated device counts the allocations and frees
        assert device.emulated.counts["host_alloc"] == before["host_alloc"]
        assert device.emulated.counts["host_free"] == before.get("host_free", 0)


def test_each_transfer_pins_at_most_num_buffers_chunks(backend):
    """Measured while the transfer runs: pinned memory held, less what the
    cache holds idle, is what the running transfer borrowed."""
    worst = []

    def progress(done, total):
        worst.append(pinned_bytes(backend) - cached_bytes())

    for chunk in (64 * KiB, 96 * KiB, 1 * MiB):
        for shape in [(5,), (40_000,), (3, 70_000), (1_000_000,)]:
            a = np.ones(shape, np.float32)
            with interop.config.set(num_buffers=3):
                interop.copy_to_host(backend.asarray(a), chunk_bytes=chunk, progress=progress)
            assert max(worst) <= 3 * chunk, (chunk, shape)
            worst.clear()


def test_idle_memory_stays_within_twice_the_largest_ring(backend):
    def lend(count, nbytes, n=1):
        """Lend ``n`` rings at once and return them; their buffers' addresses."""
        lent = [borrow_ring(backend, count, nbytes) for _ in range(n)]
        ptrs = [list(ring.ptrs) for ring in lent]
        for ring in lent:
            return_ring(ring)
        return ptrs

    lend(4, 1 * MiB)
    budget = 2 * 4 * MiB
    assert cached_bytes() == 4 * MiB
    lend(4, 1 * MiB, n=2)  # two at once: one from the cache, one new
    assert cached_bytes() == budget  # both kept: exactly the budget
    (recent,) = lend(2, 256 * KiB)
    assert cached_bytes() <= budget
    assert cached_bytes() == budget - 1 * MiB + 2 * 256 * KiB  # one oldest 1 MiB buffer freed
    assert set(recent) <= {buf.ptr for buf in ring_cache._lru}  # the newest are kept
    for _ in range(3):  # every class below, at every count: still within the budget
        for size in (64 * KiB, 128 * KiB, 256 * KiB, 512 * KiB):
            for count in (1, 3, 4):
                lend(count, size)
                assert cached_bytes() <= budget
    assert pinned_bytes(backend) == cached_bytes()  # nothing lent, nothing lost


def test_the_most_recently_returned_buffers_are_kept(backend):
    first = borrow_ring(backend, 4, 1 * MiB)
    first_ptrs = list(first.ptrs)
    return_ring(first)
    second = [borrow_ring(backend, 4, 1 * MiB) for _ in range(2)]
    second_ptrs = [p for r in second for p in r.ptrs]
    assert set(first_ptrs) <= set(second_ptrs)
    for r in second:
        return_ring(r)
    small = borrow_ring(backend, 4, 512 * KiB)
    small_ptrs = list(small.ptrs)
    return_ring(small)  # 2 MiB more: over the 8 MiB budget, the oldest go first
    idle = [buf.ptr for buf in ring_cache._lru]
    assert idle[-4:] == small_ptrs
    assert set(second_ptrs[4:]) <= set(idle)  # returned last of the 1 MiB rings: kept
    assert len(set(second_ptrs[:4]) & set(idle)) == 2  # returned first: two freed


def test_free_cached_rings_frees_everything_and_forgets_the_largest_ring(backend):
    with staging_ring(backend, 4, 1 * MiB):
        pass
    lent = borrow_ring(backend, 2, 64 * KiB)
    free_cached_rings()
    assert pinned_bytes(backend) == 2 * 64 * KiB  # only the ring still lent
    return_ring(lent)  # comes back, and sets the budget again: 2 x 2 x 64 KiB
    assert cached_bytes() == 2 * 64 * KiB
    with staging_ring(backend, 1, 64 * KiB), staging_ring(backend, 1, 64 * KiB):
        pass
    assert cached_bytes() == 2 * 64 * KiB  # the 1 MiB ring no longer widens it


def test_a_ring_not_made_by_the_cache_is_freed_when_returned(backend):
    ring = StagingRing(backend, 2, 1000)  # not a size class
    return_ring(ring)
    assert ring.closed
    assert cached_buffers() == 0
    assert backend.host_buffers == {}


def test_a_failed_transfer_frees_its_ring_and_keeps_the_cache(backend):
    with staging_ring(backend, 2, 64 * KiB):
        pass
    failing = EmulatedDevice(faults={"drain": 2})  # a host thread's copy out of a slot fails
    a = np.ones(1 << 20, np.float32)
    with pytest.raises(interop.TransferError):
        interop.copy_to_host(failing.asarray(a), chunk_bytes=64 * KiB)
    assert failing.counts["host_free"] == failing.counts["host_alloc"] > 0
    assert failing.host_buffers == {}  # every buffer of the failed ring freed
    assert cached_buffers() == 2  # the other backend's idle buffers untouched
    failing.close()


def test_rings_of_two_backends_are_never_mixed(backend):
    other = EmulatedDevice()
    with staging_ring(backend, 1, 64) as mine:
        mine_ptrs = list(mine.ptrs)
    with staging_ring(other, 1, 64) as theirs:
        assert theirs.backend is other
        assert not set(theirs.ptrs) & set(mine_ptrs)
    free_cached_rings()
    assert other.host_buffers == {}
    other.close()


def test_free_tries_every_buffer_and_raises_the_first_failure():
    backend = EmulatedDevice(faults={"host_free": 2})
    ring = StagingRing(backend, 4, 256)
    with pytest.raises(EmulatedDeviceError, match="freeing pinned buffer"):
        ring.free()
    assert backend.counts["host_free"] == 4
    assert len(backend.host_buffers) == 1
    assert ring.closed
    backend.close()


def test_freeing_the_cache_tries_every_buffer_and_raises_the_first_failure():
    free_cached_rings()
    backend = EmulatedDevice(faults={"host_free": 2})
    with staging_ring(backend, 3, 64 * KiB):
        pass
    with pytest.raises(EmulatedDeviceError, match="freeing pinned buffer"):
        free_cached_rings()
    assert backend.counts["host_free"] == 3
    assert cached_buffers() == 0
    backend.close()


def test_a_failing_free_never_replaces_the_error_in_flight():
    backend = EmulatedDevice(faults={"host_free": 1})
    with pytest.raises(KeyError, match="the original") as info, StagingRing(backend, 2, 64):
        raise KeyError("the original")
    assert any("freeing the staging ring also failed" in n for n in info.value.__notes__)
    assert backend.counts["host_free"] == 2
    backend.close()


def test_a_failed_allocation_frees_what_it_had():
    backend = EmulatedDevice(faults={"host_alloc": 3})
    with pytest.raises(EmulatedDeviceError, match="pinned host allocation failed"):
        StagingRing(backend, 4, 64)
    assert backend.host_buffers == {}
    backend.close()


def test_a_forked_child_starts_with_an_empty_cache_and_a_free_lock():
    proc = run_python(
        """
        import os, threading
        from interop._process import ring_cache
        from interop.pipeline import ring as rings
        from interop.testing import EmulatedDevice

        backend = EmulatedDevice()
        with rings.staging_ring(backend, 2, 1000):
            pass
        held, release = threading.Event(), threading.Event()

        def hold():  # another thread inside the cache at the fork
            with ring_cache._lock:
                held.set()
                release.wait(30)

        t = threading.Thread(target=hold)
        t.start()
        held.wait(30)
        pid = os.fork()
        if pid == 0:
            child = EmulatedDevice()
            r = rings.borrow_ring(child, 1, 1000)  # would hang on the parent's held lock
            rings.return_ring(r)
            print("child", rings.cached_buffers(), child.counts["host_alloc"], flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        release.set()
        t.join()
        print("parent", rings.cached_buffers(), backend.counts["host_alloc"])
        """,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["child", "1", "1", "parent", "2", "2"]


def test_a_cuda_ring_without_a_device_says_so():
    if interop._backends.cupy_device_count() > 0:
        pytest.skip("a CUDA device is visible")
    from interop.pipeline.cuda import cuda_backend

    with pytest.raises(interop.NoDeviceError):
        cuda_backend(0)
