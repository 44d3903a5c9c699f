"""``python -m benchmarks sweep``: settings applied through interop.config, JSON written.

On a machine without a GPU the sweep runs the host row (``host_copy``) end to end.
No timing asserts: the figures are results, not outcomes.
"""

from __future__ import annotations

import json

import pytest

import interop
from benchmarks import sweep as sweep_mod
from interop.bench import SCHEMA
from interop.bench.measure import BenchSizes, Case, WrongResultError, measure
from interop.bench.rows import BenchContext

from .runs import quick_sweep, run_lab

TINY = BenchSizes.choose(True, 0.02)
MiB = 1 << 20


@pytest.fixture
def cpu_sweep():
    """A real sweep from the command line, host row only here: (process, parsed JSON)."""
    proc, data, _ = quick_sweep()
    return proc, data


def test_sweep_json_records_the_run_and_grid(cpu_sweep):
    _, data = cpu_sweep
    assert data["kind"] == "sweep"
    assert data["schema"] == SCHEMA
    assert data["quick"] is True
    assert "partial" not in data
    assert data["grid"] == {
        "chunk_bytes": [1 * MiB, 2 * MiB, 4 * MiB],
        "host_threads": [1, 2],
        "num_buffers": [2, 3],
    }
    assert [row["name"] for row in data["rows"]] == ["host_copy", "d2h_prealloc", "h2d_pageable"]


def test_host_copy_is_swept_over_chunk_bytes_and_host_threads(cpu_sweep):
    proc, data = cpu_sweep
    row = data["rows"][0]
    assert row["status"] == "ok", row
    assert row["call"] == "copy_to_host"
    assert row["reference"] == "numpy.copyto"
    # no staging ring on the host path: num_buffers stays at the current setting
    assert row["grid"]["num_buffers"] == [data["config"]["num_buffers"]]
    settings = [(p["chunk_bytes"], p["host_threads"], p["num_buffers"]) for p in row["points"]]
    nb = data["config"]["num_buffers"]
    assert sorted(settings) == [(c * MiB, t, nb) for c in (1, 2, 4) for t in (1, 2)]
    for p in row["points"]:
        assert "error" not in p, p
        assert p["gbps"] > 0
        assert p["reference_gbps"] > 0
        assert p["ratio"]["quantity"] == "throughput"
        assert p["ratio"]["to"] == "numpy.copyto"
        assert p["ratio"]["value"] == pytest.approx(p["gbps"] / p["reference_gbps"])
        assert p["samples"]["copy_to_host"]["result_checked"] is True
        assert len(p["samples"]["copy_to_host"]["seconds"]) == 2
    assert row["points_not_run"] == 0
    assert row["best"]["gbps"] == max(p["gbps"] for p in row["points"])
    assert row["anchors"]["numpy.copyto GB/s"] > 0
    assert "host_copy: copy_to_host" in proc.stdout
    assert "the throughput of numpy.copyto" in proc.stdout


def test_gpu_rows_of_the_sweep_say_why_they_did_not_run(cpu_sweep):
    proc, data = cpu_sweep
    if data["device"] != "no CUDA device":
        pytest.skip("a CUDA device is visible")
    for row in data["rows"][1:]:
        assert row["status"] == "skipped"
        assert row["reason"].startswith("no CUDA device")
        assert "points" not in row
    assert "skipped (d2h_prealloc, h2d_pageable): no CUDA device" in proc.stdout


def _recording_row(seen: list[dict]) -> sweep_mod.SweepRow:
    """A real row whose call records interop.config as the call sees it."""

    def setup(ctx):
        def call():
            seen.append(interop.config.as_dict())
            return 1

        cases = {"ours": Case(call, 1 << 20), "reference": Case(lambda: 1, 1 << 20)}
        return sweep_mod.Subject("1 MiB", "ours", "reference", cases, {}, measure)

    return sweep_mod.SweepRow("recording", "records config", False, setup)


def test_every_point_runs_under_its_settings():
    seen: list[dict] = []
    before = interop.config.as_dict()
    grid = {"chunk_bytes": [1 * MiB, 3 * MiB], "host_threads": [1, 3], "num_buffers": [2, 5]}
    data = sweep_mod.sweep(TINY, grid, [_recording_row(seen)])
    (row,) = data["rows"]
    assert len(row["points"]) == 8
    calls_per_point = 1 + max(2, TINY.repeats - 2)  # the first (the warm-up), the timed
    assert len(seen) == 8 * calls_per_point
    for i, point in enumerate(row["points"]):
        settings = {k: point[k] for k in ("chunk_bytes", "host_threads", "num_buffers")}
        assert all(s == settings for s in seen[i * calls_per_point : (i + 1) * calls_per_point])
    assert interop.config.as_dict() == before  # restored
    # the current num_buffers plane first, so that a sweep cut short has it
    current = interop.config.num_buffers
    planes = [p["num_buffers"] for p in row["points"]]
    if current in grid["num_buffers"]:
        assert planes[:4] == [current] * 4


