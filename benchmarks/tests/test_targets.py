"""Targets that compare rows of one run: the pageable transfers against the
link or the ring's ceiling, whichever is lower, and ``d2h_fresh`` against
``d2h_prealloc``."""

from __future__ import annotations

from benchmarks.targets import D2H_BOUND, H2D_BOUND, PREALLOC, RunJudge


def _ok(name: str, gbps: float, **fields: object) -> dict[str, object]:
    return {"name": name, "what": name, "status": "ok", "gbps": gbps, "ratios": []} | fields


def _host_limit(d2h: float, h2d: float) -> dict[str, object]:
    anchors = {"pinned->pageable ceiling GB/s": d2h, "pageable->pinned ceiling GB/s": h2d}
    return _ok("host_limit", d2h, anchors=anchors)


def _ratio(row: dict[str, object], to: str) -> dict[str, object]:
    (found,) = [r for r in row["ratios"] if r["to"] == to]  # type: ignore[attr-defined]
    return found


def test_pageable_rows_are_judged_against_the_ring_ceiling_when_it_is_lower():
    judge = RunJudge()
    assert judge(_host_limit(d2h=30.0, h2d=40.0))["met"] is None  # a reference
    link = {"anchors": {"d2h_limit GB/s": 50.0}}
    row = judge(_ok("d2h_prealloc", 28.0, **link))
    ratio = _ratio(row, D2H_BOUND)
    assert ratio["value"] == 28.0 / 30.0
    assert ratio["target"] == ">= 0.9x"
    assert ratio["met"] is True
    assert row["met"] is True
    row = judge(_ok("h2d_pageable", 30.0, anchors={"h2d_limit GB/s": 50.0}))
    assert _ratio(row, H2D_BOUND)["value"] == 30.0 / 40.0
    assert _ratio(row, H2D_BOUND)["met"] is False
    assert row["met"] is False


def test_pageable_rows_are_judged_against_the_link_when_the_ring_is_faster():
    judge = RunJudge()
    judge(_host_limit(d2h=80.0, h2d=80.0))
    row = judge(_ok("d2h_prealloc", 45.0, anchors={"d2h_limit GB/s": 55.0}))
    assert _ratio(row, D2H_BOUND)["value"] == 45.0 / 55.0
    assert row["met"] is False


def test_without_host_limit_the_ceiling_target_is_missed_not_passed():
    row = RunJudge()(_ok("d2h_prealloc", 54.0, anchors={"d2h_limit GB/s": 55.0}))
    ratio = _ratio(row, D2H_BOUND)
    assert ratio["value"] is None
    assert ratio["met"] is False
    assert row["met"] is False


def test_fresh_copies_are_judged_against_the_preallocated_row_of_the_same_run():
    judge = RunJudge()
    judge(_ok("d2h_prealloc", 40.0, anchors={"d2h_limit GB/s": 55.0}))
    fresh = {
        "ratios": [
            {"of": "copy_to_host(x)", "quantity": "throughput", "to": to, "value": 5.0}
            for to in ("cupy.asnumpy(x)", "t.cpu().numpy()")
        ]
    }
    row = judge(_ok("d2h_fresh", 30.0, **fresh))
    assert _ratio(row, PREALLOC)["value"] == 0.75
    assert _ratio(row, PREALLOC)["met"] is False
    assert row["met"] is False
    assert _ratio(row, "cupy.asnumpy(x)")["met"] is True
    judge = RunJudge()
    judge(_ok("d2h_prealloc", 40.0, anchors={"d2h_limit GB/s": 55.0}))
    assert judge(_ok("d2h_fresh", 36.0, **fresh))["met"] is True


def test_a_smoke_run_adds_the_ratios_but_judges_none():
    judge = RunJudge()
    judge(_host_limit(d2h=30.0, h2d=40.0), False)
    row = judge(_ok("d2h_prealloc", 28.0, anchors={"d2h_limit GB/s": 50.0}), False)
    assert _ratio(row, D2H_BOUND)["met"] is None
    assert row["met"] is None
