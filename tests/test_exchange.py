"""SPEC §1.1 on the CPU: NumPy <-> CPU torch and generic DLPack producers."""

from __future__ import annotations

import gc
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import interop

from .helpers import STANDARD, Producer, run_python


def ptr(x) -> int:
    if isinstance(x, np.ndarray):
        return x.__array_interface__["data"][0]
    return x.data_ptr()


# ----------------------------------------------------------------- views


@pytest.mark.parametrize(
    "view",
    [lambda a: a, lambda a: a.T, lambda a: a[1:, ::2], lambda a: a[:, 1]],
    ids=["contiguous", "transposed", "sliced", "column"],
)
def test_strided_views_are_zero_copy_both_ways(torch, view):
    base = np.arange(12.0).reshape(3, 4)
    a = view(base)
    t = interop.to_torch(a)
    assert ptr(t) == ptr(a)
    assert t.stride() == tuple(s // 8 for s in a.strides)
    t.mul_(-1)  # shared: NumPy sees the write
    np.testing.assert_array_equal(a, t.numpy())
    assert (a <= 0).all()
    back = interop.to_numpy(t)
    assert ptr(back) == ptr(t)
    assert back.strides == a.strides
    tb = torch.arange(12.0).reshape(3, 4)
    for tv in (tb, tb.T, tb[1:, ::2]):
        n = interop.to_numpy(tv, copy=False)
        assert ptr(n) == ptr(tv)
        assert n.strides == tuple(s * 4 for s in tv.stride())


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


def test_requires_grad_is_a_detached_zero_copy_view(torch):
    t = torch.arange(3.0, requires_grad=True)
    n = interop.to_numpy(t)
    assert ptr(n) == ptr(t)
    n[0] = 7.0
    assert t[0].item() == 7.0
    d = interop.to_torch(t)
    assert not d.requires_grad
    assert ptr(d) == ptr(t)
    assert interop.to_numpy(t, copy=False).tolist() == [7.0, 1.0, 2.0]


# ----------------------------------------------------------------- conj / neg bits


def test_conj_bit_gives_conjugated_values_as_a_copy(torch):
    z = torch.tensor([1 + 2j, 3 - 4j])
    zc = z.conj()
    assert zc.is_conj()
    n = interop.to_numpy(zc)
    assert n.tolist() == [1 - 2j, 3 + 4j]
    assert ptr(n) != ptr(z)
    with pytest.raises(interop.CopyRequiredError, match="conjugate bit") as info:
        interop.to_numpy(zc, copy=False)
    assert isinstance(info.value, BufferError)
    assert "copy=None or copy=True" in str(info.value)


def test_neg_bit_gives_negated_values(torch):
    z = torch.tensor([1 + 2j, 3 - 4j])
    im = z.conj().imag
    assert im.is_neg()
    assert interop.to_numpy(im).tolist() == [-2.0, 4.0]
    # what the libraries do on their own: the bit is silently ignored
    assert np.from_dlpack(im).tolist() == [2.0, -4.0]
    with pytest.raises(interop.CopyRequiredError, match="negative bit"):
        interop.to_numpy(im, copy=False)
    assert interop.to_numpy(im, copy=True).tolist() == [-2.0, 4.0]


def test_conj_through_a_generic_producer_is_refused_by_torch(torch):
    # torch's own __dlpack__ refuses conj tensors; interop resolves them first
    z = torch.tensor([1 + 1j]).conj()
    with pytest.raises(BufferError):
        np.from_dlpack(z)
    assert interop.to_numpy(z).tolist() == [1 - 1j]


# ----------------------------------------------------------------- negative strides


def test_negative_strides_to_torch_are_copied(torch):
    a = np.arange(6.0)
    r = interop.to_torch(a[::-1])
    assert r.tolist() == [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]
    r[0] = -1
    assert a[5] == 5.0  # a copy
    m = np.arange(12).reshape(3, 4)[::-1, ::2]
    assert interop.to_torch(m).tolist() == m.tolist()
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


def test_expanded_tensor_to_numpy_is_zero_copy_and_read_only(torch):
    t = torch.arange(3.0).expand(4, 3)
    n = interop.to_numpy(t)
    assert n.strides == (0, 4)
    assert ptr(n) == ptr(t)
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


def test_complex32_is_unsupported(torch):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: ComplexHalf is experimental
        t = torch.zeros(2, dtype=torch.complex32)
    with pytest.raises(interop.UnsupportedDtypeError, match=r"torch.complex32.*complex64") as info:
        interop.to_numpy(t)
    assert isinstance(info.value, TypeError)


@pytest.mark.parametrize("name", STANDARD)
def test_standard_dtypes_zero_copy_both_ways(torch, name):
    a = np.arange(6).astype(name).reshape(2, 3)
    t = interop.to_torch(a, copy=False)
    assert t.dtype == getattr(torch, name)
    assert ptr(t) == ptr(a)
    n = interop.to_numpy(t, copy=False)
    assert n.dtype == np.dtype(name)
    assert ptr(n) == ptr(a)
    np.testing.assert_array_equal(n, a)


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


@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "uint16"])
def test_zero_d_and_zero_size(torch, shape, dtype):
    t = torch.zeros(shape, dtype=getattr(torch, dtype))
    n = interop.to_numpy(t)
    assert n.shape == shape
    assert n.dtype.name == dtype
    back = interop.to_torch(n)
    assert tuple(back.shape) == shape
    assert back.dtype == t.dtype


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


def test_to_cupy_refuses_cpu_device():
    with pytest.raises(ValueError, match="to_cupy expected a CUDA device"):
        interop.to_cupy(np.arange(3.0), device="cpu")


# ----------------------------------------------------------------- bad input


@pytest.mark.parametrize("func", [interop.to_numpy, interop.to_torch, interop.to_cupy])
@pytest.mark.parametrize("value", [[1, 2], "abc", None, 3])
def test_unsupported_objects(func, value):
    with pytest.raises(TypeError, match=rf"{func.__name__} expected a NumPy array.*\(got builtins"):
        func(value)


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


def test_result_keeps_the_source_alive(torch):
    t = torch.arange(1000.0)
    n = interop.to_numpy(t)
    del t
    gc.collect()
    _ = torch.ones(1000) * 5  # reuse freed memory if it had been freed
    assert n[:3].tolist() == [0.0, 1.0, 2.0]
    a = np.arange(1000.0)
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
