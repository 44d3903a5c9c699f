"""GPU rows: they run where both CuPy and PyTorch see a CUDA device, on the run's shared
float32 arrays (:class:`~interop.bench.context.GpuArrays`). ``anchors`` holds the GB/s of
every call that is not interop's, the link's limit included; ``variants`` interop's other
forms of the call."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import interop

from ...config import chunk_bytes_or_default, config
from ...destination import wait_for_replaced_files
from ..context import BenchContext, GpuArrays
from ..measure import Case, GiB, WrongResultError, expect_equal, measure
from ..results import Ratio
from .host import per_call_row, records

RING = "the ring size (num_buffers x chunk_bytes)"


def ring_bytes() -> int:
    """The staging ring at the current settings (the 64 KiB chunk floor applied)."""
    return config.num_buffers * chunk_bytes_or_default(None)


def _row(
    ctx: BenchContext, cases: dict[str, Case], ours: str, to: tuple[str, ...], **more: Any
) -> dict[str, Any]:
    """Measure ``cases``: ``ours``'s GB/s; the throughput of every case but ``to[0]`` over
    ``to[0]``'s, then ``ours``'s over each of ``to[1:]``; interop's other calls (named
    like ``ours``) as ``variants``, the rest as ``anchors``; ``ours``'s host memory."""
    g = ctx.gpu()
    got = measure(cases, ctx.sizes.repeats, sync=g.sync, release=g.release)
    gbps = {k: m.gbps for k, m in got.items()}
    mine = ours.split("(")[0]
    ratios = [Ratio.between(k, "throughput", to[0], v, gbps[to[0]]) for k, v in gbps.items()]
    ratios += [Ratio.between(ours, "throughput", k, gbps[ours], gbps[k]) for k in to[1:]]
    return {
        "size": f"{g.nbytes / GiB:.2f} GiB float32",
        "gbps": gbps[ours],
        "variants": {f"{k} GB/s": v for k, v in gbps.items() if k.startswith(mine) and k != ours},
        "anchors": {f"{k} GB/s": v for k, v in gbps.items() if not k.startswith(mine)},
        "ratios": [r for r in ratios if r.of != r.to],
        "memory": {"extra_host_rss_bytes": got[ours].extra_host_bytes, "ring_bytes": ring_bytes()},
        "samples": records(got),
    } | more


def _poisoned(g: GpuArrays, fn: Any, out: Any, what: str, ref: Any = None) -> Case:
    """``fn()`` into ``out``, poisoned before the first call, checked equal to ``ref``."""
    check = expect_equal(g.ref if ref is None else ref, what)
    return Case(fn, out.nbytes, check, lambda: out.fill(np.nan))


def _on_device(g: GpuArrays) -> Any:
    """A :class:`Case` check: the device array returned equals ``g.x``."""

    def check(result: Any) -> None:
        if not bool(g.cp.array_equal(result, g.x)):
            raise WrongResultError("copy_to_device returned data that differs from the source")

    return check


def d2h_limit(ctx: BenchContext) -> dict[str, Any]:
    """One ``cudaMemcpyAsync`` of the whole array into pinned memory: the link's limit."""
    return _row(ctx, {"d2h_limit": ctx.gpu().d2h_limit_case()}, "d2h_limit", ("d2h_limit",))


def h2d_limit(ctx: BenchContext) -> dict[str, Any]:
    """One ``cudaMemcpyAsync`` of the whole array from pinned memory: the link's limit."""
    g = ctx.gpu()
    dst = g.cp.empty_like(g.x)
    fields = _row(ctx, {"h2d_limit": g.h2d_limit_case(dst)}, "h2d_limit", ("h2d_limit",))
    if not bool(g.cp.array_equal(dst, g.x)):
        raise WrongResultError("the pinned-to-device cudaMemcpyAsync returned wrong data")
    return fields


def d2h_prealloc_cases(g: GpuArrays, out: np.ndarray, every: int = 1) -> dict[str, Case]:
    """``d2h_limit`` and ``copy_to_host(x, out)`` into ``out`` (pageable, touched), also what
    the sweep times; every ``every``-th element of ``out`` is poisoned before the first call
    and checked after it (the sweep samples with a prime stride, seeing every chunk)."""

    def poison() -> None:
        out[::every] = np.nan

    def check(result: Any) -> None:
        if not np.array_equal(result[::every], g.ref[::every]):
            raise WrongResultError("copy_to_host(x, out) returned data that differs from x")

    ours = Case(lambda: interop.copy_to_host(g.x, out), g.nbytes, check, poison)
    return {"d2h_limit": g.d2h_limit_case(), "copy_to_host(x, out)": ours}


