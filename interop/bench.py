"""``python -m interop bench``: the measurements of SPEC §5.

Every figure is reported beside anchors measured in the same run, as ratios,
so a result holds on a noisy machine. Within a row the measured calls are
interleaved (ours, anchor, ours, anchor, ...) so that drift hits all of them
alike, and each figure is the median of several repeats. The first call of
each is not timed: it warms up, its result is checked against a reference,
and it is the call whose extra memory is measured (after the caches of
CuPy, PyTorch and interop were emptied, so a staging ring allocated by the
call is counted).

The pieces: one small function per row (``_row_*``, each returning a dict of
measured fields), :data:`ROWS` (name, description, target, needs),
:func:`collect_results` (runs the rows), :func:`format_table` (the printed
table) and :func:`write_json`. GPU rows run only where CuPy and PyTorch both
see a CUDA device; host rows run anywhere PyTorch is installed. A row whose
interop function is missing from this build is reported as
``"not available"``, never faked.

Environment variables: ``INTEROP_BENCH_SCALE`` (a positive float) multiplies
every array size and loop count, e.g. ``0.25`` for a smoke test or ``4`` for
4 GiB GPU arrays; ``INTEROP_BENCH_DIR`` is where the file rows write
(default: the system temporary directory).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import datetime
import gc
import importlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import timeit
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from . import _backends
from .config import config
from .errors import BackendUnavailableError, NoDeviceError

__all__ = [
    "ROWS",
    "BenchSizes",
    "PeakRss",
    "RowSpec",
    "collect_results",
    "format_table",
    "run_bench",
    "write_json",
]

GB = 1e9
MiB = 1 << 20
GiB = 1 << 30
SCHEMA = 1


# ----------------------------------------------------------------- sizes


@dataclasses.dataclass(frozen=True)
class BenchSizes:
    """Array sizes, loop counts and repeats of one run.

    Attributes
    ----------
    repeats : int
        Timed repeats per figure (the median is reported).
    calls : int
        Calls per timed repeat of the per-call (µs) rows.
    host_bytes : int
        Size of the ``host_copy`` array.
    rss_bytes : int
        Size of the tensor saved by ``save_npy_rss``.
    gpu_bytes : int
        Size of the float32 arrays of the GPU rows.
    scale : float
        The ``INTEROP_BENCH_SCALE`` the sizes were multiplied by.
    """

    repeats: int
    calls: int
    host_bytes: int
    rss_bytes: int
    gpu_bytes: int
    scale: float = 1.0

    @classmethod
    def choose(cls, quick: bool, scale: float = 1.0) -> BenchSizes:
        """The sizes of a full run (SPEC §5) or of a ``--quick`` smoke run, scaled.

        Raises
        ------
        ValueError
            ``scale`` is not a positive finite number.
        """
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
            raise ValueError(f"expected a positive scale (got {scale!r})")
        if quick:
            repeats, calls, host, rss, gpu = 3, 2000, 64 * MiB, 64 * MiB, 256 * MiB
        else:
            repeats, calls, host, rss, gpu = 5, 20000, 256 * MiB, 768 * MiB, GiB

        def nbytes(n: int) -> int:  # a multiple of 4 KiB, at least 1 MiB
            return max(MiB, int(n * scale) // 4096 * 4096)

        return cls(
            repeats=repeats,
            calls=max(100, int(calls * scale)),
            host_bytes=nbytes(host),
            rss_bytes=nbytes(rss),
            gpu_bytes=nbytes(gpu),
            scale=float(scale),
        )


def _scale_from_env() -> float:
    raw = os.environ.get("INTEROP_BENCH_SCALE", "").strip()
    if not raw:
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"expected INTEROP_BENCH_SCALE to be a positive number (got {raw!r}); "
            "unset it or use e.g. 0.25"
        )
    return value


# ----------------------------------------------------------------- measuring


def _status_bytes(key: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` in bytes, or None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class PeakRss:
    """Peak growth of this process's resident memory over a ``with`` block.

    On Linux the kernel's peak (``VmHWM``) is reset at entry through
    ``/proc/self/clear_refs``; where that is refused, a thread samples
    ``VmRSS`` every millisecond instead (it can miss a short peak). Off Linux
    :attr:`extra_bytes` stays None.

    Attributes
    ----------
    extra_bytes : int or None
        Peak resident bytes minus resident bytes at entry (at least 0).
    method : str
        ``"VmHWM"``, ``"sampled VmRSS"`` or ``"unavailable"``.
    """

    def __init__(self) -> None:
        self.extra_bytes: int | None = None
        self.method = "unavailable"
        self._base: int | None = None
        self._peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakRss:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current RSS
            self.method = "VmHWM"
        except OSError:
            self.method = "sampled VmRSS"
        self._base = _status_bytes("VmRSS")
        if self._base is None:
            self.method = "unavailable"
        elif self.method == "sampled VmRSS":
            self._peak = self._base
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            self._peak = max(self._peak, _status_bytes("VmRSS") or 0)

    def __exit__(self, *exc: object) -> None:
        if self._base is None:
            return
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            peak = max(self._peak, _status_bytes("VmRSS") or 0)
        else:
            peak = _status_bytes("VmHWM") or 0
        self.extra_bytes = max(0, peak - self._base)


class _DeviceGrowth:
    """Peak device memory taken from CuPy's pool and PyTorch's allocator in a block.

    CuPy's pool only grows while nothing frees its blocks, so its growth is
    the peak held; PyTorch reports its peak directly. Memory taken past both
    (a raw ``cudaMalloc``) is not seen.
    """

    def __init__(self, cp: Any, th: Any) -> None:
        self._cp, self._th = cp, th
        self.extra_bytes: int | None = None

    def __enter__(self) -> _DeviceGrowth:
        self._pool_before = self._cp.get_default_memory_pool().total_bytes()
        self._th.cuda.reset_peak_memory_stats()
        self._torch_before = self._th.cuda.memory_allocated()
        return self

    def __exit__(self, *exc: object) -> None:
        pool = self._cp.get_default_memory_pool().total_bytes() - self._pool_before
        torch_peak = self._th.cuda.max_memory_allocated() - self._torch_before
        self.extra_bytes = max(0, pool) + max(0, torch_peak)


class WrongResultError(AssertionError):
    """A benchmarked call returned wrong data; its row is an error, not a figure."""


@dataclasses.dataclass
class Case:
    """One measured call of a row.

    Attributes
    ----------
    fn : callable
        The call; its return value goes to ``check``.
    nbytes : int
        Bytes moved per call (0 for per-call latency cases).
    check : callable, optional
        Called once with the first call's result; raises
        :class:`WrongResultError` if it is wrong.
    prepare : callable, optional
        Called once, untimed, before the first call (e.g. to poison ``out``
        so that the check sees what this call wrote).
    """

    fn: Callable[[], Any]
    nbytes: int = 0
    check: Callable[[Any], None] | None = None
    prepare: Callable[[], None] | None = None


@dataclasses.dataclass
class Measured:
    """Timings and memory of one :class:`Case`."""

    seconds: list[float]
    nbytes: int = 0
    calls: int = 1
    extra_host_bytes: int | None = None
    extra_device_bytes: int | None = None
    checked: bool = False

    @property
    def median_s(self) -> float:
        """Median seconds of one timed repeat."""
        return statistics.median(self.seconds)

    @property
    def gbps(self) -> float:
        """Bytes per second of the median repeat, in GB/s (1e9)."""
        return self.nbytes / self.median_s / GB

    @property
    def us(self) -> float:
        """Microseconds per call of the median repeat."""
        return self.median_s / self.calls * 1e6

    def record(self) -> dict[str, Any]:
        """The JSON form: every repeat, and the memory where it was measured."""
        out: dict[str, Any] = {"seconds": self.seconds, "calls": self.calls}
        if self.nbytes:
            out["bytes"] = self.nbytes
        if self.extra_host_bytes is not None:
            out["extra_host_rss_bytes"] = self.extra_host_bytes
        if self.extra_device_bytes is not None:
            out["extra_device_bytes"] = self.extra_device_bytes
        if self.checked:
            out["result_checked"] = True
        return out


def measure(
    cases: dict[str, Case],
    repeats: int,
    *,
    sync: Callable[[], None] | None = None,
    release: Callable[[], None] | None = None,
    device_growth: Callable[[], _DeviceGrowth] | None = None,
) -> dict[str, Measured]:
    """Time byte-moving calls, interleaved, after a measured first call and a warm-up.

    Each case's first call runs after ``release`` (so what it allocates,
    staging rings and pools included, is counted): its peak extra host RSS
    and device memory are measured and its result is checked. Then every case
    runs once more untimed, so that the caches emptied for later cases' first
    calls are full again, and then ``repeats`` timed rounds run, case after
    case in each round.

    Parameters
    ----------
    cases : dict of str to Case
        The calls of one row, by label.
    repeats : int
        Timed calls per case; case after case within each repeat.
    sync : callable, optional
        Waits for the device after each call (inside the timed region).
    release : callable, optional
        Empties allocator and staging caches before each first call (not
        before the timed calls).
    device_growth : callable, optional
        Makes the context manager that measures device memory.

    Returns
    -------
    dict of str to Measured
    """
    results: dict[str, Measured] = {}
    for label, case in cases.items():
        if case.prepare is not None:
            case.prepare()
        if release is not None:
            release()
        growth = device_growth() if device_growth is not None else None
        with PeakRss() as rss, growth if growth is not None else contextlib.nullcontext():
            value = case.fn()
            if sync is not None:
                sync()
        if case.check is not None:
            case.check(value)
        del value
        results[label] = Measured(
            [],
            case.nbytes,
            extra_host_bytes=rss.extra_bytes,
            extra_device_bytes=growth.extra_bytes if growth is not None else None,
            checked=case.check is not None,
        )
    for case in cases.values():  # warm again: later first calls emptied the caches
        case.fn()
        if sync is not None:
            sync()
    for _ in range(repeats):
        for label, case in cases.items():
            start = time.perf_counter()
            case.fn()
            if sync is not None:
                sync()
            results[label].seconds.append(time.perf_counter() - start)
    return results


def measure_per_call(
    cases: dict[str, Callable[[], Any]], calls: int, repeats: int
) -> dict[str, Measured]:
    """Per-call latency, timeit-style: ``calls`` calls per repeat, interleaved.

    Each case first runs a tenth of ``calls`` untimed (warm-up); garbage
    collection is off while timing, as in :mod:`timeit`.
    """
    timers = {label: timeit.Timer(fn) for label, fn in cases.items()}
    for timer in timers.values():
        timer.timeit(number=max(1, calls // 10))
    results = {label: Measured([], calls=calls) for label in cases}
    for _ in range(repeats):
        for label, timer in timers.items():
            results[label].seconds.append(timer.timeit(number=calls))
    return results


def _ratio(a: float, b: float) -> float | None:
    r = a / b if b else math.nan
    return r if math.isfinite(r) else None


def _expect_equal(reference: Any, what: str) -> Callable[[Any], None]:
    def check(result: Any) -> None:
        if not np.array_equal(np.asarray(result), reference):
            raise WrongResultError(f"{what} returned data that differs from the source")

    return check


def _collect_garbage() -> None:
    gc.collect()


def _api(name: str) -> Any:
    """``interop.<name>``, looked up when a row runs (rows list what they need)."""
    return getattr(importlib.import_module("interop"), name)


# ----------------------------------------------------------------- context


class BenchContext:
    """What the rows share: the sizes, a scratch directory and the GPU arrays.

    The GPU arrays are made by the first GPU row and freed by :meth:`close`;
    everything else a row allocates is local to it and freed when it returns.
    """

    def __init__(self, sizes: BenchSizes, workdir: Path) -> None:
        self.sizes = sizes
        self.workdir = workdir
        self.notes: dict[str, Any] = {}
        self._gpu: _Gpu | None = None

    def gpu(self) -> _Gpu:
        """The shared GPU state (made on first use)."""
        if self._gpu is None:
            self._gpu = _Gpu(self.sizes.gpu_bytes)
            self.notes["pinned_pages_in_rss"] = self._gpu.pinned_in_rss
        return self._gpu

    def release(self) -> None:
        """Free what rows left behind: garbage, pooled blocks, staging rings."""
        gc.collect()
        if self._gpu is not None:
            self._gpu.release()

    def close(self) -> None:
        """Free the GPU arrays and every cache."""
        if self._gpu is not None:
            self._gpu.close()
            self._gpu = None
        gc.collect()


def _release_interop_rings() -> None:
    """Free interop's idle pinned staging rings so the next call allocates (and counts) one."""
    from .pipeline.ring import free_cached_rings

    free_cached_rings()


