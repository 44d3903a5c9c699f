"""GPU rows: they run where both CuPy and PyTorch see a CUDA device.

Each works on the run's shared float32 arrays (:class:`~interop.bench.context.GpuArrays`:
CuPy ``x``, torch ``t`` with the same values, and a pinned host copy ``ref``)
and returns its measured fields like the host rows do. ``anchors`` holds the
GB/s of every call that is not interop's, the link's limit included.
"""

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
from ..measure import Case, GiB, Measured, WrongResultError, expect_equal, measure_per_call
from ..results import Ratio

RING = "the ring size (num_buffers x chunk_bytes)"


def ring_bytes() -> int:
    """The staging ring at the current settings (the 64 KiB chunk floor applied)."""
    return config.num_buffers * chunk_bytes_or_default(None)


def _ratio(got: dict[str, Measured], of: str, to: str) -> Ratio:
    return Ratio.between(of, "throughput", to, got[of].gbps, got[to].gbps)


def _fields(g: GpuArrays, got: dict[str, Measured], ours: str, **more: Any) -> dict[str, Any]:
    """A row's fields: ``ours``'s GB/s, the others' as anchors (those not starting like
    ``ours``: interop's variants), ``ours``'s memory, every sample, and ``more``."""
    mine = ours.split("(")[0]
    return {
        "size": f"{g.nbytes / GiB:.2f} GiB float32",
        "gbps": got[ours].gbps,
        "anchors": {f"{k} GB/s": m.gbps for k, m in got.items() if not k.startswith(mine)},
        "memory": {
            "extra_device_bytes": got[ours].extra_device_bytes,
            "extra_host_rss_bytes": got[ours].extra_host_bytes,
        },
        "samples": {label: m.record() for label, m in got.items()},
    } | more


def _limit(ctx: BenchContext, case: str) -> dict[str, Any]:
    g = ctx.gpu()
    dst = g.cp.empty_like(g.x)
    cases = {"cudaMemcpyAsync": g.d2h_limit_case() if case == "d2h" else g.h2d_limit_case(dst)}
    got = g.measure(cases, ctx.sizes.repeats)
    if case == "h2d" and not bool(g.cp.array_equal(dst, g.x)):
        raise WrongResultError("the pinned-to-device cudaMemcpyAsync returned wrong data")
    return _fields(g, got, "cudaMemcpyAsync", anchors={})


def d2h_limit(ctx: BenchContext) -> dict[str, Any]:
    """One ``cudaMemcpyAsync`` of the whole array into pinned memory: the link's limit."""
    return _limit(ctx, "d2h")


def h2d_limit(ctx: BenchContext) -> dict[str, Any]:
    """One ``cudaMemcpyAsync`` of the whole array from pinned memory: the link's limit."""
    return _limit(ctx, "h2d")


def d2h_prealloc_cases(g: GpuArrays, out: np.ndarray, every: int = 1) -> dict[str, Case]:
    """``d2h_limit`` and ``copy_to_host(x, out)`` into ``out`` (pageable, touched): the pair
    ``d2h_prealloc`` and the sweep time. Every ``every``-th element of ``out`` is poisoned
    before the first call and checked after it (the sweep checks every point, sampling
    with a prime stride so that every chunk is seen)."""

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
        "copy_to_host(t, out)": Case(
            lambda: interop.copy_to_host(g.t, out),
            g.nbytes,
            expect_equal(g.ref, "copy_to_host(t, out)"),
            lambda: out.fill(np.nan),
        ),
        "cupy.asnumpy(x, out=out)": Case(lambda: g.cp.asnumpy(g.x, out=out), g.nbytes),
        "t.to('cpu', non_blocking=True)+sync": Case(
            lambda: g.t.to("cpu", non_blocking=True), g.nbytes
        ),
    }
    got = g.measure(cases, ctx.sizes.repeats)
    fields = _fields(
        g,
        got,
        "copy_to_host(x, out)",
        variants={"copy_to_host(t, out) GB/s": got["copy_to_host(t, out)"].gbps},
        ratios=[_ratio(got, label, "d2h_limit") for label in got if label != "d2h_limit"],
    )
    fields["memory"]["ring_bytes"] = ring_bytes()
    return fields


