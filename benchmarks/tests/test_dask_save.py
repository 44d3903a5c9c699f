"""The lab's dask rows (``python -m benchmarks run``): the cluster row on the shared
real runs, the threaded variant (the CuPy row's body) on NumPy blocks, the
helpers the workers run, and "not available" without dask or distributed.

No timing asserts: whether a ratio meets its target is a result of the
benchmark, never a test outcome.
"""

from __future__ import annotations

import importlib.util
import json
import re
import statistics
from pathlib import Path

import numpy as np
import pytest

from benchmarks import dask_save
from benchmarks.dask_save import reset_peak_rss
from benchmarks.report import format_report
from benchmarks.targets import judge
from interop.bench import collect_results
from interop.bench.measure import BenchSizes, WrongResultError
from interop.bench.report import format_bytes
from interop.bench.rows import BenchContext, RowSpec
from interop.info import install_command
from tests.helpers import run_python

from .runs import full_host_run, quick_bench

#: Tests that run dask (not installed on every machine: the GPU runner has none).
needs_dask = pytest.mark.skipif(
    not all(importlib.util.find_spec(name) for name in ("dask", "distributed")),
    reason="needs the 'dask' extra (dask and distributed)",
)

OURS = "interop.dask.save_npy"
STACK = "da.to_npy_stack"
MEMMAP = "da.store(open_memmap)"
CLUSTER_BOUND = "the bound one block + 2 x num_buffers x chunk_bytes"


def _row(data: dict, name: str) -> dict:
    (row,) = [row for row in data["rows"] if row["name"] == name]
    return row


def _ring(config: dict) -> int:
    return config["num_buffers"] * max(config["chunk_bytes"], 64 << 10)


def _brief(ratio: dict) -> tuple:
    return ratio["of"], ratio["quantity"], ratio["to"], ratio["target"]


# ------------------------------------------------------------------ the cluster row, real runs


@needs_dask
def test_cluster_row_reports_throughput_and_peak_rss_per_worker():
    proc, data, _ = quick_bench()
    row = _row(data, "dask_save_npy")
    assert row["status"] == "ok", row
    nbytes = data["sizes"]["dask_bytes"]  # whole 4 KiB rows: nothing rounded away
    assert row["size"].startswith(f"{nbytes / (1 << 20):.1f} MiB float32 in 16 blocks")
    assert set(row["samples"]) == {OURS, STACK, MEMMAP}
    gbps = {}
    for label, sample in row["samples"].items():
        assert sample["result_checked"] is True, label
        assert sample["bytes"] == nbytes
        assert len(sample["seconds"]) == data["sizes"]["repeats"]  # the untimed call not counted
        gbps[label] = nbytes / statistics.median(sample["seconds"]) / 1e9
    assert row["gbps"] == pytest.approx(gbps[OURS])
    assert row["anchors"] == pytest.approx(
        {f"{STACK} GB/s": gbps[STACK], f"{MEMMAP} GB/s": gbps[MEMMAP]}
    )
    assert [_brief(r) for r in row["ratios"]] == [
        (OURS, "throughput", MEMMAP, ">= 1x"),
        (OURS, "throughput", STACK, ">= 1x"),
        (f"peak extra RSS per worker of {OURS}", "memory", CLUSTER_BOUND, "<= 1x"),
        (f"peak extra RSS per worker of {STACK}", "memory", CLUSTER_BOUND, None),
        (f"peak extra RSS per worker of {MEMMAP}", "memory", CLUSTER_BOUND, None),
    ]
    memory = row["memory"]
    assert memory["block_bytes"] == nbytes // 16
    assert memory["ring_bytes"] == _ring(data["config"])
    assert memory["bound_bytes"] == memory["block_bytes"] + 2 * memory["ring_bytes"]
    extra = {
        OURS: memory["extra_host_rss_bytes"],
        STACK: memory[f"{STACK} extra_host_rss_bytes"],
        MEMMAP: memory[f"{MEMMAP} extra_host_rss_bytes"],
    }
    for label, value in extra.items():
        assert row["samples"][label].get("extra_host_rss_bytes") == value
        if reset_peak_rss() is not None:
            assert isinstance(value, int)
            assert value >= 0
    throughput, memory_ratios = row["ratios"][:2], row["ratios"][2:]
    assert throughput[0]["value"] == pytest.approx(gbps[OURS] / gbps[MEMMAP])
    assert throughput[1]["value"] == pytest.approx(gbps[OURS] / gbps[STACK])
    for ratio, label in zip(memory_ratios, (OURS, STACK, MEMMAP), strict=True):
        if extra[label] is not None:
            assert ratio["value"] == pytest.approx(extra[label] / memory["bound_bytes"])
    assert row["cluster"] == {"workers": 2, "threads_per_worker": 1, "processes": True}
    assert row["met"] is None  # a smoke run
    assert all(r["met"] is None for r in row["ratios"])
    flat = " ".join(proc.stdout.split())
    assert re.search(r"^dask_save_npy +\d+\.\d\d GB/s +not judged$", proc.stdout, re.MULTILINE)
    assert f"peak extra RSS per worker of {OURS}: " in flat
    assert f"dask_save_npy {format_bytes(nbytes)}" in flat  # the sizes line


