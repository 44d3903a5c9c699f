"""interop.dask: save_npy / load_npy of dask arrays, on a real distributed
LocalCluster of worker processes and on dask's threaded scheduler.

One cluster (2 worker processes, 1 thread each) serves the whole module; the
functions that make blocks live at module level so the workers can import them.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

dask = pytest.importorskip("dask", reason="interop.dask needs the 'dask' extra")
pytest.importorskip("distributed", reason="interop.dask's tests need the 'dask' extra")

import dask.array as da  # noqa: E402
from dask.delayed import Delayed  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import interop  # noqa: E402
import interop.dask as idask  # noqa: E402
from interop import _backends  # noqa: E402
from interop.dask import SaveError  # noqa: E402
from interop.io._format import Layout  # noqa: E402
from tests.helpers import NO_GPU, NUMPY_DTYPES, assert_same, run_python, sample  # noqa: E402

MiB = 1 << 20
# A piece size every version of interop.config accepts as is (none raises a
# chunk_bytes of 64 KiB): tests that need a block written in several pieces
# use blocks many times larger.
PIECE = 64 << 10


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def cluster():
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            # the scheduler's HTTP server on a free port: 8787 may be taken on the machine
            scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
        ) as local,
        Client(local, set_as_default=False) as client,
    ):
        yield local, client


@pytest.fixture
def client(cluster):
    """The module's distributed client, current for the test (what dask uses)."""
    _, c = cluster
    c.wait_for_workers(2, timeout=60)
    with c.as_current():
        yield c


@pytest.fixture
def threads():
    with dask.config.set(scheduler="threads"):
        yield


def _leftovers(directory: Path) -> list[str]:
    """Hidden files: what a save's temporary file would be called."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


# ------------------------------------------------------------------ blocks made on workers


def _fortran_block(block_info=None):
    """A Fortran-ordered float32 block whose values say where it is (no C copy made)."""
    info = block_info[None]
    (r0, _), (c0, _) = info["array-location"]
    rows, cols = info["chunk-shape"]
    out = np.empty((rows, cols), np.float32, order="F")
    out[...] = np.arange(c0, c0 + cols, dtype=np.float32)
    out[:, 0] = np.arange(r0, r0 + rows, dtype=np.float32)
    return out


def _fortran(block):
    out = np.array(block, order="F")  # numpy.asfortranarray would make a 0-d block 1-d
    assert out.ndim < 2 or not out.flags.c_contiguous or 1 in out.shape or 0 in out.shape
    return out


def _raise_in_block(block, bad, block_info=None):
    if tuple(block_info[0]["chunk-location"]) == bad:
        raise ValueError(f"block {bad} cannot be made")
    return block


class _KillOnSecondPiece(np.ndarray):
    """A block that kills its worker process while it is being written: the
    second piece taken of it (after the first was written) kills the process,
    once (a marker file records it), so a retry finds a healthy block."""

    marker: str | None = None
    taken = 0

    def __getitem__(self, idx):
        if self.marker is not None:
            self.taken += 1
            if self.taken == 2 and not os.path.exists(self.marker):
                Path(self.marker).touch()
                os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(idx)


def _killing_block(block, marker, kill, block_info=None):
    if tuple(block_info[0]["chunk-location"]) != kill:
        return block
    out = np.asfortranarray(block).view(_KillOnSecondPiece)
    out.marker = marker
    return out


class _HeldAfterFirstPiece(np.ndarray):
    """A block still being written when the save fails elsewhere: once its
    first piece is written, taking the second opens the file ``gate`` and
    then waits until the save's temporary file is gone (at most 60 s), and
    one second more, as a long piece would."""

    gate: str | None = None
    taken = 0

    def __getitem__(self, idx):
        if self.gate is not None:
            self.taken += 1
            if self.taken == 2:
                import time

                directory = os.path.dirname(self.gate)
                temporaries = [
                    os.path.join(directory, n) for n in os.listdir(directory) if n[0] == "."
                ]
                Path(self.gate).touch()
                deadline = time.monotonic() + 60
                while any(map(os.path.exists, temporaries)) and time.monotonic() < deadline:
                    time.sleep(0.01)
                time.sleep(1)
        return super().__getitem__(idx)


def _held_or_filling(gate, rows, block_info=None):
    """Block 0: Fortran-ordered (written piece by piece), held after its first
    piece; block 1: made once block 0 is being written, and larger than the
    file system's free space."""
    info = block_info[None]
    shape = tuple(info["chunk-shape"])
    if info["chunk-location"][0] == 0:
        out = np.asfortranarray(np.ones(shape)).view(_HeldAfterFirstPiece)
        out.gate = gate
        return out
    _gated_block(None, gate)
    return np.full(shape, 2.0)


def _held_or_failing(gate, rows, block_info=None):
    """As :func:`_held_or_filling`, but block 1 raises once block 0 is being written."""
    info = block_info[None]
    if info["chunk-location"][0] == 0:
        return _held_or_filling(gate, rows, block_info)
    _gated_block(None, gate)
    raise RuntimeError("block 1 cannot be made")


