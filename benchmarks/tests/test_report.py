"""The lab's report reads plainly: directed ratios, judged targets, grouped skips, diagnoses."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import interop
from benchmarks.__main__ import main
from benchmarks.diagnostics import traced
from benchmarks.report import format_report as format_table
from benchmarks.report import judged_ratio_text
from benchmarks.targets import judge
from interop.bench.measure import BenchSizes
from interop.bench.results import Ratio

from .runs import full_host_run, quick_bench

ROOT = Path(__file__).resolve().parent.parent.parent


def _judged(name: str, *ratios: Ratio, quick: bool = False, **fields) -> dict:
    """A measured row as the lab reports it: its ratios judged against its targets."""
    row = {"name": name, "what": "w", "status": "ok", "ratios": [r.record() for r in ratios]}
    return judge(row | fields, judged=not quick)


# ----------------------------------------------------------------- the printed report


def _results(quick: bool, rows: list[dict]) -> dict:
    return {
        "quick": quick,
        "device": "no CUDA device",
        "date": "2026-01-01T00:00:00+00:00",
        "commit": "0123456789abcdef",
        "commit_dirty": False,
        "config": {"chunk_bytes": 32 << 20, "num_buffers": 4, "host_threads": 4},
        "sizes": BenchSizes.choose(quick).__dict__,
        "notes": {},
        "rows": rows,
    }


@pytest.fixture
def host_results():
    """Real runs of the host rows: judged (full, tiny sizes) and a smoke run (``--quick``)."""
    return full_host_run(), quick_bench()[1]


def test_report_labels_every_ratio_with_its_direction(host_results):
    full, _ = host_results
    table = format_table(full)
    flat = " ".join(table.split())
    assert re.search(r"to_numpy: \d+\.\d\dx the time of numpy\.from_dlpack \(target <= 1.2x", flat)
    assert re.search(r"to_torch: \d+\.\d\dx the time of torch\.from_dlpack", flat)
    assert re.search(r"copy_to_host: \d+\.\d\dx the throughput of numpy\.copyto", flat)
    assert re.search(r"extra host RSS of save_npy: \d+\.\d\dx the bound", flat)
    assert " vs " not in table  # no undirected "a vs b" ratios
    assert "lower is better" in table
    assert "higher is better" in table


def test_memory_rows_lead_with_memory(host_results):
    full, _ = host_results
    (line,) = [line for line in format_table(full).splitlines() if line.startswith("save_npy_rss")]
    assert re.match(r"save_npy_rss\s+\d+(\.\d)? MiB extra host RSS\s+(met|MISSED)$", line), line
    assert "bound 256 MiB" in format_table(full)


def test_full_report_explains_scale_and_judges(host_results):
    full, _ = host_results
    table = format_table(full)
    assert "scale 0.005 (INTEROP_BENCH_SCALE multiplies every size and loop count)" in table
    assert "smoke" not in table
    verdicts = {row["name"]: row["met"] for row in full["rows"] if row["status"] == "ok"}
    for name, met in verdicts.items():
        (line,) = [line for line in table.splitlines() if line.startswith(name + " ")]
        assert line.endswith({True: "met", False: "MISSED", None: "reference"}[met])
    summary = table.splitlines()[-1]
    assert summary.startswith("summary: ")
    judged = [row for row in full["rows"] if row["status"] == "ok" and row["met"] is not None]
    assert len(judged) >= 5  # the host rows (and the cluster row where dask is installed)
    assert sum(int(n) for n in re.findall(r"(\d+) (?:met|missed)", summary)) == len(judged)
    assert "2 reference" in summary  # host_limit and emulated_overlap: no target


def test_quick_report_is_a_smoke_run_that_judges_nothing(host_results):
    _, quick = host_results
    table = format_table(quick)
    assert table.startswith("interop bench --quick: a smoke run")
    assert "judges no target" in table
    assert "MISSED" not in table
    assert not re.search(r"\bmet$", table, re.MULTILINE)
    assert "not judged" in table
    summary = table.splitlines()[-1]
    measured = sum(row["status"] == "ok" for row in quick["rows"])
    assert measured >= 4  # the host rows; the GPU and dask rows where they can run
    assert summary.startswith(f"summary: {measured} measured (not judged: a smoke run)")


def test_ratio_text_says_which_way_is_better_and_shows_a_target_where_judged():
    time_ = Ratio.between("to_numpy", "time", "numpy.from_dlpack", 1.29, 1.0).record()
    assert judged_ratio_text(time_) == "to_numpy: 1.29x the time of numpy.from_dlpack"
    rate = Ratio.between("copy_to_host", "throughput", "numpy.copyto", 1.14, 1.0).record()
    assert judged_ratio_text(rate | {"target": ">= 1x", "met": None}, judged=False) == (
        "copy_to_host: 1.14x the throughput of numpy.copyto (target >= 1x, not judged)"
    )
    missed = Ratio.between("x", "throughput", "d2h_limit", 0.5, 1.0).record()
    assert judged_ratio_text(missed | {"target": ">= 0.9x", "met": False}).endswith(
        "(target >= 0.9x: MISSED)"
    )
    memory = Ratio.between("extra RSS", "memory", "the ring size", 64.0, 128.0).record()
    assert judged_ratio_text(memory | {"target": "<= 1x", "met": True}) == (
        "extra RSS: 0.50x the ring size (target <= 1x)"
    )


def test_rows_that_did_not_run_are_grouped_by_reason():
    rows = [
        {"name": n, "status": "skipped", "reason": "no CUDA device: none here", "met": None}
        for n in ("d2h_limit", "d2h_fresh", "save_npy")
    ] + [{"name": "x", "status": "not available", "reason": "interop.x missing", "met": None}]
    table = format_table(_results(False, rows))
    assert table.count("no CUDA device: none here") == 1
    assert "skipped (3 rows: d2h_limit, d2h_fresh, save_npy): no CUDA device: none here" in table
    assert "not available (1 row: x): interop.x missing" in table
    assert table.splitlines()[-1] == "summary: 3 skipped, 1 not available"


def test_report_of_a_gpu_row_names_memory_in_words():
    row = _judged(
        "d2h_strided",
        Ratio.between("copy_to_host(x.T, out)", "throughput", "copy_to_host(x, out)", 8.0, 10.0),
        Ratio.between(
            "extra device memory of copy_to_host(x.T, out)",
            "memory",
            "the ring size (num_buffers x chunk_bytes)",
            None,
            128 << 20,
        ),
        gbps=8.0,
        memory={
            "extra_device_bytes": None,
            "copy_to_host(t.T) extra_device_bytes": 64 << 20,
            "ring_bytes": 128 << 20,
        },
    )
    flat = " ".join(format_table(_results(False, [row])).split())
    assert "d2h_strided 8.00 GB/s MISSED" in flat
    assert "0.80x the throughput of copy_to_host(x, out) (target >= 0.8x)" in flat
    assert "n/a the ring size (num_buffers x chunk_bytes) (target <= 1x: MISSED)" in flat
    assert (
        "memory: extra device memory not measured, copy_to_host(t.T) extra device memory "
        "64 MiB, ring 128 MiB"
    ) in flat


def test_a_gpu_row_says_where_the_time_of_a_traced_run_went():
    """The trace of a real transfer (host backend), as a GPU row carries it."""
    from interop.pipeline.ring import free_cached_rings
    from interop.testing import EmulatedDevice

    device = EmulatedDevice(delay=0.001)
    try:
        x = device.asarray(np.arange(1 << 17, dtype=np.float32))  # 512 KiB: 8 chunks
        out = np.zeros(1 << 17, np.float32)
        with interop.config.set(host_threads=2):
            where = traced(lambda: interop.copy_to_host(x, out, chunk_bytes=64 << 10))
        np.testing.assert_array_equal(out, np.arange(1 << 17, dtype=np.float32))
        failed = traced(lambda: None)  # no slot transfer ran
    finally:
        free_cached_rings()
        device.close()
    assert (where["bytes"], where["chunks"], where["threads"]) == (1 << 19, 8, 2)
    assert failed == {"error": "expected one slot transfer to trace (got 0)"}
    row = {
        "name": "d2h_prealloc", "status": "ok", "what": "w", "target": "t", "gbps": 9.0,
        "met": None, "ratios": [], "trace": where,
    }  # fmt: skip
    flat = " ".join(format_table(_results(False, [row])).split())
    said = re.search(
        r"where the time went: ([\d.]+) GB/s in all; device copies ([\d.]+) GB/s "
        r"\(busy (\d+)%\); 2 host threads ([\d.]+) GB/s each \(busy (\d+)%\); "
        r"issuer waited ([\d.]+) s; the call took ([\d.]+) s, ([\d.]+) s of it outside "
        r"the transfer: limited by (.+?) summary",
        flat,
    )
    assert said, flat
    assert where["call_seconds"] >= where["wall_seconds"]
    assert where["outside_seconds"] == pytest.approx(where["call_seconds"] - where["wall_seconds"])
    assert float(said[7]) == pytest.approx(where["call_seconds"], abs=0.0006)
    assert float(said[8]) == pytest.approx(where["outside_seconds"], abs=0.0006)
    assert float(said[1]) == pytest.approx(where["rate_gbps"], abs=0.006)
    assert float(said[2]) == pytest.approx(where["device_gbps"], abs=0.006)
    assert int(said[3]) == round(where["device_busy"] * 100)
    assert said[9].startswith(where["limited_by"].split(" (")[0])
    assert "not traced (no slot transfer)" in " ".join(
        format_table(_results(False, [row | {"trace": {"error": "no slot transfer"}}])).split()
    )


def test_a_traced_direct_copy_says_no_host_threads_copied():
    """A pinned out: the trace of the DMAs-only run, as the report prints it."""
    from interop.testing import EmulatedDevice
    from tests.helpers import pinned

    device = EmulatedDevice(delay=0.001)
    try:
        x = device.asarray(np.arange(1 << 17, dtype=np.float32))  # 512 KiB: 8 chunks
        with pinned(device, (1 << 17,), np.float32) as out:
            where = traced(lambda: interop.copy_to_host(x, out, chunk_bytes=64 << 10))
            np.testing.assert_array_equal(out, np.arange(1 << 17, dtype=np.float32))
    finally:
        device.close()
    assert (where["bytes"], where["chunks"], where["threads"]) == (1 << 19, 8, 0)
    assert where["host_seconds"] == 0
    assert where["host_gbps_per_thread"] is None
    row = {
        "name": "d2h_prealloc", "status": "ok", "what": "w", "target": "t", "gbps": 9.0,
        "met": None, "ratios": [], "trace": where,
    }  # fmt: skip
    flat = " ".join(format_table(_results(False, [row])).split())
    assert re.search(
        r"device copies [\d.]+ GB/s \(busy \d+%\); no host threads \(DMAs straight to or "
        r"from pinned memory\); issuer waited",
        flat,
    ), flat


# ----------------------------------------------------------------- help and wording


def test_lab_help_lists_the_commands_and_the_environment(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
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
    for command in ("run", "sweep", "plot", "keep"):
        assert f"  {command} " in text
    assert "multiplies every array size and loop count" in text
    assert "judged against targets" in " ".join(text.split())


def test_keep_has_its_own_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["keep", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m benchmarks keep [-h] [--branch BRANCH]")
    assert "benchmarks/results/" in out or "the OUTDIR that scripts/gpu-check wrote" in out


@pytest.mark.parametrize(
    "argv", [["--help"], ["run", "--help"], ["sweep", "--help"], ["keep", "--help"]]
)
def test_help_has_no_markup_and_no_private_references(argv, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    text = capsys.readouterr().out
    assert "SPEC" not in text
    assert "§" not in text
    assert "``" not in text
    assert not re.search(r":(func|class|mod|data|meth):", text)


def test_no_private_references_in_the_lab_sources_and_docs():
    files = sorted((ROOT / "benchmarks").glob("*.py"))  # the lab, not its tests
    files += [ROOT / "docs" / "benchmarks.md", ROOT / "docs" / "benchmark-method.md"]
    files += [ROOT / "scripts" / "gpu-check"]
    for path in files:
        text = path.read_text()
        assert "SPEC" not in text, path
        assert "§" not in text, path


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sweep", "--chunk-mib", "0,4"], "positive integers"),
        (["sweep", "--max-seconds", "-3"], "positive number of seconds"),
        (["plot", "out.png"], "the following arguments are required: JSON"),
        (["run", "--chunk-mib", "4"], "unrecognized arguments"),
        (["bench"], "invalid choice"),
    ],
)
def test_bad_lab_arguments_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_report_shows_the_ring_stages_of_a_transfer_row():
    settings = {"chunk_bytes": 32 << 20, "num_buffers": 4, "host_threads": 8}
    stages = {"settings": settings, "DMA GB/s": 51.0, "host GB/s": 20.5, "bound GB/s": 20.5}
    ratio = Ratio.between(
        "copy_to_host(x, out)", "throughput", "the slower ring stage alone", 19.0, 20.5
    )
    row = _judged("d2h_prealloc", ratio, quick=True, gbps=19.0, stages=stages)
    failed = row | {"name": "h2d_pageable", "stages": {"settings": settings, "error": "E: x"}}
    pinned = row | {
        "name": "d2h_strided",
        "stages": stages | {"registration": {"whole GB/s": 12.345, "chunks GB/s": 9.0}},
    }
    unpinned = row | {"name": "d2h_fresh", "stages": stages | {"registration": {"error": "E: y"}}}
    flat = " ".join(format_table(_results(True, [row, failed, pinned, unpinned])).split())
    assert (
        "ring stages alone: DMA 51.00 GB/s, host copies 20.50 GB/s at chunk_bytes 32 MiB, "
        "num_buffers 4, host_threads 8 h2d_pageable"  # the next row: no pinning figures here
    ) in flat
    assert "0.93x the throughput of the slower ring stage alone" in flat
    assert "ring stages alone: not measured (E: x) at chunk_bytes 32 MiB" in flat
    assert (
        "num_buffers 4, host_threads 8; pinning the array in place (cudaHostRegister + "
        "unregister) 12.35 GB/s whole, 9.00 GB/s by chunks"
    ) in flat
    assert "host_threads 8; pinning the array in place not measured (E: y)" in flat


def test_report_shows_the_host_ceilings():
    rates = {"1": 9.0, "2": 17.5, "4": 30.0, "8": 31.0, "16": 29.0}
    row = _judged(
        "host_limit",
        Ratio.between(
            "pinned->pageable, link busy", "throughput", "pinned->pageable, alone", 20.0, 31.0
        ),
        gbps=20.0,
        copies={"pinned->pageable": {"alone": rates, "link busy": rates | {"8": 20.0}}},
        registration={"whole": 6.5, "chunks, 1 threads": 5.25},
    )
    flat = " ".join(format_table(_results(False, [row])).split())
    assert "host_limit 20.00 GB/s reference" in flat
    assert (
        "pinned->pageable, alone: 1 threads 9.00, 2 threads 17.50, 4 threads 30.00, "
        "8 threads 31.00, 16 threads 29.00 GB/s"
    ) in flat
    assert (
        "pinned->pageable, link busy: 1 threads 9.00, 2 threads 17.50, 4 threads 30.00, "
        "8 threads 20.00"
    ) in flat
    assert "cudaHostRegister + unregister: whole 6.50, chunks, 1 threads 5.25 GB/s" in flat
    assert "cudaHostRegister + unregister: whole 6.50, chunks, 1 threads 5.25 GB/s" in flat
