"""Property-based checks (hypothesis) of the exchange, transfer and ``.npy``
calls on arrays a user may hold: random shapes, byte strides (negative, zero,
odd, misaligned), every dtype of ``helpers.NUMPY_DTYPES`` in both byte orders,
read-only arrays, CPU tensors with zero strides, storage offsets and the
conjugate/negative bit.

Each call gives the right values (compared bit for bit, in native byte order),
or, where the contract allows it, an ``interop.InteropError``; never another
exception. Foreign DLPack producers, where a library could abort the
interpreter, are fed in a subprocess.
"""

from __future__ import annotations

import pathlib
import warnings

import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import interop
from tests.helpers import ML, NUMPY_DTYPES, Producer, run_python

# Small arrays, few examples: the whole file runs in a few seconds.
MAX_EXAMPLES = 100
SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

_SWAPPED = [d.newbyteorder("S") for d in NUMPY_DTYPES]
DTYPES = NUMPY_DTYPES + [d for d in _SWAPPED if d not in NUMPY_DTYPES]
_ML_INT = {"bfloat16": "int16"} | {name: "uint8" for name in ML if name.startswith("float8")}


# --------------------------------------------------------------------------- values


def native_bytes(a: np.ndarray) -> np.ndarray:
    """``a``'s elements as bytes in native byte order, C order: the values bit
    for bit (NaN payloads included)."""
    a = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("="))
    return a.reshape(-1).view(np.uint8)


def tensor_values(t) -> np.ndarray:
    """What a CPU tensor holds, as NumPy (bits applied), without interop."""
    import torch

    t = t.detach().resolve_conj().resolve_neg().contiguous()
    name = str(t.dtype).removeprefix("torch.")
    if name in _ML_INT:
        ml = np.dtype(getattr(ml_dtypes, name))
        return t.view(getattr(torch, _ML_INT[name])).numpy().view(ml)
    return t.numpy()


def same_values(got: np.ndarray, want: np.ndarray) -> bool:
    return got.shape == want.shape and np.array_equal(native_bytes(got), native_bytes(want))


# --------------------------------------------------------------------------- strategies


@st.composite
def strided_arrays(draw) -> np.ndarray:
    """A NumPy view with random byte strides over random bytes."""
    dtype = draw(st.sampled_from(DTYPES))
    size = dtype.itemsize
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    stride = st.one_of(
        st.integers(-3, 3).map(lambda k: k * size),  # element strides, zero and negative
        st.integers(-3 * size - 1, 3 * size + 1),  # any byte stride: odd ones too
    )
    strides = tuple(draw(stride) for _ in shape)
    if draw(st.booleans()):  # the common case: C order, maybe one axis reversed
        strides = tuple(int(s) for s in np.empty(shape, dtype).strides)
        if shape and draw(st.booleans()):
            axis = draw(st.integers(0, len(shape) - 1))
            strides = tuple(-s if i == axis else s for i, s in enumerate(strides))
    misalign = draw(st.integers(0, size - 1))
    low = sum(min(0, s * (n - 1)) for s, n in zip(strides, shape, strict=True) if n)
    high = sum(max(0, s * (n - 1)) for s, n in zip(strides, shape, strict=True) if n)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    nbytes = high - low + size + misalign
    raw = rng.integers(0, 2 if dtype.kind == "b" else 256, nbytes, dtype=np.uint8)
    a = np.ndarray(shape, dtype, buffer=raw, offset=misalign - low, strides=strides)
    if draw(st.booleans()):
        a.flags.writeable = False
    return a


def _needs_copy_for_torch(a: np.ndarray) -> bool:
    """Whether PyTorch cannot share ``a``'s memory as it is: byte order,
    negative or odd strides on axes longer than 1, a misaligned first element."""
    size = a.dtype.itemsize
    if not a.dtype.isnative and size > 1:
        return True
    return a.size > 0 and (
        a.ctypes.data % size != 0
        or any(s < 0 or s % size for s, n in zip(a.strides, a.shape, strict=True) if n > 1)
    )


@st.composite
def strided_tensors(draw):
    """A CPU tensor view with random (non-negative) strides and storage
    offset, maybe with the conjugate or negative bit or requires_grad."""
    import torch

    name = draw(st.sampled_from([str(d) for d in NUMPY_DTYPES]))
    dtype = getattr(torch, name)
    size = dtype.itemsize
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    strides = tuple(draw(st.integers(0, 5)) for _ in shape)
    offset = draw(st.integers(0, 3))
    extent = offset + sum(s * (n - 1) for s, n in zip(strides, shape, strict=True) if n) + 1
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    raw = rng.integers(0, 2 if name == "bool" else 256, extent * size, dtype=np.uint8)
    base = torch.from_numpy(raw).view(dtype)
    t = torch.as_strided(base, shape, strides, offset)
    bit = draw(st.sampled_from(["none", "conj", "neg", "grad"]))
    if bit == "conj" and t.is_complex():
        t = t.conj()
    elif bit == "neg" and (t.is_complex() or name in ("float32", "float64", "int32", "int64")):
        t = torch._neg_view(t)
    elif bit == "grad" and t.is_floating_point() and name not in _ML_INT:
        t = t.detach().requires_grad_(True)
    return t


def _out_like(a: np.ndarray, layout: str) -> np.ndarray:
    """A destination for ``a``'s values: C order, Fortran order, or reversed."""
    dtype = a.dtype
    if layout == "fortran":
        return np.empty(a.shape[::-1], dtype).T
    if layout == "reversed" and a.ndim:
        return np.empty(a.shape, dtype)[::-1]
    return np.empty(a.shape, dtype)


# --------------------------------------------------------------------------- NumPy sources


