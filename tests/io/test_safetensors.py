"""interop.safetensors on the host, against the safetensors package itself: files go
both ways, byte for byte; every bad file, argument and destination is refused clearly
before anything is allocated, written or lost."""

from __future__ import annotations

import errno
import json
import os
import re
import struct
import threading

import ml_dtypes
import numpy as np
import pytest

import interop
import interop.safetensors as ist
from tests.helpers import Producer, reading_fifo, run_python

st = pytest.importorskip("safetensors.torch", reason="the 'test' extra installs safetensors")
torch = pytest.importorskip("torch")

# every dtype safetensors.torch 0.8 maps, by its torch name
TORCH_DTYPES = [
    "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8",
    "bool", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
    "float8_e8m0fnu", "complex64", "uint64", "uint32", "uint16",
]  # fmt: skip
SHAPES = [(5, 7), (), (0, 3)]
INDEX = "model.safetensors.index.json"


def _sample(name: str, shape: tuple[int, ...], seed: int = 0):
    """A tensor of ``shape`` with random bits (any bit pattern: NaNs compared as bytes)."""
    dtype = getattr(torch, name)
    n = int(np.prod(shape, dtype=np.int64))
    g = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(shape)


def _bytes(x) -> tuple:
    """dtype, shape and bytes of a tensor or array, to compare two exactly."""
    if isinstance(x, np.ndarray):
        return (
            x.dtype.newbyteorder("<"),
            x.shape,
            np.ascontiguousarray(x.astype(x.dtype.newbyteorder("<"))).tobytes(),
        )
    return (
        str(x.dtype),
        tuple(x.shape),
        bytes(x.contiguous().reshape(-1).view(torch.uint8).numpy()),
    )


def _same(a, b) -> None:
    assert _bytes(a) == _bytes(b)


