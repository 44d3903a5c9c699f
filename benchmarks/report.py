"""The lab's report of a bench run: the package's figures and ratios, with verdicts.

Every ratio is printed with its direction ("1.29x the time of
numpy.from_dlpack", "1.14x the throughput of numpy.copyto") and, where it is
a target, the target; memory rows lead with memory; the lab's diagnoses
(ring stages, traces, profiles, the host ceilings) follow their row; rows that
did not run are grouped by reason (one line per reason); a smoke run says so
and judges nothing. It reads results files of every schema kept in
``benchmarks/results/``.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

from benchmarks.diagnostics import profile_text, stages_text, trace_text
from interop.bench.report import (
    figure_text,
    format_bytes,
    machine_text,
    memory_text,
    not_run_lines,
    ratio_text,
)

WIDTH = 100
_NBSP = "\N{NO-BREAK SPACE}"
#: Rows whose figure is memory.
MEMORY_ROWS = {"save_npy_rss"}


def _wrap(text: str, indent: str = "", hanging: str = "         ") -> list[str]:
    """``text`` wrapped to the report's width, later lines indented by ``hanging``;
    a "(target ...)" is kept on one line."""
    text = re.sub(r"\(target [^)]*\)", lambda m: m.group(0).replace(" ", _NBSP), text)
    lines = textwrap.wrap(
        text,
        WIDTH,
        initial_indent=indent,
        subsequent_indent=indent + hanging,
        break_on_hyphens=False,
        break_long_words=False,
    )
    return [line.replace(_NBSP, " ") for line in lines]


def judged_ratio_text(ratio: dict[str, Any], judged: bool = True) -> str:
    """:func:`~interop.bench.report.ratio_text` with the ratio's target, where it has one:
    ``"to_numpy: 1.33x the time of numpy.from_dlpack (target <= 2x)"``, ``": MISSED"``
    added where it was missed, ``", not judged"`` where the run judged nothing."""
    text = ratio_text(ratio)
    if not ratio.get("target"):
        return text
    if not judged:
        return text + f" (target {ratio['target']}, not judged)"
    missed = ": MISSED" if ratio.get("met") is False else ""
    return text + f" (target {ratio['target']}{missed})"


def is_judged(results: dict[str, Any]) -> bool:
    """Whether ``results`` were judged (a file before schema 3: unless a smoke run)."""
    return bool(results.get("judged", not results.get("quick")))


def _header(results: dict[str, Any]) -> list[str]:
    cfg, sizes = results["config"], results["sizes"]
    dirty = " (with uncommitted changes)" if results.get("commit_dirty") else ""
    title = "interop bench"
    if results.get("quick"):
        title += (
            " --quick: a smoke run with small sizes and few repeats; "
            "it checks that every row runs and judges no target"
        )
    fields = [
        f"device   {results['device']}",
        f"run      {results['date']}, commit {results['commit'][:12]}{dirty}",
        f"config   chunk_bytes {format_bytes(cfg['chunk_bytes'])}, num_buffers "
        f"{cfg['num_buffers']}, host_threads {cfg['host_threads']} (staging ring "
        f"{format_bytes(cfg['chunk_bytes'] * cfg['num_buffers'])})",
        f"sizes    scale {sizes['scale']:g} (INTEROP_BENCH_SCALE multiplies every size and loop "
        f"count): GPU arrays {format_bytes(sizes['gpu_bytes'])}, host_copy "
        f"{format_bytes(sizes['host_bytes'])}, save_npy_rss {format_bytes(sizes['rss_bytes'])}"
        + (f", dask_save_npy {format_bytes(sizes['dask_bytes'])}" if "dask_bytes" in sizes else "")
        + f"; {sizes['calls']} calls per repeat in per-call rows",
        f"timing   median of {sizes['repeats']} timed repeats after an untimed, checked first "
        "call; anchors measured in the same run, interleaved",
        "ratios   'Nx the time of A': lower is better; 'Nx the throughput of A': higher is "
        "better; memory: extra memory over a bound, at most 1x is within it",
    ]
    if results.get("machine"):
        fields.append(f"machine  {machine_text(results['machine'])}")
    lines = _wrap(title, hanging="  ")
    for field in fields:
        lines += _wrap(field)
    return lines


def host_limit_text(row: dict[str, Any]) -> list[str]:
    """The ``host_limit`` row's ceilings: per side and condition, GB/s by thread count."""
    lines = []
    for side, by in row.get("copies", {}).items():
        for condition, rates in by.items():
            at = ", ".join(f"{n} threads {v:.2f}" for n, v in rates.items())
            lines.append(f"{side}, {condition}: {at} GB/s")
    pinning = row.get("registration")
    if pinning:
        at = ", ".join(f"{label} {v:.2f}" for label, v in pinning.items())
        lines.append(f"cudaHostRegister + unregister: {at} GB/s")
    if row.get("not_measured"):
        lines.append(f"not measured: {row['not_measured']}")
    return lines


