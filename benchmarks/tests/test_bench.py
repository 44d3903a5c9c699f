"""``python -m interop bench``: it runs, its JSON has the schema, rows are honest.

No timing asserts: whether a ratio meets its target is a result of the
benchmark (docs/benchmarks.md), never a test outcome.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from tests.bench_runs import SMOKE_SCALE, full_host_run, quick_bench, run_cli

import interop
from interop import bench
from interop.bench.measure import status_bytes
from tests.helpers import REPO_ROOT, git_head, run_python

GPU_ROWS = {
    "d2h_limit",
    "d2h_prealloc",
    "d2h_fresh",
    "d2h_strided",
    "h2d_limit",
    "h2d_pageable",
    "exchange_us",
    "save_npy",
    "dask_save_npy_cupy",
}
HOST_ROWS = {"to_numpy_us", "to_torch_us", "host_copy", "save_npy_rss"}
# The cluster row (tests/test_bench_dask.py): some of its ratios are context, without a target.
DASK_ROWS = {"dask_save_npy"}
HAVE_DASK = all(importlib.util.find_spec(name) for name in ("dask", "distributed"))
TINY = bench.BenchSizes.choose(True, 0.02)


@pytest.fixture
def quick_run():
    """One quick, scaled-down run with --json: (process, parsed JSON)."""
    proc, data, _ = quick_bench()
    return proc, data


def test_json_records_the_run(quick_run):
    _, data = quick_run
    assert data["schema"] == bench.SCHEMA == 2
    assert data["kind"] == "bench"
    assert isinstance(data["device"], str)
    assert data["device"]
    assert data["quick"] is True
    assert data["date"].endswith("+00:00")  # UTC, ISO 8601
    assert isinstance(data["commit"], str)
    assert data["commit"]
    head = git_head()
    if os.environ.get("INTEROP_COMMIT", "").strip():  # a copy of the checkout, on a runner
        assert (data["commit"], data["commit_source"]) == (
            os.environ["INTEROP_COMMIT"].strip(),
            "INTEROP_COMMIT",
        )
    elif head is not None:
        assert (data["commit"], data["commit_source"]) == (head, "git")
    else:
        assert (data["commit"], data["commit_source"]) == ("unknown", None)
    assert set(data["config"]) == {"chunk_bytes", "num_buffers", "host_threads"}
    assert all(isinstance(v, int) and v > 0 for v in data["config"].values())
    assert data["versions"]["numpy"] == np.__version__
    assert "torch" in data["versions"]
    assert "cupy" in data["versions"]
    assert data["sizes"]["scale"] == float(SMOKE_SCALE)  # from INTEROP_BENCH_SCALE
    assert data["sizes"]["repeats"] >= 3


_HEADER_OUTSIDE_GIT = """
import json
from interop.bench.results import run_header
from interop.bench.sizes import BenchSizes
header = run_header("bench", BenchSizes.choose(quick=True), quick=True)
print(json.dumps({k: header[k] for k in ("commit", "commit_source", "commit_dirty")}))
"""


def _header_in(directory, env: dict[str, str]) -> dict[str, object]:
    """The commit fields of a run header made in a fresh Python in ``directory``."""
    proc = subprocess.run(
        [sys.executable, "-c", _HEADER_OUTSIDE_GIT],
        capture_output=True,
        text=True,
        cwd=directory,
        env=env,
        timeout=120,
        check=True,
    )
    return json.loads(proc.stdout.splitlines()[-1])


def _copy_of_interop(directory) -> dict[str, str]:
    """Copy the package into ``directory``; the environment to import it from there."""
    shutil.copytree(REPO_ROOT / "interop", directory / "interop")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "INTEROP_"))}
    return env | {"PYTHONPATH": str(directory)}


@pytest.mark.parametrize("named", ["0123abcd" * 5, None])
def test_a_copy_without_git_records_the_commit_it_is_given(tmp_path, named):
    """A runner gets a copy of the working tree without .git: INTEROP_COMMIT names the commit."""
    env = _copy_of_interop(tmp_path) | {"GIT_CEILING_DIRECTORIES": str(tmp_path.parent)}
    if named is not None:
        env["INTEROP_COMMIT"] = named
    header = _header_in(tmp_path, env)
    if named is None:
        assert header == {"commit": "unknown", "commit_source": None, "commit_dirty": None}
    else:
        assert header == {"commit": named, "commit_source": "INTEROP_COMMIT", "commit_dirty": None}


def test_the_commit_named_wins_over_the_git_of_the_copy(tmp_path):
    """A runner's copy may carry a .git at another commit: INTEROP_COMMIT still names it."""
    env = _copy_of_interop(tmp_path)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "older"]):
        subprocess.run(git + args, cwd=tmp_path, env=env, check=True, capture_output=True)
    init = tmp_path / "interop" / "__init__.py"
    init.write_text(init.read_text() + "\n# a newer tree\n")
    alone = _header_in(tmp_path, env)
    assert alone["commit_source"] == "git"  # git alone: the older commit, and dirty
    assert alone["commit_dirty"] is True
    named = "4567cdef" * 5
    header = _header_in(tmp_path, env | {"INTEROP_COMMIT": f" {named}\n"})
    assert header == {"commit": named, "commit_source": "INTEROP_COMMIT", "commit_dirty": None}