def _same_dicts(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        _same(a[k], b[k])


# ----------------------------------------------------------------------- both ways


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_every_dtype_round_trips_both_ways_with_the_package(tmp_path, name, shape):
    tensors = {"x": _sample(name, shape), "y": _sample(name, (3,), seed=1)}
    ours = ist.save_file(tensors, tmp_path / "ours.safetensors")
    assert ours == tmp_path / "ours.safetensors"
    st.save_file(tensors, tmp_path / "theirs.safetensors")
    assert ours.read_bytes() == (tmp_path / "theirs.safetensors").read_bytes()
    _same_dicts(st.load_file(ours), tensors)
    _same_dicts(ist.load_file(tmp_path / "theirs.safetensors"), tensors)
    _same_dicts(ist.load_file(ours, backend="pread"), tensors)


def test_a_file_of_every_dtype_is_the_packages_byte_for_byte(tmp_path):
    tensors = {f"{name}.é/{i}": _sample(name, (i + 1, 2), i) for i, name in enumerate(TORCH_DTYPES)}
    tensors |= {'a\nb"\\\x01': torch.zeros(0), "scalar": torch.tensor(1.5)}
    ist.save_file(tensors, tmp_path / "ours.safetensors")
    st.save_file(tensors, tmp_path / "theirs.safetensors")
    assert (tmp_path / "ours.safetensors").read_bytes() == (
        tmp_path / "theirs.safetensors"
    ).read_bytes()
    theirs_path = tmp_path / "theirs.safetensors"
    with st.safe_open(theirs_path, "pt") as theirs, ist.safe_open(theirs_path) as ours:
        assert ours.keys() == theirs.keys()
        assert ours.offset_keys() == theirs.offset_keys()
        assert ours.metadata() is theirs.metadata() is None


def test_metadata_goes_both_ways(tmp_path):
    meta = {"format": "pt", "note": 'ü\n"quoted"', "": ""}
    t = {"w": torch.arange(6.0).reshape(2, 3)}
    ist.save_file(t, tmp_path / "ours.safetensors", metadata=meta)
    st.save_file(t, tmp_path / "theirs.safetensors", metadata=meta)
    with st.safe_open(tmp_path / "ours.safetensors", "pt") as f:
        assert f.metadata() == meta
    with ist.safe_open(tmp_path / "theirs.safetensors") as f:
        assert f.metadata() == meta
    empty = ist.save_file(t, tmp_path / "empty.safetensors", metadata={})
    with st.safe_open(empty, "pt") as f:
        assert f.metadata() == {}


def test_numpy_sources_with_ml_dtypes_big_endian_and_any_strides(tmp_path):
    rng = np.random.default_rng(0)
    base = rng.standard_normal((6, 8))
    arrays = {
        "bf16": base.astype(ml_dtypes.bfloat16),
        "e4m3fnuz": base.astype(ml_dtypes.float8_e4m3fnuz),
        "e5m2fnuz": base.astype(ml_dtypes.float8_e5m2fnuz),
        "e8m0": np.abs(base).astype(ml_dtypes.float8_e8m0fnu),
        "big_f32": base.astype(">f4"),
        "big_i64": np.arange(48).reshape(6, 8).astype(">i8"),
        "big_c64_T": (base + 1j * base[::-1]).astype(">c8").T,
        "transposed": base.copy().T,  # each its own memory: views of one are refused
        "reversed": base.copy()[::-1, ::-2],
        "column": base.copy()[:, 3],
        "scalar": np.float16(2.5),
        "empty": np.zeros((0, 4), np.int32),
    }
    path = ist.save_file(arrays, tmp_path / "np.safetensors")
    loaded = st.load_file(path)
    for name, a in arrays.items():
        want = np.asarray(a)
        got = ist.load_file(path, framework="np")[name]
        assert got.dtype == want.dtype.newbyteorder("=")  # little-endian, ml_dtypes kept
        _same(got, want)
        _same(interop.to_numpy(loaded[name]), want)


def test_mixed_sources_in_one_file(tmp_path):
    def z():
        return torch.complex(torch.arange(4.0), torch.arange(4.0) + 1)

    sources = {
        "torch": torch.arange(12.0).reshape(3, 4),
        "torch_T": torch.arange(12, dtype=torch.int16).reshape(3, 4).T,
        "numpy": np.arange(5, dtype=np.uint32),
        "foreign": Producer(np.arange(6.0).reshape(2, 3)[::-1]),
        "conj": z().conj(),  # the lazy conjugate bit: its values, not its memory
        "neg": z().conj().imag,  # the negative bit
        "grad": torch.ones(3, requires_grad=True),
    }
    path = ist.save_file(sources, tmp_path / "mixed.safetensors")
    loaded = st.load_file(path)
    np.testing.assert_array_equal(loaded["torch_T"].numpy(), sources["torch_T"].numpy())
    np.testing.assert_array_equal(loaded["foreign"].numpy(), np.arange(6.0).reshape(2, 3)[::-1])
    assert torch.equal(loaded["conj"], z().conj().resolve_conj())
    assert torch.equal(loaded["neg"], -(torch.arange(4.0) + 1))
    np.testing.assert_array_equal(loaded["numpy"].numpy(), np.arange(5, dtype=np.uint32))
    assert not loaded["grad"].requires_grad


def test_a_strided_source_is_written_a_chunk_at_a_time(tmp_path):
    a = np.arange(1 << 18, dtype=np.float64).reshape(512, 512)  # 2 MiB
    with interop.config.set(chunk_bytes=64 << 10):
        path = ist.save_file({"t": a.T, "be": a.astype(">f8")}, tmp_path / "s.safetensors")
    loaded = st.load_file(path)
    np.testing.assert_array_equal(loaded["t"].numpy(), a.T)
    np.testing.assert_array_equal(loaded["be"].numpy(), a)


def test_host_tensors_are_gathered_into_positioned_writes_at_their_offsets(tmp_path, monkeypatch):
    """Host tensors holding the file's bytes go out from their memory, many per write,
    split across chunks and threads, between tensors written otherwise; a write the
    system cuts short is continued."""
    tensors = {f"small{i}": torch.full((i,), float(i)) for i in range(40)}  # 0-d to 156 bytes
    tensors |= {
        "big": torch.arange(50_000.0),
        "strided": torch.arange(20_000.0).reshape(100, 200).T,
    }
    tensors |= {"i8": torch.arange(3000, dtype=torch.int8), "empty": torch.zeros(0)}
    short = os.pwritev
    calls = []

    def pwritev(fd, views, offset):  # at most 1000 bytes a call, as a signal could cut it
        calls.append(len(views))
        room, taken = 1000, []
        for v in views:
            if room <= 0:
                break
            taken.append(memoryview(v)[:room])
            room -= len(taken[-1])
        return short(fd, taken, offset)

    monkeypatch.setattr(os, "pwritev", pwritev)
    with interop.config.set(chunk_bytes=64 << 10, host_threads=3):
        path = ist.save_file(tensors, tmp_path / "ours.safetensors")
    st.save_file({k: v.contiguous() for k, v in tensors.items()}, tmp_path / "theirs.safetensors")
    assert path.read_bytes() == (tmp_path / "theirs.safetensors").read_bytes()
    assert max(calls) > 1  # adjacent tensors went out in one call


# ----------------------------------------------------------------------- load


def test_load_file_gives_each_framework_its_arrays(tmp_path):
    t = {"bf": torch.arange(4.0).bfloat16(), "f8": torch.arange(4.0).to(torch.float8_e5m2)}
    path = st.save_file(t, tmp_path / "a.safetensors") or tmp_path / "a.safetensors"
    as_np = ist.load_file(path, framework="np")
    assert as_np["bf"].dtype == np.dtype(ml_dtypes.bfloat16)
    assert as_np["f8"].dtype == np.dtype(ml_dtypes.float8_e5m2)
    as_pt = ist.load_file(path, device=torch.device("cpu"))
    assert as_pt["bf"].dtype is torch.bfloat16
    _same_dicts(as_pt, t)


def test_a_cpu_load_maps_the_file_copy_on_write(tmp_path):
    path = ist.save_file({"w": torch.zeros(1000)}, tmp_path / "a.safetensors")
    before = path.read_bytes()
    for backend in (None, "mmap", "pread"):
        loaded = ist.load_file(path, backend=backend)["w"]
        loaded += 1  # a private copy of the pages written: the file stays as it was
        assert path.read_bytes() == before
    mapped = ist.load_file(path)["w"]
    ist.save_file({"w": torch.ones(1000)}, path)  # replaced, not rewritten in place
    assert torch.equal(mapped, torch.zeros(1000))
    resaved = ist.save_file({"w": mapped + 2}, path)  # a map of the file itself, saved over it
    assert torch.equal(st.load_file(resaved)["w"], torch.full((1000,), 2.0))


def test_safe_open_reads_keys_metadata_tensors_and_slices_as_the_package(tmp_path):
    a = torch.arange(60.0).reshape(3, 4, 5)
    path = tmp_path / "a.safetensors"
    st.save_file({"a": a, "b": torch.arange(3).bfloat16()}, path, metadata={"k": "v"})
    slices = [
        np.s_[1:3],
        np.s_[:, ::2],
        np.s_[0],
        np.s_[:, 1:3, -1],
        np.s_[..., 2],
        np.s_[2:, :0],
    ]
    for framework in ("pt", "np"):
        with st.safe_open(path, framework) as theirs, ist.safe_open(path, framework) as ours:
            assert ours.keys() == theirs.keys() == ["a", "b"]
            assert ours.metadata() == theirs.metadata()
            assert ours.get_slice("a").get_shape() == [3, 4, 5]
            assert ours.get_slice("b").get_dtype() == theirs.get_slice("b").get_dtype() == "BF16"
            for index in slices:
                want = theirs.get_slice("a")[index]
                got = ours.get_slice("a")[index]
                assert type(got) is type(want)
                np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
            _same(ours.get_tensor("a"), a.numpy() if framework == "np" else a)
            assert set(ours.get_tensors()) == {"a", "b"}
            with pytest.raises(KeyError, match="no tensor 'c' in"):
                ours.get_tensor("c")


def test_progress_counts_every_byte_of_every_call(tmp_path):
    tensors = {f"w{i}": torch.rand(100_000 + i) for i in range(5)}
    total = sum(t.numel() * 4 for t in tensors.values())
    for call in (
        lambda p: ist.save_file(tensors, tmp_path / "a.safetensors", progress=p),
        lambda p: ist.save_sharded(tensors, tmp_path / "d", max_shard_size="1MB", progress=p),
        lambda p: ist.load_file(tmp_path / "a.safetensors", progress=p),
        lambda p: ist.load_file(tmp_path / "a.safetensors", backend="pread", progress=p),
        lambda p: ist.load_into(tmp_path / "d" / INDEX, dict(tensors), progress=p),
    ):
        seen: list[tuple[int, int]] = []
        call(lambda done, of, seen=seen: seen.append((done, of)))
        assert seen, "progress was never called"
        assert all(of == total for _, of in seen)
        assert [d for d, _ in seen] == sorted(d for d, _ in seen)
        assert seen[-1][0] == total


def test_a_progress_callbacks_error_comes_back_as_itself(tmp_path):
    tensors = {"a": torch.zeros(1 << 16), "b": np.zeros((1 << 15, 2)).T}  # 256 KiB each
    path = ist.save_file(tensors, tmp_path / "a.safetensors")

    def mine(done, total):
        if done > 1 << 18:
            raise KeyError("mine")

    with interop.config.set(chunk_bytes=64 << 10):
        for func, call in (
            (
                "save_file",
                lambda: ist.save_file(tensors, tmp_path / "b.safetensors", progress=mine),
            ),
            ("load_file", lambda: ist.load_file(path, backend="pread", progress=mine)),
            ("load_into", lambda: ist.load_into(path, dict(tensors), progress=mine)),
        ):
            with pytest.raises(KeyError, match="mine") as info:
                call()
            assert info.value.__notes__ == [  # one note, of the bytes done in all
                f"raised by the progress callback of {func}; bytes [0, {(1 << 18) + (64 << 10)}) "
                f"of {3 << 18} were complete when it raised"
            ]
    assert not (tmp_path / "b.safetensors").exists()


def test_progress_true_shows_a_bar(tmp_path, capsys):
    ist.save_file({"w": torch.zeros(1000)}, tmp_path / "a.safetensors", progress=True)
    assert "save_file" in capsys.readouterr().err


# ----------------------------------------------------------------------- load_into


def _targets():
    return {
        "w": torch.full((4, 3), -1.0),
        "b": np.full(3, -1, np.int16),
        "s": torch.full((), -1.0, dtype=torch.bfloat16),
        "e": torch.zeros(0, 2),
    }


def _saved(tmp_path):
    values = {
        "w": torch.arange(12.0).reshape(4, 3),
        "b": torch.arange(3, dtype=torch.int16),
        "s": torch.tensor(7.0).bfloat16(),
        "e": torch.zeros(0, 2),
    }
    return st.save_file(values, tmp_path / "a.safetensors") or tmp_path / "a.safetensors", values


def test_load_into_fills_the_given_tensors_in_place(tmp_path):
    path, values = _saved(tmp_path)
    targets = _targets()
    pointers = {k: v.data_ptr() for k, v in targets.items() if hasattr(v, "data_ptr")}
    assert ist.load_into(path, targets) == ([], [])
    assert {k: v.data_ptr() for k, v in targets.items() if hasattr(v, "data_ptr")} == pointers
    for k, v in values.items():
        np.testing.assert_array_equal(interop.to_numpy(targets[k]), interop.to_numpy(v))


def test_load_into_strided_targets(tmp_path):
    path, values = _saved(tmp_path)
    base = torch.zeros(3, 8)
    targets = _targets() | {"w": base.T[::2]}  # (4, 3) every other column of base's transpose
    ist.load_into(path, targets)
    assert torch.equal(base.T[::2], values["w"])
    assert not base.T[1::2].any()  # the gaps untouched


def test_load_into_not_strict_fills_what_the_file_holds(tmp_path):
    path, values = _saved(tmp_path)
    targets = _targets()
    targets.pop("b")
    extra = {"extra": torch.full((2,), -1.0)}
    missing, unexpected = ist.load_into(path, targets | extra, strict=False)
    assert (missing, unexpected) == (["extra"], ["b"])
    assert torch.equal(targets["w"], values["w"])
    assert torch.equal(extra["extra"], torch.full((2,), -1.0))


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        (
            lambda t: t.update(w=torch.zeros(3, 4)),
            r"'w' is shape \(3, 4\) float32, the file's \(4, 3\)",
        ),
        (
            lambda t: t.update(w=torch.zeros(4, 3, dtype=torch.float64)),
            r"'w' is shape \(4, 3\) float64",
        ),
        (lambda t: t.update(b=np.zeros(3, ">i2")), r"'b' is shape \(3,\) >i2 \(big-endian\)"),
        (lambda t: t.update(b=np.zeros(3, np.int16)), None),  # the control: these fill
        (lambda t: t.pop("b"), r"missing \[\], unexpected \['b'\]"),
        (lambda t: t.update(x=torch.zeros(1)), r"missing \['x'\], unexpected \[\]"),
    ],
)
def test_load_into_refuses_a_mismatch_before_writing_anything(tmp_path, change, pattern):
    path, _ = _saved(tmp_path)
    targets = _targets()
    change(targets)
    before = {k: _bytes(v) for k, v in targets.items()}
    if pattern is None:
        assert ist.load_into(path, targets) == ([], [])
        return
    with pytest.raises(interop.CheckpointMismatchError, match=pattern) as info:
        ist.load_into(path, targets)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, RuntimeError)
    assert {k: _bytes(v) for k, v in targets.items()} == before  # not a byte written


