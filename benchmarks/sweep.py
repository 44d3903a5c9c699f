"""Which settings? ``python -m benchmarks.sweep [--quick] [--json PATH] [--chunk-mib LIST] ...``"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from interop.bench.measure import (
    BenchSizes,
    Case,
    MiB,
    Ratio,
    format_bytes,
    gpu_unavailable,
    host_unavailable,
    measure,
    scale_from_env,
)
from interop.bench.rows import BenchContext, host_copy_cases, to_device_case, to_host_case
from interop.bench.run import bench_directory, json_path_problem, log_done, run_header, write_json
from interop.config import config
from interop.errors import BackendUnavailableError

CHECK_STRIDE = 4099  # every CHECK_STRIDE-th element is poisoned and checked at a GPU point
SETTINGS = ("chunk_bytes", "host_threads", "num_buffers")


@dataclasses.dataclass
class Subject:
    """What a row times at each point (``cases``) and once before them (``anchors``)."""

    size: str
    call: str
    reference: str
    cases: dict[str, Case]
    anchors: dict[str, Case]
    sync: Callable[[], object] | None = None


@dataclasses.dataclass(frozen=True)
class SweepRow:
    """A swept row: its name, its call in words, ``gpu``, the ``setup`` making its Subject."""

    name: str
    what: str
    gpu: bool
    setup: Callable[[BenchContext], Subject]
    num_buffers_matters: bool = True


def _d2h_prealloc(ctx: BenchContext) -> Subject:
    g = ctx.gpu()
    out = np.full(g.ref.shape, np.nan, np.float32)  # pageable, touched
    anchors = {
        "cupy.asnumpy(x)": Case(lambda: g.cp.asnumpy(g.x), g.nbytes),
        "cupy.asnumpy(x, out=out)": Case(lambda: g.cp.asnumpy(g.x, out=out), g.nbytes),
        "t.cpu().numpy()": Case(lambda: g.t.cpu().numpy(), g.nbytes),
    }
    ours = to_host_case("copy_to_host(x, out)", g.x, out, g.ref, CHECK_STRIDE)
    cases = {"d2h_limit": g.limit_case(True), "copy_to_host(x, out)": ours}
    size = f"{format_bytes(g.nbytes)} float32"
    return Subject(size, "copy_to_host(x, out)", "d2h_limit", cases, anchors, g.sync)


def _h2d_pageable(ctx: BenchContext) -> Subject:
    g = ctx.gpu()
    host = np.array(g.ref)  # pageable, touched
    anchors = {
        "cupy.asarray(host)": Case(lambda: g.cp.asarray(host), g.nbytes),
        "torch.from_numpy(host).cuda()": Case(lambda: g.th.from_numpy(host).cuda(), g.nbytes),
    }
    ours = to_device_case("copy_to_device(host)", g, host)
    cases = {"h2d_limit": g.limit_case(False), "copy_to_device(host)": ours}
    size = f"{format_bytes(g.nbytes)} float32"
    return Subject(size, "copy_to_device(host)", "h2d_limit", cases, anchors, g.sync)


def _host_copy(ctx: BenchContext) -> Subject:
    cases, nbytes = host_copy_cases(ctx.sizes.host_bytes), ctx.sizes.host_bytes
    return Subject(f"{nbytes / MiB:.0f} MiB float32", "copy_to_host", "numpy.copyto", cases, {})


#: The rows swept by default; ``host_copy`` first (seconds), so a time budget, shared among
#: the rows still to run, leaves what it does not use to the GPU rows.
SWEEP_ROWS = (
    SweepRow("host_copy", "copy_to_host(cpu_tensor, out)", False, _host_copy, False),
    SweepRow("d2h_prealloc", "copy_to_host(x, out), out pageable and touched", True, _d2h_prealloc),
    SweepRow("h2d_pageable", "copy_to_device(host), host pageable", True, _h2d_pageable),
)


def default_grid(quick: bool, cpu_count: int | None = None) -> dict[str, list[int]]:
    """The values swept by default: chunk sizes, thread counts, buffer counts."""
    cores = max(1, cpu_count or os.cpu_count() or 1)
    chunks, threads, buffers = ((8, 32), [1], [2, 4])
    if not quick:
        chunks, threads, buffers = ((4, 8, 16, 32, 64, 128), [1, 2, 4, 8, 16], [2, 3, 4, 6])
    grid = {"chunk_bytes": [n * MiB for n in chunks], "num_buffers": buffers}
    grid["host_threads"] = [n for n in threads if n <= cores] + [cores]
    return {name: sorted(set(values) | {getattr(config, name)}) for name, values in grid.items()}


def _check_grid(grid: dict[str, list[int]]) -> None:
    """Every value is one ``interop.config`` accepts, and no list is empty."""
    for name in SETTINGS:
        values = grid.get(name)
        if not values:
            raise ValueError(f"expected at least one value of {name} to sweep (got {values!r})")
        for value in values:
            with config.set(**{name: value}):
                pass


def _measure_point(subject: Subject, point: dict[str, int], repeats: int) -> dict[str, Any]:
    try:
        with config.set(**point):
            got = measure(subject.cases, repeats, sync=subject.sync)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        return point | {"error": f"{type(exc).__name__}: {exc}"}
    ours, ref = got[subject.call].gbps, got[subject.reference].gbps
    return point | {
        "gbps": ours,
        "reference_gbps": ref,
        "ratio": Ratio.between(subject.call, "throughput", subject.reference, ours, ref).record(),
        "samples": {label: m.record() for label, m in got.items()},
    }


def sweep_row(
    row: SweepRow,
    ctx: BenchContext,
    grid: dict[str, list[int]],
    repeats: int,
    reason: str | None,
    deadline: float | None = None,
    on_point: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """One row over ``grid``; points not started by ``deadline`` are counted, not run."""
    if not row.num_buffers_matters:
        grid = grid | {"num_buffers": [config.num_buffers]}
    record: dict[str, Any] = {"name": row.name, "what": row.what, "grid": grid}
    if reason is not None:
        return record | {"status": "skipped", "reason": reason}
    points: list[dict[str, Any]] = []
    record |= {"status": "ok", "points": points, "points_not_run": 0}
    buffers = sorted(grid["num_buffers"], key=lambda b: (b != config.num_buffers, b))
    try:
        subject = row.setup(ctx)
        anchors = measure(subject.anchors, repeats, sync=subject.sync) if subject.anchors else {}
        record |= {"size": subject.size, "call": subject.call, "reference": subject.reference}
        record["anchors"] = {f"{label} GB/s": m.gbps for label, m in anchors.items()}
        record["samples"] = {label: m.record() for label, m in anchors.items()}
        for b, c, t in itertools.product(buffers, grid["chunk_bytes"], grid["host_threads"]):
            if deadline is not None and time.monotonic() >= deadline:
                record["points_not_run"] += 1
                continue
            point = {"chunk_bytes": c, "host_threads": t, "num_buffers": b}
            points.append(_measure_point(subject, point, repeats))
            if on_point is not None:
                on_point(record | {"points": list(points)})  # a snapshot: the list grows
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        record |= {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}
    ctx.noting(f"after {row.name}", ctx.release)  # e.g. a sticky CUDA error: points kept
    measured = [p for p in points if "gbps" in p]
    if measured:
        reference = statistics.median(p["reference_gbps"] for p in measured)
        record["anchors"][f"{record['reference']} GB/s"] = reference
        record["best"] = max(measured, key=lambda p: p["gbps"])
    return record


def sweep(
    sizes: BenchSizes,
    grid: dict[str, list[int]],
    rows: Sequence[SweepRow] = SWEEP_ROWS,
    *,
    quick: bool = False,
    max_seconds: float | None = None,
    on_point: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Sweep ``rows`` over every combination of ``grid``, within ``max_seconds``."""
    _check_grid(grid)
    header = run_header("sweep", sizes, quick) | {"grid": grid}
    gpu_reason, host_reason = gpu_unavailable(), host_unavailable()
    repeats = max(2, sizes.repeats - 2)
    ctx = BenchContext(sizes, bench_directory())
    start = time.monotonic()
    done: list[dict[str, Any]] = []

    def partial(*current: dict[str, Any]) -> None:
        if on_point is not None:
            on_point(header | {"notes": ctx.notes, "rows": [*done, *current], "partial": True})

    try:
        for i, row in enumerate(rows):
            deadline = None
            if max_seconds is not None:
                now = time.monotonic()
                deadline = now + (start + max_seconds - now) / (len(rows) - i)
            began = time.perf_counter()
            reason = gpu_reason if row.gpu else host_reason
            done.append(sweep_row(row, ctx, grid, repeats, reason, deadline, partial))
            log_done("sweep", row.name, done[-1]["status"], began)
            partial()
    finally:
        ctx.noting("at the end", ctx.close)
    results = header | {"notes": ctx.notes, "rows": done}
    return results | {"suggested_defaults": suggest_defaults(results)}


