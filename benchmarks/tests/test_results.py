"""The lab's results: the sweep and its plot at a tiny size, the verdicts that compare rows
of one run, and every run kept in ``benchmarks/results/`` read by every reader and kept
again by ``keep`` (what it refuses, it refuses with nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import interop
from benchmarks import keep, lab, sweep
from benchmarks.targets import D2H_BOUND, H2D_BOUND, PREALLOC, RunJudge, judge
from interop.bench.measure import BenchSizes, Case, Ratio
from tests.helpers import git_head

from .test_scripts import run

MiB = 1 << 20
KEPT = sorted((Path(__file__).resolve().parents[1] / "results").rglob("*.json"))


def test_the_sweep_and_its_plot_run_at_a_tiny_size(tmp_path):
    path, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    grid = ["--chunk-mib", "1,2", "--host-threads", "1,2", "--num-buffers", "2,3"]
    proc = run(tmp_path, "benchmarks", "sweep", "--quick", *grid, "--json", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(path.read_text())
    assert (data["kind"], data["quick"], "partial" in data) == ("sweep", True, False)
    assert data["grid"] == {
        "chunk_bytes": [MiB, 2 * MiB],
        "host_threads": [1, 2],
        "num_buffers": [2, 3],
    }
    host, *gpu = data["rows"]
    assert [r["status"] for r in gpu] == ["skipped", "skipped"]  # the GPU is hidden
    assert data["suggested_defaults"] is None  # no transfer row measured
    nb = data["config"]["num_buffers"]  # the host engine has no ring: num_buffers not swept
    points = sorted((p["chunk_bytes"], p["host_threads"], p["num_buffers"]) for p in host["points"])
    assert points == [(c * MiB, t, nb) for c in (1, 2) for t in (1, 2)]
    for p in host["points"]:
        assert p["ratio"]["value"] == pytest.approx(p["gbps"] / p["reference_gbps"])
        assert p["samples"]["copy_to_host"]["result_checked"] is True
    assert host["best"]["gbps"] == max(p["gbps"] for p in host["points"])
    assert "host_copy: copy_to_host" in proc.stdout
    proc = run(tmp_path, "benchmarks", "plot", str(png), str(path))
    assert proc.returncode == 0, proc.stderr
    assert "host_copy against chunk_bytes: 2 lines; horizontal lines: numpy.copyto" in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_point_runs_under_its_settings_and_a_spent_budget_leaves_points_not_run():
    seen: list[dict] = []

    def setup(ctx):
        def call():
            seen.append(interop.config.as_dict())

        cases = {"ours": Case(call, MiB), "reference": Case(lambda: 1, MiB)}
        return sweep.Subject("1 MiB", "ours", "reference", cases, {})

    row = sweep.SweepRow("recording", "records config", False, setup)
    grid = {"chunk_bytes": [MiB, 3 * MiB], "host_threads": [1, 3], "num_buffers": [2, 5]}
    tiny, before = BenchSizes.choose(True, 0.02), interop.config.as_dict()
    snapshots: list[dict] = []
    (done,) = sweep.sweep(tiny, grid, [row], on_point=snapshots.append)["rows"]
    calls = 1 + max(2, tiny.repeats - 2)  # the first (checked) call, then the timed ones
    for i, point in enumerate(done["points"]):
        settings = {k: point[k] for k in sweep.SETTINGS}
        assert seen[i * calls : (i + 1) * calls] == [settings] * calls
    assert interop.config.as_dict() == before
    assert [len(s["rows"][0]["points"]) for s in snapshots] == [1, 2, 3, 4, 5, 6, 7, 8, 8]
    (cut,) = sweep.sweep(tiny, grid, [row], max_seconds=1e-9)["rows"]
    assert (cut["points"], cut["points_not_run"]) == ([], 8)
    with pytest.raises(ValueError, match="at least one value of chunk_bytes"):
        sweep.sweep(tiny, grid | {"chunk_bytes": []}, [row])


def _sweep_of(points: dict[str, dict[tuple[int, int, int], float]]) -> dict:
    """Sweep results whose rows have these (chunk MiB, threads, buffers) -> GB/s points."""
    rows = []
    for name, got in points.items():
        settings = [dict(zip(sweep.SETTINGS, (c * MiB, t, b), strict=True)) for c, t, b in got]
        measured = [
            p | {"gbps": g, "ratio": {"value": 1.0}}
            for p, g in zip(settings, got.values(), strict=True)
        ]
        rows.append({"name": name, "status": "ok", "reference": "r", "points": measured})
    return {"rows": rows}


def test_the_suggested_defaults_are_the_cheapest_point_near_the_best_of_both_directions():
    d2h = {(8, 4, 2): 40.0, (16, 4, 4): 50.0, (32, 8, 4): 51.0, (64, 16, 6): 52.0, (8, 2, 4): 30.0}
    h2d = {(8, 4, 2): 45.0, (16, 4, 4): 44.0, (32, 8, 4): 46.0, (64, 16, 6): 46.0, (8, 2, 4): 46.0}
    both = _sweep_of({"d2h_prealloc": d2h, "h2d_pageable": h2d})
    # scores (the worse of each row's fraction of its best): 0.77, 0.957, 0.981, 1.0, 0.58;
    # within 5 %: 16/4/4, 32/8/4 and 64/16/6, of which 16 MiB x 4 is the smallest ring
    got = sweep.suggest_defaults(both)
    assert got["settings"] == {"chunk_bytes": 16 * MiB, "host_threads": 4, "num_buffers": 4}
    assert got["score"] == pytest.approx(min(50 / 52, 44 / 46))
    assert got["rows"]["h2d_pageable"] == {"gbps": 44.0, "best_gbps": 46.0}
    tight = sweep.suggest_defaults(both, tolerance=0.02)
    assert tight["settings"] == {"chunk_bytes": 32 * MiB, "host_threads": 8, "num_buffers": 4}
    assert sweep.suggest_defaults(_sweep_of({"d2h_prealloc": d2h})) is None
    apart = _sweep_of({"d2h_prealloc": {(8, 4, 2): 1.0}, "h2d_pageable": {(16, 4, 2): 1.0}})
    assert sweep.suggest_defaults(apart) is None


def _ok(name: str, gbps: float, *ratios: Ratio, **fields: object) -> dict:
    return {
        "name": name,
        "what": name,
        "status": "ok",
        "gbps": gbps,
        "ratios": [r.record() for r in ratios],
    } | fields


def _ratio(row: dict, to: str) -> dict:
    (found,) = [r for r in row["ratios"] if r["to"] == to]
    return found


def test_pageable_transfers_are_judged_against_the_lower_of_the_link_and_the_ring():
    run_judge = RunJudge()
    ceilings = {"pinned->pageable ceiling GB/s": 30.0, "pageable->pinned ceiling GB/s": 80.0}
    assert run_judge(_ok("host_limit", 30.0, anchors=ceilings))["met"] is None  # a reference
    d2h = run_judge(_ok("d2h_prealloc", 28.0, anchors={"d2h_limit GB/s": 50.0}))
    assert (_ratio(d2h, D2H_BOUND)["value"], _ratio(d2h, D2H_BOUND)["target"]) == (
        28 / 30,
        ">= 0.9x",
    )
    assert d2h["met"] is True
    h2d = run_judge(_ok("h2d_pageable", 45.0, anchors={"h2d_limit GB/s": 55.0}))
    assert _ratio(h2d, H2D_BOUND)["value"] == 45 / 55  # the link is the lower here
    assert h2d["met"] is False  # and its memory target found no ratio: missed too
    fresh = Ratio.between("copy_to_host(x)", "throughput", "cupy.asnumpy(x)", 5.0, 1.0)
    slow = run_judge(
        _ok(
            "d2h_fresh",
            20.0,
            fresh,
            Ratio.between("copy_to_host(x)", "throughput", "t.cpu().numpy()", 5, 1),
        )
    )
    assert (_ratio(slow, PREALLOC)["value"], _ratio(slow, PREALLOC)["met"]) == (20 / 28, False)
    alone = RunJudge()(_ok("d2h_prealloc", 54.0, anchors={"d2h_limit GB/s": 55.0}))
    assert (_ratio(alone, D2H_BOUND)["value"], alone["met"]) == (None, False)  # no host_limit
    smoke = RunJudge()
    smoke(_ok("host_limit", 30.0, anchors=ceilings), False)
    quick = smoke(_ok("d2h_prealloc", 28.0, anchors={"d2h_limit GB/s": 50.0}), False)
    assert (_ratio(quick, D2H_BOUND)["met"], quick["met"]) == (None, None)  # carried, not judged


def test_a_target_no_ratio_matches_is_missed_and_a_reference_is_not_judged():
    renamed = Ratio.between("copy_to_host(out)", "throughput", "numpy.copyto", 2.0, 1.0)
    row = judge(_ok("host_copy", 1.0, renamed))
    assert row["met"] is False
    assert row["ratios"][-1] == {
        "of": "copy_to_host", "quantity": "throughput", "to": "numpy.copyto", "value": None,
        "target": ">= 1x", "met": False,
    }  # fmt: skip
    idle = Ratio.between("copy_to_host(t) 1 MiB", "throughput", "t.numpy().copy() 1 MiB", 1.1, 1)
    without_busy = judge(_ok("host_fresh", 1.0, idle))  # busy is judged too: missed without it
    assert (without_busy["ratios"][0]["met"], without_busy["met"]) == (True, False)
    assert judge(_ok("d2h_limit", 50.0))["met"] is None
    skipped = judge({"name": "host_copy", "what": "w", "status": "skipped", "reason": "r"})
    assert (skipped["met"], skipped["target"]) == (
        None,
        "copy_to_host: >= 1x the throughput of numpy.copyto",
    )


@pytest.mark.parametrize("path", KEPT, ids=[p.stem for p in KEPT])
def test_a_kept_run_is_read_by_every_reader(path, tmp_path):
    kept = json.loads(path.read_text())
    bench, swept = kept.get("bench", kept), kept.get("sweep")  # benchmarks/results/cpu: a bench
    report = lab.format_report(bench)
    for row in bench["rows"]:
        if row["status"] == "ok":
            (line,) = [line for line in report.splitlines() if line.startswith(row["name"] + " ")]
            assert line.split()[-1] == {True: "met", False: "MISSED", None: "reference"}[row["met"]]
    assert report.splitlines()[-1].startswith("summary: ")
    if swept is not None:
        assert swept["rows"][0]["name"] in sweep.format_sweep(swept)
    panels = sweep.plot_results([bench] + ([swept] if swept else []), tmp_path / "kept.png")
    assert "host_copy" in {p.row for p in panels}
    if "bench" in kept:
        assert keep.report(kept, path.stem).startswith(f"## {kept['device']}, {kept['date'][:10]}")


@pytest.mark.parametrize("path", [p for p in KEPT if "sweep" in json.loads(p.read_text())])
def test_a_kept_plot_reads_on_the_page_and_no_legend_hides_data(path, tmp_path, monkeypatch):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.text import Text

    figs, save = [], Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda f, *a, **k: save(figs.append(f) or f, *a, **k))
    kept = json.loads(path.read_text())
    sweep.plot_results([kept["bench"], kept["sweep"]], tmp_path / "kept.png")
    (fig,) = figs
    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # lays the figure out as it was saved
    texts = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text()]
    assert min(texts) / 72 * 688 / fig.get_figwidth() >= 9.0  # px, the docs' column at 1280 px
    r = canvas.get_renderer()
    plots = [ax.get_tightbbox(r) for ax in fig.axes if ax.get_lines()]  # with their labels
    legends = [ax.get_legend().get_window_extent(r) for ax in fig.axes if ax.get_legend()]
    assert len(legends) == len(plots) >= 6
    assert [leg for leg in legends for plot in plots if leg.overlaps(plot)] == []
    assert all(fig.bbox.contains(b.x0, b.y0) and fig.bbox.contains(b.x1, b.y1) for b in legends)


HEAD = git_head()
needs_git = pytest.mark.skipif(
    HEAD is None, reason="keep asks git whether the commit is on a branch"
)


def _h100() -> dict:
    """The kept H100 run of 6f153b2, as if measured at this checkout's commit."""
    kept = json.loads(next(p for p in KEPT if p.name.endswith("6f153b27.json")).read_text())
    for results in (kept, kept["bench"], kept["sweep"]):
        results["commit"] = HEAD
    return kept