def d2h_prealloc(ctx: BenchContext) -> dict[str, Any]:
    """``copy_to_host(x, out)``, ``out`` pageable and touched, against the link's limit."""
    g = ctx.gpu()
    out = np.full(g.ref.shape, np.nan, np.float32)  # pageable, touched, poisoned
    cases = d2h_prealloc_cases(g, out) | {
        "copy_to_host(t, out)": _poisoned(
            g, lambda: interop.copy_to_host(g.t, out), out, "copy_to_host(t, out)"
        ),
        "cupy.asnumpy(x, out=out)": Case(lambda: g.cp.asnumpy(g.x, out=out), g.nbytes),
        "t.to('cpu', non_blocking=True)+sync": Case(
            lambda: g.t.to("cpu", non_blocking=True), g.nbytes
        ),
    }
    return _row(ctx, cases, "copy_to_host(x, out)", ("d2h_limit",))


def d2h_pinned(ctx: BenchContext) -> dict[str, Any]:
    """``copy_to_host(x, out)`` into ``interop.empty_pinned`` memory, against the link."""
    g = ctx.gpu()
    out = interop.empty_pinned(g.ref.shape, np.float32)
    cases = {
        "d2h_limit": g.d2h_limit_case(),
        "copy_to_host(x, out=pinned)": _poisoned(
            g, lambda: interop.copy_to_host(g.x, out), out, "copy_to_host(x, out=pinned)"
        ),
        "cupy.asnumpy(x, out=pinned)": Case(lambda: g.cp.asnumpy(g.x, out=out), g.nbytes),
    }
    return _row(ctx, cases, "copy_to_host(x, out=pinned)", ("d2h_limit",))


def d2h_fresh(ctx: BenchContext) -> dict[str, Any]:
    """``copy_to_host(x)`` allocating ``out``, against ``cupy.asnumpy`` and ``t.cpu().numpy()``."""
    g = ctx.gpu()
    cases = {
        "d2h_limit": g.d2h_limit_case(),
        "copy_to_host(x)": Case(
            lambda: interop.copy_to_host(g.x), g.nbytes, expect_equal(g.ref, "copy_to_host(x)")
        ),
        "cupy.asnumpy(x)": Case(lambda: g.cp.asnumpy(g.x), g.nbytes),
        "t.cpu().numpy()": Case(lambda: g.t.cpu().numpy(), g.nbytes),
    }
    to = ("d2h_limit", "cupy.asnumpy(x)", "t.cpu().numpy()")
    return _row(ctx, cases, "copy_to_host(x)", to)