def _pinned_pages_in_rss(cp: Any) -> bool | None:
    """Whether this driver counts page-locked memory in the process's RSS.

    The host-memory figures of the GPU rows are RSS growth; where pinned
    pages are not counted, they show pageable memory only.
    """
    nbytes = 64 * MiB
    with PeakRss() as rss:
        ptr = int(cp.cuda.runtime.hostAlloc(nbytes, 0))
        ctypes.memset(ptr, 1, nbytes)
    cp.cuda.runtime.freeHost(ptr)
    return None if rss.extra_bytes is None else rss.extra_bytes >= nbytes // 2


class _Gpu:
    """The GPU rows' source arrays: CuPy ``x``, torch ``t`` (same values), a pinned copy."""

    def __init__(self, nbytes: int) -> None:
        self.cp = _backends.require_cupy_device()
        self.th = _backends.require_torch_cuda()
        n = nbytes // 4
        self.nbytes = n * 4
        self.x = self.cp.random.default_rng(0).random(n, dtype=self.cp.float32)
        self.t = self.th.from_dlpack(self.x).clone()  # torch's own memory
        self._pinned_mem = self.cp.cuda.alloc_pinned_memory(self.nbytes)
        self.ref = np.frombuffer(self._pinned_mem, np.float32, n)  # pinned, == x
        self.x.get(out=self.ref)
        self.sync()
        self.pinned_in_rss = _pinned_pages_in_rss(self.cp)

    def sync(self) -> None:
        """Wait for all work on the device (every stream)."""
        self.cp.cuda.Device().synchronize()

    def growth(self) -> _DeviceGrowth:
        """A context manager measuring device memory taken in its block."""
        return _DeviceGrowth(self.cp, self.th)

    def memcpy(self, dst: int, src: int, kind: int) -> None:
        """One ``cudaMemcpyAsync`` of ``nbytes`` on CuPy's current stream."""
        stream = self.cp.cuda.get_current_stream()
        self.cp.cuda.runtime.memcpyAsync(dst, src, self.nbytes, kind, stream.ptr)

    def d2h_limit_case(self) -> Case:
        """The whole array, device to pinned host, in one copy."""
        kind = self.cp.cuda.runtime.memcpyDeviceToHost
        return Case(lambda: self.memcpy(self.ref.ctypes.data, self.x.data.ptr, kind), self.nbytes)

    def measure(self, cases: dict[str, Case], repeats: int) -> dict[str, Measured]:
        """:func:`measure` with device sync, cache release and device memory."""
        return measure(
            cases, repeats, sync=self.sync, release=self.release, device_growth=self.growth
        )

    def release(self) -> None:
        """Empty CuPy's and PyTorch's pools and interop's staging rings."""
        gc.collect()
        self.sync()
        _release_interop_rings()
        self.cp.get_default_memory_pool().free_all_blocks()
        self.cp.get_default_pinned_memory_pool().free_all_blocks()
        self.th.cuda.empty_cache()
        host_empty = getattr(self.th._C, "_host_emptyCache", None)  # torch's pinned cache
        if host_empty is not None:
            host_empty()

    def close(self) -> None:
        """Free the arrays and every cache."""
        self.sync()
        del self.x, self.t, self.ref, self._pinned_mem
        self.release()


