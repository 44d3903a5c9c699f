"""save_npy / load_npy on the host (real files, real data) and on the GPU."""

from __future__ import annotations

import errno
import io
import json
import os
import stat
import struct
import threading

import ml_dtypes
import numpy as np
import pytest

import interop
from interop.io.npy import read_npy_header
from tests.helpers import (
    NUMPY_DTYPES,
    Producer,
    assert_same,
    reading_fifo,
    run_python,
    sample,
    self_overlapping_outs,
)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_round_trip_every_dtype(tmp_path, dtype):
    a = sample((300, 257), dtype)  # several 64 KiB chunks for itemsize >= 1
    path = interop.save_npy(a, tmp_path / "a.npy", chunk_bytes=1 << 16)
    assert path == tmp_path / "a.npy"
    assert_same(np.load(path), a)  # a standard file: numpy reads it (ml_dtypes is imported)
    assert_same(interop.load_npy(path, device="cpu", chunk_bytes=1 << 16), a)


def test_bfloat16_header_names_the_dtype(tmp_path):
    a = np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16)
    interop.save_npy(a, tmp_path / "b.npy")
    header = read_npy_header(tmp_path / "b.npy")
    assert header.dtype == np.dtype(ml_dtypes.bfloat16)
    with open(tmp_path / "b.npy", "rb") as f:
        assert b"'descr': 'bfloat16'" in f.read(128)


@pytest.mark.parametrize(
    "view",
    [
        lambda a: a,
        lambda a: a.T,
        lambda a: a[::-1, ::2],
        lambda a: a[:, 3],
        lambda a: a[1:4, 2:9:3].T,
    ],
    ids=["contiguous", "transposed", "reversed-step", "column", "mixed"],
)
@pytest.mark.parametrize("chunk", [1, 100_003, 1 << 20])  # 1 is raised to 64 KiB
def test_strided_sources_and_chunk_sizes(tmp_path, view, chunk):
    base = sample((600, 1100), np.float64, seed=3)  # 5 MiB: several chunks of each size
    src = view(base)
    interop.save_npy(src, tmp_path / "s.npy", chunk_bytes=chunk)
    assert_same(np.load(tmp_path / "s.npy"), np.ascontiguousarray(src))


def test_memmap_source(tmp_path):
    mm = np.lib.format.open_memmap(tmp_path / "src.npy", "w+", np.float32, (640, 330))
    mm[...] = sample((640, 330), np.float32)
    interop.save_npy(mm.T, tmp_path / "out.npy", chunk_bytes=1 << 16)
    assert_same(np.load(tmp_path / "out.npy"), np.ascontiguousarray(mm.T))


def test_torch_cpu_sources(tmp_path, torch):
    z = torch.tensor([[1 + 2j, 3 - 4j], [5 + 6j, -7 - 8j]])
    interop.save_npy(z.conj(), tmp_path / "c.npy", chunk_bytes=16)
    np.testing.assert_array_equal(np.load(tmp_path / "c.npy"), z.conj().resolve_conj().numpy())
    interop.save_npy(z.conj().imag, tmp_path / "n.npy", chunk_bytes=8)
    np.testing.assert_array_equal(np.load(tmp_path / "n.npy"), [[-2.0, 4.0], [-6.0, 8.0]])
    b = torch.linspace(-3, 3, 10, dtype=torch.bfloat16)
    interop.save_npy(b, tmp_path / "b.npy", chunk_bytes=6)
    loaded = np.load(tmp_path / "b.npy")
    assert loaded.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(loaded.astype(np.float32), b.float().numpy())
    g = torch.ones(3, requires_grad=True)
    interop.save_npy(g, tmp_path / "g.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "g.npy"), [1.0, 1.0, 1.0])


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1,)])
def test_zero_d_and_zero_size(tmp_path, shape):
    a = sample(shape, np.int32)
    interop.save_npy(a, tmp_path / "z.npy")
    assert_same(np.load(tmp_path / "z.npy"), a)
    assert_same(interop.load_npy(tmp_path / "z.npy", device="cpu"), a)


def test_progress_callable_is_monotonic_and_complete(tmp_path):
    a = sample((50000, 10), np.float32)  # 2 MB: 31 chunks of 64 KiB (the smallest chunk)
    seen: list[tuple[int, int]] = []
    interop.save_npy(
        a, tmp_path / "p.npy", chunk_bytes=1 << 16, progress=lambda d, t: seen.append((d, t))
    )
    assert len(seen) > 5
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert seen[-1] == (a.nbytes, a.nbytes)
    seen.clear()
    interop.load_npy(
        tmp_path / "p.npy", device="cpu", chunk_bytes=1, progress=lambda d, t: seen.append((d, t))
    )
    assert len(seen) > 5  # chunk_bytes=1 is raised to 64 KiB
    assert seen[-1] == (a.nbytes, a.nbytes)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_progress_bar(tmp_path, capsys):
    a = sample((50,), np.float64)
    interop.save_npy(a, tmp_path / "bar.npy", progress=True)
    interop.load_npy(tmp_path / "bar.npy", device="cpu", progress=True)
    err = capsys.readouterr().err
    assert "save_npy" in err
    assert "load_npy" in err


