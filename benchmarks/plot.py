"""A PNG of transfer throughput from bench and sweep results (matplotlib, Agg).

For each swept row (``d2h_prealloc``, ``h2d_pageable``, ``host_copy``) the
figure has a panel of throughput against ``chunk_bytes`` (one line per
``host_threads``) and one against ``host_threads`` (one line per chunk
size); each point is the best over ``num_buffers``, and a third panel shows
throughput against ``num_buffers`` where it was swept. The pinned-link limit
(``d2h_limit`` / ``h2d_limit``) and the anchors users compare with
(``cupy.asnumpy``, ``t.cpu()``, ``cupy.asarray``, ``numpy.copyto``) are drawn
as horizontal lines where the results have them. A bench run's own figure is
drawn as a single marker at the settings it ran with.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from interop.bench.measure import MiB
from interop.errors import BackendUnavailableError

__all__ = ["PLOTTED_ROWS", "Panel", "load_results", "plot_results", "run_plot"]

#: Per plotted row: the bench rows whose figures and anchors it draws, and the anchors drawn.
PLOTTED_ROWS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "d2h_prealloc": (
        ("d2h_prealloc", "d2h_fresh", "d2h_limit"),
        ("d2h_limit", "cupy.asnumpy(x)", "cupy.asnumpy(x, out=out)", "t.cpu().numpy()"),
    ),
    "h2d_pageable": (
        ("h2d_pageable", "h2d_limit"),
        ("h2d_limit", "cupy.asarray(host)", "torch.from_numpy(host).cuda()"),
    ),
    "host_copy": (("host_copy",), ("numpy.copyto",)),
}


@dataclasses.dataclass
class Panel:
    """What one panel of the figure shows (returned so that callers can check it).

    Attributes
    ----------
    row : str
        The plotted row.
    x : str
        ``"chunk_bytes"``, ``"host_threads"`` or ``"num_buffers"``.
    lines : dict of str to list of (x, GB/s)
        Swept series by label (chunk sizes in MiB on the x axis).
    hlines : dict of str to float
        Horizontal lines (GB/s) by label.
    markers : dict of str to (x, GB/s)
        Single bench figures by label.
    """

    row: str
    x: str
    lines: dict[str, list[tuple[float, float]]] = dataclasses.field(default_factory=dict)
    hlines: dict[str, float] = dataclasses.field(default_factory=dict)
    markers: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)


def load_results(paths: Sequence[str | os.PathLike[str]]) -> list[dict[str, Any]]:
    """Read bench or sweep JSON files.

    Raises
    ------
    FileNotFoundError
        A path does not exist.
    ValueError
        A file is not a bench or sweep result (no ``rows``).
    """
    results = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
            raise ValueError(
                f"expected a bench or sweep JSON file with a 'rows' list (got {str(path)!r}); "
                "make one with python -m benchmarks run --json PATH (or sweep --json PATH)"
            )
        results.append(data)
    return results


def _anchor_values(row: dict[str, Any]) -> dict[str, float]:
    values = {
        label.removesuffix(" GB/s"): v
        for label, v in row.get("anchors", {}).items()
        if label.endswith(" GB/s") and isinstance(v, (int, float))
    }
    if row.get("name", "").endswith("_limit") and isinstance(row.get("gbps"), (int, float)):
        values[row["name"]] = row["gbps"]
    return values


Line = list[tuple[float, float]]


def _best(points: list[dict[str, Any]], x: str, series: str) -> dict[Any, Line]:
    """For each value of ``series``: (x, best GB/s over the other settings), sorted by x."""
    best: dict[Any, dict[float, float]] = {}
    for p in points:
        xv = p[x] / MiB if x == "chunk_bytes" else p[x]
        line = best.setdefault(p[series], {})
        line[xv] = max(line.get(xv, 0.0), p["gbps"])
    return {key: sorted(line.items()) for key, line in sorted(best.items())}


def _label(setting: str, value: int) -> str:
    if setting == "chunk_bytes":
        return f"chunk_bytes {value / MiB:g} MiB"
    return f"{setting} {value}"


def _panels(results: list[dict[str, Any]]) -> list[Panel]:
    sweeps = {
        row["name"]: row
        for data in results
        if data.get("kind") == "sweep"
        for row in data["rows"]
        if row.get("points")
    }
    bench_rows = {
        row["name"]: (data, row)
        for data in results
        if data.get("kind", "bench") == "bench"
        for row in data["rows"]
        if row.get("status") == "ok"
    }
    panels: list[Panel] = []
    for name, (related, wanted) in PLOTTED_ROWS.items():
        swept = sweeps.get(name)
        bench = bench_rows.get(name)
        if swept is None and bench is None:
            continue
        hlines: dict[str, float] = {}
        for other in related:  # bench figures first; the sweep's (same run as its points) win
            if other in bench_rows:
                hlines |= _anchor_values(bench_rows[other][1])
        if swept is not None:
            hlines |= _anchor_values(swept)
        hlines = {label: hlines[label] for label in wanted if label in hlines}
        points = [p for p in swept["points"] if "gbps" in p] if swept else []
        axes = ["chunk_bytes", "host_threads"]
        if len({p["num_buffers"] for p in points}) > 1:
            axes.append("num_buffers")
        series = {"chunk_bytes": "host_threads", "host_threads": "chunk_bytes"}
        for x in axes:
            panel = Panel(name, x, hlines=dict(hlines))
            by = series.get(x, "chunk_bytes")
            for key, line in _best(points, x, by).items():
                panel.lines[_label(by, key)] = line
            if bench is not None:
                data, row = bench
                xv = data["config"][x] / MiB if x == "chunk_bytes" else data["config"][x]
                panel.markers[f"bench run: {row['name']} at its settings"] = (xv, row["gbps"])
            panels.append(panel)
    return panels


def plot_results(results: list[dict[str, Any]], path: str | os.PathLike[str]) -> list[Panel]:
    """Draw ``results`` (loaded bench and sweep JSON) into a PNG at ``path``.

    Parameters
    ----------
    results : list of dict
        Bench and/or sweep results (``load_results``). Rows without figures
        (skipped, not available) are left out.
    path : str or path-like
        The PNG to write (parents created).

    Returns
    -------
    list of Panel
        What was drawn, panel by panel.

    Raises
    ------
    ValueError
        No row of the results has a figure to plot.
    BackendUnavailableError
        matplotlib is not installed.
    """
    panels = _panels(results)
    if not panels:
        raise ValueError(
            "expected results with a measured d2h_prealloc, h2d_pageable or host_copy row "
            "(got none: every such row was skipped or absent); plot a run that measured one"
        )
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise BackendUnavailableError(
            f"the plot needs matplotlib, which cannot be imported ({exc}); "
            "install it with: pip install matplotlib"
        ) from exc
    names = list(dict.fromkeys(p.row for p in panels))
    cols = max(sum(p.row == n for p in panels) for n in names)
    fig = Figure(figsize=(6.4 * cols, 4.2 * len(names)), layout="constrained")
    axes = fig.subplots(len(names), cols, squeeze=False)
    source = next((r for r in results if r.get("kind") == "sweep"), results[0])
    device = source["device"]
    where = "a machine without a CUDA device" if device == "no CUDA device" else device
    fig.suptitle(f"interop transfer throughput on {where} ({source['date'][:10]})")
    for i, name in enumerate(names):
        row_panels = [p for p in panels if p.row == name]
        for j in range(cols):
            ax = axes[i][j]
            if j >= len(row_panels):
                ax.set_visible(False)
                continue
            _draw(ax, row_panels[j])
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, format="png", dpi=100)
    return panels


def _draw(ax: Any, panel: Panel) -> None:
    for label, line in panel.lines.items():
        ax.plot([x for x, _ in line], [y for _, y in line], marker="o", label=label)
    for label, (x, y) in panel.markers.items():
        ax.plot([x], [y], marker="*", markersize=14, linestyle="none", color="black", label=label)
    styles = ["--", ":", "-.", (0, (5, 1, 1, 1, 1, 1))]
    for k, (label, y) in enumerate(panel.hlines.items()):
        ax.axhline(
            y, linestyle=styles[k % len(styles)], color=f"C{k + 5}", label=f"{label} {y:.1f} GB/s"
        )
    ticks = sorted({x for line in panel.lines.values() for x, _ in line})
    ticks += [x for x, _ in panel.markers.values() if x not in ticks]
    if ticks:  # powers of two, labelled as plain numbers
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(ticks), [f"{x:g}" for x in sorted(ticks)])
        ax.minorticks_off()
    ax.set_xlabel("chunk_bytes (MiB)" if panel.x == "chunk_bytes" else panel.x)
    ax.set_ylabel("GB/s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{panel.row}: throughput against {panel.x}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")


def run_plot(png: str, inputs: Sequence[str]) -> int:
    """``python -m benchmarks plot PNG JSON...``: draw, print what was drawn; exit status."""
    try:
        panels = plot_results(load_results(inputs), png)
    except (OSError, ValueError, BackendUnavailableError) as exc:
        print(f"benchmarks plot: {exc}", file=sys.stderr)
        return 2
    for panel in panels:
        hlines = ", ".join(f"{label} {y:.2f} GB/s" for label, y in panel.hlines.items())
        print(
            f"{panel.row} against {panel.x}: {len(panel.lines)} lines"
            + (f"; horizontal lines: {hlines}" if hlines else "")
        )
    print(f"wrote {png}")
    return 0
