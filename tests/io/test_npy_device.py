"""save_npy / load_npy of device data through the slot pipeline, on each test
device (the emulated one; CUDA under the ``gpu`` marker): pinned slots written
straight into the file (positioned writes, or in order into a FIFO) and read
straight from it."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

import interop
from interop.testing import EmulatedDevice, EmulatedDeviceError
from tests.helpers import NUMPY_DTYPES, assert_same, reading_fifo, sample

CHUNK = 64 << 10


@pytest.mark.parametrize("lib", ["cupy", "torch"])
@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_device_arrays_round_trip_every_dtype(device, tmp_path, dtype, lib):
    a = sample((300, 90), dtype)
    d = device.asarray(a, lib)
    for name, src, expect in (("c.npy", d, a), ("t.npy", d.T, a.T)):
        path = interop.save_npy(src, tmp_path / name, chunk_bytes=CHUNK)
        assert_same(np.load(path), expect)
        out = device.empty(expect.shape, dtype, lib)
        assert interop.load_npy(path, out, chunk_bytes=CHUNK) is out
        assert_same(device.to_numpy(out), expect)
        host = interop.load_npy(path)  # without out or device: host memory, like numpy.load
        assert isinstance(host, np.ndarray)
        assert_same(host, expect)


def test_load_into_a_strided_device_out(device, tmp_path):
    a = sample((640, 480), np.float64)  # 2.4 MB: 38 chunks of 64 KiB
    np.save(tmp_path / "a.npy", a)
    base = device.asarray(np.zeros((480, 1280)))
    out = base.T[::2]
    assert interop.load_npy(tmp_path / "a.npy", out, chunk_bytes=1 << 16) is out
    np.testing.assert_array_equal(device.to_numpy(out), a)
    assert not device.to_numpy(base).T[1::2].any()  # the gaps are untouched


@pytest.mark.parametrize("lib", ["cupy", "torch"])
def test_a_device_out_whose_elements_share_memory_is_refused(device, tmp_path, lib):
    a = np.arange(12.0).reshape(3, 4)
    np.save(tmp_path / "a.npy", a)
    rows = device.asarray(np.zeros(6), lib)
    for strides in ((0, 8), (16, 8)):  # every row the same memory; rows 2 elements apart
        out = device.as_strided(rows, (3, 4), strides)
        with pytest.raises(interop.InvalidValueError, match="elements may share memory"):
            interop.load_npy(tmp_path / "a.npy", out)
        with pytest.raises(interop.InvalidValueError, match="elements may share memory"):
            interop.copy_to_device(a, out)
        assert not device.to_numpy(rows).any()  # nothing written


def test_save_with_many_host_threads_writes_each_chunk_at_its_offset(device, tmp_path):
    a = sample((1024, 1024), np.float32)  # 4 MiB: chunks of 1 MiB split across threads
    with interop.config.set(host_threads=4, num_buffers=3):
        path = interop.save_npy(device.asarray(a), tmp_path / "big.npy", chunk_bytes=1 << 20)
        assert_same(np.load(path, mmap_mode="r"), a)
        out = device.empty((1024, 1024), np.float32)
        interop.load_npy(path, out, chunk_bytes=1 << 20)
    assert_same(device.to_numpy(out), a)


def test_save_into_a_fifo_writes_the_chunks_in_order(device, tmp_path):
    a = sample((512, 64), np.float64)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with reading_fifo(fifo) as got:
        interop.save_npy(device.asarray(a).T, fifo, chunk_bytes=CHUNK)
    path = tmp_path / "copy.npy"
    path.write_bytes(got)
    assert_same(np.load(path), a.T)
    assert fifo.is_fifo()  # written into, not replaced


def test_load_fortran_and_big_endian_files_onto_the_device(device, tmp_path):
    a = sample((300, 200), np.float64)
    np.save(tmp_path / "f.npy", np.asfortranarray(a))
    np.save(tmp_path / "be.npy", a.astype(">f8"))
    for name in ("f.npy", "be.npy"):
        out = device.empty(a.shape, np.float64)
        interop.load_npy(tmp_path / name, out, chunk_bytes=CHUNK)
        np.testing.assert_array_equal(device.to_numpy(out), a)
    if device.emulated:  # CuPy and PyTorch hold no big-endian arrays
        with pytest.raises(ValueError, match="dtype float64"):
            interop.load_npy(tmp_path / "be.npy", device.empty(a.shape, ">f8"))


def test_bfloat16_device_arrays_keep_their_dtype_in_the_file(device, tmp_path):
    a = np.linspace(-4, 4, 409_999, dtype=np.float32).astype(ml_dtypes.bfloat16)  # 13 chunks
    t = device.asarray(a, lib="torch")
    path = interop.save_npy(t, tmp_path / "bf.npy", chunk_bytes=1 << 16)
    loaded = np.load(path)
    assert loaded.dtype == np.dtype(ml_dtypes.bfloat16)
    assert_same(loaded, a)
    out = device.empty(a.shape, a.dtype, lib="torch")
    assert interop.load_npy(path, out, chunk_bytes=1 << 16) is out
    assert_same(device.to_numpy(out), a)


def test_progress_and_a_failed_save_leave_no_file(device, tmp_path):
    a = sample((512, 256), np.float64)
    seen = []
    path = interop.save_npy(
        device.asarray(a), tmp_path / "p.npy", chunk_bytes=CHUNK,
        progress=lambda done, total: seen.append((done, total)),
    )  # fmt: skip
    assert seen[-1] == (a.nbytes, a.nbytes)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)

    def boom(done, total):
        raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):  # the callback's own error, as itself
        interop.save_npy(device.asarray(a), tmp_path / "q.npy", chunk_bytes=CHUNK, progress=boom)
    assert sorted(os.listdir(tmp_path)) == ["p.npy"]  # no final file, no temporary left
    assert_same(np.load(path), a)


def test_a_file_shrinking_under_a_device_load_is_an_error(device, tmp_path):
    path = tmp_path / "s.npy"
    a = np.arange(3 << 14, dtype=np.float64)
    np.save(path, a)

    def shrink(done, total):
        with open(path, "r+b") as f:
            f.truncate(128 + 1000)

    out = device.empty(a.shape, np.float64)
    with (
        interop.config.set(num_buffers=1),
        pytest.raises(interop.TransferError, match=r"s\.npy' ended early") as info,
    ):
        interop.load_npy(path, out, chunk_bytes=CHUNK, progress=shrink)
    assert info.value.bytes_done == CHUNK


def test_a_device_save_that_fails_says_the_destination_is_untouched(tmp_path):
    """Emulated only: the drain fault is injected into the emulated device."""
    path = tmp_path / "keep.npy"
    old = b"the file that was there before"
    path.write_bytes(old)
    a = sample((512, 256), np.float64)

    for target, left in (
        (path, f"{str(path)!r} still holds the file it held before"),
        (tmp_path / "new.npy", f"no file was left under {str(tmp_path / 'new.npy')!r}"),
    ):
        device = EmulatedDevice(faults={"drain": 2})  # the second slot a host thread drains
        with pytest.raises(interop.TransferError) as info:
            interop.save_npy(device.asarray(a), target, chunk_bytes=CHUNK)
        device.close()
        err = info.value
        assert str(err).startswith("save_npy failed (EmulatedDeviceError: injected fault")
        assert f"the destination is untouched: {left}" in str(err)
        assert "unspecified" not in str(err)
        assert isinstance(err.__cause__, EmulatedDeviceError)
        assert (err.bytes_done, err.nbytes) == (0, a.nbytes)  # nothing of it was kept
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == ["keep.npy"]


# ----------------------------------------------------------------- CUDA only


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_gpu_load_npy_with_device_cuda_makes_a_cupy_array(tmp_path, cp, layout):
    """CUDA only: ``device="cuda"`` without an out makes a new CuPy array on the
    current CUDA device (the emulated device is never the default target)."""
    a = cp.arange(3 * 100_000, dtype=cp.float32).reshape(3, 100_000)  # 19 chunks of 64 KiB
    src = a if layout == "contiguous" else a.T
    interop.save_npy(src, tmp_path / "g.npy", chunk_bytes=1 << 16)
    np.testing.assert_array_equal(np.load(tmp_path / "g.npy"), cp.asnumpy(src))
    back = interop.load_npy(tmp_path / "g.npy", device="cuda", chunk_bytes=100_000)
    assert isinstance(back, cp.ndarray)
    assert bool((back == src).all())
    host = interop.load_npy(tmp_path / "g.npy")  # without device: host memory, like numpy.load
    assert isinstance(host, np.ndarray)
    np.testing.assert_array_equal(host, cp.asnumpy(src))