@needs_dask
def test_cluster_row_is_judged_in_a_full_run():
    row = _row(full_host_run(), "dask_save_npy")
    assert row["status"] == "ok", row
    targeted = [r for r in row["ratios"] if r["target"]]
    assert len(targeted) == 3
    assert row["met"] == all(r["met"] for r in targeted)
    for r in row["ratios"]:
        if r["target"] is None:
            assert r["met"] is None
            continue
        op, limit = r["target"].split()
        bound = float(limit.rstrip("x"))
        assert r["met"] == (r["value"] <= bound if op == "<=" else r["value"] >= bound), r


# ------------------------------------------------------------------ not available


@pytest.mark.parametrize("blocked", ["dask", pytest.param("distributed", marks=needs_dask)])
def test_rows_without_dask_or_distributed_are_not_available(blocked):
    """As if the library were not installed: the import is blocked in a fresh process."""
    proc = run_python(
        f"""
        import json, sys
        sys.modules[{blocked!r}] = None  # as if not installed
        from pathlib import Path
        from benchmarks.lab import LAB_ROWS
        from benchmarks.targets import judge
        from interop.bench.rows import BenchContext
        from interop.bench.measure import BenchSizes
        from interop.bench.run import run_row

        ctx = BenchContext(BenchSizes.choose(True, 0.02), Path("."))
        specs = {{spec.name: spec for spec in LAB_ROWS}}
        rows = [
            judge(run_row(specs[name], ctx, "no CUDA device: none here", None))
            for name in ("dask_save_npy", "dask_save_npy_cupy")
        ]
        print(json.dumps(rows))
        """
    )
    assert proc.returncode == 0, proc.stderr
    cluster, cupy = json.loads(proc.stdout.strip().splitlines()[-1])
    assert cluster["status"] == "not available"
    assert cluster["met"] is None
    assert "gbps" not in cluster
    assert f"install it with: {install_command('dask')}" in cluster["reason"]
    if blocked == "dask":
        assert cluster["reason"].startswith("interop.dask needs dask")
        assert cupy["status"] == "not available"
        assert cupy["reason"] == cluster["reason"]
    else:
        assert cluster["reason"].startswith("distributed cannot be imported")
        assert cupy["status"] == "skipped"  # the threaded scheduler needs no distributed
        assert cupy["reason"] == "no CUDA device: none here"


def test_a_row_lacking_an_optional_library_is_not_run():
    def run(ctx):
        raise AssertionError("a row that is not available must not run")

    spec = RowSpec("lacking", "a row", False, run, unavailable=lambda: "needs X")
    data = collect_results(BenchSizes.choose(True, 0.02), (spec,), judge=judge)
    (row,) = data["rows"]
    assert (row["status"], row["reason"], row["met"]) == ("not available", "needs X", None)
    assert "not available (1 row: lacking): needs X" in format_report(data)


# ------------------------------------------------------------------ the threaded variant


@pytest.fixture
def ctx(tmp_path):
    return BenchContext(BenchSizes.choose(True, 0.02), tmp_path)


