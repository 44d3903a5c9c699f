"""The rows of ``python -m interop bench``, what they share, and :data:`ROWS`. A row returns
its fields: the figure, ``anchors`` (what people write instead, the link's limit), interop's
other forms (``variants``), ``ratios``, ``memory`` and ``samples``."""

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
from .measure import (
    BenchSizes,
    Case,
    Measured,
    MiB,
    PeakRss,
    Ratio,
    WrongResultError,
    expect_equal,
    measure,
)


class BenchContext:
    """What the rows share: ``sizes``, ``workdir`` (where file rows write), ``notes``
    (run-wide observations for the JSON) and the GPU arrays (made on first use)."""

    def __init__(self, sizes: BenchSizes, workdir: Path) -> None:
        self.sizes, self.workdir = sizes, workdir
        self.notes: dict[str, Any] = {}
        self._gpu: GpuArrays | None = None

    def gpu(self) -> GpuArrays:
        """The shared GPU arrays, made on first use."""
        if self._gpu is None:
            self._gpu = GpuArrays(self.sizes.gpu_bytes)
            self.notes["pinned_pages_in_rss"] = self._gpu.pinned_in_rss
        return self._gpu

    def release(self) -> None:
        """Free what rows left behind: garbage, pooled blocks, staging rings."""
        gc.collect()
        if self._gpu is not None:
            self._gpu.release()

    def close_keeping_results(self) -> None:
        """Free the GPU arrays and every cache; a failure (a sticky CUDA error) is printed
        and kept in ``notes["close_error"]``, so the results measured stay."""
        try:
            gpu, self._gpu = self._gpu, None
            if gpu is not None:
                gpu.close()
            gc.collect()
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            self.notes["close_error"] = f"{type(exc).__name__}: {exc}"


class GpuArrays:
    """The GPU rows' sources, ``nbytes`` each: CuPy ``x``, torch ``t`` (same values) and a
    pinned copy ``ref``; NoDeviceError or BackendUnavailableError without a usable device."""

    def __init__(self, nbytes: int) -> None:
        self.cp, self.th = _backends.require_cupy_device(), _backends.require_torch_cuda()
        n = nbytes // 4
        self.nbytes = n * 4
        self.x = self.cp.random.default_rng(0).random(n, dtype=self.cp.float32)
        self.t = self.th.from_dlpack(self.x).clone()  # torch's own memory
        self._pinned_mem = self.cp.cuda.alloc_pinned_memory(self.nbytes)
        self.ref = np.frombuffer(self._pinned_mem, np.float32, n)  # pinned, == x
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

    def _memcpy_case(self, dst: int, src: int, kind: int) -> Case:
        copy = partial(self.cp.cuda.runtime.memcpyAsync, dst, src, self.nbytes, kind)
        return Case(lambda: copy(self.cp.cuda.get_current_stream().ptr), self.nbytes)

    def d2h_limit_case(self) -> Case:
        """The whole array, device to pinned host, in one ``cudaMemcpyAsync`` (the link's limit)."""
        kind = self.cp.cuda.runtime.memcpyDeviceToHost
        return self._memcpy_case(self.ref.ctypes.data, self.x.data.ptr, kind)

    def h2d_limit_case(self, dst: Any) -> Case:
        """The whole array, pinned host to ``dst`` on the device, in one ``cudaMemcpyAsync``."""
        kind = self.cp.cuda.runtime.memcpyHostToDevice
        return self._memcpy_case(dst.data.ptr, self.ref.ctypes.data, kind)

    def release(self) -> None:
        """Empty CuPy's and PyTorch's pools and interop's staging rings."""
        from ..pipeline.ring import free_cached_rings

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
        del self.x, self.t, self.ref, self._pinned_mem
        self.release()


