"""to_numpy / to_torch / to_cupy: the exchange between libraries, and generic
DLPack producers.

The tests of what holds on both sides take the ``side`` fixture: NumPy and CPU
tensors always, CuPy and CUDA tensors under the ``gpu`` marker; one body each.
The CUDA-only tests at the end are about what only CUDA has: streams, devices,
CuPy's dtypes."""

from __future__ import annotations

import gc
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import interop
from tests.helpers import STANDARD, Producer, run_python


def ptr(x) -> int:
    if isinstance(x, np.ndarray):
        return x.__array_interface__["data"][0]
    if hasattr(x, "data_ptr"):
        return x.data_ptr()
    return int(x.data.ptr)  # a CuPy array


class Side:
    """One side of the exchange: NumPy and CPU tensors ("host"), or CuPy and
    CUDA tensors ("cuda")."""

    def __init__(self, name: str) -> None:
        self.name = name
        if name == "host":
            self.xp, self.to_xp, self.device = np, interop.to_numpy, "cpu"
        else:
            import cupy

            self.xp, self.to_xp, self.device = cupy, interop.to_cupy, "cuda"

    def asnumpy(self, x) -> np.ndarray:
        return np.asarray(x) if self.name == "host" else self.xp.asnumpy(x)

    def tolist(self, x) -> list:
        return self.asnumpy(x).tolist()

    def need_dtype(self, name: str) -> None:
        """Skip on CUDA where CuPy cannot hold ``name`` (bfloat16 before CuPy 14)."""
        if self.name == "cuda":
            from interop import dtypes

            try:
                dtypes.check_cupy_dtype(np.dtype(getattr(ml_dtypes, name, name)))
            except interop.UnsupportedDtypeError as exc:
                pytest.skip(str(exc))


@pytest.fixture(params=["host", pytest.param("cuda", marks=pytest.mark.gpu)])
def side(request) -> Side:
    """NumPy and CPU tensors; CuPy and CUDA tensors (marked ``gpu``)."""
    return Side(request.param)


# ----------------------------------------------------------------- views


