"""``scripts/gpu-check``: runs its steps in order, keeps going after a failure, keeps results.

The whole script (test suite and all) runs on a GPU runner; here it runs a few
of its steps, on the host rows, to show the plumbing works.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu-check"

pytestmark = pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("timeout") is None,
    reason="needs bash and coreutils timeout",
)


def _run(out: Path, *steps: str, scale: str = "0.02") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "INTEROP_BENCH_SCALE": scale}
    return subprocess.run(
        [str(SCRIPT), str(out), *steps],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )


def _steps(out: Path) -> dict[str, str]:
    lines = (out / "steps.tsv").read_text().splitlines()
    assert lines[0] == "step\tstatus\texit\tseconds"
    return {line.split("\t")[0]: line.split("\t")[1] for line in lines[1:]}


def test_a_failing_step_is_recorded_and_the_next_ones_run(tmp_path):
    out = tmp_path / "out"
    proc = _run(out, "bench", "sweep", "plot", scale="-1")  # bench and sweep refuse the scale
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _steps(out) == {"bench": "failed", "sweep": "failed", "plot": "failed"}
    assert "INTEROP_BENCH_SCALE" in (out / "logs" / "bench.log").read_text()
    assert "INTEROP_BENCH_SCALE" in (out / "logs" / "sweep.log").read_text()
    assert "no bench.json or sweep.json" in (out / "logs" / "plot.log").read_text()
    assert (out / "summary.txt").read_text().splitlines()[-1] == "failed: bench sweep plot"
    assert "commit" in (out / "machine.txt").read_text()
    assert not (out / "tmp").exists()  # scratch removed


def test_bench_sweep_and_plot_write_their_results(tmp_path):
    out = tmp_path / "out"
    proc = _run(out, "bench", "sweep", "plot")
    assert proc.returncode == 0, proc.stdout + proc.stderr + (out / "summary.txt").read_text()
    assert _steps(out) == {"bench": "passed", "sweep": "passed", "plot": "passed"}
    bench = json.loads((out / "bench.json").read_text())
    assert bench["kind"] == "bench"
    assert bench["quick"] is False
    assert "partial" not in bench
    sweep = json.loads((out / "sweep.json").read_text())
    host = next(r for r in sweep["rows"] if r["name"] == "host_copy")
    assert host["status"] == "ok"
    assert {p["chunk_bytes"] >> 20 for p in host["points"]} == {4, 8, 16, 32, 64}
    assert (out / "throughput.png").read_bytes()[:4] == b"\x89PNG"
    assert "host_copy" in (out / "bench.txt").read_text()
    assert (out / "summary.txt").read_text().splitlines()[-1] == "every step passed"


def test_an_unknown_step_is_refused(tmp_path):
    proc = _run(tmp_path / "out", "bench", "lint")
    assert proc.returncode == 2
    assert "expected steps among" in proc.stderr
