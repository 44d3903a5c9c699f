"""``python -m benchmarks keep``: a GPU run's results kept in the repository, and its report.

The GPU rows of the bench and sweep files given to it are made here (this
machine has no GPU) through the bench's own verdict code and a real traced
transfer on the host backend; the host rows come from a real run. Only the
script's checks, what it writes and what it reports are under test.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import interop
from benchmarks import keep_results
from benchmarks.lab import LAB_ROWS
from benchmarks.targets import RunJudge, judge
from interop.bench.results import Ratio
from interop.pipeline import trace
from interop.pipeline.ring import free_cached_rings
from interop.testing import EmulatedDevice
from tests.helpers import REPO_ROOT, child_env, git_head

from .runs import full_host_run

DEVICE = "NVIDIA H100 80GB HBM3"
MiB = 1 << 20


# The script checks the results' commit against the checkout's history.
pytestmark = pytest.mark.skipif(
    git_head() is None, reason="needs a git checkout (a runner's copy of the tree has no .git)"
)


def _head() -> str:
    head = git_head()
    assert head is not None
    return head


def _host_trace() -> dict[str, Any]:
    """The summary of a real traced transfer (host backend): what a GPU row's ``trace`` holds."""
    backend = EmulatedDevice(delay=0.001)
    try:
        d = backend.asarray(np.arange(64 << 10, dtype=np.float32))
        with trace.recording() as traces:
            interop.copy_to_host(d, chunk_bytes=64 << 10)
        assert backend.violations == []
    finally:
        free_cached_rings()
        backend.close()
    return traces[0].summary()


def _row(name: str, fields: dict[str, Any], judge: Any = judge) -> dict[str, Any]:
    spec = next(s for s in LAB_ROWS if s.name == name)
    ratios = [r.record() for r in fields["ratios"]]
    return judge({"name": name, "what": spec.what, "status": "ok"} | fields | {"ratios": ratios})


def _run_judge() -> RunJudge:
    """A run's judge that has seen ``host_limit``: ring ceilings of 30 GB/s (D2H) and
    18 GB/s (H2D) with the link busy."""
    run = RunJudge()
    ceilings = {"pinned->pageable ceiling GB/s": 30.0, "pageable->pinned ceiling GB/s": 18.0}
    run({"name": "host_limit", "what": "", "status": "ok", "gbps": 30.0, "anchors": ceilings})
    return run


def _bench() -> dict[str, Any]:
    results = copy.deepcopy(full_host_run())
    results |= {"device": DEVICE, "commit": _head(), "commit_dirty": False}
    stages = {
        "settings": {"chunk_bytes": 32 * MiB, "num_buffers": 4, "host_threads": 4},
        "DMA GB/s": 25.0,
        "host GB/s": 17.0,
        "bound GB/s": 17.0,
    }
    gpu = {
        "d2h_limit": {"gbps": 25.0, "ratios": []},
        "d2h_prealloc": {
            "gbps": 23.5,
            "anchors": {"d2h_limit GB/s": 25.0},
            "ratios": [
                Ratio.between("copy_to_host(x, out)", "throughput", "d2h_limit", 23.5, 25.0)
            ],
        },
        "h2d_pageable": {
            "gbps": 16.0,
            "anchors": {"h2d_limit GB/s": 20.0},
            "stages": stages,
            "trace": _host_trace(),
            "ratios": [
                Ratio.between("copy_to_device(host)", "throughput", "h2d_limit", 16.0, 20.0),
                Ratio.between(
                    "extra host RSS of copy_to_device(host)",
                    "memory",
                    "the ring size (num_buffers x chunk_bytes)",
                    0.0,
                    128 * MiB,
                ),
            ],
        },
    }
    gpu_names = [s.name for s in LAB_ROWS if s.gpu]
    run = _run_judge()
    skipped = {"status": "skipped", "reason": "not measured in this test"}
    results["rows"] = [
        _row(s.name, gpu[s.name], run)
        if s.name in gpu
        else judge({"name": s.name, "what": s.what} | skipped)
        for s in LAB_ROWS
        if s.gpu
    ] + [row for row in results["rows"] if row["name"] not in gpu_names]
    return results


def _point(chunk_mib: int, threads: int, buffers: int, gbps: float) -> dict[str, Any]:
    return {
        "chunk_bytes": chunk_mib * MiB,
        "host_threads": threads,
        "num_buffers": buffers,
        "gbps": gbps,
        "reference_gbps": 25.0,
        "ratio": Ratio.between("ours", "throughput", "limit", gbps, 25.0).record(),
    }


