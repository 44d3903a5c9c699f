"""python -m interop bench: runs here (host rows), schema of its JSON. No timing asserts."""

from __future__ import annotations

import json
import subprocess
import sys

GPU_ROWS = {
    "d2h_limit",
    "d2h_prealloc",
    "d2h_fresh",
    "d2h_strided",
    "h2d_limit",
    "h2d_pageable",
    "exchange_us",
    "save_npy",
}
HOST_ROWS = {"to_numpy_us", "to_torch_us", "host_copy", "save_npy_rss"}


def test_quick_bench_writes_the_schema(tmp_path):
    path = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "interop", "bench", "--quick", "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(path.read_text())
    assert set(data) >= {"device", "date", "commit", "config", "versions", "rows", "quick"}
    assert data["quick"] is True
    assert set(data["config"]) == {"chunk_bytes", "num_buffers", "host_threads"}
    assert all(isinstance(v, int) and v > 0 for v in data["config"].values())
    assert data["versions"]["numpy"]
    rows = {row["name"]: row for row in data["rows"]}
    assert set(rows) == GPU_ROWS | HOST_ROWS
    for name in HOST_ROWS:
        row = rows[name]
        assert "skipped" not in row, row
        assert row["target"]
        assert row["ratios"]
        assert all(v >= 0 for v in row["ratios"].values())  # an extra RSS of 0 is possible
        assert isinstance(row["met"], bool)
    assert rows["to_numpy_us"]["us"] > 0
    assert rows["to_torch_us"]["ratios"]["vs_torch.from_dlpack"] > 0
    assert rows["host_copy"]["gbps"] > 0
    assert rows["save_npy_rss"]["bound_bytes"] > 0
    if data["device"] == "no CUDA device":
        for name in GPU_ROWS:
            assert (
                "no CUDA device" in rows[name]["skipped"]
                or "NoDeviceError" in rows[name]["skipped"]
            )
            assert rows[name]["met"] is None
    for name in HOST_ROWS:
        assert name in proc.stdout