@SETTINGS
@given(a=strided_arrays())
def test_to_numpy_gives_the_values_for_any_view(a):
    want = np.array(a)
    for copy in (None, False, True):
        got = interop.to_numpy(a, copy=copy)
        assert got.dtype == a.dtype
        assert same_values(got, want)
        if copy:
            assert not np.shares_memory(got, a)


def check_to_torch(a: np.ndarray) -> None:
    """``to_torch`` of ``a``: the values with ``copy=None`` and ``copy=True``;
    with ``copy=False`` shared memory exactly when PyTorch can take the view
    as it is, else ``CopyRequiredError``. Run in a subprocess: PyTorch's
    kernels crash the interpreter on memory it cannot take (misaligned)."""
    want = np.array(a)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", interop.ReadOnlyWarning)
        t = interop.to_torch(a)  # copy=None: always the values
        assert same_values(tensor_values(t), want)
        try:
            shared = interop.to_torch(a, copy=False)
        except interop.CopyRequiredError:
            assert _needs_copy_for_torch(a)
        else:
            assert not _needs_copy_for_torch(a)
            assert same_values(tensor_values(shared), want)
            if a.size:
                base = a.base if isinstance(a.base, np.ndarray) else a
                start = base.__array_interface__["data"][0]
                assert start <= shared.data_ptr() < start + base.nbytes
        copied = interop.to_torch(a, copy=True)
        assert same_values(tensor_values(copied), want)


@SETTINGS
@given(a=strided_arrays(), layout=st.sampled_from(["new", "c", "fortran", "reversed"]))
def test_copy_to_host_gives_the_values_for_any_view(a, layout):
    want = np.array(a)
    if layout == "new":
        got = interop.copy_to_host(a)
    else:
        out = _out_like(a, layout)
        got = interop.copy_to_host(a, out)
        assert got is out
    assert got.dtype == a.dtype
    assert same_values(got, want)


@SETTINGS
@given(a=strided_arrays(), layout=st.sampled_from(["c", "fortran", "reversed"]))
def test_save_npy_then_load_npy_gives_the_values_for_any_view(a, layout, tmp_path):
    want = np.array(a)
    path = interop.save_npy(a, tmp_path / "a.npy")
    # a header names bfloat16/float8 without a byte order: stored in native order
    dtype = a.dtype.newbyteorder("=") if ml_dtypes_name(a.dtype) else a.dtype
    out = _out_like(np.empty(a.shape, dtype), layout)
    for loaded in (interop.load_npy(path), np.load(path), interop.load_npy(path, out)):
        assert loaded.dtype == dtype
        assert same_values(loaded, want)


def ml_dtypes_name(dtype: np.dtype) -> str | None:
    native = dtype.newbyteorder("=")
    return native.name if native.name in ML else None


# --------------------------------------------------------------------------- tensors


@SETTINGS
@given(t=strided_tensors())
def test_tensor_views_give_their_values(t, tmp_path):
    want = tensor_values(t)
    assert same_values(interop.to_numpy(t), want)
    assert same_values(interop.to_numpy(t, copy=True), want)
    try:
        shared = interop.to_numpy(t, copy=False)
    except interop.CopyRequiredError:
        assert t.is_conj() or t.is_neg()
    else:
        assert same_values(shared, want)
    same = interop.to_torch(t)
    if t.requires_grad:  # its data, detached: the same memory
        assert not same.requires_grad
        assert same.data_ptr() == t.data_ptr()
    else:
        assert same is t
    assert same_values(tensor_values(interop.to_torch(t, copy=True)), want)
    assert same_values(interop.copy_to_host(t), want)
    path = interop.save_npy(t, tmp_path / "t.npy")
    assert same_values(interop.load_npy(path), want)
    assert same_values(np.load(path), want)


# --------------------------------------------------------------------------- foreign


def check_foreign_producer(a: np.ndarray) -> None:
    """Feed ``a`` through a foreign DLPack producer: right values or an
    InteropError (a producer may refuse odd strides or byte order)."""
    want = np.array(a)
    calls = {
        "to_numpy": lambda x: interop.to_numpy(x),
        "to_torch": lambda x: tensor_values(interop.to_torch(x)),
        "copy_to_host": lambda x: interop.copy_to_host(x),
    }
    for name, call in calls.items():
        try:
            got = call(Producer(a))
        except interop.InteropError:
            continue
        assert same_values(got, want), (name, a.dtype, a.shape, a.strides)


def describe(a: np.ndarray) -> str:
    """An example in a line, written before it runs (a crash shows it)."""
    return (
        f"dtype={a.dtype.str} ({a.dtype}) shape={a.shape} strides={a.strides} "
        f"address%16={a.ctypes.data % 16} writeable={a.flags.writeable}"
    )


_CHILD = """
import sys, warnings
sys.path.insert(0, {root!r})
from hypothesis import HealthCheck, given, settings
from tests.exchange import test_properties as p
import interop

@settings(max_examples={n}, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=p.strided_arrays())
def run(a):
    print(p.describe(a), file=sys.stderr, flush=True)
    p.{check}(a)

run()
print("checked")
"""


def _in_a_subprocess(check: str, examples: int) -> None:
    root = str(pathlib.Path(__file__).resolve().parents[2])
    proc = run_python(_CHILD.format(root=root, n=examples, check=check))
    # on a crash the last line of stderr is the example that crashed
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "checked"


def test_to_torch_gives_the_values_and_shares_only_when_it_can():
    _in_a_subprocess("check_to_torch", MAX_EXAMPLES)


def test_foreign_producers_of_any_view_give_values_or_interop_errors():
    # A producer's export is handed to a library, and some libraries abort
    # the interpreter on inputs they do not take.
    _in_a_subprocess("check_foreign_producer", MAX_EXAMPLES)