def d2h_pinned(ctx: BenchContext) -> dict[str, Any]:
    """``copy_to_host(x, out)`` into ``interop.empty_pinned`` memory, against the link."""
    g = ctx.gpu()
    out = interop.empty_pinned(g.ref.shape, np.float32)
    out.fill(np.nan)  # touched, poisoned
    check = expect_equal(g.ref, "copy_to_host(x, out=pinned)")
    cases = {
        "d2h_limit": g.d2h_limit_case(),
        "copy_to_host(x, out=pinned)": Case(
            lambda: interop.copy_to_host(g.x, out), g.nbytes, check
        ),
        "cupy.asnumpy(x, out=pinned)": Case(lambda: g.cp.asnumpy(g.x, out=out), g.nbytes),
    }
    got = g.measure(cases, ctx.sizes.repeats)
    ratios = [_ratio(got, label, "d2h_limit") for label in got if label != "d2h_limit"]
    return _fields(g, got, "copy_to_host(x, out=pinned)", ratios=ratios)


def d2h_fresh(ctx: BenchContext) -> dict[str, Any]:
    """``copy_to_host(x)`` allocating ``out``, against ``cupy.asnumpy`` and ``t.cpu().numpy()``."""
    g = ctx.gpu()
    check = expect_equal(g.ref, "copy_to_host(x)")
    cases = {
        "d2h_limit": g.d2h_limit_case(),
        "copy_to_host(x)": Case(lambda: interop.copy_to_host(g.x), g.nbytes, check),
        "cupy.asnumpy(x)": Case(lambda: g.cp.asnumpy(g.x), g.nbytes),
        "t.cpu().numpy()": Case(lambda: g.t.cpu().numpy(), g.nbytes),
    }
    got = g.measure(cases, ctx.sizes.repeats)
    to = ("cupy.asnumpy(x)", "t.cpu().numpy()", "d2h_limit")
    fields = _fields(
        g, got, "copy_to_host(x)", ratios=[_ratio(got, "copy_to_host(x)", t) for t in to]
    )
    fields["memory"] |= {"out_bytes": g.nbytes, "ring_bytes": ring_bytes()}
    return fields