def _sweep(bench_results: dict[str, Any]) -> dict[str, Any]:
    header = {k: v for k, v in bench_results.items() if k not in ("rows", "kind")}
    # (chunk MiB, threads, buffers): (d2h GB/s, h2d GB/s). The 64 MiB point is the best;
    # 16 MiB x 4 is within 5% of it in both rows with a quarter of its ring; 8 MiB x 2 is not.
    grid = {(8, 2, 2): (20.0, 19.5), (16, 4, 4): (21.0, 20.0), (64, 8, 6): (21.2, 20.1)}
    rows = []
    for i, name in enumerate(("d2h_prealloc", "h2d_pageable")):
        points = [_point(*key, gbps[i]) for key, gbps in grid.items()]
        rows.append(
            {
                "name": name,
                "what": name,
                "status": "ok",
                "call": name,
                "reference": "limit",
                "anchors": {"limit GB/s": 25.0},
                "points": points,
                "points_not_run": 0,
                "best": max(points, key=lambda p: p["gbps"]),
            }
        )
    return header | {"kind": "sweep", "grid": {}, "rows": rows}


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="2" tests="7">
</testsuite></testsuites>
"""
JUNIT_GPU = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="0" tests="5">
</testsuite></testsuites>
"""
STEPS = "step\tstatus\texit\tseconds\ninfo\tpassed\t0\t3\ntests\tfailed\t1\t120\n"


def _outdir(tmp_path: Path, bench_results: dict[str, Any], sweep: dict[str, Any] | None) -> Path:
    out = tmp_path / "gpu-out"
    out.mkdir()
    (out / "bench.json").write_text(json.dumps(bench_results))
    if sweep is not None:
        (out / "sweep.json").write_text(json.dumps(sweep))
    (out / "junit.xml").write_text(JUNIT)
    (out / "junit-gpu.xml").write_text(JUNIT_GPU)  # gpu-check's two test runs: counts summed
    (out / "steps.tsv").write_text(STEPS)
    return out


@pytest.fixture(scope="module")
def run() -> tuple[dict[str, Any], dict[str, Any]]:
    b = _bench()
    return b, _sweep(b)


def test_a_gpu_run_is_kept_whole_with_its_plot_and_report(tmp_path, run):
    b, s = run
    into = tmp_path / "repo"
    path, png, text = keep_results.keep(_outdir(tmp_path, b, s), "HEAD", into)
    name = f"{b['date'][:10]}-nvidia-h100-80gb-hbm3"
    assert path == into / "benchmarks" / "results" / f"{name}.json"
    assert png == into / "docs" / "img" / f"throughput-{name}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    kept = json.loads(path.read_text())
    assert kept["bench"] == json.loads(json.dumps(b))
    assert kept["sweep"] == json.loads(json.dumps(s))
    assert (kept["device"], kept["commit"]) == (DEVICE, _head())
    assert kept["versions"] == b["versions"]
    assert kept["gpu_check"]["tests"] == {
        "tests": 12,
        "failures": 2,
        "errors": 1,
        "skipped": 2,
        "passed": 7,
    }
    assert [st["status"] for st in kept["gpu_check"]["steps"]] == ["passed", "failed"]

    assert "Tests: 7 passed, 2 failed, 1 errors, 2 skipped (of 12)." in text
    assert "gpu-check steps: info passed, tests failed." in text
    table_row = next(line for line in text.splitlines() if line.startswith(f"| {DEVICE} |"))
    cells = [c.strip() for c in table_row.strip("|").split("|")]
    # d2h_prealloc: judged against the link or the ring's ceiling, whichever is lower
    assert cells[3] == "0.94x d2h_limit; 0.94x min(d2h_limit, the ring's D2H ceiling) (met)"
    assert cells[4] == "skipped"  # d2h_fresh
    assert cells[6] == (  # h2d_pageable
        "0.80x h2d_limit; 0.00x the ring size (num_buffers x chunk_bytes); "
        "0.89x min(h2d_limit, the ring's H2D ceiling) (**missed**)"
    )
    assert (
        "| `d2h_prealloc` | copy_to_host(x, out): 0.94x the throughput of "
        "min(d2h_limit, the ring's D2H ceiling) | >= 0.9x | met |"
    ) in text
    assert (
        "| `h2d_pageable` | copy_to_device(host): 0.89x the throughput of "
        "min(h2d_limit, the ring's H2D ceiling) | >= 0.9x | **missed** |"
    ) in text
    missed = next(line for line in text.splitlines() if line.startswith("- `h2d_pageable`"))
    assert "DMA 25.00 GB/s, host copies 17.00 GB/s" in missed
    traced = next(r for r in b["rows"] if r["name"] == "h2d_pageable")["trace"]
    assert f"limited by {traced['limited_by']}" in missed
    assert "`d2h_prealloc`:" not in text.split("Where the time went", 1)[1]  # met: not listed
    assert (
        "Suggested defaults: chunk_bytes 16 MiB, host_threads 4, num_buffers 4 on "
        f"{b['cpu_count']} cores: `d2h_prealloc` 21.00 GB/s (99% of its best, 21.20 GB/s)"
    ) in text


