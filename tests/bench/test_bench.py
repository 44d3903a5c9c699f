"""``python -m interop bench``: it runs, its JSON has the schema, rows are honest.

No timing asserts: the figures are results of the benchmark, never test outcomes.
The lab built on it (targets, sweep, plot, diagnoses) is tested in ``benchmarks/tests``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from interop import bench
from interop.__main__ import main
from interop.bench import run as run_mod
from interop.bench.measure import (
    BenchSizes,
    Case,
    PeakRss,
    Ratio,
    WrongResultError,
    measure,
    status_bytes,
)
from interop.bench.rows import RowSpec, busy_machine
from interop.bench.run import format_table, json_path_problem, machine, memory_text, ratio_text
from tests.helpers import NO_GPU, REPO_ROOT, child_env, git_head, run_python

GPU_ROWS = {
    "d2h_limit",
    "d2h_prealloc",
    "d2h_pinned",
    "d2h_fresh",
    "d2h_strided",
    "h2d_limit",
    "h2d_pageable",
    "h2d_pinned",
    "exchange_us",
    "save_npy",
}
HOST_ROWS = {"to_numpy_us", "to_torch_us", "host_copy", "host_fresh", "save_npy_rss"}
SMOKE_SCALE = "0.25"  # --quick at a quarter of its sizes: seconds on two cores
TINY = BenchSizes.choose(True, 0.02)
MACHINE_KEYS = {
    "cpu_model",
    "cpus",
    "cpus_usable",
    "numa_nodes",
    "gpu_numa_node",
    "l3_bytes",
    "transparent_hugepages",
    "glibc",
    "memory_bytes",
}


def run_cli(
    directory: Path, *args: str, scale: str = SMOKE_SCALE, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python -m interop ARGS`` in a fresh process, with a scale and a scratch directory."""
    env = child_env(
        {"INTEROP_BENCH_SCALE": scale, "INTEROP_BENCH_DIR": str(directory), **(env or {})}
    )
    return subprocess.run(
        [sys.executable, "-m", "interop", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )


@functools.cache
def _quick(directory: str) -> tuple[subprocess.CompletedProcess, Any]:
    path = Path(directory) / "bench.json"
    proc = run_cli(Path(directory), "bench", "--quick", "--json", str(path), env=NO_GPU)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, json.loads(path.read_text())


@pytest.fixture
def quick_run(tmp_path_factory):
    """One quick, scaled-down run with --json, GPU hidden (once per session)."""
    return _quick(str(tmp_path_factory.getbasetemp() / "interop-bench-quick"))


def test_json_records_the_run(quick_run):
    _, data = quick_run
    assert data["schema"] == bench.SCHEMA == 3
    assert data["kind"] == "bench"
    assert isinstance(data["device"], str)
    assert data["device"]
    assert data["quick"] is True
    assert data["judged"] is False  # the package measures; the lab judges
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
    settings = {"chunk_bytes", "num_buffers", "host_threads"}
    assert set(data["config"]) == settings | {"register_min_bytes"}  # -1: measured on first use
    assert all(isinstance(data["config"][k], int) and data["config"][k] > 0 for k in settings)
    assert data["config"]["register_min_bytes"] >= -1
    assert data["versions"]["numpy"] == np.__version__
    assert "torch" in data["versions"]
    assert "cupy" in data["versions"]
    assert data["sizes"]["scale"] == float(SMOKE_SCALE)  # from INTEROP_BENCH_SCALE
    assert data["sizes"]["repeats"] >= 3
    assert set(data["machine"]) == MACHINE_KEYS
    assert data["machine"]["cpus"] == os.cpu_count()
    assert data["machine"]["gpu_numa_node"] is None  # the GPU is hidden from the run


def test_machine_facts_are_read_from_the_system():
    facts = machine()
    assert set(facts) == MACHINE_KEYS
    assert facts["cpus"] == os.cpu_count()
    if sys.platform == "linux":
        meminfo = Path("/proc/meminfo").read_text()
        total = int(re.search(r"^MemTotal:\s+(\d+) kB", meminfo, re.MULTILINE)[1]) * 1024
        assert facts["memory_bytes"] == total
        assert facts["cpus_usable"] == len(os.sched_getaffinity(0))
        assert facts["glibc"] is None or re.fullmatch(r"\d+\.\d+(\.\d+)?", facts["glibc"])
        thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
        if thp.exists():
            assert f"[{facts['transparent_hugepages']}]" in thp.read_text()
        nodes = list(Path("/sys/devices/system/node").glob("node[0-9]*"))
        assert facts["numa_nodes"] == (len(nodes) or None)


def test_missing_machine_facts_are_null_not_errors(monkeypatch):
    """A container hiding /proc and /sys, another libc: every fact it cannot read is None."""
    monkeypatch.setattr(run_mod, "_read", lambda path: None)
    monkeypatch.setattr(run_mod.glob, "glob", lambda pattern: [])
    monkeypatch.setattr(run_mod.platform, "libc_ver", lambda: ("", ""))
    facts = machine()
    assert {k for k, v in facts.items() if v is not None} <= {"cpus", "cpus_usable"}
    assert facts["cpu_model"] is None
    assert facts["l3_bytes"] is None
    assert facts["glibc"] is None
    assert facts["memory_bytes"] is None
    assert facts["numa_nodes"] is None


_HEADER_OUTSIDE_GIT = """
import json
from interop.bench.run import run_header
from interop.bench.measure import BenchSizes
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


def test_every_row_is_listed(quick_run):
    _, data = quick_run
    names = [row["name"] for row in data["rows"]]
    assert sorted(names) == sorted(GPU_ROWS | HOST_ROWS)
    assert names == [spec.name for spec in bench.ROWS]
    for row in data["rows"]:
        assert row["what"]
        assert row["status"] in {"ok", "skipped", "not available", "error"}
        assert row["status"] != "error", row
        assert "met" not in row  # nothing judged here
        if row["status"] != "ok":
            assert row["reason"]


def test_host_rows_report_figures_and_directed_ratios(quick_run):
    proc, data = quick_run
    rows = {row["name"]: row for row in data["rows"]}
    for name in HOST_ROWS:
        row = rows[name]
        assert row["status"] == "ok", row
        assert row["ratios"]
        for ratio in row["ratios"]:
            assert set(ratio) == {"of", "quantity", "to", "value"}
            assert ratio["quantity"] in {"time", "throughput", "memory"}
            assert ratio["value"] is not None
            assert ratio["value"] >= 0
        assert row["anchors"]
        assert all(v > 0 for v in row["anchors"].values())
        assert name in proc.stdout
    (r,) = rows["to_numpy_us"]["ratios"]
    assert (r["of"], r["quantity"], r["to"]) == ("to_numpy", "time", "numpy.from_dlpack")
    (r,) = rows["host_copy"]["ratios"]
    assert (r["quantity"], r["to"]) == ("throughput", "numpy.copyto")
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


def test_host_fresh_compares_each_size_with_a_numpy_copy_idle_and_busy(quick_run):
    """copy_to_host(t) allocating out, at 1 MiB, 16 MiB and the host_copy size, on the
    machine as it is and again with every core kept busy by other processes."""
    _, data = quick_run
    row = next(r for r in data["rows"] if r["name"] == "host_fresh")
    host_mib = data["sizes"]["host_bytes"] / (1 << 20)
    sizes = [f"{n:.0f} MiB" for n in sorted({1, min(16, host_mib), host_mib})]
    at = sizes + [f"{a} busy" for a in sizes]
    assert list(row["by_size_gbps"]) == at
    assert row["gbps"] == row["by_size_gbps"][sizes[-1]]  # the figure: the largest, not busy
    assert row["busy"] == {"processes": os.cpu_count(), "nice": os.getpriority(os.PRIO_PROCESS, 0)}
    assert [(r["of"], r["to"]) for r in row["ratios"]] == [
        (f"copy_to_host(t) {a}", f"t.numpy().copy() {a}") for a in at
    ]
    for r, a in zip(row["ratios"], at, strict=True):
        anchor = row["anchors"][f"t.numpy().copy() {a} GB/s"]
        assert r["value"] == pytest.approx(row["by_size_gbps"][a] / anchor)
        assert row["samples"][f"copy_to_host(t) {a}"]["result_checked"] is True
        # rounds: as many as fit in the largest size's time (at least 3 x repeats)
        rounds = max(9, 4 * data["sizes"]["host_bytes"] // (int(a.split()[0]) << 20))
        assert len(row["samples"][f"t.numpy().copy() {a}"]["seconds"]) == rounds


def _spinners() -> dict[int, str]:
    """This process's children running busy_machine's loop: pid -> state (R: running)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, ppid = stat.read_text().rsplit(") ", 1)[1].split()[:2]
            command = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue  # ended meanwhile
        if int(ppid) == os.getpid() and b"getppid" in command:
            found[int(stat.parent.name)] = state
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_busy_machine_spins_its_processes_and_kills_every_one():
    seen: dict[int, str] = {}

    def spin_then_fail() -> None:
        with busy_machine(3):
            seen.update(_spinners())
            raise KeyError("inside the block")

    assert _spinners() == {}
    with pytest.raises(KeyError, match="inside the block"):
        spin_then_fail()
    assert sorted(seen.values()) == ["R", "R", "R"]  # running (or ready to) in the block
    assert _spinners() == {}  # killed and reaped, though the block raised
    for pid in seen:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_spinner_whose_bench_died_stops_by_itself():
    """A bench killed outright (no ``finally`` runs) leaves no process spinning."""
    proc = run_python(
        """
        import os
        from interop.bench.rows import busy_machine
        from tests.bench.test_bench import _spinners
        with busy_machine(1):
            print(*_spinners(), flush=True)
            os._exit(0)
        """
    )
    (pid,) = map(int, proc.stdout.split())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:  # gone, or a zombie its new parent has not reaped
            if Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] == "Z":
                break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        pytest.fail(f"spinner {pid} still running after its parent died")


