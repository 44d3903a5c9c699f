"""Real lab runs shared by the lab's tests, each made once per test session.

Each run starts a fresh ``python -m benchmarks`` (or runs the host rows in this
process) on this machine; the tests read what it printed and wrote. Cached
here rather than in fixtures so that several test modules share one run.

The shared quick runs hide any GPU from their process (``CUDA_VISIBLE_DEVICES``
empty), so they are the same host-rows run on every machine: what the tests of
the report, the JSON and the plot read from them does not depend on whether a
GPU is present. The GPU rows are run by the tests marked ``gpu``.
"""

from __future__ import annotations

import atexit
import fcntl
import functools
import json
import pickle
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.lab import LAB_ROWS
from benchmarks.targets import judge
from interop.bench import collect_results
from interop.bench.measure import BenchSizes
from tests.helpers import NO_GPU, REPO_ROOT, child_env

T = TypeVar("T")

SMOKE_SCALE = "0.25"  # --quick at a quarter of its sizes: seconds on two cores
SWEEP_SCALE = "0.05"
SWEEP_ARGS = ("--chunk-mib", "1,2,4", "--host-threads", "1,2", "--num-buffers", "2,3")


def run_lab(
    directory: Path, *args: str, scale: str = SMOKE_SCALE, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python -m benchmarks ARGS`` in a fresh process from the repository root, with a
    scale and a scratch directory; ``env`` adds to its environment (``NO_GPU``)."""
    env = child_env(
        {"INTEROP_BENCH_SCALE": scale, "INTEROP_BENCH_DIR": str(directory), **(env or {})}
    )
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=REPO_ROOT,
        check=False,
    )


#: Set by the lab's conftest for a pytest session: a directory every xdist worker of the
#: session shares (pytest's own base temporary directory, which pytest cleans up).
SHARED: Path | None = None


@functools.cache
def _directory() -> Path:
    if SHARED is not None:
        path = SHARED / "interop-lab-runs"
        path.mkdir(exist_ok=True)
        return path
    path = Path(tempfile.mkdtemp(prefix="interop-lab-tests-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _once(name: str, compute: Callable[[], T]) -> T:
    """``compute()`` once per test session, across xdist workers: the first worker to
    take the lock runs it and leaves the result for the others (a run that fails
    leaves nothing, so the next one tries again and fails the same way)."""
    directory = _directory()
    with open(directory / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = directory / f"{name}.pickle"
        if done.exists():
            return pickle.loads(done.read_bytes())
        result = compute()
        done.write_bytes(pickle.dumps(result))
        return result


def _cli_json(name: str, *args: str, scale: str) -> tuple[subprocess.CompletedProcess, Any, Path]:
    path = _directory() / name / f"{name}.json"
    proc = run_lab(path.parent.parent, *args, "--json", str(path), scale=scale, env=NO_GPU)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, json.loads(path.read_text()), path


@functools.cache
def quick_bench() -> tuple[subprocess.CompletedProcess, Any, Path]:
    """``run --quick --json`` at ``SMOKE_SCALE``, GPU hidden: (process, JSON, path)."""
    return _once("bench", lambda: _cli_json("bench", "run", "--quick", scale=SMOKE_SCALE))


@functools.cache
def quick_sweep() -> tuple[subprocess.CompletedProcess, Any, Path]:
    """``sweep --quick`` over ``SWEEP_ARGS`` at ``SWEEP_SCALE``, GPU hidden.

    Returns (process, JSON, path).
    """
    return _once(
        "sweep", lambda: _cli_json("sweep", "sweep", "--quick", *SWEEP_ARGS, scale=SWEEP_SCALE)
    )


@functools.cache
def full_host_run() -> dict[str, Any]:
    """The lab's host rows, judged as in a full run, at tiny sizes, in this process."""
    rows = tuple(spec for spec in LAB_ROWS if not spec.gpu)
    return _once(
        "full-host-run",
        lambda: collect_results(BenchSizes.choose(False, 0.005), rows, quick=False, judge=judge),
    )