def d2h_strided(ctx: BenchContext) -> dict[str, Any]:
    """A transposed source (CuPy and torch), against the contiguous copy of the same bytes."""
    g = ctx.gpu()
    side = math.isqrt(g.nbytes // 4)
    n = side * side
    square = g.x[:n].reshape(side, side).T  # a transposed view, no copy
    square_t = g.t[:n].view(side, side).T  # the same values, a torch source
    reference = g.ref[:n].reshape(side, side).T
    contiguous = g.x[:n].reshape(side, side)
    out = np.full((side, side), np.nan, np.float32)
    cases = {
        "copy_to_host(x.T, out)": Case(
            lambda: interop.copy_to_host(square, out),
            n * 4,
            expect_equal(reference, "copy_to_host(x.T)"),
        ),
        "copy_to_host(t.T, out)": Case(
            lambda: interop.copy_to_host(square_t, out),
            n * 4,
            expect_equal(reference, "copy_to_host(t.T)"),
            lambda: out.fill(np.nan),
        ),
        "copy_to_host(x, out)": Case(lambda: interop.copy_to_host(contiguous, out), n * 4),
        "cupy.asnumpy(x.T, out=out)": Case(lambda: g.cp.asnumpy(square, out=out), n * 4),
    }
    got = g.measure(cases, ctx.sizes.repeats)
    ring = ring_bytes()
    ratios = [_ratio(got, f"copy_to_host({s}.T, out)", "copy_to_host(x, out)") for s in "xt"]
    ratios += [
        Ratio.between(
            f"extra device memory of copy_to_host({s}.T, out)",
            "memory",
            RING,
            got[f"copy_to_host({s}.T, out)"].extra_device_bytes,
            ring,
        )
        for s in "xt"
    ]
    fields = _fields(g, got, "copy_to_host(x.T, out)", ratios=ratios)
    fields["anchors"] = {
        "copy_to_host(x, out) GB/s (d2h_prealloc)": got["copy_to_host(x, out)"].gbps,
        "cupy.asnumpy(x.T, out=out) GB/s": got["cupy.asnumpy(x.T, out=out)"].gbps,
    }
    fields["memory"] |= {
        "copy_to_host(t.T) extra_device_bytes": got["copy_to_host(t.T, out)"].extra_device_bytes,
        "ring_bytes": ring,
        "cupy.asnumpy(x.T) extra_device_bytes": got[
            "cupy.asnumpy(x.T, out=out)"
        ].extra_device_bytes,
    }
    return fields | {
        "size": f"{side}x{side} float32, transposed",
        "variants": {"copy_to_host(t.T, out) GB/s": got["copy_to_host(t.T, out)"].gbps},
    }


def _on_device(g: GpuArrays) -> Any:
    """A :class:`Case` check: the device array returned equals ``g.x``."""

    def check(result: Any) -> None:
        if not bool(g.cp.array_equal(result, g.x)):
            raise WrongResultError("copy_to_device returned data that differs from the source")

    return check


def h2d_pageable_cases(g: GpuArrays, host: np.ndarray) -> dict[str, Case]:
    """``h2d_limit`` and ``copy_to_device(host)`` from ``host`` (pageable, touched): the
    pair ``h2d_pageable`` and the sweep time."""
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
    got = g.measure(cases, ctx.sizes.repeats)
    ours, ring = got["copy_to_device(host)"], ring_bytes()
    ratios = [_ratio(got, label, "h2d_limit") for label in got if label != "h2d_limit"]
    ratios += [
        Ratio.between(
            "extra host RSS of copy_to_device(host)", "memory", RING, ours.extra_host_bytes, ring
        ),
        _ratio(got, "copy_to_device(host)", "cupy.asarray(host)"),
    ]
    fields = _fields(g, got, "copy_to_device(host)", ratios=ratios)
    fields["memory"] |= {
        "ring_bytes": ring,
        "cupy.asarray(host) extra_host_rss_bytes": got["cupy.asarray(host)"].extra_host_bytes,
    }
    return fields | {
        "variants": {"copy_to_device(host, out) GB/s": got["copy_to_device(host, out)"].gbps}
    }


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
    got = g.measure(cases, ctx.sizes.repeats)
    ratios = [_ratio(got, label, "h2d_limit") for label in got if label != "h2d_limit"]
    return _fields(g, got, "copy_to_device(pinned)", ratios=ratios)


def exchange_us(ctx: BenchContext) -> dict[str, Any]:
    """``to_cupy(t)`` / ``to_torch(c)`` per call, against the libraries' ``from_dlpack``."""
    g = ctx.gpu()
    cp, th = g.cp, g.th
    t = th.arange(16, dtype=th.float32, device="cuda")
    c = cp.arange(16, dtype=cp.float32)
    if not bool(cp.array_equal(interop.to_cupy(t), c)) or not th.equal(interop.to_torch(c), t):
        raise WrongResultError("to_cupy / to_torch returned wrong data")
    pairs = {"to_cupy(t)": "cupy.from_dlpack(t)", "to_torch(c)": "torch.from_dlpack(c)"}
    cases = {
        "to_cupy(t)": lambda: interop.to_cupy(t),
        "cupy.from_dlpack(t)": lambda: cp.from_dlpack(t),
        "to_torch(c)": lambda: interop.to_torch(c),
        "torch.from_dlpack(c)": lambda: th.from_dlpack(c),
    }
    got = measure_per_call(cases, ctx.sizes.calls, ctx.sizes.repeats)
    g.sync()
    us = {label: m.us for label, m in got.items()}
    return {
        "size": "16 float32",
        "us": {ours: us[ours] for ours in pairs},
        "anchors": {f"{anchor} us": us[anchor] for anchor in pairs.values()},
        "ratios": [Ratio.between(o, "time", a, us[o], us[a]) for o, a in pairs.items()],
        "samples": {label: m.record() for label, m in got.items()},
    }


def save_npy(ctx: BenchContext) -> dict[str, Any]:
    """``save_npy(x, path)`` against the link's limit and a plain file write of the same bytes."""
    g = ctx.gpu()
    host = np.array(g.ref)  # pageable, the same bytes
    with tempfile.TemporaryDirectory(dir=ctx.workdir) as tmp:
        path, plain = Path(tmp) / "bench.npy", Path(tmp) / "plain.bin"

        def write_plain() -> None:
            with open(plain, "wb") as f:
                f.write(host.data)

        def saved(result: Any) -> None:
            if not np.array_equal(np.load(path, mmap_mode="r"), g.ref):
                raise WrongResultError("save_npy wrote a file that differs from the source")

        cases = {
            "d2h_limit": g.d2h_limit_case(),
            "file write": Case(write_plain, g.nbytes),
            # the replaced file is freed in the background: not while the anchors run
            "save_npy(x, path)": Case(
                lambda: interop.save_npy(g.x, path), g.nbytes, saved, settle=wait_for_replaced_files
            ),
        }
        got = g.measure(cases, ctx.sizes.repeats)
    limit = min(got["d2h_limit"].gbps, got["file write"].gbps)
    ratio = Ratio.between(
        "save_npy(x, path)",
        "throughput",
        "min(d2h_limit, sequential file write)",
        got["save_npy(x, path)"].gbps,
        limit,
    )
    fields = _fields(g, got, "save_npy(x, path)", ratios=[ratio], directory=str(ctx.workdir))
    fields["anchors"] = {
        "sequential file write GB/s": got["file write"].gbps,
        "d2h_limit GB/s": got["d2h_limit"].gbps,
    }
    fields["memory"]["ring_bytes"] = ring_bytes()
    return fields
