"""SPEC §1.1 and §1.2 on the GPU: CuPy <-> CUDA torch (skipped without a device)."""

from __future__ import annotations

import gc
import warnings

import ml_dtypes
import numpy as np
import pytest

import interop

from .helpers import STANDARD

pytestmark = pytest.mark.gpu


def cptr(c) -> int:
    return int(c.data.ptr)


def test_views_are_zero_copy_both_ways(cp, torch):
    t = torch.arange(12.0, device="cuda").reshape(3, 4)
    for tv in (t, t.T, t[1:, ::2]):
        c = interop.to_cupy(tv, copy=False)
        assert cptr(c) == tv.data_ptr()
        assert c.strides == tuple(s * 4 for s in tv.stride())
    c = interop.to_cupy(t)
    c *= -1  # shared
    assert float(t.sum()) == -66.0
    a = cp.arange(12.0).reshape(3, 4)
    for av in (a, a.T, a[:, 1:3]):
        u = interop.to_torch(av, copy=False)
        assert u.data_ptr() == cptr(av)
        assert u.device.type == "cuda"
        assert tuple(s * 8 for s in u.stride()) == av.strides


def test_requires_grad(cp, torch):
    t = torch.ones(4, device="cuda", requires_grad=True)
    c = interop.to_cupy(t)
    assert cptr(c) == t.data_ptr()
    c[0] = 5
    assert t[0].item() == 5.0


def test_conj_and_neg_bits(cp, torch):
    z = torch.tensor([1 + 2j, 3 - 4j], device="cuda")
    assert cp.asnumpy(interop.to_cupy(z.conj())).tolist() == [1 - 2j, 3 + 4j]
    assert cp.asnumpy(interop.to_cupy(z.conj().imag)).tolist() == [-2.0, 4.0]
    with pytest.raises(interop.CopyRequiredError, match="conjugate bit"):
        interop.to_cupy(z.conj(), copy=False)
    with pytest.raises(interop.CopyRequiredError, match="negative bit"):
        interop.to_cupy(z.conj().imag, copy=False)
    assert interop.to_numpy(z.conj().imag).tolist() == [-2.0, 4.0]
    s = cp.cuda.Stream(non_blocking=True)
    with s:  # the resolved copy is marked as used on CuPy's own stream
        c = interop.to_cupy(z.conj())
        assert cp.asnumpy(c, stream=s).tolist() == [1 - 2j, 3 + 4j]
        with torch.cuda.stream(torch.cuda.ExternalStream(s.ptr)):
            torch.cuda._sleep(500_000_000)  # s is busy ...
        p = cptr(c)
        del c  # ... so PyTorch must not hand the resolved copy out again yet
        again = torch.empty_like(z)  # same size, PyTorch's current stream
        assert not s.done
        assert again.data_ptr() != p
    s.synchronize()


def test_negative_strides_cupy_to_torch(cp, torch):
    a = cp.arange(6.0)
    t = interop.to_torch(a[::-1])
    assert t.tolist() == [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]
    assert t.data_ptr() != cptr(a)
    with pytest.raises(interop.CopyRequiredError, match="negative strides"):
        interop.to_torch(a[::-1], copy=False)


def test_a_packed_copy_waits_for_cupy_and_runs_on_torchs_stream(cp, torch):
    """to_torch of a reversed view copies it on PyTorch's current stream, after
    the kernels still queued on CuPy's stream, without blocking the host."""
    s = cp.cuda.Stream(non_blocking=True)
    side = torch.cuda.Stream()
    with s:
        a = cp.zeros(1 << 20, dtype=cp.float32)
        a += 2.0
        a[::-1].copy()  # compile both kernels before the sleep
        with torch.cuda.stream(torch.cuda.ExternalStream(s.ptr)):
            torch.cuda._sleep(200_000_000)
        a += 2.0
        with torch.cuda.stream(side):
            t = interop.to_torch(a[::-1])
            assert not s.done
            total = t.sum()
    side.synchronize()
    assert total.item() == 4.0 * (1 << 20)
    assert t.data_ptr() != cptr(a)
    # The copy's memory is PyTorch's, allocated on PyTorch's stream `side`: freed,
    # it goes back to PyTorch's pool for that stream, never to CuPy's pool.
    p = t.data_ptr()
    del t
    gc.collect()
    with torch.cuda.stream(side):
        again = torch.empty(1 << 20, dtype=torch.float32, device="cuda")
    assert again.data_ptr() == p


