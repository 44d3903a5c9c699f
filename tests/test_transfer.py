"""copy_to_host / copy_to_host_async / copy_to_device: the host engine on real data
here, the CUDA backend of the slot pipeline under the ``gpu`` marker (the same
pipeline runs through the host backend in test_schedule.py)."""

from __future__ import annotations

import gc
import threading
import weakref
from typing import ClassVar

import ml_dtypes
import numpy as np
import pytest

import interop
from interop.pipeline.ring import _ring_cache, cached_rings

from .helpers import ALL_NAMES, NUMPY_DTYPES, in_threads, run_python, sample


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


def test_conj_and_neg_tensors_give_their_values(torch):
    z = torch.tensor([[1 + 2j, 3 - 4j], [5 + 6j, -7 - 8j]])
    np.testing.assert_array_equal(interop.copy_to_host(z.conj(), chunk_bytes=16), z.numpy().conj())
    np.testing.assert_array_equal(
        interop.copy_to_host(z.conj().imag, chunk_bytes=8), -z.numpy().imag
    )
    g = torch.ones(3, requires_grad=True)
    np.testing.assert_array_equal(interop.copy_to_host(g), [1.0, 1.0, 1.0])


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


# ----------------------------------------------------------------- CUDA engine


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
@pytest.mark.parametrize("chunk", [4, 4096, 1 << 22])
def test_gpu_cupy_sources(cp, layout, chunk):
    a = cp.arange(300 * 70, dtype=cp.float32).reshape(300, 70)
    src = {"contiguous": a, "transposed": a.T, "sliced": a[::-3, 5:60:2]}[layout]
    out = interop.copy_to_host(src, chunk_bytes=chunk)
    np.testing.assert_array_equal(out, cp.asnumpy(src))
    strided_out = np.zeros((src.shape[1], src.shape[0]), np.float32).T
    assert interop.copy_to_host(src, strided_out, chunk_bytes=chunk) is strided_out
    np.testing.assert_array_equal(strided_out, cp.asnumpy(src))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(), (0,), (5, 0), (1,)])
def test_gpu_zero_d_and_zero_size(cp, shape):
    a = cp.full(shape, 3, dtype=cp.int16)
    out = np.full(shape, 9, np.int16)
    assert interop.copy_to_host(a, out, chunk_bytes=1) is out
    assert bits(out) == bits(cp.asnumpy(a))


@pytest.mark.gpu
def test_gpu_cupy_bfloat16_transposed(cp, torch):
    if not interop._backends.cupy_supports_bfloat16():
        pytest.skip("this CuPy has no bfloat16")
    t = torch.linspace(-3, 3, 600, device="cuda").reshape(20, 30).to(torch.bfloat16)
    c = interop.to_cupy(t).T
    got = interop.copy_to_host(c, chunk_bytes=100)
    assert got.dtype == np.dtype(ml_dtypes.bfloat16)
    assert bits(got) == bits(interop.to_numpy(t.T.cpu()))


@pytest.mark.gpu
def test_gpu_concurrent_transfers(cp):
    sources = [cp.arange(s, s + 50_000, dtype=cp.float64).reshape(500, 100) for s in range(6)]
    outs = [np.zeros((100, 500)) for _ in sources]
    in_threads(
        lambda i: interop.copy_to_host(sources[i].T, outs[i], chunk_bytes=8192), len(sources)
    )
    for s, o in zip(sources, outs, strict=True):
        np.testing.assert_array_equal(o, cp.asnumpy(s.T))


@pytest.mark.gpu
def test_gpu_large_chunks_split_across_host_threads(cp):
    """Chunks of several MiB: each slot's host copy is split across threads."""
    a = cp.arange(3 << 20, dtype=cp.float32).reshape(3 << 10, 1 << 10)  # 12 MiB
    out = np.zeros((1 << 10, 3 << 10), np.float32).T  # strided out
    with interop.config.set(host_threads=4, num_buffers=2):
        interop.copy_to_host(a, out, chunk_bytes=4 << 20)
    np.testing.assert_array_equal(out, cp.asnumpy(a))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ALL_NAMES)
def test_gpu_torch_every_dtype(torch, name):
    t = torch.linspace(-3, 3, 1000, device="cuda").reshape(40, 25).to(getattr(torch, name))
    got = interop.copy_to_host(t.T, chunk_bytes=300)
    expect = interop.to_numpy(t.T.cpu())
    assert got.dtype == expect.dtype
    assert bits(got) == bits(expect)


