"""What bounds the staging ring? ``python -m benchmarks.host_limit [--quick] [--json PATH]``"""

from __future__ import annotations

import itertools
import mmap
import statistics
import sys
import threading
import traceback
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from typing import Any

import numpy as np

import interop
from benchmarks import lab
from interop.bench.measure import Case, MiB, Ratio, WrongResultError, gpu_unavailable, measure
from interop.bench.rows import BenchContext, GpuArrays, RowSpec
from interop.config import chunk_bytes_or_default, config
from interop.testing import EmulatedDevice

THREADS = (1, 2, 4, 8, 16)
PAGE = mmap.PAGESIZE


def threaded_copies(
    pool: ThreadPoolExecutor,
    threads: int,
    flat: np.ndarray,
    slots: np.ndarray,
    chunk: int,
    to_flat: bool,
) -> Case:
    """Copy ``flat`` through ``slots`` by ``threads`` threads, whole chunks round-robin."""
    offsets = list(range(0, flat.nbytes, chunk))

    def part(i: int, off: int) -> tuple[np.ndarray, np.ndarray]:
        n = min(chunk, flat.nbytes - off)
        return flat[off : off + n], slots[i * chunk : i * chunk + n]

    def worker(i: int) -> None:
        for off in offsets[i::threads]:
            mine, slot = part(i, off)
            np.copyto(*((mine, slot) if to_flat else (slot, mine)))

    def check(_: Any) -> None:
        for i in range(min(threads, len(offsets))):
            if not np.array_equal(*part(i, offsets[i::threads][-1])):
                raise WrongResultError(f"thread {i} left a chunk that differs from its slot")

    return Case(lambda: list(pool.map(worker, range(threads))), flat.nbytes, check)


@contextmanager
def _busy_link(g: GpuArrays | None, to_host: bool) -> Iterator[None]:
    """While the block runs, a thread on its own stream keeps whole-array DMAs going."""
    if g is None:
        yield
        return
    runtime = g.cp.cuda.runtime
    kind = runtime.memcpyDeviceToHost if to_host else runtime.memcpyHostToDevice
    on_device = g.x.copy()  # the D2H DMAs write it into g.ref, which must keep x's values
    g.sync()  # copied before a non-blocking stream's DMA reads it
    dst, src = (g.ref.ctypes.data, on_device.data.ptr)
    if not to_host:
        dst, src = src, dst
    stop = threading.Event()

    def loop() -> None:
        with g.cp.cuda.Device(on_device.device.id):
            stream = g.cp.cuda.Stream(non_blocking=True)
            while not stop.is_set():
                runtime.memcpyAsync(dst, src, g.nbytes, kind, stream.ptr)
                stream.synchronize()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        g.sync()