def test_every_row_is_listed_with_its_target(quick_run):
    _, data = quick_run
    names = [row["name"] for row in data["rows"]]
    assert sorted(names) == sorted(GPU_ROWS | HOST_ROWS | DASK_ROWS)
    assert names == [spec.name for spec in bench.ROWS]
    for row in data["rows"]:
        assert row["what"]
        assert row["target"]
        assert row["status"] in {"ok", "skipped", "not available", "error"}
        assert row["status"] != "error", row
        if row["status"] != "ok":
            assert row["reason"]
            assert row["met"] is None


def test_host_rows_report_figures_and_directed_ratios(quick_run):
    proc, data = quick_run
    rows = {row["name"]: row for row in data["rows"]}
    for name in HOST_ROWS:
        row = rows[name]
        assert row["status"] == "ok", row
        assert row["ratios"]
        for ratio in row["ratios"]:
            assert ratio["quantity"] in {"time", "throughput", "memory"}
            assert ratio["value"] is not None
            assert ratio["value"] >= 0
            assert ratio["target"]
        assert row["anchors"]
        assert all(v > 0 for v in row["anchors"].values())
        assert name in proc.stdout
    (r,) = rows["to_numpy_us"]["ratios"]
    assert (r["of"], r["quantity"], r["to"], r["target"]) == (
        "to_numpy",
        "time",
        "numpy.from_dlpack",
        "<= 2x",
    )
    (r,) = rows["host_copy"]["ratios"]
    assert (r["quantity"], r["to"], r["target"]) == ("throughput", "numpy.copyto", ">= 1x")
    assert rows["to_numpy_us"]["us"] > 0
    assert rows["to_torch_us"]["us"] > 0
    assert rows["host_copy"]["gbps"] > 0
    assert rows["host_copy"]["samples"]["copy_to_host"]["result_checked"] is True
    assert len(rows["host_copy"]["samples"]["numpy.copyto"]["seconds"]) == 9
    if not os.environ.get("INTEROP_HOST_THREADS", "").strip():  # a host copy takes every CPU
        assert rows["host_copy"]["threads"] == max(1, min(8, len(os.sched_getaffinity(0))))
    rss = rows["save_npy_rss"]["memory"]
    assert rss["bound_bytes"] == 2 * data["config"]["num_buffers"] * data["config"]["chunk_bytes"]
    assert rss["extra_host_rss_bytes"] >= 0  # 0 is possible: the tensor is written in place
    (r,) = rows["save_npy_rss"]["ratios"]
    assert r["quantity"] == "memory"
    assert r["value"] == rss["extra_host_rss_bytes"] / rss["bound_bytes"]


def test_quick_run_judges_no_target(quick_run):
    proc, data = quick_run
    for row in data["rows"]:
        assert row["met"] is None, row
        assert all(r["met"] is None for r in row.get("ratios", []))
    assert "smoke run" in proc.stdout
    assert "judges no target" in proc.stdout
    assert "MISSED" not in proc.stdout
    assert " met\n" not in proc.stdout


