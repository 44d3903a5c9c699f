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

import importlib
import importlib.util
import inspect
import sys
from typing import Any

from benchmarks.dask_save import (
    cluster_unavailable,
    dask_save_npy,
    dask_save_npy_cupy,
    dask_unavailable,
)
from benchmarks.diagnostics import diagnosed
from benchmarks.host_limit import host_limit
from benchmarks.report import format_report
from benchmarks.targets import judge
from interop.bench.context import BenchContext
from interop.bench.results import Ratio
from interop.bench.rows import ROWS, RowSpec
from interop.bench.run import run_bench

#: The module that measures ``torch_op_us`` (written beside this one, where it exists).
TORCH_OP_MODULE = "benchmarks.torch_op_overhead"


def torch_op_unavailable() -> str | None:
    """Why ``torch_op_us`` cannot run: its measuring module is not in this checkout."""
    if importlib.util.find_spec(TORCH_OP_MODULE) is None:
        return "benchmarks/torch_op_overhead.py is not in this checkout"
    return None


def torch_op_us(ctx: BenchContext) -> dict[str, Any]:
    """``interop.torch_op`` per call against a hand-written ``torch.library.custom_op``.

    Measured by ``benchmarks.torch_op_overhead.measure()``, given ``calls`` and
    ``repeats`` where it takes them; it returns the row's fields (``us``,
    ``anchors``, ``ratios`` as :class:`~interop.bench.results.Ratio` or their JSON).
    """
    measure = importlib.import_module(TORCH_OP_MODULE).measure
    sizes = {"calls": ctx.sizes.calls, "repeats": ctx.sizes.repeats}
    taken = inspect.signature(measure).parameters
    fields = dict(measure(**{k: v for k, v in sizes.items() if k in taken}))
    ratios = [r if isinstance(r, Ratio) else Ratio(**r) for r in fields.get("ratios", [])]
    return fields | {"ratios": ratios}


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
        judge=judge,
        report=format_report,
        command="benchmarks run",
    )