def test_a_spent_time_budget_leaves_points_not_run():
    seen: list[dict] = []
    grid = {"chunk_bytes": [1 * MiB], "host_threads": [1, 2], "num_buffers": [2]}
    data = sweep_mod.sweep(TINY, grid, [_recording_row(seen)], max_seconds=1e-9)
    (row,) = data["rows"]
    assert row["status"] == "ok"
    assert row["points"] == []
    assert row["points_not_run"] == 2
    assert seen == []
    assert "2 points not run: the time budget ran out" in sweep_mod.format_sweep(data)


def test_a_wrong_result_is_an_error_point_and_the_sweep_goes_on(capsys):
    def setup(ctx):
        def check(result):
            if interop.config.host_threads == 2:
                raise WrongResultError("copy returned data that differs from the source")

        cases = {
            "ours": Case(lambda: 1, 1 << 20, check),
            "reference": Case(lambda: 1, 1 << 20),
        }
        return sweep_mod.Subject("1 MiB", "ours", "reference", cases, {}, measure)

    row = sweep_mod.SweepRow("flaky", "fails at 2 threads", False, setup)
    grid = {"chunk_bytes": [1 * MiB], "host_threads": [1, 2, 3], "num_buffers": [2]}
    data = sweep_mod.sweep(TINY, grid, [row])
    points = data["rows"][0]["points"]
    assert [("error" in p) for p in points] == [False, True, False]
    assert points[1]["error"].startswith("WrongResultError: copy returned data")
    assert "WrongResultError" in capsys.readouterr().err
    assert "error at chunk_bytes 1.0 MiB, host_threads 2" in sweep_mod.format_sweep(data)


def test_partial_results_are_handed_out_after_every_point():
    seen: list[dict] = []
    snapshots: list[dict] = []
    grid = {"chunk_bytes": [1 * MiB], "host_threads": [1, 2], "num_buffers": [2]}
    sweep_mod.sweep(TINY, grid, [_recording_row(seen)], on_point=snapshots.append)
    assert [len(s["rows"][0]["points"]) for s in snapshots] == [1, 2, 2]
    assert all(s["partial"] is True for s in snapshots)


@pytest.mark.parametrize(
    ("grid", "error"),
    [
        ({"chunk_bytes": [], "host_threads": [1], "num_buffers": [2]}, ValueError),
        ({"chunk_bytes": [0], "host_threads": [1], "num_buffers": [2]}, ValueError),
        ({"chunk_bytes": [1 << 20], "host_threads": [1.5], "num_buffers": [2]}, TypeError),
    ],
)
def test_a_bad_grid_is_refused_before_anything_runs(grid, error):
    seen: list[dict] = []
    with pytest.raises(error):
        sweep_mod.sweep(TINY, grid, [_recording_row(seen)])
    assert seen == []


def test_an_unknown_sweep_row_is_refused(tmp_path):
    proc = run_lab(tmp_path, "sweep", "--rows", "host_copy,d2h_fresh")
    assert proc.returncode == 2
    assert "expected rows among" in proc.stderr
    assert "d2h_fresh" in proc.stderr


def test_default_grid_follows_the_cores_and_has_the_current_settings():
    with interop.config.set(chunk_bytes=24 * MiB, host_threads=3, num_buffers=5):
        grid = sweep_mod.default_grid(False, cpu_count=12)
        quick = sweep_mod.default_grid(True, cpu_count=1)
    assert grid["host_threads"] == [1, 2, 3, 4, 8, 12]
    assert grid["chunk_bytes"] == [n * MiB for n in (4, 8, 16, 24, 32, 64, 128)]
    assert grid["num_buffers"] == [2, 3, 4, 5, 6]
    assert quick["host_threads"] == [1, 3]


