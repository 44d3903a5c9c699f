"""``python -m benchmarks tables [--check]``: the pages' figure tables from the kept runs.

Written between ``<!-- table:KIND STEM... [ROW...] -->`` and ``<!-- /table -->``, KIND
``speed``, ``judged``, ``swept`` or ``report``; ``--check``: nothing written, 1 if a page differs.
"""

from __future__ import annotations

import json
import re
import statistics
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.lab import all_rows, format_report
from benchmarks.torch_op import HAND

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
MARK = re.compile(r"<!-- table:(\w+)((?: \S+)*) -->\n.*?(?=<!-- /table -->)", re.S)
#: Sample labels as their rows' ratios name them (``file write``: runs before 2026-11-24).
ALIASES = {"file write": "sequential file write", "custom_op": HAND}
HOST = {spec.name for spec in all_rows() if not spec.gpu}
Run = dict[str, Any]
X, H2D = "\N{MULTIPLICATION SIGN}", "torch.from_numpy(host).cuda()"
#: The speed table's rows: what moves, interop's call, the usual calls, the limit beside.
SPEED = [
    ("device → host array", "copy_to_host(x, out)", "cupy.asnumpy(x, out=out)", "d2h_limit"),
    ("device → pinned array", "copy_to_host(x, out=pinned)", "cupy.asnumpy(x, out=pinned)", ""),
    ("strided device → host", "copy_to_host(x.T, out)", "cupy.asnumpy(x.T, out=out)", ""),
    ("device → new array", "copy_to_host(x)", "cupy.asnumpy(x) / t.cpu().numpy()", ""),
    ("host array → device", "copy_to_device(host)", f"cupy.asarray(host) / {H2D}", "h2d_limit"),
    ("device → `.npy` file", "save_npy(x, path)", "", "sequential file write"),
]


#: The sweep table's points, (chunk MiB, num_buffers, host_threads), and its rows.
POINTS = [(32, 4, 4), (32, 4, 8), (32, 4, 16), (64, 2, 8), (64, 6, 8), (16, 4, 8), (8, 4, 8)]
TRANSFERS = ("d2h_prealloc", "h2d_pageable")


def kept(stem: str) -> Run:
    """The kept run ``benchmarks/results/<stem>.json``; ``bench``: its bench (a CPU run whole)."""
    run = json.loads((ROOT / "benchmarks" / "results" / f"{stem}.json").read_text())
    return run | {"stem": stem, "bench": run.get("bench", run)}


def _samples(run: Run) -> Iterator[tuple[str, dict[str, Any]]]:
    """(label, sample) of every call the run timed: in the bench's rows, at the sweep's points."""
    rows = run["bench"]["rows"]
    if run.get("sweep") and run["sweep"]["sizes"] == run["bench"]["sizes"]:
        swept = run["sweep"]["rows"]  # its rows: the anchors' samples (since 2026-11-27)
        rows = rows + swept + [p for row in swept for p in row.get("points", [])]
    for row in rows:
        for label, sample in row.get("samples", {}).items():
            yield row["name"] if label == "cudaMemcpyAsync" else ALIASES.get(label, label), sample


def figure(sample: dict[str, Any], best: bool = False) -> float:
    """GB/s of a sample's median (``best``: fastest) repeat, or else microseconds per call."""
    seconds = min(sample["seconds"]) if best else statistics.median(sample["seconds"])
    return sample["bytes"] / seconds / 1e9 if "bytes" in sample else seconds * 1e6 / sample["calls"]


def ours(run: Run, label: str) -> float | None:
    """interop's call ``label``: the median of its repeats in the first row that timed it."""
    return next((figure(s) for got, s in _samples(run) if got == label), None)


def best(run: Run, label: str) -> float | None:
    """Another call at its best: its fastest repeat at one size, or the sweep's if higher."""
    found = [s for got, s in _samples(run) if got == label]
    if not found or "bytes" not in found[0]:
        return min((figure(s, best=True) for s in found), default=None)  # microseconds
    swept = [row["anchors"] for row in run.get("sweep", {}).get("rows", []) if "anchors" in row]
    rates = [figure(s, best=True) for s in found if s["bytes"] == found[0]["bytes"]]
    return max(rates + [a[f"{label} GB/s"] for a in swept if f"{label} GB/s" in a])


def _num(value: float | None, unit: str = "") -> str:
    return "—" if value is None else f"{value:.2f}{unit}" if value < 10 else f"{value:.1f}{unit}"


def speed(run: Run) -> str:
    """The speed table of a GPU run, and what its figures are."""
    lines = ["| you move | interop | GB/s | instead | GB/s | link |", "|---|---|---|---|---|---|"]
    link = ""
    for what, call, usual, limit in SPEED:
        link, calls = limit or link, [u for u in usual.split(" / ") if u]
        instead = " / ".join(f"`{u}`" for u in calls) or "`numpy.save(path, cupy.asnumpy(x))`"
        figures = " / ".join(_num(best(run, u)) for u in calls) or "not measured"
        cells = [what, f"`{call}`", f"**{_num(ours(run, call))}**", instead, figures]
        cells.append(f"{'disk ' * ('write' in link)}{_num(best(run, link))}")
        lines.append(f"| {' | '.join(cells)} |")
    versions, size = run["versions"], run["bench"]["sizes"]
    caption = (
        f"GB/s: 10⁹ bytes per second, moving a {size['gpu_bytes'] >> 30} GiB float32 array; "
        f"interop's figure is the median of its {size['repeats']} timed copies, each under "
        "**instead** and **link** that call's best in the same run (its fastest copy, or the "
        f"sweep's median of it where higher). `python -m interop bench` on an {run['device']} "
        f"({run['cpu_count']} CPUs, PyTorch {versions['torch']['version'].split('+')[0]}, CuPy "
        f"{versions['cupy']['version']}), {run['date'][:10]}, commit `{run['commit'][:7]}`, "
        f"default settings; kept whole in `benchmarks/results/{run['stem']}.json`."
    )
    return "\n".join(lines) + "\n\n" + textwrap.fill(caption, 76, break_on_hyphens=False)


