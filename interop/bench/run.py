"""Running the rows: one at a time, each measured, skipped or failed with its reason."""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from .measure import BenchSizes, scale_from_env
from .report import format_table
from .results import gpu_unavailable, host_unavailable, json_path_problem, run_header, write_json
from .rows import ROWS, BenchContext, RowSpec

Row = dict[str, Any]


def log_done(command: str, name: str, status: str, began: float) -> None:
    """One line on stderr for a finished row: its status and seconds since ``began``."""
    took = time.perf_counter() - began
    print(f"{command}: {name} {status} ({took:.1f} s)", file=sys.stderr, flush=True)


def run_row(
    spec: RowSpec, ctx: BenchContext, gpu_reason: str | None, host_reason: str | None
) -> Row:
    """One row's result: ``name``, ``what``, ``status`` (``ok``, ``skipped``, ``not available``,
    ``error``) and ``reason`` or the measured fields; ``*_reason``: why such rows cannot run."""
    row: Row = {"name": spec.name, "what": spec.what}
    lacking = spec.unavailable() if spec.unavailable is not None else None
    if lacking is not None:
        return row | {"status": "not available", "reason": lacking}
    reason = gpu_reason if spec.gpu else host_reason
    if reason is not None:
        return row | {"status": "skipped", "reason": reason}
    try:
        got = spec.run(ctx)
        fields = {"status": "ok", **got, "ratios": [r.record() for r in got.get("ratios", [])]}
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        fields = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}
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
    rows: Sequence[RowSpec] = ROWS,
    on_row: Callable[[dict[str, Any]], object] | None = None,
    *,
    quick: bool = False,
    judge: Callable[[Row, bool], Row] | None = None,
) -> dict[str, Any]:
    """Run ``rows`` (file rows write in :func:`bench_directory`): the run's header with
    ``notes`` and ``rows``. ``on_row`` gets the results so far after each row
    (``"partial": True``), so that a run that dies later keeps them; ``judge(row, judged)``
    returns a row with its targets and verdicts (``judged`` False in a ``quick`` run)."""
    gpu_reason, host_reason = gpu_unavailable(), host_unavailable()
    header = run_header("bench", sizes, quick, judged=judge is not None and not quick)
    ctx = BenchContext(sizes, bench_directory())
    results: list[Row] = []
    try:
        for spec in rows:
            start = time.perf_counter()
            row = run_row(spec, ctx, gpu_reason, host_reason)
            results.append(judge(row, not quick) if judge is not None else row)
            log_done("bench", spec.name, row["status"], start)
            if on_row is not None:
                on_row(header | {"notes": ctx.notes, "rows": list(results), "partial": True})
    finally:
        ctx.close_keeping_results()
    return header | {"notes": ctx.notes, "rows": results}


def run_bench(
    quick: bool = False,
    json_path: str | None = None,
    rows: Sequence[RowSpec] = ROWS,
    *,
    judge: Callable[[Row, bool], Row] | None = None,
    report: Callable[[dict[str, Any]], str] = format_table,
    command: str = "interop bench",
) -> int:
    """``python -m interop bench``: run ``rows``, print the ``report``, optionally write JSON
    (rewritten after every row with ``"partial": true``, the final file without). The exit
    status: 0, or 1 when a row raised or returned wrong data (traceback on stderr), or 2
    before any row for a bad ``INTEROP_BENCH_SCALE`` or a ``json_path`` it cannot write."""
    problem = json_path_problem(json_path) if json_path else None
    try:
        sizes = BenchSizes.choose(quick, scale_from_env())
    except ValueError as exc:
        problem = problem or str(exc)
    if problem is not None:
        print(f"{command}: {problem}", file=sys.stderr)
        return 2
    save = partial(write_json, path=json_path) if json_path else None
    results = collect_results(sizes, rows, on_row=save, quick=quick, judge=judge)
    print(report(results))
    if json_path:
        print(f"wrote {write_json(results, json_path)}")
    return 1 if any(row["status"] == "error" for row in results["rows"]) else 0