def test_gpu_rows_say_why_they_did_not_run(quick_run):
    proc, data = quick_run
    assert data["device"] == "no CUDA device"  # the quick run hides any GPU (helpers.NO_GPU)
    for row in data["rows"]:
        if row["name"] in GPU_ROWS:
            assert row["status"] == "skipped"
            assert row["reason"].startswith("no CUDA device")
            assert "gbps" not in row
            assert "ratios" not in row
    # one plain sentence for what ran, then the rows that did not, in words, their reason once
    assert "Measured on the CPU only: the GPU rows below need a CUDA device." in proc.stdout
    reason = next(r["reason"] for r in data["rows"] if r["name"] == "d2h_limit")
    assert proc.stdout.count(reason) == 1
    skipped = [r["what"] for r in data["rows"] if r["status"] == "skipped"]
    listed = proc.stdout.split(f"skipped ({reason}):\n", 1)[1].split("\nwrote ")[0]
    assert listed.splitlines() == [f"  {what}" for what in skipped]
    assert not any(name in proc.stdout for name in GPU_ROWS - {"save_npy"})  # no row ids


def test_without_gpu_cupy_is_suggested_only_where_a_gpu_is(monkeypatch, tmp_path):
    """CuPy missing: its install line helps where a GPU is there, and misleads where none is."""
    from interop import _backends
    from interop.bench import measure as measure_mod
    from interop.errors import BackendUnavailableError

    def no_cupy():
        raise BackendUnavailableError("this call needs cupy; install it with: pip install x")

    monkeypatch.setattr(_backends, "require_cupy_device", no_cupy)
    driver = str(tmp_path)  # as /proc/driver/nvidia/gpus: an entry per GPU, none here
    assert measure_mod.gpu_unavailable(driver) == "no CUDA device: the driver lists no GPU"
    (tmp_path / "0000:01:00.0").mkdir()
    assert measure_mod.gpu_unavailable(driver) == (
        "no CUDA device usable: this call needs cupy; install it with: pip install x"
    )


