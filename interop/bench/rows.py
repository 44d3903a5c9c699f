"""The rows of ``python -m interop bench`` (:data:`ROWS`) and what they share. A row returns its
figure, ``anchors`` (what people write instead, the link's limit), interop's other forms
(``variants``), ``ratios``, ``memory`` and ``samples``."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import math
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import timeit
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

import interop

from .. import _backends
from ..config import chunk_bytes_or_default, config, host_copy_threads
from ..io.destination import wait_for_replaced_files
from ..pipeline.ring import free_cached_rings
from .measure import (
    GB,
    BenchSizes,
    Case,
    Measured,
    MiB,
    PeakRss,
    Ratio,
    WrongResultError,
    expect_equal,
    format_bytes,
    measure,
)

Fields = dict[str, Any]


class BenchContext:
    """What rows share: ``sizes``, ``workdir`` (for files), ``notes`` (for the JSON), GPU arrays."""

    def __init__(self, sizes: BenchSizes, workdir: Path) -> None:
        self.sizes, self.workdir = sizes, workdir
        self.notes: dict[str, Any] = {}
        self._gpu: GpuArrays | None = None

    def gpu(self) -> GpuArrays:
        if self._gpu is None:
            self._gpu = GpuArrays(self.sizes.gpu_bytes)
            self.notes["pinned_pages_in_rss"] = self._gpu.pinned_in_rss
        return self._gpu

    def release(self) -> None:
        """Free what a row left: garbage, pooled blocks, staging rings."""
        gc.collect()
        if self._gpu is not None:
            self._gpu.release()

    def close(self) -> None:
        """Free the GPU arrays and every cache."""
        gpu, self._gpu = self._gpu, None
        if gpu is not None:
            gpu.close()
        gc.collect()

    def noting(self, when: str, free: Callable[[], object]) -> None:
        """``free()``; a failure (a sticky CUDA error) printed and noted, the results kept."""
        try:
            free()
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            error = f"{when}: {type(exc).__name__}: {exc}"
            self.notes.setdefault("release_errors", []).append(error)


class GpuArrays:
    """The GPU rows' sources, ``nbytes`` each: CuPy ``x``, torch ``t`` (same values) and a
    pinned copy ``ref``; NoDeviceError or BackendUnavailableError without a usable device."""

    def __init__(self, nbytes: int) -> None:
        self.cp, self.th = _backends.require_cupy_device(), _backends.require_torch_cuda()
        n = nbytes // 4
        self.nbytes = n * 4
        self.x = self.cp.random.default_rng(0).random(n, dtype=self.cp.float32)
        self.t = self.th.from_dlpack(self.x).clone()  # torch's own memory
        self._pinned = self.cp.cuda.alloc_pinned_memory(self.nbytes)
        self.ref = np.frombuffer(self._pinned, np.float32, n)  # pinned, == x
        self.x.get(out=self.ref)
        self.sync()
        # Does the driver count pinned pages in RSS? If not, GPU rows' RSS is pageable only.
        with PeakRss() as rss:
            ptr = int(self.cp.cuda.runtime.hostAlloc(64 * MiB, 0))
            ctypes.memset(ptr, 1, 64 * MiB)
        self.cp.cuda.runtime.freeHost(ptr)
        self.pinned_in_rss = None if rss.extra_bytes is None else rss.extra_bytes >= 32 * MiB

    def sync(self) -> None:
        """Wait for all work on the device (every stream)."""
        self.cp.cuda.Device().synchronize()

    def limit_case(self, to_host: bool, dst: Any = None) -> Case:
        """The link's limit: one ``cudaMemcpyAsync``, ``x`` to ``ref`` or ``ref`` to ``dst``."""
        rt = self.cp.cuda.runtime
        dst = self.cp.empty_like(self.x) if dst is None and not to_host else dst
        ptrs = (
            (self.ref.ctypes.data, self.x.data.ptr)
            if to_host
            else (dst.data.ptr, self.ref.ctypes.data)
        )
        kind = rt.memcpyDeviceToHost if to_host else rt.memcpyHostToDevice
        copy = partial(rt.memcpyAsync, *ptrs, self.nbytes, kind)
        # dst held by the case: its memory must not go back to the pool while DMAs write it
        return Case(lambda: (dst, copy(self.cp.cuda.get_current_stream().ptr)), self.nbytes)

    def release(self) -> None:
        """Empty CuPy's and PyTorch's pools and interop's staging rings."""
        gc.collect()
        self.sync()
        free_cached_rings()
        self.cp.get_default_memory_pool().free_all_blocks()
        self.cp.get_default_pinned_memory_pool().free_all_blocks()
        self.th.cuda.empty_cache()
        getattr(self.th._C, "_host_emptyCache", lambda: None)()  # torch's pinned cache, if any

    def close(self) -> None:
        """Free the arrays and every cache."""
        self.sync()
        del self.x, self.t, self.ref, self._pinned
        self.release()