@pytest.mark.gpu
def test_gpu_conj_neg_and_grad(torch):
    z = torch.randn(64, 3, dtype=torch.complex64, device="cuda")
    np.testing.assert_array_equal(
        interop.copy_to_host(z.conj(), chunk_bytes=64), z.cpu().numpy().conj()
    )
    np.testing.assert_array_equal(
        interop.copy_to_host(z.conj().imag, chunk_bytes=64), -z.cpu().numpy().imag
    )
    g = torch.ones(5, device="cuda", requires_grad=True)
    np.testing.assert_array_equal(interop.copy_to_host(g), np.ones(5, np.float32))


@pytest.mark.gpu
def test_gpu_transposed_source_extra_memory_within_the_ring(cp):
    a = cp.ones((4096, 4096), cp.float32)  # 64 MiB
    cp.cuda.Device().synchronize()
    pool = cp.get_default_memory_pool()
    chunk = 1 << 20
    with interop.config.set(chunk_bytes=chunk, num_buffers=3):
        before = pool.used_bytes()
        transfer = interop.copy_to_host_async(a.T, chunk_bytes=chunk)
        peak = before
        while not transfer.done():
            peak = max(peak, pool.used_bytes())
        out = transfer.result()
        peak = max(peak, pool.used_bytes())
    assert out.sum() == 4096 * 4096
    assert peak - before <= 3 * chunk


@pytest.mark.gpu
def test_gpu_staging_rows_of_odd_chunk_sizes_stay_aligned(cp):
    """Unrounded slots would put staging row 1 at 70_008 bytes: a misaligned
    complex128 pack (cudaErrorMisalignedAddress, a sticky error)."""
    a = cp.arange(30_000, dtype=cp.complex128).reshape(10_000, 3)
    np.testing.assert_array_equal(interop.copy_to_host(a.T, chunk_bytes=70_008), cp.asnumpy(a.T))
    out = cp.zeros((3, 10_000), cp.complex128)
    interop.copy_to_device(cp.asnumpy(a), out.T, chunk_bytes=70_008)
    np.testing.assert_array_equal(cp.asnumpy(out.T), cp.asnumpy(a))


@pytest.mark.gpu
def test_gpu_staging_waits_for_work_pending_on_its_allocating_stream(cp, torch):
    """The worker allocates device staging on its current stream (the legacy
    default stream) from CuPy's pool: a block freed there while a kernel still
    fills it must not be packed into before that kernel is done."""
    x = cp.arange(1 << 20, dtype=cp.float32).reshape(1024, 1024)
    expect = cp.asnumpy(x.T)
    with interop.config.set(num_buffers=4):
        for _ in range(3):
            tmp = cp.empty(4 << 20, dtype=cp.uint8)  # the size of the staging block
            torch.cuda._sleep(200_000_000)  # on the legacy default stream ...
            tmp.fill(255)  # ... then this write, on the same stream
            del tmp  # back to CuPy's pool for the default stream, still being written
            with cp.cuda.Stream(non_blocking=True):  # the producer is another stream
                out = interop.copy_to_host(x.T, chunk_bytes=1 << 20)
            np.testing.assert_array_equal(out, expect)


@pytest.mark.gpu
def test_gpu_device_to_device_waits_for_the_source_stream(cp, torch):
    side = torch.cuda.Stream()
    src = torch.zeros(1 << 22, device="cuda")
    out = cp.zeros(1 << 22, dtype=cp.float32)
    side.wait_stream(torch.cuda.current_stream())  # the zeros first
    with torch.cuda.stream(side):  # PyTorch's current stream: the producer
        torch.cuda._sleep(200_000_000)
        src.fill_(3.0)
        assert interop.copy_to_device(src, out) is out  # queued on CuPy's current stream
    assert float(out.sum()) == 3.0 * (1 << 22)


@pytest.mark.gpu
def test_gpu_device_to_device_keeps_a_resolved_temporary_until_the_copy_read_it(cp, torch):
    """A conjugate tensor is resolved into a temporary on PyTorch's stream and
    copied on CuPy's stream, which here runs later: PyTorch hands the freed
    temporary out again on its stream, and that must not overwrite it first."""
    n = 1 << 20
    z = torch.randn(n, dtype=torch.complex64, device="cuda")
    expect = z.cpu().numpy().conj()
    out = cp.zeros(n, cp.complex64)
    consumer = cp.cuda.Stream(non_blocking=True)
    with torch.cuda.stream(torch.cuda.ExternalStream(consumer.ptr)):
        torch.cuda._sleep(200_000_000)  # the copy queued on consumer waits for this
    with consumer:
        assert interop.copy_to_device(z.conj(), out) is out
    reused = torch.empty(n, dtype=torch.complex64, device="cuda")  # the temporary's block
    reused.fill_(7.0)
    consumer.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(out), expect)