@dataclasses.dataclass(frozen=True)
class RowSpec:
    """A row: ``name``, ``what`` it measures, whether it needs a ``gpu``, the function that
    measures it, the ``figure`` shown first (``"gbps"``, ``"us"``, ``"memory"``), and
    ``unavailable``, saying why it cannot run in this installation (None: it can)."""

    name: str
    what: str
    gpu: bool
    run: Callable[[BenchContext], dict[str, Any]]
    figure: str = "gbps"
    unavailable: Callable[[], str | None] | None = None


# Host rows ---------------------------------------------------------------------------
RING = "the ring size (num_buffers x chunk_bytes)"


def ring_bytes() -> int:
    """The staging ring at the current settings (the 64 KiB chunk floor applied)."""
    return config.num_buffers * chunk_bytes_or_default(None)


def _throughput(got: dict[str, Measured], ours: str, to: tuple[str, ...]) -> dict[str, Any]:
    """``ours``'s GB/s; the throughput of every case but ``to[0]`` over ``to[0]``'s, then
    ``ours``'s over each of ``to[1:]``; interop's other calls (named like ``ours``) as
    ``variants``, the rest as ``anchors``; ``ours``'s host memory."""
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


def per_call_row(ctx: BenchContext, calls: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    """Per-call latency, timeit-style (garbage collection off), interleaved, after a tenth as
    many calls untimed: ``calls`` in pairs, each of ours followed by its anchor."""
    pairs = dict(zip(list(calls)[::2], list(calls)[1::2], strict=True))
    n, timers = ctx.sizes.calls, {label: timeit.Timer(fn) for label, fn in calls.items()}
    for timer in timers.values():
        timer.timeit(number=max(1, n // 10))
    got = {label: Measured([], calls=n) for label in calls}
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


def to_numpy_us(ctx: BenchContext) -> dict[str, Any]:
    """``to_numpy`` of a 16-float CPU tensor, per call, against ``numpy.from_dlpack``."""
    t = _backends.torch().arange(16, dtype=_backends.torch().float32)
    expect_equal(t.numpy(), "to_numpy")(interop.to_numpy(t))
    return per_call_row(
        ctx,
        {"to_numpy": lambda: interop.to_numpy(t), "numpy.from_dlpack": lambda: np.from_dlpack(t)},
    )


def to_torch_us(ctx: BenchContext) -> dict[str, Any]:
    """``to_torch`` of a 16-float NumPy array, per call, against ``torch.from_dlpack``."""
    th = _backends.torch()
    a = np.arange(16, dtype=np.float32)
    expect_equal(a, "to_torch")(interop.to_torch(a).numpy())
    return per_call_row(
        ctx,
        {"to_torch": lambda: interop.to_torch(a), "torch.from_dlpack": lambda: th.from_dlpack(a)},
    )


def host_copy_cases(nbytes: int) -> tuple[dict[str, Case], int]:
    """Cases ``copy_to_host(t, out)`` and ``numpy.copyto`` into one ``out`` (the sweep's too),
    and their bytes."""
    t = _backends.torch().rand(nbytes // 4)
    src = t.numpy()
    out = np.full(src.size, np.nan, np.float32)  # touched, poisoned
    check = expect_equal(src, "copy_to_host")
    cases = {
        "copy_to_host": Case(lambda: interop.copy_to_host(t, out), src.nbytes, check),
        "numpy.copyto": Case(lambda: np.copyto(out, src), src.nbytes),
    }
    return cases, src.nbytes


def host_copy(ctx: BenchContext) -> dict[str, Any]:
    """``copy_to_host(cpu_tensor, out)`` against one ``numpy.copyto`` into the same ``out``."""
    cases, nbytes = host_copy_cases(ctx.sizes.host_bytes)
    got = measure(cases, 3 * ctx.sizes.repeats, release=gc.collect)  # milliseconds a copy
    fields = _throughput(got, "copy_to_host", ("numpy.copyto",))
    return {"size": f"{nbytes / MiB:.0f} MiB float32"} | fields | {"threads": host_copy_threads()}


def _numpy_copy(t: Any) -> np.ndarray:
    return t.numpy().copy()


_SPIN = "import os\np = os.getppid()\nprint(flush=True)\nwhile os.getppid() == p: pass"


@contextlib.contextmanager
def busy_machine(processes: int) -> Iterator[None]:
    """``processes`` processes spinning at this one's niceness while the block runs (each running
    before it starts), killed when it ends, however it ends (or when this process dies)."""
    with contextlib.ExitStack() as stack:
        for _ in range(processes):
            cmd = [sys.executable, "-I", "-S", "-c", _SPIN]
            p = stack.enter_context(subprocess.Popen(cmd, stdout=subprocess.PIPE))
            stack.callback(p.kill)  # before Popen's exit, which closes the pipe and waits
            if not (p.stdout and p.stdout.read(1)):
                raise RuntimeError("expected a spinning process (got one that exited)")
        yield


def host_fresh(ctx: BenchContext) -> dict[str, Any]:
    """``copy_to_host(t)`` allocating ``out``, against ``t.numpy().copy()``, at 1 MiB, 16 MiB and
    the ``host_copy`` size (256 MiB at scale 1), then again ``busy``: a process per CPU spinning
    (:func:`busy_machine`). The figure is the largest's, not busy."""
    sizes = sorted({MiB, min(16 * MiB, ctx.sizes.host_bytes), ctx.sizes.host_bytes})
    tensors = {f"{n / MiB:.0f} MiB": _backends.torch().rand(n // 4) for n in sizes}
    at = [size + busy for busy in ("", " busy") for size in tensors]
    pairs = {a: (f"copy_to_host(t) {a}", f"t.numpy().copy() {a}") for a in at}
    got: dict[str, Measured] = {}
    for busy, spinners in (("", 0), (" busy", os.cpu_count() or 1)):
        with busy_machine(spinners):
            for size, t in tensors.items():
                ours, anchor = pairs[size + busy]
                check = expect_equal(t.numpy(), ours)
                cases = {ours: Case(partial(interop.copy_to_host, t), t.nbytes, check)}
                cases[anchor] = Case(partial(_numpy_copy, t), t.nbytes)
                got |= measure(cases, 3 * ctx.sizes.repeats, release=gc.collect)
    gbps = {label: m.gbps for label, m in got.items()}
    return {
        "size": ", ".join(tensors) + " float32",
        "gbps": gbps[pairs[at[len(tensors) - 1]][0]],
        "by_size_gbps": {a: gbps[ours] for a, (ours, _) in pairs.items()},
        "busy": {"processes": spinners, "nice": os.getpriority(os.PRIO_PROCESS, 0)},
        "anchors": {f"{anchor} GB/s": gbps[anchor] for _, anchor in pairs.values()},
        "ratios": [Ratio.between(o, "throughput", a, gbps[o], gbps[a]) for o, a in pairs.values()],
        "memory": {"extra_host_rss_bytes": got[pairs[at[len(tensors) - 1]][0]].extra_host_bytes},
        "samples": {label: m.record() for label, m in got.items()},
    }


def save_npy_rss_child(nbytes: int, path: str, settings: dict[str, int]) -> dict[str, Any]:
    """``save_npy_rss`` in a fresh process: peak RSS growth while ``save_npy`` saves a touched
    CPU tensor (warmed up on a slice) with ``settings``, and whether the file holds it."""
    import torch

    t = torch.rand(nbytes // 4, dtype=torch.float32)
    with config.set(**settings):
        interop.save_npy(t[:1024], path)  # imports and first-use allocations done
        gc.collect()
        with PeakRss() as rss:
            start = time.perf_counter()
            interop.save_npy(t, path)
            seconds = time.perf_counter() - start
    checked = bool(np.array_equal(np.load(path, mmap_mode="r"), t.numpy()))
    return {"extra": rss.extra_bytes, "method": rss.method, "seconds": seconds, "checked": checked}


def save_npy_rss(ctx: BenchContext) -> dict[str, Any]:
    """Peak extra RSS of a fresh process while ``save_npy`` saves a CPU tensor."""
    ring = ring_bytes()
    bound, nbytes = 2 * ring, ctx.sizes.rss_bytes // 4 * 4
    fresh = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    with tempfile.TemporaryDirectory(dir=ctx.workdir) as tmp, fresh:
        path = str(Path(tmp) / "rss.npy")
        child = fresh.submit(save_npy_rss_child, nbytes, path, config.as_dict()).result()
    if not child["checked"]:
        raise WrongResultError("save_npy wrote a file that differs from the tensor")
    extra = child["extra"]
    if extra is None:
        raise RuntimeError("peak RSS cannot be measured here (needs Linux /proc)")
    words = "the bound 2 x num_buffers x chunk_bytes"
    return {
        "size": f"{nbytes / MiB:.0f} MiB float32",
        "gbps": nbytes / child["seconds"] / 1e9,
        "anchors": {"2 x num_buffers x chunk_bytes bytes": bound},
        "ratios": [Ratio.between("extra host RSS of save_npy", "memory", words, extra, bound)],
        "memory": {
            "extra_host_rss_bytes": extra,
            "bound_bytes": bound,
            "ring_bytes": ring,
            "rss_method": child["method"],
        },
        "samples": {"save_npy": {"seconds": [child["seconds"]], "result_checked": True}},
    }


# GPU rows ----------------------------------------------------------------------------
def _row(
    ctx: BenchContext, cases: dict[str, Case], ours: str, to: tuple[str, ...], **more: Any
) -> dict[str, Any]:
    """Measure ``cases`` on the GPU arrays; the fields as :func:`_throughput` makes them."""
    g = ctx.gpu()
    got = measure(cases, ctx.sizes.repeats, sync=g.sync, release=g.release)
    fields = {"size": f"{g.nbytes / 2**30:.2f} GiB float32"} | _throughput(got, ours, to)
    fields["memory"]["ring_bytes"] = ring_bytes()
    return fields | more


def _poisoned(g: GpuArrays, fn: Any, out: Any, what: str, ref: Any = None) -> Case:
    """``fn()`` into ``out``, poisoned before the first call, checked equal to ``ref``."""
    check = expect_equal(g.ref if ref is None else ref, what)
    return Case(fn, out.nbytes, check, lambda: out.fill(np.nan))


def _on_device(g: GpuArrays, what: str = "copy_to_device") -> Any:
    """A :class:`Case` check: the device array returned equals ``g.x``."""

    def check(result: Any) -> None:
        if not bool(g.cp.array_equal(result, g.x)):
            raise WrongResultError(f"{what} returned data that differs from the source")

    return check


def d2h_limit(ctx: BenchContext) -> dict[str, Any]:
    """One ``cudaMemcpyAsync`` of the whole array into pinned memory: the link's limit."""
    return _row(ctx, {"d2h_limit": ctx.gpu().d2h_limit_case()}, "d2h_limit", ("d2h_limit",))


def h2d_limit(ctx: BenchContext) -> dict[str, Any]:
    """One ``cudaMemcpyAsync`` of the whole array from pinned memory: the link's limit."""
    g = ctx.gpu()
    dst = g.cp.empty_like(g.x)
    fields = _row(ctx, {"h2d_limit": g.h2d_limit_case(dst)}, "h2d_limit", ("h2d_limit",))
    _on_device(g, "the pinned-to-device cudaMemcpyAsync")(dst)
    return fields


def d2h_prealloc_cases(g: GpuArrays, out: np.ndarray, every: int = 1) -> dict[str, Case]:
    """``d2h_limit`` and ``copy_to_host(x, out)`` into ``out`` (pageable, touched), also what
    the sweep times; every ``every``-th element of ``out`` is poisoned before the first call
    and checked after it (the sweep samples with a prime stride, seeing every chunk)."""
    check = expect_equal(g.ref[::every], "copy_to_host(x, out)")
    ours = Case(lambda: interop.copy_to_host(g.x, out), g.nbytes, lambda r: check(r[::every]))
    ours.prepare = lambda: out[::every].fill(np.nan)
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
    x_t, t_t, ref_t = (a[: side * side].reshape(side, side).T for a in (g.x, g.t, g.ref))
    return x_t, t_t, ref_t, np.full((side, side), np.nan, np.float32)


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
    """``h2d_limit`` and ``copy_to_device(host)`` from pageable ``host``; the sweep times them."""
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
    fields = per_call_row(ctx, calls)
    g.sync()
    return fields


def save_npy(ctx: BenchContext) -> dict[str, Any]:
    """``save_npy(x, path)`` against the link's limit and a plain file write of the same bytes."""
    g = ctx.gpu()
    host = np.array(g.ref)  # pageable, the same bytes
    ours, to = "save_npy(x, path)", "min(d2h_limit, sequential file write)"
    with tempfile.TemporaryDirectory(dir=ctx.workdir) as tmp:
        path, plain = Path(tmp) / "bench.npy", Path(tmp) / "plain.bin"

        def saved(result: Any) -> None:
            expect_equal(g.ref, ours)(np.load(path, mmap_mode="r"))

        cases = {
            "d2h_limit": g.d2h_limit_case(),
            "sequential file write": Case(lambda: plain.write_bytes(host.data), g.nbytes),
            # the replaced file is freed in the background: not while the anchors run
            ours: Case(
                lambda: interop.save_npy(g.x, path), g.nbytes, saved, settle=wait_for_replaced_files
            ),
        }
        fields = _row(ctx, cases, ours, ("d2h_limit",), directory=str(ctx.workdir))
    limit = min(fields["anchors"][f"{k} GB/s"] for k in ("d2h_limit", "sequential file write"))
    fields["ratios"].append(Ratio.between(ours, "throughput", to, fields["gbps"], limit))
    return fields


_RSS = "peak extra RSS while saving a CPU tensor with save_npy (fresh process)"

#: Every row, in the order a run measures them.
ROWS: tuple[RowSpec, ...] = (
    RowSpec("to_numpy_us", "to_numpy(small CPU tensor), per call", False, to_numpy_us, "us"),
    RowSpec("to_torch_us", "to_torch(small NumPy array), per call", False, to_torch_us, "us"),
    RowSpec("host_copy", "copy_to_host(cpu_tensor, out)", False, host_copy),
    RowSpec("host_fresh", "copy_to_host(cpu_tensor), allocating out", False, host_fresh),
    RowSpec("save_npy_rss", _RSS, False, save_npy_rss, "memory"),
    RowSpec("d2h_limit", "one cudaMemcpyAsync of the array to pinned memory", True, d2h_limit),
    RowSpec("d2h_prealloc", "copy_to_host(x, out), out pageable, touched", True, d2h_prealloc),
    RowSpec("d2h_pinned", "copy_to_host(x, out), out pinned (empty_pinned)", True, d2h_pinned),
    RowSpec("d2h_fresh", "copy_to_host(x), allocating out", True, d2h_fresh),
    RowSpec("d2h_strided", "copy_to_host(x.T, out), transposed source", True, d2h_strided),
    RowSpec("h2d_limit", "one cudaMemcpyAsync of the array from pinned memory", True, h2d_limit),
    RowSpec("h2d_pageable", "copy_to_device(host), host pageable", True, h2d_pageable),
    RowSpec("h2d_pinned", "copy_to_device(host), host pinned (empty_pinned)", True, h2d_pinned),
    RowSpec("exchange_us", "to_cupy(t) / to_torch(c) per call", True, exchange_us, "us"),
    RowSpec("save_npy", "save_npy(device array, path)", True, save_npy),
)