class _Stop(Exception):
    pass


def test_interrupted_save_leaves_no_file_and_keeps_the_old_one(tmp_path):
    target = tmp_path / "keep.npy"
    old = np.arange(4.0)
    np.save(target, old)

    def stop(done, total):
        if done > total // 2:
            raise _Stop("interrupted")

    big = sample((20000, 10), np.float64)  # 1.6 MB: stopped after 13 of 25 chunks

    with pytest.raises(_Stop):
        interop.save_npy(big, target, chunk_bytes=1 << 16, progress=stop)
    assert_same(np.load(target), old)  # the previous file is untouched
    assert sorted(os.listdir(tmp_path)) == ["keep.npy"]  # no partial file left behind

    fresh = tmp_path / "fresh.npy"
    with pytest.raises(_Stop):
        interop.save_npy(big, fresh, chunk_bytes=1 << 16, progress=stop)
    assert not fresh.exists()


def test_load_into_strided_numpy_and_torch_out(tmp_path, torch):
    a = sample((9000, 40), np.float32)  # 1.4 MB: 22 chunks of 64 KiB
    np.save(tmp_path / "a.npy", a)
    base = np.zeros((40, 18000), np.float32)
    out = base.T[::2]
    assert out.shape == a.shape
    assert interop.load_npy(tmp_path / "a.npy", out, chunk_bytes=1 << 16) is out
    np.testing.assert_array_equal(out, a)
    assert not base.T[1::2].any()  # the gaps are untouched
    t = torch.zeros(9000, 40)
    assert interop.load_npy(tmp_path / "a.npy", t, chunk_bytes=1 << 16) is t
    np.testing.assert_array_equal(t.numpy(), a)


def test_load_fortran_order_file(tmp_path):
    a = np.asfortranarray(sample((50, 70, 30), np.int64))  # 840 KB
    np.save(tmp_path / "f.npy", a)
    assert read_npy_header(tmp_path / "f.npy").fortran_order
    assert_same(interop.load_npy(tmp_path / "f.npy", chunk_bytes=1 << 16), a)


def _untouched(out):
    return out.copy()


def test_corrupt_file_names_the_file_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"not an npy file at all" * 4)
    out = np.full(3, 7.0)
    with pytest.raises(ValueError, match=r"bad\.npy.*not a readable \.npy file"):
        interop.load_npy(bad, out)
    np.testing.assert_array_equal(out, [7.0, 7.0, 7.0])


def test_truncated_file(tmp_path):
    path = tmp_path / "t.npy"
    np.save(path, np.arange(1000, dtype=np.float64))
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 8)
    out = np.full(1000, -1.0)
    with pytest.raises(ValueError, match=r"t\.npy' is truncated: expected \d+ bytes"):
        interop.load_npy(path, out)
    assert (out == -1.0).all()


def test_file_longer_than_header(tmp_path):
    path = tmp_path / "long.npy"
    np.save(path, np.arange(10, dtype=np.int16))
    with open(path, "ab") as f:
        f.write(b"\0" * 4)
    with pytest.raises(ValueError, match="longer than its header says"):
        read_npy_header(path)


def test_object_file_refused(tmp_path):
    path = tmp_path / "o.npy"
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="never unpickles"):
        interop.load_npy(path, device="cpu")


@pytest.mark.parametrize(
    ("out", "exc", "pattern"),
    [
        (np.zeros((3, 4), np.float32), ValueError, r"shape \(4, 3\)"),
        (np.zeros((4, 3), np.float64), ValueError, "dtype float32"),
        ([0.0] * 12, TypeError, "expected out .* NumPy array"),
    ],
)
def test_wrong_out_is_refused_before_writing(tmp_path, out, exc, pattern):
    np.save(tmp_path / "a.npy", np.ones((4, 3), np.float32))
    before = json.dumps(np.asarray(out).tolist())
    with pytest.raises(exc, match=pattern):
        interop.load_npy(tmp_path / "a.npy", out)
    assert json.dumps(np.asarray(out).tolist()) == before


@pytest.mark.parametrize("how", ["requires grad", "conjugate bit"])
def test_a_tensor_out_that_cannot_be_written_in_place_is_refused(tmp_path, torch, how):
    np.save(tmp_path / "g.npy", np.arange(4.0) + 1j)
    if how == "requires grad":
        out = torch.zeros(4, dtype=torch.complex128, requires_grad=True)
        match = r"does not require grad \(got a tensor with requires_grad=True.*out.detach\(\)"
    else:
        out = torch.zeros(4, dtype=torch.complex128).conj()
        match = r"without the conjugate/negative bit"
    with pytest.raises(ValueError, match=match):
        interop.load_npy(tmp_path / "g.npy", out)
    assert out.detach().abs().sum().item() == 0  # nothing written
    detached = torch.zeros(4, dtype=torch.complex128)
    interop.load_npy(tmp_path / "g.npy", detached)
    np.testing.assert_array_equal(detached.numpy(), np.arange(4.0) + 1j)