@pytest.mark.multigpu
def test_gpu_device_to_device_across_devices_is_ordered_after_the_producer(cp, torch):
    """A strided source on another device is read on the copy's stream, after
    the producer's work (not packed on an unordered stream of its device)."""
    src = torch.zeros(2048, 2048, device="cuda:1")
    with cp.cuda.Device(0):
        out = cp.zeros((2048, 1024), cp.float32)
    side = torch.cuda.Stream(device=1)
    with torch.cuda.device(1), torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        src.fill_(3.0)
        assert interop.copy_to_device(src[:, ::2], out) is out
    with cp.cuda.Device(0):
        assert float(out.sum()) == 3.0 * out.size


@pytest.mark.gpu
def test_gpu_waiting_threads_sleep_instead_of_spinning(torch):
    """Blocking-sync events: host threads waiting on a long kernel cost little
    CPU time (spinning threads would cost their wall time each)."""
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
    a = np.arange(300_000, dtype=">f4").reshape(600, 500)
    for got in (
        interop.copy_to_device(a, chunk_bytes=1 << 16),
        interop.to_cupy(a),
        interop.to_torch(a, device="cuda"),
    ):
        assert str(got.dtype) in ("float32", "torch.float32")
        np.testing.assert_array_equal(interop.to_numpy(got), a)


@pytest.mark.gpu
def test_gpu_stream_order_without_explicit_sync(torch):
    side = torch.cuda.Stream()
    x = torch.zeros(1 << 22, device="cuda")
    side.wait_stream(torch.cuda.current_stream())  # the zeros first
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        x.fill_(7.0)
        out = interop.copy_to_host(x, chunk_bytes=1 << 20)
    assert (out == 7.0).all()


@pytest.mark.gpu
def test_gpu_transfers_of_tensors_under_cupys_per_thread_default_stream():
    """CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1: CuPy would name the per-thread
    default stream to PyTorch's __dlpack__, which refuses it; the pipeline
    orders its copy stream itself and gets the values after the producer."""
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


@pytest.mark.gpu
def test_gpu_cancel_frees_the_ring_and_stays_usable(cp):
    a = cp.arange(1 << 22, dtype=cp.float32)
    holder = {}
    started = threading.Event()

    def progress(done, total):
        started.wait(30)  # the first chunk's callback cancels, never after the last one
        holder["t"].cancel()

    out = np.zeros(a.shape, np.float32)
    transfer = interop.copy_to_host_async(a, out, chunk_bytes=1 << 16, progress=progress)
    holder["t"] = transfer
    started.set()
    with pytest.raises(interop.TransferError) as info:
        transfer.result(timeout=60)
    n = info.value.bytes_done // 4
    np.testing.assert_array_equal(out[:n], cp.asnumpy(a[:n]))
    # the failed transfer's ring was freed, not cached
    assert all(not r.closed for v in _ring_cache.values() for r in v)
    cached = cached_rings()
    np.testing.assert_array_equal(interop.copy_to_host(a, chunk_bytes=1 << 16), cp.asnumpy(a))
    assert cached_rings() >= cached


@pytest.mark.gpu
def test_gpu_error_in_a_worker_releases_and_stays_usable(cp):
    a = cp.arange(1 << 20, dtype=cp.float32).reshape(1024, 1024).T  # packed on the device
    pool = cp.get_default_memory_pool()
    cp.cuda.Device().synchronize()
    before = pool.used_bytes()

    def progress(done, total):
        raise ZeroDivisionError

    with pytest.raises(interop.TransferError) as info:
        interop.copy_to_host(a, chunk_bytes=1 << 16, progress=progress)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert pool.used_bytes() == before  # device staging released, though the error lives
    np.testing.assert_array_equal(interop.copy_to_host(a, chunk_bytes=1 << 16), cp.asnumpy(a))