@dataclasses.dataclass(frozen=True)
class RowSpec:
    """A row: ``name``, ``what`` it measures, whether it needs a ``gpu``, the function that
    measures it, and ``unavailable``: why it cannot run in this installation, or None."""

    name: str
    what: str
    gpu: bool
    run: Callable[[BenchContext], Fields]
    unavailable: Callable[[], str | None] | None = None


RING = "the ring size (num_buffers x chunk_bytes)"


def ring_bytes() -> int:
    """The staging ring at the current settings (the 64 KiB chunk floor applied)."""
    return config.num_buffers * chunk_bytes_or_default(None)


def _throughput(got: dict[str, Measured], ours: str, to: tuple[str, ...]) -> Fields:
    """Fields: every case's throughput over ``to[0]``'s, ``ours``'s over each of ``to[1:]``."""
    gbps = {k: m.gbps for k, m in got.items()}
    mine = ours.split("(")[0]
    ratios = [Ratio.between(k, "throughput", to[0], v, gbps[to[0]]) for k, v in gbps.items()]
    ratios += [Ratio.between(ours, "throughput", k, gbps[ours], gbps[k]) for k in to[1:]]
    return {
        "gbps": gbps[ours],
        "variants": {f"{k} GB/s": v for k, v in gbps.items() if k.startswith(mine) and k != ours},
        "anchors": {f"{k} GB/s": v for k, v in gbps.items() if not k.startswith(mine)},
        "ratios": [r for r in ratios if r.of != r.to],
        "memory": {"extra_host_rss_bytes": got[ours].extra_host_bytes},
        "samples": {label: m.record() for label, m in got.items()},
    }