# ----------------------------------------------------------------- host rows


def _per_call_fields(
    ours: str, anchor: str, cases: dict[str, Callable[[], Any]], ctx: BenchContext
) -> dict[str, Any]:
    """A per-call latency row: ``ours`` against ``anchor``, target <= 2x."""
    got = measure_per_call(cases, ctx.sizes.calls, ctx.sizes.repeats)
    ratio = _ratio(got[ours].us, got[anchor].us)
    return {
        "us": got[ours].us,
        "anchors": {f"{anchor} us": got[anchor].us},
        "ratios": {f"vs {anchor}": ratio},
        "met": ratio is not None and ratio <= 2.0,
        "samples": {label: m.record() for label, m in got.items()},
    }


def _row_to_numpy_us(ctx: BenchContext) -> dict[str, Any]:
    th = _backends.torch()
    to_numpy = _api("to_numpy")
    t = th.arange(16, dtype=th.float32)
    _expect_equal(t.numpy(), "to_numpy")(to_numpy(t))
    cases = {"to_numpy": lambda: to_numpy(t), "numpy.from_dlpack": lambda: np.from_dlpack(t)}
    return {"size": "16 float32", **_per_call_fields("to_numpy", "numpy.from_dlpack", cases, ctx)}


def _row_to_torch_us(ctx: BenchContext) -> dict[str, Any]:
    th = _backends.torch()
    to_torch = _api("to_torch")
    a = np.arange(16, dtype=np.float32)
    _expect_equal(a, "to_torch")(to_torch(a).numpy())
    cases = {"to_torch": lambda: to_torch(a), "torch.from_dlpack": lambda: th.from_dlpack(a)}
    return {"size": "16 float32", **_per_call_fields("to_torch", "torch.from_dlpack", cases, ctx)}


