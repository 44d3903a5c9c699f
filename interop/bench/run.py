"""Running the rows; what a results file records (the run's header: device, versions, commit,
date, machine; each row measured, skipped or failed with its reason); the table it prints."""

from __future__ import annotations

import dataclasses
import datetime
import glob
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from .. import _backends
from ..config import config
from ..info import collect_info
from .measure import BenchSizes, format_bytes, gpu_unavailable, host_unavailable, scale_from_env
from .rows import ROWS, BenchContext, RowSpec

#: Version of the JSON layout (3: ``machine`` and ``judged``; ``target`` and ``met`` only where
#: a run judged them; 2: ``ratios`` a list of objects with their direction).
SCHEMA = 3
Row = dict[str, Any]


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _gpu_numa_node() -> int | None:
    if gpu_unavailable() is not None:
        return None
    try:  # -1 where the kernel does not know
        cp = _backends.cupy()
        bus = cp.cuda.runtime.deviceGetPCIBusId(cp.cuda.runtime.getDevice()).lower()
        return int(_read(f"/sys/bus/pci/devices/{bus}/numa_node") or "")
    except Exception:  # an old driver, no sysfs: the fact is unknown, not an error
        return None


def machine() -> dict[str, Any]:
    """The machine's facts from ``/proc``, ``/sys`` and libc; None for a fact not readable."""
    cpu = re.search(r"^(model name|Model)\s*:\s*(.+)$", _read("/proc/cpuinfo") or "", re.M)
    memory = re.search(r"^MemTotal:\s*(\d+) kB", _read("/proc/meminfo") or "", re.M)
    thp = re.search(r"\[(\w+)\]", _read("/sys/kernel/mm/transparent_hugepage/enabled") or "")
    caches = sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"))
    l3 = next((_read(f"{c}/size") for c in caches if _read(f"{c}/level") == "3"), None)
    l3_size = re.fullmatch(r"(\d+)([KMG])", l3 or "")
    libc, version = platform.libc_ver()
    return {
        "cpu_model": cpu[2].strip() if cpu else None,
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "numa_nodes": len(glob.glob("/sys/devices/system/node/node[0-9]*")) or None,
        "gpu_numa_node": _gpu_numa_node(),
        "l3_bytes": int(l3_size[1]) << "KMG".index(l3_size[2]) * 10 + 10 if l3_size else None,
        "transparent_hugepages": thp[1] if thp else None,
        "glibc": version if libc == "glibc" and version else None,
        "memory_bytes": int(memory[1]) * 1024 if memory else None,
    }


def _git(*args: str) -> str | None:
    cmd = ["git", "-C", str(Path(__file__).resolve().parent), *args]
    try:
        return subprocess.check_output(
            cmd, stderr=subprocess.DEVNULL, text=True, timeout=10
        ).strip()
    except (OSError, subprocess.SubprocessError):
        return None


def run_header(kind: str, sizes: BenchSizes, quick: bool, judged: bool = False) -> dict[str, Any]:
    """A results file's header (``kind``: ``"bench"`` or ``"sweep"``)."""
    started = datetime.datetime.now(datetime.timezone.utc)
    versions, device = collect_info(), "no CUDA device"
    if gpu_unavailable() is None:  # the current device, as info names it
        device = versions["cupy"]["devices"][_backends.cupy().cuda.runtime.getDevice()]["name"]
    # INTEROP_COMMIT names the commit a copy of the tree came from (a remote runner); it wins
    # over git, as such a copy may carry a .git of another commit.
    named = os.environ.get("INTEROP_COMMIT", "").strip() or None
    commit = named or _git("rev-parse", "HEAD")
    dirty = None if named or not commit else _git("status", "--porcelain", "--untracked-files=no")
    return {
        "schema": SCHEMA,
        "kind": kind,
        "quick": quick,
        "judged": judged,
        "device": device,
        "date": started.isoformat(timespec="seconds"),
        "commit": commit or "unknown",
        "commit_source": "INTEROP_COMMIT" if named else "git" if commit else None,
        "commit_dirty": None if dirty is None else bool(dirty),
        "config": config.as_dict(),
        "sizes": dataclasses.asdict(sizes),
        "cpu_count": os.cpu_count(),
        "machine": machine(),
        "versions": versions,
    }


