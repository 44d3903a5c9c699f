"""The ``host_limit`` row: the ceilings of the staging ring's host side, measured alone.

A transfer through the ring is bounded by its DMA (the link) and by its host
threads copying chunks between pinned slots and the caller's pageable memory.
This row measures the second, as the pipeline does it, one whole chunk
(``chunk_bytes``) per thread at a time, each thread with its own pinned slot:

- ``copies``: pinned->pageable (the D2H side) and pageable->pinned (the H2D
  side) with 1, 2, 4, 8 and 16 threads, each alone and while a second stream
  keeps the link busy with DMAs in the same direction (the ring's real
  ceiling: the DMA and the host copies share the memory bus);
- ``registration``: ``cudaHostRegister`` + ``cudaHostUnregister`` of the
  pageable array, whole, chunk by chunk, and chunk by chunk from N threads
  (the rate at which pinning the caller's array in place could go).

On a machine without a CUDA device it measures pageable->pageable copies by
the same threads (what the host side of a ring could do there), and says why
the rest is not measured. The figure is the best D2H-side rate with the link
busy (pageable->pageable without a GPU).
"""

from __future__ import annotations

import itertools
import mmap
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np

from interop.bench.measure import Case, Measured, MiB, WrongResultError, measure
from interop.bench.results import Ratio, gpu_unavailable
from interop.bench.rows import BenchContext, GpuArrays
from interop.config import chunk_bytes_or_default

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
    """Copy ``flat`` through ``slots`` by ``threads`` threads: thread ``i`` copies chunks
    ``i``, ``i + threads``, ... whole, each between ``flat`` and its slot ``i``. The
    first call is checked: each thread's last chunk and its slot hold the same bytes."""
    offsets = list(range(0, flat.nbytes, chunk))

    def part(i: int, off: int) -> tuple[np.ndarray, np.ndarray]:
        n = min(chunk, flat.nbytes - off)
        return flat[off : off + n], slots[i * chunk : i * chunk + n]

    def worker(i: int) -> None:
        for off in offsets[i::threads]:
            mine, slot = part(i, off)
            if to_flat:
                np.copyto(mine, slot)
            else:
                np.copyto(slot, mine)

    def check(_: Any) -> None:
        for i in range(min(threads, len(offsets))):
            if not np.array_equal(*part(i, offsets[i::threads][-1])):
                raise WrongResultError(f"thread {i} left a chunk that differs from its slot")

    return Case(lambda: list(pool.map(worker, range(threads))), flat.nbytes, check)


@contextmanager
def _busy_link(g: GpuArrays | None, to_host: bool) -> Iterator[None]:
    """While the block runs, a thread on its own stream issues whole-array DMAs (device
    to pinned host for ``to_host``, else back), one after another."""
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