def test_read_only_out_is_refused(tmp_path):
    np.save(tmp_path / "a.npy", np.ones(3))
    out = np.zeros(3)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        interop.load_npy(tmp_path / "a.npy", out)


def test_an_out_whose_elements_share_memory_is_refused_before_writing(tmp_path, torch):
    np.save(tmp_path / "a.npy", np.arange(12.0).reshape(3, 4))
    t = torch.zeros(4, dtype=torch.float64)
    outs = [*self_overlapping_outs(torch), (t, t.expand(3, 4))]
    for base, out in outs:
        with pytest.raises(interop.InvalidValueError, match="elements may share memory"):
            interop.load_npy(tmp_path / "a.npy", out)
        assert not np.asarray(base).any()  # nothing written


@pytest.mark.parametrize(
    ("file", "given", "tensor"),
    [(">f8", "<f8", False), (">f8", "<f8", True), ("<f8", ">f8", False)],  # tensors: native only
)
def test_an_out_in_the_other_byte_order_is_refused_with_what_to_do(
    tmp_path, torch, file, given, tensor
):
    a = np.arange(12.0).reshape(3, 4)
    np.save(tmp_path / "a.npy", a.astype(file))
    out = torch.full((3, 4), 7.0, dtype=torch.float64) if tensor else np.full((3, 4), 7.0, given)
    with pytest.raises(interop.InvalidValueError, match="byte order") as info:
        interop.load_npy(tmp_path / "a.npy", out)
    assert (np.asarray(out) == 7.0).all()  # nothing written
    message = str(info.value)
    assert f"dtype {np.dtype(file).str!r}" in message
    target = "out.numpy()" if tensor else "out"
    assert f"numpy.copyto({target}, numpy.load(path, mmap_mode='r'))" in message
    # the advice works
    target = out.numpy() if tensor else out
    np.copyto(target, np.load(tmp_path / "a.npy", mmap_mode="r"))
    np.testing.assert_array_equal(target, a)


def _header_file(path, header: str, data: bytes, version=(1, 0)):
    """A .npy file with ``header`` as its header text, as it is."""
    text = header.encode("latin1")
    size = "<H" if version == (1, 0) else "<I"
    text += b" " * (-(8 + struct.calcsize(size) + len(text) + 1) % 64) + b"\n"
    path.write_bytes(b"\x93NUMPY" + bytes(version) + struct.pack(size, len(text)) + text + data)
    return path


@pytest.mark.parametrize(("shape", "count"), [("(True,)", 1), ("(2, False)", 0), ("(1.0,)", 1)])
def test_a_header_whose_shape_is_not_integers_is_refused(tmp_path, shape, count):
    header = f"{{'descr': '<f8', 'fortran_order': False, 'shape': {shape}, }}"
    path = _header_file(tmp_path / "b.npy", header, np.ones(count).tobytes())
    out = np.full(1, 7.0)
    with pytest.raises(interop.NpyFormatError, match=r"b\.npy' is not a readable \.npy file"):
        interop.load_npy(path, out)
    assert out.tolist() == [7.0]
    with pytest.raises(interop.NpyFormatError, match="shape"):
        interop.load_npy(path)


def test_a_huge_header_gives_advice_load_npy_can_follow(tmp_path):
    pad = " " * 20_000
    header = f"{{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }}{pad}"
    path = _header_file(tmp_path / "h.npy", header, np.arange(3.0).tobytes(), version=(2, 0))
    before = path.read_bytes()
    with pytest.raises(interop.NpyFormatError, match=r"its header is \d+ bytes") as info:
        interop.load_npy(path)
    message = str(info.value)
    assert "allow_pickle" not in message
    assert "numpy.load(path, mmap_mode='r', max_header_size=" in message
    assert path.read_bytes() == before
    size = int(message.split("max_header_size=")[1].split(")")[0])
    np.testing.assert_array_equal(np.load(path, mmap_mode="r", max_header_size=size), [0, 1, 2])


def test_a_fifo_is_refused_and_nothing_is_read_from_it(tmp_path):
    fifo = tmp_path / "pipe.npy"
    os.mkfifo(fifo)
    data = io.BytesIO()
    np.save(data, np.arange(5.0))
    # a reader and a writer at once: opening the FIFO never waits, and what
    # load_npy would read stays in the pipe for this test to read back
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        os.write(fd, data.getvalue())
        with pytest.raises(interop.PathError, match=r"pipe\.npy': it is a FIFO.*regular file"):
            interop.load_npy(fifo)
        assert os.read(fd, 1 << 16) == data.getvalue()  # nothing was read from it
    finally:
        os.close(fd)


def test_a_nul_byte_in_a_path_is_refused(tmp_path):
    a = np.arange(3.0)
    bad = str(tmp_path / "a\0b.npy")
    with pytest.raises(interop.InvalidValueError, match="NUL"):
        interop.save_npy(a, bad)
    with pytest.raises(interop.InvalidValueError, match="NUL"):
        interop.load_npy(bad)
    with pytest.raises(interop.InvalidValueError, match="NUL"):
        interop.load_npy(os.fsencode(bad))
    assert os.listdir(tmp_path) == []


