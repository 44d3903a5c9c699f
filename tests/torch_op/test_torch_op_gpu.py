"""``interop.torch_op`` on the GPU (CuPy path): zero-copy hand-overs, PyTorch's
current stream, CUDA graphs, PyTorch's pool, ``torch.compile(mode=
"reduce-overhead")`` (skipped without a device)."""

from __future__ import annotations

import itertools

import pytest

import interop

pytestmark = pytest.mark.gpu

_COUNTER = itertools.count()


def name(what: str) -> str:
    """A process-unique operator name."""
    return f"interop_gpu_test::{what}_{next(_COUNTER)}"


def affine_op():
    """``a * x + b`` in two CuPy kernels, with a temporary between them."""

    @interop.torch_op(name("affine"), like=0)
    def affine(x, a: float = 2.0, b: float = 1.0):
        xp = interop.array_namespace(x)
        tmp = xp.multiply(x, x.dtype.type(a))
        return xp.add(tmp, x.dtype.type(b))

    return affine


def test_gpu_values_and_zero_copy(cp, torch):
    seen = {}

    @interop.torch_op(name("twice"), like=0)
    def twice(x):
        seen["type"] = type(x)
        seen["ptr"] = int(x.data.ptr)
        out = x * 2
        seen["out"] = int(out.data.ptr)
        return out

    x = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    y = twice(x)
    assert seen["type"] is cp.ndarray
    assert seen["ptr"] == x.data_ptr()
    assert y.data_ptr() == seen["out"]  # the returned array itself
    assert y.device == x.device
    assert torch.equal(y, x * 2)
    if hasattr(torch._C, "_has_Standard_Deleter"):  # PyTorch's own storage, not a DLPack one
        assert torch._C._has_Standard_Deleter(y.untyped_storage()._cdata)


def test_gpu_the_op_runs_on_pytorch_s_current_stream(cp, torch):
    op = affine_op()
    x = torch.zeros(1 << 22, device="cuda")
    op(x)  # CuPy compiles its kernels now, not behind the sleep
    torch.cuda.synchronize()
    cupy_before = cp.cuda.get_current_stream()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(500_000_000)  # s is busy for a while ...
        x.fill_(3.0)  # ... then writes x
        y = op(x)  # must read x after the write: on s
        busy = not s.query()  # the call queued its kernels, it did not wait for them
        z = y + 1  # PyTorch's next kernel on s reads the output
    s.synchronize()
    assert busy
    assert bool(torch.all(y == 7.0))
    assert bool(torch.all(z == 8.0))
    assert cp.cuda.get_current_stream() == cupy_before  # CuPy's stream given back