def suggest_defaults(
    results: dict[str, Any],
    rows: Sequence[str] = ("d2h_prealloc", "h2d_pageable"),
    tolerance: float = 0.05,
) -> dict[str, Any] | None:
    """The cheapest point (smallest ring, then threads, buffers) within ``tolerance`` of the
    best worst-row fraction of each row's best; None without a point measured in every row."""
    measured = {
        row["name"]: {
            tuple(p[k] for k in SETTINGS): p["gbps"] for p in row.get("points", []) if "gbps" in p
        }
        for row in results["rows"]
        if row["name"] in rows
    }
    if set(measured) != set(rows) or not all(measured.values()):
        return None
    best = {name: max(points.values()) for name, points in measured.items()}
    common = set.intersection(*(set(points) for points in measured.values()))
    if not common or min(best.values()) <= 0:
        return None
    score = {key: min(measured[name][key] / best[name] for name in rows) for key in common}
    top = max(score.values())
    # the smallest ring (chunk_bytes x num_buffers), then threads, then buffers
    chosen = min(
        (k for k in common if score[k] >= top * (1 - tolerance)),
        key=lambda k: (k[0] * k[2], k[1], k[2]),
    )
    return {
        "settings": dict(zip(SETTINGS, chosen, strict=True)),
        "score": score[chosen],
        "best_score": top,
        "rows": {name: {"gbps": measured[name][chosen], "best_gbps": best[name]} for name in rows},
        "rule": (
            f"of the points within {tolerance:.0%} of the best worst-row fraction of each row's "
            "best throughput, the smallest ring, then the fewest host threads and buffers"
        ),
    }