def test_load_into_refuses_targets_it_cannot_write_before_writing_any(tmp_path):
    path, _ = _saved(tmp_path)
    read_only = np.full(3, -1, np.int16)
    read_only.flags.writeable = False
    writable = np.full(3, -1, np.int16)
    broadcast = np.lib.stride_tricks.as_strided(writable[:1], (3,), (0,))  # one element, 3 times
    for bad, exc, pattern in (
        ({"b": read_only}, interop.CheckpointMismatchError, "'b' is read-only"),
        ({"b": broadcast}, interop.InvalidValueError, "elements may share memory"),
        ({"b": np.int16(3)}, interop.InvalidTypeError, "expected tensor 'b' to be a tensor"),
        ({"b": [1, 2, 3]}, interop.InvalidTypeError, "expected tensor 'b' to be a tensor"),
    ):
        targets = _targets() | bad
        with pytest.raises(exc, match=pattern):
            ist.load_into(path, targets)
        assert torch.equal(targets["w"], torch.full((4, 3), -1.0))
    assert (writable == -1).all()
    z = torch.tensor([1 + 2j, 3j], dtype=torch.complex64)
    zpath = ist.save_file({"z": z}, tmp_path / "z.safetensors")
    target = torch.zeros(2, dtype=torch.complex64)
    with pytest.raises(interop.CheckpointMismatchError, match="conjugate or negative bit"):
        ist.load_into(zpath, {"z": target.conj()})
    assert not target.any()
    with pytest.raises(interop.InvalidTypeError, match="expected a dict of names to tensors"):
        ist.load_into(path, [("w", torch.zeros(4, 3))])


