"""The ``emulated_overlap`` row: the pipeline's overlap measured on a CPU."""

from __future__ import annotations

import pytest

from benchmarks.emulated_overlap import LINK_GBPS, SETTINGS, measure

from .runs import quick_bench


@pytest.fixture(scope="module")
def quick_run():
    """The lab's shared quick run (made once per test session): (process, JSON)."""
    proc, data, _ = quick_bench()
    return proc, data


def test_the_row_reports_the_pipeline_against_both_schedules(quick_run):
    _, data = quick_run
    row = next(r for r in data["rows"] if r["name"] == "emulated_overlap")
    assert row["status"] == "ok", row
    assert row["settings"] == SETTINGS
    assert set(row["anchors"]) == {"link GB/s", "host stage GB/s"}
    assert row["anchors"]["link GB/s"] <= LINK_GBPS * 1.0001  # never faster than the link
    assert row["gbps"] > 0
    assert all(v > 0 for v in row["anchors"].values())
    ideal, serial = row["ratios"]
    assert (ideal["of"], ideal["to"]) == ("copy_to_host(x, out)", "max(link, host stage)")
    assert serial["to"] == "link + host stage, one after the other"
    assert ideal["value"] == pytest.approx(row["gbps"] / min(row["anchors"].values()))
    assert serial["value"] > ideal["value"] > 0
    assert isinstance(row["overlap"], float)
    assert row["met"] is None  # a reference


def test_the_link_is_never_timed_faster_than_its_rate():
    nbytes = 4 << 20
    seconds = measure(nbytes, link_gbps=1.0, repeats=1, chunk_bytes=1 << 20)
    assert seconds["link"] >= nbytes / 1e9
    # the pipeline cannot beat its own link: every byte crossed it
    assert seconds["copy_to_host(x, out)"] >= nbytes / 1e9
    assert seconds["host stage"] > 0


def test_a_bad_setting_is_refused_before_anything_moves():
    with pytest.raises(ValueError, match="link_gbps"):
        measure(1 << 20, link_gbps=0.0)