def strided(g: GpuArrays) -> tuple[Any, Any, np.ndarray, np.ndarray]:
    """The square's transposed views (CuPy ``x.T``, torch ``t.T``), ``x.T``'s values on the
    host, and a pageable ``out`` for them."""
    side = math.isqrt(g.nbytes // 4)
    n = side * side
    out = np.full((side, side), np.nan, np.float32)
    square = (g.x[:n].reshape(side, side), g.t[:n].view(side, side), g.ref[:n].reshape(side, side))
    return square[0].T, square[1].T, square[2].T, out


def d2h_strided(ctx: BenchContext) -> dict[str, Any]:
    """A transposed source (CuPy and torch), against the contiguous copy of the same bytes."""
    g = ctx.gpu()
    x_t, t_t, reference, out = strided(g)
    contiguous = g.x[: out.size].reshape(out.shape)
    cases = {
        "copy_to_host(x, out)": Case(lambda: interop.copy_to_host(contiguous, out), out.nbytes),
        "copy_to_host(x.T, out)": _poisoned(
            g, lambda: interop.copy_to_host(x_t, out), out, "copy_to_host(x.T)", reference
        ),
        "copy_to_host(t.T, out)": _poisoned(
            g, lambda: interop.copy_to_host(t_t, out), out, "copy_to_host(t.T)", reference
        ),
        "cupy.asnumpy(x.T, out=out)": Case(lambda: g.cp.asnumpy(x_t, out=out), out.nbytes),
    }
    fields = _row(ctx, cases, "copy_to_host(x.T, out)", ("copy_to_host(x, out)",))
    return fields | {"size": f"{out.shape[0]}x{out.shape[1]} float32, transposed"}


def h2d_pageable_cases(g: GpuArrays, host: np.ndarray) -> dict[str, Case]:
    """``h2d_limit`` and ``copy_to_device(host)`` from ``host`` (pageable, touched), also
    what the sweep times."""
    ours = Case(lambda: interop.copy_to_device(host), g.nbytes, _on_device(g))
    return {"h2d_limit": g.h2d_limit_case(g.cp.empty_like(g.x)), "copy_to_device(host)": ours}


def h2d_pageable(ctx: BenchContext) -> dict[str, Any]:
    """``copy_to_device(host)`` from pageable memory, against the link and ``cupy.asarray``."""
    g = ctx.gpu()
    host = np.array(g.ref)  # pageable, touched
    out = g.cp.full_like(g.x, g.cp.nan)  # poisoned
    cases = h2d_pageable_cases(g, host) | {
        "copy_to_device(host, out)": Case(
            lambda: interop.copy_to_device(host, out), g.nbytes, _on_device(g)
        ),
        "cupy.asarray(host)": Case(lambda: g.cp.asarray(host), g.nbytes),
        "torch.from_numpy(host).cuda()": Case(lambda: g.th.from_numpy(host).cuda(), g.nbytes),
    }
    fields = _row(ctx, cases, "copy_to_device(host)", ("h2d_limit", "cupy.asarray(host)"))
    extra = fields["memory"]["extra_host_rss_bytes"]
    of = "extra host RSS of copy_to_device(host)"
    fields["ratios"].append(Ratio.between(of, "memory", RING, extra, ring_bytes()))
    return fields


def h2d_pinned(ctx: BenchContext) -> dict[str, Any]:
    """``copy_to_device(host)`` from ``interop.empty_pinned`` memory, against the link."""
    g = ctx.gpu()
    host = interop.empty_pinned(g.ref.shape, np.float32)
    np.copyto(host, g.ref)
    cases = {
        "h2d_limit": g.h2d_limit_case(g.cp.empty_like(g.x)),
        "copy_to_device(pinned)": Case(
            lambda: interop.copy_to_device(host), g.nbytes, _on_device(g)
        ),
        "cupy.asarray(pinned)": Case(lambda: g.cp.asarray(host), g.nbytes),
    }
    return _row(ctx, cases, "copy_to_device(pinned)", ("h2d_limit",))


def exchange_us(ctx: BenchContext) -> dict[str, Any]:
    """``to_cupy(t)`` / ``to_torch(c)`` per call, against the libraries' ``from_dlpack``."""
    g = ctx.gpu()
    cp, th = g.cp, g.th
    t = th.arange(16, dtype=th.float32, device="cuda")
    c = cp.arange(16, dtype=cp.float32)
    if not bool(cp.array_equal(interop.to_cupy(t), c)) or not th.equal(interop.to_torch(c), t):
        raise WrongResultError("to_cupy / to_torch returned wrong data")
    calls = {
        "to_cupy(t)": lambda: interop.to_cupy(t),
        "cupy.from_dlpack(t)": lambda: cp.from_dlpack(t),
        "to_torch(c)": lambda: interop.to_torch(c),
        "torch.from_dlpack(c)": lambda: th.from_dlpack(c),
    }
    pairs = {"to_cupy(t)": "cupy.from_dlpack(t)", "to_torch(c)": "torch.from_dlpack(c)"}
    fields = per_call_row(ctx, pairs, calls)
    g.sync()
    return fields


def save_npy(ctx: BenchContext) -> dict[str, Any]:
    """``save_npy(x, path)`` against the link's limit and a plain file write of the same bytes."""
    g = ctx.gpu()
    host = np.array(g.ref)  # pageable, the same bytes
    with tempfile.TemporaryDirectory(dir=ctx.workdir) as tmp:
        path, plain = Path(tmp) / "bench.npy", Path(tmp) / "plain.bin"

        def saved(result: Any) -> None:
            if not np.array_equal(np.load(path, mmap_mode="r"), g.ref):
                raise WrongResultError("save_npy wrote a file that differs from the source")

        cases = {
            "d2h_limit": g.d2h_limit_case(),
            "sequential file write": Case(lambda: plain.write_bytes(host.data), g.nbytes),
            # the replaced file is freed in the background: not while the anchors run
            "save_npy(x, path)": Case(
                lambda: interop.save_npy(g.x, path), g.nbytes, saved, settle=wait_for_replaced_files
            ),
        }
        fields = _row(ctx, cases, "save_npy(x, path)", ("d2h_limit",), directory=str(ctx.workdir))
    limit = min(fields["anchors"][f"{k} GB/s"] for k in ("d2h_limit", "sequential file write"))
    to = "min(d2h_limit, sequential file write)"
    fields["ratios"].append(
        Ratio.between("save_npy(x, path)", "throughput", to, fields["gbps"], limit)
    )
    return fields
