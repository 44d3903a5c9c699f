"""The lab's run: the package's rows with their diagnoses, the lab's own rows, verdicts.

``python -m benchmarks run`` measures every row of ``python -m interop bench``
(with the stages, traces and profiles of :mod:`benchmarks.diagnostics`) and
the rows that need more than the package: ``host_limit`` (the ring's
ceilings), ``dask_save_npy`` (a ``distributed.LocalCluster``),
``dask_save_npy_cupy`` and ``torch_op_us``; then judges every row against
its targets (:mod:`benchmarks.targets`). The results file has the package's
layout, so the same readers (the plot, ``keep``) read both.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from benchmarks.dask_save import (
    cluster_unavailable,
    dask_save_npy,
    dask_save_npy_cupy,
    dask_unavailable,
)
from benchmarks.diagnostics import diagnosed
from benchmarks.emulated_overlap import emulated_overlap
from benchmarks.host_limit import host_limit
from benchmarks.report import format_report
from benchmarks.targets import RunJudge
from interop.bench.results import Ratio, gpu_unavailable
from interop.bench.rows import ROWS, BenchContext, RowSpec
from interop.bench.run import run_bench
from interop.info import install_command

#: The module that measures ``torch_op_us``, and the call it compares with.
TORCH_OP_MODULE = "benchmarks.torch_op_overhead"
HAND = "a hand-written torch.library.custom_op"


def torch_op_unavailable() -> str | None:
    """Why ``torch_op_us`` cannot run: PyTorch, or its measuring module, is missing."""
    if importlib.util.find_spec("torch") is None:
        return f"PyTorch is not installed: {install_command('torch')}"
    if importlib.util.find_spec(TORCH_OP_MODULE) is None:
        return "benchmarks/torch_op_overhead.py is not in this checkout"
    return None


def torch_op_us(ctx: BenchContext) -> dict[str, Any]:
    """An ``interop.torch_op`` call against a hand-written ``torch.library.custom_op`` doing
    its own DLPack exchange, per call, on CUDA where usable (else the CPU).

    Measured by ``benchmarks.torch_op_overhead.measure`` in interleaved blocks of a
    quarter of the per-call rows' calls.
    """
    device = "cpu" if gpu_unavailable() is not None else "cuda"
    calls = max(100, ctx.sizes.calls // 4)
    module = importlib.import_module(TORCH_OP_MODULE)
    got = module.measure(calls, repeats=ctx.sizes.repeats, device=device)
    ours, hand = got["interop_us"], got["custom_op_us"]
    return {
        "size": f"{got['size']}, {device}",
        "us": ours,
        "anchors": {f"{HAND} us": hand},
        "ratios": [Ratio.between("interop.torch_op", "time", HAND, ours, hand)],
        "samples": {
            label: {"seconds": [us * calls / 1e6 for us in per_call], "calls": calls}
            for label, per_call in got["samples"].items()
        },
    }


def _rows() -> tuple[RowSpec, ...]:
    host = [diagnosed(spec) for spec in ROWS if not spec.gpu]
    gpu = [diagnosed(spec) for spec in ROWS if spec.gpu]
    return (
        *host,
        RowSpec(
            "host_limit",
            "host copies by 1-16 threads, one whole chunk each, alone and with the link "
            "busy; cudaHostRegister rates",
            False,
            host_limit,
        ),
        RowSpec(
            "emulated_overlap",
            "copy_to_host(x, out) through the emulated device's 2 GB/s link: the overlap "
            "of its DMAs with its host copies, on any machine",
            False,
            emulated_overlap,
        ),
        RowSpec(
            "dask_save_npy",
            "interop.dask.save_npy of NumPy blocks persisted on a distributed.LocalCluster "
            "of 2 worker processes (1 thread each)",
            False,
            dask_save_npy,
            unavailable=cluster_unavailable,
        ),
        *gpu,
        RowSpec(
            "torch_op_us",
            "an interop.torch_op call, per call",
            False,
            torch_op_us,
            "us",
            unavailable=torch_op_unavailable,
        ),
        RowSpec(
            "dask_save_npy_cupy",
            "interop.dask.save_npy of CuPy blocks on the threaded scheduler (2 threads)",
            True,
            dask_save_npy_cupy,
            unavailable=dask_unavailable,
        ),
    )


#: Every row of a lab run, in order.
LAB_ROWS: tuple[RowSpec, ...] = _rows()


def run_lab(
    quick: bool = False, json_path: str | None = None, rows: list[str] | None = None
) -> int:
    """``python -m benchmarks run``: every row (or those named), judged; report and JSON.

    Returns the exit status as :func:`interop.bench.run.run_bench` does (2 also for an
    unknown row name).
    """
    chosen = list(LAB_ROWS)
    if rows:
        names = {spec.name: spec for spec in LAB_ROWS}
        unknown = [name for name in rows if name not in names]
        if unknown:
            print(
                f"benchmarks run: expected rows among {sorted(names)} (got {unknown!r})",
                file=sys.stderr,
            )
            return 2
        chosen = [names[name] for name in rows]
    return run_bench(
        quick,
        json_path,
        chosen,
        judge=RunJudge(),
        report=format_report,
        command="benchmarks run",
    )