def _cell(run: Run, name: str, of: str, to: str) -> str:
    """The run's ratio ``of`` / ``to`` of row ``name``, against ``to`` at its best."""
    rows = [row for row in run["bench"]["rows"] if row["name"] == name]
    found = [r for row in rows for r in row.get("ratios", []) if (r["of"], r["to"]) == (of, to)]
    if not found:
        return "—"
    value, bound = found[0]["value"], float(found[0]["target"][3:-1])  # "<= 1.2x"
    if found[0]["quantity"] != "memory" and best(run, to) and ours(run, of):
        value = ours(run, of) / best(run, to)  # type: ignore[operator]
    if value is not None and (value <= bound if found[0]["target"][0] == "<" else value >= bound):
        return f"{value:.2f}{X}"
    return f"**{_num(value, X)}** missed"


def _head(run: Run) -> str:
    if run["device"] != "no CUDA device":
        return f"`{run['commit'][:7]}`"
    return f"{'busy' if run['busy_processes'] else 'as found'}, load {run['load_average'][0]:.1f}"


def judged(*args: Any) -> str:
    """The targeted ratios of the runs' GPU, host or named rows, a column per run."""
    runs, named = [a for a in args if isinstance(a, dict)], {a for a in args if isinstance(a, str)}
    gpu = runs[0]["device"] != "no CUDA device"
    keys: dict[tuple[str, str, str], str] = {}
    for row in (row for run in runs for row in run["bench"]["rows"]):
        if row["name"] in named or (not named and (row["name"] in HOST) != gpu):
            for r in (r for r in row.get("ratios", []) if r.get("target")):
                keys.setdefault((row["name"], r["of"], r["to"]), r["target"])
    lines = [f"| row | ratio | target | {' | '.join(map(_head, runs))} |"]
    lines.append("|---|---|---|" + "---|" * len(runs))
    for (name, of, to), target in keys.items():
        cells = " | ".join(_cell(run, name, of, to) for run in runs)
        words = target.replace(">=", "≥").replace("<=", "≤").replace("x", X)
        lines.append(f"| `{name}` | {of} / {to} | {words} | {cells} |")
    return "\n".join(lines)


def _at(run: Run, name: str, c: int, b: int, t: int) -> float | None:
    """GB/s of sweep row ``name`` of ``run`` at ``c`` MiB chunks, ``b`` buffers, ``t`` threads."""
    want = {"chunk_bytes": c << 20, "num_buffers": b, "host_threads": t}
    points = [p for row in run["sweep"]["rows"] if row["name"] == name for p in row["points"]]
    return next((p.get("gbps") for p in points if want.items() <= p.items()), None)


def swept(*runs: Run) -> str:
    """GB/s of the runs' sweeps at :data:`POINTS`, a figure per run in each cell."""
    lines = ["| `chunk_bytes` | `num_buffers` | `host_threads` | device to host | host to device |"]
    lines.append("|---|---|---|---|---|")
    for point in POINTS:
        cells = [" / ".join(_num(_at(run, name, *point)) for run in runs) for name in TRANSFERS]
        lines.append(f"| {point[0]} MiB | {point[1]} | {point[2]} | {' | '.join(cells)} |")
    return "\n".join(lines)


def report(run: Run) -> str:
    """The lab's report of a run, long lines wrapped."""
    lines = []
    for line in format_report(run["bench"]).splitlines():
        indent = " " * (len(line) - len(line.lstrip()) + (4 if line[:1] == " " else 9))
        lines += textwrap.wrap(line, 80, subsequent_indent=indent) or [""]
    return "```text\n" + "\n".join(lines) + "\n```"


def render(text: str) -> str:
    """``text`` with every table it asks for written anew from the kept runs."""

    def table(match: re.Match[str]) -> str:
        args = [a if a.isidentifier() else kept(a) for a in match[2].split()]  # runs, rows
        made = {"speed": speed, "judged": judged, "swept": swept, "report": report}[match[1]](*args)
        return f"<!-- table:{match[1]}{match[2]} -->\n\n{made}\n\n"

    return MARK.sub(table, text)


def main(argv: list[str]) -> int:
    """``python -m benchmarks tables [--check]``: the exit status."""
    stale = [p for p in PAGES if render((ROOT / p).read_text()) != (ROOT / p).read_text()]
    for page in [] if "--check" in argv else stale:
        (ROOT / page).write_text(render((ROOT / page).read_text()))
    print(f"tables: {', '.join(stale) or 'none'} {'differ' if argv else 'written'}")
    return 1 if argv and stale else 0