def _row_host_copy(ctx: BenchContext) -> dict[str, Any]:
    th = _backends.torch()
    copy_to_host = _api("copy_to_host")
    n = ctx.sizes.host_bytes // 4
    t = th.rand(n, dtype=th.float32)
    src = t.numpy()
    out = np.full(n, np.nan, np.float32)  # touched, poisoned
    got = measure(
        {
            "copy_to_host": Case(
                lambda: copy_to_host(t, out), src.nbytes, _expect_equal(src, "copy_to_host")
            ),
            "numpy.copyto": Case(lambda: np.copyto(out, src), src.nbytes),
        },
        3 * ctx.sizes.repeats,  # a copy takes milliseconds: more repeats, same cost
        release=_collect_garbage,
    )
    ours, anchor = got["copy_to_host"], got["numpy.copyto"]
    ratio = _ratio(ours.gbps, anchor.gbps)
    return {
        "size": f"{src.nbytes / MiB:.0f} MiB float32",
        "gbps": ours.gbps,
        "anchors": {"numpy.copyto GB/s": anchor.gbps},
        "ratios": {"vs numpy.copyto": ratio},
        "met": ratio is not None and ratio >= 1.0,
        "memory": {"extra_host_rss_bytes": ours.extra_host_bytes},
        "samples": {label: m.record() for label, m in got.items()},
    }


def save_npy_rss_child(nbytes: int, path: str) -> dict[str, Any]:
    """The measured part of ``save_npy_rss``, run in a fresh process.

    Makes a touched CPU tensor, warms ``save_npy`` up on a small slice, then
    measures the peak resident growth while saving the whole tensor, and
    checks the file.
    """
    import torch

    import interop

    t = torch.rand(nbytes // 4, dtype=torch.float32)
    interop.save_npy(t[:1024], path)  # imports and first-use allocations done
    gc.collect()
    with PeakRss() as rss:
        start = time.perf_counter()
        interop.save_npy(t, path)
        seconds = time.perf_counter() - start
    checked = bool(np.array_equal(np.load(path, mmap_mode="r"), t.numpy()))
    return {
        "extra_rss_bytes": rss.extra_bytes,
        "method": rss.method,
        "seconds": seconds,
        "nbytes": t.numel() * 4,
        "checked": checked,
    }


_CHILD = (
    "import json, sys; from interop.bench import save_npy_rss_child; "
    "print(json.dumps(save_npy_rss_child(int(sys.argv[1]), sys.argv[2])))"
)


def _row_save_npy_rss(ctx: BenchContext) -> dict[str, Any]:
    bound = 2 * config.num_buffers * config.chunk_bytes
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    env.update({f"INTEROP_{k.upper()}": str(v) for k, v in config.as_dict().items()})
    with tempfile.TemporaryDirectory(dir=ctx.workdir) as tmp:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, str(ctx.sizes.rss_bytes), str(Path(tmp) / "rss.npy")],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"the measuring process failed: {proc.stderr.strip()[-500:]}")
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    if not child["checked"]:
        raise WrongResultError("save_npy wrote a file that differs from the tensor")
    extra = child["extra_rss_bytes"]
    if extra is None:
        raise RuntimeError("peak RSS cannot be measured here (needs Linux /proc)")
    ratio = _ratio(extra, bound)
    return {
        "size": f"{child['nbytes'] / MiB:.0f} MiB float32",
        "gbps": child["nbytes"] / child["seconds"] / GB,
        "anchors": {"2 x num_buffers x chunk_bytes bytes": bound},
        "ratios": {"extra RSS vs bound": ratio},
        "met": extra <= bound,
        "memory": {
            "extra_host_rss_bytes": extra,
            "bound_bytes": bound,
            "rss_method": child["method"],
        },
        "samples": {"save_npy": {"seconds": [child["seconds"]], "result_checked": True}},
    }


# ----------------------------------------------------------------- GPU rows


def _size(g: _Gpu) -> str:
    return f"{g.nbytes / GiB:.2f} GiB float32"


def _records(got: dict[str, Measured]) -> dict[str, Any]:
    return {label: m.record() for label, m in got.items()}


def _row_d2h_limit(ctx: BenchContext) -> dict[str, Any]:
    g = ctx.gpu()
    got = g.measure({"cudaMemcpyAsync": g.d2h_limit_case()}, ctx.sizes.repeats)
    return {
        "size": _size(g),
        "gbps": got["cudaMemcpyAsync"].gbps,
        "met": None,
        "samples": _records(got),
    }


def _row_d2h_prealloc(ctx: BenchContext) -> dict[str, Any]:
    g = ctx.gpu()
    cp = g.cp
    copy_to_host = _api("copy_to_host")
    out = np.full(g.ref.shape, np.nan, np.float32)  # pageable, touched, poisoned
    check = _expect_equal(g.ref, "copy_to_host(x, out)")
    cases = {
        "d2h_limit": g.d2h_limit_case(),
        "copy_to_host(x, out)": Case(lambda: copy_to_host(g.x, out), g.nbytes, check),
        "copy_to_host(t, out)": Case(
            lambda: copy_to_host(g.t, out), g.nbytes, check, lambda: out.fill(np.nan)
        ),
        "cupy.asnumpy(x, out=out)": Case(lambda: cp.asnumpy(g.x, out=out), g.nbytes),
        "cupy.asnumpy(x, out=pinned)": Case(lambda: cp.asnumpy(g.x, out=g.ref), g.nbytes),
        "t.to('cpu', non_blocking=True)+sync": Case(
            lambda: g.t.to("cpu", non_blocking=True), g.nbytes
        ),
    }
    got = g.measure(cases, ctx.sizes.repeats)
    ours, limit = got["copy_to_host(x, out)"], got["d2h_limit"].gbps
    ratios = {f"{label} vs d2h_limit": _ratio(m.gbps, limit) for label, m in got.items()}
    del ratios["d2h_limit vs d2h_limit"]
    return {
        "size": _size(g),
        "gbps": ours.gbps,
        "variants": {"copy_to_host(t, out) GB/s": got["copy_to_host(t, out)"].gbps},
        "anchors": {
            f"{label} GB/s": m.gbps
            for label, m in got.items()
            if not label.startswith(("copy_to_host", "d2h_limit"))
        }
        | {"d2h_limit GB/s": limit},
        "ratios": ratios,
        "met": ours.gbps >= 0.90 * limit,
        "memory": {
            "extra_device_bytes": ours.extra_device_bytes,
            "extra_host_rss_bytes": ours.extra_host_bytes,
            "ring_bytes": config.num_buffers * config.chunk_bytes,
        },
        "samples": _records(got),
    }