def _gated_block(block, gate, block_info=None):
    """Wait (at most 30 s) until the file ``gate`` exists before giving the block."""
    import time

    deadline = time.monotonic() + 30
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)
    return block


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak() -> int:
    """Reset this process's peak RSS (VmHWM) to its current RSS; return that."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status("VmRSS:")


def _peak() -> int:
    return _status("VmHWM:")


# ------------------------------------------------------------------ layout


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_block_runs_match_the_c_order_offsets(data):
    """Every block's runs list exactly the file offsets of its elements, in order."""
    shape = tuple(data.draw(st.lists(st.integers(1, 6), min_size=0, max_size=4)))
    start = tuple(data.draw(st.integers(0, n - 1)) for n in shape)
    stop = tuple(data.draw(st.integers(s + 1, n)) for s, n in zip(start, shape, strict=True))
    itemsize = data.draw(st.sampled_from([1, 2, 8]))
    layout = Layout("x", shape, np.dtype(f"V{itemsize}"), 128)
    block = tuple(b - a for a, b in zip(start, stop, strict=True))
    runs = layout.runs(start, block)
    index = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    region = index[tuple(slice(a, b) for a, b in zip(start, stop, strict=True))]
    expected = (128 + region.reshape(-1) * itemsize).tolist()
    got = [o + k for o, _, n in runs.segments(0, region.size * itemsize) for k in range(n)]
    assert got[::itemsize] == expected
    assert len(got) == region.size * itemsize
    # runs are maximal: consecutive runs are never adjacent in the file
    assert all(np.diff(runs.offsets) > runs.nbytes)
    # any byte range maps onto the same offsets
    lo = data.draw(st.integers(0, region.size * itemsize - 1))
    hi = data.draw(st.integers(lo + 1, region.size * itemsize))
    part = [o + k for o, _, n in runs.segments(lo, hi - lo) for k in range(n)]
    assert part == got[lo:hi]


# ------------------------------------------------------------------ threaded scheduler


@pytest.mark.parametrize(
    ("shape", "chunks"),
    [
        ((13,), 4),
        ((7, 10), ((3, 4), (1, 6, 3))),  # blocks that do not span the last axis
        ((5, 6, 7), (2, 3, 7)),  # ... that span it but not the middle one
        ((4, 3, 2), 1),  # one element per block
        ((6, 1, 5), (6, 1, 2)),
        ((), ()),
        ((0, 4), 2),
        ((3, 0, 2), 2),
    ],
    ids=["1d", "2d-ragged", "3d-middle", "elements", "unit-axis", "0d", "empty", "empty-mid"],
)
@pytest.mark.parametrize("layout", ["C", "F"])
def test_round_trip_threaded(tmp_path, threads, shape, chunks, layout):
    a = sample(shape, np.float64, seed=1)
    x = da.from_array(a, chunks=chunks)
    if layout == "F":  # non-contiguous blocks go through the bounded buffer
        x = x.map_blocks(_fortran, meta=x._meta)
    path = idask.save_npy(x, tmp_path / "a.npy", chunk_bytes=24)
    assert path == tmp_path / "a.npy"
    assert_same(np.load(path), a)
    assert np.load(path, mmap_mode="r").shape == a.shape
    back = idask.load_npy(path, chunks=chunks)
    assert back.chunks == x.chunks
    assert_same(back.compute(), a)
    assert _leftovers(tmp_path) == []


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_any_chunking_round_trips(tmp_path_factory, data):
    shape = tuple(data.draw(st.lists(st.integers(1, 9), min_size=1, max_size=3)))
    chunks = tuple(data.draw(st.integers(1, n)) for n in shape)
    reread = tuple(data.draw(st.integers(1, n)) for n in shape)
    a = sample(shape, np.int16, seed=len(shape))
    path = tmp_path_factory.mktemp("any") / "a.npy"
    with dask.config.set(scheduler="sync"):
        idask.save_npy(da.from_array(a, chunks=chunks), path, chunk_bytes=6)
        assert_same(np.load(path), a)
        assert_same(idask.load_npy(path, chunks=reread).compute(), a)


def test_pieces_that_cut_runs(tmp_path, threads):
    """Blocks written in pieces whose edges fall inside a run (and runs that
    span several pieces): 800 KB runs, 64 KiB pieces, Fortran-ordered blocks."""
    a = sample((4, 300, 1000), np.float64, seed=4)
    x = da.from_array(a, chunks=(2, 100, 1000)).map_blocks(_fortran, meta=np.empty((0, 0, 0)))
    idask.save_npy(x, tmp_path / "p.npy", chunk_bytes=PIECE)
    assert_same(np.load(tmp_path / "p.npy"), a)
    assert_same(idask.load_npy(tmp_path / "p.npy", chunks=(3, 70, 300)).compute(), a)


def test_fortran_order_file_loads_as_numpy_does(tmp_path, threads):
    a = np.asfortranarray(sample((9, 7, 4), np.float32))
    np.save(tmp_path / "f.npy", a)
    back = idask.load_npy(tmp_path / "f.npy", chunks=(4, 3, 2))
    got = back.compute()
    assert_same(got, a)
    assert back.to_delayed()[1, 1, 1].compute().flags.f_contiguous  # as the file is