def _settings_text(p: dict[str, Any]) -> str:
    return ", ".join(f"{k} {format_bytes(p[k]) if k == 'chunk_bytes' else p[k]}" for k in SETTINGS)


def format_sweep(results: dict[str, Any], top: int = 8) -> str:
    """The printed summary of a sweep: anchors, best points, the defaults' figures."""
    now = results["config"]
    lines = [
        "benchmarks sweep" + (" (--quick: a smoke run)" if results.get("quick") else ""),
        f"device   {results['device']}",
        f"run      {results['date']}, commit {results['commit'][:12]}",
        f"settings now: {_settings_text(now)}",
    ]
    not_run: dict[tuple[str, str], list[str]] = {}
    for row in results["rows"]:
        if "points" not in row:
            not_run.setdefault((row["status"], row["reason"]), []).append(row["name"])
            continue
        lines += ["", f"{row['name']}: {row.get('call', row['what'])}, {row.get('size', '')}"]
        lines += [f"  error: {row['reason']}"] if row["status"] == "error" else []
        anchors = [f"{k[:-5]} {v:.2f} GB/s" for k, v in row.get("anchors", {}).items()]
        lines += [f"  anchors: {', '.join(anchors)}"] if anchors else []
        measured = sorted((p for p in row["points"] if "gbps" in p), key=lambda p: -p["gbps"])
        for p in measured[:top]:
            value = p["ratio"]["value"]
            ratio = "n/a" if value is None else f"{value:.2f}x"
            to = f"{ratio} the throughput of {row['reference']}"
            lines.append(f"  {p['gbps']:7.2f} GB/s  {to}  at {_settings_text(p)}")
        current = [p for p in measured if all(p[k] == now[k] for k in SETTINGS)]
        lines += [f"  settings now: {current[0]['gbps']:.2f} GB/s"] if current else []
        errors = [p for p in row["points"] if "error" in p]
        lines += [f"  error at {_settings_text(p)}: {p['error']}" for p in errors]
        if row["points_not_run"]:
            lines.append(f"  {row['points_not_run']} points not run: the time budget ran out")
    suggested = suggest_defaults(results)
    if suggested is not None:
        at = ", ".join(
            f"{name} {v['gbps']:.2f} GB/s ({v['gbps'] / v['best_gbps']:.0%} of its best)"
            for name, v in suggested["rows"].items()
        )
        lines += ["", f"suggested defaults: {_settings_text(suggested['settings'])}: {at}"]
        lines.append(f"  rule: {suggested['rule']}")
    lines += [""] if not_run else []
    lines += [
        f"{status} ({', '.join(names)}): {reason}" for (status, reason), names in not_run.items()
    ]
    notes = results.get("notes", {})
    lines += [f"note: releasing caches failed {error}" for error in notes.get("release_errors", [])]
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    try:
        values = [int(part, 0) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of positive integers, e.g. 4,8,16 (got {text!r})"
        )
    return values


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks sweep``: the exit status (1 if a row failed, 2 bad usage)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks sweep", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="small arrays, a two-value grid")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    for flag, kind, default in (
        ("--chunk-mib", _ints, "4,8,16,32,64,128 (--quick 8,32)"),
        ("--host-threads", _ints, "powers of two up to the cores"),
        ("--num-buffers", _ints, "2,3,4,6 (--quick 2,4)"),
        ("--rows", str, "host_copy,d2h_prealloc,h2d_pageable"),
        ("--max-seconds", float, "none; points not started in time are not run"),
    ):
        parser.add_argument(flag, type=kind, metavar="LIST", help=f"default: {default}")
    args = parser.parse_args(argv)
    named = {row.name: row for row in SWEEP_ROWS}
    chosen = [name.strip() for name in (args.rows or ",".join(named)).split(",") if name.strip()]
    given = {"host_threads": args.host_threads, "num_buffers": args.num_buffers}
    given["chunk_bytes"] = [n << 20 for n in args.chunk_mib or []]
    try:
        if any(name not in named for name in chosen):
            raise ValueError(f"expected rows among {sorted(named)} (got {chosen!r})")
        if args.max_seconds is not None and not args.max_seconds > 0:
            raise ValueError(f"expected a positive number of seconds (got {args.max_seconds})")
        sizes = BenchSizes.choose(args.quick, scale_from_env())
        grid = default_grid(args.quick) | {k: v for k, v in given.items() if v}
        _check_grid(grid)
        problem = json_path_problem(args.json) if args.json else None
        if problem is not None:
            raise ValueError(problem)
    except (ValueError, TypeError) as exc:
        print(f"benchmarks sweep: {exc}", file=sys.stderr)
        return 2
    save = (lambda partial: write_json(partial, args.json)) if args.json else None
    rows = [named[n] for n in chosen]
    results = sweep(
        sizes, grid, rows, quick=args.quick, max_seconds=args.max_seconds, on_point=save
    )
    print(format_sweep(results))
    if args.json:
        print(f"wrote {write_json(results, args.json)}")
    done = results["rows"]
    failed = [row for row in done if row["status"] == "error"]
    failed += [p for row in done for p in row.get("points", []) if "error" in p]
    return 1 if failed else 0