def test_load_into_and_tied_targets(tmp_path):
    shared = torch.zeros(4, 3)
    path = ist.save_file({"w": torch.ones(4, 3)}, tmp_path / "a.safetensors")
    # a name the file lacks whose tensor is a filled one's memory is filled through it
    assert ist.load_into(path, {"w": shared, "tied": shared}) == ([], [])
    assert torch.equal(shared, torch.ones(4, 3))
    both = ist.save_file(
        {"w": torch.ones(4, 3), "tied": torch.ones(4, 3)}, tmp_path / "b.safetensors"
    )
    target = torch.zeros(4, 3)
    with pytest.raises(interop.SharedTensorsError, match=r"\['tied', 'w'\]"):
        ist.load_into(both, {"w": target, "tied": target})
    assert not target.any()


# ----------------------------------------------------------------------- modules


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.head = torch.nn.Linear(3, 5)
        self.head.weight = self.embed.weight  # tied, as language models tie them


def test_save_model_dedupes_tied_weights_as_the_package(tmp_path):
    torch.manual_seed(0)
    model = _Tied()
    with pytest.raises(
        interop.SharedTensorsError, match=r"\['embed.weight', 'head.weight'\]"
    ) as info:
        ist.save_file(model.state_dict(), tmp_path / "x.safetensors")
    assert isinstance(info.value, RuntimeError)  # as the package raises it
    assert not (tmp_path / "x.safetensors").exists()
    ours = ist.save_model(model, tmp_path / "ours.safetensors", metadata={"a": "b"})
    st.save_model(model, tmp_path / "theirs.safetensors")
    with st.safe_open(ours, "pt") as f:
        assert f.metadata() == {"a": "b", "head.weight": "embed.weight"}
        assert sorted(f.keys()) == ["embed.weight", "head.bias"]
    with st.safe_open(tmp_path / "theirs.safetensors", "pt") as f:
        assert f.metadata() == {"head.weight": "embed.weight"}
    for path in (ours, tmp_path / "theirs.safetensors"):
        fresh = _Tied()
        assert ist.load_model(fresh, path) == st.load_model(_Tied(), path) == (set(), [])
        assert torch.equal(fresh.head.weight, model.embed.weight)
        assert fresh.head.weight.data_ptr() == fresh.embed.weight.data_ptr()  # still tied


def test_load_model_reports_and_refuses_as_the_package(tmp_path):
    model = torch.nn.Linear(3, 2)
    path = (
        st.save_file(
            {"weight": torch.ones(2, 3), "extra": torch.ones(1)}, tmp_path / "a.safetensors"
        )
        or tmp_path / "a.safetensors"
    )
    with pytest.raises(RuntimeError) as theirs:
        st.load_model(torch.nn.Linear(3, 2), path)
    before = model.weight.detach().clone()
    with pytest.raises(interop.CheckpointMismatchError) as ours:
        ist.load_model(model, path)
    assert str(ours.value) == str(theirs.value)
    assert torch.equal(model.weight.detach(), before)  # refused before anything was written
    assert (
        ist.load_model(model, path, strict=False)
        == st.load_model(torch.nn.Linear(3, 2), path, strict=False)
        == ({"bias"}, ["extra"])
    )
    assert torch.equal(model.weight.detach(), torch.ones(2, 3))
    with pytest.raises(interop.CheckpointMismatchError, match="'weight' is shape"):
        ist.load_model(torch.nn.Linear(2, 2), path, strict=False)