def test_broadcast_to_numpy_is_read_only(cp, torch):
    t = torch.arange(3.0, device="cuda").expand(4, 3)
    n = interop.to_numpy(t)  # a host copy of the values
    assert n.tolist() == [[0.0, 1.0, 2.0]] * 4
    c = interop.to_cupy(t)
    assert c.strides == (0, 4)
    assert cptr(c) == t.data_ptr()


def test_read_only_numpy_to_cupy_is_copied_without_warning(cp):
    a = np.arange(3.0)
    a.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = interop.to_cupy(a)
    assert cp.asnumpy(c).tolist() == [0.0, 1.0, 2.0]


def test_bfloat16_to_cupy_and_float8_refused(cp, torch):
    t = torch.tensor([1.5, -2.0], device="cuda", dtype=torch.bfloat16)
    if interop._backends.cupy_supports_bfloat16():
        c = interop.to_cupy(t)
        assert c.dtype == np.dtype(ml_dtypes.bfloat16)
        assert cptr(c) == t.data_ptr()
        back = interop.to_torch(c)
        assert back.dtype == torch.bfloat16
        assert back.data_ptr() == t.data_ptr()
    else:
        with pytest.raises(interop.UnsupportedDtypeError, match="CuPy >= 14"):
            interop.to_cupy(t)
    f8 = torch.zeros(2, device="cuda", dtype=torch.float8_e4m3fn)
    with pytest.raises(interop.UnsupportedDtypeError, match="float8_e4m3fn"):
        interop.to_cupy(f8)
    n = interop.to_numpy(f8)
    assert n.dtype == np.dtype(ml_dtypes.float8_e4m3fn)


def test_complex32_refused(torch):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        t = torch.zeros(2, device="cuda", dtype=torch.complex32)
    with pytest.raises(interop.UnsupportedDtypeError):
        interop.to_cupy(t)
    with pytest.raises(interop.UnsupportedDtypeError):
        interop.to_numpy(t)


@pytest.mark.parametrize("name", STANDARD)
def test_standard_dtypes_zero_copy(cp, torch, name):
    a = cp.arange(6).astype(name)
    t = interop.to_torch(a, copy=False)
    assert t.dtype == getattr(torch, name)
    assert t.data_ptr() == cptr(a)
    c = interop.to_cupy(t, copy=False)
    assert cptr(c) == cptr(a)
    assert c.dtype == a.dtype


@pytest.mark.parametrize("shape", [(), (0,), (3, 0)])
def test_zero_d_and_zero_size(cp, torch, shape):
    t = torch.zeros(shape, device="cuda")
    c = interop.to_cupy(t)
    assert c.shape == shape
    assert tuple(interop.to_torch(c).shape) == shape
    assert interop.to_numpy(c).shape == shape


def test_device_moves(cp, torch):
    t = torch.arange(4.0, device="cuda")
    n = interop.to_torch(t, device="cpu")
    assert n.device.type == "cpu"
    assert n.tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(interop.CopyRequiredError, match="moving a tensor"):
        interop.to_torch(t, device="cpu", copy=False)
    h = interop.to_torch(np.arange(3.0), device="cuda")
    assert h.device.type == "cuda"
    assert h.tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(interop.CopyRequiredError):
        interop.to_numpy(t, copy=False)
    with pytest.raises(interop.CopyRequiredError):
        interop.to_cupy(np.arange(3.0), copy=False)
    c = interop.to_cupy(torch.arange(3.0).conj())  # a CPU tensor to the device
    assert cp.asnumpy(c).tolist() == [0.0, 1.0, 2.0]


def test_explicit_device_zero_contexts(cp, torch):
    with cp.cuda.Device(0):
        a = cp.arange(5.0)
    t = interop.to_torch(a, device=0)
    assert t.device == torch.device("cuda", 0)
    assert t.data_ptr() == cptr(a)
    c = interop.to_cupy(t, device=cp.cuda.Device(0))
    assert int(c.device.id) == 0
    same = interop.to_cupy(t, device=torch.device("cuda:0"), copy=False)
    assert cptr(same) == t.data_ptr()


def test_an_export_on_the_current_device_switches_no_device(cp, torch):
    from interop import exchange

    assert exchange._torch_export_context(0) is exchange._ALREADY_CURRENT
    t = torch.arange(4.0, device="cuda:0")
    c = interop.to_cupy(t)
    assert cptr(c) == t.data_ptr()
    assert (cp.cuda.runtime.getDevice(), torch.cuda.current_device()) == (0, 0)