def test_gpu_rows_say_why_they_did_not_run(quick_run):
    proc, data = quick_run
    assert data["device"] == "no CUDA device"  # the quick run hides any GPU (helpers.NO_GPU)
    for row in data["rows"]:
        if row["name"] in GPU_ROWS:
            assert row["status"] in {"skipped", "not available"}
            if row["status"] == "skipped":
                assert row["reason"].startswith("no CUDA device")
            assert "gbps" not in row
            assert "ratios" not in row
            assert row["name"] in proc.stdout
    # one line for the group, its reason once
    reason = next(r["reason"] for r in data["rows"] if r["name"] == "d2h_limit")
    flat = " ".join(proc.stdout.split())  # the report wraps long lines
    assert flat.count(reason) == 1
    # dask_save_npy_cupy is "not available" instead where dask is missing (the GPU runner)
    skipped = [r["name"] for r in data["rows"] if r["status"] == "skipped"]
    assert skipped[:2] == ["d2h_limit", "d2h_prealloc"]
    assert f"skipped ({len(skipped)} rows: {', '.join(skipped)})" in flat


def test_a_full_run_judges_its_targets():
    data = full_host_run()
    assert data["quick"] is False
    assert {row["name"] for row in data["rows"]} == HOST_ROWS | DASK_ROWS
    for row in data["rows"]:
        if row["name"] in DASK_ROWS and not HAVE_DASK:  # e.g. the GPU runner
            assert row["status"] == "not available", row
            assert "[dask]" in row["reason"]
            continue
        assert row["status"] == "ok", row
        assert isinstance(row["met"], bool)
        targeted = [r for r in row["ratios"] if r["target"]]
        assert targeted
        assert row["met"] == all(r["met"] for r in targeted)
        for r in row["ratios"]:
            if r["target"] is None:  # context
                assert r["met"] is None
                continue
            op, limit = r["target"].split()
            bound = float(limit.rstrip("x"))
            assert r["met"] == (r["value"] <= bound if op == "<=" else r["value"] >= bound), r
    table = bench.format_table(data).splitlines()
    for row in (row for row in data["rows"] if row["status"] == "ok"):
        (line,) = [line for line in table if line.startswith(row["name"] + " ")]
        assert line.split()[-1] == ("met" if row["met"] else "MISSED")


def test_missing_function_is_not_available_not_faked(monkeypatch):
    monkeypatch.delattr(interop, "save_npy")
    rows = tuple(spec for spec in bench.ROWS if spec.name in {"save_npy_rss", "save_npy"})
    data = bench.collect_results(TINY, rows)
    for row in data["rows"]:
        assert row["status"] == "not available"
        assert "interop.save_npy" in row["reason"]
        assert "gbps" not in row
        assert row["met"] is None


def test_bad_scale_is_refused(tmp_path):
    proc = run_cli(tmp_path, "bench", "--quick", scale="-1")
    assert proc.returncode == 2
    assert "INTEROP_BENCH_SCALE" in proc.stderr


def test_sizes_scale_and_stay_usable():
    full, quick = bench.BenchSizes.choose(False), bench.BenchSizes.choose(True)
    assert full.gpu_bytes == 1 << 30
    assert full.rss_bytes == 768 << 20
    assert full.host_bytes == 256 << 20
    assert quick.gpu_bytes < full.gpu_bytes
    tiny = bench.BenchSizes.choose(True, 1e-6)
    assert tiny.host_bytes == 1 << 20
    assert tiny.calls >= 100
    with pytest.raises(ValueError, match="positive"):
        bench.BenchSizes.choose(True, 0.0)


def test_peak_rss_sees_an_allocation():
    if status_bytes("VmRSS") is None:
        pytest.skip("needs Linux /proc")
    with bench.PeakRss() as rss:
        a = np.ones(64 << 20, np.uint8)  # 64 MiB, touched
        del a
    assert rss.extra_bytes is not None
    assert 48 << 20 <= rss.extra_bytes <= 128 << 20, rss.extra_bytes


def test_wrong_data_makes_an_error_row(capsys):
    def broken(ctx):
        raise bench.WrongResultError("copy_to_host returned data that differs from the source")

    spec = bench.RowSpec("broken", "a row that fails", "-", (), False, broken)
    data = bench.collect_results(TINY, (spec,))
    (row,) = data["rows"]
    assert row["status"] == "error"
    assert "differs" in row["reason"]
    assert "WrongResultError" in capsys.readouterr().err
    assert "MISSED" not in bench.format_table(data)
    assert "error (1 row: broken): WrongResultError" in bench.format_table(data)