def test_the_table_shows_figures_anchors_and_directions(quick_run):
    proc, data = quick_run
    table = format_table(data)
    assert table == proc.stdout.split("\nwrote ")[0].rstrip("\n")  # what the command printed
    assert table.startswith("interop bench --quick: a smoke run")
    assert re.search(r"to_numpy: \d+\.\d\dx the time of numpy\.from_dlpack", table)
    assert re.search(r"to_torch: \d+\.\d\dx the time of torch\.from_dlpack", table)
    assert re.search(r"copy_to_host: \d+\.\d\dx the throughput of numpy\.copyto", table)
    assert re.search(r"extra host RSS of save_npy: \d+\.\d\dx the bound", table)
    assert re.search(r"^save_npy_rss\s+\d+(\.\d)? MiB extra host RSS$", table, re.MULTILINE)
    assert "lower is better" in table
    assert "higher is better" in table
    assert " vs " not in table  # no undirected "a vs b" ratios
    assert "target" not in table  # targets and verdicts are the lab's
    assert "MISSED" not in table
    assert f"{os.cpu_count()} CPUs" in table  # the machine
    assert re.search(r"^machine  .*memory \d+\.\d\d GiB", table, re.MULTILINE)


def test_ratio_text_says_which_way_is_better():
    """Targets and verdicts are the lab's (benchmarks/lab.py): never shown here."""
    time_ = Ratio.between("to_numpy", "time", "numpy.from_dlpack", 1.29, 1.0).record()
    assert ratio_text(time_) == "to_numpy: 1.29x the time of numpy.from_dlpack"
    rate = Ratio.between("copy_to_host", "throughput", "numpy.copyto", 1.14, 1.0).record()
    assert ratio_text(rate | {"target": ">= 1x", "met": False}) == (
        "copy_to_host: 1.14x the throughput of numpy.copyto"
    )
    memory = Ratio.between("extra RSS", "memory", "the ring size", 64.0, 128.0).record()
    assert ratio_text(memory) == "extra RSS: 0.50x the ring size"
    none = Ratio.between("a", "throughput", "b", 1.0, 0.0).record()
    assert ratio_text(none) == "a: n/a the throughput of b"


