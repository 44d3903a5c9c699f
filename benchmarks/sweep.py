"""The sweep: transfer throughput over ``chunk_bytes`` x ``host_threads`` x ``num_buffers``.

Each point sets the three values with ``interop.config.set`` and times the
row's interop call interleaved with its reference (the pinned-link limit for
the GPU rows, one ``numpy.copyto`` for ``host_copy``), so every point's ratio
holds on a noisy machine. Each point's first call is checked (a wrong copy is
an error, never a figure). The anchors users compare with (``cupy.asnumpy``,
``t.cpu()``, ``cupy.asarray``) do not depend on interop's settings and are
measured once per row.

GPU rows (``d2h_prealloc``, ``h2d_pageable``) run where CuPy and PyTorch see
a CUDA device; ``host_copy`` runs anywhere (its engine needs no staging
ring, so ``num_buffers`` is not swept for it).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from interop.bench.measure import BenchSizes, Case, GiB, Measured, MiB, measure, scale_from_env
from interop.bench.report import format_bytes
from interop.bench.results import (
    Ratio,
    gpu_unavailable,
    host_unavailable,
    json_path_problem,
    run_header,
    write_json,
)
from interop.bench.rows import (
    BenchContext,
    GpuArrays,
    d2h_prealloc_cases,
    h2d_pageable_cases,
    host_copy_cases,
)
from interop.bench.run import bench_directory, log_done
from interop.config import config

__all__ = [
    "SWEEP_ROWS",
    "Subject",
    "SweepRow",
    "default_grid",
    "format_sweep",
    "run_sweep",
    "sweep",
]

#: Every ``CHECK_STRIDE``-th element is poisoned and checked at each GPU point (a prime).
CHECK_STRIDE = 4099
SETTINGS = ("chunk_bytes", "host_threads", "num_buffers")


@dataclasses.dataclass
class Subject:
    """What a sweep row times at each point, made once per row.

    Attributes
    ----------
    size : str
        The array measured, in words.
    call, reference : str
        Labels in ``cases``: the interop call and what its ratio is taken to.
    cases : dict of str to Case
        Measured at every point, interleaved.
    anchors : dict of str to Case
        Measured once, before the points (they ignore interop's settings).
    measure : callable
        ``measure(cases, repeats)`` returning :class:`~interop.bench.measure.Measured`
        by label.
    """

    size: str
    call: str
    reference: str
    cases: dict[str, Case]
    anchors: dict[str, Case]
    measure: Callable[[dict[str, Case], int], dict[str, Measured]]


@dataclasses.dataclass(frozen=True)
class SweepRow:
    """One swept row.

    Attributes
    ----------
    name, what : str
        The bench row it sweeps, and its call in words.
    gpu : bool
        Needs a CUDA device visible to CuPy and PyTorch.
    setup : callable
        Makes the row's :class:`Subject` from the run's context.
    num_buffers_matters : bool
        False where the path has no staging ring: ``num_buffers`` stays at
        its current value.
    """

    name: str
    what: str
    gpu: bool
    setup: Callable[[BenchContext], Subject]
    num_buffers_matters: bool = True


def _gpu_measure(g: GpuArrays) -> Callable[[dict[str, Case], int], dict[str, Measured]]:
    return lambda cases, repeats: measure(cases, repeats, sync=g.sync)


def _d2h_prealloc(ctx: BenchContext) -> Subject:
    g = ctx.gpu()
    cp = g.cp
    out = np.full(g.ref.shape, np.nan, np.float32)  # pageable, touched
    return Subject(
        size=f"{g.nbytes / GiB:.2f} GiB float32",
        call="copy_to_host(x, out)",
        reference="d2h_limit",
        cases=d2h_prealloc_cases(g, out, every=CHECK_STRIDE),
        anchors={
            "cupy.asnumpy(x)": Case(lambda: cp.asnumpy(g.x), g.nbytes),
            "cupy.asnumpy(x, out=out)": Case(lambda: cp.asnumpy(g.x, out=out), g.nbytes),
            "t.cpu().numpy()": Case(lambda: g.t.cpu().numpy(), g.nbytes),
        },
        measure=_gpu_measure(g),
    )


def _h2d_pageable(ctx: BenchContext) -> Subject:
    g = ctx.gpu()
    cp, th = g.cp, g.th
    host = np.array(g.ref)  # pageable, touched
    return Subject(
        size=f"{g.nbytes / GiB:.2f} GiB float32",
        call="copy_to_device(host)",
        reference="h2d_limit",
        cases=h2d_pageable_cases(g, host),
        anchors={
            "cupy.asarray(host)": Case(lambda: cp.asarray(host), g.nbytes),
            "torch.from_numpy(host).cuda()": Case(lambda: th.from_numpy(host).cuda(), g.nbytes),
        },
        measure=_gpu_measure(g),
    )


def _host_copy(ctx: BenchContext) -> Subject:
    cases, nbytes = host_copy_cases(ctx.sizes.host_bytes)
    return Subject(
        size=f"{nbytes / MiB:.0f} MiB float32",
        call="copy_to_host",
        reference="numpy.copyto",
        cases=cases,
        anchors={},
        measure=lambda cases, repeats: measure(cases, repeats),
    )


#: The rows a sweep measures by default. ``host_copy`` comes first: it takes seconds, and a
#: time budget is shared among the rows still to run, so what it leaves goes to the GPU rows.
SWEEP_ROWS: tuple[SweepRow, ...] = (
    SweepRow(
        "host_copy",
        "copy_to_host(cpu_tensor, out)",
        False,
        _host_copy,
        num_buffers_matters=False,
    ),
    SweepRow(
        "d2h_prealloc",
        "copy_to_host(x, out), out pageable and touched",
        True,
        _d2h_prealloc,
    ),
    SweepRow(
        "h2d_pageable",
        "copy_to_device(host), host pageable",
        True,
        _h2d_pageable,
    ),
)


def _threads(cpu_count: int, candidates: Sequence[int]) -> list[int]:
    return sorted({n for n in candidates if n <= cpu_count} | {cpu_count})


def default_grid(quick: bool, cpu_count: int | None = None) -> dict[str, list[int]]:
    """The values swept by default, by setting name.

    ``host_threads`` goes in powers of two up to the machine's cores (and
    includes the core count); a ``quick`` grid has about two values per
    setting. Every grid includes the current settings, so the report can set
    them beside the best point.
    """
    cores = max(1, cpu_count or os.cpu_count() or 1)
    if quick:
        grid = {
            "chunk_bytes": [8 * MiB, 32 * MiB],
            "host_threads": _threads(cores, [1]),
            "num_buffers": [2, 4],
        }
    else:
        grid = {
            "chunk_bytes": [n * MiB for n in (4, 8, 16, 32, 64, 128)],
            "host_threads": _threads(cores, [1, 2, 4, 8, 16]),
            "num_buffers": [2, 3, 4, 6],
        }
    return {name: sorted(set(values) | {getattr(config, name)}) for name, values in grid.items()}


def _check_grid(grid: dict[str, list[int]]) -> None:
    """Every value is accepted by ``interop.config`` (its own validation), and no list is empty."""
    for name in SETTINGS:
        values = grid.get(name)
        if not values:
            raise ValueError(f"expected at least one value of {name} to sweep (got {values!r})")
        for value in values:
            with config.set(**{name: value}):
                pass


def _points(grid: dict[str, list[int]]) -> list[dict[str, int]]:
    """The grid's points: the current ``num_buffers`` plane first, so a cut-short sweep has it."""
    buffers = sorted(grid["num_buffers"], key=lambda b: (b != config.num_buffers, b))
    return [
        {"chunk_bytes": c, "host_threads": t, "num_buffers": b}
        for b, c, t in itertools.product(buffers, grid["chunk_bytes"], grid["host_threads"])
    ]