# ------------------------------------------------------------------ the plot

#: Per plotted row: the bench rows whose figures and anchors it draws, and the anchors drawn.
PLOTTED_ROWS = {
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
    """A ``row``'s throughput against ``x``: swept ``lines``, ``hlines`` and bench ``markers``."""

    row: str
    x: str
    lines: dict[str, list[tuple[float, float]]] = dataclasses.field(default_factory=dict)
    hlines: dict[str, float] = dataclasses.field(default_factory=dict)
    markers: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)


def _anchor_values(row: dict[str, Any]) -> dict[str, float]:
    values = {
        label.removesuffix(" GB/s"): v
        for label, v in row.get("anchors", {}).items()
        if label.endswith(" GB/s") and isinstance(v, (int, float))
    }
    if row.get("name", "").endswith("_limit") and isinstance(row.get("gbps"), (int, float)):
        values[row["name"]] = row["gbps"]
    return values


def _at(point: dict[str, Any], setting: str) -> float:
    return point[setting] / MiB if setting == "chunk_bytes" else point[setting]


def _label(setting: str, value: int) -> str:
    return f"chunk_bytes {value / MiB:g} MiB" if setting == "chunk_bytes" else f"{setting} {value}"


def _panels(results: list[dict[str, Any]]) -> list[Panel]:
    swept_runs = [d for d in results if d.get("kind") == "sweep"]
    sweeps = {r["name"]: r for d in swept_runs for r in d["rows"] if r.get("points")}
    benches = [d for d in results if d.get("kind", "bench") == "bench"]
    bench = {r["name"]: (d, r) for d in benches for r in d["rows"] if r.get("status") == "ok"}
    panels: list[Panel] = []
    for name, (related, wanted) in PLOTTED_ROWS.items():
        swept, ran = sweeps.get(name), bench.get(name)
        if swept is None and ran is None:
            continue
        hlines: dict[str, float] = {}
        for other in related:  # bench figures first; the sweep's (same run as its points) win
            hlines |= _anchor_values(bench[other][1]) if other in bench else {}
        hlines |= _anchor_values(swept) if swept else {}
        hlines = {label: hlines[label] for label in wanted if label in hlines}
        points = [p for p in swept["points"] if "gbps" in p] if swept else []
        buffers_swept = len({p["num_buffers"] for p in points}) > 1
        axes = ["chunk_bytes", "host_threads"] + ["num_buffers"] * buffers_swept
        for x in axes:
            panel = Panel(name, x, hlines=dict(hlines))
            by = "chunk_bytes" if x != "chunk_bytes" else "host_threads"
            best: dict[Any, dict[float, float]] = {}  # per line, the best GB/s at each x
            for p in points:
                line = best.setdefault(p[by], {})
                line[_at(p, x)] = max(line.get(_at(p, x), 0.0), p["gbps"])
            panel.lines = {
                _label(by, key): sorted(line.items()) for key, line in sorted(best.items())
            }
            if ran is not None:
                at = (_at(ran[0]["config"], x), ran[1]["gbps"])
                panel.markers[f"bench run: {name} at its settings"] = at
            panels.append(panel)
    return panels


