"""Diagnoses the lab adds to the package's GPU rows: where their time goes.

- ``stages``: the ring's two stages at the current settings, each alone (DMA of
  chunks to and from a pinned ring; host threads copying chunks between the
  ring and pageable memory), and for ``d2h_prealloc`` what pinning the array
  in place would cost (``cudaHostRegister``);
- ``trace``: one more, untimed run of the row's transfer with the slot
  pipeline traced (:mod:`interop.pipeline.trace`);
- ``profile``: where one call of ``to_cupy`` / ``to_torch`` spends its time
  (:mod:`cProfile`);
- device memory: what ``d2h_strided``'s copies of transposed sources take on the
  device (:class:`DeviceGrowth`), against the ring size.

A diagnosis that fails is recorded as ``{"error": ...}``; it never costs the
row its figures.
"""

from __future__ import annotations

import cProfile
import dataclasses
import gc
import pstats
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

import interop
from interop.bench.measure import Case, measure
from interop.bench.report import format_bytes
from interop.bench.results import Ratio
from interop.bench.rows import RING, BenchContext, GpuArrays, RowSpec, ring_bytes, strided
from interop.config import chunk_bytes_or_default, config
from interop.pipeline import trace


class DeviceGrowth:
    """Peak device memory taken from CuPy's pool and PyTorch's allocator in a block.

    CuPy's pool only grows while nothing frees its blocks, so its growth is
    the peak held; PyTorch reports its peak. A raw ``cudaMalloc`` is not seen.
    """

    def __init__(self, cp: Any, th: Any) -> None:
        self._cp, self._th = cp, th
        self.extra_bytes: int | None = None

    def __enter__(self) -> DeviceGrowth:
        self._pool_before = self._cp.get_default_memory_pool().total_bytes()
        self._th.cuda.reset_peak_memory_stats()
        self._torch_before = self._th.cuda.memory_allocated()
        return self

    def __exit__(self, *exc: object) -> None:
        pool = self._cp.get_default_memory_pool().total_bytes() - self._pool_before
        torch_peak = self._th.cuda.max_memory_allocated() - self._torch_before
        self.extra_bytes = max(0, pool) + max(0, torch_peak)


def _records(got: dict[str, Any]) -> dict[str, Any]:
    return {label: m.record() for label, m in got.items()}


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