def test_bfloat16_header_and_values(tmp_path, threads):
    a = np.linspace(-3, 3, 60).astype(ml_dtypes.bfloat16).reshape(6, 10)
    idask.save_npy(da.from_array(a, chunks=(4, 3)), tmp_path / "b.npy")
    with open(tmp_path / "b.npy", "rb") as f:
        assert b"'descr': 'bfloat16'" in f.read(128)
    assert_same(np.load(tmp_path / "b.npy"), a)
    back = idask.load_npy(tmp_path / "b.npy", chunks=5)
    assert back.dtype == np.dtype(ml_dtypes.bfloat16)
    assert_same(back.compute(), a)


def test_file_matches_interop_save_npy(tmp_path, threads):
    a = sample((11, 6), np.complex64)
    interop.save_npy(a, tmp_path / "one.npy")
    idask.save_npy(da.from_array(a, chunks=(4, 5)), tmp_path / "many.npy")
    assert (tmp_path / "one.npy").read_bytes() == (tmp_path / "many.npy").read_bytes()


def test_compute_false_returns_the_delayed_save(tmp_path, threads):
    a = sample((10, 8), np.int32)
    x = da.from_array(a, chunks=3)
    delayed = idask.save_npy(x, tmp_path / "d.npy", compute=False)
    assert isinstance(delayed, Delayed)
    assert not (tmp_path / "d.npy").exists()
    assert len(_leftovers(tmp_path)) == 1  # the caller made the sized temporary file
    (path, total) = dask.compute(delayed, x.sum())  # computed along with other work
    assert path == tmp_path / "d.npy"
    assert total == a.sum()
    assert_same(np.load(path), a)
    assert _leftovers(tmp_path) == []


def test_block_raising_threaded_keeps_the_old_file(tmp_path, threads):
    old = tmp_path / "a.npy"
    np.save(old, np.arange(3))
    os.chmod(old, 0o640)
    before = old.read_bytes()
    x = da.from_array(sample((8, 8), np.float32), chunks=4)
    bad = x.map_blocks(_raise_in_block, (1, 0), meta=x._meta)
    with pytest.raises(SaveError, match=r"cannot be made.*of 4 blocks were written") as info:
        idask.save_npy(bad, old)
    assert isinstance(info.value.__cause__, ValueError)
    assert isinstance(info.value, interop.TransferError)
    assert info.value.nblocks == 4
    assert (1, 0) not in info.value.blocks_done
    assert old.read_bytes() == before
    assert stat.S_IMODE(old.stat().st_mode) == 0o640
    assert _leftovers(tmp_path) == []


def test_npy_suffix_appended_as_numpy_save_does(tmp_path, threads):
    a = sample((3, 4), np.int8)
    assert idask.save_npy(da.from_array(a, chunks=2), tmp_path / "weights") == (
        tmp_path / "weights.npy"
    )
    assert_same(np.load(tmp_path / "weights.npy"), a)


def test_existing_mode_kept_and_symlink_followed(tmp_path, threads):
    target = tmp_path / "real.npy"
    target.write_bytes(b"old")
    os.chmod(target, 0o604)
    link = tmp_path / "link.npy"
    link.symlink_to(target)
    a = sample((5, 5), np.uint8)
    assert idask.save_npy(da.from_array(a, chunks=2), link) == link
    assert link.is_symlink()
    assert_same(np.load(target), a)
    assert stat.S_IMODE(target.stat().st_mode) == 0o604


def test_block_that_does_not_match_the_arrays_dtype(tmp_path, threads):
    x = da.from_array(np.ones((4, 4), np.float32), chunks=2)
    lying = x.map_blocks(lambda b: b.astype(np.float64), meta=x._meta)
    with pytest.raises(SaveError, match=r"expected a block of shape \(2, 2\) and dtype float32"):
        idask.save_npy(lying, tmp_path / "l.npy")
    assert not (tmp_path / "l.npy").exists()


def test_interrupted_save_cancels_and_removes_the_temporary(tmp_path):
    """KeyboardInterrupt while the workers write: re-raised, nothing left behind."""
    code = f"""
        import os, signal, threading, time
        from pathlib import Path
        import dask, dask.array as da, numpy as np
        import interop.dask as idask
        from tests.io.test_dask import _gated_block
        d, gate = Path(r"{tmp_path}"), r"{tmp_path / "gate"}"
        x = da.from_array(np.ones((8, 8)), chunks=4)
        x = x.map_blocks(_gated_block, gate, meta=x._meta)
        def interrupt():
            while not any(p.name.startswith(".") for p in d.iterdir()):
                time.sleep(0.01)
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGINT)  # a real signal wakes the waiting main thread
        threading.Thread(target=interrupt).start()
        try:
            with dask.config.set(scheduler="threads"):
                idask.save_npy(x, d / "a.npy")
        except KeyboardInterrupt:
            print("interrupted", sorted(p.name for p in d.iterdir()))
        Path(gate).touch()
    """
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "interrupted []"


# ------------------------------------------------------------------ bad input