def _row_d2h_fresh(ctx: BenchContext) -> dict[str, Any]:
    g = ctx.gpu()
    cp = g.cp
    copy_to_host = _api("copy_to_host")
    cases = {
        "d2h_limit": g.d2h_limit_case(),
        "copy_to_host(x)": Case(
            lambda: copy_to_host(g.x), g.nbytes, _expect_equal(g.ref, "copy_to_host(x)")
        ),
        "cupy.asnumpy(x)": Case(lambda: cp.asnumpy(g.x), g.nbytes),
        "t.cpu().numpy()": Case(lambda: g.t.cpu().numpy(), g.nbytes),
    }
    got = g.measure(cases, ctx.sizes.repeats)
    ours = got["copy_to_host(x)"]
    asnumpy, tcpu = got["cupy.asnumpy(x)"], got["t.cpu().numpy()"]
    return {
        "size": _size(g),
        "gbps": ours.gbps,
        "anchors": {
            "cupy.asnumpy(x) GB/s": asnumpy.gbps,
            "t.cpu().numpy() GB/s": tcpu.gbps,
            "d2h_limit GB/s": got["d2h_limit"].gbps,
        },
        "ratios": {
            "vs cupy.asnumpy(x)": _ratio(ours.gbps, asnumpy.gbps),
            "vs t.cpu().numpy()": _ratio(ours.gbps, tcpu.gbps),
            "vs d2h_limit": _ratio(ours.gbps, got["d2h_limit"].gbps),
        },
        "met": ours.gbps >= 2 * asnumpy.gbps and ours.gbps >= 2 * tcpu.gbps,
        "memory": {
            "extra_device_bytes": ours.extra_device_bytes,
            "extra_host_rss_bytes": ours.extra_host_bytes,
            "out_bytes": g.nbytes,
            "ring_bytes": config.num_buffers * config.chunk_bytes,
        },
        "samples": _records(got),
    }