@pytest.mark.gpu
@pytest.mark.parametrize("fails", [False, True], ids=["completes", "fails"])
def test_gpu_device_staging_is_freed_while_frames_of_the_schedule_live_on(cp, fails):
    """The staging block goes back to CuPy's pool when the transfer ends, even
    while something else keeps the schedule's frames (and their views of the
    rows) alive: here a profiler that holds every frame. Under
    compute-sanitizer such frames were seen to outlive the call, held by
    something unidentified, and the block stayed in use (256 KiB)."""
    a = cp.arange(1 << 20, dtype=cp.float32).reshape(1024, 1024).T  # packed on the device
    expect = cp.asnumpy(a)
    pool = cp.get_default_memory_pool()
    gc.collect()  # earlier tests' garbage, which the profiler's allocations could collect
    cp.cuda.Device().synchronize()
    before = pool.used_bytes()
    frames = []

    def keep(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "device_step":
            frames.append(frame)

    def progress(done, total):
        if fails:
            raise ZeroDivisionError

    previous = threading.getprofile()
    threading.setprofile(keep)  # for the threads started from now: the transfer's
    try:
        if fails:
            with pytest.raises(interop.TransferError):
                interop.copy_to_host(a, chunk_bytes=1 << 16, progress=progress)
        else:
            out = interop.copy_to_host(a, chunk_bytes=1 << 16, progress=progress)
            np.testing.assert_array_equal(out, expect)
    finally:
        threading.setprofile(previous)
    assert any("row" in f.f_locals for f in frames)  # views of the rows outlived the call
    assert pool.used_bytes() == before
    frames.clear()
    gc.collect()
    assert pool.used_bytes() == before  # and the views going later frees nothing twice
    np.testing.assert_array_equal(interop.copy_to_host(a, chunk_bytes=1 << 16), expect)


@pytest.mark.gpu
def test_gpu_pinned_outs_and_sources_skip_the_ring(cp, torch):
    """Page-locked host memory (CuPy's pinned pool, PyTorch's pin_memory,
    cudaHostRegister) is copied to and from by the DMAs alone: no staging
    ring is borrowed, so none is cached afterwards; pageable memory is."""
    import cupyx

    from interop.pipeline.ring import free_cached_rings

    a = cp.arange(3 << 20, dtype=cp.float32).reshape(3 << 10, 1 << 10)  # 12 MiB
    expect = cp.asnumpy(a)
    free_cached_rings()
    pinned = cupyx.empty_pinned(a.shape, np.float32)
    pinned.fill(-1)
    assert interop.copy_to_host(a, pinned, chunk_bytes=1 << 20) is pinned
    np.testing.assert_array_equal(pinned, expect)
    transposed = cupyx.empty_pinned((1 << 10, 3 << 10), np.float32)
    interop.copy_to_host(a.T, transposed, chunk_bytes=1 << 20)  # packed on the device
    np.testing.assert_array_equal(transposed, expect.T)
    page_locked = torch.empty(a.shape, dtype=torch.float32, pin_memory=True)
    interop.copy_to_host(a, page_locked.numpy(), chunk_bytes=1 << 20)
    np.testing.assert_array_equal(page_locked.numpy(), expect)
    back = interop.copy_to_device(pinned, chunk_bytes=1 << 20)
    assert bool(cp.array_equal(back, a))
    into_t = torch.empty((1 << 10, 3 << 10), device="cuda").T  # unpacked on the device
    interop.copy_to_device(page_locked, into_t, chunk_bytes=1 << 20)
    assert bool((into_t.cpu() == page_locked).all())
    registered = np.zeros(a.shape, np.float32)
    runtime = cp.cuda.runtime
    runtime.hostRegister(registered.ctypes.data, registered.nbytes, 0)
    try:
        interop.copy_to_host(a, registered, chunk_bytes=1 << 20)
        np.testing.assert_array_equal(registered, expect)
    finally:
        runtime.hostUnregister(registered.ctypes.data)
    assert cached_rings() == 0  # no copy above borrowed a ring
    pageable = np.zeros(a.shape, np.float32)
    interop.copy_to_host(a, pageable, chunk_bytes=1 << 20)
    np.testing.assert_array_equal(pageable, expect)
    assert cached_rings() == 1  # the staged copy borrowed one and gave it back


@pytest.mark.gpu
def test_gpu_pinned_memory_is_recognised_by_address(cp):
    import cupyx

    from interop.pipeline.cuda import _buffer_id, cuda_backend

    backend = cuda_backend(cp.cuda.runtime.getDevice())
    pinned = cupyx.empty_pinned(1 << 16, np.uint8)
    base = pinned.ctypes.data
    assert backend.is_pinned(base, pinned.nbytes)
    assert backend.is_pinned(base + 100, 1000)
    assert not backend.is_pinned(base, 0)
    other = cupyx.empty_pinned(1 << 16, np.uint8)
    assert _buffer_id(base) == _buffer_id(base + pinned.nbytes - 1)
    assert _buffer_id(base) != _buffer_id(other.ctypes.data)
    pageable = np.ones(1 << 16, np.uint8)
    assert not backend.is_pinned(pageable.ctypes.data, pageable.nbytes)
    runtime = cp.cuda.runtime
    runtime.hostRegister(pageable.ctypes.data, pageable.nbytes, 0)
    try:  # a registration is one buffer to the driver too
        assert _buffer_id(pageable.ctypes.data) is not None
        assert backend.is_pinned(pageable.ctypes.data, pageable.nbytes)
    finally:
        runtime.hostUnregister(pageable.ctypes.data)
    assert not backend.is_pinned(pageable.ctypes.data, pageable.nbytes)


@pytest.mark.gpu
def test_gpu_an_out_pinned_only_at_its_ends_goes_through_the_ring(cp):
    """Both ends registered, the middle pageable: a DMA over the whole range
    would fail, so the copy is staged (and right)."""
    import mmap

    from interop.pipeline.ring import free_cached_rings

    page = mmap.PAGESIZE
    memory = mmap.mmap(-1, 64 * page)  # page-aligned
    out = np.frombuffer(memory, np.float32)
    a = cp.arange(out.size, dtype=cp.float32)
    runtime = cp.cuda.runtime
    base = out.ctypes.data
    runtime.hostRegister(base, page, 0)
    runtime.hostRegister(base + out.nbytes - page, page, 0)
    try:
        free_cached_rings()
        interop.copy_to_host(a, out, chunk_bytes=4 * page)
        np.testing.assert_array_equal(out, cp.asnumpy(a))
        assert cached_rings() == 1  # staged
    finally:
        runtime.hostUnregister(base)
        runtime.hostUnregister(base + out.nbytes - page)
    del out
    memory.close()


@pytest.mark.gpu
def test_gpu_a_resolved_tensor_outlives_its_direct_dma(torch):
    """A tensor with the negative bit is resolved chunk by chunk into
    temporaries from PyTorch's caching allocator; each must stay alive until
    its DMA into the pinned out has read it."""
    from interop.pipeline.ring import free_cached_rings

    t = torch.arange(1 << 22, dtype=torch.float32, device="cuda")
    out = torch.empty(1 << 22, pin_memory=True).numpy()
    free_cached_rings()
    for _ in range(3):
        out.fill(0)
        interop.copy_to_host(torch._neg_view(t), out, chunk_bytes=1 << 16)
        np.testing.assert_array_equal(out, -np.arange(1 << 22, dtype=np.float32))
    assert cached_rings() == 0


@pytest.mark.gpu
def test_gpu_a_direct_copy_waits_for_the_producer_stream(torch):
    from interop.pipeline.ring import free_cached_rings

    free_cached_rings()
    side = torch.cuda.Stream()
    x = torch.zeros(1 << 22, device="cuda")
    out = torch.empty(1 << 22, pin_memory=True).numpy()
    side.wait_stream(torch.cuda.current_stream())  # the zeros first
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        x.fill_(7.0)
        interop.copy_to_host(x, out, chunk_bytes=1 << 20)
        assert (out == 7.0).all()
        src = torch.full((1 << 22,), 5.0, pin_memory=True)
        torch.cuda._sleep(100_000_000)
        x.fill_(1.0)  # queued before the copy: the copy must land after it
        interop.copy_to_device(src, x, chunk_bytes=1 << 20)
    torch.cuda.synchronize()
    assert bool((x == 5.0).all())
    assert cached_rings() == 0  # both copies were direct


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


@pytest.mark.gpu
def test_gpu_casts_on_the_device_in_chunks(cp, torch):
    """bfloat16 tensors and float16 CuPy arrays reach the host as float32, cast
    chunk by chunk on the device: no full-size float32 temporary."""
    n = 64 << 20  # 64 Mi elements: 128 MiB of bfloat16
    t = torch.linspace(-3, 3, n, device="cuda").to(torch.bfloat16).reshape(8192, -1)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with interop.config.set(chunk_bytes=8 << 20, num_buffers=4):
        out = interop.copy_to_host(t.T, dtype=np.float32)
    peak = torch.cuda.max_memory_allocated() - base
    # chunk-sized float32 temporaries only (one per slot, and one being made),
    # never a full-size one (4 * n bytes = 256 MiB)
    assert peak <= 2 * 4 * (8 << 20)
    np.testing.assert_array_equal(out, t.T.float().cpu().numpy())
    c = cp.linspace(-3, 3, 1 << 20, dtype=cp.float16).reshape(1024, 1024)
    np.testing.assert_array_equal(
        interop.copy_to_host(c[::2, ::3], dtype=np.float32),
        cp.asnumpy(c[::2, ::3]).astype(np.float32),
    )


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