def test_a_ratio_is_none_where_a_side_is_missing_and_refuses_a_bad_quantity():
    assert Ratio.between("a", "throughput", "b", 5.0, 10.0).value == 0.5
    assert Ratio.between("a", "throughput", "b", 5.0, 0.0).value is None
    assert Ratio.between("a", "memory", "the ring", None, 10.0).value is None
    assert Ratio.between("a", "time", "b", float("inf"), 1.0).value is None
    with pytest.raises(ValueError, match="expected a quantity"):
        Ratio("a", "speed", "b", 1.0)


def test_memory_is_named_in_words():
    memory = {
        "extra_device_bytes": None,
        "copy_to_host(t.T) extra_device_bytes": 64 << 20,
        "ring_bytes": 128 << 20,
        "extra_host_rss_bytes": 3 << 30,
        "rss_method": "VmHWM",
    }
    assert memory_text(memory) == (
        "extra device memory not measured, copy_to_host(t.T) extra device memory 64 MiB, "
        "ring 128 MiB, extra host RSS 3.00 GiB, peak RSS from VmHWM"
    )


def test_bad_scale_is_refused(tmp_path):
    proc = run_cli(tmp_path, "bench", "--quick", scale="-1")
    assert proc.returncode == 2
    assert "INTEROP_BENCH_SCALE" in proc.stderr