def _row_d2h_strided(ctx: BenchContext) -> dict[str, Any]:
    g = ctx.gpu()
    cp = g.cp
    copy_to_host = _api("copy_to_host")
    side = math.isqrt(g.nbytes // 4)
    square = g.x[: side * side].reshape(side, side).T  # a transposed view, no copy
    reference = g.ref[: side * side].reshape(side, side).T
    out = np.full((side, side), np.nan, np.float32)
    contiguous = g.x[: side * side].reshape(side, side)
    square_t = g.t[: side * side].view(side, side).T  # the same values, a torch source
    nbytes = side * side * 4
    cases = {
        "copy_to_host(x.T, out)": Case(
            lambda: copy_to_host(square, out), nbytes, _expect_equal(reference, "copy_to_host(x.T)")
        ),
        "copy_to_host(t.T, out)": Case(
            lambda: copy_to_host(square_t, out),
            nbytes,
            _expect_equal(reference, "copy_to_host(t.T)"),
            lambda: out.fill(np.nan),
        ),
        "copy_to_host(x, out)": Case(lambda: copy_to_host(contiguous, out), nbytes),
        "cupy.asnumpy(x.T, out=out)": Case(lambda: cp.asnumpy(square, out=out), nbytes),
    }
    got = g.measure(cases, ctx.sizes.repeats)
    ours, prealloc = got["copy_to_host(x.T, out)"], got["copy_to_host(x, out)"]
    of_torch = got["copy_to_host(t.T, out)"]
    ring = config.num_buffers * config.chunk_bytes
    extra, extra_torch = ours.extra_device_bytes, of_torch.extra_device_bytes
    slowest = min(ours.gbps, of_torch.gbps)
    most = None if extra is None or extra_torch is None else max(extra, extra_torch)
    return {
        "size": f"{side}x{side} float32, transposed",
        "gbps": ours.gbps,
        "variants": {"copy_to_host(t.T, out) GB/s": of_torch.gbps},
        "anchors": {
            "copy_to_host(x, out) GB/s (d2h_prealloc)": prealloc.gbps,
            "cupy.asnumpy(x.T, out=out) GB/s": got["cupy.asnumpy(x.T, out=out)"].gbps,
        },
        "ratios": {
            "vs d2h_prealloc": _ratio(ours.gbps, prealloc.gbps),
            "copy_to_host(t.T, out) vs d2h_prealloc": _ratio(of_torch.gbps, prealloc.gbps),
        },
        # The target holds for both kinds of source.
        "met": slowest >= 0.80 * prealloc.gbps and most is not None and most <= ring,
        "memory": {
            "extra_device_bytes": extra,
            "copy_to_host(t.T) extra_device_bytes": extra_torch,
            "ring_bytes": ring,
            "cupy.asnumpy(x.T) extra_device_bytes": got[
                "cupy.asnumpy(x.T, out=out)"
            ].extra_device_bytes,
            "extra_host_rss_bytes": ours.extra_host_bytes,
        },
        "samples": _records(got),
    }


def _h2d_limit_case(g: _Gpu, dst: Any) -> Case:
    kind = g.cp.cuda.runtime.memcpyHostToDevice
    return Case(lambda: g.memcpy(dst.data.ptr, g.ref.ctypes.data, kind), g.nbytes)


def _row_h2d_limit(ctx: BenchContext) -> dict[str, Any]:
    g = ctx.gpu()
    dst = g.cp.empty_like(g.x)
    got = g.measure({"cudaMemcpyAsync": _h2d_limit_case(g, dst)}, ctx.sizes.repeats)
    if not bool(g.cp.array_equal(dst, g.x)):
        raise WrongResultError("the pinned-to-device cudaMemcpyAsync returned wrong data")
    return {
        "size": _size(g),
        "gbps": got["cudaMemcpyAsync"].gbps,
        "met": None,
        "samples": _records(got),
    }


def _row_h2d_pageable(ctx: BenchContext) -> dict[str, Any]:
    g = ctx.gpu()
    cp, th = g.cp, g.th
    copy_to_device = _api("copy_to_device")
    host = np.array(g.ref)  # pageable, touched
    dst = cp.empty_like(g.x)
    out = cp.full_like(g.x, cp.nan)  # poisoned

    def on_device(result: Any) -> None:
        if not bool(cp.array_equal(result, g.x)):
            raise WrongResultError("copy_to_device returned data that differs from the source")

    cases = {
        "h2d_limit": _h2d_limit_case(g, dst),
        "copy_to_device(host)": Case(lambda: copy_to_device(host), g.nbytes, on_device),
        "copy_to_device(host, out)": Case(lambda: copy_to_device(host, out), g.nbytes, on_device),
        "cupy.asarray(host)": Case(lambda: cp.asarray(host), g.nbytes),
        "torch.from_numpy(host).cuda()": Case(lambda: th.from_numpy(host).cuda(), g.nbytes),
    }
    got = g.measure(cases, ctx.sizes.repeats)
    ours, limit = got["copy_to_device(host)"], got["h2d_limit"].gbps
    ring = config.num_buffers * config.chunk_bytes
    extra = ours.extra_host_bytes
    return {
        "size": _size(g),
        "gbps": ours.gbps,
        "variants": {"copy_to_device(host, out) GB/s": got["copy_to_device(host, out)"].gbps},
        "anchors": {
            f"{label} GB/s": m.gbps
            for label, m in got.items()
            if not label.startswith(("copy_to_device", "h2d_limit"))
        }
        | {"h2d_limit GB/s": limit},
        "ratios": {
            "vs h2d_limit": _ratio(ours.gbps, limit),
            "copy_to_device(host, out) vs h2d_limit": _ratio(
                got["copy_to_device(host, out)"].gbps, limit
            ),
            "vs cupy.asarray(host)": _ratio(ours.gbps, got["cupy.asarray(host)"].gbps),
        },
        "met": ours.gbps >= 0.90 * limit and extra is not None and extra <= ring,
        "memory": {
            "extra_host_rss_bytes": extra,
            "ring_bytes": ring,
            "cupy.asarray(host) extra_host_rss_bytes": got["cupy.asarray(host)"].extra_host_bytes,
            "extra_device_bytes": ours.extra_device_bytes,
        },
        "samples": _records(got),
    }


def _row_exchange_us(ctx: BenchContext) -> dict[str, Any]:
    g = ctx.gpu()
    cp, th = g.cp, g.th
    to_cupy, to_torch = _api("to_cupy"), _api("to_torch")
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
    g.sync()
    r_cupy = _ratio(got["to_cupy(t)"].us, got["cupy.from_dlpack(t)"].us)
    r_torch = _ratio(got["to_torch(c)"].us, got["torch.from_dlpack(c)"].us)
    return {
        "size": "16 float32",
        "us": {"to_cupy(t)": got["to_cupy(t)"].us, "to_torch(c)": got["to_torch(c)"].us},
        "anchors": {
            "cupy.from_dlpack(t) us": got["cupy.from_dlpack(t)"].us,
            "torch.from_dlpack(c) us": got["torch.from_dlpack(c)"].us,
        },
        "ratios": {"to_cupy vs cupy.from_dlpack": r_cupy, "to_torch vs torch.from_dlpack": r_torch},
        "met": r_cupy is not None and r_torch is not None and r_cupy <= 1.5 and r_torch <= 1.5,
        "samples": _records(got),
    }


def _row_save_npy(ctx: BenchContext) -> dict[str, Any]:
    g = ctx.gpu()
    save_npy = _api("save_npy")
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
            "save_npy(x, path)": Case(lambda: save_npy(g.x, path), g.nbytes, saved),
        }
        got = g.measure(cases, ctx.sizes.repeats)
    ours = got["save_npy(x, path)"]
    limit = min(got["d2h_limit"].gbps, got["file write"].gbps)
    ratio = _ratio(ours.gbps, limit)
    return {
        "size": _size(g),
        "gbps": ours.gbps,
        "anchors": {
            "sequential file write GB/s": got["file write"].gbps,
            "d2h_limit GB/s": got["d2h_limit"].gbps,
        },
        "ratios": {"vs min(d2h_limit, file write)": ratio},
        "met": ratio is not None and ratio >= 0.80,
        "memory": {
            "extra_host_rss_bytes": ours.extra_host_bytes,
            "extra_device_bytes": ours.extra_device_bytes,
            "ring_bytes": config.num_buffers * config.chunk_bytes,
        },
        "directory": str(ctx.workdir),
        "samples": _records(got),
    }


# ----------------------------------------------------------------- the rows


@dataclasses.dataclass(frozen=True)
class RowSpec:
    """One row of SPEC §5.

    Attributes
    ----------
    name, what, target : str
        As in the SPEC's tables.
    needs : tuple of str
        The ``interop`` functions the row measures; missing ones make the row
        ``"not available"``.
    gpu : bool
        Needs a CUDA device visible to both CuPy and PyTorch.
    run : callable
        Measures the row; returns its fields.
    """

    name: str
    what: str
    target: str
    needs: tuple[str, ...]
    gpu: bool
    run: Callable[[BenchContext], dict[str, Any]]


