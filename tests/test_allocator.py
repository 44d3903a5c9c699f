"""interop.use_torch_allocator: one pool for CuPy and PyTorch."""

from __future__ import annotations

import pytest

import interop

from .helpers import run_python


def test_is_a_runtime_error_and_an_interop_error():
    assert issubclass(interop.StreamMismatchError, RuntimeError)
    assert issubclass(interop.StreamMismatchError, interop.InteropError)


def test_without_a_device(torch):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    with pytest.raises(interop.NoDeviceError, match=r"torch.cuda.is_available\(\) is False"):
        interop.use_torch_allocator()


def test_without_torch():
    proc = run_python(
        """
        import sys
        sys.modules["torch"] = None
        import interop
        try:
            interop.use_torch_allocator()
        except interop.BackendUnavailableError as exc:
            print(exc)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "needs torch" in proc.stdout
    assert "torch-cupy-interop[torch]" in proc.stdout


# ----------------------------------------------------------------- GPU

GiB = 1 << 30


@pytest.mark.gpu
def test_cupy_memory_is_counted_by_torch(cp, torch):
    before = torch.cuda.memory_allocated()
    with interop.use_torch_allocator():
        a = cp.empty(256 << 20, dtype=cp.uint8)
        assert torch.cuda.memory_allocated() - before >= 256 << 20
        del a
    assert torch.cuda.memory_allocated() == before


@pytest.mark.gpu
def test_two_pools_become_one(cp, torch):
    torch.cuda.empty_cache()
    cp.get_default_memory_pool().free_all_blocks()
    with interop.use_torch_allocator():
        a = cp.ones(GiB, dtype=cp.uint8)
        assert int(a[-1]) == 1
        del a
    reserved = torch.cuda.memory_reserved()
    t = torch.empty(GiB, dtype=torch.uint8, device="cuda")
    assert torch.cuda.memory_reserved() == reserved  # reused the block CuPy freed
    del t


@pytest.mark.gpu
def test_previous_allocator_restored(cp, torch):
    previous = cp.cuda.get_allocator()
    with pytest.raises(RuntimeError, match="x"), interop.use_torch_allocator():  # noqa: PT012
        assert cp.cuda.get_allocator() is not previous
        raise RuntimeError("x")
    assert cp.cuda.get_allocator() == previous


@pytest.mark.gpu
def test_allocation_on_a_different_stream_is_refused(cp, torch):
    with interop.use_torch_allocator():
        s = cp.cuda.Stream(non_blocking=True)
        with s, pytest.raises(interop.StreamMismatchError, match=r"interop\.stream"):
            cp.empty(1024, dtype=cp.float32)
        side = torch.cuda.Stream()
        with interop.stream(side):
            ok = cp.arange(10, dtype=cp.float32)
            assert float(ok.sum()) == 45.0
