"""The ``host_limit`` row's pinning rate by chunks: the spans it registers.

``cudaHostRegister`` locks whole pages, and refuses a range that shares a page
with a registration already made (error 712). The emulated device refuses it
too, so the spans are checked on a CPU; the ``[cuda]`` half asks the driver.
"""

from __future__ import annotations

import itertools
import mmap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from benchmarks.host_limit import register_spans
from interop.testing import EmulatedDevice

PAGE = mmap.PAGESIZE
CHUNK = 64 << 10


@pytest.fixture(params=["emulated", pytest.param("cuda", marks=pytest.mark.gpu)])
def registry(request):
    """``(register(address, nbytes), unregister(address))`` of host memory: the
    emulated device's, or CUDA's (``cudaHostRegister`` / ``cudaHostUnregister``)."""
    if request.param == "emulated":
        device = EmulatedDevice()
        yield device.host_register, device.host_unregister
        assert device.machine.registered == {}
        device.close()
        return
    import cupy

    runtime = cupy.cuda.runtime
    yield (lambda ptr, n: runtime.hostRegister(ptr, n, 0)), runtime.hostUnregister


def test_chunks_registered_at_once_from_threads_share_no_page(registry):
    """An array that starts mid-page, cut into chunks: the spans cover it exactly,
    in order, meet at page boundaries, and can all be registered at the same
    time from several threads (as the row's threads may)."""
    register, unregister = registry
    host = np.ones(5 * CHUNK + 3 * PAGE, np.uint8)
    view = host[PAGE // 2 + 8 :]  # not page-aligned, as np.ones' memory need not be
    base, nbytes = view.ctypes.data, view.nbytes
    spans = register_spans(base, nbytes, CHUNK)
    assert spans[0][0] == base
    assert sum(n for _, n in spans) == nbytes
    assert all(lo + n == after for (lo, n), (after, _) in itertools.pairwise(spans))
    assert all(lo % PAGE == 0 for lo, _ in spans[1:])
    assert all(CHUNK - PAGE < n <= CHUNK + PAGE for _, n in spans[:-1])
    assert 0 < spans[-1][1] <= CHUNK + PAGE
    done: list[int] = []

    def pin(span: tuple[int, int]) -> None:
        register(*span)
        done.append(span[0])

    try:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(pin, spans))  # every span registered at once
        assert sorted(done) == [lo for lo, _ in spans]
    finally:
        for ptr in done:
            unregister(ptr)
