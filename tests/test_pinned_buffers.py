"""interop.empty_pinned and interop.pin: page-locked buffers for reuse.

Without CUDA both refuse with NoDeviceError, after checking their arguments;
the ``gpu`` tests check the page-locking itself and the direct DMAs.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

import interop
from tests.conftest import gpu_count

no_gpu = pytest.mark.skipif(gpu_count() > 0, reason="the no-device paths")


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (((2, -1), np.float32), ValueError, r"sizes >= 0"),
        ((("a", 2), np.float32), TypeError, r"a shape of ints and a NumPy dtype"),
        (((2,), "no such dtype"), TypeError, r"a shape of ints and a NumPy dtype"),
        (((2,), object), ValueError, r"without Python objects"),
        # sizes that are not integers (numpy.empty refuses them too), before the device
        (((3.0,), np.float32), TypeError, r"a shape of ints .*\(got shape=\(3.0,\)"),
        ((2.5, np.float32), TypeError, r"\(got shape=2.5"),
        ((("3",), np.float32), TypeError, r"\(got shape=\('3',\)"),
        (("3", np.float32), TypeError, r"\(got shape='3'"),
        (((np.float64(2), 2), np.float32), TypeError, r"a shape of ints"),
        # more bytes than an address space holds
        (
            ((1 << 40, 1 << 40), np.float32),
            ValueError,
            r"at most \d+ bytes \(got shape \(1099511627776, 1099511627776\) of float32",
        ),
    ],
)
def test_empty_pinned_checks_its_arguments_first(args, error, match):
    with pytest.raises(error, match=match) as info:
        interop.empty_pinned(*args)
    assert isinstance(info.value, interop.InteropError)
    assert not isinstance(info.value, interop.NoDeviceError)


def test_empty_pinned_takes_any_integral_size():
    """``numpy.int64`` sizes and a bare int pass the checks (then, without a
    device, NoDeviceError; with one, the array)."""
    for shape in ((np.int64(2), 3), np.int32(6), 6):
        try:
            a = interop.empty_pinned(shape, np.float32)
        except interop.NoDeviceError:
            assert gpu_count() == 0
        else:
            assert a.size == 6


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: [1.0, 2.0], TypeError, r"pin expected a NumPy array \(got builtins.list"),
        (lambda: np.zeros(8)[::2], ValueError, r"a contiguous array \(got strides \(16,\)\)"),
        (lambda: np.broadcast_to(np.zeros(1), (8,)), ValueError, r"a writable array"),
        (lambda: np.zeros(0), ValueError, r"an array with data"),
        (lambda: np.array([None, 1]), ValueError, r"without Python objects \(got object\)"),
        (lambda: np.zeros(8, dtype="i4,O"), ValueError, r"without Python objects"),
    ],
)
def test_pin_checks_its_argument_first(make, error, match):
    with pytest.raises(error, match=match) as info:
        interop.pin(make())
    assert isinstance(info.value, interop.InteropError)
    assert not isinstance(info.value, interop.NoDeviceError)


@no_gpu
def test_without_a_device_both_raise_no_device_error():
    with pytest.raises(interop.NoDeviceError, match="CUDA device"):
        interop.empty_pinned((4, 4), np.float32)
    a = np.zeros(16)
    with pytest.raises(interop.NoDeviceError, match="CUDA device"):
        interop.pin(a)
    a[:] = 1  # untouched and usable
    assert a.sum() == 16


@pytest.mark.gpu
def test_gpu_empty_pinned_is_page_locked_and_copied_by_dma_alone(cp):
    from interop.pipeline.cuda import cuda_backend
    from interop.pipeline.ring import cached_rings, free_cached_rings

    free_cached_rings()
    a = interop.empty_pinned((1024, 256), np.float32)
    assert a.flags.c_contiguous
    assert a.flags.writeable
    assert a.dtype == np.float32
    assert cuda_backend(0).is_pinned(a.ctypes.data, a.nbytes)
    x = cp.arange(a.size, dtype=cp.float32).reshape(a.shape)
    assert interop.copy_to_host(x, a, chunk_bytes=1 << 20) is a
    np.testing.assert_array_equal(a, cp.asnumpy(x))
    back = interop.copy_to_device(a)
    np.testing.assert_array_equal(cp.asnumpy(back), a)
    assert cached_rings() == 0  # no staging ring was borrowed
    b = interop.empty_pinned(7, "bfloat16")
    assert (b.shape, b.dtype.name) == ((7,), "bfloat16")
    del a, b
    gc.collect()  # freed (cudaFreeHost) with the last reference


@pytest.mark.gpu
def test_gpu_pin_registers_in_place_and_unpins(cp):
    from interop.pipeline.cuda import cuda_backend

    backend = cuda_backend(0)
    a = np.zeros((512, 512), np.float32)
    with interop.pin(a) as pinned:
        assert pinned is a
        assert backend.is_pinned(a.ctypes.data, a.nbytes)
        x = cp.full(a.shape, 3.0, dtype=cp.float32)
        interop.copy_to_host(x, a)
        assert (a == 3.0).all()
        with pytest.raises(ValueError, match="page-locked already"):
            interop.pin(a)
    assert not backend.is_pinned(a.ctypes.data, a.nbytes)
    handle = interop.pin(a)
    assert handle.pinned
    handle.unpin()
    handle.unpin()  # idempotent
    assert not handle.pinned
    assert not backend.is_pinned(a.ctypes.data, a.nbytes)
    with pytest.raises(ValueError, match="page-locked already"):
        interop.pin(interop.empty_pinned(16, np.float32))


@pytest.mark.gpu
def test_gpu_a_dropped_handle_unpins_and_a_file_mapping_is_pinned_or_refused(cp, tmp_path):
    from interop.pipeline.cuda import cuda_backend

    backend = cuda_backend(0)
    a = np.zeros(1 << 16, np.float64)
    interop.pin(a)  # dropped at once
    gc.collect()
    assert not backend.is_pinned(a.ctypes.data, a.nbytes)
    m = np.lib.format.open_memmap(tmp_path / "m.npy", mode="w+", dtype=np.float32, shape=(4096,))
    try:
        handle = interop.pin(m)
    except ValueError as exc:  # the driver may refuse file-backed pages: clearly, and nothing kept
        refused = str(exc)
    else:
        refused = ""
        assert backend.is_pinned(m.ctypes.data, m.nbytes)
        handle.unpin()
    assert not refused or "can page-lock" in refused
    assert not backend.is_pinned(m.ctypes.data, m.nbytes)