def _measure_point(subject: Subject, point: dict[str, int], repeats: int) -> dict[str, Any]:
    try:
        with config.set(**point):
            got = subject.measure(subject.cases, repeats)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        return point | {"error": f"{type(exc).__name__}: {exc}"}
    ours, ref = got[subject.call], got[subject.reference]
    ratio = Ratio.between(subject.call, "throughput", subject.reference, ours.gbps, ref.gbps)
    return point | {
        "gbps": ours.gbps,
        "reference_gbps": ref.gbps,
        "ratio": ratio.record(),
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
    """Sweep one row over ``grid``; points not started by ``deadline`` (monotonic) are counted.

    Returns
    -------
    dict
        ``name``, ``what``, ``status``, ``grid``, and when it ran ``size``,
        ``call``, ``reference``, ``anchors`` (GB/s, the reference's median
        over the points included), ``points`` (each with its settings and
        ``gbps``, ``reference_gbps``, ``ratio`` and ``samples``, or ``error``),
        ``points_not_run`` and ``best``.
    """
    if not row.num_buffers_matters:
        grid = grid | {"num_buffers": [config.num_buffers]}
    record: dict[str, Any] = {"name": row.name, "what": row.what, "grid": grid}
    if reason is not None:
        return record | {"status": "skipped", "reason": reason}
    points: list[dict[str, Any]] = []
    record |= {"status": "ok", "points": points, "points_not_run": 0}
    try:
        subject = row.setup(ctx)
        anchors = subject.measure(subject.anchors, repeats) if subject.anchors else {}
        record |= {
            "size": subject.size,
            "call": subject.call,
            "reference": subject.reference,
            "anchors": {f"{label} GB/s": m.gbps for label, m in anchors.items()},
        }
        for point in _points(grid):
            if deadline is not None and time.monotonic() >= deadline:
                record["points_not_run"] += 1
                continue
            points.append(_measure_point(subject, point, repeats))
            if on_point is not None:
                on_point(record)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        record |= {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}
    try:
        ctx.release()
    except Exception as exc:  # e.g. a sticky CUDA error: the points measured are kept
        traceback.print_exc(file=sys.stderr)
        ctx.notes.setdefault("release_errors", []).append(
            f"after {row.name}: {type(exc).__name__}: {exc}"
        )
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
    workdir: str | None = None,
    on_point: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Sweep ``rows`` over ``grid`` and return the results with the run's context.

    Parameters
    ----------
    sizes : BenchSizes
        Array sizes (``gpu_bytes``, ``host_bytes``) and repeats (two fewer
        than the bench's, at least 2).
    grid : dict
        ``chunk_bytes``, ``host_threads`` and ``num_buffers``: the values to
        sweep (every combination).
    rows : sequence of SweepRow
    quick : bool
        Recorded in the results (a smoke run).
    max_seconds : float, optional
        Time budget: each row gets an equal share of what is left when it
        starts, and points not started in time are counted as not run.
    workdir : str, optional
        Scratch directory (as for the bench).
    on_point : callable, optional
        Called after every point with the results so far (``"partial": True``).

    Returns
    -------
    dict
        The run header (``kind: "sweep"``), ``grid``, ``notes`` and ``rows``
        (see :func:`sweep_row`).

    Raises
    ------
    ValueError, TypeError
        A grid value ``interop.config`` refuses, or an empty list; raised
        before anything is measured.
    """
    _check_grid(grid)
    header = run_header("sweep", sizes, quick) | {"grid": grid}
    gpu_reason, host_reason = gpu_unavailable(), host_unavailable()
    repeats = max(2, sizes.repeats - 2)
    ctx = BenchContext(sizes, bench_directory(workdir))
    start = time.monotonic()
    done: list[dict[str, Any]] = []

    def partial(current: dict[str, Any]) -> None:
        if on_point is not None:
            now = current | {"points": list(current["points"])}  # a snapshot: it grows
            on_point(header | {"notes": ctx.notes, "rows": [*done, now], "partial": True})

    try:
        for i, row in enumerate(rows):
            deadline = None
            if max_seconds is not None:
                now = time.monotonic()
                deadline = now + (start + max_seconds - now) / (len(rows) - i)
            reason = gpu_reason if row.gpu else host_reason
            began = time.perf_counter()
            done.append(sweep_row(row, ctx, grid, repeats, reason, deadline, partial))
            log_done("sweep", row.name, done[-1]["status"], began)
            if on_point is not None:
                on_point(header | {"notes": ctx.notes, "rows": list(done), "partial": True})
    finally:
        ctx.close_keeping_results()
    results = header | {"notes": ctx.notes, "rows": done}
    return results | {"suggested_defaults": suggest_defaults(results)}


def _settings_text(point: dict[str, Any]) -> str:
    return (
        f"chunk_bytes {format_bytes(point['chunk_bytes'])}, host_threads {point['host_threads']}, "
        f"num_buffers {point['num_buffers']}"
    )


TRANSFER_ROWS = ("d2h_prealloc", "h2d_pageable")


def suggest_defaults(
    results: dict[str, Any], rows: Sequence[str] = TRANSFER_ROWS, tolerance: float = 0.05
) -> dict[str, Any] | None:
    """The settings to make the defaults, from a sweep's points.

    Each point measured in every one of ``rows`` scores the smallest of its
    throughputs there, each divided by that row's best. Among the points
    that score within ``tolerance`` of the best score, the one that costs
    least is chosen: the smallest ring (``num_buffers x chunk_bytes``, pinned
    memory held per device), then the fewest host threads, then the fewest
    buffers. Both directions share the settings, so no row is sacrificed to
    the other.

    Returns
    -------
    dict or None
        ``settings`` (the chosen point), ``score`` and ``best_score``, per row
        its ``gbps`` there and its ``best_gbps``, and ``rule`` (this rule in
        words); None when no point was measured in every row (the rows were
        skipped, cut short or failed).
    """
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

    def cost(key: tuple[int, ...]) -> tuple[int, int, int]:
        p = dict(zip(SETTINGS, key, strict=True))
        return p["chunk_bytes"] * p["num_buffers"], p["host_threads"], p["num_buffers"]

    chosen = min((key for key in common if score[key] >= top * (1 - tolerance)), key=cost)
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


def format_sweep(results: dict[str, Any], top: int = 8) -> str:
    """The printed summary of a sweep: per row its anchors, best points and the current settings.

    Every ratio is "Nx the throughput of" the row's reference (higher is better).
    """
    current = results["config"]
    lines = [
        "benchmarks sweep" + (" (--quick: a smoke run)" if results.get("quick") else ""),
        f"device   {results['device']}",
        f"run      {results['date']}, commit {results['commit'][:12]}",
        f"settings now: {_settings_text(current)}",
    ]
    not_run: dict[tuple[str, str], list[str]] = {}
    for row in results["rows"]:
        if "points" not in row:
            not_run.setdefault((row["status"], row["reason"]), []).append(row["name"])
            continue
        lines.append("")
        lines.append(f"{row['name']}: {row.get('call', row['what'])}, {row.get('size', '')}")
        if row["status"] == "error":
            lines.append(f"  error: {row['reason']}")
        anchors = ", ".join(
            f"{label.removesuffix(' GB/s')} {v:.2f} GB/s"
            for label, v in row.get("anchors", {}).items()
        )
        if anchors:
            lines.append(f"  anchors: {anchors}")
        measured = sorted(
            (p for p in row["points"] if "gbps" in p), key=lambda p: p["gbps"], reverse=True
        )
        for p in measured[:top]:
            value = p["ratio"]["value"]
            ratio = "n/a" if value is None else f"{value:.2f}x"
            lines.append(
                f"  {p['gbps']:7.2f} GB/s  {ratio} the throughput of {row['reference']}  "
                f"at {_settings_text(p)}"
            )
        now = [p for p in measured if all(p[k] == current[k] for k in SETTINGS)]
        if now:
            lines.append(f"  settings now: {now[0]['gbps']:.2f} GB/s")
        errors = [p for p in row["points"] if "error" in p]
        for p in errors:
            lines.append(f"  error at {_settings_text(p)}: {p['error']}")
        if row["points_not_run"]:
            lines.append(f"  {row['points_not_run']} points not run: the time budget ran out")
    suggested = suggest_defaults(results)
    if suggested is not None:
        at = ", ".join(
            f"{name} {v['gbps']:.2f} GB/s ({v['gbps'] / v['best_gbps']:.0%} of its best)"
            for name, v in suggested["rows"].items()
        )
        lines += [
            "",
            f"suggested defaults: {_settings_text(suggested['settings'])}: {at}",
            f"  rule: {suggested['rule']}",
        ]
    if not_run:
        lines.append("")
    for (status, reason), names in not_run.items():
        lines.append(f"{status} ({', '.join(names)}): {reason}")
    notes = results.get("notes", {})
    lines += [f"note: releasing caches failed {error}" for error in notes.get("release_errors", [])]
    if notes.get("close_error"):
        lines.append(f"note: closing the GPU arrays failed: {notes['close_error']}")
    return "\n".join(lines)


def run_sweep(
    quick: bool = False,
    json_path: str | None = None,
    grid: dict[str, list[int]] | None = None,
    max_seconds: float | None = None,
    rows: Sequence[str] | None = None,
) -> int:
    """Run the sweep, print its summary, optionally write JSON; return the exit status.

    Parameters
    ----------
    quick : bool
        Smaller arrays, fewer repeats and a two-value default grid.
    json_path : str, optional
        Where to write the results (rewritten after every point with
        ``"partial": true``; the final file has no ``partial`` key).
    grid : dict, optional
        Values to sweep by setting name; missing settings use
        :func:`default_grid`.
    max_seconds : float, optional
        Time budget (see :func:`sweep`).
    rows : sequence of str, optional
        Names of the rows to sweep (default: all of :data:`SWEEP_ROWS`).

    Returns
    -------
    int
        0 when every row ran or was skipped for a stated reason, 1 when a
        row or a point failed (traceback on stderr), 2 for bad arguments or
        a bad ``INTEROP_BENCH_SCALE``.
    """
    chosen = list(SWEEP_ROWS)
    if rows:
        names = {row.name: row for row in SWEEP_ROWS}
        unknown = [name for name in rows if name not in names]
        if unknown:
            print(
                f"benchmarks sweep: expected rows among {sorted(names)} (got {unknown!r})",
                file=sys.stderr,
            )
            return 2
        chosen = [names[name] for name in rows]
    try:
        sizes = BenchSizes.choose(quick, scale_from_env())
        full_grid = default_grid(quick) | (grid or {})
        _check_grid(full_grid)
        problem = json_path_problem(json_path) if json_path else None
        if problem is not None:
            raise ValueError(problem)
    except (ValueError, TypeError) as exc:
        print(f"benchmarks sweep: {exc}", file=sys.stderr)
        return 2

    def save_partial(partial: dict[str, Any]) -> None:
        if json_path:
            write_json(partial, json_path)

    results = sweep(
        sizes, full_grid, chosen, quick=quick, max_seconds=max_seconds, on_point=save_partial
    )
    print(format_sweep(results))
    if json_path:
        print(f"wrote {write_json(results, json_path)}")
    failed = any(
        row["status"] == "error" or any("error" in p for p in row.get("points", []))
        for row in results["rows"]
    )
    return 1 if failed else 0