def test_a_file_replaced_after_its_header_was_read_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "a.npy"
    np.save(path, np.zeros(4))
    np.save(tmp_path / "new.npy", np.ones(4))
    read = interop.io.npy.read_npy_header

    def then_replaced(p):
        header = read(p)
        os.replace(tmp_path / "new.npy", path)
        return header

    monkeypatch.setattr(interop.io.npy, "read_npy_header", then_replaced)
    out = np.full(4, 7.0)
    with pytest.raises(interop.InvalidValueError, match="replaced"):
        interop.load_npy(path, out)
    assert out.tolist() == [7.0] * 4


def test_another_machine_compares_a_files_identity_without_its_device(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros(2))
    header = read_npy_header(tmp_path / "a.npy")
    elsewhere = (header.identity[0] + 1, *header.identity[1:])  # a shared file's other number
    os.close(interop.io._format.open_unchanged(header.path, elsewhere, "x", same_machine=False))
    with pytest.raises(interop.InvalidValueError, match="x: expected the file whose header"):
        interop.io._format.open_unchanged(header.path, elsewhere, "x")
    moved = (header.identity[0], header.identity[1] + 1, *header.identity[2:])  # another inode
    with pytest.raises(interop.InvalidValueError, match="replaced or changed since"):
        interop.io._format.open_unchanged(header.path, moved, "x", same_machine=False)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        interop.load_npy(tmp_path / "nope.npy", device="cpu")


def test_load_refuses_a_progress_that_is_neither_a_bool_nor_a_callable(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(4.0))
    out = np.full(4, 7.0)
    with pytest.raises(interop.InvalidTypeError, match=r"expected progress .* \(got 5\)"):
        interop.load_npy(tmp_path / "a.npy", out, progress=5)
    assert out.tolist() == [7.0] * 4  # refused before anything was read


def test_save_rejects_non_arrays(tmp_path):
    with pytest.raises(TypeError, match=r"save_npy expected .* \(got builtins.list: \[1, 2, 3\]\)"):
        interop.save_npy([1, 2, 3], tmp_path / "x.npy")
    assert not (tmp_path / "x.npy").exists()


def test_without_a_gpu_device_paths_raise_no_device(tmp_path):
    if interop._backends.cupy_device_count() > 0:
        pytest.skip("a CUDA device is visible")
    np.save(tmp_path / "a.npy", np.ones(3))
    for device in ("cuda", "cuda:0", 0):
        with pytest.raises(interop.NoDeviceError, match="expected a CUDA device") as info:
            interop.load_npy(tmp_path / "a.npy", device=device)
        assert "without device=, or with device='cpu', reads" in str(info.value)
        assert "a.npy' into a NumPy array" in str(info.value)
    with pytest.raises(interop.NoDeviceError):
        interop.copy_to_device(np.ones(3))


def test_copy_to_device_rejects_non_arrays():
    with pytest.raises(TypeError, match=r"copy_to_device expected .* \(got builtins.str: 'abc'\)"):
        interop.copy_to_device("abc")


def test_save_peak_rss_stays_within_twice_the_ring(tmp_path):
    """Saving a 256 MiB CPU tensor must not make a full-size host copy."""
    code = f"""
        import numpy as np, torch, interop
        def status(key):
            for line in open("/proc/self/status"):
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
        t = torch.ones(64 * 2**20, dtype=torch.float32)  # 256 MiB, touched
        chunk, nbuf = 4 << 20, 2
        with interop.config.set(chunk_bytes=chunk, num_buffers=nbuf):
            interop.save_npy(t[:1024], r"{tmp_path / "warm.npy"}")  # imports done
            open("/proc/self/clear_refs", "w").write("5")  # reset the peak RSS
            base = status("VmRSS:")
            interop.save_npy(t, r"{tmp_path / "big.npy"}")
            extra = status("VmHWM:") - base
        print(extra, 2 * nbuf * chunk)
    """
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    extra, bound = map(int, proc.stdout.split())
    assert extra <= bound, f"peak extra RSS {extra} bytes exceeds {bound}"
    assert (tmp_path / "big.npy").stat().st_size == 64 * 2**20 * 4 + 128


def test_foreign_dlpack_producer(tmp_path):
    a = sample((5, 6), np.int32)[::-1]
    interop.save_npy(Producer(a), tmp_path / "p.npy", chunk_bytes=24)
    assert_same(np.load(tmp_path / "p.npy"), a)


def test_file_shrinking_during_the_read_is_an_error_not_success(tmp_path):
    path = tmp_path / "shrinks.npy"
    a = np.arange(3 << 13, dtype=np.float64)  # 3 chunks of 64 KiB
    np.save(path, a)
    out = np.zeros(a.size)

    def shrink(done, total):
        if done == 1 << 16:  # after the first chunk: another process truncates the file
            with open(path, "r+b") as f:
                f.truncate(128 + (1 << 16) + 1200)

    with pytest.raises(interop.TransferError, match=r"shrinks\.npy' ended early") as info:
        interop.load_npy(path, out, chunk_bytes=1 << 16, progress=shrink)
    assert info.value.bytes_done == 1 << 16
    assert "bytes [0, 65536) of 196608 (in the file's data) are complete" in str(info.value)
    np.testing.assert_array_equal(out[: 1 << 13], a[: 1 << 13])