def _more(row: dict[str, Any]) -> list[str]:
    lines = []
    if row.get("stages"):
        lines.append(f"ring stages alone: {stages_text(row['stages'])}")
    if row.get("trace"):
        lines.append(f"where the time went: {trace_text(row['trace'])}")
    for label, top in row.get("profile", {}).items():
        lines.append(f"profile of {label}: {profile_text(top)}")
    if row.get("diagnosis_error"):
        lines.append(f"diagnoses not made: {row['diagnosis_error']}")
    return lines + host_limit_text(row)


def format_report(results: dict[str, Any]) -> str:
    """The printed report of a run's results (as returned by the run or read from its JSON).

    Returns
    -------
    str
        The header (device, commit, config, sizes, machine, how to read ratios), one
        block per measured row (figure, verdict, every ratio with its direction and
        target, memory, diagnoses), one line per group of rows that did not run with
        their shared reason, notes, and a summary line.
    """
    judged = is_judged(results)
    lines = _header(results)
    # the name column fits the longest name of a row that ran
    width = max([14] + [len(row["name"]) for row in results["rows"] if row["status"] == "ok"])
    lines += ["", f"{'row':<{width}} {'result':<32} verdict"]
    counts: dict[str, int] = {}
    for row in results["rows"]:
        if row["status"] != "ok":
            counts[row["status"]] = counts.get(row["status"], 0) + 1
            continue
        if judged:
            verdict = {True: "met", False: "MISSED", None: "reference"}[row.get("met")]
            key = verdict.lower()
        else:
            verdict, key = "not judged", "measured (not judged: a smoke run)"
        counts[key] = counts.get(key, 0) + 1
        figure = figure_text(row, row["name"] in MEMORY_ROWS)
        lines.append(f"{row['name']:<{width}} {figure:<32} {verdict}")
        indent = " " * (width + 1)
        if not row.get("ratios") and row.get("target"):
            lines.append(f"{indent}target: {row['target']}")
        for r in row.get("ratios", []):
            lines += _wrap(judged_ratio_text(r, judged), indent, "    ")
        if row.get("memory"):
            lines += _wrap(f"memory: {memory_text(row['memory'])}", indent, "    ")
        for line in _more(row):
            lines += _wrap(line, indent, "    ")
    for line in not_run_lines(results["rows"]):
        lines += _wrap(line, hanging="    ")
    notes = results.get("notes", {})
    if notes.get("pinned_pages_in_rss") is False:
        lines.append(
            "note: this driver does not count pinned pages in RSS; "
            "extra host memory of GPU rows is pageable memory only"
        )
    for error in notes.get("release_errors", []):
        lines.append(f"note: releasing caches failed {error}")
    if notes.get("close_error"):
        lines.append(f"note: closing the GPU arrays failed: {notes['close_error']}")
    lines.append("summary: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    return "\n".join(lines)