@pytest.mark.parametrize(
    "view",
    [lambda a: a, lambda a: a.T, lambda a: a[1:, ::2], lambda a: a[:, 1], lambda a: a[:, 1:3]],
    ids=["contiguous", "transposed", "sliced", "column", "columns"],
)
def test_strided_views_are_zero_copy_both_ways(torch, side, view):
    base = side.xp.arange(12.0).reshape(3, 4)
    a = view(base)
    t = interop.to_torch(a, copy=False)
    assert ptr(t) == ptr(a)
    assert t.device.type == side.device
    assert t.stride() == tuple(s // 8 for s in a.strides)
    t.mul_(-1)  # shared: the other library sees the write
    np.testing.assert_array_equal(side.asnumpy(a), t.cpu().numpy())
    assert (side.asnumpy(a) <= 0).all()
    back = side.to_xp(t)
    assert ptr(back) == ptr(t)
    assert back.strides == a.strides
    tb = torch.arange(12.0, device=side.device).reshape(3, 4)
    for tv in (tb, tb.T, tb[1:, ::2]):
        n = side.to_xp(tv, copy=False)
        assert ptr(n) == ptr(tv)
        assert n.strides == tuple(s * 4 for s in tv.stride())
    c = side.to_xp(tb)
    c *= -1  # shared
    assert float(tb.sum()) == -66.0


def test_same_library_returns_the_input():
    a = np.arange(3.0)
    assert interop.to_numpy(a) is a
    c = interop.to_numpy(a, copy=True)
    c[0] = 9
    assert a[0] == 0


def test_torch_to_torch_keeps_or_clones(torch):
    t = torch.arange(4.0)
    assert interop.to_torch(t) is t
    c = interop.to_torch(t, copy=True)
    c[0] = 5
    assert t[0] == 0


# ----------------------------------------------------------------- autograd


def test_requires_grad_is_a_detached_zero_copy_view(torch, side):
    t = torch.arange(3.0, requires_grad=True, device=side.device)
    n = side.to_xp(t)
    assert ptr(n) == ptr(t)
    n[0] = 7.0
    assert t[0].item() == 7.0
    d = interop.to_torch(t)
    assert not d.requires_grad
    assert ptr(d) == ptr(t)
    assert side.tolist(side.to_xp(t, copy=False)) == [7.0, 1.0, 2.0]


def test_a_fake_tensor_has_no_data_to_give(torch):
    """A FakeTensor (torch.compile and torch.export trace with them) has a
    shape and a dtype but no data: refused by name, before any device."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.ones(3)
        traced = torch.ones(3, requires_grad=True)
    expected = r"expected a tensor with data \(got a FakeTensor"
    for call in (
        lambda: interop.to_numpy(fake),  # today: a bare RuntimeError from .numpy()
        lambda: interop.to_numpy(fake, copy=True),
        lambda: interop.to_numpy(traced),
        lambda: interop.to_cupy(fake),  # today: NoDeviceError here, whatever the argument
    ):
        with pytest.raises(interop.InvalidValueError, match=expected):
            call()
    assert interop.to_torch(fake) is fake  # torch to torch needs no data: as it is


@pytest.mark.parametrize("transform", ["grad", "vmap", "jacrev", "vmap(grad)"])
def test_inside_a_torch_func_transform_a_tensor_has_no_data_to_give(torch, transform):
    def f(x):
        interop.to_numpy(x)  # today: a bare RuntimeError from PyTorch
        return (x * x).sum()

    func = torch.func
    run = {
        "grad": lambda: func.grad(f)(torch.ones(3)),
        "vmap": lambda: func.vmap(f)(torch.ones(2, 3)),
        "jacrev": lambda: func.jacrev(f)(torch.ones(3)),
        "vmap(grad)": lambda: func.vmap(func.grad(f))(torch.ones(2, 3)),
    }[transform]
    with pytest.raises(interop.InvalidValueError, match=r"inside a torch\.func transform") as info:
        run()
    assert "call to_numpy outside the transform" in str(info.value)
    assert interop.to_numpy(torch.ones(3)).tolist() == [1.0, 1.0, 1.0]  # outside: as ever


# ----------------------------------------------------------------- conj / neg bits


def test_conj_bit_gives_conjugated_values_as_a_copy(torch, side):
    z = torch.tensor([1 + 2j, 3 - 4j], device=side.device)
    zc = z.conj()
    assert zc.is_conj()
    n = side.to_xp(zc)
    assert side.tolist(n) == [1 - 2j, 3 + 4j]
    assert ptr(n) != ptr(z)
    with pytest.raises(interop.CopyRequiredError, match="conjugate bit") as info:
        side.to_xp(zc, copy=False)
    assert isinstance(info.value, BufferError)
    assert "copy=None or copy=True" in str(info.value)


def test_neg_bit_gives_negated_values(torch, side):
    z = torch.tensor([1 + 2j, 3 - 4j], device=side.device)
    im = z.conj().imag
    assert im.is_neg()
    assert side.tolist(side.to_xp(im)) == [-2.0, 4.0]
    assert interop.to_numpy(im).tolist() == [-2.0, 4.0]  # to the host from either side
    if side.name == "host":  # what the libraries do on their own: the bit is silently ignored
        assert np.from_dlpack(im).tolist() == [2.0, -4.0]
    with pytest.raises(interop.CopyRequiredError, match="negative bit"):
        side.to_xp(im, copy=False)
    assert side.tolist(side.to_xp(im, copy=True)) == [-2.0, 4.0]


def test_conj_through_a_generic_producer_is_refused_by_torch(torch):
    # torch's own __dlpack__ refuses conj tensors; interop resolves them first
    z = torch.tensor([1 + 1j]).conj()
    with pytest.raises(BufferError):
        np.from_dlpack(z)
    assert interop.to_numpy(z).tolist() == [1 - 1j]


# ----------------------------------------------------------------- negative strides


def test_negative_strides_to_torch_are_copied(torch, side):
    a = side.xp.arange(6.0)
    r = interop.to_torch(a[::-1])
    assert r.device.type == side.device
    assert r.tolist() == [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]
    assert ptr(r) != ptr(a)
    r[0] = -1
    assert float(a[5]) == 5.0  # a copy
    m = side.xp.arange(12).reshape(3, 4)[::-1, ::2]
    assert interop.to_torch(m).tolist() == side.tolist(m)
    with pytest.raises(interop.CopyRequiredError, match=r"negative strides \(-8,\)"):
        interop.to_torch(a[::-1], copy=False)


def test_negative_strides_through_a_generic_producer(torch):
    a = np.arange(6.0)[::-1]
    assert interop.to_torch(Producer(a)).tolist() == a.tolist()


def test_negative_strides_never_abort_the_process():
    proc = run_python(
        """
        import numpy as np, interop
        class P:
            def __init__(s, a): s.a = a
            def __dlpack__(s, **k): return s.a.__dlpack__(**k)
            def __dlpack_device__(s): return s.a.__dlpack_device__()
        a = np.arange(6.0)[::-1]
        print(interop.to_torch(a).tolist(), interop.to_torch(P(a)).tolist())
        try:
            interop.to_torch(a, copy=False)
        except interop.CopyRequiredError:
            print("refused")
        """
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split("\n")
    assert lines[0] == "[5.0, 4.0, 3.0, 2.0, 1.0, 0.0] [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]"
    assert lines[1] == "refused"


# ----------------------------------------------------------------- broadcast / read-only


def test_an_expanded_tensor_is_shared_with_its_zero_strides(torch, side):
    t = torch.arange(3.0, device=side.device).expand(4, 3)
    n = side.to_xp(t)
    assert n.strides == (0, 4)
    assert ptr(n) == ptr(t)
    assert interop.to_numpy(t).tolist() == [[0.0, 1.0, 2.0]] * 4  # to the host from either side
    if side.name == "host":  # NumPy can say read-only (CuPy arrays have no such flag)
        assert not n.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            n[0, 0] = 1


def test_broadcast_numpy_stays_read_only():
    a = np.broadcast_to(np.arange(3.0), (4, 3))
    assert not interop.to_numpy(a).flags.writeable
    writable = np.lib.stride_tricks.as_strided(np.arange(3.0), (4, 3), (0, 8))
    n = interop.to_numpy(writable)
    assert ptr(n) == ptr(writable)
    assert not n.flags.writeable


def test_read_only_numpy_to_torch_warns_and_shares(torch):
    a = np.arange(3.0)
    a.flags.writeable = False
    with pytest.warns(interop.ReadOnlyWarning, match="read-only") as record:
        t = interop.to_torch(a)
    assert len(record) == 1  # ours only, not torch's own warning as well
    assert issubclass(interop.ReadOnlyWarning, UserWarning)
    assert ptr(t) == ptr(a)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = interop.to_torch(a, copy=True)  # a writable copy: no warning
    assert ptr(c) != ptr(a)


def test_the_read_only_warning_points_at_the_line_that_called_to_torch(torch):
    a = np.arange(3.0)
    a.flags.writeable = False
    with pytest.warns(interop.ReadOnlyWarning) as record:
        interop.to_torch(a)
    assert record[0].filename == __file__


def test_read_only_source_to_numpy_is_read_only(torch):
    a = np.arange(3.0)
    a.flags.writeable = False
    assert not interop.to_numpy(a).flags.writeable
    via = interop.to_numpy(Producer(a))
    assert not via.flags.writeable
    assert ptr(via) == ptr(a)


# ----------------------------------------------------------------- dtypes


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_ml_dtypes_zero_copy_both_ways(torch, name):
    t = torch.tensor([0.5, -1.5, 2.0, 448.0 if "e4m3" in name else 4.0]).to(getattr(torch, name))
    n = interop.to_numpy(t)
    assert n.dtype == np.dtype(getattr(ml_dtypes, name))
    assert ptr(n) == ptr(t)
    np.testing.assert_array_equal(n.astype(np.float32), t.float().numpy())
    back = interop.to_torch(n)
    assert back.dtype == getattr(torch, name)
    assert ptr(back) == ptr(t)
    assert interop.to_numpy(t, copy=False).dtype == n.dtype


def test_complex32_is_unsupported(torch, side):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: ComplexHalf is experimental
        t = torch.zeros(2, dtype=torch.complex32, device=side.device)
    with pytest.raises(interop.UnsupportedDtypeError, match=r"torch.complex32.*complex64") as info:
        interop.to_numpy(t)
    assert isinstance(info.value, TypeError)
    with pytest.raises(interop.UnsupportedDtypeError, match="complex32"):
        side.to_xp(t)


@pytest.mark.parametrize("name", STANDARD)
def test_standard_dtypes_zero_copy_both_ways(torch, side, name):
    a = side.xp.arange(6).astype(name).reshape(2, 3)
    t = interop.to_torch(a, copy=False)
    assert t.dtype == getattr(torch, name)
    assert t.device.type == side.device
    assert ptr(t) == ptr(a)
    n = side.to_xp(t, copy=False)
    assert n.dtype == np.dtype(name)
    assert ptr(n) == ptr(a)
    np.testing.assert_array_equal(side.asnumpy(n), side.asnumpy(a))


def test_object_and_string_arrays_are_unsupported():
    with pytest.raises(interop.UnsupportedDtypeError, match="dtype PyTorch supports"):
        interop.to_torch(np.array(["a", "b"]))
    with pytest.raises(interop.UnsupportedDtypeError):
        interop.to_torch(np.array([object()]))


def test_non_native_byte_order_is_copied(torch):
    a = np.arange(3, dtype=">i4")
    t = interop.to_torch(a)
    assert t.tolist() == [0, 1, 2]
    assert t.dtype == torch.int32
    with pytest.raises(interop.CopyRequiredError, match="byte order"):
        interop.to_torch(a, copy=False)


# ----------------------------------------------------------------- shapes


@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3), (3, 0)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "uint16"])
def test_zero_d_and_zero_size(torch, side, shape, dtype):
    side.need_dtype(dtype)
    t = torch.zeros(shape, dtype=getattr(torch, dtype), device=side.device)
    n = side.to_xp(t)
    assert n.shape == shape
    assert n.dtype.name == dtype
    back = interop.to_torch(n)
    assert tuple(back.shape) == shape
    assert back.dtype == t.dtype
    assert back.device.type == side.device
    assert interop.to_numpy(n).shape == shape


# ----------------------------------------------------------------- devices


def test_device_cpu_keeps_host_data(torch):
    a = np.arange(3.0)
    assert ptr(interop.to_torch(a, device="cpu")) == ptr(a)
    assert ptr(interop.to_torch(a, device=torch.device("cpu"), copy=False)) == ptr(a)


def test_device_move_with_copy_false_is_refused_first():
    with pytest.raises(interop.CopyRequiredError, match="moving a NumPy array to cuda:0"):
        interop.to_torch(np.arange(3.0), device="cuda:0", copy=False)


def test_cuda_targets_without_a_device(torch):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    with pytest.raises(interop.NoDeviceError, match=r"torch.cuda.is_available\(\) is False"):
        interop.to_torch(np.arange(3.0), device="cuda")
    with pytest.raises(interop.NoDeviceError, match=r"cupy.cuda.is_available\(\) is False") as i:
        interop.to_cupy(np.arange(3.0))
    assert isinstance(i.value, RuntimeError)
    with pytest.raises(interop.NoDeviceError):
        interop.to_cupy(torch.arange(3.0))


@pytest.mark.parametrize(
    ("device", "exc", "pattern"),
    [
        ("gpu", ValueError, r"'cpu', 'cuda' or 'cuda:N' \(got 'gpu'\)"),
        (-1, ValueError, r"index >= 0 \(got -1\)"),
        (True, TypeError, r"expected a device \(got True\)"),
        (1.5, TypeError, r"expected a device: .*got builtins.float"),
    ],
)
def test_bad_devices(device, exc, pattern):
    with pytest.raises(exc, match=pattern):
        interop.to_torch(np.arange(3.0), device=device)


def test_torch_devices_say_where(torch):
    a = np.arange(3.0)
    assert interop.to_torch(a, device=torch.device("cpu", 0)).data_ptr() == a.ctypes.data
    with pytest.raises(interop.InvalidValueError, match=r"\(got 'meta'\)"):
        interop.to_torch(a, device=torch.device("meta"))


def test_to_cupy_refuses_cpu_device():
    with pytest.raises(ValueError, match="to_cupy expected a CUDA device"):
        interop.to_cupy(np.arange(3.0), device="cpu")


# ----------------------------------------------------------------- bad input


@pytest.mark.parametrize("func", [interop.to_numpy, interop.to_torch, interop.to_cupy])
@pytest.mark.parametrize("value", [[1, 2], "abc", None, 3])
def test_unsupported_objects(func, value):
    with pytest.raises(TypeError, match=rf"{func.__name__} expected a NumPy array.*\(got builtins"):
        func(value)


@pytest.mark.parametrize("func", [interop.to_numpy, interop.to_torch, interop.to_cupy])
def test_an_emulated_device_array_is_refused_as_not_an_array(func):
    """The emulated device's arrays move with copy_to_host/copy_to_device only;
    each exchange function refuses them alike, before asking for a library."""
    from interop.testing import EmulatedDevice

    device = EmulatedDevice(delay=0.0)
    try:
        x = device.asarray(np.arange(3.0))
        with pytest.raises(interop.InvalidTypeError, match=r"expected a NumPy array.*DeviceArray"):
            func(x)
        assert interop.copy_to_host(x).tolist() == [0.0, 1.0, 2.0]  # nothing lost
    finally:
        device.close()


SCALARS = [np.float64(2.5), np.float32(-1.5), np.int16(-3), np.bool_(True), np.complex64(1 + 2j)]


@pytest.mark.parametrize("scalar", SCALARS)
def test_numpy_scalars_are_taken_as_numpy_asarray_takes_them(scalar, torch):
    """A NumPy scalar is a 0-d array, as numpy.asarray and torch.as_tensor see it."""
    t = interop.to_torch(scalar)
    assert t.shape == ()
    assert t.dtype == torch.as_tensor(scalar).dtype
    assert t.item() == scalar.item()
    for copy in (None, True, False):
        a = interop.to_numpy(scalar, copy=copy)
        assert isinstance(a, np.ndarray)
        assert (a.shape, a.dtype, a[()]) == ((), scalar.dtype, scalar)
    with pytest.raises(interop.NoDeviceError):  # a CUDA device is what is missing here
        interop.to_cupy(scalar)


def test_python_scalars_are_still_refused():
    with pytest.raises(TypeError, match=r"to_torch expected a NumPy array \(or scalar\)"):
        interop.to_torch(2.5)


@pytest.mark.parametrize("copy", ["yes", 0, 1.0])
def test_bad_copy_argument(copy):
    with pytest.raises(TypeError, match=r"copy to be None, True or False"):
        interop.to_numpy(np.arange(2), copy=copy)


# ----------------------------------------------------------------- lifetime, memmap


def test_result_keeps_the_source_alive(torch, side):
    t = torch.arange(float(1 << 20), device=side.device)  # 4 MiB
    n = side.to_xp(t)
    del t
    gc.collect()
    if side.name == "cuda":
        torch.cuda.empty_cache()  # a freed block would go back to the driver
    _ = torch.full((1 << 20,), 5.0, device=side.device)  # reuse freed memory if it had been freed
    assert side.tolist(n[:3]) == [0.0, 1.0, 2.0]
    assert float(n[12]) == 12.0
    a = side.xp.arange(1000.0)
    u = interop.to_torch(a)
    del a
    gc.collect()
    assert u[999].item() == 999.0


def test_memmap_is_shared(tmp_path, torch):
    mm = np.lib.format.open_memmap(tmp_path / "m.npy", "w+", np.float32, (4, 4))
    mm[...] = 1.0
    t = interop.to_torch(mm)
    t.add_(1.0)
    mm.flush()
    assert (np.load(tmp_path / "m.npy") == 2.0).all()


# ----------------------------------------------------------------- property


_DTYPES = st.sampled_from(["float32", "int16", "uint64", "complex64", "bool", "bfloat16"])


@settings(max_examples=60, deadline=None)
@given(
    shape=st.lists(st.integers(0, 5), min_size=1, max_size=3),
    steps=st.lists(st.sampled_from([1, 2, -1, -2]), min_size=3, max_size=3),
    transpose=st.booleans(),
    dtype=_DTYPES,
)
def test_round_trip_property(shape, steps, transpose, dtype):
    base = (np.arange(int(np.prod(shape))) % 7).astype(np.float32).astype(dtype).reshape(shape)
    view = base[tuple(slice(None, None, s) for s in steps[: len(shape)])]
    if transpose:
        view = view.T
    t = interop.to_torch(view)
    back = interop.to_numpy(t)
    assert back.dtype == view.dtype
    assert back.tobytes() == view.tobytes()
    negative = any(s < 0 for s, n in zip(view.strides, view.shape, strict=True) if n > 1)
    if not negative and view.size:
        assert np.shares_memory(back, base)


# ----------------------------------------------------------------- what CuPy can hold


@pytest.mark.parametrize("name", ["float32", "bool", "uint16", "complex128", "bfloat16"])
def test_cupy_dtypes_accepted(torch, name):
    from interop import dtypes

    dtypes.check_cupy_dtype(getattr(torch, name))
    numpy_dtype = np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)
    dtypes.check_cupy_dtype(numpy_dtype)
    dtypes.check_cupy_dtype(numpy_dtype.newbyteorder(">"))


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("quint8", r"got torch\.quint8\); take its values with t\.dequantize\(\)"),
        ("uint4", r"got torch\.uint4\); convert first with t\.to"),
        ("bits8", r"got torch\.bits8\); convert first with t\.to"),
        ("float8_e5m2", r"CuPy has no float8_e5m2 arrays"),
    ],
)
def test_cupy_refuses_torch_dtypes_it_cannot_hold(torch, name, pattern):
    """Refused with the fix before the tensor reaches DLPack, whose export error
    would not say what to do."""
    from interop import dtypes

    with pytest.raises(interop.UnsupportedDtypeError, match=pattern):
        dtypes.check_cupy_dtype(getattr(torch, name))


@pytest.mark.parametrize("dtype", ["U2", "O", "M8[s]", [("a", "f4")]])
def test_cupy_refuses_numpy_dtypes_it_cannot_hold(dtype):
    from interop import dtypes

    with pytest.raises(interop.UnsupportedDtypeError, match=r"expected a dtype CuPy can hold: "):
        dtypes.check_cupy_dtype(np.dtype(dtype))


@pytest.mark.parametrize(
    ("cupy_version", "numpy_version", "expected"),
    [
        ("14.2.0", "2.5.0", True),
        ("14.0.0rc1", "2.1.2", True),
        ("14.2.0", "2.1.1", False),  # CuPy 14 leaves bfloat16 off below NumPy 2.1.2
        ("13.6.0", "2.5.0", False),
        ("dev", "2.5.0", False),
    ],
)
def test_bfloat16_needs_cupy_14_and_numpy_2_1_2(cupy_version, numpy_version, expected):
    assert interop._backends.bfloat16_capable(cupy_version, numpy_version) is expected


# ----------------------------------------------------------------- the fast paths


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.arange(1.0)[::-1],  # C-contiguous by NumPy's rules, stride -8
        lambda: np.arange(6.0).reshape(3, 2)[1:2, ::-1],  # a length-1 axis and a negative stride
        lambda: np.empty((0, 3))[:, ::-1],  # zero-size with a negative stride
        lambda: np.lib.stride_tricks.as_strided(np.arange(4.0), (1, 2), (3, 8)),  # odd stride
    ],
    ids=["length-1 reversed", "row reversed", "zero-size reversed", "odd length-1 stride"],
)
def test_arrays_numpy_calls_contiguous_but_torch_refuses_are_handled(make, torch):
    """The common case is answered first (a plain contiguous array, shared at
    once); C-contiguous arrays whose strides PyTorch would refuse still take
    the general rules."""
    a = make()
    t = interop.to_torch(a)
    assert t.tolist() == a.tolist()
    back = interop.to_numpy(t)
    assert back.tolist() == a.tolist()


def test_the_fast_paths_share_what_the_general_ones_share(torch):
    a = np.arange(12.0).reshape(3, 4)
    t = interop.to_torch(a)
    assert t.data_ptr() == a.ctypes.data
    assert interop.to_numpy(t).ctypes.data == a.ctypes.data
    e = torch.zeros(1, 4).expand(3, 4)  # a broadcast view: read-only as NumPy
    assert not interop.to_numpy(e).flags.writeable
    parameter = torch.nn.Parameter(torch.ones(2))  # requires grad: its detached data
    assert interop.to_numpy(parameter).tolist() == [1.0, 1.0]


# ----------------------------------------------------------------- CUDA only
# What only CUDA has: CuPy's dtypes, streams (each library's current one, and
# their order), devices and moves between them.


@pytest.mark.gpu
def test_gpu_bfloat16_to_cupy_and_float8_refused(cp, torch):
    t = torch.tensor([1.5, -2.0], device="cuda", dtype=torch.bfloat16)
    if interop._backends.cupy_supports_bfloat16():
        c = interop.to_cupy(t)
        assert c.dtype == np.dtype(ml_dtypes.bfloat16)
        assert ptr(c) == t.data_ptr()
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


@pytest.mark.gpu
def test_gpu_read_only_numpy_to_cupy_is_copied_without_warning(cp):
    a = np.arange(3.0)
    a.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = interop.to_cupy(a)
    assert cp.asnumpy(c).tolist() == [0.0, 1.0, 2.0]


@pytest.mark.gpu
def test_gpu_a_packed_copy_waits_for_cupy_and_runs_on_torchs_stream(cp, torch):
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
    assert t.data_ptr() != ptr(a)
    # The copy's memory is PyTorch's, allocated on PyTorch's stream `side`: freed,
    # it goes back to PyTorch's pool for that stream, never to CuPy's pool.
    p = t.data_ptr()
    del t
    gc.collect()
    with torch.cuda.stream(side):
        again = torch.empty(1 << 20, dtype=torch.float32, device="cuda")
    assert again.data_ptr() == p


@pytest.mark.gpu
def test_gpu_a_resolved_conj_copy_is_marked_used_on_cupys_stream(cp, torch):
    """The copy that resolves the conjugate bit is used on CuPy's own stream: freed
    while that stream is busy, PyTorch must not hand its block out again yet."""
    z = torch.tensor([1 + 2j, 3 - 4j], device="cuda")
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        c = interop.to_cupy(z.conj())
        assert cp.asnumpy(c, stream=s).tolist() == [1 - 2j, 3 + 4j]
        with torch.cuda.stream(torch.cuda.ExternalStream(s.ptr)):
            torch.cuda._sleep(500_000_000)  # s is busy ...
        p = ptr(c)
        del c  # ... so PyTorch must not hand the resolved copy out again yet
        again = torch.empty_like(z)  # same size, PyTorch's current stream
        assert not s.done
        assert again.data_ptr() != p
    s.synchronize()


@pytest.mark.gpu
def test_gpu_device_moves(cp, torch):
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


@pytest.mark.gpu
def test_gpu_explicit_device_zero_contexts(cp, torch):
    with cp.cuda.Device(0):
        a = cp.arange(5.0)
    t = interop.to_torch(a, device=0)
    assert t.device == torch.device("cuda", 0)
    assert t.data_ptr() == ptr(a)
    c = interop.to_cupy(t, device=cp.cuda.Device(0))
    assert int(c.device.id) == 0
    same = interop.to_cupy(t, device=torch.device("cuda:0"), copy=False)
    assert ptr(same) == t.data_ptr()


@pytest.mark.gpu
def test_gpu_an_export_on_the_current_device_switches_no_device(cp, torch):
    from interop.exchange import _torch

    assert _torch.export_context(0) is _torch.ALREADY_CURRENT
    t = torch.arange(4.0, device="cuda:0")
    c = interop.to_cupy(t)
    assert ptr(c) == t.data_ptr()
    assert (cp.cuda.runtime.getDevice(), torch.cuda.current_device()) == (0, 0)


@pytest.mark.gpu
@pytest.mark.multigpu
def test_gpu_an_export_from_another_device_switches_there_and_back(cp, torch):
    from interop.exchange import _torch

    assert _torch.export_context(1) is not _torch.ALREADY_CURRENT
    t = torch.arange(4.0, device="cuda:1")
    c = interop.to_cupy(t)
    assert int(c.device.id) == 1
    assert (cp.cuda.runtime.getDevice(), torch.cuda.current_device()) == (0, 0)
    with cp.cuda.Device(1):
        a = cp.arange(3.0)
    assert interop.to_torch(a).device == torch.device("cuda", 1)
    assert (cp.cuda.runtime.getDevice(), torch.cuda.current_device()) == (0, 0)


@pytest.mark.gpu
@pytest.mark.multigpu
def test_gpu_data_on_another_device_stays_there(cp, torch):
    t = torch.arange(4.0, device="cuda:1")
    with cp.cuda.Device(0):
        c = interop.to_cupy(t)
    assert int(c.device.id) == 1
    assert ptr(c) == t.data_ptr()
    with cp.cuda.Device(1):
        a = cp.arange(3.0)
    u = interop.to_torch(a)
    assert u.device == torch.device("cuda", 1)
    moved = interop.to_cupy(a, device=0)
    assert int(moved.device.id) == 0
    assert cp.asnumpy(moved).tolist() == [0.0, 1.0, 2.0]


@pytest.mark.gpu
@pytest.mark.multigpu
def test_gpu_a_move_to_another_device_waits_for_the_source_devices_stream(cp, torch):
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


@pytest.mark.gpu
def test_gpu_to_cupy_is_ordered_after_torch_side_stream_work(cp, torch):
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


@pytest.mark.gpu
def test_gpu_to_torch_is_ordered_after_cupy_stream_work(cp, torch):
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