def json_path_problem(path: str | os.PathLike[str]) -> str | None:
    """Why results cannot be written to ``path`` (a directory, or under a file or a directory
    this process may not write in; missing directories are created), or None."""
    target = Path(path)
    if target.is_dir():
        return f"expected a file path for the results (got {str(path)!r}, a directory)"
    parent = next((p for p in target.parents if p.exists()), target.parents[-1])
    if not parent.is_dir():
        return (
            f"expected the results' path to be in a directory (got {str(path)!r}, but "
            f"{str(parent)!r} is a file); choose another path"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot write the results under {str(parent)!r} (permission denied)"
    return None


def write_json(results: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``results`` as strict JSON (NaN, inf: ``null``), whole (through a renamed file)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    loose = json.dumps(results, default=str)  # NaN, Infinity: tokens that are read as None
    text = json.dumps(json.loads(loose, parse_constant=lambda _: None), indent=2, allow_nan=False)
    partial = target.with_name(f".{target.name}.writing")
    partial.write_text(text + "\n")
    os.replace(partial, target)
    return target


def log_done(command: str, name: str, status: str, began: float) -> None:
    """One line on stderr for a finished row: its status and seconds since ``began``."""
    took = time.perf_counter() - began
    print(f"{command}: {name} {status} ({took:.1f} s)", file=sys.stderr, flush=True)


def run_row(spec: RowSpec, ctx: BenchContext, reasons: dict[bool, str | None]) -> Row:
    """One row's result; ``reasons[gpu]``: why such rows cannot run here, or None."""
    row: Row = {"name": spec.name, "what": spec.what}
    lacking = spec.unavailable() if spec.unavailable is not None else None
    if lacking is not None:
        return row | {"status": "not available", "reason": lacking}
    if reasons[spec.gpu] is not None:
        return row | {"status": "skipped", "reason": reasons[spec.gpu]}
    try:
        got = spec.run(ctx)
        fields = {"status": "ok", **got, "ratios": [r.record() for r in got.get("ratios", [])]}
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        fields = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}
    ctx.noting(f"after {spec.name}", ctx.release)  # e.g. a sticky CUDA error: a note
    return row | fields


def bench_directory() -> Path:
    """Where file rows write: ``INTEROP_BENCH_DIR``, else the temporary directory."""
    return Path(os.environ.get("INTEROP_BENCH_DIR") or tempfile.gettempdir())


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
    reasons = {True: gpu_unavailable(), False: host_unavailable()}
    header = run_header("bench", sizes, quick, judged=judge is not None and not quick)
    ctx = BenchContext(sizes, bench_directory())
    results: list[Row] = []
    try:
        for spec in rows:
            start = time.perf_counter()
            row = run_row(spec, ctx, reasons)
            results.append(judge(row, not quick) if judge is not None else row)
            log_done("bench", spec.name, row["status"], start)
            if on_row is not None:
                on_row(header | {"notes": ctx.notes, "rows": list(results), "partial": True})
    finally:
        ctx.noting("at the end", ctx.close)
    return header | {"notes": ctx.notes, "rows": results}


#: How the table names each fact of the JSON's ``machine``.
_MACHINE = (
    "cpu_model={}, cpus={} CPUs, cpus_usable={} usable, numa_nodes=NUMA nodes {}, gpu_numa_node="
    "the GPU on node {}, l3_bytes=L3 {}, transparent_hugepages=transparent huge pages {}, "
    "glibc=glibc {}, memory_bytes=memory {}"
)
_MACHINE_WORDS = dict(pair.split("=") for pair in _MACHINE.split(", "))


def _num(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def ratio_text(ratio: dict[str, Any]) -> str:
    """A JSON ratio in words: ``"to_numpy: 1.33x the time of numpy.from_dlpack"``."""
    value = "n/a" if ratio["value"] is None else f"{ratio['value']:.2f}x"
    if ratio["quantity"] == "memory":
        return f"{ratio['of']}: {value} {ratio['to']}"
    return f"{ratio['of']}: {value} the {ratio['quantity']} of {ratio['to']}"


def figure_text(row: dict[str, Any]) -> str:
    """A row's figure: extra host RSS where its first ratio is of memory, else GB/s or us."""
    memory = row.get("memory", {}).get("extra_host_rss_bytes")
    if memory is not None and (row.get("ratios") or [{}])[0].get("quantity") == "memory":
        return f"{format_bytes(memory)} extra host RSS"
    if "gbps" in row:
        return f"{row['gbps']:.2f} GB/s"
    us = row.get("us")
    if isinstance(us, dict):
        return ", ".join(f"{label} {_num(v)} us" for label, v in us.items())
    return f"{_num(us)} us per call" if us is not None else ""


def memory_text(memory: dict[str, Any]) -> str:
    """A row's ``memory`` in words: ``"extra host RSS 12 MiB, ring 128 MiB"``."""
    words = {"extra_host_rss": "extra host RSS", "extra_device": "extra device memory"}
    parts = []
    for key, value in memory.items():
        prefix, _, last = key.removesuffix("_bytes").rpartition(" ")
        name = f"{prefix} {words.get(last, last.replace('_', ' '))}".strip()
        if key == "rss_method":
            parts.append(f"peak RSS from {value}")
        elif value is None:
            parts.append(f"{name} not measured")
        elif isinstance(value, (int, float)):
            parts.append(f"{name} {format_bytes(value)}")
    return ", ".join(parts)


def row_lines(row: dict[str, Any]) -> list[str]:
    """A measured row's figure, then its ratios and memory, one a line."""
    lines = [figure_text(row), *map(ratio_text, row.get("ratios", []))]
    return lines + ([f"memory: {memory_text(row['memory'])}"] if row.get("memory") else [])


def format_table(
    results: dict[str, Any],
    title: str = "interop bench",
    lines_of: Callable[[dict[str, Any]], list[str]] = row_lines,
) -> str:
    """The printed table of a run: ``title``, its header, rows' ``lines_of``, rows not run."""
    cfg, sizes, facts = results["config"], results["sizes"], results.get("machine") or {}
    machine = [
        _MACHINE_WORDS[k].format(format_bytes(v) if k.endswith("_bytes") else v)
        for k, v in facts.items()
        if v is not None and k in _MACHINE_WORDS
    ]
    quick = " --quick: a smoke run (small sizes, few repeats)" if results.get("quick") else ""
    lines = [
        title + quick,
        f"device   {results['device']}",
        f"machine  {', '.join(machine)}",
        f"run      {results['date']}, commit {results['commit'][:12]}",
        f"config   chunk_bytes {format_bytes(cfg['chunk_bytes'])}, num_buffers "
        f"{cfg['num_buffers']}, host_threads {cfg['host_threads']}",
        f"timing   median of {sizes['repeats']} repeats, scale {sizes['scale']:g} "
        "(INTEROP_BENCH_SCALE); anchors measured in the same run, interleaved",
        "ratios   'the time of': lower is better; 'the throughput of': higher is better; "
        "memory: extra over a bound",
        "",
    ]
    width = max([14] + [len(row["name"]) for row in results["rows"]])
    not_run: dict[tuple[str, str], list[str]] = {}
    for row in results["rows"]:
        if row["status"] != "ok":
            not_run.setdefault((row["status"], row["reason"]), []).append(row["what"])
            continue
        first, *more = lines_of(row)
        lines.append(f"{row['name']:<{width}} {first}".rstrip())
        lines += [" " * (width + 1) + line for line in more]
    if results["device"] == "no CUDA device":
        below = " below" * bool(not_run)  # --rows may have asked for host rows only
        lines.append(f"Measured on the CPU only: the GPU rows{below} need a CUDA device.")
    for (status, reason), whats in not_run.items():
        lines += [f"{status} ({reason}):", *(f"  {what}" for what in whats)]
    if results.get("notes", {}).get("pinned_pages_in_rss") is False:
        lines.append("note: this driver does not count pinned pages in RSS")
    return "\n".join(lines)


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