def test_a_failing_cache_release_keeps_the_other_rows(monkeypatch, capsys):
    """A release that raises (a sticky CUDA error) is a note; the run goes on."""

    def failing_release(self):
        raise RuntimeError("cudaErrorIllegalAddress")

    monkeypatch.setattr(bench.context.BenchContext, "release", failing_release)
    first = bench.RowSpec("first", "a row", "-", (), False, lambda ctx: {})
    second = bench.RowSpec("second", "a row", "-", (), False, lambda ctx: {})
    data = bench.collect_results(TINY, (first, second))
    assert [row["status"] for row in data["rows"]] == ["ok", "ok"]
    assert len(data["notes"]["release_errors"]) == 2
    assert "cudaErrorIllegalAddress" in capsys.readouterr().err
    assert "note: releasing caches failed after first" in bench.format_table(data)


def test_results_so_far_are_handed_out_after_each_row():
    """A run that dies in a later row (a crash in the driver) keeps the earlier rows."""
    seen = []
    first = bench.RowSpec("first", "a row", "-", (), False, lambda ctx: {})

    def crash(ctx):
        raise SystemExit("the process dies here")

    second = bench.RowSpec("second", "a row", "-", (), False, crash)
    with pytest.raises(SystemExit):
        bench.collect_results(TINY, (first, second), on_row=seen.append)
    (partial,) = seen
    assert partial["partial"] is True
    assert [row["name"] for row in partial["rows"]] == ["first"]
    assert partial["device"]
    assert partial["commit"]


def test_final_json_is_not_marked_partial(quick_run):
    _, data = quick_run
    assert "partial" not in data


def test_json_is_strict_with_non_finite_figures(tmp_path):
    results = {"rows": [{"gbps": float("nan"), "ratios": {"a": float("inf"), "b": 1.5}}]}
    path = bench.write_json(results, tmp_path / "deep" / "r.json")
    text = path.read_text()
    assert "NaN" not in text
    assert "Infinity" not in text
    assert json.loads(text) == {"rows": [{"gbps": None, "ratios": {"a": None, "b": 1.5}}]}
    assert sorted(p.name for p in path.parent.iterdir()) == ["r.json"]  # no temporary left


def test_importing_interop_does_not_import_the_bench():
    code = "import sys, interop; print('interop.bench' in sys.modules, 'matplotlib' in sys.modules)"
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.gpu
def test_gpu_rows_run(tmp_path):
    """On a GPU runner every GPU row runs and checks its result (figures not judged)."""
    path = tmp_path / "bench.json"
    proc = run_cli(tmp_path, "bench", "--quick", "--json", str(path), scale="0.125")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(path.read_text())
    assert data["device"] != "no CUDA device"
    rows = {row["name"]: row for row in data["rows"]}
    if rows["dask_save_npy_cupy"]["status"] == "not available":  # no dask on the runner
        assert "interop[dask]" in rows["dask_save_npy_cupy"]["reason"]
        rows.pop("dask_save_npy_cupy")
    for name in GPU_ROWS & set(rows):
        assert rows[name]["status"] == "ok", rows[name]
        assert rows[name].get("gbps", 0) > 0 or rows[name].get("us")
    checked = {"d2h_prealloc", "d2h_fresh", "d2h_strided", "h2d_pageable", "save_npy"}
    for name in checked | ({"dask_save_npy_cupy"} & set(rows)):
        assert any(s.get("result_checked") for s in rows[name]["samples"].values()), name
    assert rows["d2h_strided"]["memory"]["extra_device_bytes"] is not None
    assert rows["d2h_strided"]["memory"]["copy_to_host(t.T) extra_device_bytes"] is not None
    assert rows["h2d_pageable"]["memory"]["extra_host_rss_bytes"] is not None
    for name in ("d2h_prealloc", "h2d_pageable"):  # what bounds the ring, stage by stage
        stages = rows[name]["stages"]
        assert "error" not in stages, stages
        assert stages["DMA GB/s"] > 0
        assert stages["host GB/s"] > 0
        assert stages["bound GB/s"] == min(stages["DMA GB/s"], stages["host GB/s"])
        assert stages["settings"] == data["config"] | {
            "chunk_bytes": stages["settings"]["chunk_bytes"]
        }
        assert any(r["to"] == "the slower ring stage alone" for r in rows[name]["ratios"])
    pinning = rows["d2h_prealloc"]["stages"]["registration"]  # pinning out in place instead
    assert "error" not in pinning, pinning
    assert pinning["whole GB/s"] > 0
    assert pinning["chunks GB/s"] > 0
    assert "registration" not in rows["h2d_pageable"]["stages"]
    assert "ring stages alone: DMA " in proc.stdout
    targets = {r["to"] for r in rows["d2h_fresh"]["ratios"] if r["target"]}
    assert targets == {"cupy.asnumpy(x)", "t.cpu().numpy()"}
    if "dask_save_npy_cupy" in rows:
        assert rows["dask_save_npy_cupy"]["memory"]["extra_device_bytes"] is not None
    for label in ("to_cupy(t)", "to_torch(c)"):  # where a call's time goes
        top = rows["exchange_us"]["profile"][label]
        assert top, label
        assert any("exchange.py" in entry["function"] for entry in top), top
    assert "profile of to_cupy(t): " in proc.stdout
    where = rows["save_npy"]["trace"]  # the save's own time beside its transfer's
    assert where["call_seconds"] >= where["wall_seconds"]


