"""What the lab's scripts share: running rows with their targets, the report, diagnoses.

A script lists ``ROWS`` and ends with ``sys.exit(lab.main(ROWS, __spec__.name, __doc__))``;
a diagnosis (:func:`diagnosed`) adds fields to a row after it ran, never costing its figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.targets import RunJudge
from interop.bench import write_json
from interop.bench.rows import ROWS, RowSpec, busy_machine
from interop.bench.run import figure_text, format_table, memory_text, ratio_text, run_bench
from interop.pipeline import trace

#: The scripts whose rows ``python -m benchmarks run`` runs, in this order (host_limit first:
#: the transfer rows are judged against its ceilings).
SCRIPTS = ("host_limit", "d2h", "h2d", "npy", "torch_op", "dask_save", "ckpt")

EPILOG = """\
environment variables (docs/benchmark-method.md says more):
  INTEROP_BENCH_SCALE   multiplies every array size and loop count (default 1)
  INTEROP_BENCH_DIR     where the file rows write (default: the temporary directory)
  INTEROP_CHUNK_BYTES, INTEROP_NUM_BUFFERS, INTEROP_HOST_THREADS: the settings, reported

exit status: 0 when every row ran or was skipped for a stated reason (a missed target is
a result); 1 when a row raised or returned wrong data; 2 for bad arguments."""


def package_row(name: str) -> RowSpec:
    """The row ``name`` of ``python -m interop bench``."""
    return next(spec for spec in ROWS if spec.name == name)


def all_rows() -> list[RowSpec]:
    """The rows of every script, in :data:`SCRIPTS` order, each once."""
    rows: dict[str, RowSpec] = {}
    for script in SCRIPTS:
        for spec in importlib.import_module(f"benchmarks.{script}").ROWS:
            rows.setdefault(spec.name, spec)
    return list(rows.values())


def main(
    rows: Sequence[RowSpec], script: str, doc: str | None, argv: list[str] | None = None
) -> int:
    """``python -m SCRIPT [--quick] [--json PATH] [--rows LIST] [--busy]``: the exit status."""
    prog = f"python -m {script}"
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(doc or "").split("\n\n")[0].replace("``", ""),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    quick = "a smoke run: small sizes, few repeats; checks that every row runs, judges nothing"
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    names = lambda text: [part.strip() for part in text.split(",") if part.strip()]  # noqa: E731
    parser.add_argument("--rows", type=names, metavar="LIST", help="only these rows, in order")
    parser.add_argument("--busy", action="store_true", help="a process per CPU spinning meanwhile")
    args = parser.parse_args(argv)
    named = {spec.name: spec for spec in rows}
    unknown = [name for name in args.rows or () if name not in named]
    if unknown:
        print(f"{prog}: expected rows among {sorted(named)} (got {unknown!r})", file=sys.stderr)
        return 2
    chosen = [named[name] for name in args.rows] if args.rows else list(rows)
    spinners, load = (os.cpu_count() or 1) * args.busy, os.getloadavg()
    with busy_machine(spinners):
        status = run_bench(
            args.quick, args.json, chosen, judge=RunJudge(), report=format_report, command=prog
        )
    if args.json and status != 2:  # the machine's state, beside the run's header
        results = json.loads(Path(args.json).read_text())
        write_json(results | {"busy_processes": spinners, "load_average": load}, args.json)
    return status


# ------------------------------------------------------------------ diagnoses


def diagnosed(spec: RowSpec, diagnose: Callable[[Any, dict[str, Any]], dict[str, Any]]) -> RowSpec:
    """``spec`` whose fields go through ``diagnose(ctx, fields)``, which may fail alone."""

    def run(ctx: Any) -> dict[str, Any]:
        fields = spec.run(ctx)
        try:
            return diagnose(ctx, fields)
        except Exception as exc:  # a diagnosis: its failure must not cost the row
            traceback.print_exc(file=sys.stderr)
            return fields | {"diagnosis_error": f"{type(exc).__name__}: {exc}"}

    return dataclasses.replace(spec, run=run)


def traced(call: Callable[[], Any]) -> dict[str, Any]:
    """One more, untimed ``call`` traced: its summary, or ``error``."""
    try:
        with trace.recording() as traces:
            start = time.perf_counter()
            call()
            seconds = time.perf_counter() - start
    except Exception as exc:  # a diagnosis: its failure must not cost the row
        traceback.print_exc(file=sys.stderr)
        return {"error": f"{type(exc).__name__}: {exc}"}
    if len(traces) != 1:
        return {"error": f"expected one slot transfer to trace (got {len(traces)})"}
    return traces[0].summary(call_seconds=seconds)


class DeviceGrowth:
    """Peak device memory taken in a block from CuPy's pool and PyTorch's allocator."""

    def __init__(self, cp: Any, th: Any) -> None:
        self._cp, self._th = cp, th
        self.extra_bytes: int | None = None

    def __enter__(self) -> DeviceGrowth:
        self._pool = self._cp.get_default_memory_pool().total_bytes()
        self._th.cuda.reset_peak_memory_stats()
        self._torch = self._th.cuda.memory_allocated()
        return self

    def __exit__(self, *exc: object) -> None:
        pool = self._cp.get_default_memory_pool().total_bytes() - self._pool
        self.extra_bytes = max(0, pool) + max(0, self._th.cuda.max_memory_allocated() - self._torch)


# ------------------------------------------------------------------ the report


def _rate(gbps: float | None) -> str:
    return "-" if gbps is None else f"{gbps:.2f} GB/s"


def stages_text(stages: dict[str, Any]) -> str:
    """The DMA and host stages of a GPU row measured alone, or why they were not."""
    st = stages["settings"]
    at = f"at chunk_bytes {st['chunk_bytes'] >> 20} MiB, num_buffers {st['num_buffers']}, "
    at += f"host_threads {st['host_threads']}"
    if "error" in stages:
        return f"not measured ({stages['error']}) {at}"
    return f"DMA {stages['DMA GB/s']:.2f} GB/s, host copies {stages['host GB/s']:.2f} GB/s {at}"


def trace_text(where: dict[str, Any]) -> str:
    """Where a traced transfer spent its time, or why it was not traced."""
    if "error" in where:
        return f"not traced ({where['error']})"
    host = "no host threads (DMAs straight to or from pinned memory)"
    if where["threads"]:
        host = f"{where['threads']} host threads {_rate(where['host_gbps_per_thread'])} each "
        host += f"(busy {where['host_busy']:.0%})"
    outside = ""
    if "call_seconds" in where:
        outside = f"; the call took {where['call_seconds']:.3f} s, "
        outside += f"{where['outside_seconds']:.3f} s of it outside the transfer"
    return (
        f"{_rate(where['rate_gbps'])} in all; device copies {_rate(where['device_gbps'])} "
        f"(busy {where['device_busy']:.0%}); {host}; issuer waited "
        f"{where['issuer_wait_seconds']:.3f} s{outside}: limited by {where['limited_by']}"
    )


def explain(row: dict[str, Any]) -> list[str]:
    """What a row's diagnoses found: ring stages, trace, profile, host ceilings."""
    lines = [f"ring stages alone: {stages_text(row['stages'])}"] if row.get("stages") else []
    if row.get("trace"):
        lines.append(f"where the time went: {trace_text(row['trace'])}")
    for label, top in row.get("profile", {}).items():
        costs = "; ".join(f"{entry['function']} {entry['own_us']:.1f} us" for entry in top[:4])
        lines.append(f"profile of {label}: {costs} (own time per call under cProfile)")
    for side, by in row.get("copies", {}).items():
        for condition, rates in by.items():
            at = ", ".join(f"{n} threads {v:.2f}" for n, v in rates.items())
            lines.append(f"{side}, {condition}: {at} GB/s")
    if row.get("registration"):
        at = ", ".join(f"{label} {v:.2f}" for label, v in row["registration"].items())
        lines.append(f"cudaHostRegister + unregister: {at} GB/s")
    for key in ("not_measured", "diagnosis_error"):
        if row.get(key):
            lines.append(f"{key.replace('_', ' ')}: {row[key]}")
    return lines