def test_a_json_path_in_a_regular_file_is_refused_before_any_row(tmp_path):
    (tmp_path / "afile").write_text("a regular file")
    proc = run_cli(tmp_path, "bench", "--json", str(tmp_path / "afile" / "x.json"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""  # no row ran, no table
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.splitlines()  # no row's progress line either
    assert line == (
        "interop bench: expected the results' path to be in a directory (got "
        f"{str(tmp_path / 'afile' / 'x.json')!r}, but {str(tmp_path / 'afile')!r} is a file); "
        "choose another path"
    )
    assert (tmp_path / "afile").read_text() == "a regular file"


@pytest.mark.parametrize("where", ["afile/deeper/x.json", "adir"])
def test_other_json_paths_that_cannot_be_written_are_refused_before_any_row(
    tmp_path, where, capsys, monkeypatch
):
    (tmp_path / "afile").write_text("a regular file")
    (tmp_path / "adir").mkdir()
    ran = []
    monkeypatch.setattr(bench.run, "collect_results", lambda *a, **k: ran.append(a))
    assert main(["bench", "--json", str(tmp_path / where)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert ran == []
    assert err.startswith("interop bench: expected ")
    assert str(tmp_path / where) in err
    assert ("is a file" in err) == (where != "adir")


def test_a_json_path_under_missing_directories_is_fine(tmp_path):
    assert json_path_problem(tmp_path / "new" / "deeper" / "x.json") is None
    assert json_path_problem(tmp_path / "x.json") is None
    assert "a directory" in json_path_problem(tmp_path)


def test_sizes_scale_and_stay_usable():
    full, quick = BenchSizes.choose(False), BenchSizes.choose(True)
    assert full.gpu_bytes == 1 << 30
    assert full.rss_bytes == 768 << 20
    assert full.host_bytes == 256 << 20
    assert quick.gpu_bytes < full.gpu_bytes
    tiny = BenchSizes.choose(True, 1e-6)
    assert tiny.host_bytes == 1 << 20
    assert tiny.calls >= 100
    assert BenchSizes.choose(False, 0.5).host_bytes == 128 << 20
    with pytest.raises(ValueError, match="positive"):
        BenchSizes.choose(True, 0.0)


def test_peak_rss_sees_an_allocation():
    if status_bytes("VmRSS") is None:
        pytest.skip("needs Linux /proc")
    with PeakRss() as rss:
        a = np.ones(64 << 20, np.uint8)  # 64 MiB, touched
        del a
    assert rss.extra_bytes is not None
    assert 48 << 20 <= rss.extra_bytes <= 128 << 20, rss.extra_bytes


def test_wrong_data_makes_an_error_row(capsys):
    def broken(ctx):
        raise WrongResultError("copy_to_host returned data that differs from the source")

    spec = RowSpec("broken", "a row that fails", False, broken)
    data = bench.collect_results(TINY, (spec,))
    (row,) = data["rows"]
    assert row["status"] == "error"
    assert "differs" in row["reason"]
    assert "WrongResultError" in capsys.readouterr().err
    why = "WrongResultError: copy_to_host returned data that differs from the source"
    assert f"error ({why}):\n  a row that fails" in format_table(data)  # the row in words


def test_a_row_lacking_an_optional_library_is_not_available():
    ran = []
    spec = RowSpec("x", "a row", False, ran.append, unavailable=lambda: "needs y: pip install y")
    data = bench.collect_results(TINY, (spec,))
    assert data["rows"] == [
        {
            "name": "x",
            "what": "a row",
            "status": "not available",
            "reason": "needs y: pip install y",
        }
    ]
    assert ran == []


def test_a_failing_cache_release_keeps_the_other_rows(monkeypatch, capsys):
    """A release that raises (a sticky CUDA error) is a note; the run goes on."""

    def failing_release(self):
        raise RuntimeError("cudaErrorIllegalAddress")

    monkeypatch.setattr(bench.run.BenchContext, "release", failing_release)
    first = RowSpec("first", "a row", False, lambda ctx: {})
    second = RowSpec("second", "a row", False, lambda ctx: {})
    data = bench.collect_results(TINY, (first, second))
    assert [row["status"] for row in data["rows"]] == ["ok", "ok"]
    assert len(data["notes"]["release_errors"]) == 2
    assert "cudaErrorIllegalAddress" in capsys.readouterr().err


def test_results_so_far_are_handed_out_after_each_row():
    """A run that dies in a later row (a crash in the driver) keeps the earlier rows."""
    seen = []
    first = RowSpec("first", "a row", False, lambda ctx: {})

    def crash(ctx):
        raise SystemExit("the process dies here")

    second = RowSpec("second", "a row", False, crash)
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


def test_the_package_does_not_import_the_lab():
    """interop.bench is shipped; benchmarks/ (the lab) is not, so the package never needs it."""
    code = (
        "import sys, interop.bench.run, interop.bench.rows; "
        "print(any(m == 'benchmarks' or m.startswith('benchmarks.') for m in sys.modules))"
    )
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False"]


def test_a_case_settles_untimed_after_every_call():
    """Background work a call leaves (a replaced file being freed) is waited for
    after each of its calls, outside its timing and before the next case."""
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


def test_bench_help_lists_the_environment_and_explains_scale(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for name in (
        "INTEROP_BENCH_SCALE",
        "INTEROP_BENCH_DIR",
        "INTEROP_CHUNK_BYTES",
        "INTEROP_NUM_BUFFERS",
        "INTEROP_HOST_THREADS",
    ):
        assert name in text
    assert "multiplies every array size and loop count" in text
    assert "--quick" in text
    assert "--json" in text
    assert "--sweep" not in text  # the lab's (python -m benchmarks sweep)


@pytest.mark.parametrize("argv", [["--help"], ["bench", "--help"], ["info", "--help"]])
def test_help_has_no_markup_and_no_private_references(argv, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    text = capsys.readouterr().out
    assert "SPEC" not in text
    assert "§" not in text
    assert "``" not in text
    assert not re.search(r":(func|class|mod|data|meth):", text)


@pytest.mark.parametrize("argv", [["bench", "--sweep"], ["bench", "--plot", "x.png", "a.json"]])
def test_the_lab_options_are_not_the_packages(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_no_private_references_in_the_bench_sources():
    files = [
        *sorted((REPO_ROOT / "interop" / "bench").rglob("*.py")),
        REPO_ROOT / "interop" / "__main__.py",
        *sorted((REPO_ROOT / "benchmarks").glob("*.py")),  # the lab, its page and the runner
        REPO_ROOT / "docs" / "benchmark-method.md",
        REPO_ROOT / "scripts" / "gpu-check",
    ]
    for path in files:
        text = path.read_text()
        assert "SPEC" not in text, path
        assert "§" not in text, path


def test_the_package_stays_small():
    """The bench shipped with interop: the user-facing rows and the table, no lab."""
    lines = sum(
        len(p.read_text().splitlines()) for p in (REPO_ROOT / "interop" / "bench").rglob("*.py")
    )
    assert lines <= 1103, lines


@pytest.mark.gpu
def test_gpu_rows_run(tmp_path):
    """On a GPU runner every GPU row runs and checks its result."""
    path = tmp_path / "bench.json"
    proc = run_cli(tmp_path, "bench", "--quick", "--json", str(path), scale="0.125")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(path.read_text())
    assert data["device"] != "no CUDA device"
    assert data["machine"]["gpu_numa_node"] is None or isinstance(
        data["machine"]["gpu_numa_node"], int
    )
    rows = {row["name"]: row for row in data["rows"]}
    for name in GPU_ROWS:
        assert rows[name]["status"] == "ok", rows[name]
        assert rows[name].get("gbps", 0) > 0 or rows[name].get("us")
        assert rows[name]["name"] in proc.stdout
    checked = {
        "d2h_prealloc",
        "d2h_pinned",
        "d2h_fresh",
        "d2h_strided",
        "h2d_pageable",
        "h2d_pinned",
        "save_npy",
    }
    for name in checked:
        assert any(s.get("result_checked") for s in rows[name]["samples"].values()), name
    assert rows["h2d_pageable"]["memory"]["extra_host_rss_bytes"] is not None
    assert rows["d2h_strided"]["variants"]["copy_to_host(t.T, out) GB/s"] > 0
    to = {r["to"] for r in rows["d2h_fresh"]["ratios"]}
    assert to == {"cupy.asnumpy(x)", "t.cpu().numpy()", "d2h_limit"}
    for name, ours, limit in (
        ("d2h_pinned", "copy_to_host(x, out=pinned)", "d2h_limit"),
        ("h2d_pinned", "copy_to_device(pinned)", "h2d_limit"),
        ("d2h_prealloc", "copy_to_host(x, out)", "d2h_limit"),
        ("h2d_pageable", "copy_to_device(host)", "h2d_limit"),
    ):
        (r,) = [r for r in rows[name]["ratios"] if r["of"] == ours and r["to"] == limit]
        assert r["value"] == pytest.approx(
            rows[name]["gbps"] / rows[name]["anchors"][f"{limit} GB/s"]
        )
    assert set(rows["exchange_us"]["us"]) == {"to_cupy(t)", "to_torch(c)"}