def _copies(ctx: BenchContext, g: GpuArrays | None, repeats: int) -> dict[str, Any]:
    """The host copies by each number of threads: per side, ``alone`` and (with a GPU)
    ``link busy``, GB/s by thread count; and the samples."""
    chunk = chunk_bytes_or_default(None)
    if g is None:  # a chunk for every thread at the host_copy size
        chunk = min(chunk, max(64 << 10, ctx.sizes.host_bytes // max(THREADS) >> 12 << 12))
    nbytes = max(max(THREADS), ctx.sizes.host_bytes // chunk) * chunk
    flat = np.arange(nbytes // 4, dtype=np.float32).view(np.uint8)  # pageable, touched
    if g is not None:
        slots_mem = g.cp.cuda.alloc_pinned_memory(max(THREADS) * chunk)
        slots = np.frombuffer(slots_mem, np.uint8, max(THREADS) * chunk)
        sides = {"pinned->pageable": True, "pageable->pinned": False}
    else:
        slots = np.zeros(max(THREADS) * chunk, np.uint8)
        sides = {"pageable->pageable": True}
    gbps: dict[str, dict[str, dict[str, float]]] = {side: {} for side in sides}
    got: dict[str, Measured] = {}
    for threads in THREADS:
        with ThreadPoolExecutor(threads, thread_name_prefix="host-limit") as pool:
            for side, to_flat in sides.items():
                case = threaded_copies(pool, threads, flat, slots, chunk, to_flat)
                for busy in ("alone", "link busy") if g is not None else ("alone",):
                    label = f"{side}, {threads} threads, {busy}"
                    with _busy_link(g if busy == "link busy" else None, to_flat):
                        got |= measure({label: case}, repeats)
                    gbps[side].setdefault(busy, {})[str(threads)] = got[label].gbps
    samples = {label: m.record() for label, m in got.items()}
    return {"bytes": nbytes, "chunk_bytes": chunk, "gbps": gbps, "samples": samples}


def register_spans(base: int, nbytes: int, chunk: int) -> list[tuple[int, int]]:
    """``[base, base + nbytes)`` as ``(address, bytes)`` spans of about ``chunk`` bytes,
    to register one by one, meeting at page boundaries: ``cudaHostRegister`` locks
    whole pages, and refuses a span sharing a page with one registered already (712)."""
    end = base + nbytes
    cuts = {min(end, -(-(base + off) // PAGE) * PAGE) for off in range(chunk, nbytes, chunk)}
    bounds = [base, *sorted(cuts), end]
    return [(lo, hi - lo) for lo, hi in itertools.pairwise(bounds) if hi > lo]


def _registration(g: GpuArrays, nbytes: int, repeats: int) -> dict[str, Any]:
    """``cudaHostRegister`` + ``cudaHostUnregister`` of a pageable array: whole, by
    chunks, and by chunks from N threads; GB/s of the array's bytes."""
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

            def chunks(pool: ThreadPoolExecutor = pool) -> None:
                list(pool.map(pin, spans))

            cases[f"chunks, {n} threads"] = Case(chunks, nbytes)
        got = measure(cases, repeats)
    finally:
        for pool in pools.values():
            pool.shutdown()
    return {label: m.gbps for label, m in got.items()}


def host_limit(ctx: BenchContext) -> dict[str, Any]:
    """The ``host_limit`` row (see the module): host copies by 1-16 threads, alone and
    with the link busy, and pinning rates; pageable copies only without a GPU."""
    reason = gpu_unavailable()
    g = ctx.gpu() if reason is None else None
    repeats = max(2, ctx.sizes.repeats - 3)
    copies = _copies(ctx, g, repeats)
    fields: dict[str, Any] = {
        "size": f"{copies['bytes'] / MiB:.0f} MiB in chunks of {copies['chunk_bytes'] / MiB:g} MiB",
        "threads": list(THREADS),
        "copies": copies["gbps"],
        "chunk_bytes": copies["chunk_bytes"],
        "samples": copies["samples"],
    }
    best = {
        side: {k: max(v.values()) for k, v in by.items()} for side, by in copies["gbps"].items()
    }
    ratios = [
        Ratio.between(
            f"{side}, link busy", "throughput", f"{side}, alone", b["link busy"], b["alone"]
        )
        for side, b in best.items()
        if "link busy" in b
    ]
    if g is None:
        one = copies["gbps"]["pageable->pageable"]["alone"]["1"]
        best_side = best["pageable->pageable"]["alone"]
        return fields | {
            "gbps": best_side,
            "anchors": {"pageable->pageable, 1 thread GB/s": one},
            "ratios": [
                Ratio.between("the best thread count", "throughput", "1 thread", best_side, one)
            ],
            "not_measured": "pinned copies, a busy link and pinning rates: "
            + (reason or "").split(":")[0],
        }
    fields["registration"] = _registration(g, copies["bytes"], min(repeats, 3))
    return fields | {
        "gbps": best["pinned->pageable"]["link busy"],
        "anchors": {f"{side} ceiling GB/s": b["link busy"] for side, b in best.items()},
        "ratios": ratios,
    }
