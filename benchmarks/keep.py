"""Keep a GPU run: ``python -m benchmarks keep OUTDIR [--branch main] > report.md``

Exit status 0 when kept, 1 when not (nothing written, the reason on stderr), 2 for bad usage.
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

from benchmarks.sweep import plot_results
from benchmarks.tables import judged
from interop.bench import write_json
from interop.errors import BackendUnavailableError

ROOT = Path(__file__).resolve().parent.parent


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


def _check_commit(bench: dict[str, Any], branch: str) -> None:
    commit = bench["commit"]
    if commit in ("", "unknown"):
        raise NotKept(
            "the results do not name their commit: run gpu-check in a git checkout, or set "
            "INTEROP_COMMIT to the commit the copy was made from"
        )
    if bench.get("commit_dirty"):
        raise NotKept("the run had uncommitted changes: commit them, run again and keep that")
    cmd = ["git", "merge-base", "--is-ancestor", commit, branch]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        why = proc.stderr.strip() or f"it is not an ancestor of {branch}"
        raise NotKept(f"the results' commit {commit} is not a commit on {branch}: {why}")


def _gpu_check(outdir: Path) -> dict[str, Any]:
    """gpu-check's ``steps`` and ``tests`` (JUnit counts summed; None without them)."""
    tsv = outdir / "steps.tsv"
    head, *lines = tsv.read_text().splitlines() if tsv.is_file() else [""]
    steps = [dict(zip(head.split("\t"), line.split("\t"), strict=False)) for line in lines if line]
    suites = []
    for path in (outdir / "junit-gpu.xml", outdir / "junit.xml"):
        if path.is_file():
            root = ET.parse(path).getroot()
            suites += [root] if root.tag == "testsuite" else root.findall("testsuite")
    if not suites:
        return {"steps": steps, "tests": None}
    keys = ("tests", "failures", "errors", "skipped")
    tests = {key: sum(int(s.get(key, 0)) for s in suites) for key in keys}
    tests["passed"] = tests["tests"] - tests["failures"] - tests["errors"] - tests["skipped"]
    return {"steps": steps, "tests": tests}


def report(kept: dict[str, Any], name: str) -> str:
    """A kept run in Markdown: its tests, steps and judged ratios, and how to show it."""
    lines = [f"## {kept['device']}, {kept['date'][:10]}, commit `{kept['commit'][:8]}`", ""]
    tests, steps = kept["gpu_check"]["tests"], kept["gpu_check"]["steps"]
    if tests is not None:
        lines.append(
            f"Tests: {tests['passed']} passed, {tests['failures']} failed, "
            f"{tests['errors']} errors, {tests['skipped']} skipped (of {tests['tests']})."
        )
    if steps:
        done = ", ".join(f"{s['step']} {s['status']}" for s in steps)
        lines.append(f"gpu-check steps: {done}.")
    return "\n".join(lines) + (
        f"\n\n{judged(kept)}\n\nKept: `benchmarks/results/{name}.json`, plot "
        f"`docs/img/throughput-{name}.png`. To show it, name `{name}` in the pages' "
        "`<!-- table:... -->` markers, then run `python -m benchmarks tables`."
    )


def _free_name(name: str, bench: dict[str, Any], into: Path) -> str:
    """The first of ``name``, ``-<commit>``, ``-<commit>-<time>`` free or holding this run."""
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
    """Check and keep the results in ``outdir`` under ``into``; (JSON, PNG, Markdown)."""
    bench = _load(outdir / "bench.json", "bench")
    sweep = _load(outdir / "sweep.json", "sweep") if (outdir / "sweep.json").is_file() else None
    for key in ("device", "commit") if sweep else ():
        if sweep[key] != bench[key]:  # type: ignore[index]
            raise NotKept(
                f"bench.json and sweep.json differ in {key} ({bench[key]!r} against "
                f"{sweep[key]!r}): keep the two files of one gpu-check run"  # type: ignore[index]
            )
    _check_commit(bench, branch)
    device = re.sub(r"[^a-z0-9]+", "-", bench["device"].lower()).strip("-")
    name = _free_name(f"{bench['date'][:10]}-{device}", bench, into)
    keys = ("device", "date", "commit", "commit_source", "versions", "cpu_count")
    kept = {key: bench.get(key) for key in keys}
    kept |= {"gpu_check": _gpu_check(outdir), "bench": bench, "sweep": sweep}
    png = into / "docs" / "img" / f"throughput-{name}.png"
    try:
        plot_results([bench] + ([sweep] if sweep else []), png)
    except (ValueError, BackendUnavailableError) as exc:
        raise NotKept(f"cannot plot the results: {exc}") from exc
    path = write_json(kept, into / "benchmarks" / "results" / f"{name}.json")
    return path, png, report(kept, name)


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks keep``: the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks keep", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("outdir", type=Path, help="the OUTDIR that scripts/gpu-check wrote")
    parser.add_argument("--branch", default="main", help="the results' commit must be on it")
    parser.add_argument("--into", type=Path, default=ROOT, help="where results/ and img/ go")
    args = parser.parse_args(argv)
    try:
        path, png, text = keep(args.outdir, args.branch, args.into)
    except NotKept as exc:
        print(f"keep: not kept: {exc}", file=sys.stderr)
        return 1
    print(text)
    print(f"keep: wrote {path} and {png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