def test_a_profile_ranks_the_functions_a_call_spends_its_time_in():
    import time

    from interop.bench.measure import profile_per_call
    from interop.bench.report import profile_text

    def slow() -> None:
        time.sleep(0.002)

    def quick() -> int:
        return sum(range(10))

    def call() -> None:
        quick()
        slow()
        quick()

    top = profile_per_call(call, 20, top=3)
    assert len(top) == 3
    assert top[0]["function"] == "<built-in method time.sleep>"
    assert top[0]["own_us"] >= 2000
    assert top[0]["calls"] == 1
    assert [e["own_us"] for e in top] == sorted((e["own_us"] for e in top), reverse=True)
    found = {e["function"].rsplit("(", 1)[-1]: e for e in profile_per_call(call, 20, top=20)}
    assert found["slow)"]["cumulative_us"] >= 2000
    assert found["quick)"]["calls"] == 2
    assert found["call)"]["calls"] == 1
    everything = profile_per_call(call, 20, top=100)
    assert not any("measure.py" in e["function"] for e in everything)  # not the calling loop
    assert gc.isenabled()
    text = profile_text(top, shown=2)
    assert text.startswith(f"<built-in method time.sleep> {top[0]['own_us']:.1f} us; ")
    assert text.endswith("(own time per call under cProfile, which inflates it)")


def test_a_case_settles_untimed_after_every_call():
    """Background work a call leaves (a replaced file being freed) is waited for
    after each of its calls, outside its timing and before the next case."""
    import time

    from interop.bench.measure import Case, measure

    calls: list[str] = []

    def settle() -> None:
        time.sleep(0.05)
        calls.append("settled")

    cases = {
        "ours": Case(lambda: calls.append("ours"), 1, settle=settle),
        "anchor": Case(lambda: calls.append("anchor"), 1),
    }
    got = measure(cases, 2, release=lambda: None)
    assert calls == ["ours", "settled", "anchor"] * 4  # first calls, warm-up, 2 rounds
    assert max(got["ours"].seconds) < 0.05  # the settling is not timed


def test_measure_warms_again_only_after_emptying_caches():
    """Without ``release`` (the sweep) the first call is the warm-up: no extra untimed round."""
    from interop.bench.measure import Case, measure

    calls: list[str] = []
    released: list[int] = []

    def cases() -> dict[str, Case]:
        return {k: Case(lambda k=k: calls.append(k), 1) for k in ("ours", "limit")}

    got = measure(cases(), 3)
    assert calls == ["ours", "limit"] + ["ours", "limit"] * 3
    assert [len(m.seconds) for m in got.values()] == [3, 3]
    calls.clear()
    measure(cases(), 2, release=lambda: released.append(len(calls)))
    assert released == [0, 1]  # before each first call
    assert calls == ["ours", "limit"] + ["ours", "limit"] + ["ours", "limit"] * 2
