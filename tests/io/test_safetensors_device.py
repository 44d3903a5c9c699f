"""interop.safetensors with device tensors, on each test device (the emulated one; CUDA
under the ``gpu`` marker): saved through the staging ring into a file the safetensors
package reads, filled back in place through the ring, refused before anything moves."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

import interop
import interop.safetensors as ist
from interop.testing import EmulatedDevice, EmulatedDeviceError
from tests.helpers import NUMPY_DTYPES, assert_same, sample

st = pytest.importorskip("safetensors.torch", reason="the 'test' extra installs safetensors")

CHUNK = 64 << 10
# the dtypes both the format and the test devices hold (the format has no complex128)
DTYPES = [d for d in NUMPY_DTYPES if d != np.dtype(np.complex128)]


@pytest.mark.parametrize("lib", ["cupy", "torch"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_device_tensors_round_trip_through_the_ring(device, tmp_path, dtype, lib):
    a, b = sample((300, 90), dtype), sample((7,), dtype, seed=1)
    staged = device.staged() if device.emulated else 0
    tensors = {"c": device.asarray(a, lib), "t": device.asarray(a, lib).T, "host": b}
    with interop.config.set(chunk_bytes=CHUNK):  # several chunks per tensor
        path = ist.save_file(tensors, tmp_path / "d.safetensors")
    if device.emulated:
        assert device.staged() > staged  # the device tensors went through the ring's slots
    loaded = ist.load_file(path, framework="np")
    for name, want in (("c", a), ("t", a.T), ("host", b)):
        assert_same(loaded[name], want)
    theirs = st.load_file(path)
    assert_same(interop.to_numpy(theirs["t"]), a.T)
    targets = {"c": device.empty(a.shape, dtype, lib), "t": device.empty(a.T.shape, dtype, lib)}
    targets["host"] = np.empty_like(b)
    with interop.config.set(chunk_bytes=CHUNK):
        assert ist.load_into(path, targets) == ([], [])
    assert_same(device.to_numpy(targets["c"]), a)
    assert_same(device.to_numpy(targets["t"]), a.T)
    assert_same(targets["host"], b)


def test_load_into_a_strided_device_target(device, tmp_path):
    a = sample((640, 480), np.float32)
    path = ist.save_file({"a": a}, tmp_path / "a.safetensors")
    base = device.asarray(np.zeros((480, 1280), np.float32))
    with interop.config.set(chunk_bytes=CHUNK):
        ist.load_into(path, {"a": base.T[::2]})
    np.testing.assert_array_equal(device.to_numpy(base).T[::2], a)
    assert not device.to_numpy(base).T[1::2].any()  # the gaps untouched


def test_a_mismatched_device_target_is_refused_before_anything_moves(device, tmp_path):
    path = ist.save_file({"a": np.ones((4, 3)), "b": np.ones(3)}, tmp_path / "a.safetensors")
    targets = {
        "a": device.asarray(np.zeros((4, 3))),
        "b": device.asarray(np.zeros(3, np.float32)),  # float32 where the file has F64
    }
    with pytest.raises(interop.CheckpointMismatchError, match=r"'b' is shape \(3,\) float32"):
        ist.load_into(path, targets)
    assert not device.to_numpy(targets["a"]).any()  # not even the tensor that matched
    overlapping = device.as_strided(device.asarray(np.zeros(3)), (4, 3), (0, 8))
    with pytest.raises(interop.InvalidValueError, match="elements may share memory"):
        ist.load_into(path, {"a": overlapping, "b": device.asarray(np.zeros(3))})


def test_a_lazy_device_tensor_is_saved_with_its_values(device, tmp_path):
    a = sample((256, 64), np.float32)
    lazy, values = device.lazy(device.asarray(a, "torch"), a)
    with interop.config.set(chunk_bytes=CHUNK):
        path = ist.save_file({"lazy": lazy}, tmp_path / "l.safetensors")
    assert_same(ist.load_file(path, framework="np")["lazy"], values)


def test_a_device_save_with_many_host_threads_writes_each_chunk_at_its_offset(device, tmp_path):
    a = sample((1024, 1024), np.float32)  # 4 MiB: chunks of 1 MiB split across threads
    b = np.linspace(-4, 4, 409_999, dtype=np.float32).astype(ml_dtypes.bfloat16)
    with interop.config.set(host_threads=4, num_buffers=3, chunk_bytes=1 << 20):
        path = ist.save_file(
            {"a": device.asarray(a), "b": device.asarray(b, "torch")}, tmp_path / "big.safetensors"
        )
        out = {"a": device.empty(a.shape, a.dtype), "b": device.empty(b.shape, b.dtype, "torch")}
        ist.load_into(path, out)
    assert_same(device.to_numpy(out["a"]), a)
    assert_same(device.to_numpy(out["b"]), b)
    assert_same(interop.to_numpy(st.load_file(path)["b"]), b)


def test_a_failed_device_save_leaves_the_old_file_and_no_temporary(device, tmp_path):
    path = ist.save_file({"a": np.zeros(3)}, tmp_path / "a.safetensors")
    old = path.read_bytes()

    def boom(done, total):
        raise ZeroDivisionError

    x = device.asarray(sample((512, 256), np.float64))
    with interop.config.set(chunk_bytes=CHUNK), pytest.raises(ZeroDivisionError):
        ist.save_file({"x": x, "y": np.ones(3)}, path, progress=boom)
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == ["a.safetensors"]


def test_a_device_chunk_that_fails_is_a_transfer_error_and_nothing_is_left(tmp_path):
    """Emulated only: the drain fault is injected into the emulated device."""
    path = tmp_path / "keep.safetensors"
    path.write_bytes(b"the old checkpoint")
    device = EmulatedDevice(faults={"drain": 2})  # the second slot a host thread drains
    try:
        with interop.config.set(chunk_bytes=CHUNK), pytest.raises(interop.TransferError) as info:
            ist.save_file({"x": device.asarray(sample((512, 256), np.float64))}, path)
    finally:
        device.close()
    assert str(info.value).startswith("save_file failed (EmulatedDeviceError: injected fault")
    assert "still holds the file it held before" in str(info.value)
    assert isinstance(info.value.__cause__, EmulatedDeviceError)
    assert path.read_bytes() == b"the old checkpoint"
    assert os.listdir(tmp_path) == ["keep.safetensors"]


# ----------------------------------------------------------------- CUDA only


@pytest.mark.gpu
@pytest.mark.parametrize("framework", ["pt", "cupy"])
def test_gpu_load_file_to_cuda_streams_into_new_device_tensors(tmp_path, framework, torch):
    """CUDA only: ``device="cuda"`` makes new device tensors (the emulated device is
    never a load_file target), filled from the file through the ring."""
    t = {"w": torch.arange(300_000.0).reshape(3, 100_000), "b": torch.arange(7).bfloat16()}
    path = ist.save_file(t, tmp_path / "g.safetensors")
    with interop.config.set(chunk_bytes=CHUNK):
        loaded = ist.load_file(path, device="cuda:0", framework=framework)
        with ist.safe_open(path, framework, device=0) as f:
            part = f.get_slice("w")[1:, ::2]
    if framework == "pt":
        assert loaded["w"].device.type == "cuda"
        assert torch.equal(loaded["w"].cpu(), t["w"])
        assert torch.equal(loaded["b"].cpu(), t["b"])
        assert torch.equal(part.cpu(), t["w"][1:, ::2])
    else:
        import cupy

        assert isinstance(loaded["w"], cupy.ndarray)
        np.testing.assert_array_equal(cupy.asnumpy(loaded["w"]), t["w"].numpy())
        np.testing.assert_array_equal(cupy.asnumpy(part), t["w"].numpy()[1:, ::2])
    theirs = st.load_file(path, device="cuda:0")
    assert torch.equal(theirs["w"].cpu(), t["w"])