def test_bad_input_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(TypeError, match=r"expected a dask.array.Array \(got numpy.ndarray\)"):
        idask.save_npy(np.ones(3), tmp_path / "a.npy")
    with pytest.raises(TypeError, match="expected numeric data"):
        idask.save_npy(
            da.from_array(np.array([None, 1], dtype=object), chunks=1), tmp_path / "a.npy"
        )
    x = da.from_array(np.arange(10), chunks=3)
    with pytest.raises(ValueError, match=r"known chunk sizes .*compute_chunk_sizes"):
        idask.save_npy(x[x > 3], tmp_path / "a.npy")
    with pytest.raises(ValueError, match="chunk_bytes"):
        idask.save_npy(x, tmp_path / "a.npy", chunk_bytes=0)
    (tmp_path / "dir.npy").mkdir()
    with pytest.raises(IsADirectoryError, match="expected a file path"):
        idask.save_npy(x, tmp_path / "dir.npy")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        idask.save_npy(x, tmp_path / "missing" / "a.npy")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="needs a regular file"):
        idask.save_npy(x, fifo)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.npy", "fifo"]
    assert list((tmp_path / "dir.npy").iterdir()) == []


def test_load_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError):
        idask.load_npy(tmp_path / "missing.npy", chunks=2)
    (tmp_path / "junk.npy").write_bytes(b"not a npy file at all")
    with pytest.raises(ValueError, match=r"is not a readable \.npy file"):
        idask.load_npy(tmp_path / "junk.npy", chunks=2)
    np.save(tmp_path / "a.npy", np.arange(12.0).reshape(3, 4))
    with pytest.raises(ValueError, match=r"expected chunks for shape \(3, 4\)"):
        idask.load_npy(tmp_path / "a.npy", chunks=(1, 2, 3))
    with pytest.raises(ValueError, match="expected 'cpu', 'cuda' or 'cuda:N'"):
        idask.load_npy(tmp_path / "a.npy", chunks=2, device="gpu")
    for zero in (0, (0, 2)):  # dask itself would divide by zero
        with pytest.raises(ValueError, match=r"a block size of 0\); pass positive block sizes"):
            idask.load_npy(tmp_path / "a.npy", chunks=zero)


def test_load_chunks_default_to_auto(tmp_path):
    a = np.arange(12.0).reshape(3, 4)
    np.save(tmp_path / "a.npy", a)
    lazy = idask.load_npy(tmp_path / "a.npy")
    assert lazy.chunks == da.from_array(a, chunks="auto").chunks
    np.testing.assert_array_equal(lazy.compute(scheduler="sync"), a)


def test_load_without_a_gpu_refuses_device_blocks(tmp_path):
    np.save(tmp_path / "a.npy", np.ones(4))
    proc = run_python(
        f"""
        import interop, interop.dask
        try:
            interop.dask.load_npy(r"{tmp_path / "a.npy"}", chunks=2, device="cuda")
        except interop.NoDeviceError as exc:
            print(exc)
        """,
        env=NO_GPU,  # no device, on any machine
    )
    assert proc.returncode == 0, proc.stderr
    assert "expected a CUDA device" in proc.stdout


def test_file_replaced_after_load_npy_is_detected(tmp_path, threads):
    np.save(tmp_path / "a.npy", np.ones((4, 4)))
    lazy = idask.load_npy(tmp_path / "a.npy", chunks=2)
    np.save(tmp_path / "a.npy", np.ones((4, 5)))
    with pytest.raises(ValueError, match="it was replaced or changed since: call load_npy again"):
        lazy.compute()


def test_a_nul_byte_in_a_path_is_refused(tmp_path):
    bad = str(tmp_path / "a\0b.npy")
    with pytest.raises(interop.InvalidValueError, match="without a NUL byte"):
        idask.save_npy(da.arange(4, chunks=2), bad)
    with pytest.raises(interop.InvalidValueError, match="without a NUL byte"):
        idask.load_npy(bad, chunks=2)
    assert list(tmp_path.iterdir()) == []