ROWS: tuple[RowSpec, ...] = (
    RowSpec(
        "to_numpy_us",
        "interop.to_numpy(small CPU tensor), per call",
        "<= 2 x numpy.from_dlpack",
        ("to_numpy",),
        False,
        _row_to_numpy_us,
    ),
    RowSpec(
        "to_torch_us",
        "interop.to_torch(small NumPy array), per call",
        "<= 2 x torch.from_dlpack",
        ("to_torch",),
        False,
        _row_to_torch_us,
    ),
    RowSpec(
        "host_copy",
        "copy_to_host(cpu_tensor, out)",
        ">= 1.0 x one numpy.copyto",
        ("copy_to_host",),
        False,
        _row_host_copy,
    ),
    RowSpec(
        "save_npy_rss",
        "peak extra RSS while saving a CPU tensor with save_npy (fresh process)",
        "<= 2 x num_buffers x chunk_bytes",
        ("save_npy",),
        False,
        _row_save_npy_rss,
    ),
    RowSpec(
        "d2h_limit",
        "one cudaMemcpyAsync of the whole array into a pinned buffer",
        "the link's limit (reference)",
        (),
        True,
        _row_d2h_limit,
    ),
    RowSpec(
        "d2h_prealloc",
        "copy_to_host(x, out), out pageable and already touched",
        ">= 0.90 x d2h_limit",
        ("copy_to_host",),
        True,
        _row_d2h_prealloc,
    ),
    RowSpec(
        "d2h_fresh",
        "copy_to_host(x), allocating out",
        ">= 2 x cupy.asnumpy(x) and >= 2 x t.cpu().numpy()",
        ("copy_to_host",),
        True,
        _row_d2h_fresh,
    ),
    RowSpec(
        "d2h_strided",
        "copy_to_host(x.T, out), transposed source",
        ">= 0.80 x d2h_prealloc; extra device memory <= num_buffers x chunk_bytes",
        ("copy_to_host",),
        True,
        _row_d2h_strided,
    ),
    RowSpec(
        "h2d_limit",
        "one cudaMemcpyAsync of the whole array from a pinned buffer",
        "the link's limit (reference)",
        (),
        True,
        _row_h2d_limit,
    ),
    RowSpec(
        "h2d_pageable",
        "copy_to_device(host), host pageable",
        ">= 0.90 x h2d_limit; extra host memory <= num_buffers x chunk_bytes",
        ("copy_to_device",),
        True,
        _row_h2d_pageable,
    ),
    RowSpec(
        "exchange_us",
        "to_cupy(t) / to_torch(c) per call, small CUDA arrays",
        "<= 1.5 x cupy.from_dlpack(t) / torch.from_dlpack(c)",
        ("to_cupy", "to_torch"),
        True,
        _row_exchange_us,
    ),
    RowSpec(
        "save_npy",
        "save_npy(device array, path)",
        ">= 0.80 x min(d2h_limit, sequential file-write rate)",
        ("save_npy",),
        True,
        _row_save_npy,
    ),
)


# ----------------------------------------------------------------- driver


def _gpu_unavailable() -> str | None:
    """Why the GPU rows cannot run here, or None when they can."""
    try:
        _backends.require_cupy_device()
        _backends.require_torch_cuda()
    except NoDeviceError as exc:
        return f"no CUDA device: {str(exc).split(';')[0]}"
    except BackendUnavailableError as exc:
        return f"no CUDA device usable: {exc}"
    return None


def _host_unavailable() -> str | None:
    try:
        _backends.torch()
    except BackendUnavailableError as exc:
        return f"PyTorch is not installed: {exc}"
    return None