def profile_per_call(fn: Callable[[], Any], calls: int, top: int = 10) -> list[dict[str, Any]]:
    """Where one call's time goes: ``calls`` calls under :mod:`cProfile`.

    A tenth of ``calls`` runs first, unprofiled (warm-up); garbage
    collection is off while profiling, as in :mod:`timeit`. The profiler's
    own overhead inflates every figure (a short Python function the most),
    so the figures rank the costs of a call; they are not its time.

    Returns
    -------
    list of dict
        The ``top`` functions by their own time (``tottime``), largest first:
        ``function`` (``file:line(name)``, the file's last two parts),
        ``own_us`` and ``cumulative_us`` per call of ``fn``, and ``calls``,
        how many times ``fn`` called it, per call.
    """
    for _ in range(max(1, calls // 10)):  # warm-up: imports and caches are not the call's
        fn()

    def run() -> None:  # each result is dropped inside the profile (its free is the call's)
        for _ in range(calls):
            fn()

    profiler = cProfile.Profile()
    collecting = gc.isenabled()
    gc.disable()  # as timeit: a collection would be charged to whatever function it interrupts
    try:
        profiler.runcall(run)
    finally:
        if collecting:
            gc.enable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = []
    for (path, line, name), (_, ncalls, tottime, cumtime, _) in stats.items():
        if path == __file__ or "_lsprof.Profiler" in name:
            continue  # the loop that made the calls, and the profiler stopping
        where = "/".join(path.replace("\\", "/").split("/")[-2:]) if path != "~" else ""
        rows.append(
            {
                "function": f"{where}:{line}({name})" if where else name,
                "own_us": tottime / calls * 1e6,
                "cumulative_us": cumtime / calls * 1e6,
                "calls": ncalls / calls,
            }
        )
    rows.sort(key=lambda r: r["own_us"], reverse=True)
    return rows[:top]


def stages_text(stages: dict[str, Any]) -> str:
    """The DMA and host stages of a GPU row measured alone, or why they were not."""
    st = stages["settings"]
    at = (
        f"at chunk_bytes {format_bytes(st['chunk_bytes'])}, num_buffers {st['num_buffers']}, "
        f"host_threads {st['host_threads']}"
    )
    if "error" in stages:
        return f"not measured ({stages['error']}) {at}"
    text = f"DMA {stages['DMA GB/s']:.2f} GB/s, host copies {stages['host GB/s']:.2f} GB/s {at}"
    pinning = stages.get("registration")
    if pinning is None:
        return text
    if "error" in pinning:
        return f"{text}; pinning the array in place not measured ({pinning['error']})"
    return (
        f"{text}; pinning the array in place (cudaHostRegister + unregister) "
        f"{pinning['whole GB/s']:.2f} GB/s whole, {pinning['chunks GB/s']:.2f} GB/s by chunks"
    )


def trace_text(where: dict[str, Any]) -> str:
    """Where a traced run of a GPU row's transfer spent its time, or why it was not traced."""
    if "error" in where:
        return f"not traced ({where['error']})"

    def rate(gbps: float | None) -> str:
        return "-" if gbps is None else f"{gbps:.2f} GB/s"

    host = (
        f"{where['threads']} host threads {rate(where['host_gbps_per_thread'])} each "
        f"(busy {where['host_busy']:.0%})"
        if where["threads"]
        else "no host threads (DMAs straight to or from pinned memory)"
    )
    return (
        f"{rate(where['rate_gbps'])} in all; device copies {rate(where['device_gbps'])} "
        f"(busy {where['device_busy']:.0%}); {host}; "
        f"issuer waited {where['issuer_wait_seconds']:.3f} s"
        + (
            f"; the call took {where['call_seconds']:.3f} s, {where['outside_seconds']:.3f} s "
            "of it outside the transfer"
            if "call_seconds" in where
            else ""
        )
        + f": limited by {where['limited_by']}"
    )


def profile_text(top: list[dict[str, Any]], shown: int = 4) -> str:
    """The largest own times per call of a profiled call (see ``profile_per_call``)."""
    parts = [f"{entry['function']} {entry['own_us']:.1f} us" for entry in top[:shown]]
    return "; ".join(parts) + " (own time per call under cProfile, which inflates it)"


def _stages_and_trace(
    g: GpuArrays, host: np.ndarray, to_host: bool, call: Callable[[], Any], repeats: int
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    stages = stage_components(g, host, to_host, repeats)
    where = traced(call)

    def add(fields: dict[str, Any]) -> dict[str, Any]:
        ours = fields["ratios"][0].of
        ratios = [*fields["ratios"], *_stage_ratio(ours, fields["gbps"], stages)]
        return fields | {"stages": stages, "trace": where, "ratios": ratios}

    return add


def _d2h_prealloc(ctx: BenchContext) -> Callable[[dict[str, Any]], dict[str, Any]]:
    g = ctx.gpu()
    out = np.zeros(g.ref.shape, np.float32)  # pageable, touched
    return _stages_and_trace(
        g, out, True, lambda: interop.copy_to_host(g.x, out), ctx.sizes.repeats
    )


def _h2d_pageable(ctx: BenchContext) -> Callable[[dict[str, Any]], dict[str, Any]]:
    g = ctx.gpu()
    host = np.array(g.ref)  # pageable, touched
    return _stages_and_trace(
        g, host, False, lambda: interop.copy_to_device(host), ctx.sizes.repeats
    )


def _d2h_strided(ctx: BenchContext) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The trace of ``copy_to_host(x.T, out)``, and the device memory each transposed
    source's copy takes (first call after the caches were emptied), against the ring."""
    g = ctx.gpu()
    x_t, t_t, _, out = strided(g)
    where = traced(lambda: interop.copy_to_host(x_t, out))
    taken = {}
    for label, source in (("copy_to_host(x.T, out)", x_t), ("copy_to_host(t.T, out)", t_t)):
        g.release()
        with DeviceGrowth(g.cp, g.th) as growth:
            interop.copy_to_host(source, out)
            g.sync()
        taken[label] = growth.extra_bytes
    ring = ring_bytes()

    def add(fields: dict[str, Any]) -> dict[str, Any]:
        ratios = [
            Ratio.between(f"extra device memory of {label}", "memory", RING, value, ring)
            for label, value in taken.items()
        ]
        memory = fields["memory"] | {
            "extra_device_bytes": taken["copy_to_host(x.T, out)"],
            "copy_to_host(t.T) extra_device_bytes": taken["copy_to_host(t.T, out)"],
        }
        return fields | {"trace": where, "ratios": [*fields["ratios"], *ratios], "memory": memory}

    return add


def _save_npy(ctx: BenchContext) -> Callable[[dict[str, Any]], dict[str, Any]]:
    g = ctx.gpu()
    with tempfile.TemporaryDirectory(dir=ctx.workdir) as tmp:
        where = traced(lambda: interop.save_npy(g.x, Path(tmp) / "traced.npy"))
    return lambda fields: fields | {"trace": where}


def _exchange_us(ctx: BenchContext) -> Callable[[dict[str, Any]], dict[str, Any]]:
    g = ctx.gpu()
    t = g.th.arange(16, dtype=g.th.float32, device="cuda")
    c = g.cp.arange(16, dtype=g.cp.float32)
    calls = max(1, ctx.sizes.calls // 4)
    profiled = {
        "to_cupy(t)": profile_per_call(lambda: interop.to_cupy(t), calls),
        "to_torch(c)": profile_per_call(lambda: interop.to_torch(c), calls),
    }
    g.sync()
    return lambda fields: fields | {"profile": profiled}


#: The rows the lab diagnoses, and how: each makes, after the row ran, what to add to it.
DIAGNOSES: dict[str, Callable[[BenchContext], Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "d2h_prealloc": _d2h_prealloc,
    "d2h_strided": _d2h_strided,
    "h2d_pageable": _h2d_pageable,
    "exchange_us": _exchange_us,
    "save_npy": _save_npy,
}


def diagnosed(spec: RowSpec) -> RowSpec:
    """``spec`` whose run adds the row's diagnoses (:data:`DIAGNOSES`) to its fields."""
    diagnose = DIAGNOSES.get(spec.name)
    if diagnose is None:
        return spec

    def run(ctx: BenchContext) -> dict[str, Any]:
        fields = spec.run(ctx)
        try:
            return diagnose(ctx)(fields)
        except Exception as exc:  # a diagnosis: its failure must not cost the row
            traceback.print_exc(file=sys.stderr)
            return fields | {"diagnosis_error": f"{type(exc).__name__}: {exc}"}

    return dataclasses.replace(spec, run=run)
