"""GPU rows: they run where both CuPy and PyTorch see a CUDA device.

Each works on the run's shared float32 arrays (:class:`~interop.bench.context.GpuArrays`:
CuPy ``x``, torch ``t`` with the same values, and a pinned host copy ``ref``)
and returns its measured fields like the host rows do.
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ...config import chunk_bytes_or_default, config
from ...destination import wait_for_replaced_files
from ...pipeline import trace
from ..context import BenchContext, GpuArrays
from ..measure import (
    Case,
    Measured,
    WrongResultError,
    expect_equal,
    measure,
    measure_per_call,
    profile_per_call,
)
from ..ratios import Ratio
from ..sizes import GiB
from .api import api

__all__ = [
    "d2h_fresh",
    "d2h_limit",
    "d2h_prealloc",
    "d2h_prealloc_cases",
    "d2h_strided",
    "exchange_us",
    "h2d_limit",
    "h2d_pageable",
    "h2d_pageable_cases",
    "save_npy",
]

RING = "the ring size (num_buffers x chunk_bytes)"


def _size(g: GpuArrays) -> str:
    return f"{g.nbytes / GiB:.2f} GiB float32"


def _records(got: dict[str, Measured]) -> dict[str, Any]:
    return {label: m.record() for label, m in got.items()}


def _ring() -> int:
    return config.num_buffers * chunk_bytes_or_default(None)  # the 64 KiB floor applied


def stage_components(g: GpuArrays, host: np.ndarray, to_host: bool, repeats: int) -> dict[str, Any]:
    """The ring's two stages at the current settings, each alone: what bounds the pipeline.

    ``DMA``: the whole array as ``chunk_bytes`` copies on one stream between
    the device and a ring of ``num_buffers`` pinned slots (slot after slot,
    no host work). ``host``: ``host_threads`` threads copying the same chunks
    between the slots and ``host`` (pageable), no DMA. The pipeline overlaps
    the two, so its throughput is at most the smaller; far below it, the
    overlap (waiting on events, handing slots over) is what limits it. The
    pinned ring and the threads are made before anything is timed.

    Returns
    -------
    dict
        ``settings``, ``"DMA GB/s"``, ``"host GB/s"``, ``"bound GB/s"`` (the
        smaller) and ``samples``; or ``error`` where measuring failed (the
        row keeps its other figures).
    """
    cp = g.cp
    chunk, count, threads = chunk_bytes_or_default(None), config.num_buffers, config.host_threads
    settings = {"chunk_bytes": chunk, "num_buffers": count, "host_threads": threads}
    try:
        ring_mem = cp.cuda.alloc_pinned_memory(chunk * count)
        ring = np.frombuffer(ring_mem, np.uint8, chunk * count)
        flat = host.reshape(-1).view(np.uint8)
        offsets = [
            (k, off, min(chunk, g.nbytes - off)) for k, off in enumerate(range(0, g.nbytes, chunk))
        ]
        runtime = cp.cuda.runtime
        kind = runtime.memcpyDeviceToHost if to_host else runtime.memcpyHostToDevice
        on_device = g.x if to_host else cp.empty_like(g.x)  # held while the cases live
        slot = ring.ctypes.data

        def dma() -> None:
            stream, device = cp.cuda.get_current_stream().ptr, on_device.data.ptr
            for k, off, n in offsets:
                at = slot + (k % count) * chunk
                dst, src = (at, device + off) if to_host else (device + off, at)
                runtime.memcpyAsync(dst, src, n, kind, stream)

        def one_chunk(item: tuple[int, int, int]) -> None:
            k, off, n = item
            pinned = ring[(k % count) * chunk :][:n]
            if to_host:
                np.copyto(flat[off : off + n], pinned)
            else:
                np.copyto(pinned, flat[off : off + n])

        with ThreadPoolExecutor(threads, thread_name_prefix="bench-host") as pool:
            list(pool.map(one_chunk, offsets[:threads]))  # the threads started

            def drain() -> None:
                list(pool.map(one_chunk, offsets))

            got = measure(
                {"DMA": Case(dma, g.nbytes), "host": Case(drain, g.nbytes)}, repeats, sync=g.sync
            )
    except Exception as exc:  # a diagnosis: its failure must not cost the row
        traceback.print_exc(file=sys.stderr)
        return {"settings": settings, "error": f"{type(exc).__name__}: {exc}"}
    return {
        "settings": settings,
        "DMA GB/s": got["DMA"].gbps,
        "host GB/s": got["host"].gbps,
        "bound GB/s": min(got["DMA"].gbps, got["host"].gbps),
        "samples": _records(got),
        # pinning out in place, measured once (h2d would pin the same kind of memory)
        **({"registration": host_registration(g, host, min(repeats, 3))} if to_host else {}),
    }


def host_registration(g: GpuArrays, host: np.ndarray, repeats: int) -> dict[str, Any]:
    """What pinning ``host`` in place would cost: ``cudaHostRegister`` and
    ``cudaHostUnregister`` of the pageable array, whole and chunk by chunk.

    Not used by the pipeline: a diagnosis of whether a copy that pins the
    caller's array for its duration (a DMA straight into it, no staging
    and no host copy) could beat the staging ring, which needs the register
    and unregister rate above the link's.

    Returns
    -------
    dict
        ``"whole GB/s"`` and ``"chunks GB/s"`` (register then unregister, the
        array's bytes over the time), and ``samples``; or ``error``.
    """
    runtime = g.cp.cuda.runtime
    chunk = chunk_bytes_or_default(None)
    base, nbytes = host.ctypes.data, host.nbytes

    def whole() -> None:
        runtime.hostRegister(base, nbytes, 0)
        runtime.hostUnregister(base)

    def chunks() -> None:
        for off in range(0, nbytes, chunk):
            runtime.hostRegister(base + off, min(chunk, nbytes - off), 0)
            runtime.hostUnregister(base + off)

    try:
        got = measure({"whole": Case(whole, nbytes), "chunks": Case(chunks, nbytes)}, repeats)
    except Exception as exc:  # a diagnosis: its failure must not cost the row
        traceback.print_exc(file=sys.stderr)
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {
        "whole GB/s": got["whole"].gbps,
        "chunks GB/s": got["chunks"].gbps,
        "samples": _records(got),
    }


def traced(call: Callable[[], Any]) -> dict[str, Any]:
    """One more, untimed run of ``call`` with the slot pipeline traced: where its time went.

    The call's own wall time is kept beside the transfer's, so time spent
    outside the pipeline (a file's creation and rename) shows.

    Returns
    -------
    dict
        The run's :meth:`~interop.pipeline.trace.SlotTrace.summary` (rates and
        busy fractions of the device copies and the host threads, and the side
        that was busy); or ``error`` where tracing failed or no slot transfer
        ran (the row keeps its other figures).
    """
    try:
        with trace.recording() as traces:
            start = time.perf_counter()
            call()
            seconds = time.perf_counter() - start
    except Exception as exc:  # a diagnosis: its failure must not cost the row
        traceback.print_exc(file=sys.stderr)
        return {"error": f"{type(exc).__name__}: {exc}"}
    if len(traces) != 1:
        return {"error": f"expected one slot transfer to trace (got {len(traces)})"}
    return traces[0].summary(call_seconds=seconds)


def _stage_ratio(label: str, gbps: float, stages: dict[str, Any]) -> list[Ratio]:
    """``label`` against the slower of its two stages measured alone (context, no target)."""
    if "bound GB/s" not in stages:
        return []
    return [
        Ratio.between(
            label, "throughput", "the slower ring stage alone", gbps, stages["bound GB/s"]
        )
    ]


def d2h_limit(ctx: BenchContext) -> dict[str, Any]:
    """One ``cudaMemcpyAsync`` of the whole array into pinned memory: the link's limit."""
    g = ctx.gpu()
    got = g.measure({"cudaMemcpyAsync": g.d2h_limit_case()}, ctx.sizes.repeats)
    return {"size": _size(g), "gbps": got["cudaMemcpyAsync"].gbps, "samples": _records(got)}


def d2h_prealloc_cases(g: GpuArrays, out: np.ndarray, every: int = 1) -> dict[str, Case]:
    """``copy_to_host(x, out)`` into ``out`` (pageable, touched) and ``d2h_limit``.

    The measured pair of ``d2h_prealloc``, also what the sweep times. Before
    the first call every ``every``-th element of ``out`` is poisoned and
    after it checked (``every=1``: all of them; the sweep, which checks at
    every point, samples with a prime stride so that every chunk is seen).
    """
    copy_to_host = api("copy_to_host")

    def poison() -> None:
        out[::every] = np.nan

    def check(result: Any) -> None:
        if not np.array_equal(result[::every], g.ref[::every]):
            raise WrongResultError("copy_to_host(x, out) returned data that differs from x")

    return {
        "d2h_limit": g.d2h_limit_case(),
        "copy_to_host(x, out)": Case(lambda: copy_to_host(g.x, out), g.nbytes, check, poison),
    }


def d2h_prealloc(ctx: BenchContext) -> dict[str, Any]:
    """``copy_to_host(x, out)``, ``out`` pageable and touched, against the link's limit."""
    g = ctx.gpu()
    cp = g.cp
    copy_to_host = api("copy_to_host")
    out = np.full(g.ref.shape, np.nan, np.float32)  # pageable, touched, poisoned
    pinned = np.frombuffer(cp.cuda.alloc_pinned_memory(g.nbytes), np.float32, g.ref.size)
    cases = d2h_prealloc_cases(g, out)
    cases |= {
        "copy_to_host(x, out=pinned)": Case(
            lambda: copy_to_host(g.x, pinned),
            g.nbytes,
            expect_equal(g.ref, "copy_to_host(x, out=pinned)"),
            lambda: pinned.fill(np.nan),
        ),
        "copy_to_host(t, out)": Case(
            lambda: copy_to_host(g.t, out),
            g.nbytes,
            expect_equal(g.ref, "copy_to_host(t, out)"),
            lambda: out.fill(np.nan),
        ),
        "cupy.asnumpy(x, out=out)": Case(lambda: cp.asnumpy(g.x, out=out), g.nbytes),
        "cupy.asnumpy(x, out=pinned)": Case(lambda: cp.asnumpy(g.x, out=g.ref), g.nbytes),
        "t.to('cpu', non_blocking=True)+sync": Case(
            lambda: g.t.to("cpu", non_blocking=True), g.nbytes
        ),
    }
    got = g.measure(cases, ctx.sizes.repeats)
    ours, limit = got["copy_to_host(x, out)"], got["d2h_limit"].gbps
    stages = stage_components(g, out, True, ctx.sizes.repeats)
    ratios = [
        Ratio.between(
            "copy_to_host(x, out)", "throughput", "d2h_limit", ours.gbps, limit, at_least=0.90
        )
    ]
    ratios += [
        Ratio.between(label, "throughput", "d2h_limit", m.gbps, limit)
        for label, m in got.items()
        if label not in ("d2h_limit", "copy_to_host(x, out)")
    ]
    ratios += _stage_ratio("copy_to_host(x, out)", ours.gbps, stages)
    return {
        "size": _size(g),
        "gbps": ours.gbps,
        "stages": stages,
        "trace": traced(lambda: copy_to_host(g.x, out)),
        "variants": {
            "copy_to_host(t, out) GB/s": got["copy_to_host(t, out)"].gbps,
            "copy_to_host(x, out=pinned) GB/s": got["copy_to_host(x, out=pinned)"].gbps,
        },
        "anchors": {
            f"{label} GB/s": m.gbps
            for label, m in got.items()
            if not label.startswith(("copy_to_host", "d2h_limit"))
        }
        | {"d2h_limit GB/s": limit},
        "ratios": ratios,
        "memory": {
            "extra_device_bytes": ours.extra_device_bytes,
            "extra_host_rss_bytes": ours.extra_host_bytes,
            "ring_bytes": _ring(),
        },
        "samples": _records(got),
    }


def d2h_fresh(ctx: BenchContext) -> dict[str, Any]:
    """``copy_to_host(x)`` allocating ``out``, against ``cupy.asnumpy`` and ``t.cpu().numpy()``."""
    g = ctx.gpu()
    cp = g.cp
    copy_to_host = api("copy_to_host")
    cases = {
        "d2h_limit": g.d2h_limit_case(),
        "copy_to_host(x)": Case(
            lambda: copy_to_host(g.x), g.nbytes, expect_equal(g.ref, "copy_to_host(x)")
        ),
        "cupy.asnumpy(x)": Case(lambda: cp.asnumpy(g.x), g.nbytes),
        "t.cpu().numpy()": Case(lambda: g.t.cpu().numpy(), g.nbytes),
    }
    got = g.measure(cases, ctx.sizes.repeats)
    ours = got["copy_to_host(x)"].gbps
    asnumpy, tcpu, limit = (
        got[k].gbps for k in ("cupy.asnumpy(x)", "t.cpu().numpy()", "d2h_limit")
    )
    return {
        "size": _size(g),
        "gbps": ours,
        "anchors": {
            "cupy.asnumpy(x) GB/s": asnumpy,
            "t.cpu().numpy() GB/s": tcpu,
            "d2h_limit GB/s": limit,
        },
        "ratios": [
            Ratio.between(
                "copy_to_host(x)", "throughput", "cupy.asnumpy(x)", ours, asnumpy, at_least=2.0
            ),
            Ratio.between(
                "copy_to_host(x)", "throughput", "t.cpu().numpy()", ours, tcpu, at_least=2.0
            ),
            Ratio.between("copy_to_host(x)", "throughput", "d2h_limit", ours, limit),
        ],
        "memory": {
            "extra_device_bytes": got["copy_to_host(x)"].extra_device_bytes,
            "extra_host_rss_bytes": got["copy_to_host(x)"].extra_host_bytes,
            "out_bytes": g.nbytes,
            "ring_bytes": _ring(),
        },
        "samples": _records(got),
    }


def d2h_strided(ctx: BenchContext) -> dict[str, Any]:
    """A transposed source (CuPy and torch), against the contiguous copy of the same bytes."""
    g = ctx.gpu()
    cp = g.cp
    copy_to_host = api("copy_to_host")
    side = math.isqrt(g.nbytes // 4)
    square = g.x[: side * side].reshape(side, side).T  # a transposed view, no copy
    reference = g.ref[: side * side].reshape(side, side).T
    out = np.full((side, side), np.nan, np.float32)
    contiguous = g.x[: side * side].reshape(side, side)
    square_t = g.t[: side * side].view(side, side).T  # the same values, a torch source
    nbytes = side * side * 4
    cases = {
        "copy_to_host(x.T, out)": Case(
            lambda: copy_to_host(square, out), nbytes, expect_equal(reference, "copy_to_host(x.T)")
        ),
        "copy_to_host(t.T, out)": Case(
            lambda: copy_to_host(square_t, out),
            nbytes,
            expect_equal(reference, "copy_to_host(t.T)"),
            lambda: out.fill(np.nan),
        ),
        "copy_to_host(x, out)": Case(lambda: copy_to_host(contiguous, out), nbytes),
        "cupy.asnumpy(x.T, out=out)": Case(lambda: cp.asnumpy(square, out=out), nbytes),
    }
    got = g.measure(cases, ctx.sizes.repeats)
    ours, of_torch = got["copy_to_host(x.T, out)"], got["copy_to_host(t.T, out)"]
    prealloc = got["copy_to_host(x, out)"].gbps
    ring = _ring()
    # The target holds for both kinds of source.
    ratios = [
        Ratio.between(
            "copy_to_host(x.T, out)",
            "throughput",
            "copy_to_host(x, out)",
            ours.gbps,
            prealloc,
            at_least=0.80,
        ),
        Ratio.between(
            "copy_to_host(t.T, out)",
            "throughput",
            "copy_to_host(x, out)",
            of_torch.gbps,
            prealloc,
            at_least=0.80,
        ),
        Ratio.between(
            "extra device memory of copy_to_host(x.T, out)",
            "memory",
            RING,
            ours.extra_device_bytes,
            ring,
            at_most=1.0,
        ),
        Ratio.between(
            "extra device memory of copy_to_host(t.T, out)",
            "memory",
            RING,
            of_torch.extra_device_bytes,
            ring,
            at_most=1.0,
        ),
    ]
    return {
        "size": f"{side}x{side} float32, transposed",
        "gbps": ours.gbps,
        "trace": traced(lambda: copy_to_host(square, out)),
        "variants": {"copy_to_host(t.T, out) GB/s": of_torch.gbps},
        "anchors": {
            "copy_to_host(x, out) GB/s (d2h_prealloc)": prealloc,
            "cupy.asnumpy(x.T, out=out) GB/s": got["cupy.asnumpy(x.T, out=out)"].gbps,
        },
        "ratios": ratios,
        "memory": {
            "extra_device_bytes": ours.extra_device_bytes,
            "copy_to_host(t.T) extra_device_bytes": of_torch.extra_device_bytes,
            "ring_bytes": ring,
            "cupy.asnumpy(x.T) extra_device_bytes": got[
                "cupy.asnumpy(x.T, out=out)"
            ].extra_device_bytes,
            "extra_host_rss_bytes": ours.extra_host_bytes,
        },
        "samples": _records(got),
    }


def h2d_limit(ctx: BenchContext) -> dict[str, Any]:
    """One ``cudaMemcpyAsync`` of the whole array from pinned memory: the link's limit."""
    g = ctx.gpu()
    dst = g.cp.empty_like(g.x)
    got = g.measure({"cudaMemcpyAsync": g.h2d_limit_case(dst)}, ctx.sizes.repeats)
    if not bool(g.cp.array_equal(dst, g.x)):
        raise WrongResultError("the pinned-to-device cudaMemcpyAsync returned wrong data")
    return {"size": _size(g), "gbps": got["cudaMemcpyAsync"].gbps, "samples": _records(got)}


def h2d_pageable_cases(g: GpuArrays, host: np.ndarray) -> dict[str, Case]:
    """``copy_to_device(host)`` from ``host`` (pageable, touched) and ``h2d_limit``.

    The measured pair of ``h2d_pageable``, also what the sweep times.
    """
    cp = g.cp
    copy_to_device = api("copy_to_device")
    dst = cp.empty_like(g.x)

    def on_device(result: Any) -> None:
        if not bool(cp.array_equal(result, g.x)):
            raise WrongResultError("copy_to_device returned data that differs from the source")

    return {
        "h2d_limit": g.h2d_limit_case(dst),
        "copy_to_device(host)": Case(lambda: copy_to_device(host), g.nbytes, on_device),
    }


def h2d_pageable(ctx: BenchContext) -> dict[str, Any]:
    """``copy_to_device(host)`` from pageable memory, against the link and ``cupy.asarray``."""
    g = ctx.gpu()
    cp, th = g.cp, g.th
    copy_to_device = api("copy_to_device")
    host = np.array(g.ref)  # pageable, touched
    out = cp.full_like(g.x, cp.nan)  # poisoned

    def on_device(result: Any) -> None:
        if not bool(cp.array_equal(result, g.x)):
            raise WrongResultError("copy_to_device returned data that differs from the source")

    cases = h2d_pageable_cases(g, host) | {
        "copy_to_device(host, out)": Case(lambda: copy_to_device(host, out), g.nbytes, on_device),
        "copy_to_device(pinned)": Case(lambda: copy_to_device(g.ref), g.nbytes, on_device),
        "cupy.asarray(host)": Case(lambda: cp.asarray(host), g.nbytes),
        "torch.from_numpy(host).cuda()": Case(lambda: th.from_numpy(host).cuda(), g.nbytes),
    }
    got = g.measure(cases, ctx.sizes.repeats)
    ours, limit = got["copy_to_device(host)"], got["h2d_limit"].gbps
    ring = _ring()
    with_out = got["copy_to_device(host, out)"].gbps
    stages = stage_components(g, host, False, ctx.sizes.repeats)
    return {
        "size": _size(g),
        "gbps": ours.gbps,
        "stages": stages,
        "trace": traced(lambda: copy_to_device(host)),
        "variants": {
            "copy_to_device(host, out) GB/s": with_out,
            "copy_to_device(pinned) GB/s": got["copy_to_device(pinned)"].gbps,
        },
        "anchors": {
            f"{label} GB/s": m.gbps
            for label, m in got.items()
            if not label.startswith(("copy_to_device", "h2d_limit"))
        }
        | {"h2d_limit GB/s": limit},
        "ratios": [
            Ratio.between(
                "copy_to_device(host)", "throughput", "h2d_limit", ours.gbps, limit, at_least=0.90
            ),
            Ratio.between(
                "extra host RSS of copy_to_device(host)",
                "memory",
                RING,
                ours.extra_host_bytes,
                ring,
                at_most=1.0,
            ),
            Ratio.between("copy_to_device(host, out)", "throughput", "h2d_limit", with_out, limit),
            Ratio.between(
                "copy_to_device(pinned)",
                "throughput",
                "h2d_limit",
                got["copy_to_device(pinned)"].gbps,
                limit,
            ),
            Ratio.between(
                "copy_to_device(host)",
                "throughput",
                "cupy.asarray(host)",
                ours.gbps,
                got["cupy.asarray(host)"].gbps,
            ),
            *_stage_ratio("copy_to_device(host)", ours.gbps, stages),
        ],
        "memory": {
            "extra_host_rss_bytes": ours.extra_host_bytes,
            "ring_bytes": ring,
            "cupy.asarray(host) extra_host_rss_bytes": got["cupy.asarray(host)"].extra_host_bytes,
            "extra_device_bytes": ours.extra_device_bytes,
        },
        "samples": _records(got),
    }


def exchange_us(ctx: BenchContext) -> dict[str, Any]:
    """``to_cupy(t)`` / ``to_torch(c)`` per call, against the libraries' ``from_dlpack``."""
    g = ctx.gpu()
    cp, th = g.cp, g.th
    to_cupy, to_torch = api("to_cupy"), api("to_torch")
    t = th.arange(16, dtype=th.float32, device="cuda")
    c = cp.arange(16, dtype=cp.float32)
    if not bool(cp.array_equal(to_cupy(t), c)) or not bool(th.equal(to_torch(c), t)):
        raise WrongResultError("to_cupy / to_torch returned wrong data")
    cases = {
        "to_cupy(t)": lambda: to_cupy(t),
        "cupy.from_dlpack(t)": lambda: cp.from_dlpack(t),
        "to_torch(c)": lambda: to_torch(c),
        "torch.from_dlpack(c)": lambda: th.from_dlpack(c),
    }
    got = measure_per_call(cases, ctx.sizes.calls, ctx.sizes.repeats)
    profiled = {
        label: profile_per_call(cases[label], max(1, ctx.sizes.calls // 4))
        for label in ("to_cupy(t)", "to_torch(c)")
    }
    g.sync()
    us = {label: m.us for label, m in got.items()}
    return {
        "size": "16 float32",
        "us": {"to_cupy(t)": us["to_cupy(t)"], "to_torch(c)": us["to_torch(c)"]},
        "anchors": {
            "cupy.from_dlpack(t) us": us["cupy.from_dlpack(t)"],
            "torch.from_dlpack(c) us": us["torch.from_dlpack(c)"],
        },
        "ratios": [
            Ratio.between(
                "to_cupy(t)",
                "time",
                "cupy.from_dlpack(t)",
                us["to_cupy(t)"],
                us["cupy.from_dlpack(t)"],
                at_most=1.5,
            ),
            Ratio.between(
                "to_torch(c)",
                "time",
                "torch.from_dlpack(c)",
                us["to_torch(c)"],
                us["torch.from_dlpack(c)"],
                at_most=1.5,
            ),
        ],
        "profile": profiled,
        "samples": _records(got),
    }


def save_npy(ctx: BenchContext) -> dict[str, Any]:
    """``save_npy(x, path)`` against the link's limit and a plain file write of the same bytes."""
    g = ctx.gpu()
    save = api("save_npy")
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
                lambda: save(g.x, path), g.nbytes, saved, settle=wait_for_replaced_files
            ),
        }
        got = g.measure(cases, ctx.sizes.repeats)
        where = traced(lambda: save(g.x, path))
    ours = got["save_npy(x, path)"]
    limit = min(got["d2h_limit"].gbps, got["file write"].gbps)
    return {
        "size": _size(g),
        "gbps": ours.gbps,
        "trace": where,
        "anchors": {
            "sequential file write GB/s": got["file write"].gbps,
            "d2h_limit GB/s": got["d2h_limit"].gbps,
        },
        "ratios": [
            Ratio.between(
                "save_npy(x, path)",
                "throughput",
                "min(d2h_limit, sequential file write)",
                ours.gbps,
                limit,
                at_least=0.80,
            ),
        ],
        "memory": {
            "extra_host_rss_bytes": ours.extra_host_bytes,
            "extra_device_bytes": ours.extra_device_bytes,
            "ring_bytes": _ring(),
        },
        "directory": str(ctx.workdir),
        "samples": _records(got),
    }