def _device_name() -> str:
    if _gpu_unavailable() is not None:
        return "no CUDA device"
    cp = _backends.cupy()
    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(
            ["git", *args],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parent,
            check=False,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _run_row(
    spec: RowSpec, ctx: BenchContext, gpu_reason: str | None, host_reason: str | None
) -> dict[str, Any]:
    """One row's result: measured, or skipped / not available / error with the reason."""
    row: dict[str, Any] = {"name": spec.name, "what": spec.what, "target": spec.target}
    interop = importlib.import_module("interop")
    missing = [name for name in spec.needs if not hasattr(interop, name)]
    reason = gpu_reason if spec.gpu else host_reason
    if missing:
        names = ", ".join(f"interop.{name}" for name in missing)
        return row | {
            "status": "not available",
            "reason": f"{names} not in this build",
            "met": None,
        }
    if reason is not None:
        return row | {"status": "skipped", "reason": reason, "met": None}
    try:
        fields = spec.run(ctx)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        fields = {"status": "error", "reason": f"{type(exc).__name__}: {exc}", "met": None}
    else:
        fields = {"status": "ok"} | fields
    try:
        ctx.release()
    except Exception as exc:  # e.g. a sticky CUDA error: later rows report theirs
        traceback.print_exc(file=sys.stderr)
        ctx.notes.setdefault("release_errors", []).append(
            f"after {spec.name}: {type(exc).__name__}: {exc}"
        )
    return row | fields


def collect_results(
    sizes: BenchSizes,
    rows: tuple[RowSpec, ...] = ROWS,
    workdir: str | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run ``rows`` and return the results with the run's context.

    Parameters
    ----------
    sizes : BenchSizes
        Sizes, loop counts and repeats.
    rows : tuple of RowSpec
        The rows to run, in order (default: all of SPEC §5).
    workdir : str, optional
        Where file rows write (default ``INTEROP_BENCH_DIR`` or the system
        temporary directory).
    on_row : callable, optional
        Called after each row with the results so far (the same form as the
        return value, plus ``"partial": True``), e.g. to save them, so that a
        run that dies in a later row keeps the rows already measured.

    Returns
    -------
    dict
        ``device``, ``date`` (UTC, ISO 8601), ``commit``, ``config``,
        ``versions``, ``sizes`` and ``rows`` (one dict per row with ``name``,
        ``what``, ``target``, ``status`` and, when it ran, its figures,
        ``anchors``, ``ratios`` and ``met``).
    """
    from .info import collect_info

    directory = Path(workdir or os.environ.get("INTEROP_BENCH_DIR") or tempfile.gettempdir())
    gpu_reason, host_reason = _gpu_unavailable(), _host_unavailable()
    started = datetime.datetime.now(datetime.timezone.utc)
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    header = {
        "schema": SCHEMA,
        "device": _device_name(),
        "date": started.isoformat(timespec="seconds"),
        "commit": _git("rev-parse", "HEAD") or "unknown",
        "commit_dirty": None if dirty is None else bool(dirty),
        "config": config.as_dict(),
        "sizes": dataclasses.asdict(sizes),
        "cpu_count": os.cpu_count(),
        "versions": collect_info(),
    }
    ctx = BenchContext(sizes, directory)
    results: list[dict[str, Any]] = []
    try:
        for spec in rows:
            start = time.perf_counter()
            results.append(_run_row(spec, ctx, gpu_reason, host_reason))
            print(
                f"interop bench: {spec.name} {results[-1]['status']} "
                f"({time.perf_counter() - start:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
            if on_row is not None:
                on_row(header | {"notes": ctx.notes, "rows": list(results), "partial": True})
    finally:
        try:
            ctx.close()
        except Exception as exc:  # the results are kept; the failure is reported
            traceback.print_exc(file=sys.stderr)
            ctx.notes["close_error"] = f"{type(exc).__name__}: {exc}"
    return header | {"notes": ctx.notes, "rows": results}


def _num(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def _figure(row: dict[str, Any]) -> str:
    if "gbps" in row:
        return f"{row['gbps']:.2f} GB/s"
    us = row.get("us")
    if isinstance(us, dict):
        return ", ".join(f"{_num(v)} us" for v in us.values())
    return f"{_num(us)} us" if us is not None else ""


def format_table(results: dict[str, Any]) -> str:
    """The printed form of :func:`collect_results`'s result."""
    cfg = results["config"]
    sizes = results["sizes"]
    lines = [
        f"interop bench on {results['device']}, {results['date']}, "
        f"commit {results['commit'][:12]}{' (dirty)' if results.get('commit_dirty') else ''}",
        f"config: chunk_bytes {cfg['chunk_bytes'] / MiB:g} MiB, num_buffers {cfg['num_buffers']}, "
        f"host_threads {cfg['host_threads']}; median of {sizes['repeats']} repeats "
        f"(first call untimed); scale {sizes['scale']:g}",
        f"{'row':<14} {'figure':<22} {'met':<7} ratios (same run)",
    ]
    for row in results["rows"]:
        if row["status"] != "ok":
            lines.append(f"{row['name']:<14} {row['status']}: {row['reason']}")
            continue
        met = {True: "met", False: "MISSED", None: "-"}[row["met"]]
        ratios = "; ".join(
            f"{k} {v:.2f}" if v is not None else f"{k} n/a"
            for k, v in row.get("ratios", {}).items()
        )
        memory = row.get("memory", {})
        extra = [
            f"{k.replace('_bytes', '')} {v / MiB:.0f} MiB"
            for k, v in memory.items()
            if k.endswith("_bytes") and isinstance(v, int)
        ]
        lines.append(f"{row['name']:<14} {_figure(row):<22} {met:<7} {ratios}")
        lines.append(
            f"{'':<14} target {row['target']}" + (f"; {', '.join(extra)}" if extra else "")
        )
    counts: dict[str, int] = {}
    for row in results["rows"]:
        key = (
            row["status"]
            if row["status"] != "ok"
            else {True: "met", False: "missed"}.get(row["met"], "reference")
        )
        counts[key] = counts.get(key, 0) + 1
    if results.get("notes", {}).get("pinned_pages_in_rss") is False:
        lines.append(
            "note: this driver does not count pinned pages in RSS; "
            "extra host memory of GPU rows is pageable memory only"
        )
    lines.append("summary: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    return "\n".join(lines)


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, inf) replaced by None, for strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_json(results: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``results`` as indented JSON to ``path`` (parents created); returns the path.

    Non-finite floats are written as ``null``, so the file is strict JSON and
    a stray NaN cannot lose a run's results.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_finite(results), indent=2, allow_nan=False, default=str)
    target.write_text(text + "\n")
    return target


def run_bench(quick: bool = False, json_path: str | None = None) -> int:
    """Run the benchmark rows of SPEC §5, print a table, optionally write JSON.

    Parameters
    ----------
    quick : bool
        Small sizes and few repeats: a smoke run, not a measurement.
    json_path : str, optional
        Where to write the results as JSON.

    Returns
    -------
    int
        The exit status: 0 when every row ran or was skipped for a stated
        reason (a missed target is a result, not a failure), 1 when a row
        raised or returned wrong data (its traceback is on stderr), 2 for a
        bad ``INTEROP_BENCH_SCALE``.

    Notes
    -----
    With ``json_path`` the file is rewritten after every row with the rows so
    far and ``"partial": true``, so a run that dies keeps what it measured;
    the final file has no ``partial`` key. Each row's status and duration go
    to stderr as it finishes.
    """
    try:
        sizes = BenchSizes.choose(quick, _scale_from_env())
    except ValueError as exc:
        print(f"interop bench: {exc}", file=sys.stderr)
        return 2

    def save_partial(partial: dict[str, Any]) -> None:
        if json_path:
            write_json(partial | {"quick": quick}, json_path)

    results = collect_results(sizes, on_row=save_partial)
    results["quick"] = quick
    print(format_table(results))
    if quick:
        print("(--quick: small sizes, a smoke run, not a measurement)")
    if json_path:
        print(f"wrote {write_json(results, json_path)}")
    return 1 if any(row["status"] == "error" for row in results["rows"]) else 0
