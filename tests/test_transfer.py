"""copy_to_host / copy_to_host_async / copy_to_device: the host engine on real data.
The slot pipeline on a device is tested in test_schedule.py (and test_pinned.py,
test_lifetime.py, test_trace.py, test_npy_device.py), one body for the emulated
device and CUDA; the few tests at the end of this file need CUDA itself."""

from __future__ import annotations

import sys
import threading
import weakref
from typing import ClassVar

import ml_dtypes
import numpy as np
import pytest

import interop
from tests.helpers import (
    ALL_NAMES,
    NUMPY_DTYPES,
    in_threads,
    run_python,
    sample,
    self_overlapping_outs,
)


def bits(a):
    """Bytes of ``a`` in C order, for exact comparisons of any dtype."""
    return np.ascontiguousarray(a).tobytes()


# ----------------------------------------------------------------- host engine


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_every_dtype(dtype):
    a = sample((13, 7), dtype)
    out = np.empty_like(a)
    assert interop.copy_to_host(a, out, chunk_bytes=20) is out
    assert bits(out) == bits(a)
    fresh = interop.copy_to_host(a, chunk_bytes=33)
    assert fresh.dtype == a.dtype
    assert not np.shares_memory(fresh, a)
    assert bits(fresh) == bits(a)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_cpu_tensor_every_dtype(torch, name):
    t = torch.from_numpy(sample((6, 5), np.float64)).to(getattr(torch, name))
    got = interop.copy_to_host(t, chunk_bytes=7)
    expect = interop.to_numpy(t)
    assert got.dtype == expect.dtype
    assert bits(got) == bits(expect)
    if name == "bfloat16":
        assert got.dtype == np.dtype(ml_dtypes.bfloat16)


TORCH_DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("where", TORCH_DEVICES)
@pytest.mark.parametrize(("shape", "dtype"), [((2, 2), "complex128"), ((64, 3), "complex64")])
def test_conj_and_neg_tensors_give_their_values(torch, where, shape, dtype):
    """A CPU tensor through the host engine, a CUDA one through the slot pipeline."""
    values = sample(shape, dtype)
    z = torch.tensor(values, device=where)
    np.testing.assert_array_equal(interop.copy_to_host(z.conj(), chunk_bytes=16), values.conj())
    np.testing.assert_array_equal(interop.copy_to_host(z.conj().imag, chunk_bytes=8), -values.imag)
    g = torch.ones(5, device=where, requires_grad=True)
    got = interop.copy_to_host(g)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.ones(5, np.float32))


VIEWS = {
    "contiguous": lambda a: a,
    "transposed": lambda a: a.T,
    "negative": lambda a: a[::-1, ::-2],
    "column": lambda a: a[:, 4],
    "steps": lambda a: a[1::3, 2:9:2],
}


@pytest.mark.parametrize("src_view", VIEWS.values(), ids=VIEWS.keys())
@pytest.mark.parametrize("out_layout", ["C", "F", "strided"])
@pytest.mark.parametrize("chunk", [1, 24, 1 << 20])
def test_strided_sources_and_outs(src_view, out_layout, chunk):
    src = src_view(sample((10, 12), np.float64, seed=1))
    if out_layout == "C":
        out = np.zeros(src.shape)
    elif out_layout == "F":
        out = np.zeros(src.shape, order="F")
    else:
        out = (
            np.zeros(tuple(2 * n for n in src.shape))[::2, ::-2]
            if src.ndim == 2
            else (np.zeros(2 * src.shape[0])[::2])
        )
    interop.copy_to_host(src, out, chunk_bytes=chunk)
    np.testing.assert_array_equal(out, src)


def test_memmap_source_and_out(tmp_path):
    src = np.lib.format.open_memmap(tmp_path / "s.npy", "w+", np.float32, (64, 40))
    src[...] = sample((64, 40), np.float32)
    out = np.lib.format.open_memmap(tmp_path / "o.npy", "w+", np.float32, (40, 64))
    interop.copy_to_host(src.T, out, chunk_bytes=1000)
    out.flush()
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), src.T)


@pytest.mark.parametrize("shape", [(), (0,), (4, 0, 3), (1,)])
def test_zero_d_and_zero_size(shape):
    a = sample(shape, np.int16)
    out = np.full(shape, 9, np.int16)
    assert interop.copy_to_host(a, out) is out
    assert out.shape == shape
    assert bits(out) == bits(a)