# ----------------------------------------------------------------------- sharded


def test_save_sharded_writes_the_hugging_face_layout(tmp_path):
    tensors = {
        "a": torch.zeros(100),  # 400 bytes each
        "b": torch.ones(100),
        "big": torch.arange(300.0),  # 1200 bytes: larger than a shard, alone
        "c": torch.full((50,), 2.0),  # 200
        "d": torch.full((50,), 3, dtype=torch.int16),  # 100
    }
    index = ist.save_sharded(tensors, tmp_path / "ckpt", max_shard_size=1000, metadata={"m": "1"})
    assert index == tmp_path / "ckpt" / "model.safetensors.index.json"
    names = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert sorted(os.listdir(index.parent)) == sorted([*names, index.name])
    data = json.loads(index.read_text())
    assert data["metadata"] == {"total_size": 400 + 400 + 1200 + 200 + 100, "m": "1"}
    # as huggingface_hub splits: a tensor over the limit goes alone, ahead of the shard filling
    assert data["weight_map"] == {
        "a": names[1],
        "b": names[1],
        "big": names[0],
        "c": names[1],
        "d": names[2],
    }
    for name in names:
        with st.safe_open(index.parent / name, "pt") as f:
            assert f.metadata() == {"format": "pt"}
    _same_dicts(ist.load_file(index), tensors)
    targets = {k: torch.empty_like(v) for k, v in tensors.items()}
    assert ist.load_into(index, targets) == ([], [])
    _same_dicts(targets, tensors)


def test_one_shard_is_a_single_model_file_and_old_layouts_go(tmp_path):
    tensors = {"a": torch.zeros(100), "b": torch.ones(100)}
    index = ist.save_sharded(tensors, tmp_path, max_shard_size=500)
    assert index.name == "model.safetensors.index.json"
    (tmp_path / "notes.txt").write_text("kept")
    single = ist.save_sharded(tensors, tmp_path, metadata={"m": "1"})
    assert single == tmp_path / "model.safetensors"
    assert sorted(os.listdir(tmp_path)) == ["model.safetensors", "notes.txt"]
    with st.safe_open(single, "pt") as f:
        assert f.metadata() == {"format": "pt", "m": "1"}
    _same_dicts(st.load_file(single), tensors)
    ist.save_sharded(tensors, tmp_path, max_shard_size="0.5KB")
    assert "model.safetensors" not in os.listdir(tmp_path)