def register_spans(base: int, nbytes: int, chunk: int) -> list[tuple[int, int]]:
    """``[base, base + nbytes)`` as ``(address, bytes)`` spans of ~``chunk`` meeting at pages."""
    end = base + nbytes
    cuts = {min(end, -(-(base + off) // PAGE) * PAGE) for off in range(chunk, nbytes, chunk)}
    bounds = [base, *sorted(cuts), end]
    return [(lo, hi - lo) for lo, hi in itertools.pairwise(bounds) if hi > lo]


def _registration(g: GpuArrays, nbytes: int, repeats: int) -> dict[str, float]:
    """GB/s of ``cudaHostRegister`` + unregister: whole, and by chunks from N threads."""
    runtime = g.cp.cuda.runtime
    host = np.ones(nbytes, np.uint8)  # pageable, touched
    base = host.ctypes.data
    spans = register_spans(base, nbytes, chunk_bytes_or_default(None))

    def pin(span: tuple[int, int]) -> None:
        runtime.hostRegister(*span, 0)
        runtime.hostUnregister(span[0])

    cases = {"whole": Case(lambda: pin((base, nbytes)), nbytes)}
    pools = {n: ThreadPoolExecutor(n) for n in THREADS}
    try:
        for n, pool in pools.items():
            cases[f"chunks, {n} threads"] = Case(lambda p=pool: list(p.map(pin, spans)), nbytes)
        got = measure(cases, repeats)
    finally:
        for pool in pools.values():
            pool.shutdown()
    return {label: m.gbps for label, m in got.items()}


def host_limit(ctx: BenchContext) -> dict[str, Any]:
    """The ``host_limit`` row (see the module)."""
    reason = gpu_unavailable()
    g = ctx.gpu() if reason is None else None
    repeats = max(2, ctx.sizes.repeats - 3)
    chunk = chunk_bytes_or_default(None)
    if g is None:  # a chunk for every thread at the host_copy size
        chunk = min(chunk, max(64 << 10, ctx.sizes.host_bytes // max(THREADS) >> 12 << 12))
    nbytes = max(max(THREADS), ctx.sizes.host_bytes // chunk) * chunk
    flat = np.arange(nbytes // 4, dtype=np.float32).view(np.uint8)  # pageable, touched
    sides = {"pageable->pageable": True}
    slots = np.zeros(max(THREADS) * chunk, np.uint8)
    if g is not None:
        slots_mem = g.cp.cuda.alloc_pinned_memory(max(THREADS) * chunk)
        slots = np.frombuffer(slots_mem, np.uint8, max(THREADS) * chunk)
        sides = {"pinned->pageable": True, "pageable->pinned": False}
    gbps: dict[str, dict[str, dict[str, float]]] = {side: {} for side in sides}
    got = {}
    for threads in THREADS:
        with ThreadPoolExecutor(threads, thread_name_prefix="host-limit") as pool:
            for side, to_flat in sides.items():
                case = threaded_copies(pool, threads, flat, slots, chunk, to_flat)
                for busy in ("alone", "link busy") if g is not None else ("alone",):
                    label = f"{side}, {threads} threads, {busy}"
                    with _busy_link(g if busy == "link busy" else None, to_flat):
                        got |= measure({label: case}, repeats)
                    gbps[side].setdefault(busy, {})[str(threads)] = got[label].gbps
    best = {side: {k: max(v.values()) for k, v in by.items()} for side, by in gbps.items()}
    fields: dict[str, Any] = {
        "size": f"{nbytes / MiB:.0f} MiB in chunks of {chunk / MiB:g} MiB",
        "threads": list(THREADS),
        "copies": gbps,
        "chunk_bytes": chunk,
        "samples": {label: m.record() for label, m in got.items()},
    }
    if g is None:
        one, top = gbps["pageable->pageable"]["alone"]["1"], best["pageable->pageable"]["alone"]
        return fields | {
            "gbps": top,
            "anchors": {"pageable->pageable, 1 thread GB/s": one},
            "ratios": [Ratio.between("the best thread count", "throughput", "1 thread", top, one)],
            "not_measured": "pinned copies, a busy link and pinning rates: "
            + (reason or "").split(":")[0],
        }
    return fields | {
        "registration": _registration(g, nbytes, min(repeats, 3)),
        "gbps": best["pinned->pageable"]["link busy"],
        "anchors": {f"{side} ceiling GB/s": b["link busy"] for side, b in best.items()},
        "ratios": [
            Ratio.between(
                f"{s}, link busy", "throughput", f"{s}, alone", b["link busy"], b["alone"]
            )
            for s, b in best.items()
        ],
    }


def ring_stages(g: GpuArrays, host: np.ndarray, to_host: bool, repeats: int) -> dict[str, Any]:
    """A GPU row's ring stages each alone at the current settings: ``DMA``, ``host``, bound."""
    cp, runtime = g.cp, g.cp.cuda.runtime
    chunk, count, threads = chunk_bytes_or_default(None), config.num_buffers, config.host_threads
    settings = {"chunk_bytes": chunk, "num_buffers": count, "host_threads": threads}
    try:
        ring_mem = cp.cuda.alloc_pinned_memory(chunk * count)
        ring = np.frombuffer(ring_mem, np.uint8, chunk * count)
        flat = host.reshape(-1).view(np.uint8)
        offsets = [
            (k, off, min(chunk, g.nbytes - off)) for k, off in enumerate(range(0, g.nbytes, chunk))
        ]
        kind = runtime.memcpyDeviceToHost if to_host else runtime.memcpyHostToDevice
        on_device = g.x if to_host else cp.empty_like(g.x)  # held while the cases live

        def dma() -> None:
            stream, device = cp.cuda.get_current_stream().ptr, on_device.data.ptr
            for k, off, n in offsets:
                at = ring.ctypes.data + (k % count) * chunk
                dst, src = (at, device + off) if to_host else (device + off, at)
                runtime.memcpyAsync(dst, src, n, kind, stream)

        def one_chunk(item: tuple[int, int, int]) -> None:
            k, off, n = item
            pinned, mine = ring[(k % count) * chunk :][:n], flat[off : off + n]
            np.copyto(*((mine, pinned) if to_host else (pinned, mine)))

        with ThreadPoolExecutor(threads, thread_name_prefix="bench-host") as pool:
            list(pool.map(one_chunk, offsets[:threads]))  # the threads started
            cases = {
                "DMA": Case(dma, g.nbytes),
                "host": Case(lambda: list(pool.map(one_chunk, offsets)), g.nbytes),
            }
            got = measure(cases, repeats, sync=g.sync)
    except Exception as exc:  # a diagnosis: its failure must not cost the row
        traceback.print_exc(file=sys.stderr)
        return {"settings": settings, "error": f"{type(exc).__name__}: {exc}"}
    dma_gbps, host_gbps = got["DMA"].gbps, got["host"].gbps
    return {
        "settings": settings,
        "DMA GB/s": dma_gbps,
        "host GB/s": host_gbps,
        "bound GB/s": min(dma_gbps, host_gbps),
        "samples": {label: m.record() for label, m in got.items()},
    }


def stages_and_trace(ctx: BenchContext, fields: dict[str, Any], to_host: bool) -> dict[str, Any]:
    """A pageable transfer row's diagnoses: its ring stages alone and one traced run."""
    g = ctx.gpu()
    host = np.zeros(g.ref.shape, np.float32) if to_host else np.array(g.ref)  # pageable, touched
    stages = ring_stages(g, host, to_host, ctx.sizes.repeats)
    copy = partial(interop.copy_to_host, g.x) if to_host else interop.copy_to_device
    where = lab.traced(partial(copy, host))
    ratios = list(fields["ratios"])
    if "bound GB/s" in stages:  # context: the row against the slower stage alone
        to, bound = "the slower ring stage alone", stages["bound GB/s"]
        ratios.append(Ratio.between(ratios[0].of, "throughput", to, fields["gbps"], bound))
    return fields | {"stages": stages, "trace": where, "ratios": ratios}


# ------------------------------------------------------------------ emulated_overlap

#: The emulated link's rate, GB/s (below one thread's memcpy on small machines), and the
#: pipeline's settings for the row.
LINK_GBPS = 2.0
SETTINGS = {"chunk_bytes": 8 * MiB, "num_buffers": 4, "host_threads": 2}


def overlap_seconds(
    nbytes: int,
    *,
    link_gbps: float = LINK_GBPS,
    repeats: int = 5,
    register: Any = None,
    **settings: int,
) -> dict[str, float]:
    """Median seconds of ``link``, ``host`` stage and ``copy_to_host`` on the emulated device."""
    settings = SETTINGS | settings
    chunk, threads = settings["chunk_bytes"], settings["host_threads"]
    dev = EmulatedDevice(link_gbps=link_gbps, register=register)
    host = np.random.default_rng(0).random(nbytes // 8)
    x = dev.asarray(host)
    out = np.zeros_like(host)  # touched, as d2h_prealloc's out

    def pipeline() -> np.ndarray:
        with interop.config.set(**settings):
            return interop.copy_to_host(x, out)

    def right(got: np.ndarray) -> None:
        if not np.array_equal(got, host):
            raise WrongResultError("copy_to_host through the emulated link gave wrong values")

    slots = np.ones(threads * chunk, np.uint8)
    with ThreadPoolExecutor(threads) as pool:
        cases = {
            "memcpy": Case(lambda: np.copyto(out, host), nbytes),
            "host stage": threaded_copies(
                pool, threads, out.reshape(-1).view(np.uint8), slots, chunk, True
            ),
            "copy_to_host(x, out)": Case(pipeline, nbytes, right),
        }
        seconds = {
            label: statistics.median(m.seconds) for label, m in measure(cases, repeats).items()
        }
    return {"link": max(nbytes / (link_gbps * 1e9), seconds.pop("memcpy")), **seconds}


def emulated_overlap(ctx: BenchContext) -> dict[str, Any]:
    """``copy_to_host``'s throughput over a perfect overlap's and over none's."""
    nbytes = min(ctx.sizes.host_bytes, 256 * MiB)
    s = overlap_seconds(nbytes, repeats=ctx.sizes.repeats)
    link, host, pipe = s["link"], s["host stage"], s["copy_to_host(x, out)"]
    gbps = {k: nbytes / v / 1e9 for k, v in s.items()}
    ours = "copy_to_host(x, out)"
    return {
        "size": f"{nbytes / MiB:.0f} MiB float64, emulated link {LINK_GBPS:g} GB/s",
        "settings": SETTINGS,
        "gbps": gbps[ours],
        "anchors": {f"{k} GB/s": v for k, v in gbps.items() if k != ours},
        "overlap": (link + host - pipe) / min(link, host),
        "ratios": [
            Ratio.between(ours, "throughput", to, gbps[ours], nbytes / seconds / 1e9)
            for to, seconds in (
                ("max(link, host stage)", max(link, host)),
                ("link + host stage, one after the other", link + host),
            )
        ],
    }


def d2h_hybrid(ctx: BenchContext) -> dict[str, Any]:
    """``copy_to_host(x, out)`` with the back of ``out`` registered in place (emulated:
    1 ms and 4 GB/s a registration) over the link, and over the ring alone."""
    nbytes = min(ctx.sizes.host_bytes, 256 * MiB)
    n = {"repeats": ctx.sizes.repeats, "chunk_bytes": nbytes // 32}  # 32 chunks
    ring = overlap_seconds(nbytes, **n)["copy_to_host(x, out)"]
    s = overlap_seconds(nbytes, register=(1e-3, 4.0), register_min_bytes=1, **n)
    gbps = {k: nbytes / v / 1e9 for k, v in (*s.items(), ("the ring alone", ring))}
    ours = gbps.pop("copy_to_host(x, out)")
    return {
        "size": f"{nbytes / MiB:.0f} MiB float64, emulated link {LINK_GBPS:g} GB/s",
        "gbps": ours,
        "anchors": {f"{k} GB/s": v for k, v in gbps.items()},
        "ratios": [
            Ratio.between("copy_to_host(x, out), hybrid", "throughput", to, ours, gbps[to])
            for to in ("link", "the ring alone")
        ],
    }


_HOST = "host copies by 1-16 threads, one whole chunk each, alone and with the link busy; "
_OVERLAP = "copy_to_host(x, out) through the emulated device's 2 GB/s link: the overlap of its "
HOST_LIMIT = RowSpec("host_limit", _HOST + "cudaHostRegister rates", False, host_limit)
_OVERLAP += "DMAs with its host copies, on any machine"
_HYBRID = "the same through the hybrid form (out registered in part)"
ROWS = (
    HOST_LIMIT,
    RowSpec("emulated_overlap", _OVERLAP, False, emulated_overlap),
    RowSpec("d2h_hybrid", _HYBRID, False, d2h_hybrid),
)

if __name__ == "__main__":
    sys.exit(lab.main(ROWS, __spec__.name, __doc__))