def test_a_transfer_request_resolves_its_options_and_refuses_missing_ends():
    """The pipeline's request: one validator for what every copy shares."""
    from interop.pipeline.hostcopy import CopyOut
    from interop.pipeline.request import TransferRequest

    out = np.zeros(3)
    with interop.config.set(chunk_bytes=1 << 20, host_threads=3):
        request = TransferRequest("f", "h2h", out, CopyOut(out), shape=(3,), itemsize=8)
    assert (request.chunk, request.threads) == (1 << 20, 3)
    with pytest.raises(interop.UsageError, match=r"f: expected a request .* \(got 'd2h' with"):
        TransferRequest("f", "d2h", out, CopyOut(out))  # no device array
    with pytest.raises(ValueError, match="chunk_bytes"):
        TransferRequest("f", "h2h", out, CopyOut(out), chunk_bytes=0)
    with pytest.raises(TypeError, match="progress"):
        TransferRequest("f", "h2h", out, CopyOut(out), progress="yes")


def test_chunk_smaller_than_an_element_is_clamped():
    a = sample((17,), np.complex128)
    np.testing.assert_array_equal(interop.copy_to_host(a, chunk_bytes=1), a)


# ----------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("make_out", "exc", "pattern"),
    [
        (lambda: np.full((4, 5), 3.0), ValueError, r"shape \(5, 4\) \(got \(4, 5\)\)"),
        (lambda: np.full((5, 4), 3, np.float32), ValueError, "dtype float64 \\(got float32\\)"),
        (lambda: [[3.0] * 4] * 5, TypeError, r"writable NumPy array .* \(got builtins.list\)"),
    ],
)
def test_bad_out_is_refused_before_writing(make_out, exc, pattern):
    out = make_out()
    before = np.asarray(out).tobytes()
    with pytest.raises(exc, match=pattern):
        interop.copy_to_host(np.ones((5, 4)), out)
    assert np.asarray(out).tobytes() == before


def test_read_only_out_is_refused():
    out = np.full(3, 2.0)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="writable out"):
        interop.copy_to_host(np.ones(3), out)
    assert out.tolist() == [2.0, 2.0, 2.0]


def test_overlapping_out_is_refused():
    a = np.arange(10.0)
    with pytest.raises(ValueError, match="overlap"):
        interop.copy_to_host(a[:5], a[3:8])
    assert a.tolist() == list(np.arange(10.0))
    interop.copy_to_host(a[0::2], a[1::2])  # interleaved, disjoint: allowed
    assert a[1::2].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]


def test_an_out_whose_elements_share_memory_is_refused_before_writing(torch):
    a = np.arange(12.0).reshape(3, 4)
    for base, out in self_overlapping_outs(torch):
        assert out.flags.writeable
        with pytest.raises(interop.InvalidValueError, match="elements may share memory") as info:
            interop.copy_to_host(a, out)
        assert f"strides {out.strides}" in str(info.value)
        assert not np.asarray(base).any()  # nothing written


def test_lazy_conj_and_neg_sources_overlapping_out_are_refused(torch):
    z = torch.tensor([1 + 2j, 3 - 4j, 5 + 6j, 7 - 8j])
    out = z.numpy()
    before = out.tobytes()
    with pytest.raises(ValueError, match="overlap"):
        interop.copy_to_host(z.conj(), out)
    reals = torch.view_as_real(z)  # float64 (4, 2) over the same memory
    with pytest.raises(ValueError, match="overlap"):
        interop.copy_to_host(z.conj().imag, reals.numpy()[:, 1])
    assert out.tobytes() == before


def test_bad_progress_is_refused_before_writing():
    out = np.zeros(4)
    with pytest.raises(TypeError, match=r"expected progress to be .* \(got 'yes'\)"):
        interop.copy_to_host(np.ones(4), out, progress="yes")
    assert out.tolist() == [0.0] * 4


def test_non_arrays_and_bad_chunk_bytes():
    with pytest.raises(TypeError, match=r"copy_to_host expected .* \(got builtins.list: \[1, 2"):
        interop.copy_to_host([1, 2])
    with pytest.raises(ValueError, match=r"expected chunk_bytes between 1 and \d+ .*\(got 0\)"):
        interop.copy_to_host(np.ones(2), chunk_bytes=0)


def test_cuda_data_without_a_device_raises_no_device():
    class FakeCAI:
        __cuda_array_interface__: ClassVar = {
            "shape": (4,),
            "typestr": "<f4",
            "data": (0, False),
            "version": 3,
        }

    if interop._backends.cupy_device_count() > 0:
        pytest.skip("a CUDA device is visible")
    with pytest.raises(interop.NoDeviceError, match="expected a CUDA device"):
        interop.copy_to_host(FakeCAI())


