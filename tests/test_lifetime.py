"""Cross-stream lifetime and graph capture on the emulated device.

Its pool follows the real allocators' rule (a freed block goes straight to the
next allocation on the stream it belongs to) and fails a test when a block is
handed out again while work queued on another stream before the free may still
use it. Each device copy interop makes between two streams is exercised here in
the configuration of a call that uses it: the source is dropped as soon as the
call returns and its block is taken back at once on its owner's stream, while
the copy is still held back on the destination's stream. The same cases run on
a GPU in tests/test_lifetime_gpu.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import interop
from interop.testing import EmulatedDevice

from .helpers import hold, inverted_bytes, sample

SHAPE = (96, 40)

# The device copies of the exchange and transfer calls, as (source library,
# destination library, source view, destination device): each call's copy is
# interop.copy_to_device(x, out) in that configuration.
SITES = {
    # copy_to_device(tensor, cupy_out), and to_cupy(t, copy=True)
    "torch to cupy": ("torch", "cupy", lambda a: a, 0),
    # to_torch(c, copy=True)
    "cupy to torch": ("cupy", "torch", lambda a: a, 0),
    # to_torch(c) of a reversed view: the packing copy
    "cupy to torch, packed": ("cupy", "torch", lambda a: a[::-1, ::-1], 0),
    # to_torch(c, device=other)
    "cupy to torch on another device": ("cupy", "torch", lambda a: a, 1),
    # to_cupy(t, device=other), and a CuPy array's move
    "torch to cupy on another device": ("torch", "cupy", lambda a: a, 1),
    # copy_to_device(x, out) across devices, strided: one peer copy of its span
    "cupy to cupy on another device, strided": ("cupy", "cupy", lambda a: a.T, 1),
}


@pytest.fixture
def machine():
    d0 = EmulatedDevice(devices=2, delay=0.0002)
    yield d0
    d0.close()


@pytest.mark.parametrize("site", list(SITES))
def test_a_copied_source_may_be_dropped_as_soon_as_the_call_returns(machine, site):
    src_lib, dst_lib, view, dst_index = SITES[site]
    dx, dout = machine, machine.peer(dst_index)
    a = sample(SHAPE, np.float32)
    expect = view(a)
    owner, consumer = dx.stream(), dout.stream()
    with dx.use_stream(owner, lib=src_lib):
        x = dx.asarray(a, lib=src_lib)  # allocated and written on owner
    with dout.activate(), dout.use_stream(consumer, lib=dst_lib):
        out = dout.empty(expect.shape, expect.dtype, lib=dst_lib)  # on consumer
    gate = hold(consumer)  # the copy below stays queued behind this
    try:
        with (
            dout.activate(),
            dout.use_stream(consumer, lib=dst_lib),
            dx.use_stream(owner, lib=src_lib),
        ):
            interop.copy_to_device(view(x), out)
        del x  # a copying call returned: the caller may drop its source
        with dx.use_stream(owner, lib=src_lib):
            fresh = dx.asarray(np.zeros_like(a), lib=src_lib)  # x's block, written now
    finally:
        gate.set()
    np.testing.assert_array_equal(dout.to_numpy(out), expect)
    np.testing.assert_array_equal(dx.to_numpy(fresh), np.zeros_like(a))
    assert machine.violations == []


def test_a_resolved_temporary_and_its_source_may_be_dropped_at_once(machine):
    """A source with a bit to apply (the emulated inverted view, as a CUDA tensor
    with the conjugate bit) is resolved into a temporary on its stream: both it
    and the source may be reused at once on that stream."""
    a = sample(SHAPE, np.float32)
    owner, consumer = machine.stream(), machine.stream()
    with machine.use_stream(owner, lib="torch"):
        x = machine.asarray(a, lib="torch")
    with machine.use_stream(consumer, lib="cupy"):
        out = machine.empty(a.shape, a.dtype)
    gate = hold(consumer)
    try:
        with machine.use_stream(consumer, lib="cupy"), machine.use_stream(owner, lib="torch"):
            interop.copy_to_device(machine.inverted(x), out)
        del x
        with machine.use_stream(owner, lib="torch"):
            # two blocks of that size on owner: the source's and the temporary's
            fresh = [machine.asarray(np.zeros_like(a), lib="torch") for _ in range(2)]
    finally:
        gate.set()
    assert machine.to_numpy(out).tobytes() == inverted_bytes(a)
    for f in fresh:
        np.testing.assert_array_equal(machine.to_numpy(f), np.zeros_like(a))
    assert machine.violations == []


def test_one_stream_needs_no_events(machine):
    """Both libraries on one stream: stream order covers both directions, and no
    event is made for the copy."""
    a = sample(SHAPE, np.float32)
    s = machine.stream()
    with machine.use_stream(s):
        x = machine.asarray(a, lib="torch")
        out = machine.empty(a.shape, a.dtype)
        before = machine.counts["event"]
        interop.copy_to_device(x, out)
        assert machine.counts["event"] == before
        del x
        fresh = machine.asarray(np.zeros_like(a), lib="torch")
    np.testing.assert_array_equal(machine.to_numpy(out), a)
    np.testing.assert_array_equal(machine.to_numpy(fresh), np.zeros_like(a))
    assert machine.violations == []


# ----------------------------------------------------------------- graph capture


def _refused_in_capture(machine, s, call):
    """Run ``call`` inside a capture on ``s``: it must raise CaptureError and
    leave the capture valid, with nothing recorded into it."""
    with machine.capture(s) as graph:
        with pytest.raises(interop.CaptureError, match="capture"):
            call()
        assert machine.is_capturing(s)
    assert graph.operations == []
    assert machine.violations == []


def test_host_copies_refuse_a_capture_and_keep_it_valid(machine, tmp_path):
    a = np.arange(4096.0)
    s = machine.stream()
    with machine.use_stream(s):
        x = machine.asarray(a)
        s.synchronize()
        path = tmp_path / "x.npy"
        np.save(path, a[::-1])
        before = path.read_bytes()
        for call in (
            lambda: interop.copy_to_host(x),
            lambda: interop.copy_to_host_async(x),
            lambda: interop.copy_to_device(a, x),
            lambda: interop.save_npy(x, path),
            lambda: interop.load_npy(path, x),
        ):
            _refused_in_capture(machine, s, call)
        assert path.read_bytes() == before  # the save refused before touching it
        np.testing.assert_array_equal(machine.to_numpy(x), a)


def test_a_capture_elsewhere_on_the_device_refuses_host_copies(machine):
    """CUDA's global capture mode: a pinned allocation or a synchronisation
    breaks a capture on any stream, so host copies refuse then too."""
    a = np.arange(1024.0)
    s, other = machine.stream(), machine.stream()
    with machine.use_stream(other):
        x = machine.asarray(a)
        other.synchronize()
        _refused_in_capture(machine, s, lambda: interop.copy_to_host(x))


def test_a_device_copy_into_a_capturing_stream_from_outside_it_is_refused(machine):
    """The destination's stream captures, the source's does not: waiting on the
    source would break the capture (cudaErrorStreamCaptureIsolation), so the
    copy is refused before anything is queued."""
    a = sample(SHAPE, np.float32)
    s, c = machine.stream(), machine.stream()
    with machine.use_stream(s, lib="torch"), machine.use_stream(c, lib="cupy"):
        x = machine.asarray(a, lib="torch")
        out = machine.asarray(np.zeros_like(a))
        machine.synchronize()
        _refused_in_capture(machine, c, lambda: interop.copy_to_device(x, out))
        np.testing.assert_array_equal(machine.to_numpy(out), np.zeros_like(a))
