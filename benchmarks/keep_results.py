"""Keep a GPU runner's results in the repository, and say what they measured.

Usage (from the repository root, after ``scripts/gpu-check OUTDIR`` ran on a GPU)::

    python -m benchmarks keep OUTDIR > /tmp/report.md

It reads ``OUTDIR/bench.json`` (needed), ``sweep.json``, ``steps.tsv`` and
the JUnit files ``junit-gpu.xml`` and ``junit.xml`` (when there; the counts
are summed), checks that they are one full run on a CUDA device
at a commit of the ``main`` branch (``--branch``) with no uncommitted changes,
and writes:

- ``benchmarks/results/<date>-<device>.json``: the device, date, commit,
  library versions, gpu-check's steps and test counts, and the bench and
  sweep results whole (``<date>-<device>-<commit>.json``, then
  ``…-<commit>-<time>.json``, where another run is already kept under the
  name before: an earlier run is never replaced);
- ``docs/img/throughput-<date>-<device>.png``: the plot of that JSON;

then prints, as Markdown, what to paste into ``docs/benchmarks.md``: the
results table's row, every judged ratio (measured, target, met) with where
the time went for a missed transfer row, and the sweep's suggested defaults.
Exit status: 0 when kept, 1 when the results cannot be kept (the reason on
stderr; nothing is written), 2 for bad usage.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from benchmarks.diagnostics import stages_text, trace_text
from benchmarks.plot import plot_results
from benchmarks.sweep import suggest_defaults
from interop.bench.report import ratio_text
from interop.bench.results import write_json
from interop.errors import BackendUnavailableError

ROOT = Path(__file__).resolve().parent.parent

#: The columns of the results table in docs/benchmarks.md, in order.
TABLE_ROWS = (
    "d2h_prealloc",
    "d2h_fresh",
    "d2h_strided",
    "h2d_pageable",
    "exchange_us",
    "save_npy",
    "dask_save_npy_cupy",
)


#: A verdict in words: met, missed, or none (a reference row without a target).
VERDICT = {True: "met", False: "**missed**", None: "reference"}


class NotKept(Exception):
    """The results cannot be kept; the message says why."""


def _load(path: Path, kind: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise NotKept(f"cannot read {path}: {exc}") from exc
    if data.get("kind") != kind:
        raise NotKept(f"expected {path} to hold {kind} results (got kind {data.get('kind')!r})")
    if data.get("partial"):
        raise NotKept(f"{path} is partial: its run stopped before the end; run it again")
    if data.get("quick"):
        raise NotKept(f"{path} is a --quick smoke run, which judges nothing; keep a full run")
    if data.get("device") in (None, "no CUDA device"):
        raise NotKept(f"{path} was measured without a CUDA device")
    return data


def _on_branch(commit: str, branch: str) -> None:
    if commit in ("", "unknown"):
        raise NotKept(
            "the results do not name their commit: run gpu-check in a git checkout, or set "
            "INTEROP_COMMIT to the commit the copy was made from"
        )
    proc = subprocess.run(
        ["git", "merge-base", "--is-ancestor", commit, branch],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        why = proc.stderr.strip() or f"it is not an ancestor of {branch}"
        raise NotKept(f"the results' commit {commit} is not a commit on {branch}: {why}")


def _steps(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    lines = path.read_text().splitlines()
    header = lines[0].split("\t") if lines else []
    return [dict(zip(header, line.split("\t"), strict=False)) for line in lines[1:] if line]


def _tests(outdir: Path) -> dict[str, int] | None:
    """Test counts summed over OUTDIR's JUnit files: tests, passed, failures, errors, skipped."""
    paths = [p for p in (outdir / "junit-gpu.xml", outdir / "junit.xml") if p.is_file()]
    if not paths:
        return None
    suites = []
    for path in paths:
        root = ET.parse(path).getroot()
        suites += [root] if root.tag == "testsuite" else root.findall("testsuite")
    counts = {
        key: sum(int(s.get(key, 0)) for s in suites)
        for key in ("tests", "failures", "errors", "skipped")
    }
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def slug(text: str) -> str:
    """``text`` as a file name part: lower case, runs of other characters as one ``-``."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


LINKS = ("d2h_limit", "h2d_limit")


def _cell(row: dict[str, Any] | None) -> str:
    if row is None or row["status"] != "ok":
        return "not run" if row is None else f"{row['status']}"
    ratios = row.get("ratios", [])
    judged = [r for r in ratios if r.get("target")]
    # the ratio to the link too, where a row is judged against something lower
    ours = {r["of"] for r in judged}
    to_link = [r for r in ratios if r["to"] in LINKS and r["of"] in ours and not r.get("target")]
    judged = to_link + judged
    parts = [
        f"{'n/a' if r['value'] is None else format(r['value'], '.2f')}x {r['to']}" for r in judged
    ]
    verdict = VERDICT[row["met"]]
    return f"{'; '.join(parts)} ({verdict})"


def report(kept: dict[str, Any], name: str) -> str:
    """The Markdown to paste into docs/benchmarks.md for one kept run."""
    bench, sweep = kept["bench"], kept.get("sweep")
    rows = {row["name"]: row for row in bench["rows"]}
    commit = kept["commit"][:8]
    lines = [f"## {kept['device']}, {kept['date'][:10]}, commit `{commit}`", ""]
    tests = kept["gpu_check"]["tests"]
    if tests is not None:
        lines.append(
            f"Tests: {tests['passed']} passed, {tests['failures']} failed, "
            f"{tests['errors']} errors, {tests['skipped']} skipped (of {tests['tests']})."
        )
    steps = kept["gpu_check"]["steps"]
    if steps:
        lines.append(
            "gpu-check steps: " + ", ".join(f"{s['step']} {s['status']}" for s in steps) + "."
        )
    lines += [
        "",
        "Results table row:",
        "",
        f"| {kept['device']} | {kept['date'][:10]} | `{commit}` | "
        + " | ".join(_cell(rows.get(n)) for n in TABLE_ROWS)
        + " |",
        "",
        "| row | measured | target | met |",
        "|---|---|---|---|",
    ]
    missed = []
    for row in bench["rows"]:
        if row["status"] != "ok":
            lines.append(f"| `{row['name']}` | {row['status']}: {row.get('reason', '')} | | |")
            continue
        for r in row.get("ratios", []):
            if not r.get("target"):
                continue
            measured = ratio_text(r)
            lines.append(f"| `{row['name']}` | {measured} | {r['target']} | {VERDICT[r['met']]} |")
        if row["met"] is False:
            missed.append(row)
    if missed:
        lines += ["", "Where the time went in the missed rows:", ""]
    for row in missed:
        detail = []
        if row.get("stages"):
            detail.append(f"ring stages alone: {stages_text(row['stages'])}")
        if row.get("trace"):
            detail.append(f"traced: {trace_text(row['trace'])}")
        lines.append(f"- `{row['name']}`: " + ("; ".join(detail) or "no trace for this row"))
    suggested = suggest_defaults(sweep) if sweep is not None else None
    lines.append("")
    if suggested is None:
        lines.append("Sweep: no point measured in every transfer row; no defaults suggested.")
    else:
        s = suggested["settings"]
        at = ", ".join(
            f"`{row}` {v['gbps']:.2f} GB/s ({v['gbps'] / v['best_gbps']:.0%} of its best, "
            f"{v['best_gbps']:.2f} GB/s)"
            for row, v in suggested["rows"].items()
        )
        lines += [
            f"Suggested defaults: chunk_bytes {s['chunk_bytes'] >> 20} MiB, host_threads "
            f"{s['host_threads']}, num_buffers {s['num_buffers']} on {kept['cpu_count']} cores: "
            f"{at}. Rule: {suggested['rule']}.",
        ]
    lines += ["", f"Kept: `benchmarks/results/{name}.json`, plot `docs/img/throughput-{name}.png`."]
    return "\n".join(lines)


def _free_name(name: str, bench: dict[str, Any], into: Path) -> str:
    """The first of ``name``, ``name-<commit>``, ``name-<commit>-<time>`` that
    is free or holds this same run (commit and date): another run of the same
    day and device, even of the same commit, is never overwritten.

    Raises
    ------
    NotKept
        All three hold other runs.
    """
    time = re.sub(r"\D", "", bench["date"][11:19])  # HHMMSS of the run's start
    stem = f"{name}-{bench['commit'][:8]}"
    for candidate in (name, stem, f"{stem}-{time}"):
        earlier = into / "benchmarks" / "results" / f"{candidate}.json"
        if not earlier.is_file():
            return candidate
        try:
            kept = json.loads(earlier.read_text())
            if (kept.get("commit"), kept.get("date")) == (bench["commit"], bench["date"]):
                return candidate
        except (OSError, ValueError, AttributeError):
            pass  # unreadable: someone else's file, left alone
    raise NotKept(f"benchmarks/results/{stem}-{time}.json already holds another run")


def keep(outdir: Path, branch: str = "main", into: Path = ROOT) -> tuple[Path, Path, str]:
    """Check and keep the results in ``outdir`` under ``into``; return (JSON, PNG, Markdown)."""
    bench = _load(outdir / "bench.json", "bench")
    sweep = None
    if (outdir / "sweep.json").is_file():
        sweep = _load(outdir / "sweep.json", "sweep")
        for key in ("device", "commit"):
            if sweep[key] != bench[key]:
                raise NotKept(
                    f"bench.json and sweep.json differ in {key} ({bench[key]!r} against "
                    f"{sweep[key]!r}): keep the two files of one gpu-check run"
                )
    if bench.get("commit_dirty"):
        raise NotKept("the run had uncommitted changes: commit them, run again and keep that")
    _on_branch(bench["commit"], branch)
    name = _free_name(f"{bench['date'][:10]}-{slug(bench['device'])}", bench, into)
    kept = {
        "device": bench["device"],
        "date": bench["date"],
        "commit": bench["commit"],
        "commit_source": bench.get("commit_source"),
        "versions": bench["versions"],
        "cpu_count": bench["cpu_count"],
        "gpu_check": {
            "steps": _steps(outdir / "steps.tsv"),
            "tests": _tests(outdir),
        },
        "bench": bench,
        "sweep": sweep,
    }
    png = into / "docs" / "img" / f"throughput-{name}.png"
    try:
        plot_results([bench] + ([sweep] if sweep else []), png)
    except (ValueError, BackendUnavailableError) as exc:
        raise NotKept(f"cannot plot the results: {exc}") from exc
    path = write_json(kept, into / "benchmarks" / "results" / f"{name}.json")
    return path, png, report(kept, name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks keep",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("outdir", type=Path, help="the OUTDIR that scripts/gpu-check wrote")
    parser.add_argument(
        "--branch", default="main", help="the results' commit must be on it (default main)"
    )
    parser.add_argument(
        "--into",
        type=Path,
        default=ROOT,
        help="the directory that gets benchmarks/results/ and docs/img/ (default the repository)",
    )
    args = parser.parse_args(argv)
    try:
        path, png, text = keep(args.outdir, args.branch, args.into)
    except NotKept as exc:
        print(f"keep_results: not kept: {exc}", file=sys.stderr)
        return 1
    print(text)
    print(f"keep_results: wrote {path} and {png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