# ----------------------------------------------------------------- progress, cancel, errors


def test_progress_callable_is_monotonic_and_complete():
    a = sample((12000, 10), np.float64)  # 15 chunks of 64 KiB (the smallest chunk)
    seen = []
    interop.copy_to_host(a, chunk_bytes=1 << 16, progress=lambda d, t: seen.append((d, t)))
    assert len(seen) > 10
    done = [d for d, _ in seen]
    assert done == sorted(done)
    assert seen[-1] == (a.nbytes, a.nbytes)
    assert {t for _, t in seen} == {a.nbytes}


@pytest.mark.parametrize("shape", [(0,), (3, 0)])
def test_progress_of_an_empty_transfer_ends_at_the_total(shape):
    seen = []
    interop.copy_to_host(np.ones(shape), progress=lambda d, t: seen.append((d, t)))
    assert seen == [(0, 0)]


def test_progress_bar(capsys):
    interop.copy_to_host(np.ones(1000), progress=True)
    assert "copy_to_host" in capsys.readouterr().err


def test_cancel_reports_the_complete_prefix():
    a = sample((4000, 8), np.float64)
    out = np.zeros_like(a)
    holder = {}
    gate = threading.Event()

    def progress(done, total):
        if done >= 10 * 64 and "t" in holder:
            holder["t"].cancel()
        gate.wait(5)

    transfer = interop.copy_to_host_async(a, out, chunk_bytes=64, progress=progress)
    holder["t"] = transfer
    gate.set()
    with pytest.raises(
        interop.TransferError, match=r"cancelled; bytes \[0, (\d+)\) of 256000"
    ) as info:
        transfer.result(timeout=30)
    err = info.value
    assert 0 < err.bytes_done < a.nbytes
    assert err.nbytes == a.nbytes
    assert transfer.done()
    n = err.bytes_done // 8
    assert out.reshape(-1)[:n].tolist() == a.reshape(-1)[:n].tolist()


@pytest.mark.parametrize("blocking", [True, False])
def test_a_progress_callbacks_error_is_raised_as_itself(blocking):
    """An exception of the caller's own callback comes back as itself (an
    ``except KeyError`` around the call catches it), with a note saying which
    bytes were complete."""

    def progress(done, total):
        raise KeyError("from the callback")

    src = np.ones(3 << 13)
    if blocking:
        call = lambda: interop.copy_to_host(src, chunk_bytes=1 << 16, progress=progress)  # noqa: E731
    else:
        t = interop.copy_to_host_async(src, chunk_bytes=1 << 16, progress=progress)
        call = lambda: t.result(timeout=30)  # noqa: E731
    with pytest.raises(KeyError, match="from the callback") as info:
        call()
    assert not isinstance(info.value, interop.TransferError)
    notes = "\n".join(info.value.__notes__)
    # the first chunk was complete when the callback raised
    assert f"progress callback of copy_to_host; bytes [0, {1 << 16}) of {3 << 16}" in notes


def test_a_failed_transfer_keeps_nothing_alive():
    """The worker's frames (engine state: on a GPU, staging memory and streams)
    are not kept alive by the error the caller holds."""
    src = np.ones(1000)
    alive = weakref.ref(src)

    def progress(done, total):
        raise ZeroDivisionError

    transfer = interop.copy_to_host_async(src, chunk_bytes=800, progress=progress)
    del src
    with pytest.raises(ZeroDivisionError):
        transfer.result(timeout=30)
    assert alive() is None