# ------------------------------------------------------- where save_npy writes


def test_save_adds_the_npy_suffix_like_numpy_save(tmp_path):
    a = sample((4, 3), np.int16)
    assert interop.save_npy(a, tmp_path / "weights") == tmp_path / "weights.npy"
    assert interop.save_npy(a, str(tmp_path / "w.bin")) == tmp_path / "w.bin"
    assert_same(np.load(tmp_path / "weights.npy"), a)
    assert_same(np.load(tmp_path / "w.bin"), a)
    assert sorted(os.listdir(tmp_path)) == ["w.bin", "weights.npy"]


def test_save_through_a_symlink_replaces_its_target(tmp_path):
    (tmp_path / "store").mkdir()
    real = tmp_path / "store" / "real.npy"
    np.save(real, np.zeros(3))
    os.symlink(real, tmp_path / "latest.npy")
    a = sample((100, 1000), np.float32)
    assert interop.save_npy(a, tmp_path / "latest.npy") == tmp_path / "latest.npy"
    assert os.readlink(tmp_path / "latest.npy") == str(real)  # still the same link
    assert_same(np.load(real), a)
    assert os.listdir(tmp_path / "store") == ["real.npy"]


def test_save_into_a_fifo_streams_the_file(tmp_path):
    fifo = tmp_path / "stream.npy"
    os.mkfifo(fifo)
    a = sample((300, 1000), np.float64)  # 2.4 MB, many times a pipe's buffer
    with reading_fifo(fifo) as received:
        assert interop.save_npy(a, fifo, chunk_bytes=1 << 16) == fifo
    assert_same(np.load(io.BytesIO(bytes(received))), a)  # np.load needs to seek
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert os.listdir(tmp_path) == ["stream.npy"]


def test_save_keeps_an_existing_files_mode(tmp_path):
    target = tmp_path / "shared.npy"
    np.save(target, np.zeros(2))
    os.chmod(target, 0o640)
    a = sample((50, 50), np.complex64)
    interop.save_npy(a, target)
    assert_same(np.load(target), a)
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


def test_save_to_a_read_only_file_does_what_numpy_save_does(tmp_path):
    """Refused with PermissionError where numpy.save is refused (any user but
    root; the refusal itself is tested without privileges in
    test_destination.py); root overwrites it, keeping mode 0444."""
    old = np.arange(4.0)
    probe, target = tmp_path / "probe.npy", tmp_path / "ro.npy"
    for path in (probe, target):
        np.save(path, old)
        os.chmod(path, 0o444)
    try:
        np.save(probe, np.ones(2))
    except PermissionError:
        seen: list[int] = []
        with pytest.raises(PermissionError, match="expected a writable file"):
            interop.save_npy(np.ones(5), target, progress=lambda d, t: seen.append(d))
        assert seen == []  # refused before any data moved
        assert_same(np.load(target), old)
    else:
        interop.save_npy(np.ones(5), target)
        assert_same(np.load(target), np.ones(5))
    assert stat.S_IMODE(target.stat().st_mode) == 0o444


def test_save_to_a_directory_fails_before_any_data_moves(tmp_path):
    (tmp_path / "out.npy").mkdir()
    seen: list[int] = []
    with pytest.raises(IsADirectoryError, match=r"out\.npy.*a directory"):
        interop.save_npy(
            sample((1000, 100), np.float64),
            tmp_path / "out.npy",
            progress=lambda d, t: seen.append(d),
        )
    assert seen == []
    assert os.listdir(tmp_path / "out.npy") == []
    assert os.listdir(tmp_path) == ["out.npy"]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        interop.save_npy(np.ones(3), tmp_path / "missing" / "a.npy")


def test_save_accepts_the_longest_name_numpy_save_accepts(tmp_path):
    name = "n" * 251 + ".npy"
    a = sample((10,), np.uint8)
    assert interop.save_npy(a, tmp_path / name) == tmp_path / name
    assert_same(np.load(tmp_path / name), a)


# ------------------------------------------------------------ load_npy's device


def test_load_without_device_gives_numpy_like_numpy_load(tmp_path, torch):
    a = sample((20, 30), np.float32)
    np.save(tmp_path / "a.npy", a)
    for kwargs in ({}, {"device": "cpu"}, {"device": torch.device("cpu")}):
        got = interop.load_npy(tmp_path / "a.npy", **kwargs)
        assert type(got) is np.ndarray
        assert_same(got, a)


@pytest.mark.parametrize(
    ("device", "exc"),
    [
        ("bogus", ValueError),
        ("CPU", ValueError),
        ("cuda:x", ValueError),
        (-1, ValueError),
        (True, TypeError),
        (1.0, TypeError),
    ],
)
def test_a_bad_device_says_what_to_pass(tmp_path, device, exc):
    np.save(tmp_path / "a.npy", np.ones(3))
    with pytest.raises(exc) as info:
        interop.load_npy(tmp_path / "a.npy", device=device)
    message = str(info.value)
    assert message.startswith("load_npy expected device to be None or 'cpu' (a NumPy array)")
    assert "'cuda', 'cuda:N', an int, a torch.device or a cupy.cuda.Device" in message
    assert message.endswith(f"(got {device!r})")


