"""``host_limit``'s spans: ``cudaHostRegister`` locks whole pages and refuses a range sharing a
page with another registration (712); the emulated device refuses it too."""

import itertools
import mmap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from benchmarks.host_limit import register_spans
from interop.testing import EmulatedDevice

PAGE, CHUNK = mmap.PAGESIZE, 64 << 10


@pytest.fixture(params=["emulated", pytest.param("cuda", marks=pytest.mark.gpu)])
def registry(request):
    """``(register(address, nbytes), unregister(address))``: the emulated device's or CUDA's."""
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
    """Spans of an array that starts mid-page cover it in order, meet at page boundaries and
    can all be registered at once from several threads."""
    register, unregister = registry
    view = np.ones(5 * CHUNK + 3 * PAGE, np.uint8)[PAGE // 2 + 8 :]
    base, nbytes = view.ctypes.data, view.nbytes
    spans = register_spans(base, nbytes, CHUNK)
    assert spans[0][0] == base
    assert sum(n for _, n in spans) == nbytes
    assert all(lo + n == after for (lo, n), (after, _) in itertools.pairwise(spans))
    assert all(lo % PAGE == 0 for lo, _ in spans[1:])
    assert all(CHUNK - PAGE < n <= CHUNK + PAGE for _, n in spans[:-1])
    done: list[int] = []
    try:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda s: (register(*s), done.append(s[0])), spans))
        assert sorted(done) == [lo for lo, _ in spans]
    finally:
        for ptr in done:
            unregister(ptr)