@needs_dask
def test_threaded_variant_on_numpy_blocks(ctx, tmp_path):
    """The CuPy row's body, run with NumPy blocks and numpy.asarray as the recipe's copy."""
    x = np.random.default_rng(1).random((64, 1024), dtype=np.float32)
    recipe = "numpy.asarray+numpy.save per block"
    fields = dask_save.threaded_saves(ctx, x, x.copy(), np.asarray, recipe)
    assert fields["size"] == "0.2 MiB float32 in 16 blocks of 0.02 MiB"
    bound = "the bound 2 threads x 2 x num_buffers x chunk_bytes"
    judged = judge(
        {"name": "dask_save_npy_cupy", "status": "ok"}
        | fields
        | {"ratios": [r.record() for r in fields["ratios"]]}
    )
    assert [_brief(r) for r in judged["ratios"]] == [
        (OURS, "throughput", recipe, ">= 1x"),
        (f"peak extra RSS of the process of {OURS}", "memory", bound, "<= 1x"),
        (f"peak extra RSS of the process of {recipe}", "memory", bound, None),
    ]
    memory = fields["memory"]
    assert memory["block_bytes"] == 4 * 1024 * 4
    assert memory["bound_bytes"] == 2 * 2 * memory["ring_bytes"]
    assert memory["extra_device_bytes"] is None  # no device memory measured here
    for label in (OURS, recipe):
        sample = fields["samples"][label]
        assert sample["result_checked"] is True
        assert sample["bytes"] == x.nbytes
        assert len(sample["seconds"]) == ctx.sizes.repeats
    assert fields["scheduler"] == {"name": "threads", "num_workers": 2}
    assert list(tmp_path.iterdir()) == []  # every output removed, the row's directory too


@needs_dask
def test_threaded_variant_refuses_a_wrong_copy(ctx):
    x = np.arange(32 * 1024, dtype=np.float32).reshape(32, 1024)
    with pytest.raises(WrongResultError, match=r"x \+ 1 per block wrote block 0"):
        dask_save.threaded_saves(ctx, x, x, lambda b: np.asarray(b) + 1, "x + 1 per block")


# ------------------------------------------------------------------ helpers


def test_outputs_are_removed_between_calls(tmp_path):
    calls = []

    def write(path: Path) -> None:
        assert not path.exists()  # the previous call's output is gone
        path.mkdir()
        (path / "0.npy").write_bytes(b"x")
        calls.append(path.name)

    class Probe:
        def __init__(self) -> None:
            self.extra_bytes = 10 * len(calls)

        def __enter__(self) -> Probe:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    saves = [
        dask_save._Save("a", "a", write, lambda p: None),
        dask_save._Save("b", "b", write, lambda p: None),
    ]
    got = dask_save._alternate(saves, tmp_path, 100, 2, Probe)
    assert calls == ["a", "b"] * 3  # alternated: one untimed round, two timed
    assert list(tmp_path.iterdir()) == []
    assert [len(m.seconds) for m in got.values()] == [2, 2]
    assert got["a"].extra_host_bytes == 40  # the largest over its calls (0, 20, 40)
    assert got["b"].extra_host_bytes == 50


def test_block_checks_find_each_block_in_the_outputs(tmp_path):
    a = np.arange(6 * 5, dtype=np.float32).reshape(6, 5)
    np.save(tmp_path / "a.npy", a)
    (tmp_path / "stack").mkdir()
    np.save(tmp_path / "stack" / "1.npy", a[3:6])
    info = {0: {"array-location": [(3, 6), (0, 5)], "chunk-location": (1, 0)}}
    for check, where in [
        (dask_save._block_in_file, tmp_path / "a.npy"),
        (dask_save._block_in_stack, tmp_path / "stack"),
    ]:
        assert check(a[3:6], str(where), block_info=info).tolist() == [[True]]
        assert check(a[3:6] + 1, str(where), block_info=info).tolist() == [[False]]


@needs_dask
def test_memmap_target_writes_through_a_mapping_per_block(tmp_path):
    import dask
    import dask.array as da

    a = np.random.default_rng(2).random((40, 7))
    path = tmp_path / "m.npy"
    made = np.lib.format.open_memmap(path, mode="w+", dtype=a.dtype, shape=a.shape)
    del made
    with dask.config.set(scheduler="threads"):
        da.store(da.from_array(a, chunks=(8, 4)), dask_save.MemmapOnWorker(str(path)), lock=False)
    np.testing.assert_array_equal(np.load(path), a)


@needs_dask
def test_the_cluster_starts_while_another_holds_the_dashboard_port():
    """Port 8787 taken (another cluster on the machine): no warning, which is an error here."""
    import socket

    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 8787))
        holder.listen()
    except OSError:  # already held by someone else: the same situation
        pass
    try:
        with dask_save.local_cluster({}) as cluster:
            assert len(cluster.workers) == dask_save.WORKERS
            assert cluster.scheduler.http_server.port != 8787
    finally:
        holder.close()