def test_a_bad_device_is_refused_before_the_file_is_opened(tmp_path):
    with pytest.raises(ValueError, match="load_npy expected device"):
        interop.load_npy(tmp_path / "missing.npy", device="gpu")


def test_device_and_out_must_agree(tmp_path):
    np.save(tmp_path / "a.npy", np.ones(3))
    out = np.zeros(3)
    with pytest.raises(ValueError, match=r"got device=cuda and out on cpu.*not both"):
        interop.load_npy(tmp_path / "a.npy", out, device="cuda")
    assert not out.any()
    assert interop.load_npy(tmp_path / "a.npy", out, device="cpu") is out
    np.testing.assert_array_equal(out, np.ones(3))


# --------------------------------------------------------------- .npy headers


def test_format_3_0_files_are_read(tmp_path):
    """numpy writes format 3.0 when the header needs UTF-8 (non-Latin-1 field names)."""
    a = np.zeros(4, dtype=[("température", "<f4"), ("温度", "<i2")])
    a["température"] = [1.5, -2, 3, 4]
    a["温度"] = [7, 8, 9, -10]
    with pytest.warns(UserWarning, match="format 3.0"):
        np.save(tmp_path / "u.npy", a)
    with open(tmp_path / "u.npy", "rb") as f:
        assert np.lib.format.read_magic(f) == (3, 0)
    header = read_npy_header(tmp_path / "u.npy")
    assert header.dtype == a.dtype
    assert header.dtype.names == ("température", "温度")
    assert_same(interop.load_npy(tmp_path / "u.npy"), a)
    plain = sample((70, 300), np.float64)  # a 3.0 file of a plain dtype, many chunks
    with open(tmp_path / "p.npy", "wb") as f:
        np.lib.format.write_array(f, plain, version=(3, 0))
    assert read_npy_header(tmp_path / "p.npy").offset == 128
    assert_same(interop.load_npy(tmp_path / "p.npy", chunk_bytes=1 << 16), plain)


def _header_only(path, shape, version=(1, 0)):
    header = {"descr": "<f8", "fortran_order": False, "shape": shape}
    with open(path, "wb") as f:
        if version == (1, 0):
            np.lib.format.write_array_header_1_0(f, header)
        else:
            np.lib.format.write_array_header_2_0(f, header)


@pytest.mark.parametrize(
    ("shape", "pattern"),
    [
        ((2**32, 2**32), r"shape \(4294967296, 4294967296\) of float64, more than the \d+ bytes"),
        ((0, 2**62, 2**62), r"more than the \d+ bytes an array can have"),
        ((2**64,), r"more than the \d+ bytes"),
        ((-3,), r"shape \(-3,\), with a negative dimension"),
        ((4, -1), r"negative dimension"),
    ],
)
def test_impossible_header_shapes_name_the_file(tmp_path, shape, pattern):
    path = tmp_path / "huge.npy"
    _header_only(path, shape)
    out = np.full(2, 5.0)
    with pytest.raises(ValueError, match=r"huge\.npy' is not a readable \.npy file: .*" + pattern):
        read_npy_header(path)
    with pytest.raises(ValueError, match=r"huge\.npy'"):
        interop.load_npy(path, out)
    np.testing.assert_array_equal(out, [5.0, 5.0])


def test_an_unknown_format_version_is_named(tmp_path):
    path = tmp_path / "v9.npy"
    np.save(path, np.ones(2))
    data = bytearray(path.read_bytes())
    data[6] = 9  # the major version byte
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"v9\.npy'.*unsupported \.npy format version 9\.0"):
        read_npy_header(path)


# ------------------------------------------------------- a write that fails

# Run in a child: on a 1 MiB tmpfs (a full disk) or under RLIMIT_FSIZE (a file
# size limit). argv[1] is the directory; the source is a NumPy array or an
# array of the emulated device (through the device-to-host slot pipeline).
_FAILING_SAVE = """
import errno, json, os, resource, signal, sys
import numpy as np, interop
from interop.testing import EmulatedDevice

d, kind, existing, limit = sys.argv[1], {kind!r}, {existing!r}, {limit!r}
path = os.path.join(d, "x.npy")
old = b"the file that was there before " * 300  # 9.3 KB
if existing:
    with open(path, "wb") as f:
        f.write(old)
if limit:  # a write past the limit fails with EFBIG instead of killing the process
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
free = os.statvfs(d).f_bfree
a = np.arange(1 << 18, dtype=np.float64)  # 2 MiB: more than either allows
backend = EmulatedDevice()
if kind == "cupy":
    import cupy

    src = cupy.asarray(a)
else:
    src = backend.asarray(a) if kind == "device" else a
try:
    interop.save_npy(src, path, chunk_bytes=64 << 10)
    got = None
except Exception as exc:
    got = exc
print(json.dumps({{
    "classes": [c.__name__ for c in type(got).__mro__],
    "errno": getattr(got, "errno", None),
    "filename": getattr(got, "filename", None),
    "message": str(got),
    "listing": sorted(os.listdir(d)),
    "old_kept": open(path, "rb").read() == old if existing else None,
    "space_back": os.statvfs(d).f_bfree == free,
}}))
backend.close()
"""


