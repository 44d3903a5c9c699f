"""``python -m benchmarks run``: every row with its target, verdicts, the lab's own rows.

No timing asserts: whether a ratio meets its target is a result of the
benchmark (docs/benchmarks.md), never a test outcome.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import time

import pytest

from benchmarks import diagnostics, lab
from benchmarks.__main__ import main
from benchmarks.dask_save import reset_peak_rss
from benchmarks.diagnostics import profile_per_call, profile_text
from benchmarks.lab import LAB_ROWS, torch_op_unavailable
from benchmarks.report import format_report
from benchmarks.targets import REFERENCES, TARGETS, Target, judge
from interop.bench import ROWS, collect_results
from interop.bench.measure import BenchSizes
from interop.bench.results import Ratio
from interop.bench.rows import RowSpec
from interop.info import install_command

from .runs import full_host_run, quick_bench, run_lab

PACKAGE_GPU_ROWS = {spec.name for spec in ROWS if spec.gpu}
GPU_ROWS = PACKAGE_GPU_ROWS | {"dask_save_npy_cupy"}
HOST_ROWS = {spec.name for spec in ROWS if not spec.gpu} | {"host_limit", "emulated_overlap"}
# The cluster row (test_dask_save.py) and the torch_op row: some of their ratios are
# context, without a target, and they may be "not available".
OPTIONAL_ROWS = {"dask_save_npy", "torch_op_us"}
HAVE_DASK = all(importlib.util.find_spec(name) for name in ("dask", "distributed"))
TINY = BenchSizes.choose(True, 0.02)


@pytest.fixture
def quick_run():
    """One quick, scaled-down lab run with --json: (process, parsed JSON)."""
    proc, data, _ = quick_bench()
    return proc, data


def test_the_lab_runs_every_row_of_the_package_and_its_own():
    names = [spec.name for spec in LAB_ROWS]
    assert len(names) == len(set(names))
    assert set(names) == GPU_ROWS | HOST_ROWS | OPTIONAL_ROWS
    package = [name for name in names if name in {spec.name for spec in ROWS}]
    assert package == [spec.name for spec in ROWS if not spec.gpu] + [
        spec.name for spec in ROWS if spec.gpu
    ]


def test_every_row_has_a_target_or_is_a_reference():
    names = {spec.name for spec in LAB_ROWS}
    assert set(TARGETS) | set(REFERENCES) == names
    assert not set(TARGETS) & set(REFERENCES)


def test_every_row_is_listed_with_its_target(quick_run):
    _, data = quick_run
    names = [row["name"] for row in data["rows"]]
    assert names == [spec.name for spec in LAB_ROWS]
    for row in data["rows"]:
        assert row["what"]
        assert row["target"]
        assert row["status"] in {"ok", "skipped", "not available", "error"}
        assert row["status"] != "error", row
        if row["status"] != "ok":
            assert row["reason"]
            assert row["met"] is None
    targets = {row["name"]: row["target"] for row in data["rows"]}
    assert targets["d2h_limit"].startswith("none: ")
    assert targets["host_copy"] == "at least 1.0x the throughput of one numpy.copyto"


def test_quick_run_judges_no_target(quick_run):
    proc, data = quick_run
    assert data["judged"] is False
    for row in data["rows"]:
        assert row["met"] is None, row
        assert all(r["met"] is None for r in row.get("ratios", []))
    assert "smoke run" in proc.stdout
    assert "judges no target" in proc.stdout
    assert "MISSED" not in proc.stdout
    assert " met\n" not in proc.stdout
    host_copy = next(r for r in data["rows"] if r["name"] == "host_copy")
    assert host_copy["ratios"][0]["target"] == ">= 1x"  # carried, not judged


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
    assert data["judged"] is True
    assert {row["name"] for row in data["rows"]} == HOST_ROWS | OPTIONAL_ROWS
    for row in data["rows"]:
        if row["name"] in OPTIONAL_ROWS and row["status"] == "not available":
            if row["name"] == "dask_save_npy":
                assert not HAVE_DASK  # e.g. the GPU runner
                assert "[dask]" in row["reason"]
            continue
        assert row["status"] == "ok", row
        if row["name"] in REFERENCES:
            assert row["met"] is None
            assert all(r["target"] is None for r in row["ratios"])
            continue
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
    table = format_report(data).splitlines()
    for row in (row for row in data["rows"] if row["status"] == "ok"):
        (line,) = [line for line in table if line.startswith(row["name"] + " ")]
        verdict = {True: "met", False: "MISSED", None: "reference"}[row["met"]]
        assert line.split()[-1] == verdict


def test_every_host_target_is_matched_by_a_ratio_of_a_real_run():
    """A target's patterns name ratios the rows really make: no target is left unmeasured
    (where peak RSS can be measured here)."""
    for row in full_host_run()["rows"]:
        if row["status"] != "ok":
            continue
        for target in TARGETS.get(row["name"], ("", ()))[1]:
            if target.quantity == "memory" and not reset_peak_rss() is not None:
                continue
            measured = [r for r in row["ratios"] if target.matches(r) and r["value"] is not None]
            assert measured, (row["name"], target)


def test_a_target_knows_its_direction():
    faster = Target("to_numpy", "numpy.from_dlpack", "time", at_most=2.0)
    assert faster.words == "<= 2x"
    assert faster.met(1.5) is True
    assert faster.met(2.5) is False
    slower = Target("copy_to_host", "numpy.copyto", "throughput", at_least=1.0)
    assert slower.words == ">= 1x"
    assert slower.met(0.9) is False
    assert slower.met(1.0) is True
    assert Target("a", "the ring", "memory", at_most=1.0).met(None) is False  # not measured
    assert slower.matches({"of": "copy_to_host", "to": "numpy.copyto"})
    assert not slower.matches({"of": "copy_to_host", "to": "numpy.copy"})
    strided = Target("copy_to_host(?.T, out)", "copy_to_host(x, out)", "throughput", at_least=0.8)
    assert strided.matches({"of": "copy_to_host(t.T, out)", "to": "copy_to_host(x, out)"})


def _row(name: str, *ratios: Ratio) -> dict:
    return {"name": name, "what": "w", "status": "ok", "ratios": [r.record() for r in ratios]}


def test_a_row_meets_its_target_when_every_targeted_ratio_does():
    ok = Ratio.between("copy_to_host", "throughput", "numpy.copyto", 1.2, 1.0)
    bad = Ratio.between("copy_to_host", "throughput", "numpy.copyto", 0.9, 1.0)
    info = Ratio.between("copy_to_host", "throughput", "the link", 1.0, 100.0)  # context
    met = judge(_row("host_copy", ok, info))
    assert met["met"] is True
    assert [(r["target"], r["met"]) for r in met["ratios"]] == [(">= 1x", True), (None, None)]
    assert met["target"] == TARGETS["host_copy"][0]
    missed = judge(_row("host_copy", bad, info))
    assert missed["met"] is False
    assert missed["ratios"][0]["met"] is False
    smoke = judge(_row("host_copy", bad), judged=False)  # a smoke run
    assert smoke["met"] is None
    assert smoke["ratios"][0] | {"value": None} == {
        "of": "copy_to_host",
        "quantity": "throughput",
        "to": "numpy.copyto",
        "value": None,
        "target": ">= 1x",
        "met": None,
    }
    reference = judge(_row("d2h_limit"))
    assert (reference["met"], reference["target"]) == (None, REFERENCES["d2h_limit"])
    skipped = judge({"name": "host_copy", "what": "w", "status": "skipped", "reason": "r"})
    assert (skipped["met"], skipped["target"]) == (None, TARGETS["host_copy"][0])


def test_a_target_no_ratio_matches_is_missed():
    """A renamed ratio cannot pass unseen: its target is shown, unmeasured and missed."""
    renamed = Ratio.between("copy_to_host(out)", "throughput", "numpy.copyto", 2.0, 1.0)
    row = judge(_row("host_copy", renamed))
    assert row["met"] is False
    assert row["ratios"][-1] == {
        "of": "copy_to_host",
        "quantity": "throughput",
        "to": "numpy.copyto",
        "value": None,
        "target": ">= 1x",
        "met": False,
    }
    assert "copy_to_host: n/a the throughput of numpy.copyto (target >= 1x: MISSED)" in " ".join(
        format_report(_results([row])).split()
    )


def test_host_fresh_is_judged_idle_and_busy():
    """Both conditions carry the target; a row that lost its busy half misses it."""
    idle = Ratio.between("copy_to_host(t) 1 MiB", "throughput", "t.numpy().copy() 1 MiB", 1.1, 1.0)
    busy = Ratio.between(
        "copy_to_host(t) 1 MiB busy", "throughput", "t.numpy().copy() 1 MiB busy", 0.5, 1.0
    )
    row = judge(_row("host_fresh", idle, busy))
    assert [(r["of"], r["target"], r["met"]) for r in row["ratios"]] == [
        ("copy_to_host(t) 1 MiB", ">= 1x", True),
        ("copy_to_host(t) 1 MiB busy", ">= 1x", False),
    ]
    assert row["met"] is False
    without_busy = judge(_row("host_fresh", idle))
    assert without_busy["met"] is False
    assert without_busy["ratios"][-1]["of"] == "copy_to_host(t) * busy"
    assert without_busy["ratios"][-1]["value"] is None


def _results(rows: list[dict]) -> dict:
    return {
        "quick": False,
        "judged": True,
        "device": "no CUDA device",
        "date": "2026-01-01T00:00:00+00:00",
        "commit": "0123456789abcdef",
        "config": {"chunk_bytes": 32 << 20, "num_buffers": 4, "host_threads": 4},
        "sizes": BenchSizes.choose(False).__dict__,
        "rows": rows,
    }


def test_the_host_limit_row_measures_thread_scaling_without_a_gpu(quick_run):
    _, data = quick_run
    row = next(r for r in data["rows"] if r["name"] == "host_limit")
    assert row["status"] == "ok", row
    assert row["threads"] == [1, 2, 4, 8, 16]
    (side,) = row["copies"]
    assert side == "pageable->pageable"
    rates = row["copies"][side]["alone"]
    assert list(rates) == ["1", "2", "4", "8", "16"]
    assert all(v > 0 for v in rates.values())
    assert row["gbps"] == max(rates.values())
    assert "link busy" not in row["copies"][side]
    assert "registration" not in row
    assert row["not_measured"] == "pinned copies, a busy link and pinning rates: no CUDA device"
    for n in rates:
        sample = row["samples"][f"{side}, {n} threads, alone"]
        assert sample["result_checked"] is True
        assert sample["bytes"] >= 16 * row["chunk_bytes"]  # a whole chunk for every thread
    assert row["met"] is None  # a reference


def test_torch_op_row_compares_with_a_hand_written_custom_op(quick_run):
    _, data = quick_run
    row = next(r for r in data["rows"] if r["name"] == "torch_op_us")
    assert torch_op_unavailable() is None  # PyTorch and benchmarks/torch_op_overhead.py here
    assert row["status"] == "ok", row
    assert row["size"] == "16 float32, x + y, cpu"  # the quick run hides the GPU
    hand = row["anchors"]["a hand-written torch.library.custom_op us"]
    assert row["us"] > 0
    assert hand > 0
    (ratio,) = row["ratios"]
    assert (ratio["of"], ratio["quantity"], ratio["to"]) == (
        "interop.torch_op",
        "time",
        "a hand-written torch.library.custom_op",
    )
    assert ratio["value"] == pytest.approx(row["us"] / hand)
    assert (ratio["target"], ratio["met"]) == ("<= 1.3x", None)  # carried, not judged: quick
    calls = max(100, data["sizes"]["calls"] // 4)
    for sample in row["samples"].values():
        assert sample["calls"] == calls
        assert len(sample["seconds"]) == data["sizes"]["repeats"]


def test_torch_op_row_is_not_available_without_its_module(monkeypatch):
    monkeypatch.setattr(lab, "TORCH_OP_MODULE", "benchmarks.no_such_module")
    spec = next(spec for spec in LAB_ROWS if spec.name == "torch_op_us")
    (row,) = collect_results(TINY, (spec,), judge=judge)["rows"]
    assert (row["status"], row["met"]) == ("not available", None)
    assert row["reason"] == "benchmarks/torch_op_overhead.py is not in this checkout"


def test_torch_op_row_is_judged_against_its_target(tmp_path, monkeypatch):
    """The row's ratio is judged: a measuring module that reports 1.5x misses the 1.3x."""
    (tmp_path / "fake_torch_op.py").write_text(
        "def measure(n_calls, *, repeats, device):\n"
        "    return {'size': '16 float32', 'interop_us': 3.0, 'custom_op_us': 2.0,\n"
        "            'samples': {'interop.torch_op': [3.0] * repeats,\n"
        "                        'custom_op': [2.0] * repeats}}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(lab, "TORCH_OP_MODULE", "fake_torch_op")
    spec = next(spec for spec in LAB_ROWS if spec.name == "torch_op_us")
    data = collect_results(TINY, (spec,), judge=judge)
    (row,) = data["rows"]
    assert row["status"] == "ok", row
    assert row["us"] == 3.0
    (ratio,) = row["ratios"]
    assert (ratio["value"], ratio["target"], ratio["met"]) == (1.5, "<= 1.3x", False)
    assert row["met"] is False


def test_an_unknown_row_is_refused(capsys):
    assert main(["run", "--rows", "host_copy,d2h_sweep"]) == 2
    err = capsys.readouterr().err
    assert "expected rows among" in err
    assert "d2h_sweep" in err


def test_rows_can_be_chosen_and_the_json_path_is_checked_first(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("INTEROP_BENCH_SCALE", "0.02")
    path = tmp_path / "lab.json"
    assert main(["run", "--quick", "--rows", "to_numpy_us", "--json", str(path)]) == 0
    assert [row["name"] for row in json.loads(path.read_text())["rows"]] == ["to_numpy_us"]
    capsys.readouterr()
    (tmp_path / "afile").write_text("")
    assert main(["run", "--quick", "--json", str(tmp_path / "afile" / "x.json")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("benchmarks run: expected the results' path to be in a directory")


def test_bad_scale_is_refused(tmp_path):
    proc = run_lab(tmp_path, "run", "--quick", scale="-1")  # the command line, end to end
    assert proc.returncode == 2
    assert "INTEROP_BENCH_SCALE" in proc.stderr


def test_a_wrong_result_is_an_error_row_not_a_verdict(capsys):
    from interop.bench.measure import WrongResultError

    def broken(ctx):
        raise WrongResultError("copy_to_host returned data that differs from the source")

    data = collect_results(TINY, (RowSpec("host_copy", "w", False, broken),), judge=judge)
    (row,) = data["rows"]
    assert (row["status"], row["met"]) == ("error", None)
    assert "WrongResultError" in capsys.readouterr().err
    table = format_report(data)
    assert "MISSED" not in table
    assert "error (1 row: host_copy): WrongResultError" in table


def test_a_profile_ranks_the_functions_a_call_spends_its_time_in():
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
    assert not any("diagnostics.py" in e["function"] for e in everything)  # not the calling loop
    assert gc.isenabled()
    text = profile_text(top, shown=2)
    assert text.startswith(f"<built-in method time.sleep> {top[0]['own_us']:.1f} us; ")
    assert text.endswith("(own time per call under cProfile, which inflates it)")


def test_a_failing_diagnosis_keeps_the_rows_figures(monkeypatch, capsys):
    def diagnose(ctx):
        raise RuntimeError("cudaErrorIllegalAddress")

    monkeypatch.setitem(diagnostics.DIAGNOSES, "host_copy", diagnose)
    spec = diagnostics.diagnosed(next(spec for spec in ROWS if spec.name == "host_copy"))
    data = collect_results(TINY, (spec,), judge=judge)
    (row,) = data["rows"]
    assert row["status"] == "ok"
    assert row["gbps"] > 0
    assert row["diagnosis_error"] == "RuntimeError: cudaErrorIllegalAddress"
    assert isinstance(row["met"], bool)
    assert "cudaErrorIllegalAddress" in capsys.readouterr().err
    flat = " ".join(format_report(data).split())
    assert "diagnoses not made: RuntimeError: cudaErrorIllegalAddress" in flat


@pytest.mark.gpu
def test_gpu_rows_run_with_their_diagnoses(tmp_path):
    """On a GPU runner every GPU row runs, checks its result and carries its diagnoses."""
    path = tmp_path / "bench.json"
    proc = run_lab(tmp_path, "run", "--quick", "--json", str(path), scale="0.125")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(path.read_text())
    assert data["device"] != "no CUDA device"
    rows = {row["name"]: row for row in data["rows"]}
    if rows["dask_save_npy_cupy"]["status"] == "not available":  # no dask on the runner
        assert install_command("dask") in rows["dask_save_npy_cupy"]["reason"]
        rows.pop("dask_save_npy_cupy")
    for name in GPU_ROWS & set(rows):
        assert rows[name]["status"] == "ok", rows[name]
        assert rows[name].get("gbps", 0) > 0 or rows[name].get("us")
    checked = {"d2h_prealloc", "d2h_fresh", "d2h_strided", "h2d_pageable", "save_npy"}
    for name in checked | ({"dask_save_npy_cupy"} & set(rows)):
        assert any(s.get("result_checked") for s in rows[name]["samples"].values()), name
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
    targets = {(r["of"], r["to"]) for r in rows["d2h_pinned"]["ratios"] if r["target"]}
    assert targets == {("copy_to_host(x, out=pinned)", "d2h_limit")}
    if "dask_save_npy_cupy" in rows:
        assert rows["dask_save_npy_cupy"]["memory"]["extra_device_bytes"] is not None
    strided = rows["d2h_strided"]  # the device memory of transposed copies, against the ring
    assert strided["memory"]["extra_device_bytes"] is not None
    assert strided["memory"]["copy_to_host(t.T) extra_device_bytes"] is not None
    memory = {r["of"]: r for r in strided["ratios"] if r["quantity"] == "memory"}
    assert set(memory) == {
        "extra device memory of copy_to_host(x.T, out)",
        "extra device memory of copy_to_host(t.T, out)",
    }
    assert all(r["target"] == "<= 1x" for r in memory.values())
    for label in ("to_cupy(t)", "to_torch(c)"):  # where a call's time goes
        top = rows["exchange_us"]["profile"][label]
        assert top, label
        assert any("exchange.py" in entry["function"] for entry in top), top
    assert "profile of to_cupy(t): " in proc.stdout
    where = rows["save_npy"]["trace"]  # the save's own time beside its transfer's
    assert where["call_seconds"] >= where["wall_seconds"]
    for name in ("d2h_prealloc", "d2h_strided", "h2d_pageable"):
        assert "error" not in rows[name]["trace"], rows[name]["trace"]
    # the host side's ceilings, alone and with the link busy, and the pinning rates
    host = rows["host_limit"]
    assert set(host["copies"]) == {"pinned->pageable", "pageable->pinned"}
    for side, by in host["copies"].items():
        assert set(by) == {"alone", "link busy"}
        for rates in by.values():
            assert list(rates) == ["1", "2", "4", "8", "16"]
            assert all(v > 0 for v in rates.values())
        assert host["anchors"][f"{side} ceiling GB/s"] == max(by["link busy"].values())
    assert host["gbps"] == host["anchors"]["pinned->pageable ceiling GB/s"]
    assert set(host["registration"]) == {"whole"} | {
        f"chunks, {n} threads" for n in (1, 2, 4, 8, 16)
    }
    assert all(v > 0 for v in host["registration"].values())
    assert "cudaHostRegister + unregister: whole " in proc.stdout