def test_import_interop_does_not_import_dask():
    proc = run_python(
        """
        import sys, interop
        print(sorted(m for m in ("dask", "distributed") if m in sys.modules))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_missing_dask_names_the_extra():
    proc = run_python(
        """
        import sys
        sys.modules["dask"] = None  # as if not installed
        import interop
        try:
            import interop.dask
        except ImportError as exc:
            assert isinstance(exc, interop.BackendUnavailableError)
            print(exc)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert f"install it with: {_backends.install_command('dask')}" in proc.stdout


# ------------------------------------------------------------------ distributed cluster


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_round_trip_every_dtype_on_the_cluster(tmp_path, client, dtype):
    a = sample((9, 10), dtype, seed=2)
    x = da.from_array(a, chunks=((4, 5), (3, 3, 4)))
    idask.save_npy(x, tmp_path / "a.npy")
    assert_same(np.load(tmp_path / "a.npy"), a)
    back = idask.load_npy(tmp_path / "a.npy", chunks=(5, 4))
    assert back.dtype == a.dtype
    # compared through an integer view made on the workers: distributed cannot
    # move float8_e5m2 NumPy blocks between processes (see docs/dask.md)
    bits = interop.dtypes.int_view_of_numpy(a.dtype)
    assert_same(back.view(bits).compute(), a.view(bits))


def test_blocks_are_written_and_read_by_the_workers(tmp_path, client):
    """The file grows only from worker processes; the blocks come back as NumPy."""
    x = da.map_blocks(
        _fortran_block,
        dtype=np.float32,
        chunks=((300, 200), (70, 60)),
        meta=np.empty((0, 0), np.float32),
    )
    idask.save_npy(x, tmp_path / "w.npy", chunk_bytes=1000)
    assert_same(np.load(tmp_path / "w.npy"), x.compute())
    back = idask.load_npy(tmp_path / "w.npy", chunks=(128, 50))
    blocks = client.compute(back.to_delayed().ravel().tolist(), sync=True)
    assert all(type(b) is np.ndarray for b in blocks)
    assert_same(back.compute(), x.compute())


def test_block_raising_on_the_cluster(tmp_path, client):
    x = da.from_array(sample((8, 9), np.float32), chunks=(4, 3))
    bad = x.map_blocks(_raise_in_block, (1, 2), meta=x._meta)
    with pytest.raises(SaveError, match=r"block\(s\) \[\(1, 2\)\] could not be written") as info:
        idask.save_npy(bad, tmp_path / "a.npy")
    err = info.value
    assert isinstance(err.__cause__, ValueError)
    assert "cannot be made" in str(err.__cause__)
    assert err.nblocks == 6
    assert (1, 2) not in err.blocks_done
    assert set(err.blocks_done) <= {(i, j) for i in range(2) for j in range(3)}
    assert list(tmp_path.iterdir()) == []


def test_a_file_replaced_before_compute_is_refused_by_every_block(tmp_path, client):
    path = tmp_path / "a.npy"
    np.save(path, np.zeros((8, 4)))
    lazy = idask.load_npy(path, chunks=(2, 4))
    np.save(tmp_path / "new.npy", np.ones((8, 4)))  # same shape and dtype
    os.replace(tmp_path / "new.npy", path)
    with pytest.raises(interop.InvalidValueError, match="it was replaced or changed since"):
        lazy.compute()
    for block in lazy.to_delayed().ravel():
        with pytest.raises(interop.InvalidValueError, match="it was replaced or changed since"):
            client.compute(block).result()
    assert_same(np.load(path), np.ones((8, 4)))  # the new file is untouched
    assert_same(idask.load_npy(path, chunks=(2, 4)).compute(), np.ones((8, 4)))


@pytest.mark.parametrize("dtype", [np.uint8, np.float64])
def test_a_masked_dask_array_is_refused_and_nothing_is_written(tmp_path, client, dtype):
    path = tmp_path / "m.npy"
    np.save(path, np.arange(3))  # an existing file: kept as it is
    before = path.read_bytes()
    data = da.arange(6, chunks=3).astype(dtype)
    masked = da.ma.masked_array(data, mask=np.array([0, 1, 0, 1, 0, 0], bool))
    with pytest.raises(interop.InvalidTypeError, match=r"without a mask.*da\.ma\.filled"):
        idask.save_npy(masked, path)
    # masked blocks under a plain array's meta are refused by their tasks
    hidden = data.map_blocks(np.ma.masked_less, 2, meta=np.empty(0, dtype))
    with pytest.raises(SaveError) as info:
        idask.save_npy(hidden, path)
    assert isinstance(info.value.__cause__, interop.InvalidTypeError)
    assert path.read_bytes() == before
    assert _leftovers(tmp_path) == []


def test_worker_killed_mid_save_leaves_no_file(tmp_path, cluster, client, monkeypatch):
    """With no retries allowed, a worker killed while writing a block fails the
    save; the nanny restarts the worker and the cluster keeps working."""
    local, _ = cluster
    monkeypatch.setattr(local.scheduler, "allowed_failures", 0)
    x = da.from_array(sample((256, 1024), np.float64), chunks=(128, 1024))  # 1 MiB blocks
    dying = x.map_blocks(_killing_block, str(tmp_path / "killed"), (1, 0), meta=x._meta)
    with pytest.raises(SaveError, match=r"\(1, 0\)\] could not be written") as info:
        idask.save_npy(dying, tmp_path / "a.npy", chunk_bytes=PIECE)
    assert type(info.value.__cause__).__name__ == "KilledWorker"
    assert (tmp_path / "killed").exists()  # it died in the middle of the block
    assert sorted(p.name for p in tmp_path.iterdir()) == ["killed"]
    client.wait_for_workers(2, timeout=60)
    idask.save_npy(x, tmp_path / "after.npy")
    assert_same(np.load(tmp_path / "after.npy"), x.compute())


def test_retried_block_writes_the_same_bytes(tmp_path, client):
    """A worker killed after part of its block was written: Dask retries the
    task elsewhere and the retry rewrites the whole block, identically."""
    a = sample((256, 1024), np.float64, seed=5)
    x = da.from_array(a, chunks=(64, 1024))  # 512 KiB blocks: 8 pieces each
    dying = x.map_blocks(_killing_block, str(tmp_path / "killed"), (2, 0), meta=x._meta)
    idask.save_npy(dying, tmp_path / "a.npy", chunk_bytes=PIECE)
    assert (tmp_path / "killed").exists()
    assert_same(np.load(tmp_path / "a.npy"), a)
    assert _leftovers(tmp_path) == []
    client.wait_for_workers(2, timeout=60)


def test_cancelled_delayed_save_leaves_no_file(tmp_path, client):
    gate = tmp_path / "gate"
    x = da.from_array(np.ones((8, 8)), chunks=4).map_blocks(
        _gated_block, str(gate), meta=np.empty((0, 0))
    )
    delayed = idask.save_npy(x, tmp_path / "c.npy", compute=False)
    future = client.compute(delayed)
    future.cancel()
    gate.touch()
    client.submit(sum, [1, 2]).result()  # the scheduler has seen the cancellation
    assert future.cancelled()
    assert not (tmp_path / "c.npy").exists()
    # as documented: the caller's temporary file stays, for the caller to delete
    (leftover,) = _leftovers(tmp_path)
    (tmp_path / leftover).unlink()
    # computed without cancelling, the same kind of graph completes
    delayed = idask.save_npy(x, tmp_path / "c.npy", compute=False)
    assert client.compute(delayed).result() == tmp_path / "c.npy"
    assert_same(np.load(tmp_path / "c.npy"), np.ones((8, 8)))


def test_memory_per_worker_and_on_the_client(tmp_path, client):
    """Measured: a worker's peak RSS grows by at most its block plus the
    bounded buffers (not a second copy of the block); the client's by almost
    nothing while 128 MiB are saved and loaded."""
    chunk = 2 * MiB
    rows = 4096  # blocks of 4096 x 1024 float32 = 16 MiB, Fortran-ordered
    x = da.map_blocks(
        _fortran_block,
        dtype=np.float32,
        chunks=((rows,) * 8, (1024,)),
        meta=np.empty((0, 0), np.float32),
    )
    block = rows * 1024 * 4
    slack = 6 * MiB  # the interpreter, dask's bookkeeping, allocator rounding
    base = client.run(_reset_peak)
    client_base = _reset_peak()
    idask.save_npy(x, tmp_path / "m.npy", chunk_bytes=chunk)
    peak = client.run(_peak)
    client_extra = _peak() - client_base
    for worker, before in base.items():
        extra = peak[worker] - before
        assert extra <= block + 2 * chunk + slack, f"{worker}: {extra / MiB:.1f} MiB"
    assert client_extra <= slack, f"client: {client_extra / MiB:.1f} MiB"
    assert (tmp_path / "m.npy").stat().st_size == 8 * block + 128

    base = client.run(_reset_peak)
    client_base = _reset_peak()
    back = idask.load_npy(tmp_path / "m.npy", chunks=(rows, 1024))
    total = back.sum(dtype=np.float64).compute()
    peak = client.run(_peak)
    client_extra = _peak() - client_base
    for worker, before in base.items():
        extra = peak[worker] - before
        assert extra <= block + slack, f"{worker}: {extra / MiB:.1f} MiB"
    assert client_extra <= slack, f"client: {client_extra / MiB:.1f} MiB"
    assert total == pytest.approx(float(x.sum(dtype=np.float64).compute()))


# ------------------------------------------------------------------ GPU (threaded scheduler)
# CUDA only: dask arrays of CuPy blocks (meta, from_array, map_blocks) need a
# real array library; the emulated device's arrays are no dask blocks. The
# device path of the write task runs on the emulated device in the tests after.


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_gpu_cupy_blocks_round_trip(tmp_path, cp, layout, threads):
    a = cp.arange(37 * 53, dtype=cp.float32).reshape(37, 53)
    x = da.from_array(a, chunks=(10, 20), asarray=False)
    if layout == "transposed":
        x = x.map_blocks(cp.asfortranarray, meta=x._meta)
    idask.save_npy(x, tmp_path / "g.npy", chunk_bytes=256)
    np.testing.assert_array_equal(np.load(tmp_path / "g.npy"), cp.asnumpy(a))
    back = idask.load_npy(tmp_path / "g.npy", chunks=(16, 7), device="cuda")
    assert type(back._meta) is cp.ndarray
    block = back.blocks[1, 2].compute()
    assert type(block) is cp.ndarray
    assert bool((block == a[16:32, 14:21]).all())
    assert bool((back.compute() == a).all())


@pytest.mark.gpu
def test_gpu_bfloat16_and_fortran_file_to_device(tmp_path, cp, threads):
    a = np.linspace(-4, 4, 300).astype(ml_dtypes.bfloat16).reshape(15, 20)
    x = da.from_array(cp.asarray(a), chunks=(4, 7), asarray=False)
    idask.save_npy(x, tmp_path / "b.npy")
    assert_same(np.load(tmp_path / "b.npy"), a)
    f = np.asfortranarray(sample((9, 11), np.float64))
    np.save(tmp_path / "f.npy", f)
    back = idask.load_npy(tmp_path / "f.npy", chunks=(4, 4), device="cuda").compute()
    np.testing.assert_array_equal(cp.asnumpy(back), f)


@pytest.mark.gpu
def test_gpu_big_endian_file_to_device_blocks_in_native_order(tmp_path, cp, threads):
    """CuPy holds no big-endian dtype: the blocks and the declared dtype are native."""
    a = sample((12, 10), np.float64, seed=5)
    np.save(tmp_path / "be.npy", a.astype(">f8"))
    back = idask.load_npy(tmp_path / "be.npy", chunks=(5, 4), device="cuda")
    assert back.dtype == np.dtype("float64")
    assert back.dtype.isnative
    assert type(back._meta) is cp.ndarray
    np.testing.assert_array_equal(cp.asnumpy(back.compute()), a)
    host = idask.load_npy(tmp_path / "be.npy", chunks=(5, 4))  # host blocks keep the file's
    assert host.dtype == np.dtype(">f8")
    np.testing.assert_array_equal(host.compute(), a)


@pytest.mark.gpu
def test_gpu_threads_share_one_file(tmp_path, cp, threads):
    """Many device blocks written by concurrent threads land at their offsets, each
    after the kernel that made it (queued behind a sleep on the default stream)."""
    a = cp.random.default_rng(0).standard_normal((256, 300), dtype=cp.float32)
    (a * 2).sum()  # compile before any sleep
    x = da.from_array(a, chunks=(32, 100), asarray=False).map_blocks(_late_double)
    with dask.config.set(num_workers=4):
        idask.save_npy(x, tmp_path / "t.npy", chunk_bytes=4096)
    np.testing.assert_array_equal(np.load(tmp_path / "t.npy"), cp.asnumpy(a) * 2)


def _late_double(block):
    """``2 * block``, made after 10 ms of sleep queued on the default stream."""
    import torch

    torch.cuda._sleep(20_000_000)  # PyTorch's current stream: the legacy default one
    return block * 2  # CuPy's current stream: the same; written after the sleep


# ----------------------------------------------------------------- device blocks, emulated


@pytest.mark.parametrize("corner", [(0, 0), (160, 120), (480, 360)])
def test_a_device_block_streams_through_the_pipeline_into_its_runs(tmp_path, corner):
    """The write task's device path (pinned slots written straight to the
    block's runs) on the host backend: a block that does not span whole
    trailing axes lands at its C-order offsets."""
    from interop.io._format import Layout, header_bytes
    from interop.io.dask import _write_block
    from interop.testing import EmulatedDevice

    full = sample((640, 480), np.float64, seed=4)
    path = tmp_path / "blocks.npy"
    header = header_bytes(full.shape, full.dtype)
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(len(header) + full.nbytes)
    layout = Layout(str(path), full.shape, full.dtype, len(header))
    device = EmulatedDevice(delay=0.0002)
    r, c = corner
    block = full[r : r + 160, c : c + 120]  # 150 KiB: three chunks of 64 KiB
    where = [(r, r + 160), (c, c + 120)]
    info = {0: {"array-location": where, "chunk-location": (r // 160, c // 120)}}
    with interop.config.set(num_buffers=2):
        written = _write_block(
            device.asarray(block).T.T, layout=layout, chunk_bytes=1 << 16, block_info=info
        )
    assert int(written.sum()) == block.nbytes
    on_disk = np.load(path)
    np.testing.assert_array_equal(on_disk[r : r + 160, c : c + 120], block)
    assert not on_disk[:r].any()  # nothing written outside the block
    assert device.violations == []
    device.close()


# ------------------------------------------------------------------ a save given up


class _RemovesTheFileAtSecondPiece(np.ndarray):
    """A block that, when its second piece is taken, removes the file being
    written, as the caller does when it gives the save up."""

    path: str | None = None
    taken = 0

    def __getitem__(self, idx):
        if self.path is not None:
            self.taken += 1
            if self.taken == 2:
                os.unlink(self.path)
        return super().__getitem__(idx)


def _temporary_file(tmp_path, shape, dtype):
    from interop.io._format import Layout, header_bytes

    path = tmp_path / ".blocks.npy.tmp"
    header = header_bytes(shape, np.dtype(dtype))
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(len(header) + int(np.prod(shape)) * np.dtype(dtype).itemsize)
    return path, Layout(str(path), shape, np.dtype(dtype), len(header))


def test_a_block_stops_writing_at_its_next_piece_once_the_file_is_removed(tmp_path):
    from interop.io.dask import _write_block

    a = sample((256, 1024), np.float64)  # 2 MiB, Fortran-ordered: 32 pieces of 64 KiB
    path, layout = _temporary_file(tmp_path, a.shape, a.dtype)
    held = os.open(path, os.O_RDONLY)  # to see what was written after the removal
    try:
        block = np.asfortranarray(a).view(_RemovesTheFileAtSecondPiece)
        block.path = str(path)
        info = {0: {"array-location": [(0, 256), (0, 1024)], "chunk-location": (0, 0)}}
        with pytest.raises(FileNotFoundError, match="this block stopped writing"):
            _write_block(block, layout=layout, chunk_bytes=PIECE, block_info=info)
        data = np.frombuffer(os.pread(held, a.nbytes, layout.offset), a.dtype).reshape(a.shape)
    finally:
        os.close(held)
    flat = data.reshape(-1)
    assert flat[: PIECE // 8].tobytes() == a.reshape(-1)[: PIECE // 8].tobytes()  # one piece
    assert not flat[PIECE // 8 :].any()  # and nothing after the removal


@pytest.mark.parametrize("where", ["host", "device"])
def test_a_block_that_starts_after_the_save_was_given_up_writes_nothing(tmp_path, where):
    from interop.io.dask import _write_block
    from interop.testing import EmulatedDevice

    a = sample((64, 512), np.float32)
    path, layout = _temporary_file(tmp_path, a.shape, a.dtype)
    held = os.open(path, os.O_RDONLY)
    os.unlink(path)  # given up; the task still reaches the file (through /proc)
    device = EmulatedDevice()
    try:
        gone = layout.__class__(f"/proc/self/fd/{held}", layout.shape, layout.dtype, layout.offset)
        block = device.asarray(a) if where == "device" else a
        info = {0: {"array-location": [(0, 64), (0, 512)], "chunk-location": (0, 0)}}
        with pytest.raises(FileNotFoundError, match="this block stopped writing"):
            _write_block(block, layout=gone, chunk_bytes=PIECE, block_info=info)
        assert not any(os.pread(held, a.nbytes, layout.offset))
    finally:
        os.close(held)
        device.close()


def test_a_device_blocks_slots_stop_once_the_file_is_removed(tmp_path):
    """The device path's host step checks before each piece it writes."""
    from types import SimpleNamespace

    from interop.io._format import Runs
    from interop.io.dask import _block_writer

    path = tmp_path / ".d.npy.tmp"
    path.write_bytes(bytes(2 * PIECE))
    fd = os.open(path, os.O_WRONLY)
    try:
        runs = Runs(np.array([0], np.int64), 2 * PIECE)
        plan = SimpleNamespace(starts=[0, PIECE], sizes=[PIECE, PIECE])
        stage = _block_writer(fd, runs, "block (0,)")
        slot = np.full(PIECE, 7, np.uint8)
        (first,) = stage.pieces(plan, 0, 1)
        stage.run(plan, 0, first, slot)
        os.unlink(path)
        (second,) = stage.pieces(plan, 1, 1)
        with pytest.raises(FileNotFoundError, match=r"block \(0,\): the save failed or was"):
            stage.run(plan, 1, second, slot)
        with open(f"/proc/self/fd/{fd}", "rb") as f:
            written = f.read()
    finally:
        os.close(fd)
    assert written == bytes([7]) * PIECE + bytes(PIECE)


# ------------------------------------------------------------------ a full disk

# In a child with argv[1] the root of a small tmpfs: the 16 MiB array does not
# fit in 8 MiB ("full disk": found when its blocks are reserved, before any is
# made), or (in 32 MiB) block 1 raises while block 0 is still being written
# ("a block fails"); after
# save_npy raises, no task may be writing any more: the space is back, the
# temporary gone, no process holds it.
_FULL_DISK = """
import errno, json, os, sys
import dask, dask.array as da, numpy as np
import interop, interop.dask as idask
from tests.io.test_dask import _held_or_failing, _held_or_filling

d = sys.argv[1]
scheduler = {scheduler!r}

def holders():
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{{pid}}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{{pid}}/fd/{{fd}}").startswith(d + "/"):
                    found.append(int(pid))
            except OSError:
                continue
    return found

x = da.map_blocks(
    _held_or_filling if {failure!r} == "full disk" else _held_or_failing,
    os.path.join(d, "gate"), 0,
    chunks=((256, 768), (2048,)), dtype=np.float64, meta=np.empty((0, 0)),
)  # a 4 MiB and a 12 MiB block
os.makedirs(os.path.join(d, "out"))
target = os.path.join(d, "out", "a.npy")

def save():
    free = os.statvfs(d).f_bfree
    try:
        idask.save_npy(x, target, chunk_bytes=64 << 10)
    except (idask.SaveError, interop.PathError) as exc:
        err = exc
    # measured at once, as the caller sees it when the call returns
    after = (os.statvfs(d).f_bfree, sorted(os.listdir(os.path.join(d, "out"))), holders())
    cause = err if isinstance(err, interop.PathError) else err.__cause__
    print(json.dumps({{
        "kind": type(err).__name__,
        "space_back": after[0] == free,
        "listing": after[1],
        "holders": after[2],
        "gate": os.path.exists(os.path.join(d, "gate")),
        "cause_errno": getattr(cause, "errno", None),
        "message": str(err),
    }}))

if scheduler == "threads":
    with dask.config.set(scheduler="threads", num_workers=4):
        save()
else:
    from distributed import Client, LocalCluster

    with LocalCluster(
        n_workers=1, threads_per_worker=2, processes=True, dashboard_address=None,
        scheduler_kwargs={{"dashboard_address": "127.0.0.1:0"}},
    ) as cluster, Client(cluster) as client:
        save()
"""


@pytest.mark.parametrize("scheduler", ["threads", "distributed"])
@pytest.mark.parametrize("failure", ["full disk", "a block fails"])
def test_a_failed_save_returns_once_no_block_is_written(scheduler, failure):
    from tests.helpers.small_fs import run_on_tmpfs

    code = _FULL_DISK.format(scheduler=scheduler, failure=failure)
    proc = run_on_tmpfs(code, "8m" if failure == "full disk" else "32m", timeout=240)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if failure == "full disk":  # the file's blocks are reserved first: found before any block
        assert got["kind"] == "PathError"
        assert got["cause_errno"] == errno.ENOSPC, got["message"]
        assert "nothing was written and the destination is untouched" in got["message"]
        assert not got["gate"]  # no block was made
    else:
        assert got["kind"] == "SaveError"
        assert got["gate"]  # block 0 was being written when block 1 failed
        assert "block 1 cannot be made" in got["message"]
        assert "of 2 blocks were written" in got["message"]
    assert got["listing"] == []  # neither the file nor its temporary
    assert got["holders"] == []  # no process has the removed file open: no task writes it
    assert got["space_back"]  # so its space is free again when the call returns