def judged_ratio_text(ratio: dict[str, Any], judged: bool = True) -> str:
    """A ratio in words with its target and ``: MISSED`` or ``, not judged``."""
    if not ratio.get("target"):
        return ratio_text(ratio)
    verdict = ", not judged" if not judged else ": MISSED" if ratio.get("met") is False else ""
    return f"{ratio_text(ratio)} (target {ratio['target']}{verdict})"


def format_report(results: dict[str, Any]) -> str:
    """The lab's report of a run (any schema): rows, verdicts, diagnoses, a summary."""
    judged = bool(results.get("judged", not results.get("quick")))  # schema 2 has no judged
    counts = Counter(row["status"] for row in results["rows"] if row["status"] != "ok")

    def row_lines(row: dict[str, Any]) -> list[str]:
        verdict = {True: "met", False: "MISSED", None: "reference"}[row.get("met")]
        verdict = verdict if judged else "not judged"
        counts[verdict.lower()] += 1
        lines = [f"{figure_text(row):<32} {verdict}"]
        lines += [judged_ratio_text(r, judged) for r in row.get("ratios", [])]
        if row.get("memory"):
            lines.append(f"memory: {memory_text(row['memory'])}")
        return lines + explain(row)

    table = format_table(results, "interop lab", row_lines)
    return table + "\nsummary: " + ", ".join(f"{n} {what}" for what, n in counts.items())
