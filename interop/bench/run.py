"""Running the rows and what a results file records: the run's header (device, versions,
commit, date, machine), the rows (each measured, skipped or failed with its reason), and
the JSON writer."""

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
from .measure import BenchSizes, gpu_unavailable, host_unavailable, scale_from_env
from .report import format_table
from .rows import ROWS, BenchContext, RowSpec

#: Version of the JSON layout (3: ``machine`` and ``judged``; ``target`` and ``met`` only
#: where a run judged them; 2: ``ratios`` a list of objects with their direction).
SCHEMA = 3
Row = dict[str, Any]


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _field(text: str | None, key: str) -> str | None:
    """The value of the first ``key: value`` line of ``text`` (``/proc/cpuinfo``)."""
    match = re.search(rf"^{re.escape(key)}\s*:\s*(.+)$", text or "", re.MULTILINE)
    return match[1].strip() if match else None


def _l3_bytes() -> int | None:
    for index in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        size = _read(f"{index}/size")
        if _read(f"{index}/level") == "3" and size and size[:-1].isdigit():
            return int(size[:-1]) << {"K": 10, "M": 20, "G": 30}.get(size[-1], 0)
    return None


def _gpu_numa_node() -> int | None:
    if gpu_unavailable() is not None:
        return None
    try:
        cp = _backends.cupy()
        bus = cp.cuda.runtime.deviceGetPCIBusId(cp.cuda.runtime.getDevice()).lower()
        node = _read(f"/sys/bus/pci/devices/{bus}/numa_node")
        return int(node) if node is not None else None
    except Exception:  # an old driver, no sysfs: the fact is unknown, not an error
        return None


def machine() -> dict[str, Any]:
    """The machine a run measured, from ``/proc``, ``/sys`` and :func:`platform.libc_ver`; a
    fact that cannot be read is None (``gpu_numa_node``: -1 where the kernel does not know)."""
    cpuinfo = _read("/proc/cpuinfo")
    memory = _field(_read("/proc/meminfo"), "MemTotal")
    thp = re.search(r"\[(\w+)\]", _read("/sys/kernel/mm/transparent_hugepage/enabled") or "")
    nodes = glob.glob("/sys/devices/system/node/node[0-9]*")
    libc, version = platform.libc_ver()
    return {
        "cpu_model": _field(cpuinfo, "model name") or _field(cpuinfo, "Model") or None,
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "numa_nodes": len(nodes) or None,
        "gpu_numa_node": _gpu_numa_node(),
        "l3_bytes": _l3_bytes(),
        "transparent_hugepages": thp[1] if thp else None,
        "glibc": version if libc == "glibc" and version else None,
        "memory_bytes": int(memory.split()[0]) * 1024 if memory else None,
    }


def _git(*args: str) -> str | None:
    cmd = ["git", "-C", str(Path(__file__).resolve().parent), *args]
    try:
        out = subprocess.check_output(cmd, stderr=subprocess.DEVNULL, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip()


def run_header(kind: str, sizes: BenchSizes, quick: bool, judged: bool = False) -> dict[str, Any]:
    """A results file's header: ``kind`` ``"bench"`` or ``"sweep"``, ``quick`` a smoke run,
    ``judged`` whether targets were judged."""
    from ..info import collect_info

    started = datetime.datetime.now(datetime.timezone.utc)
    device = "no CUDA device"
    if gpu_unavailable() is None:
        runtime = _backends.cupy().cuda.runtime
        device = runtime.getDeviceProperties(runtime.getDevice())["name"]
    # INTEROP_COMMIT names the commit a copy of the tree came from (a remote runner); it wins
    # over git, as such a copy may carry a .git of another commit.
    named = os.environ.get("INTEROP_COMMIT", "").strip() or None
    commit, dirty, source = named, None, "INTEROP_COMMIT" if named else None
    if named is None:
        commit = _git("rev-parse", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
        source = "git" if commit is not None else None
    return {
        "schema": SCHEMA,
        "kind": kind,
        "quick": quick,
        "judged": judged,
        "device": device.decode() if isinstance(device, bytes) else str(device),
        "date": started.isoformat(timespec="seconds"),
        "commit": commit or "unknown",
        "commit_source": source,
        "commit_dirty": None if dirty is None else bool(dirty),
        "config": config.as_dict(),
        "sizes": dataclasses.asdict(sizes),
        "cpu_count": os.cpu_count(),
        "machine": machine(),
        "versions": collect_info(),
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
    """Write ``results`` as strict JSON (NaN and inf as ``null``) to ``path``, parents
    created, under a temporary name then renamed: a reader never sees half a file."""
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