@pytest.mark.gpu
def test_gpu_sweep_runs(tmp_path):
    """On a GPU runner both GPU rows sweep and check every point (figures not judged)."""
    path = tmp_path / "sweep.json"
    proc = run_lab(
        tmp_path,
        "sweep", "--quick", "--chunk-mib", "1,4", "--host-threads", "1,2",
        "--num-buffers", "2", "--json", str(path),
        scale="0.125",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {row["name"]: row for row in json.loads(path.read_text())["rows"]}
    for name, limit in (("d2h_prealloc", "d2h_limit"), ("h2d_pageable", "h2d_limit")):
        row = rows[name]
        assert row["status"] == "ok", row
        assert len(row["points"]) == 4
        assert all(p["gbps"] > 0 and "error" not in p for p in row["points"])
        assert row["anchors"][f"{limit} GB/s"] > 0
    assert rows["d2h_prealloc"]["anchors"]["cupy.asnumpy(x) GB/s"] > 0
    assert rows["h2d_pageable"]["anchors"]["cupy.asarray(host) GB/s"] > 0


def test_a_failing_cache_release_keeps_the_points(monkeypatch, capsys):
    def failing_release(self):
        raise RuntimeError("cudaErrorIllegalAddress")

    monkeypatch.setattr(BenchContext, "release", failing_release)
    seen: list[dict] = []
    grid = {"chunk_bytes": [1 * MiB], "host_threads": [1], "num_buffers": [2]}
    data = sweep_mod.sweep(TINY, grid, [_recording_row(seen)])
    assert len(data["rows"][0]["points"]) == 1
    assert data["notes"]["release_errors"] == [
        "after recording: RuntimeError: cudaErrorIllegalAddress"
    ]
    assert "cudaErrorIllegalAddress" in capsys.readouterr().err
    assert "note: releasing caches failed after recording" in sweep_mod.format_sweep(data)


def _sweep_of(points: dict[str, dict[tuple[int, int, int], float]]) -> dict:
    """Sweep results whose rows have the given (chunk MiB, threads, buffers) -> GB/s points."""
    return {
        "rows": [
            {
                "name": name,
                "what": name,
                "status": "ok",
                "reference": "its anchor",
                "points_not_run": 0,
                "points": [
                    {
                        "chunk_bytes": c << 20,
                        "host_threads": t,
                        "num_buffers": b,
                        "gbps": g,
                        "ratio": {"value": None},
                    }
                    for (c, t, b), g in got.items()
                ],
            }
            for name, got in points.items()
        ]
    }


def test_suggested_defaults_are_the_cheapest_point_near_the_best_of_both_directions():
    d2h = {(8, 4, 2): 40.0, (16, 4, 4): 50.0, (32, 8, 4): 51.0, (64, 16, 6): 52.0, (8, 2, 4): 30.0}
    h2d = {(8, 4, 2): 45.0, (16, 4, 4): 44.0, (32, 8, 4): 46.0, (64, 16, 6): 46.0, (8, 2, 4): 46.0}
    got = sweep_mod.suggest_defaults(_sweep_of({"d2h_prealloc": d2h, "h2d_pageable": h2d}))
    assert got is not None
    # scores (worst of the two fractions of each row's best): 8/4/2 0.77, 16/4/4 0.957,
    # 32/8/4 0.981, 64/16/6 1.0, 8/2/4 0.58; within 5 % of 1.0: 16/4/4, 32/8/4, 64/16/6;
    # the smallest ring of those is 16 MiB x 4
    assert got["settings"] == {"chunk_bytes": 16 << 20, "host_threads": 4, "num_buffers": 4}
    assert got["score"] == pytest.approx(min(50 / 52, 44 / 46))
    assert got["best_score"] == pytest.approx(1.0)
    assert got["rows"]["d2h_prealloc"] == {"gbps": 50.0, "best_gbps": 52.0}
    assert got["rows"]["h2d_pageable"] == {"gbps": 44.0, "best_gbps": 46.0}
    # within 2 %: only 32 MiB x 4 (8 threads) and 64 MiB x 6; the smaller ring wins
    tight = sweep_mod.suggest_defaults(
        _sweep_of({"d2h_prealloc": d2h, "h2d_pageable": h2d}), tolerance=0.02
    )
    assert tight["settings"] == {"chunk_bytes": 32 << 20, "host_threads": 8, "num_buffers": 4}


def test_no_defaults_are_suggested_without_points_in_both_directions():
    only_host = _sweep_of({"d2h_prealloc": {(8, 4, 2): 40.0}})
    assert sweep_mod.suggest_defaults(only_host) is None
    apart = _sweep_of({"d2h_prealloc": {(8, 4, 2): 40.0}, "h2d_pageable": {(16, 4, 2): 40.0}})
    assert sweep_mod.suggest_defaults(apart) is None


def test_the_sweep_summary_prints_the_suggested_defaults(cpu_sweep):
    """On a machine without a GPU the two transfer rows do not run: nothing is suggested."""
    _, data = cpu_sweep
    assert data["suggested_defaults"] is None
    assert "suggested defaults" not in sweep_mod.format_sweep(data)
    text = sweep_mod.format_sweep(
        data
        | _sweep_of(
            {"d2h_prealloc": {(8, 4, 2): 40.0, (16, 2, 2): 41.0}, "h2d_pageable": {(8, 4, 2): 30.0}}
        )
    )
    assert (
        "suggested defaults: chunk_bytes 8.0 MiB, host_threads 4, num_buffers 2: "
        "d2h_prealloc 40.00 GB/s (98% of its best), h2d_pageable 30.00 GB/s (100% of its best)"
    ) in text
