"""Every script of the lab at a tiny size, from its command line, with the GPU hidden (the
GPU rows run in ``test_gpu_rows_run_with_their_diagnoses``): what it writes and prints,
judged. No timing asserts: whether a ratio meets its target is a result, not an outcome."""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys

import pytest

from benchmarks import lab
from benchmarks.dask_save import reset_peak_rss
from benchmarks.targets import REFERENCES, TARGETS, target_words
from interop.bench import ROWS
from interop.info import install_command
from tests.helpers import NO_GPU, REPO_ROOT, child_env

GPU_ROWS = {spec.name for spec in ROWS if spec.gpu}
GPU_ROWS |= {"dask_save_npy_cupy", "ckpt_save", "ckpt_load"}
HAVE_DASK = all(importlib.util.find_spec(name) for name in ("dask", "distributed"))


def run(directory, *args: str, scale: str = "0.01", gpu: bool = False):
    """``python -m ARGS`` from the repository root, file rows writing in ``directory``."""
    env = {"INTEROP_BENCH_SCALE": scale, "INTEROP_BENCH_DIR": str(directory)}
    return subprocess.run(
        [sys.executable, "-m", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=child_env(env if gpu else env | NO_GPU),
        cwd=REPO_ROOT,
        check=False,
    )


def _host_limit(rows: dict, data: dict, directory) -> None:
    host = rows["host_limit"]  # no GPU: pageable copies only, a whole chunk for every thread
    rates = host["copies"]["pageable->pageable"]["alone"]
    assert (list(rates), host["gbps"]) == (["1", "2", "4", "8", "16"], max(rates.values()))
    assert host["not_measured"] == "pinned copies, a busy link and pinning rates: no CUDA device"
    for n in rates:
        sample = host["samples"][f"pageable->pageable, {n} threads, alone"]
        assert sample["result_checked"] is True
        assert sample["bytes"] >= 16 * host["chunk_bytes"]
    overlap = rows["emulated_overlap"]
    assert overlap["anchors"]["link GB/s"] <= 2.0 * 1.0001  # never faster than its link
    ideal, serial = overlap["ratios"]
    assert ideal["value"] == pytest.approx(overlap["gbps"] / min(overlap["anchors"].values()))
    assert serial["value"] > ideal["value"] > 0
    hybrid = rows["d2h_hybrid"]  # the emulated hybrid form, over its link and the ring alone
    link, ring = hybrid["ratios"]
    assert (link["to"], ring["to"]) == ("link", "the ring alone")
    assert link["value"] == pytest.approx(hybrid["gbps"] / hybrid["anchors"]["link GB/s"])


def _torch_op(rows: dict, data: dict, directory) -> None:
    row, calls = rows["torch_op_us"], max(100, data["sizes"]["calls"] // 4)
    assert row["size"] == "16 float32, x + y, cpu"  # the GPU is hidden
    (ratio,) = row["ratios"]
    assert ratio["value"] == pytest.approx(row["us"] / row["anchors"][f"{ratio['to']} us"])
    assert all(s["calls"] == calls for s in row["samples"].values())


def _dask_save(rows: dict, data: dict, directory) -> None:
    row = rows["dask_save_npy"]
    if not HAVE_DASK:  # e.g. the GPU runner
        assert (row["status"], install_command("dask") in row["reason"]) == ("not available", True)
        return
    ours, nbytes = "interop.dask.save_npy", data["sizes"]["rss_bytes"] // 2 // 4096 * 4096
    assert row["size"].startswith(f"{nbytes / (1 << 20):.1f} MiB float32 in 16 blocks")
    judged_on = {ours, "da.to_npy_stack", "da.store(open_memmap)"}
    if row.get("tmpfs") is None:  # judged on a tmpfs; interop's save on disk beside
        assert row["directory"] == "/dev/shm"
        judged_on.add(f"{ours} on disk")
    assert (row["disk_directory"], set(row["samples"])) == (str(directory), judged_on)
    for sample in row["samples"].values():
        assert (sample["result_checked"], sample["bytes"]) == (True, nbytes)
        assert len(sample["seconds"]) == data["sizes"]["repeats"]
    memory = row["memory"]
    assert memory["bound_bytes"] == memory["block_bytes"] + 2 * memory["ring_bytes"]
    assert row["cluster"] == {"workers": 2, "threads_per_worker": 1, "processes": True}


CHECKS = {"host_limit": _host_limit, "torch_op": _torch_op, "dask_save": _dask_save}


@pytest.mark.parametrize("script", lab.SCRIPTS)
def test_a_script_runs_its_rows_judged_at_a_tiny_size(script, tmp_path):
    """Its rows in order, each measured and judged (a reference's verdict None), skipped for
    want of a GPU or not available, with the reason; every target matched by a ratio."""
    path = tmp_path / "out.json"
    proc = run(tmp_path, f"benchmarks.{script}", "--json", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(path.read_text())
    assert (data["kind"], data["quick"], data["judged"]) == ("bench", False, True)
    module = importlib.import_module(f"benchmarks.{script}")
    assert [row["name"] for row in data["rows"]] == [spec.name for spec in module.ROWS]
    rows = {row["name"]: row for row in data["rows"]}
    for name, row in rows.items():
        assert row["target"] == target_words(name)
        assert row["status"] in {"ok", "skipped", "not available"}, row
        assert (name if row["status"] == "ok" else f"  {row['what']}\n") in proc.stdout
        if row["status"] != "ok":
            assert row["met"] is None
            assert row["reason"].startswith("no CUDA device") == (row["status"] == "skipped")
            assert name in GPU_ROWS or row["status"] == "not available"
            continue
        targeted = [r for r in row["ratios"] if r["target"]]
        assert row["met"] == (all(r["met"] for r in targeted) if name in TARGETS else None)
        for r in targeted:
            op, limit = r["target"].split()
            bound = float(limit.rstrip("x"))
            assert r["met"] == (
                r["value"] is not None
                and (r["value"] <= bound if op == "<=" else r["value"] >= bound)
            )
        for target in TARGETS.get(name, ()):
            if target.quantity != "memory" or reset_peak_rss() is not None:
                assert any(target.matches(r) and r["value"] is not None for r in row["ratios"])
    CHECKS.get(script, lambda *args: None)(rows, data, tmp_path)
    assert set(TARGETS) | set(REFERENCES) == {spec.name for spec in lab.all_rows()}
    assert proc.stdout.splitlines()[-2].startswith("summary: ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["benchmarks", "run", "--rows", "host_copy,d2h_sweep"], "expected rows among"),
        (["benchmarks.d2h", "--json", "{tmp}/afile/x.json"], "is a file); choose another path"),
        (["benchmarks", "sweep", "--rows", "d2h_fresh"], "expected rows among"),
        (["benchmarks", "sweep", "--chunk-mib", "0,4"], "positive integers"),
        (["benchmarks", "plot", "{tmp}/x.png", "{tmp}/afile"], "expected bench or sweep JSON"),
        (["benchmarks", "bench"], "usage: python -m benchmarks {run,sweep,plot,keep,tables}"),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(args, message, tmp_path):
    (tmp_path / "afile").write_text("{}")
    proc = run(tmp_path, *(a.format(tmp=tmp_path) for a in args))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


@pytest.mark.gpu
def test_gpu_rows_run_with_their_diagnoses(tmp_path):
    """On a GPU runner every GPU row runs, checks its result and carries its diagnoses."""
    path = tmp_path / "bench.json"
    proc = run(
        tmp_path, "benchmarks", "run", "--quick", "--json", str(path), scale="0.125", gpu=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(path.read_text())
    rows = {row["name"]: row for row in data["rows"]}
    if rows["dask_save_npy_cupy"]["status"] == "not available":  # no dask on the runner
        rows.pop("dask_save_npy_cupy")
    for name in GPU_ROWS & set(rows):
        assert rows[name]["status"] == "ok", rows[name]
        checked = any(s.get("result_checked") for s in rows[name]["samples"].values())
        assert checked or "us" in rows[name]
    for name in ("d2h_prealloc", "h2d_pageable"):  # what bounds the ring, stage by stage
        stages = rows[name]["stages"]
        assert stages["bound GB/s"] == min(stages["DMA GB/s"], stages["host GB/s"]) > 0
        assert any(r["to"] == "the slower ring stage alone" for r in rows[name]["ratios"])
    for name in ("d2h_prealloc", "d2h_strided", "h2d_pageable", "save_npy"):
        assert "error" not in rows[name]["trace"], rows[name]["trace"]
    assert rows["save_npy"]["trace"]["call_seconds"] >= rows["save_npy"]["trace"]["wall_seconds"]
    strided = rows["d2h_strided"]  # the device memory of transposed copies, against the ring
    memory = {r["of"]: r for r in strided["ratios"] if r["quantity"] == "memory"}
    assert set(memory) == {f"extra device memory of copy_to_host({s}.T, out)" for s in "xt"}
    assert all(r["value"] is not None and r["target"] == "<= 1x" for r in memory.values())
    for label in ("to_cupy(t)", "to_torch(c)"):  # where a call's time goes
        assert rows["exchange_us"]["profile"][label]
    host = rows["host_limit"]  # the host side's ceilings, alone and with the link busy
    assert set(host["copies"]) == {"pinned->pageable", "pageable->pinned"}
    for side, by in host["copies"].items():
        assert set(by) == {"alone", "link busy"}
        assert host["anchors"][f"{side} ceiling GB/s"] == max(by["link busy"].values()) > 0
    chunked = {f"chunks, {n} threads" for n in (1, 2, 4, 8, 16)}
    assert set(host["registration"]) == {"whole"} | chunked
    if "dask_save_npy_cupy" in rows:
        assert rows["dask_save_npy_cupy"]["memory"]["extra_device_bytes"] is not None
    for fragment in ("ring stages alone: DMA ", "profile of to_cupy(t): ", "cudaHostRegister"):
        assert fragment in proc.stdout