def per_call_row(ctx: BenchContext, calls: dict[str, Callable[[], Any]]) -> Fields:
    """Per-call latency of ``calls`` in pairs (ours, then its anchor returning the same data),
    timeit-style (garbage collection off), interleaved, after a tenth as many calls untimed."""
    pairs = dict(zip(list(calls)[::2], list(calls)[1::2], strict=True))
    for ours, anchor in pairs.items():
        got, want = calls[ours](), calls[anchor]()
        if got.shape != want.shape or not bool((got == want).all()):
            raise WrongResultError(f"{ours} returned data that differs from {anchor}'s")
    n, timers = ctx.sizes.calls, {label: timeit.Timer(fn) for label, fn in calls.items()}
    for timer in timers.values():
        timer.timeit(number=max(1, n // 10))
    got = {label: Measured([], calls=n, checked=label in pairs) for label in calls}
    for _ in range(ctx.sizes.repeats):
        for label, timer in timers.items():
            got[label].seconds.append(timer.timeit(number=n))
    us = {label: m.us for label, m in got.items()}
    return {
        "size": "16 float32",
        "us": {o: us[o] for o in pairs} if len(pairs) > 1 else us[next(iter(pairs))],
        "anchors": {f"{a} us": us[a] for a in pairs.values()},
        "ratios": [Ratio.between(o, "time", a, us[o], us[a]) for o, a in pairs.items()],
        "samples": {label: m.record() for label, m in got.items()},
    }


def to_numpy_us(ctx: BenchContext) -> Fields:
    t = _backends.torch().rand(16)
    return per_call_row(
        ctx,
        {"to_numpy": lambda: interop.to_numpy(t), "numpy.from_dlpack": lambda: np.from_dlpack(t)},
    )


def to_torch_us(ctx: BenchContext) -> Fields:
    th, a = _backends.torch(), np.arange(16, dtype=np.float32)
    return per_call_row(
        ctx,
        {"to_torch": lambda: interop.to_torch(a), "torch.from_dlpack": lambda: th.from_dlpack(a)},
    )


def host_copy_cases(nbytes: int) -> dict[str, Case]:
    """``copy_to_host(t, out)`` and ``numpy.copyto`` into one ``out`` (the sweep's too)."""
    t = _backends.torch().rand(nbytes // 4)
    src, out = t.numpy(), np.full(nbytes // 4, np.nan, np.float32)  # out touched, poisoned
    check = expect_equal(src, "copy_to_host")
    return {
        "copy_to_host": Case(lambda: interop.copy_to_host(t, out), src.nbytes, check),
        "numpy.copyto": Case(lambda: np.copyto(out, src), src.nbytes),
    }


def host_copy(ctx: BenchContext) -> Fields:
    cases = host_copy_cases(ctx.sizes.host_bytes)
    got = measure(cases, 3 * ctx.sizes.repeats, release=gc.collect)  # milliseconds a copy
    fields = _throughput(got, "copy_to_host", ("numpy.copyto",))
    size = {"size": f"{format_bytes(ctx.sizes.host_bytes)} float32"}
    return size | fields | {"threads": host_copy_threads()}


def _numpy_copy(t: Any) -> np.ndarray:
    return t.numpy().copy()


_SPIN = "import os\np = os.getppid()\nprint(flush=True)\nwhile os.getppid() == p: pass"


@contextlib.contextmanager
def busy_machine(processes: int) -> Iterator[None]:
    """``processes`` processes spinning (at our niceness) through the block, however it ends."""
    with contextlib.ExitStack() as stack:
        for _ in range(processes):
            cmd = [sys.executable, "-I", "-S", "-c", _SPIN]
            p = stack.enter_context(subprocess.Popen(cmd, stdout=subprocess.PIPE))
            stack.callback(p.kill)  # before Popen's exit, which closes the pipe and waits
            if not (p.stdout and p.stdout.read(1)):
                raise RuntimeError("expected a spinning process (got one that exited)")
        yield


def host_fresh(ctx: BenchContext) -> Fields:
    """At 1 MiB, 16 MiB and the host_copy size, idle then busy; the figure: the largest, idle."""
    sizes = sorted({MiB, min(16 * MiB, ctx.sizes.host_bytes), ctx.sizes.host_bytes})
    tensors = {f"{n / MiB:.0f} MiB": _backends.torch().rand(n // 4) for n in sizes}
    pairs: dict[str, str] = {}
    got: dict[str, Measured] = {}
    for busy, spinners in (("", 0), (" busy", os.cpu_count() or 1)):
        with busy_machine(spinners):
            for size, t in tensors.items():
                ours, anchor = f"copy_to_host(t) {size}{busy}", f"t.numpy().copy() {size}{busy}"
                pairs[ours] = anchor
                check = expect_equal(t.numpy(), ours)
                cases = {ours: Case(partial(interop.copy_to_host, t), t.nbytes, check)}
                cases[anchor] = Case(partial(_numpy_copy, t), t.nbytes)
                # as many rounds as fit in the largest size's time: a copy of a few ms on a
                # busy machine is preempted or not by chance, so few medians of it swing 10x
                rounds = max(3 * ctx.sizes.repeats, 4 * ctx.sizes.host_bytes // t.nbytes)
                got |= measure(cases, rounds, release=gc.collect)
    gbps = {label: m.gbps for label, m in got.items()}
    figure = list(pairs)[len(tensors) - 1]
    return {
        "size": ", ".join(tensors) + " float32",
        "gbps": gbps[figure],
        "by_size_gbps": {o.removeprefix("copy_to_host(t) "): gbps[o] for o in pairs},
        "busy": {"processes": spinners, "nice": os.getpriority(os.PRIO_PROCESS, 0)},
        "anchors": {f"{a} GB/s": gbps[a] for a in pairs.values()},
        "ratios": [Ratio.between(o, "throughput", a, gbps[o], gbps[a]) for o, a in pairs.items()],
        "memory": {"extra_host_rss_bytes": got[figure].extra_host_bytes},
        "samples": {label: m.record() for label, m in got.items()},
    }


def save_npy_rss_child(nbytes: int, path: str, settings: dict[str, int]) -> tuple[Any, ...]:
    """In a fresh process: ``save_npy``'s peak RSS growth, its method, seconds, and whether the
    file holds the tensor."""
    import torch

    t = torch.rand(nbytes // 4, dtype=torch.float32)
    with config.set(**settings):
        interop.save_npy(t[:1024], path)  # imports and first-use allocations done
        gc.collect()
        with PeakRss() as rss:
            start = time.perf_counter()
            interop.save_npy(t, path)
            seconds = time.perf_counter() - start
    same = np.array_equal(np.load(path, mmap_mode="r"), t.numpy())
    return rss.extra_bytes, rss.method, seconds, bool(same)


def save_npy_rss(ctx: BenchContext) -> Fields:
    ring, nbytes = ring_bytes(), ctx.sizes.rss_bytes
    fresh = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    with tempfile.TemporaryDirectory(dir=ctx.workdir) as tmp, fresh:
        child = fresh.submit(save_npy_rss_child, nbytes, f"{tmp}/rss.npy", config.as_dict())
        extra, method, seconds, same = child.result()
    if not same:
        raise WrongResultError("save_npy wrote a file that differs from the tensor")
    if extra is None:
        raise RuntimeError("peak RSS cannot be measured here (needs Linux /proc)")
    bound = "2 x num_buffers x chunk_bytes"
    ratio = Ratio.between(
        "extra host RSS of save_npy", "memory", f"the bound {bound}", extra, 2 * ring
    )
    return {
        "size": f"{format_bytes(nbytes)} float32",
        "gbps": nbytes / seconds / GB,
        "anchors": {f"{bound} bytes": 2 * ring},
        "ratios": [ratio],
        "memory": {
            "extra_host_rss_bytes": extra,
            "bound_bytes": 2 * ring,
            "ring_bytes": ring,
            "rss_method": method,
        },
        "samples": {"save_npy": {"seconds": [seconds], "result_checked": True}},
    }


def _row(ctx: BenchContext, cases: dict[str, Case], ours: str, to: tuple[str, ...]) -> Fields:
    """Measure ``cases`` on the GPU arrays: the fields of :func:`_throughput`, and the ring."""
    g = ctx.gpu()
    got = measure(cases, ctx.sizes.repeats, sync=g.sync, release=g.release)
    fields: Fields = {"size": f"{format_bytes(g.nbytes)} float32"} | _throughput(got, ours, to)
    fields["memory"]["ring_bytes"] = ring_bytes()
    return fields


def to_host_case(what: str, src: Any, out: Any, ref: Any, every: int = 1) -> Case:
    """``copy_to_host(src, out)``, every ``every``-th element poisoned, then checked (the sweep
    samples with a prime ``every``, seeing every chunk)."""
    check = expect_equal(ref[::every], what)
    fn = partial(interop.copy_to_host, src, out)
    return Case(fn, out.nbytes, lambda r: check(r[::every]), lambda: out[::every].fill(np.nan))


def to_device_case(what: str, g: GpuArrays, *args: Any) -> Case:
    """``copy_to_device(*args)``, its result checked equal to ``g.x``."""
    return Case(partial(interop.copy_to_device, *args), g.nbytes, expect_equal(g.x, what))


def link_limit(ctx: BenchContext, to_host: bool) -> Fields:
    g = ctx.gpu()
    name, dst = ("d2h_limit", None) if to_host else ("h2d_limit", g.cp.empty_like(g.x))
    fields = _row(ctx, {name: g.limit_case(to_host, dst)}, name, (name,))
    if dst is not None:
        expect_equal(g.x, "the pinned-to-device cudaMemcpyAsync")(dst)
    return fields


def d2h_prealloc(ctx: BenchContext) -> Fields:
    g = ctx.gpu()
    out = np.full(g.ref.shape, np.nan, np.float32)  # pageable, touched
    cases = {
        "d2h_limit": g.limit_case(True),
        "copy_to_host(x, out)": to_host_case("copy_to_host(x, out)", g.x, out, g.ref),
        "copy_to_host(t, out)": to_host_case("copy_to_host(t, out)", g.t, out, g.ref),
        "cupy.asnumpy(x, out=out)": Case(lambda: g.cp.asnumpy(g.x, out=out), g.nbytes),
        "t.to('cpu', non_blocking=True)+sync": Case(
            lambda: g.t.to("cpu", non_blocking=True), g.nbytes
        ),
    }
    return _row(ctx, cases, "copy_to_host(x, out)", ("d2h_limit",))


def d2h_pinned(ctx: BenchContext) -> Fields:
    g = ctx.gpu()
    out, ours = interop.empty_pinned(g.ref.shape, np.float32), "copy_to_host(x, out=pinned)"
    cases = {
        "d2h_limit": g.limit_case(True),
        ours: to_host_case(ours, g.x, out, g.ref),
        "cupy.asnumpy(x, out=pinned)": Case(lambda: g.cp.asnumpy(g.x, out=out), g.nbytes),
    }
    return _row(ctx, cases, ours, ("d2h_limit",))


def d2h_fresh(ctx: BenchContext) -> Fields:
    g = ctx.gpu()
    cases = {
        "d2h_limit": g.limit_case(True),
        "copy_to_host(x)": Case(
            partial(interop.copy_to_host, g.x), g.nbytes, expect_equal(g.ref, "copy_to_host(x)")
        ),
        "cupy.asnumpy(x)": Case(lambda: g.cp.asnumpy(g.x), g.nbytes),
        "t.cpu().numpy()": Case(lambda: g.t.cpu().numpy(), g.nbytes),
    }
    to = ("d2h_limit", "cupy.asnumpy(x)", "t.cpu().numpy()")
    return _row(ctx, cases, "copy_to_host(x)", to)


def strided(g: GpuArrays) -> tuple[Any, Any, np.ndarray, np.ndarray]:
    """The square's transposed ``x.T``, ``t.T``, ``x.T``'s values on the host, a pageable out."""
    side = math.isqrt(g.nbytes // 4)
    x_t, t_t, ref_t = (a[: side * side].reshape(side, side).T for a in (g.x, g.t, g.ref))
    return x_t, t_t, ref_t, np.full((side, side), np.nan, np.float32)


def d2h_strided(ctx: BenchContext) -> Fields:
    g = ctx.gpu()
    x_t, t_t, ref, out = strided(g)
    contiguous = g.x[: out.size].reshape(out.shape)
    cases = {
        "copy_to_host(x, out)": Case(partial(interop.copy_to_host, contiguous, out), out.nbytes),
        "copy_to_host(x.T, out)": to_host_case("copy_to_host(x.T)", x_t, out, ref),
        "copy_to_host(t.T, out)": to_host_case("copy_to_host(t.T)", t_t, out, ref),
        "cupy.asnumpy(x.T, out=out)": Case(lambda: g.cp.asnumpy(x_t, out=out), out.nbytes),
    }
    fields = _row(ctx, cases, "copy_to_host(x.T, out)", ("copy_to_host(x, out)",))
    return fields | {"size": f"{out.shape[0]}x{out.shape[1]} float32, transposed"}


def h2d_pageable(ctx: BenchContext) -> Fields:
    g = ctx.gpu()
    host = np.array(g.ref)  # pageable, touched
    out = g.cp.full_like(g.x, g.cp.nan)  # poisoned
    cases = {
        "h2d_limit": g.limit_case(False),
        "copy_to_device(host)": to_device_case("copy_to_device(host)", g, host),
        "copy_to_device(host, out)": to_device_case("copy_to_device(host, out)", g, host, out),
        "cupy.asarray(host)": Case(lambda: g.cp.asarray(host), g.nbytes),
        "torch.from_numpy(host).cuda()": Case(lambda: g.th.from_numpy(host).cuda(), g.nbytes),
    }
    fields = _row(ctx, cases, "copy_to_device(host)", ("h2d_limit", "cupy.asarray(host)"))
    extra = fields["memory"]["extra_host_rss_bytes"]
    of = "extra host RSS of copy_to_device(host)"
    fields["ratios"].append(Ratio.between(of, "memory", RING, extra, ring_bytes()))
    return fields


def h2d_pinned(ctx: BenchContext) -> Fields:
    g = ctx.gpu()
    host = interop.empty_pinned(g.ref.shape, np.float32)
    np.copyto(host, g.ref)
    cases = {
        "h2d_limit": g.limit_case(False),
        "copy_to_device(pinned)": to_device_case("copy_to_device(pinned)", g, host),
        "cupy.asarray(pinned)": Case(lambda: g.cp.asarray(host), g.nbytes),
    }
    return _row(ctx, cases, "copy_to_device(pinned)", ("h2d_limit",))


def exchange_us(ctx: BenchContext) -> Fields:
    cp, th = ctx.gpu().cp, ctx.gpu().th
    t, c = th.rand(16, device="cuda"), cp.random.default_rng(0).random(16, dtype=cp.float32)
    calls = {
        "to_cupy(t)": lambda: interop.to_cupy(t),
        "cupy.from_dlpack(t)": lambda: cp.from_dlpack(t),
        "to_torch(c)": lambda: interop.to_torch(c),
        "torch.from_dlpack(c)": lambda: th.from_dlpack(c),
    }
    return per_call_row(ctx, calls)


def save_npy(ctx: BenchContext) -> Fields:
    g = ctx.gpu()
    host = np.array(g.ref)  # pageable, the same bytes
    ours, to = "save_npy(x, path)", "min(d2h_limit, sequential file write)"
    with tempfile.TemporaryDirectory(dir=ctx.workdir) as tmp:
        path, plain = Path(tmp) / "bench.npy", Path(tmp) / "plain.bin"
        saved = expect_equal(g.ref, ours)
        cases = {
            "d2h_limit": g.limit_case(True),
            "sequential file write": Case(lambda: plain.write_bytes(host.data), g.nbytes),
            # the replaced file is freed in the background: not while the anchors run
            ours: Case(
                partial(interop.save_npy, g.x, path),
                g.nbytes,
                lambda _: saved(np.load(path, mmap_mode="r")),
                settle=wait_for_replaced_files,
            ),
        }
        fields = _row(ctx, cases, ours, ("d2h_limit",))
    limit = min(fields["anchors"][f"{k} GB/s"] for k in ("d2h_limit", "sequential file write"))
    fields["ratios"].append(Ratio.between(ours, "throughput", to, fields["gbps"], limit))
    return fields | {"directory": str(ctx.workdir)}


d2h_limit, h2d_limit = partial(link_limit, to_host=True), partial(link_limit, to_host=False)
_RSS = "peak extra RSS while saving a CPU tensor with save_npy (fresh process)"

#: Every row, in the order a run measures them.
ROWS: tuple[RowSpec, ...] = (
    RowSpec("to_numpy_us", "to_numpy(small CPU tensor), per call", False, to_numpy_us),
    RowSpec("to_torch_us", "to_torch(small NumPy array), per call", False, to_torch_us),
    RowSpec("host_copy", "copy_to_host(cpu_tensor, out)", False, host_copy),
    RowSpec("host_fresh", "copy_to_host(cpu_tensor), allocating out", False, host_fresh),
    RowSpec("save_npy_rss", _RSS, False, save_npy_rss),
    RowSpec("d2h_limit", "one cudaMemcpyAsync of the array to pinned memory", True, d2h_limit),
    RowSpec("d2h_prealloc", "copy_to_host(x, out), out pageable, touched", True, d2h_prealloc),
    RowSpec("d2h_pinned", "copy_to_host(x, out), out pinned (empty_pinned)", True, d2h_pinned),
    RowSpec("d2h_fresh", "copy_to_host(x), allocating out", True, d2h_fresh),
    RowSpec("d2h_strided", "copy_to_host(x.T, out), transposed source", True, d2h_strided),
    RowSpec("h2d_limit", "one cudaMemcpyAsync of the array from pinned memory", True, h2d_limit),
    RowSpec("h2d_pageable", "copy_to_device(host), host pageable", True, h2d_pageable),
    RowSpec("h2d_pinned", "copy_to_device(host), host pinned (empty_pinned)", True, h2d_pinned),
    RowSpec("exchange_us", "to_cupy(t) / to_torch(c) per call", True, exchange_us),
    RowSpec("save_npy", "save_npy(device array, path)", True, save_npy),
)