def test_gpu_cuda_graph_capture_and_replay(cp, torch):
    op = affine_op()
    static_x = torch.zeros(1 << 20, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up on a side stream, as PyTorch's docs do
        for _ in range(2):
            op(static_x, 3.0, 0.5)
    torch.cuda.current_stream().wait_stream(s)
    pool = cp.get_default_memory_pool()
    used = pool.used_bytes()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = op(static_x, 3.0, 0.5)
        static_z = static_y * 2  # a PyTorch kernel after it, captured too
    assert pool.used_bytes() == used
    for k in range(3):
        static_x.fill_(float(k))
        g.replay()
        assert bool(torch.all(static_y == 3.0 * k + 0.5)), k
        assert bool(torch.all(static_z == 2 * (3.0 * k + 0.5))), k


def test_gpu_cupy_allocates_from_pytorch_s_pool_during_the_call_only(cp, torch):
    pool = cp.get_default_memory_pool()
    seen = {}

    @interop.torch_op(name("pools"), like=0)
    def pools(x):
        tmp = x * 2  # a temporary
        seen["cupy"] = pool.used_bytes()
        seen["torch"] = torch.cuda.memory_allocated()
        return tmp + 1

    x = torch.randn(1 << 20, device="cuda")
    pools(x)
    torch.cuda.synchronize()
    used, total = pool.used_bytes(), pool.total_bytes()
    before = torch.cuda.memory_allocated()
    y = pools(x)
    assert seen["cupy"] == used  # nothing from CuPy's pool while the function ran ...
    assert seen["torch"] - before >= x.nbytes  # ... the temporary came from PyTorch's
    assert (pool.used_bytes(), pool.total_bytes()) == (used, total)
    grown = torch.cuda.memory_allocated() - before
    assert y.nbytes <= grown < 2 * y.nbytes  # the output stays, the temporary went back
    a = cp.ones(1 << 20, dtype=cp.float32)  # after the call: CuPy's own pool again
    assert pool.used_bytes() >= used + a.nbytes
    del a


def fft_abs_op(cp):
    """``|fft(x)|`` of a real ``x``: CuPy plans (and caches) a cuFFT plan for its length."""

    @interop.torch_op(name("fft_abs"), like=0)
    def fft_abs(x):
        return cp.abs(cp.fft.fft(x)).astype(x.dtype)

    return fft_abs


def cached_plans(cp, n):
    """The cuFFT plans CuPy's cache (this thread, the current device) holds for length ``n``."""
    return [node.plan for key, node in cp.fft.config.get_plan_cache() if key[0] == n]


def test_gpu_a_cufft_plan_made_in_a_call_is_cached_from_cupys_own_pool(cp, torch):
    """CUDA only (PyTorch's and CuPy's pools, cuFFT): the plan CuPy caches while the
    op runs outlives the call, so its work area comes from CuPy's own pool; nothing
    of the call stays in PyTorch's pool once its output is gone."""
    n = 3 * 5 * 7 * 61  # a length no other test plans
    op = fft_abs_op(cp)
    x = torch.randn(n, device="cuda")
    expect = torch.fft.fft(x).abs()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    y = op(x)
    assert torch.allclose(y, expect, rtol=1e-4, atol=1e-3)
    [plan] = cached_plans(cp, n)
    assert type(plan.work_area.mem).__name__ == "PooledMemory"  # CuPy's pool, not PyTorch's
    del y
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
    assert torch.allclose(op(x), expect, rtol=1e-4, atol=1e-3)
    assert cached_plans(cp, n) == [plan]  # found again: not planned anew


def test_gpu_torch_compile_reduce_overhead(cp, torch):
    from torch._dynamo.utils import counters

    op = affine_op()

    def model(x):
        return torch.relu(op(x * 2, 0.5, -0.25)).sum(dim=-1)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    for _ in range(4):  # warm-up, recording, then replays
        x = torch.randn(64, 256, device="cuda")
        got = compiled(x).clone()  # a replay overwrites the previous output
        assert torch.allclose(got, model(x), atol=1e-5)
    assert counters["inductor"]["cudagraph_skips"] == 0  # it did run as a CUDA graph


def test_gpu_gradcheck_and_opcheck(cp, torch):
    @interop.torch_op(name("cube_backward"), like=0)
    def cube_backward(grad, x):
        return 3 * x * x * grad

    @interop.torch_op(name("cube"), like=0)
    def cube(x):
        return x * x * x

    def setup_context(ctx, inputs, output):
        (ctx.x,) = inputs

    cube.register_autograd(
        lambda ctx, grad: cube_backward(grad, ctx.x), setup_context=setup_context
    )
    x = torch.randn(6, dtype=torch.float64, device="cuda", requires_grad=True)
    assert torch.autograd.gradcheck(cube, (x,))
    torch.library.opcheck(cube, (x,))

    @interop.torch_op(name("identity"), like=0)
    def identity(x):
        return x

    t = torch.arange(4.0, device="cuda")
    assert identity(t).data_ptr() != t.data_ptr()
    torch.library.opcheck(identity, (t,))
    torch.library.opcheck(affine_op(), (t.reshape(2, 2).T, 1.5))


def test_gpu_bfloat16(cp, torch):
    from interop import _backends

    if not _backends.cupy_supports_bfloat16():
        pytest.skip("this CuPy has no bfloat16 arrays")

    @interop.torch_op(name("halve"), like=0)
    def halve(x):
        return (x.astype(cp.float32) / 2).astype(x.dtype)

    x = torch.tensor([1.0, -3.0, 0.5], dtype=torch.bfloat16, device="cuda")
    y = halve(x)
    assert y.dtype == torch.bfloat16
    assert y.float().tolist() == [0.5, -1.5, 0.25]


def test_gpu_errors(cp, torch):
    op = affine_op()

    @interop.torch_op(name("add"), like=0)
    def add(x, y):
        return x + y

    with pytest.raises(ValueError, match=r"one device \(got 'x' on cuda:0, 'y' on cpu\)"):
        add(torch.ones(3, device="cuda"), torch.ones(3))

    @interop.torch_op(name("host"), like=0)
    def host(x):
        return cp.asnumpy(x)

    with pytest.raises(ValueError, match=r"a CuPy array on cuda:0 \(got a NumPy array\)"):
        host(torch.ones(3, device="cuda"))

    @interop.torch_op(name("other_stream"), like=0)
    def other_stream(x):
        with cp.cuda.Stream(non_blocking=True):
            return x * 2

    with pytest.raises(interop.StreamMismatchError, match="do not switch CuPy's device"):
        other_stream(torch.ones(3, device="cuda"))
    assert op(torch.ones(2, device="cuda")).tolist() == [3.0, 3.0]  # nothing left behind


def test_gpu_a_mutated_argument_with_a_math_bit_or_expanded_is_refused(cp, torch):
    calls = []

    @interop.torch_op(name("copy_into"), mutates_args=("out",))
    def copy_into(x, out) -> None:
        calls.append(1)
        out[...] = x

    z = torch.tensor([1 + 2j, 3 - 4j], device="cuda")
    for out in (z.conj(), z.conj().imag):
        with pytest.raises(interop.CopyRequiredError, match="parameter 'out', which it writes"):
            copy_into(torch.ones_like(out), out)
    base = torch.zeros(1, 2, device="cuda")
    with pytest.raises(interop.InvalidValueError, match=r"strides \(0, 1\): an expanded view"):
        copy_into(torch.arange(6.0, device="cuda").reshape(3, 2), base.expand(3, 2))
    assert calls == []
    assert z.tolist() == [1 + 2j, 3 - 4j]  # nothing written
    assert base.tolist() == [[0.0, 0.0]]
    out = torch.zeros(2, dtype=z.dtype, device="cuda")
    copy_into(z.conj(), out)  # read, not written: resolved into a copy
    assert out.tolist() == [1 - 2j, 3 + 4j]