@pytest.mark.multigpu
def test_an_export_from_another_device_switches_there_and_back(cp, torch):
    from interop import exchange

    assert exchange._torch_export_context(1) is not exchange._ALREADY_CURRENT
    t = torch.arange(4.0, device="cuda:1")
    c = interop.to_cupy(t)
    assert int(c.device.id) == 1
    assert (cp.cuda.runtime.getDevice(), torch.cuda.current_device()) == (0, 0)
    with cp.cuda.Device(1):
        a = cp.arange(3.0)
    assert interop.to_torch(a).device == torch.device("cuda", 1)
    assert (cp.cuda.runtime.getDevice(), torch.cuda.current_device()) == (0, 0)


@pytest.mark.multigpu
def test_data_on_another_device_stays_there(cp, torch):
    t = torch.arange(4.0, device="cuda:1")
    with cp.cuda.Device(0):
        c = interop.to_cupy(t)
    assert int(c.device.id) == 1
    assert cptr(c) == t.data_ptr()
    with cp.cuda.Device(1):
        a = cp.arange(3.0)
    u = interop.to_torch(a)
    assert u.device == torch.device("cuda", 1)
    moved = interop.to_cupy(a, device=0)
    assert int(moved.device.id) == 0
    assert cp.asnumpy(moved).tolist() == [0.0, 1.0, 2.0]


@pytest.mark.multigpu
def test_a_move_to_another_device_waits_for_the_source_devices_stream(cp, torch):
    """CuPy's peer copy runs on the destination's stream only: the move must
    still see the kernels queued on the source device's current stream."""
    with cp.cuda.Device(1):
        a = cp.arange(1 << 20, dtype=cp.float32)
        a += 0.0  # compile before the sleep: the add ...
        cp.ascontiguousarray(a.reshape(1024, 1024).T)  # ... and the packing of a.T
        torch.cuda.synchronize(1)
        src = cp.cuda.Stream(non_blocking=True)
        with src:
            with torch.cuda.device(1), torch.cuda.stream(torch.cuda.ExternalStream(src.ptr)):
                torch.cuda._sleep(200_000_000)
            a += 1.0  # arange + 1 once the sleep is over
            moved = interop.to_cupy(a, device=0)
            # a strided source is packed on the source device first: the peer copy
            # must wait for the packing too, not only for the add
            moved_t = interop.to_cupy(a.reshape(1024, 1024).T, device=0)
    assert int(moved.device.id) == int(moved_t.device.id) == 0
    expect = np.arange(1 << 20, dtype=np.float32) + 1
    with cp.cuda.Device(0):
        np.testing.assert_array_equal(cp.asnumpy(moved), expect)
        np.testing.assert_array_equal(cp.asnumpy(moved_t), expect.reshape(1024, 1024).T)


def test_lifetime(cp, torch):
    t = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    c = interop.to_cupy(t)
    del t
    gc.collect()
    torch.cuda.empty_cache()
    _ = torch.full((1 << 20,), 5.0, device="cuda")
    assert float(c[12]) == 12.0


def test_no_copy_of_unsupported_objects(cp):
    with pytest.raises(TypeError, match="to_cupy expected"):
        interop.to_cupy([1, 2])


# ----------------------------------------------------------------- stream order


def test_to_cupy_is_ordered_after_torch_side_stream_work(cp, torch):
    """Kernels still running on PyTorch's stream when to_cupy is called: CuPy
    reads the final values on its own stream with no explicit synchronisation,
    and to_cupy itself does not block the host."""
    side = torch.cuda.Stream()
    x = torch.zeros(1 << 20, device="cuda")
    side.wait_stream(torch.cuda.current_stream())  # x's zeros come first
    cupy_stream = cp.cuda.Stream(non_blocking=True)
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # a long kernel
        x.fill_(3.0)
        with cupy_stream:
            c = interop.to_cupy(x)
            assert not side.query()  # still running: no device-wide sync happened
            total = c.sum()  # queued on CuPy's stream, after the event
    cupy_stream.synchronize()
    assert float(total) == 3.0 * (1 << 20)


def test_to_torch_is_ordered_after_cupy_stream_work(cp, torch):
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        a = cp.zeros(1 << 20, dtype=cp.float32)
        a += 2.0  # compiles CuPy's kernel now, not while the sleep below runs
        ext = torch.cuda.ExternalStream(s.ptr)  # torch's sleep kernel, on CuPy's stream
        with torch.cuda.stream(ext):
            torch.cuda._sleep(200_000_000)
        a += 2.0
        t = interop.to_torch(a)  # torch's current stream waits on CuPy's stream
        assert not s.done
    total = t.sum()  # on torch's current (default) stream
    assert total.item() == 4.0 * (1 << 20)