def test_keyboard_interrupt_in_a_worker_reaches_the_caller():
    def progress(done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interop.copy_to_host(np.ones(10), progress=progress)


def test_result_timeout_then_completion():
    gate = threading.Event()
    a = np.arange(50.0)
    transfer = interop.copy_to_host_async(a, chunk_bytes=80, progress=lambda d, t: gate.wait(5))
    with pytest.raises(TimeoutError, match="not finished"):
        transfer.result(timeout=0.01)
    assert not transfer.done()
    gate.set()
    np.testing.assert_array_equal(transfer.result(timeout=30), a)
    assert transfer.bytes_done == transfer.nbytes == a.nbytes
    assert transfer.cancel() is False  # already finished


def test_concurrent_transfers():
    sources = [sample((200, 30), np.float32, seed=s) for s in range(8)]
    outs = [np.zeros_like(s) for s in sources]
    in_threads(lambda i: interop.copy_to_host(sources[i].T, outs[i].T, chunk_bytes=512), 8)
    for s, o in zip(sources, outs, strict=True):
        np.testing.assert_array_equal(o, s)


# ----------------------------------------------------------------- CUDA only
# The slot pipeline's behaviour on a device is tested once for both devices (the
# emulated one and CUDA) in test_schedule.py, test_pinned.py, test_lifetime.py,
# test_trace.py and test_npy_device.py. What stays here needs CUDA itself: the
# driver's blocking-sync events, a fresh CuPy array or tensor made where no out is
# given, CuPy's per-thread default stream.


@pytest.mark.gpu
def test_gpu_waiting_threads_sleep_instead_of_spinning(torch):
    """Blocking-sync events: host threads waiting on a long kernel cost little
    CPU time (spinning threads would cost their wall time each). CUDA only: the
    emulated device's events are Python conditions, which never spin."""
    import time

    x = torch.ones(1 << 24, device="cuda")
    torch.cuda._sleep(1_000_000_000)  # about half a second or more on the current stream
    with interop.config.set(host_threads=4):
        wall, cpu = time.perf_counter(), time.process_time()
        out = interop.copy_to_host(x, chunk_bytes=1 << 20)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert out.sum() == 1 << 24
    assert cpu < 0.5 * wall


@pytest.mark.gpu
def test_gpu_non_native_byte_order_reaches_the_device_in_native_order(cp, torch):
    """CUDA only: without an out, a new CuPy array or tensor is made on the
    current CUDA device (the copy into an out is test_schedule's
    test_non_native_byte_order_is_converted_while_filling_slots)."""
    a = np.arange(300_000, dtype=">f4").reshape(600, 500)
    for got in (
        interop.copy_to_device(a, chunk_bytes=1 << 16),
        interop.to_cupy(a),
        interop.to_torch(a, device="cuda"),
    ):
        assert str(got.dtype) in ("float32", "torch.float32")
        np.testing.assert_array_equal(interop.to_numpy(got), a)


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [8, 100_000, 1 << 22])  # 8 is raised to 64 KiB
def test_gpu_copy_to_device_without_out_makes_a_cupy_array(cp, chunk):
    """CUDA only: without an out, a new CuPy array on the current CUDA device,
    C-ordered whatever the source's strides (the copy into an out is
    test_schedule's test_memmap_and_strided_host_sources_into_strided_device_outs)."""
    a = sample((3000, 70), np.float32)
    out = interop.copy_to_device(a[::-1, ::3], chunk_bytes=chunk)
    assert isinstance(out, cp.ndarray)
    assert out.flags.c_contiguous
    np.testing.assert_array_equal(cp.asnumpy(out), a[::-1, ::3])


