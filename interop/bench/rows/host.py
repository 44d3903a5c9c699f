"""Host rows: they run on any machine with PyTorch, GPU or not. Each returns its measured
fields: the figure (``us`` or ``gbps``), ``anchors``, ``ratios``, ``memory``, ``samples``."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

import interop

from ... import _backends
from ...config import chunk_bytes_or_default, config, host_copy_threads
from ..context import BenchContext
from ..measure import Case, Measured, MiB, PeakRss, WrongResultError, expect_equal, measure
from ..results import Ratio


def records(got: dict[str, Measured]) -> dict[str, Any]:
    """The JSON ``samples`` of a row: every case's :meth:`Measured.record`."""
    return {label: m.record() for label, m in got.items()}


def per_call_row(
    ctx: BenchContext, pairs: dict[str, str], calls: dict[str, Callable[[], Any]]
) -> dict[str, Any]:
    """Per-call latency of 16-float arrays, timeit-style (garbage collection off): each of
    ours (``pairs``' keys) against its anchor, ``ctx.sizes.calls`` calls per repeat after a
    tenth of them untimed, interleaved; ``us`` a number for one pair, by call for more."""
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
        "samples": records(got),
    }


def to_numpy_us(ctx: BenchContext) -> dict[str, Any]:
    """``to_numpy`` of a 16-float CPU tensor, per call, against ``numpy.from_dlpack``."""
    t = _backends.torch().arange(16, dtype=_backends.torch().float32)
    expect_equal(t.numpy(), "to_numpy")(interop.to_numpy(t))
    calls = {
        "to_numpy": lambda: interop.to_numpy(t),
        "numpy.from_dlpack": lambda: np.from_dlpack(t),
    }
    return per_call_row(ctx, {"to_numpy": "numpy.from_dlpack"}, calls)


def to_torch_us(ctx: BenchContext) -> dict[str, Any]:
    """``to_torch`` of a 16-float NumPy array, per call, against ``torch.from_dlpack``."""
    th = _backends.torch()
    a = np.arange(16, dtype=np.float32)
    expect_equal(a, "to_torch")(interop.to_torch(a).numpy())
    calls = {
        "to_torch": lambda: interop.to_torch(a),
        "torch.from_dlpack": lambda: th.from_dlpack(a),
    }
    return per_call_row(ctx, {"to_torch": "torch.from_dlpack"}, calls)


def host_copy_cases(nbytes: int) -> tuple[dict[str, Case], int]:
    """``copy_to_host(t, out)`` and ``numpy.copyto`` into one ``out`` (also what the sweep
    times); and the bytes each call moves."""
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
    # a copy takes milliseconds: more repeats for the same cost
    got = measure(cases, 3 * ctx.sizes.repeats, release=gc.collect)
    ours, anchor = got["copy_to_host"].gbps, got["numpy.copyto"].gbps
    return {
        "size": f"{nbytes / MiB:.0f} MiB float32",
        "gbps": ours,
        "anchors": {"numpy.copyto GB/s": anchor},
        "ratios": [Ratio.between("copy_to_host", "throughput", "numpy.copyto", ours, anchor)],
        "memory": {"extra_host_rss_bytes": got["copy_to_host"].extra_host_bytes},
        "threads": host_copy_threads(),
        "samples": records(got),
    }


def _numpy_copy(t: Any) -> np.ndarray:
    return t.numpy().copy()


def host_fresh(ctx: BenchContext) -> dict[str, Any]:
    """``copy_to_host(t)`` allocating ``out``, against ``t.numpy().copy()``, at 1 MiB,
    16 MiB and the ``host_copy`` size (256 MiB at scale 1); the figure is the largest's."""
    sizes = sorted({MiB, min(16 * MiB, ctx.sizes.host_bytes), ctx.sizes.host_bytes})
    at = [f"{n / MiB:.0f} MiB" for n in sizes]
    got: dict[str, Measured] = {}
    for nbytes, size in zip(sizes, at, strict=True):
        t = _backends.torch().rand(nbytes // 4)
        check = expect_equal(t.numpy(), "copy_to_host(t)")
        cases = {
            f"copy_to_host(t) {size}": Case(partial(interop.copy_to_host, t), nbytes, check),
            f"t.numpy().copy() {size}": Case(partial(_numpy_copy, t), nbytes),
        }
        got |= measure(cases, 3 * ctx.sizes.repeats, release=gc.collect)
    ours = {a: got[f"copy_to_host(t) {a}"].gbps for a in at}
    anchor = {a: got[f"t.numpy().copy() {a}"].gbps for a in at}
    return {
        "size": ", ".join(at) + " float32",
        "gbps": ours[at[-1]],
        "by_size_gbps": ours,
        "anchors": {f"t.numpy().copy() {a} GB/s": anchor[a] for a in at},
        "ratios": [
            Ratio.between(f"copy_to_host(t) {a}", "throughput", f"t.numpy().copy() {a}", *pair)
            for a, pair in ((a, (ours[a], anchor[a])) for a in at)
        ],
        "memory": {"extra_host_rss_bytes": got[f"copy_to_host(t) {at[-1]}"].extra_host_bytes},
        "samples": records(got),
    }


def save_npy_rss_child(nbytes: int, path: str) -> dict[str, Any]:
    """The measured part of ``save_npy_rss``, in a fresh process: the peak RSS growth while
    ``save_npy`` saves a touched CPU tensor (warmed up on a slice), and whether the file
    holds the tensor."""
    import torch

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
    "import json, sys; from interop.bench.rows.host import save_npy_rss_child; "
    "print(json.dumps(save_npy_rss_child(int(sys.argv[1]), sys.argv[2])))"
)


def save_npy_rss(ctx: BenchContext) -> dict[str, Any]:
    """Peak extra RSS of a fresh process while ``save_npy`` saves a CPU tensor."""
    ring = config.num_buffers * chunk_bytes_or_default(None)  # the 64 KiB floor applied
    bound = 2 * ring
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    env.update({f"INTEROP_{k.upper()}": str(v) for k, v in config.as_dict().items()})
    with tempfile.TemporaryDirectory(dir=ctx.workdir) as tmp:
        args = [sys.executable, "-c", _CHILD, str(ctx.sizes.rss_bytes), str(Path(tmp) / "rss.npy")]
        proc = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"the measuring process failed: {proc.stderr.strip()[-500:]}")
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    if not child["checked"]:
        raise WrongResultError("save_npy wrote a file that differs from the tensor")
    extra = child["extra_rss_bytes"]
    if extra is None:
        raise RuntimeError("peak RSS cannot be measured here (needs Linux /proc)")
    words = "the bound 2 x num_buffers x chunk_bytes"
    return {
        "size": f"{child['nbytes'] / MiB:.0f} MiB float32",
        "gbps": child["nbytes"] / child["seconds"] / 1e9,
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
