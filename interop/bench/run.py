"""Running the rows: one row at a time, each measured, skipped or failed with its reason."""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .context import BenchContext, log_done
from .ratios import Ratio, row_met
from .report import format_table
from .results import gpu_unavailable, host_unavailable, run_header, write_json
from .rows import ROWS, RowSpec
from .sizes import BenchSizes, scale_from_env

__all__ = ["collect_results", "run_bench", "run_row"]


def _judge(fields: dict[str, Any], judged: bool) -> dict[str, Any]:
    """The row's fields with its ratios in JSON form and its verdict ``met``."""
    ratios: list[Ratio] = fields.pop("ratios", [])
    return {
        **fields,
        "ratios": [r.record(judged) for r in ratios],
        "met": row_met(ratios, judged),
    }


def run_row(
    spec: RowSpec,
    ctx: BenchContext,
    gpu_reason: str | None,
    host_reason: str | None,
    judged: bool = True,
) -> dict[str, Any]:
    """One row's result: measured, or skipped / not available / error with the reason.

    Parameters
    ----------
    spec : RowSpec
    ctx : BenchContext
    gpu_reason, host_reason : str or None
        Why GPU / host rows cannot run here (None: they can).
    judged : bool
        Judge the row's targets (False for a smoke run: ``met`` is None).

    Returns
    -------
    dict
        ``name``, ``what``, ``target``, ``status`` (``ok``, ``skipped``,
        ``not available``, ``error``), ``met``, and ``reason`` or the
        measured fields.
    """
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
    lacking = spec.unavailable() if spec.unavailable is not None else None
    if lacking is not None:
        return row | {"status": "not available", "reason": lacking, "met": None}
    if reason is not None:
        return row | {"status": "skipped", "reason": reason, "met": None}
    try:
        fields = {"status": "ok"} | _judge(spec.run(ctx), judged)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        fields = {"status": "error", "reason": f"{type(exc).__name__}: {exc}", "met": None}
    try:
        ctx.release()
    except Exception as exc:  # e.g. a sticky CUDA error: later rows report theirs
        traceback.print_exc(file=sys.stderr)
        ctx.notes.setdefault("release_errors", []).append(
            f"after {spec.name}: {type(exc).__name__}: {exc}"
        )
    return row | fields


def bench_directory(workdir: str | os.PathLike[str] | None = None) -> Path:
    """Where file rows write: ``workdir``, else ``INTEROP_BENCH_DIR``, else the temp directory."""
    return Path(workdir or os.environ.get("INTEROP_BENCH_DIR") or tempfile.gettempdir())


def collect_results(
    sizes: BenchSizes,
    rows: tuple[RowSpec, ...] = ROWS,
    workdir: str | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    *,
    quick: bool = False,
) -> dict[str, Any]:
    """Run ``rows`` and return the results with the run's context.

    Parameters
    ----------
    sizes : BenchSizes
        Sizes, loop counts and repeats.
    rows : tuple of RowSpec
        The rows to run, in order (default: all).
    workdir : str, optional
        Where file rows write (default ``INTEROP_BENCH_DIR`` or the system
        temporary directory).
    on_row : callable, optional
        Called after each row with the results so far (the same form as the
        return value, plus ``"partial": True``), e.g. to save them, so that a
        run that dies in a later row keeps the rows already measured.
    quick : bool
        A smoke run: rows are measured but no target is judged.

    Returns
    -------
    dict
        The header of :func:`~interop.bench.results.run_header` plus
        ``notes`` and ``rows`` (one dict per row, see :func:`run_row`).
    """
    gpu_reason, host_reason = gpu_unavailable(), host_unavailable()
    header = run_header("bench", sizes, quick)
    ctx = BenchContext(sizes, bench_directory(workdir))
    results: list[dict[str, Any]] = []
    try:
        for spec in rows:
            start = time.perf_counter()
            results.append(run_row(spec, ctx, gpu_reason, host_reason, judged=not quick))
            log_done("interop bench", spec.name, results[-1]["status"], start)
            if on_row is not None:
                on_row(header | {"notes": ctx.notes, "rows": list(results), "partial": True})
    finally:
        ctx.close_keeping_results()
    return header | {"notes": ctx.notes, "rows": results}


def run_bench(quick: bool = False, json_path: str | None = None) -> int:
    """Run every benchmark row, print the report, optionally write JSON.

    Parameters
    ----------
    quick : bool
        Small sizes and few repeats: a smoke run that judges no target.
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
        sizes = BenchSizes.choose(quick, scale_from_env())
    except ValueError as exc:
        print(f"interop bench: {exc}", file=sys.stderr)
        return 2

    def save_partial(partial: dict[str, Any]) -> None:
        if json_path:
            write_json(partial, json_path)

    results = collect_results(sizes, on_row=save_partial, quick=quick)
    print(format_table(results))
    if json_path:
        print(f"wrote {write_json(results, json_path)}")
    return 1 if any(row["status"] == "error" for row in results["rows"]) else 0