def _outdir(tmp_path: Path, bench: dict, swept: dict | None, name: str = "out") -> Path:
    out = tmp_path / name
    out.mkdir()
    (out / "bench.json").write_text(json.dumps(bench))
    if swept is not None:
        (out / "sweep.json").write_text(json.dumps(swept))
    (out / "steps.tsv").write_text("step\tstatus\texit\tseconds\ninfo\tpassed\t0\t3\n")
    suite = '<testsuite errors="{}" failures="1" skipped="2" tests="7"/>'
    (out / "junit.xml").write_text(suite.format(1))
    (out / "junit-gpu.xml").write_text(f"<testsuites>{suite.format(0)}</testsuites>")
    return out


@needs_git
def test_a_gpu_run_is_kept_whole_beside_the_runs_before_it(tmp_path):
    """A kept H100 run as gpu-check left it: kept again under a name of its own."""
    kept = _h100()
    into, name = tmp_path / "repo", f"{kept['date'][:10]}-nvidia-h100-80gb-hbm3"
    results = into / "benchmarks" / "results"
    results.mkdir(parents=True)
    (results / f"{name}.json").write_text('{"commit": "another run"}')
    path, png, text = keep.keep(_outdir(tmp_path, kept["bench"], kept["sweep"]), "HEAD", into)
    assert path == results / f"{name}-{kept['commit'][:8]}.json"
    assert png.name == f"throughput-{path.stem}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = json.loads(path.read_text())
    assert (again["bench"], again["sweep"], again["commit"]) == (
        kept["bench"],
        kept["sweep"],
        kept["commit"],
    )
    assert again["gpu_check"]["tests"] == {
        "tests": 14,
        "failures": 2,
        "errors": 1,
        "skipped": 4,
        "passed": 7,
    }
    assert "Tests: 7 passed, 2 failed, 1 errors, 4 skipped (of 14)." in text
    missed = "| `d2h_prealloc` | copy_to_host(x, out): 0.42x the throughput of d2h_limit |"
    assert f"{missed} >= 0.9x | **missed** |" in text
    assert "- `d2h_prealloc`: ring stages alone: DMA " in text  # where the time went
    assert "Suggested defaults: chunk_bytes 32 MiB" in text
    assert (
        keep.keep(_outdir(tmp_path, kept["bench"], kept["sweep"], "same"), "HEAD", into)[0] == path
    )


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"partial": True}, "is partial"),
        ({"quick": True}, "--quick smoke run"),
        ({"device": "no CUDA device"}, "without a CUDA device"),
        ({"commit_dirty": True}, "uncommitted changes"),
        ({"commit": "unknown"}, "INTEROP_COMMIT"),
        ({"commit": "0" * 40}, "is not a commit on HEAD"),
        ({"sweep_device": "NVIDIA H200"}, "differ in device"),
    ],
)
@needs_git
def test_results_that_cannot_be_kept_are_refused_with_nothing_written(tmp_path, change, why):
    kept = _h100()
    bench, swept = kept["bench"], kept["sweep"]
    swept["device"] = change.pop("sweep_device", swept["device"])
    swept["commit"] = change.get("commit", swept["commit"])  # one run: the same commit
    into = tmp_path / "repo"
    into.mkdir()
    with pytest.raises(keep.NotKept, match=why):
        keep.keep(_outdir(tmp_path, bench | change, swept), "HEAD", into)
    assert list(into.iterdir()) == []
    assert keep.main([str(tmp_path / "out"), "--branch", "HEAD", "--into", str(into)]) == 1
    assert list(into.iterdir()) == []