def test_a_second_run_of_the_same_day_and_device_is_kept_beside_the_first(tmp_path, run):
    b, s = run
    into = tmp_path / "repo"
    name = f"{b['date'][:10]}-nvidia-h100-80gb-hbm3"
    first = into / "benchmarks" / "results" / f"{name}.json"
    first.parent.mkdir(parents=True)
    earlier = json.dumps({"device": DEVICE, "commit": "1" * 40, "date": b["date"]})
    first.write_text(earlier)
    path, png, _ = keep_results.keep(_outdir(tmp_path, b, s), "HEAD", into)
    assert path.name == f"{name}-{_head()[:8]}.json"
    assert png.name == f"throughput-{name}-{_head()[:8]}.png"
    assert first.read_text() == earlier  # the earlier run is untouched
    assert json.loads(path.read_text())["commit"] == _head()
    # the same run kept again replaces its own file, under its own name
    (tmp_path / "again").mkdir()
    assert keep_results.keep(_outdir(tmp_path / "again", b, s), "HEAD", into)[0] == path
    # a later run of the same commit that day goes beside both, by its time
    later = b | {"date": b["date"][:11] + "23:59:58+00:00"}
    (tmp_path / "later").mkdir()
    third = keep_results.keep(_outdir(tmp_path / "later", later, s), "HEAD", into)[0]
    assert third.name == f"{name}-{_head()[:8]}-235958.json"
    assert json.loads(path.read_text())["date"] == b["date"]  # the second is untouched
    assert json.loads(third.read_text())["date"] == later["date"]
    # when even that name holds another run, nothing is written
    (tmp_path / "clash").mkdir()
    third.write_text(earlier)
    before = sorted(p.name for p in path.parent.iterdir())
    with pytest.raises(keep_results.NotKept, match="already holds another run"):
        keep_results.keep(_outdir(tmp_path / "clash", later, s), "HEAD", into)
    assert sorted(p.name for p in path.parent.iterdir()) == before
    assert third.read_text() == earlier


def _partial(b, s):
    return b | {"partial": True}, s


def _no_device(b, s):
    return b | {"device": "no CUDA device"}, s | {"device": "no CUDA device"}


def _not_on_branch(b, s):
    return b | {"commit": "0" * 40}, s | {"commit": "0" * 40}


def _dirty(b, s):
    return b | {"commit_dirty": True}, s


def _unknown_commit(b, s):
    return b | {"commit": "unknown"}, s | {"commit": "unknown"}


def _other_device(b, s):
    return b, s | {"device": "NVIDIA H200"}


def _quick(b, s):
    return b | {"quick": True}, s


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (_partial, "is partial"),
        (_no_device, "without a CUDA device"),
        (_not_on_branch, "is not a commit on HEAD"),
        (_dirty, "uncommitted changes"),
        (_unknown_commit, "INTEROP_COMMIT"),
        (_other_device, "differ in device"),
        (_quick, "--quick smoke run"),
    ],
)
def test_results_that_cannot_be_kept_are_refused_and_nothing_is_written(tmp_path, run, change, why):
    b, s = change(*copy.deepcopy(run))
    into = tmp_path / "repo"
    into.mkdir()
    with pytest.raises(keep_results.NotKept, match=why):
        keep_results.keep(_outdir(tmp_path, b, s), "HEAD", into)
    assert list(into.iterdir()) == []


def _keep(*args: object) -> subprocess.CompletedProcess:
    """``python -m benchmarks keep ARGS`` from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", "keep", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        env=child_env(),
        check=False,
    )


def test_the_command_line_keeps_or_says_why_not(tmp_path, run):
    b, s = run
    out = _outdir(tmp_path, b, s)
    into = tmp_path / "repo"
    proc = _keep(out, "--branch", "HEAD", "--into", str(into))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"## {DEVICE}, {b['date'][:10]}, commit `{_head()[:8]}`")
    assert len(list((into / "benchmarks" / "results").glob("*.json"))) == 1
    (out / "bench.json").write_text(json.dumps(b | {"partial": True}))
    proc = _keep(out, "--branch", "HEAD", "--into", str(tmp_path / "b"))
    assert proc.returncode == 1
    assert "keep_results: not kept:" in proc.stderr
    assert "is partial" in proc.stderr
    assert not (tmp_path / "b").exists()