@pytest.mark.parametrize(
    ("size", "limit"),
    [
        (1000, 1000),
        ("0.000001GB", 1000),  # huggingface_hub's units: decimal
        ("0.000000001 TB", 1000),
        ("1.5 mb", 1_500_000),
        ("1KB", 1000),
        ("0.00000095367431640625GiB", 1024),  # binary: 2**-20 GiB
        ("0.001953125MiB", 2048),
        ("2KiB", 2048),
    ],
)
def test_max_shard_size_in_huggingface_hubs_units(tmp_path, size, limit):
    half = torch.zeros(limit // 8)  # limit // 2 bytes
    fits = {"a": half, "b": torch.zeros(limit // 4 - half.numel())}  # exactly the limit
    assert ist.save_sharded(fits, tmp_path / "fits", max_shard_size=size).name == (
        "model.safetensors"
    )
    over = {"a": half, "b": torch.zeros(limit // 4 - half.numel() + 1)}  # 4 bytes more
    index = ist.save_sharded(over, tmp_path / "over", max_shard_size=size)
    assert index.name == INDEX
    assert len(set(json.loads(index.read_text())["weight_map"].values())) == 2


@pytest.mark.parametrize("size", [0, -1, "5XB", "GB", True, 1.5, None, "-1GB"])
def test_a_bad_max_shard_size_is_refused_before_anything_is_written(tmp_path, size):
    with pytest.raises(interop.InvalidValueError, match="max_shard_size"):
        ist.save_sharded({"a": torch.zeros(2)}, tmp_path / "d", max_shard_size=size)
    assert not (tmp_path / "d").exists()


def test_an_index_that_disagrees_with_its_shards_is_refused_before_filling(tmp_path):
    tensors = {"a": torch.ones(100), "b": torch.ones(100)}
    index = ist.save_sharded(tensors, tmp_path, max_shard_size=500)
    targets = {"a": torch.zeros(100), "b": torch.zeros(100)}
    good = json.loads(index.read_text())
    cases = [
        (
            good
            | {
                "weight_map": {
                    "a": good["weight_map"]["a"],
                    "b": "model-00009-of-00009.safetensors",
                }
            },
            interop.PathNotFoundError,
            "names the shard 'model-00009-of-00009.safetensors'",
        ),
        (
            good | {"weight_map": {"a": good["weight_map"]["b"], "b": good["weight_map"]["a"]}},
            interop.CheckpointFormatError,
            "holds \\['b'\\] that the index does not map to it",
        ),
        (
            good | {"weight_map": {"a": "../model.safetensors"}},
            interop.CheckpointFormatError,
            "not a file beside the index",
        ),
        ({"metadata": {}}, interop.CheckpointFormatError, 'no "weight_map"'),
        ([1, 2], interop.CheckpointFormatError, "not an object"),
    ]
    for content, exc, pattern in cases:
        index.write_text(json.dumps(content))
        with pytest.raises(exc, match=pattern):
            ist.load_into(index, targets)
        with pytest.raises(exc, match=pattern):
            ist.load_file(index)
        assert not targets["a"].any()
        assert not targets["b"].any()


# ----------------------------------------------------------------------- bad files


def _file(header: bytes | dict, data: bytes = b"", length: int | None = None) -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + data


F32x2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
BAD_FILES = {
    "shorter than the header length": (b"\x01\x00", "shorter than the header length"),
    "length past the end": (_file({"a": F32x2}, bytes(8), length=1000), "past the end of the file"),
    "absurd length": (_file(b"{}", length=2**60), "more than the format's 100000000"),
    "not utf-8": (_file(b'{"\xff": 1}   '), "not UTF-8"),
    "not json": (_file(b"{nope    "), "not JSON"),
    "not an object": (_file(b"[1, 2]  "), "not an object"),
    "twice": (_file(b'{"a": 1, "a": 2} '), r"names \['a'\] given more than once"),
    "overlap": (
        _file(
            {"a": F32x2, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12)
        ),
        "tensor 'b' starts at data byte 4, overlapping the tensor before it",
    ),
    "hole": (
        _file(
            {"a": F32x2, "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]}}, bytes(20)
        ),
        "tensor 'b' starts at data byte 12, leaving a hole",
    ),
    "negative": (
        _file({"a": F32x2 | {"data_offsets": [-8, 0]}}),
        r"data_offsets \[-8, 0\], expected two ints >= 0",
    ),
    "disagree": (_file({"a": F32x2 | {"shape": [3]}}, bytes(8)), r"\[3\] of F32 needs 12"),
    "unknown dtype": (
        _file({"a": F32x2 | {"dtype": "F4"}}, bytes(8)),
        "has dtype 'F4', expected one of BOOL",
    ),
    "bool shape": (_file({"a": F32x2 | {"shape": [True, 2]}}, bytes(8)), r"has shape \[True, 2\]"),
    "no offsets": (
        _file({"a": {"dtype": "F32", "shape": [2]}}, bytes(8)),
        "expected dtype, shape and data_offsets",
    ),
    "metadata not text": (_file({"__metadata__": {"k": 1}}), "__metadata__ is"),
    "truncated": (
        _file({"a": F32x2}, bytes(5)),
        r"truncated: (\d+) bytes where the header gives \d+",
    ),
    "longer": (_file({"a": F32x2}, bytes(9)), "longer than its header says"),
    "huge and truncated": (
        _file({"a": {"dtype": "F32", "shape": [2**40], "data_offsets": [0, 2**42]}}, bytes(64)),
        "truncated",
    ),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_lying_or_broken_file_is_refused_naming_it(tmp_path, case):
    raw, pattern = BAD_FILES[case]
    path = tmp_path / "bad.safetensors"
    path.write_bytes(raw)
    with pytest.raises(Exception):  # noqa: B017, PT011 (the package refuses it too, its own way)
        st.load_file(path)
    target = torch.full((2,), -1.0)
    for call in (
        lambda: ist.load_file(path),
        lambda: ist.load_file(path, framework="np", backend="pread"),
        lambda: ist.safe_open(path),
        lambda: ist.load_into(path, {"a": target}),
    ):
        with pytest.raises(interop.CheckpointFormatError, match=pattern) as info:
            call()
        assert repr(str(path)) in str(info.value)
        assert isinstance(info.value, ValueError)
    assert torch.equal(target, torch.full((2,), -1.0))


def test_a_file_replaced_after_its_header_was_read_is_refused(tmp_path):
    path = ist.save_file({"a": torch.zeros(4)}, tmp_path / "a.safetensors")
    with ist.safe_open(path) as f:
        ist.save_file({"a": torch.ones(4)}, path)
        with pytest.raises(interop.InvalidValueError, match="replaced or changed since"):
            f.get_tensor("a")


# ----------------------------------------------------------------------- bad arguments


@pytest.mark.parametrize(
    ("tensors", "metadata", "exc", "pattern"),
    [
        (
            lambda: {1: torch.zeros(1)},
            None,
            interop.InvalidTypeError,
            "tensor names of type str .got 1",
        ),
        (
            lambda: {"a": [1.0]},
            None,
            interop.InvalidTypeError,
            "tensor 'a' to be a tensor or an array",
        ),
        (lambda: {"a": None}, None, interop.InvalidTypeError, "tensor 'a' to be a tensor"),
        (lambda: {"a": "text"}, None, interop.InvalidTypeError, "tensor 'a' to be a tensor"),
        (
            lambda: [("a", torch.zeros(1))],
            None,
            interop.InvalidTypeError,
            "a dict of names to tensors",
        ),
        (
            lambda: {"a": torch.zeros(1)},
            {"k": 1},
            interop.InvalidTypeError,
            "metadata values of type str .got 1 for 'k'",
        ),
        (
            lambda: {"a": torch.zeros(1)},
            {2: "v"},
            interop.InvalidTypeError,
            "metadata keys of type str",
        ),
        (lambda: {"a": torch.zeros(1)}, ["k"], interop.InvalidTypeError, "metadata to be a dict"),
        (
            lambda: {"__metadata__": torch.zeros(1)},
            None,
            interop.InvalidValueError,
            "not a tensor name",
        ),
        (lambda: {"\udc80": torch.zeros(1)}, None, interop.InvalidValueError, "lone surrogate"),
        (
            lambda: {"a": torch.zeros(1, dtype=torch.complex128)},
            None,
            interop.UnsupportedDtypeError,
            "tensor 'a'",
        ),
        (
            lambda: {"a": torch.zeros(2, dtype=torch.float16).view(torch.complex32)},
            None,
            interop.UnsupportedDtypeError,
            "tensor 'a'",
        ),
        (
            lambda: {"a": torch.zeros(1, device="meta")},
            None,
            interop.InvalidValueError,
            "meta tensor.*tensor 'a'",
        ),
        (lambda: {"a": np.array(["x"], object)}, None, interop.UnsupportedDtypeError, "tensor 'a'"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_written(
    tmp_path, tensors, metadata, exc, pattern
):
    tensors = tensors()
    (tmp_path / "old.safetensors").write_bytes(b"old")
    for path in (tmp_path / "new.safetensors", tmp_path / "old.safetensors"):
        with pytest.raises(exc, match=pattern):
            ist.save_file(tensors, path, metadata)
    with pytest.raises(exc, match=pattern):
        ist.save_sharded(tensors, tmp_path / "dir", metadata=metadata)
    assert sorted(os.listdir(tmp_path)) == ["old.safetensors"]
    assert (tmp_path / "old.safetensors").read_bytes() == b"old"


def test_tensors_sharing_memory_are_refused_naming_them(tmp_path):
    base = torch.arange(10.0)
    arr = np.arange(10.0)
    for tensors, group in (
        ({"a": base, "b": base}, "['a', 'b']"),
        ({"x": base[2:6], "y": base[4:8], "z": torch.zeros(1)}, "['x', 'y']"),  # overlapping parts
        ({"n": arr, "t": torch.from_numpy(arr)[::2]}, "['n', 't']"),  # NumPy and torch alike
    ):
        with pytest.raises(interop.SharedTensorsError, match=re.escape(f"got [{group}")) as info:
            ist.save_file(tensors, tmp_path / "x.safetensors")
        assert isinstance(info.value, RuntimeError)
        with pytest.raises(interop.SharedTensorsError):
            ist.save_sharded(tensors, tmp_path / "d", max_shard_size=8)
    assert os.listdir(tmp_path) == []
    # parts of one storage that do not overlap are separate tensors, as for the package
    path = ist.save_file({"lo": base[:5], "hi": base[5:]}, tmp_path / "ok.safetensors")
    assert torch.equal(st.load_file(path)["hi"], base[5:])


@pytest.mark.parametrize(
    ("kwargs", "exc", "pattern"),
    [
        ({"framework": "tf"}, interop.InvalidValueError, "framework 'pt'"),
        ({"framework": "cupy"}, interop.InvalidValueError, "live on a GPU: pass device='cuda'"),
        ({"framework": "np", "device": "cuda"}, interop.InvalidValueError, "in host memory"),
        ({"device": "mps"}, interop.InvalidValueError, "device 'cpu', 'cuda'"),
        ({"device": [0]}, interop.InvalidTypeError, "device 'cpu', 'cuda'"),
        ({"backend": "fast"}, interop.InvalidValueError, "backend None, 'mmap' or 'pread'"),
        ({"progress": "yes"}, interop.InvalidTypeError, "progress"),
    ],
)
def test_bad_load_arguments_say_what_to_pass(tmp_path, kwargs, exc, pattern):
    path = ist.save_file({"a": torch.zeros(2)}, tmp_path / "a.safetensors")
    with pytest.raises(exc, match=pattern):
        ist.load_file(path, **kwargs)


def test_without_a_gpu_a_device_load_is_no_device_error(tmp_path):
    if interop._backends.cupy_device_count() > 0:
        pytest.skip("a CUDA device is visible")
    path = ist.save_file({"a": torch.zeros(2)}, tmp_path / "a.safetensors")
    for call in (
        lambda: ist.load_file(path, device="cuda"),
        lambda: ist.load_file(path, device=0, framework="cupy"),
        lambda: ist.safe_open(path, device="cuda:0"),
    ):
        with pytest.raises(interop.NoDeviceError, match="expected a CUDA device"):
            call()


# ----------------------------------------------------------------------- destinations


def test_the_name_is_kept_and_symlinks_are_followed(tmp_path):
    path = ist.save_file({"a": torch.zeros(2)}, tmp_path / "model")
    assert path == tmp_path / "model"  # no suffix added (save_npy adds .npy)
    assert path.exists()
    (tmp_path / "link").symlink_to(tmp_path / "target.safetensors")
    ist.save_file({"a": torch.ones(2)}, tmp_path / "link")
    assert (tmp_path / "link").is_symlink()
    assert torch.equal(st.load_file(tmp_path / "target.safetensors")["a"], torch.ones(2))


def test_a_directory_is_refused_before_any_data_moves(tmp_path):
    with pytest.raises(interop.PathIsADirectoryError):
        ist.save_file({"a": torch.zeros(2)}, tmp_path)
    with pytest.raises(interop.PathIsADirectoryError, match=r"model\.safetensors\.index\.json or"):
        ist.load_file(tmp_path)


class _Stop(Exception):
    pass


def test_an_interrupted_save_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = ist.save_file({"a": torch.zeros(2)}, tmp_path / "a.safetensors")
    old = path.read_bytes()

    def stop(done, total):
        raise _Stop

    tensors = {"a": torch.ones(1 << 16), "b": torch.ones(1 << 16)}
    with pytest.raises(_Stop):
        ist.save_file(tensors, path, progress=stop)
    assert path.read_bytes() == old
    with pytest.raises(_Stop):
        ist.save_sharded(tensors, tmp_path, max_shard_size=1 << 18, progress=stop)
    assert sorted(os.listdir(tmp_path)) == ["a.safetensors"]


def test_save_into_a_fifo_streams_the_file_in_order(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    tensors = {
        "big": torch.arange(1 << 16, dtype=torch.float64),
        "t": torch.arange(12.0).reshape(3, 4).T,
    }
    with reading_fifo(fifo) as received:
        ist.save_file(tensors, fifo)
    st.save_file({k: v.contiguous() for k, v in tensors.items()}, tmp_path / "theirs.safetensors")
    assert bytes(received) == (tmp_path / "theirs.safetensors").read_bytes()


_FULL_DISK = """
import json, os, sys
import numpy as np
import interop, interop.safetensors as ist
from interop.testing import EmulatedDevice
d = sys.argv[1]
path = os.path.join(d, "x.safetensors")
old = b"old checkpoint"
if {existing}:
    open(path, "wb").write(old)
a = np.arange(1 << 18, dtype=np.float64)  # 2 MiB: more than the tmpfs holds
backend = EmulatedDevice()
src = backend.asarray(a) if "{kind}" == "device" else a
got = None
try:
    ist.save_file({{"host": np.ones(1000), "src": src}}, path)
except Exception as exc:
    got = exc
print(json.dumps({{
    "classes": [c.__name__ for c in type(got).__mro__],
    "errno": getattr(got, "errno", None),
    "message": str(got),
    "listing": sorted(os.listdir(d)),
    "old_kept": open(path, "rb").read() == old if {existing} else None,
}}))
backend.close()
"""


@pytest.mark.parametrize("existing", [True, False], ids=["replacing", "new"])
@pytest.mark.parametrize("kind", ["host", "device"])
def test_a_full_disk_is_a_path_error_with_its_errno_and_nothing_changes(kind, existing):
    from tests.helpers.small_fs import run_on_tmpfs

    proc = run_on_tmpfs(_FULL_DISK.format(kind=kind, existing=existing), "1m")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert "PathError" in got["classes"]
    assert "OSError" in got["classes"]
    assert "TransferError" not in got["classes"]
    assert got["errno"] == errno.ENOSPC
    assert "save_file could not write" in got["message"]
    assert "the destination is untouched" in got["message"]
    assert got["listing"] == (["x.safetensors"] if existing else [])  # no temporary left
    assert got["old_kept"] in (True, None)


# ----------------------------------------------------------------------- memory


def test_saving_1_gib_takes_no_more_extra_host_memory_than_the_ring(tmp_path):
    """1 GiB of CPU tensors (one contiguous, one strided, one big-endian) saved from their
    own memory: the peak extra RSS (VmHWM reset first, in a fresh process) within the ring."""
    code = f"""
        import numpy as np, torch, interop, interop.safetensors as ist
        def status(key):
            for line in open("/proc/self/status"):
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
        big = torch.ones(896 << 18)  # 896 MiB, touched
        strided = np.ones((4096, 4096), np.float32).T  # 64 MiB
        swapped = np.ones(16 << 20, ">f4")  # 64 MiB, big-endian
        tensors = {{"big": big, "strided": strided, "swapped": swapped}}
        chunk, nbuf = 4 << 20, 2
        with interop.config.set(chunk_bytes=chunk, num_buffers=nbuf):
            ist.save_file({{k: v[:1024] for k, v in tensors.items()}}, r"{tmp_path / "warm"}")
            open("/proc/self/clear_refs", "w").write("5")  # reset the peak RSS
            base = status("VmRSS:")
            path = ist.save_file(tensors, r"{tmp_path / "big.safetensors"}")
            extra = status("VmHWM:") - base
        print(extra, nbuf * chunk, path.stat().st_size)
    """
    proc = run_python(code, timeout=300)
    assert proc.returncode == 0, proc.stderr
    extra, ring, size = map(int, proc.stdout.split())
    assert size > 1 << 30
    assert extra <= ring, f"peak extra RSS {extra} bytes exceeds the ring's {ring}"


def test_interop_safetensors_imports_without_torch_for_numpy(tmp_path):
    proc = run_python(
        f"""
        import sys
        sys.modules["torch"] = None  # as if not installed
        import numpy as np, interop.safetensors as ist
        path = ist.save_file({{"a": np.arange(3.0)}}, r"{tmp_path / "a.safetensors"}")
        print(ist.load_file(path, framework="np")["a"].tolist())
        try:
            ist.load_file(path)
        except ImportError as exc:
            print(type(exc).__name__)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[0.0,", "1.0,", "2.0]", "BackendUnavailableError"]


def test_import_interop_does_not_import_the_checkpoint_modules():
    proc = run_python("import sys, interop; print('interop.io.safetensors' in sys.modules)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_a_reader_thread_and_a_saver_agree(tmp_path):
    """Saves replace the file atomically: a reader never sees a half-written one."""
    path = ist.save_file({"w": torch.zeros(1 << 16)}, tmp_path / "a.safetensors")
    errors: list[BaseException] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                w = ist.load_file(path, backend="pread")["w"]
            except interop.InvalidValueError as exc:  # replaced between header and data
                if "replaced or changed since" not in str(exc):
                    errors.append(exc)
                continue
            except BaseException as exc:
                errors.append(exc)
                return
            if not w.eq(w[0]).all():
                errors.append(AssertionError(f"a half-written file was read: {w}"))

    reader = threading.Thread(target=read)
    reader.start()
    for i in range(20):
        ist.save_file({"w": torch.full((1 << 16,), float(i))}, path)
    stop.set()
    reader.join(30)
    assert errors == []