@pytest.mark.gpu
def test_gpu_transfers_of_tensors_under_cupys_per_thread_default_stream():
    """CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1: CuPy would name the per-thread
    default stream to PyTorch's __dlpack__, which refuses it; the pipeline
    orders its copy stream itself and gets the values after the producer.
    CUDA only: a setting of CuPy's."""
    proc = run_python(
        """
        import numpy as np, torch, interop
        t = torch.zeros(1 << 22, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())  # the zeros first
        with torch.cuda.stream(side):
            torch.cuda._sleep(100_000_000)
            t.fill_(3.0)
            print("d2h", bool((interop.copy_to_host(t, chunk_bytes=1 << 20) == 3.0).all()))
        print("default", bool((interop.copy_to_host(t) == 3.0).all()))
        out = torch.empty(1 << 22, device="cuda")
        host = np.arange(1 << 22, dtype=np.float32)
        interop.copy_to_device(host, out, chunk_bytes=1 << 20)
        print("h2d", bool(np.array_equal(out.cpu().numpy(), host)))
        """,
        env={"CUPY_CUDA_PER_THREAD_DEFAULT_STREAM": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["d2h", "True", "default", "True", "h2d", "True"]


def test_ctrl_c_while_waiting_cancels_releases_and_reraises():
    """SIGINT during result(): KeyboardInterrupt is re-raised after the transfer
    stopped and its work ended (the process's pool of host threads stays, idle);
    the process stays usable."""
    proc = run_python(
        """
        import os, signal, threading, time
        import numpy as np, interop
        a = np.arange(1 << 21, dtype=np.float64)  # 256 chunks of 64 KiB
        out = np.zeros_like(a)
        interop.copy_to_host(a, out, chunk_bytes=1 << 16)  # the pool's threads are started
        out[:] = 0
        base = threading.active_count()
        slow = lambda done, total: time.sleep(0.01)
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            interop.copy_to_host(a, out, chunk_bytes=1 << 16, progress=slow)
        except KeyboardInterrupt:
            print("interrupted")
        time.sleep(0.3)  # the timer thread ends
        print("threads", threading.active_count() - base)
        n = int(np.argmin(out[1:] != 0)) + 1 if (out[1:] == 0).any() else a.size
        print("prefix ok", bool((out[:n] == a[:n]).all()), n < a.size)
        print("usable", bool((interop.copy_to_host(a) == a).all()))
        """
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines == ["interrupted", "threads 0", "prefix ok True True", "usable True"]


# ----------------------------------------------------------------- small things


def test_numpy_scalars_are_copied_as_0d_arrays():
    out = interop.copy_to_host(np.float32(3))
    assert (type(out), out.shape, out.dtype, out[()]) == (np.ndarray, (), np.float32, 3)
    into = np.zeros((), np.int64)
    assert interop.copy_to_host(np.int64(-7), into) is into
    assert into[()] == -7


def test_a_transfer_shows_its_bytes_and_state():
    a = np.ones(1 << 15)  # 256 KiB: four chunks of 64 KiB
    t = interop.copy_to_host_async(a, chunk_bytes=1 << 16)
    t.result(timeout=30)
    assert repr(t) == f"<Transfer copy_to_host: {a.nbytes} of {a.nbytes} bytes, done>"

    def boom(done, total):
        raise KeyError("stop")

    t = interop.copy_to_host_async(a, chunk_bytes=1 << 16, progress=boom)
    with pytest.raises(KeyError):
        t.result(timeout=30)
    assert repr(t) == f"<Transfer copy_to_host: {1 << 16} of {a.nbytes} bytes, failed>"

    holder = {}

    def cancel_after_first(done, total):
        holder["t"].cancel()

    gate = threading.Event()
    with interop.config.set(host_threads=1):
        t = interop.copy_to_host_async(
            a, chunk_bytes=1 << 16, progress=lambda d, n: (gate.wait(10), cancel_after_first(d, n))
        )
        holder["t"] = t
        # the first chunk is copied, its callback waits on the gate
        assert repr(t) in (
            f"<Transfer copy_to_host: {done} of {a.nbytes} bytes, running>" for done in (0, 1 << 16)
        )
        gate.set()
        with pytest.raises(interop.TransferError, match="cancelled"):
            t.result(timeout=30)
    assert repr(t).endswith(" bytes, cancelled>")


def test_copies_work_inside_atexit_handlers(tmp_path):
    """At interpreter exit no thread pool takes new work; copies run on the
    calling thread instead (host copies, device pipelines, .npy files)."""
    code = f"""
        import atexit
        import numpy as np
        import interop
        from interop.testing import EmulatedDevice

        def at_exit():
            a = np.arange(1 << 18, dtype=np.float64)  # 2 MiB: several chunks
            with interop.config.set(host_threads=2):
                out = interop.copy_to_host(a, chunk_bytes=1 << 16)
                device = EmulatedDevice()
                d = interop.copy_to_device(a, device.empty(a.shape, a.dtype), chunk_bytes=1 << 16)
                back = interop.copy_to_host(d, chunk_bytes=1 << 16)
                path = interop.save_npy(d, {str(tmp_path / "x.npy")!r}, chunk_bytes=1 << 16)
                loaded = interop.load_npy(path)
            ok = all(np.array_equal(b, a) for b in (out, back, loaded, np.load(path)))
            print("at exit:", ok, device.violations, flush=True)

        atexit.register(at_exit)
        """
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "at exit: True []", proc.stderr


# ----------------------------------------------------------------- casting on the way

FLOATS = [np.float16, np.float32, np.float64, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn]


@pytest.mark.parametrize("have", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("want", [np.float32, ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
def test_a_host_source_is_cast_on_the_way(have, want):
    a = np.linspace(-4, 4, 3 << 12, dtype=np.float32).reshape(96, 128).astype(have)
    expect = a.T.astype(want)
    out = interop.copy_to_host(a.T, dtype=want, chunk_bytes=1 << 16)
    assert out.dtype == np.dtype(want)
    assert out.tobytes() == np.ascontiguousarray(expect).tobytes()
    into = np.zeros(a.T.shape, want)
    assert interop.copy_to_host(a.T, into, dtype=want, chunk_bytes=1 << 16) is into
    assert into.tobytes() == np.ascontiguousarray(expect).tobytes()


def test_a_bfloat16_cpu_tensor_is_cast_with_its_bits(torch):
    t = torch.linspace(-3, 3, 5000).to(torch.bfloat16).reshape(50, 100)
    seen = []
    out = interop.copy_to_host(
        t, dtype=np.float32, chunk_bytes=1 << 16, progress=lambda d, n: seen.append((d, n))
    )
    np.testing.assert_array_equal(out, t.float().numpy())
    assert seen[-1] == (out.nbytes, out.nbytes)  # progress counts the bytes of the result
    neg = torch._neg_view(torch.tensor([1.5, -2.0], dtype=torch.bfloat16))
    assert neg.is_neg()  # the bit is applied before the cast
    np.testing.assert_array_equal(interop.copy_to_host(neg, dtype=np.float64), [-1.5, 2.0])


def test_cast_arguments_are_refused_before_anything_moves():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = np.full((3, 4), 9, np.float64)
    with pytest.raises(
        ValueError,
        match=r"expected out of dtype float32 \(got float64\).*"
        r"pass dtype=numpy.float64 to cast on the way",
    ):
        interop.copy_to_host(a, out)
    with pytest.raises(ValueError, match=r"expected out of dtype float16 \(got float64\)"):
        interop.copy_to_host(a, out, dtype=np.float16)  # dtype and out disagree
    assert (out == 9).all()
    with pytest.raises(
        ValueError, match=r"a cast between floating dtypes \(got int64 to float32\)"
    ):
        interop.copy_to_host(np.arange(3), dtype=np.float32)
    with pytest.raises(ValueError, match=r"\(got float32 to int32\)"):
        interop.copy_to_host(a, dtype=np.int32)
    with pytest.raises(TypeError, match=r"expected dtype to be a NumPy dtype"):
        interop.copy_to_host(a, dtype="no such dtype")
    assert interop.copy_to_host(a, dtype=np.float32).dtype == np.float32  # the same: no cast


@pytest.mark.parametrize(
    "make",
    [
        lambda th: th.arange(24.0).reshape(4, 6),
        lambda th: th.arange(24.0).reshape(4, 6).T,  # strided: the result is C-ordered
        lambda th: th.arange(24.0).reshape(4, 6).expand(2, 4, 6),  # a broadcast view
        lambda th: th.arange(24.0, requires_grad=True),  # not plain: the general path
        lambda th: th.arange(24.0).to(th.bfloat16),
        lambda th: (th.arange(6.0) + 1j).conj(),
    ],
    ids=["contiguous", "transposed", "broadcast", "requires grad", "bfloat16", "conj"],
)
def test_a_small_fresh_copy_is_an_independent_c_ordered_array(make, torch):
    t = make(torch)
    out = interop.copy_to_host(t)
    expect = t.detach().resolve_conj().float().numpy() if t.dtype == torch.bfloat16 else None
    assert out.flags.c_contiguous
    assert out.flags.writeable
    if expect is None:
        np.testing.assert_array_equal(out, t.detach().resolve_conj().numpy())
    else:
        np.testing.assert_array_equal(out.astype(np.float32), expect)
    out[...] = 0
    assert t.detach().abs().sum().item() != 0  # the source is untouched


def _calls_made(fn):
    """``fn()`` and the names of the functions it called on this thread (Python and C)."""
    names: list[str] = []

    def watch(frame, event, arg):
        if event == "c_call":
            names.append(getattr(arg, "__qualname__", getattr(arg, "__name__", repr(arg))))
        elif event == "call":
            names.append(frame.f_code.co_name)

    sys.setprofile(watch)
    try:
        result = fn()
    finally:
        sys.setprofile(None)
    return result, names


@pytest.mark.parametrize("mib", [1, 16])
def test_a_small_fresh_copy_waits_on_no_other_thread(mib, torch):
    """A fresh copy of at most one default chunk is NumPy's, made on the calling thread:
    not PyTorch's ``copy_`` (its intra-op threads wait for each other: milliseconds a copy
    on a machine whose cores other processes keep busy) nor a hand-off to the host pool."""
    t = torch.rand(mib << 18)
    out, names = _calls_made(lambda: interop.copy_to_host(t))
    np.testing.assert_array_equal(out, t.numpy())
    assert not np.shares_memory(out, t.numpy())
    assert [n for n in names if n.endswith("copy_") or n in ("submit", "host_pool")] == []
    assert "ndarray.copy" in names  # the profile saw the copy itself