def plot_results(results: list[dict[str, Any]], path: str | os.PathLike[str]) -> list[Panel]:
    """Draw ``results`` (bench and sweep JSON) into a PNG at ``path``, two panels a line, each
    legend below its plot; the panels. ValueError without a figure to draw."""
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
    # each legend in an axes below its plot (0.2 inch an entry); 6.88 in: the docs' 688 px column
    rows = {p.row: [q for q in panels if q.row == p.row] for p in panels}
    grid = [ps[i : i + 2] for ps in rows.values() for i in range(0, len(ps), 2)]
    entries = [max(len(p.lines) + len(p.markers) + len(p.hlines) for p in ps) for ps in grid]
    heights = [h for n in entries for h in (2.3, 0.2 * n + 0.1)]
    fig = Figure(figsize=(6.88, sum(heights) + 0.8 * len(grid)), layout="constrained")
    axes = fig.subplots(2 * len(grid), 2, squeeze=False, height_ratios=heights)
    source = next((r for r in results if r.get("kind") == "sweep"), results[0])
    where = source["device"].replace("no CUDA device", "a machine without a CUDA device")
    fig.suptitle(f"interop transfer throughput on {where} ({source['date'][:10]})")
    for i, line in enumerate(grid):
        for j in range(2):
            axes[2 * i + 1][j].set_axis_off()
            if j < len(line):
                _draw(axes[2 * i][j], line[j], axes[2 * i + 1][j])
            else:
                axes[2 * i][j].set_visible(False)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=200)
    return panels


def _draw(ax: Any, panel: Panel, below: Any) -> None:
    for label, line in panel.lines.items():
        ax.plot([x for x, _ in line], [y for _, y in line], marker="o", label=label)
    for label, (x, y) in panel.markers.items():
        ax.plot([x], [y], marker="*", markersize=14, linestyle="none", color="black", label=label)
    styles = ["--", ":", "-.", (0, (5, 1, 1, 1, 1, 1))]
    for k, (label, y) in enumerate(panel.hlines.items()):
        ax.axhline(
            y, linestyle=styles[k % len(styles)], color=f"C{k + 5}", label=f"{label} {y:.1f} GB/s"
        )
    xs = [x for line in panel.lines.values() for x, _ in line]
    ticks = sorted({*xs, *(x for x, _ in panel.markers.values())})
    if ticks:  # powers of two, labelled as plain numbers
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [f"{x:g}" for x in ticks])
        ax.minorticks_off()
    ax.set_xlabel("chunk_bytes (MiB)" if panel.x == "chunk_bytes" else panel.x)
    ax.set_ylabel("GB/s")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.08)  # room for a star at the top
    ax.set_title(f"{panel.row} against {panel.x}", fontsize="medium")
    ax.grid(True, alpha=0.3)
    below.legend(*ax.get_legend_handles_labels(), loc="upper center", fontsize="small")


def plot_main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks plot PNG JSON...``: draw, say what was drawn; the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks plot", description="draw bench and sweep JSON into a PNG"
    )
    parser.add_argument("png", metavar="PNG")
    parser.add_argument("inputs", nargs="+", metavar="JSON", help="bench or sweep results")
    args = parser.parse_args(argv)
    try:
        results = [json.loads(Path(path).read_text()) for path in args.inputs]
        if not all(isinstance(r, dict) and isinstance(r.get("rows"), list) for r in results):
            raise ValueError(
                f"expected bench or sweep JSON files with a 'rows' list (got {args.inputs}); "
                "make one with python -m benchmarks run --json PATH (or sweep --json PATH)"
            )
        panels = plot_results(results, args.png)
    except (OSError, ValueError, BackendUnavailableError) as exc:
        print(f"benchmarks plot: {exc}", file=sys.stderr)
        return 2
    for panel in panels:
        hlines = ", ".join(f"{label} {y:.2f} GB/s" for label, y in panel.hlines.items())
        drawn = f"{panel.row} against {panel.x}: {len(panel.lines)} lines"
        print(drawn + (f"; horizontal lines: {hlines}" if hlines else ""))
    print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
