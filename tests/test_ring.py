"""Staging rings and their cache, with the host backend's pinned buffers (and
CUDA's under the ``gpu`` marker)."""

from __future__ import annotations

import pytest

import interop
from interop.pipeline import ring as rings
from interop.pipeline.host import HostBackend, HostDeviceError
from interop.pipeline.ring import StagingRing, cached_rings, free_cached_rings, staging_ring


@pytest.fixture
def backend():
    free_cached_rings()
    b = HostBackend()
    yield b
    free_cached_rings()
    assert b.host_buffers == {}
    b.close()


def test_a_ring_holds_exact_buffers_and_frees_them(backend):
    with StagingRing(backend, 3, 1000) as ring:
        assert len(ring.ptrs) == 3
        assert [a.nbytes for a in ring.arrays] == [1000] * 3
        ring.arrays[2][:] = 7
        assert not ring.closed
    assert ring.closed
    ring.free()  # idempotent


def test_the_cache_lends_each_ring_once_and_stays_bounded(backend):
    with staging_ring(backend, 2, 64) as a, staging_ring(backend, 2, 64) as b:
        assert a is not b  # concurrent transfers never share a ring
    with staging_ring(backend, 2, 64) as c:
        assert c in (a, b)
    with pytest.raises(RuntimeError), staging_ring(backend, 2, 64) as failed:
        raise RuntimeError
    assert failed.closed
    lent = []
    for size in range(100, 110):  # sizes seen once each
        with staging_ring(backend, 1, size) as ring:
            lent.append(ring)
    assert cached_rings() == rings._RINGS_KEPT_TOTAL
    assert [r.closed for r in lent[-4:]] == [False] * 4  # the most recent are kept
    assert all(r.closed for r in lent[:-4])
    free_cached_rings()
    assert cached_rings() == 0
    assert all(r.closed for r in lent)


def test_rings_of_two_backends_are_never_mixed(backend):
    other = HostBackend()
    with staging_ring(backend, 1, 64) as mine:
        pass
    with staging_ring(other, 1, 64) as theirs:
        assert theirs is not mine
        assert theirs.backend is other
    free_cached_rings()
    other.close()


def test_free_tries_every_buffer_and_raises_the_first_failure():
    backend = HostBackend(faults={"host_free": 2})
    ring = StagingRing(backend, 4, 256)
    with pytest.raises(HostDeviceError, match="freeing pinned buffer"):
        ring.free()
    assert backend.counts["host_free"] == 4
    assert len(backend.host_buffers) == 1
    assert ring.closed
    backend.close()


def test_a_failing_free_never_replaces_the_error_in_flight():
    backend = HostBackend(faults={"host_free": 1})
    with pytest.raises(KeyError, match="the original") as info, StagingRing(backend, 2, 64):
        raise KeyError("the original")
    assert any("freeing the staging ring also failed" in n for n in info.value.__notes__)
    assert backend.counts["host_free"] == 2
    backend.close()


def test_a_failed_allocation_frees_what_it_had():
    backend = HostBackend(faults={"host_alloc": 3})
    with pytest.raises(HostDeviceError, match="pinned host allocation failed"):
        StagingRing(backend, 4, 64)
    assert backend.host_buffers == {}
    backend.close()


def test_a_cuda_ring_without_a_device_says_so():
    if interop._backends.cupy_device_count() > 0:
        pytest.skip("a CUDA device is visible")
    from interop.pipeline.cuda import cuda_backend

    with pytest.raises(interop.NoDeviceError):
        cuda_backend(0)


@pytest.mark.gpu
def test_gpu_staging_ring_is_exact_cached_and_freed_on_error(cp):
    from interop.pipeline.cuda import cuda_backend

    backend = cuda_backend(0)
    with StagingRing(backend, 3, 1000) as ring:
        assert len(ring.ptrs) == 3
        assert [a.nbytes for a in ring.arrays] == [1000] * 3
        ring.arrays[2][:] = 7  # host-writable
    assert ring.closed
    key = ("cuda", 2, 4096)
    with staging_ring(backend, 2, 4096) as lent:
        pass
    assert lent in rings._ring_cache[key]
    with staging_ring(backend, 2, 4096) as again:
        assert again is lent  # reused, and not lent twice meanwhile
        assert lent not in rings._ring_cache[key]
    with pytest.raises(RuntimeError, match="boom"), staging_ring(backend, 2, 4096) as failed:
        raise RuntimeError("boom")
    assert failed.closed
    assert failed not in rings._ring_cache.get(key, [])
