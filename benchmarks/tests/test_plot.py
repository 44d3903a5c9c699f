"""``python -m benchmarks plot``: a PNG drawn from real bench and sweep JSON."""

from __future__ import annotations

import json

import pytest

from benchmarks.plot import load_results, plot_results

from .runs import quick_bench, quick_sweep, run_lab

pytest.importorskip("matplotlib")  # in the test extra; the plot is optional for users

MiB = 1 << 20


@pytest.fixture
def cpu_results(tmp_path):
    """JSON from a real smoke bench run and a real sweep of the host row on this machine."""
    return tmp_path, quick_bench()[2], quick_sweep()[2]


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_plot_from_a_real_sweep_and_bench_run(cpu_results):
    tmp, bench_json, sweep_json = cpu_results
    png = tmp / "out" / "throughput.png"
    bench, sweep = load_results([bench_json, sweep_json])
    panels = plot_results([bench, sweep], png)
    width, height = _png_size(png)
    assert width > 600
    assert height > 300
    assert [(p.row, p.x) for p in panels] == [
        ("host_copy", "chunk_bytes"),
        ("host_copy", "host_threads"),
    ]
    row = sweep["rows"][0]
    by_chunk, by_threads = panels
    assert set(by_chunk.lines) == {"host_threads 1", "host_threads 2"}
    assert set(by_threads.lines) == {"chunk_bytes 1 MiB", "chunk_bytes 2 MiB", "chunk_bytes 4 MiB"}
    for p in row["points"]:
        line = by_chunk.lines[f"host_threads {p['host_threads']}"]
        assert (p["chunk_bytes"] / MiB, p["gbps"]) in line
        label = f"chunk_bytes {p['chunk_bytes'] // MiB} MiB"
        assert (p["host_threads"], p["gbps"]) in by_threads.lines[label]
    # the anchor measured with the sweep's points, as a horizontal line
    assert by_chunk.hlines == {"numpy.copyto": row["anchors"]["numpy.copyto GB/s"]}
    # the bench run's own figure, at the settings it ran with
    host_copy = next(r for r in bench["rows"] if r["name"] == "host_copy")
    marker = by_chunk.markers["bench run: host_copy at its settings"]
    assert marker == (bench["config"]["chunk_bytes"] / MiB, host_copy["gbps"])


def test_plot_from_a_bench_run_alone(cpu_results):
    tmp, bench_json, _ = cpu_results
    png = tmp / "bench-only.png"
    (bench,) = load_results([bench_json])
    panels = plot_results([bench], png)
    _png_size(png)
    host_copy = next(r for r in bench["rows"] if r["name"] == "host_copy")
    assert panels[0].lines == {}
    assert panels[0].hlines == {"numpy.copyto": host_copy["anchors"]["numpy.copyto GB/s"]}


def test_plot_command_line(cpu_results):
    tmp, bench_json, sweep_json = cpu_results
    png = tmp / "cli.png"
    proc = run_lab(tmp, "plot", str(png), str(bench_json), str(sweep_json))
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {png}" in proc.stdout
    assert "host_copy against chunk_bytes: 2 lines; horizontal lines: numpy.copyto" in proc.stdout
    _png_size(png)


def test_nothing_to_plot_is_a_clear_error(cpu_results, tmp_path):
    _, _, sweep_json = cpu_results
    sweep = json.loads(sweep_json.read_text())
    sweep["rows"] = [r for r in sweep["rows"] if r["name"] != "host_copy"]
    with pytest.raises(ValueError, match="expected results with a measured"):
        plot_results([sweep], tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()
    not_results = tmp_path / "other.json"
    not_results.write_text('{"a": 1}')
    proc = run_lab(tmp_path, "plot", str(tmp_path / "x.png"), str(not_results))
    assert proc.returncode == 2
    assert "expected a bench or sweep JSON file" in proc.stderr


def test_gpu_panels_draw_the_link_limit_and_the_anchors(cpu_results, tmp_path):
    """GPU rows cannot run here: their shape is taken from the CPU sweep, figures made up."""
    sweep = json.loads(cpu_results[2].read_text())
    host = sweep["rows"][0]
    points = [
        {**p, "num_buffers": nb, "gbps": 10.0 + nb + p["host_threads"]}
        for p in host["points"]
        for nb in (2, 4)
    ]
    sweep["rows"] = [
        {"name": "d2h_prealloc", "status": "ok", "points": points,
         "anchors": {"cupy.asnumpy(x) GB/s": 5.0, "t.cpu().numpy() GB/s": 4.0,
                     "d2h_limit GB/s": 25.0}},
        {"name": "h2d_pageable", "status": "ok", "points": points,
         "anchors": {"cupy.asarray(host) GB/s": 3.0, "h2d_limit GB/s": 24.0}},
    ]  # fmt: skip
    panels = plot_results([sweep], tmp_path / "gpu.png")
    _png_size(tmp_path / "gpu.png")
    d2h = [p for p in panels if p.row == "d2h_prealloc"]
    assert [p.x for p in d2h] == ["chunk_bytes", "host_threads", "num_buffers"]
    assert d2h[0].hlines == {"d2h_limit": 25.0, "cupy.asnumpy(x)": 5.0, "t.cpu().numpy()": 4.0}
    assert d2h[0].lines["host_threads 2"][0] == (1.0, 16.0)  # the best over num_buffers
    assert d2h[2].lines["chunk_bytes 1 MiB"] == [(2, 14.0), (4, 16.0)]  # best over threads
    h2d = [p for p in panels if p.row == "h2d_pageable"]
    assert h2d[0].hlines == {"h2d_limit": 24.0, "cupy.asarray(host)": 3.0}