def _failing_save(run, kind, existing, limit=0):
    proc = run(_FAILING_SAVE.format(kind=kind, existing=existing, limit=limit))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _check_untouched(got, path, code, existing):
    assert "PathError" in got["classes"]  # an interop error ...
    assert "OSError" in got["classes"]  # ... and the OSError a user catches around open
    assert "TransferError" not in got["classes"]
    assert got["errno"] == code
    assert got["filename"] == path
    assert f"save_npy could not write {path!r}: {os.strerror(code)}" in got["message"]
    assert "the destination is untouched" in got["message"]
    if existing:
        assert f"{path!r} still holds the file it held before" in got["message"]
        assert got["old_kept"] is True  # byte for byte
        assert got["listing"] == ["x.npy"]  # and no temporary file beside it
    else:
        assert f"no file was left under {path!r}" in got["message"]
        assert got["listing"] == []


# The source of a failing save: host memory, the emulated device, a CuPy array (gpu)
KINDS = ["host", "device", pytest.param("cupy", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("existing", [True, False], ids=["replacing", "new"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_full_disk_is_a_path_error_with_its_errno_and_nothing_changes(kind, existing):
    from tests.helpers.small_fs import run_on_tmpfs

    got = _failing_save(lambda code: run_on_tmpfs(code, "1m"), kind, existing)
    path = got["filename"]
    assert isinstance(path, str), got
    assert path.endswith("/x.npy")
    _check_untouched(got, path, errno.ENOSPC, existing)
    assert got["space_back"]  # the temporary file's blocks were freed too


@pytest.mark.parametrize("existing", [True, False], ids=["replacing", "new"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_file_size_limit_is_a_path_error_with_its_errno_and_nothing_changes(
    tmp_path, kind, existing
):
    code = _FAILING_SAVE.format(kind=kind, existing=existing, limit=256 << 10)
    proc = run_python(f"import sys; sys.argv[1:] = [{str(tmp_path)!r}]\n" + code)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    _check_untouched(got, str(tmp_path / "x.npy"), errno.EFBIG, existing)


@pytest.mark.parametrize("kind", ["host", "device"])
def test_a_fifo_whose_reader_leaves_says_what_was_written_stays(tmp_path, kind):
    from interop.testing import EmulatedDevice

    fifo = tmp_path / "pipe.npy"
    os.mkfifo(fifo)
    a = np.arange(1 << 19, dtype=np.float64)  # 4 MiB: far more than the pipe holds
    received = bytearray()

    def read_a_little():
        with open(fifo, "rb") as f:
            received.extend(f.read(1000))

    reader = threading.Thread(target=read_a_little)
    reader.start()
    backend = EmulatedDevice()
    try:
        src = backend.asarray(a) if kind == "device" else a
        with pytest.raises(interop.PathError) as info:
            interop.save_npy(src, fifo, chunk_bytes=64 << 10)
    finally:
        reader.join(30)
        backend.close()
    err = info.value
    assert isinstance(err, OSError)
    assert not isinstance(err, interop.TransferError)
    assert err.errno == errno.EPIPE
    assert "is written into in place, not replaced: what was written before the error" in str(err)
    assert "stays written, and a reader sees a truncated .npy file" in str(err)
    assert "untouched" not in str(err)
    assert bytes(received[:6]) == b"\x93NUMPY"  # the header went out before the error
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


# ------------------------------------------------------- an out that maps the file


def _mapped_views(path):
    """Writable arrays over the data of the .npy file at ``path`` (shared mappings)."""
    import mmap

    header = read_npy_header(path)
    f = open(path, "r+b")  # noqa: SIM115 (the mapping keeps what it needs)
    raw = mmap.mmap(f.fileno(), 0)
    f.close()
    plain = np.frombuffer(raw, header.dtype, offset=header.offset).reshape(header.shape)
    return {
        "memmap reversed": np.load(path, mmap_mode="r+")[::-1],
        "memmap itself": np.load(path, mmap_mode="r+"),
        "numpy.memmap at an offset": np.memmap(
            path, header.dtype, "r+", offset=header.offset, shape=header.shape
        )[::-1],
        "view of mmap.mmap": plain[::-1],
        "ndarray of a memmap": np.asarray(np.load(path, mmap_mode="r+"))[::-1],
    }


@pytest.mark.parametrize(
    "name",
    ["memmap reversed", "memmap itself", "numpy.memmap at an offset", "view of mmap.mmap",
     "ndarray of a memmap"],
)  # fmt: skip
def test_loading_into_a_map_of_the_same_file_is_refused_before_anything_moves(tmp_path, name):
    path = tmp_path / "m.npy"
    a = np.arange(1 << 17, dtype=np.float64)  # 16 chunks of 64 KiB
    np.save(path, a)
    before = path.read_bytes()
    out = _mapped_views(path)[name]
    with pytest.raises(interop.InvalidValueError) as info:
        interop.load_npy(path, out, chunk_bytes=1 << 16)
    message = str(info.value)
    assert f"expected out for {str(path)!r} not to be a memory map of that file" in message
    assert f"bytes [128, {128 + a.nbytes}) of it" in message
    assert "out[...] = interop.load_npy(path)" in message
    assert path.read_bytes() == before  # nothing moved
    out[...] = interop.load_npy(path)  # the fix the message gives gives the right values
    np.testing.assert_array_equal(out, a)


def test_a_cpu_tensor_over_a_map_of_the_file_is_refused(tmp_path, torch):
    path, other = tmp_path / "t.npy", tmp_path / "other.npy"
    a = np.arange(1 << 15, dtype=np.float32)
    np.save(path, a)
    np.save(other, a[::-1])
    before = path.read_bytes()
    over_the_file = torch.from_numpy(np.load(path, mmap_mode="r+"))  # shares the mapping
    with pytest.raises(interop.InvalidValueError, match="not to be a memory map of that file"):
        interop.load_npy(path, over_the_file, chunk_bytes=1 << 16)
    assert path.read_bytes() == before
    interop.load_npy(other, over_the_file, chunk_bytes=1 << 16)  # another file into it: fine
    np.testing.assert_array_equal(np.load(path), a[::-1])
    copied = torch.from_numpy(np.load(other, mmap_mode="r+")).clone()  # not a map at all
    interop.load_npy(other, copied, chunk_bytes=1 << 16)
    np.testing.assert_array_equal(copied.numpy(), a[::-1])


@pytest.mark.parametrize("how", ["copy-on-write map", "replaced file", "another file", "empty"])
def test_maps_that_cannot_change_what_is_read_are_allowed(tmp_path, how):
    path = tmp_path / "m.npy"
    a = np.arange(1 << 17, dtype=np.float64)
    np.save(path, np.zeros_like(a) if how == "replaced file" else a)
    if how == "copy-on-write map":  # writes stay in private pages: the file never changes
        out = np.load(path, mmap_mode="c")[::-1]
        expected_file = a
    elif how == "replaced file":  # a map of the old file: save_npy wrote a new one
        out = np.load(path, mmap_mode="r+")[::-1]
        interop.save_npy(a, path)
        expected_file = a
    elif how == "another file":
        np.save(tmp_path / "other.npy", np.zeros_like(a))
        out = np.load(tmp_path / "other.npy", mmap_mode="r+")[::-1]
        expected_file = a
    else:
        np.save(path, a[:0])
        out = np.load(path, mmap_mode="r+")
        a, expected_file = a[:0], a[:0]
    assert interop.load_npy(path, out, chunk_bytes=1 << 16) is out
    np.testing.assert_array_equal(out, a)
    np.testing.assert_array_equal(np.load(path), expected_file)


def test_where_there_is_no_maps_table_the_memmap_names_its_file(tmp_path, monkeypatch):
    from interop.io import npy

    monkeypatch.setattr(npy, "_MAPS", str(tmp_path / "no-maps"))  # as on a system without /proc
    path, other = tmp_path / "m.npy", tmp_path / "other.npy"
    a = np.arange(1000, dtype=np.int32)
    np.save(path, a)
    np.save(other, a[::-1])
    before = path.read_bytes()
    at_an_offset = np.memmap(path, np.int32, "r+", offset=128, shape=(1000,))[::-1]
    with pytest.raises(interop.InvalidValueError, match=r"bytes \[128, 4128\) of it"):
        interop.load_npy(path, at_an_offset)
    with pytest.raises(interop.InvalidValueError, match="not to be a memory map of that file"):
        interop.load_npy(path, np.load(path, mmap_mode="r+")[::-1])
    assert path.read_bytes() == before
    mapped_other = np.load(other, mmap_mode="r+")[::-1]  # a map of another file: allowed
    assert interop.load_npy(path, mapped_other) is mapped_other
    np.testing.assert_array_equal(mapped_other, a)
    cow = np.load(path, mmap_mode="c")[::-1]  # copy-on-write: the file never changes
    assert interop.load_npy(path, cow) is cow
    np.testing.assert_array_equal(cow, a)
    assert path.read_bytes() == before


@pytest.mark.parametrize("mode", ["r", "r+"])
def test_saving_a_map_of_the_destination_writes_the_right_values(tmp_path, mode, monkeypatch):
    from interop.io import destination

    for unnamed in (True, False):
        monkeypatch.setattr(destination, "_UNNAMED_TEMPORARY", unnamed)
        path = tmp_path / f"s{unnamed}.npy"
        a = np.arange(1 << 17, dtype=np.float64)
        np.save(path, a)
        x = np.load(path, mmap_mode=mode)[::-1]  # read while the file is replaced: a new file
        interop.save_npy(x, path, chunk_bytes=1 << 16)
        np.testing.assert_array_equal(np.load(path), a[::-1])
        np.testing.assert_array_equal(x, a[::-1])  # the map still shows the old file
