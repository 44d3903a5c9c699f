"""Host rows: they run on any machine with PyTorch, GPU or not.

Each row function takes the run's :class:`~interop.bench.context.BenchContext`
and returns its measured fields: the figure (``us`` or ``gbps``), ``anchors``,
``ratios`` (a list of :class:`~interop.bench.ratios.Ratio`, targets included),
``memory`` and ``samples``. Judging and reporting happen elsewhere.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ... import _backends
from ...config import chunk_bytes_or_default, config, host_copy_threads
from ..context import BenchContext
from ..measure import (
    Case,
    PeakRss,
    WrongResultError,
    collect_garbage,
    expect_equal,
    measure,
    measure_per_call,
)
from ..ratios import Ratio
from ..sizes import GB, MiB
from .api import api

__all__ = ["host_copy", "save_npy_rss", "save_npy_rss_child", "to_numpy_us", "to_torch_us"]


def _per_call(ours: str, anchor: str, cases: dict[str, Callable[[], Any]], ctx: BenchContext):
    """A per-call latency row: ``ours`` against ``anchor``, target at most 2x the time."""
    got = measure_per_call(cases, ctx.sizes.calls, ctx.sizes.repeats)
    return {
        "us": got[ours].us,
        "anchors": {f"{anchor} us": got[anchor].us},
        "ratios": [Ratio.between(ours, "time", anchor, got[ours].us, got[anchor].us, at_most=2.0)],
        "samples": {label: m.record() for label, m in got.items()},
    }


def to_numpy_us(ctx: BenchContext) -> dict[str, Any]:
    """``to_numpy`` of a 16-float CPU tensor, per call, against ``numpy.from_dlpack``."""
    th = _backends.torch()
    to_numpy = api("to_numpy")
    t = th.arange(16, dtype=th.float32)
    expect_equal(t.numpy(), "to_numpy")(to_numpy(t))
    cases = {"to_numpy": lambda: to_numpy(t), "numpy.from_dlpack": lambda: np.from_dlpack(t)}
    return {"size": "16 float32", **_per_call("to_numpy", "numpy.from_dlpack", cases, ctx)}


def to_torch_us(ctx: BenchContext) -> dict[str, Any]:
    """``to_torch`` of a 16-float NumPy array, per call, against ``torch.from_dlpack``."""
    th = _backends.torch()
    to_torch = api("to_torch")
    a = np.arange(16, dtype=np.float32)
    expect_equal(a, "to_torch")(to_torch(a).numpy())
    cases = {"to_torch": lambda: to_torch(a), "torch.from_dlpack": lambda: th.from_dlpack(a)}
    return {"size": "16 float32", **_per_call("to_torch", "torch.from_dlpack", cases, ctx)}


def host_copy_cases(nbytes: int) -> tuple[dict[str, Case], int]:
    """The cases of ``host_copy``: ``copy_to_host(t, out)`` and ``numpy.copyto`` into one ``out``.

    Returns the cases and the bytes each call moves (also used by the sweep).
    """
    th = _backends.torch()
    copy_to_host = api("copy_to_host")
    n = nbytes // 4
    t = th.rand(n, dtype=th.float32)
    src = t.numpy()
    out = np.full(n, np.nan, np.float32)  # touched, poisoned
    cases = {
        "copy_to_host": Case(
            lambda: copy_to_host(t, out), src.nbytes, expect_equal(src, "copy_to_host")
        ),
        "numpy.copyto": Case(lambda: np.copyto(out, src), src.nbytes),
    }
    return cases, src.nbytes


def host_copy(ctx: BenchContext) -> dict[str, Any]:
    """``copy_to_host(cpu_tensor, out)`` against one ``numpy.copyto`` into the same ``out``."""
    cases, nbytes = host_copy_cases(ctx.sizes.host_bytes)
    # a copy takes milliseconds: more repeats for the same cost
    got = measure(cases, 3 * ctx.sizes.repeats, release=collect_garbage)
    ours, anchor = got["copy_to_host"], got["numpy.copyto"]
    return {
        "size": f"{nbytes / MiB:.0f} MiB float32",
        "gbps": ours.gbps,
        "anchors": {"numpy.copyto GB/s": anchor.gbps},
        "ratios": [
            Ratio.between(
                "copy_to_host", "throughput", "numpy.copyto", ours.gbps, anchor.gbps, at_least=1.0
            )
        ],
        "memory": {"extra_host_rss_bytes": ours.extra_host_bytes},
        "threads": host_copy_threads(),
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
    return {
        "size": f"{child['nbytes'] / MiB:.0f} MiB float32",
        "gbps": child["nbytes"] / child["seconds"] / GB,
        "anchors": {"2 x num_buffers x chunk_bytes bytes": bound},
        "ratios": [
            Ratio.between(
                "extra host RSS of save_npy",
                "memory",
                "the bound 2 x num_buffers x chunk_bytes",
                extra,
                bound,
                at_most=1.0,
            )
        ],
        "memory": {
            "extra_host_rss_bytes": extra,
            "bound_bytes": bound,
            "ring_bytes": ring,
            "rss_method": child["method"],
        },
        "samples": {"save_npy": {"seconds": [child["seconds"]], "result_checked": True}},
    }
