"""Every results file kept in ``benchmarks/results/`` stays readable by the lab's readers:
the report, the plot, the sweep's suggestion and ``keep``'s Markdown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import keep_results
from benchmarks.plot import plot_results
from benchmarks.report import format_report
from benchmarks.sweep import format_sweep, suggest_defaults

KEPT = sorted((Path(__file__).resolve().parents[1] / "results").glob("*.json"))


def test_there_are_kept_results():
    assert KEPT


@pytest.mark.parametrize("path", KEPT, ids=[p.stem for p in KEPT])
def test_a_kept_run_is_read_by_every_reader(path, tmp_path):
    kept = json.loads(path.read_text())
    bench, sweep = kept["bench"], kept["sweep"]
    report = format_report(bench)
    assert report.startswith("interop bench")
    for row in bench["rows"]:
        assert row["name"] in report
        if row["status"] == "ok":
            verdict = {True: "met", False: "MISSED", None: "reference"}[row["met"]]
            (line,) = [line for line in report.splitlines() if line.startswith(row["name"] + " ")]
            assert line.split()[-1] == verdict
    assert "summary: " in report.splitlines()[-1]
    if sweep is not None:
        assert sweep["rows"][0]["name"] in format_sweep(sweep)
        suggested = suggest_defaults(sweep)
        assert suggested is None or set(suggested["settings"]) == {
            "chunk_bytes",
            "host_threads",
            "num_buffers",
        }
    panels = plot_results([bench] + ([sweep] if sweep else []), tmp_path / "kept.png")
    assert {p.row for p in panels} >= {"host_copy"}
    assert (tmp_path / "kept.png").read_bytes()[:4] == b"\x89PNG"
    text = keep_results.report(kept, path.stem)
    assert text.startswith(f"## {kept['device']}, {kept['date'][:10]}")
    assert f"benchmarks/results/{path.stem}.json" in text
