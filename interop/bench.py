"""``python -m interop bench``: the measurements of SPEC §5.

Every figure is reported beside an anchor measured in the same run, as a ratio,
so results hold on a noisy machine. GPU rows run only where CuPy and PyTorch see
a CUDA device; the host rows run anywhere.
"""

from __future__ import annotations

import datetime
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from . import _backends
from .config import config
from .errors import BackendUnavailableError, NoDeviceError

__all__ = ["run_bench"]

GB = 1e9
MiB = 1 << 20


def _median_seconds(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _per_call_us(fn: Callable[[], Any], calls: int, repeats: int) -> float:
    def loop() -> None:
        for _ in range(calls):
            fn()

    return _median_seconds(loop, repeats) / calls * 1e6


def _row(name: str, what: str, target: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "what": what, "target": target, **fields}


def _skipped(name: str, what: str, target: str, reason: str) -> dict[str, Any]:
    return _row(name, what, target, skipped=reason, met=None)


# ----------------------------------------------------------------- host rows


def _per_call_row(
    name: str,
    what: str,
    ours: Callable[[], Any],
    anchor_name: str,
    anchor: Callable[[], Any],
    calls: int,
    repeats: int,
) -> dict[str, Any]:
    """A per-call latency row: ours against a same-run anchor, target <= 2x."""
    ours_us = _per_call_us(ours, calls, repeats)
    anchor_us = _per_call_us(anchor, calls, repeats)
    ratio = ours_us / anchor_us
    return _row(
        name,
        what,
        f"<= 2 x {anchor_name}",
        us=ours_us,
        anchors={f"{anchor_name}_us": anchor_us},
        ratios={f"vs_{anchor_name}": ratio},
        met=ratio <= 2.0,
    )


def _to_numpy_us(calls: int, repeats: int) -> dict[str, Any]:
    from .exchange import to_numpy

    t = _backends.torch().ones(16)
    return _per_call_row(
        "to_numpy_us",
        "interop.to_numpy(small CPU tensor) per call",
        lambda: to_numpy(t),
        "numpy.from_dlpack",
        lambda: np.from_dlpack(t),
        calls,
        repeats,
    )


def _to_torch_us(calls: int, repeats: int) -> dict[str, Any]:
    from .exchange import to_torch

    th = _backends.torch()
    a = np.ones(16)
    return _per_call_row(
        "to_torch_us",
        "interop.to_torch(small NumPy array) per call",
        lambda: to_torch(a),
        "torch.from_dlpack",
        lambda: th.from_dlpack(a),
        calls,
        repeats,
    )


def _host_copy(nbytes: int, repeats: int) -> dict[str, Any]:
    from .transfer import copy_to_host

    th = _backends.torch()
    t = th.ones(nbytes // 4)
    out = np.zeros(nbytes // 4, np.float32)  # touched
    src = t.numpy()
    ours = _median_seconds(lambda: copy_to_host(t, out), repeats)
    anchor = _median_seconds(lambda: np.copyto(out, src), repeats)
    ratio = anchor / ours
    return _row(
        "host_copy",
        f"copy_to_host(cpu_tensor, out), {nbytes / MiB:.0f} MiB",
        ">= 1.0 x numpy.copyto",
        gbps=nbytes / ours / GB,
        anchors={"numpy.copyto_gbps": nbytes / anchor / GB},
        ratios={"vs_numpy.copyto": ratio},
        met=ratio >= 1.0,
    )


_RSS_CHILD = """
import sys, time, torch, interop
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
n, path = int(sys.argv[1]), sys.argv[2]
t = torch.ones(n // 4)  # touched
interop.save_npy(t[:1024], path)  # warm: imports and first-use allocations done
open("/proc/self/clear_refs", "w").write("5")  # reset the peak RSS (VmHWM)
base = status("VmRSS:")
start = time.perf_counter()
interop.save_npy(t, path)
seconds = time.perf_counter() - start
print(status("VmHWM:") - base, seconds)
"""


def _save_npy_rss(nbytes: int) -> dict[str, Any]:
    bound = 2 * config.num_buffers * config.chunk_bytes
    what = f"peak extra RSS while saving a {nbytes / MiB:.0f} MiB CPU tensor"
    target = "<= 2 x num_buffers x chunk_bytes"
    if not Path("/proc/self/clear_refs").exists():
        return _skipped("save_npy_rss", what, target, "needs Linux /proc to measure peak RSS")
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [sys.executable, "-c", _RSS_CHILD, str(nbytes), os.path.join(tmp, "rss.npy")],
            capture_output=True,
            text=True,
            check=False,
        )
    if proc.returncode != 0:
        return _skipped("save_npy_rss", what, target, f"child failed: {proc.stderr[-300:]}")
    extra, seconds = proc.stdout.split()
    extra_bytes = int(extra)
    return _row(
        "save_npy_rss",
        what,
        target,
        extra_rss_bytes=extra_bytes,
        bound_bytes=bound,
        gbps=nbytes / float(seconds) / GB,
        ratios={"extra_rss_vs_bound": extra_bytes / bound},
        met=extra_bytes <= bound,
    )


# ----------------------------------------------------------------- GPU rows


class _Gpu:
    """Device buffers and anchors shared by the GPU rows."""

    def __init__(self, nbytes: int, repeats: int) -> None:
        self.cp = _backends.require_cupy_device()
        self.th = _backends.require_torch_cuda()
        self.nbytes = nbytes
        self.repeats = repeats
        self.x = self.cp.ones(nbytes // 4, dtype=self.cp.float32)
        self.t = self.th.ones(nbytes // 4, device="cuda")
        self.pinned = np.frombuffer(
            self.cp.cuda.alloc_pinned_memory(nbytes), np.float32, nbytes // 4
        )
        self.out = np.zeros(nbytes // 4, np.float32)  # pageable, touched
        self.cp.cuda.Device().synchronize()

    def time(self, fn: Callable[[], Any]) -> float:
        def synced() -> None:
            fn()
            self.cp.cuda.Device().synchronize()

        return _median_seconds(synced, self.repeats)

    def gbps(self, fn: Callable[[], Any]) -> float:
        return self.nbytes / self.time(fn) / GB

    def memcpy(self, dst: int, src: int, kind: int) -> None:
        stream = self.cp.cuda.get_current_stream()
        self.cp.cuda.runtime.memcpyAsync(dst, src, self.nbytes, kind, stream.ptr)

    def close(self) -> None:
        del self.x, self.t, self.pinned, self.out
        gc.collect()
        self.cp.get_default_memory_pool().free_all_blocks()
        self.cp.get_default_pinned_memory_pool().free_all_blocks()
        self.th.cuda.empty_cache()


def _gpu_rows(nbytes: int, repeats: int, exchange_calls: int) -> list[dict[str, Any]]:
    from .exchange import to_cupy, to_torch
    from .npy import save_npy
    from .transfer import copy_to_host
    from .upload import copy_to_device

    g = _Gpu(nbytes, repeats)
    cp, th = g.cp, g.th
    rows = []
    size = f"{nbytes / 2**30:.2f} GiB float32"
    try:
        pinned_ptr = g.pinned.ctypes.data
        d2h_limit = g.gbps(lambda: g.memcpy(pinned_ptr, g.x.data.ptr, 2))
        rows.append(
            _row(
                "d2h_limit",
                f"one cudaMemcpyAsync into pinned memory, {size}",
                "link limit",
                gbps=d2h_limit,
                met=None,
            )
        )

        prealloc = g.gbps(lambda: copy_to_host(g.x, g.out))
        asnumpy_out = g.gbps(lambda: cp.asnumpy(g.x, out=g.out))
        nonblocking = g.gbps(lambda: g.t.to("cpu", non_blocking=True))
        rows.append(
            _row(
                "d2h_prealloc",
                f"copy_to_host(x, out), out pageable and touched, {size}",
                ">= 0.90 x d2h_limit",
                gbps=prealloc,
                anchors={
                    "cupy.asnumpy(out=)_gbps": asnumpy_out,
                    "t.to(cpu, non_blocking)+sync_gbps": nonblocking,
                },
                ratios={"vs_d2h_limit": prealloc / d2h_limit},
                met=prealloc >= 0.90 * d2h_limit,
            )
        )

        fresh = g.gbps(lambda: copy_to_host(g.x))
        asnumpy = g.gbps(lambda: cp.asnumpy(g.x))
        tcpu = g.gbps(lambda: g.t.cpu().numpy())
        rows.append(
            _row(
                "d2h_fresh",
                f"copy_to_host(x) allocating out, {size}",
                ">= 2 x cupy.asnumpy(x) and >= 2 x t.cpu().numpy()",
                gbps=fresh,
                anchors={"cupy.asnumpy_gbps": asnumpy, "t.cpu().numpy()_gbps": tcpu},
                ratios={
                    "vs_cupy.asnumpy": fresh / asnumpy,
                    "vs_t.cpu": fresh / tcpu,
                    "vs_d2h_limit": fresh / d2h_limit,
                },
                met=fresh >= 2 * asnumpy and fresh >= 2 * tcpu,
            )
        )

        side = int((nbytes // 4) ** 0.5)
        square = g.x[: side * side].reshape(side, side).T
        out_t = np.zeros(square.shape, np.float32)
        pool = cp.get_default_memory_pool()
        pool.free_all_blocks()
        before = pool.total_bytes()
        strided = square.size * 4 / g.time(lambda: copy_to_host(square, out_t)) / GB
        extra = pool.total_bytes() - before
        ring = config.num_buffers * config.chunk_bytes
        rows.append(
            _row(
                "d2h_strided",
                f"copy_to_host(x.T, out), {side}x{side} float32",
                ">= 0.80 x d2h_prealloc; extra device memory <= ring",
                gbps=strided,
                ratios={"vs_d2h_prealloc": strided / prealloc, "vs_d2h_limit": strided / d2h_limit},
                extra_device_bytes=extra,
                ring_bytes=ring,
                met=strided >= 0.80 * prealloc and extra <= ring,
            )
        )

        h2d_limit = g.gbps(lambda: g.memcpy(g.x.data.ptr, pinned_ptr, 1))
        rows.append(
            _row(
                "h2d_limit",
                f"one cudaMemcpyAsync from pinned memory, {size}",
                "link limit",
                gbps=h2d_limit,
                met=None,
            )
        )
        host = np.ones(nbytes // 4, np.float32)
        h2d = g.gbps(lambda: copy_to_device(host, g.x))
        asarray = g.gbps(lambda: cp.asarray(host))
        rows.append(
            _row(
                "h2d_pageable",
                f"copy_to_device(pageable host, out), {size}",
                ">= 0.90 x h2d_limit; extra host memory <= ring",
                gbps=h2d,
                anchors={"cupy.asarray_gbps": asarray},
                ratios={"vs_h2d_limit": h2d / h2d_limit, "vs_cupy.asarray": h2d / asarray},
                pinned_ring_bytes=config.num_buffers * config.chunk_bytes,
                met=h2d >= 0.90 * h2d_limit,
            )
        )

        small_t = th.ones(16, device="cuda")
        small_c = cp.ones(16, dtype=cp.float32)
        ours_c = _per_call_us(lambda: to_cupy(small_t), exchange_calls, repeats)
        anchor_c = _per_call_us(lambda: cp.from_dlpack(small_t), exchange_calls, repeats)
        ours_t = _per_call_us(lambda: to_torch(small_c), exchange_calls, repeats)
        anchor_t = _per_call_us(lambda: th.from_dlpack(small_c), exchange_calls, repeats)
        rows.append(
            _row(
                "exchange_us",
                "to_cupy(t) / to_torch(c) per call, 16 floats",
                "<= 1.5 x cupy.from_dlpack / torch.from_dlpack",
                us={"to_cupy": ours_c, "to_torch": ours_t},
                anchors={"cupy.from_dlpack_us": anchor_c, "torch.from_dlpack_us": anchor_t},
                ratios={"to_cupy": ours_c / anchor_c, "to_torch": ours_t / anchor_t},
                met=ours_c <= 1.5 * anchor_c and ours_t <= 1.5 * anchor_t,
            )
        )

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "bench.npy"
            plain = Path(tmp) / "plain.bin"

            def write_plain() -> None:
                with open(plain, "wb") as f:
                    f.write(g.out.view(np.uint8).data)

            file_rate = nbytes / _median_seconds(write_plain, repeats) / GB
            save = g.gbps(lambda: save_npy(g.x, path))
            limit = min(d2h_limit, file_rate)
            rows.append(
                _row(
                    "save_npy",
                    f"save_npy(device array, path), {size}",
                    ">= 0.80 x min(d2h_limit, sequential file-write rate)",
                    gbps=save,
                    anchors={"file_write_gbps": file_rate, "d2h_limit_gbps": d2h_limit},
                    ratios={"vs_limit": save / limit},
                    met=save >= 0.80 * limit,
                )
            )
    finally:
        g.close()
    return rows


# ----------------------------------------------------------------- driver


def _device_name() -> str:
    try:
        cp = _backends.require_cupy_device()
    except (BackendUnavailableError, NoDeviceError):
        return "no CUDA device"
    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def _git_commit() -> str:
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parent,
            check=False,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return proc.stdout.strip() if proc.returncode == 0 else "unknown"


def _fmt(row: dict[str, Any]) -> str:
    if "skipped" in row:
        return f"{row['name']:<14} skipped: {row['skipped']}"
    if "gbps" in row:
        value = f"{row['gbps']:8.2f} GB/s"
    elif isinstance(row.get("us"), dict):
        value = ", ".join(f"{k} {v:.2f} us" for k, v in row["us"].items())
    elif "us" in row:
        value = f"{row['us']:8.2f} us"
    else:
        value = f"{row.get('extra_rss_bytes', 0) / MiB:8.1f} MiB"
    ratios = ", ".join(f"{k} {v:.2f}" for k, v in row.get("ratios", {}).items())
    met = {True: "met", False: "MISSED", None: "-"}[row.get("met")]
    return f"{row['name']:<14} {value:<22} {ratios:<48} {met:<6} target {row['target']}"


_GPU_ROWS = (
    "d2h_limit",
    "d2h_prealloc",
    "d2h_fresh",
    "d2h_strided",
    "h2d_limit",
    "h2d_pageable",
    "exchange_us",
    "save_npy",
)


def run_bench(quick: bool = False, json_path: str | None = None) -> int:
    """Run the benchmark rows, print a table, optionally write JSON.

    Parameters
    ----------
    quick : bool
        Small sizes and few repeats (a smoke run, not a measurement).
    json_path : str, optional
        Where to write the results as JSON.

    Returns
    -------
    int
        The exit status (0; a missed target is reported, not an error).
    """
    from .info import collect_info

    repeats = 2 if quick else 5
    calls = 2000 if quick else 20000
    host_bytes = 32 * MiB if quick else 256 * MiB
    rss_bytes = 64 * MiB if quick else 768 * MiB
    gpu_bytes = 256 * MiB if quick else 1 << 30

    rows: list[dict[str, Any]] = []
    try:
        _backends.torch()
        rows += [
            _to_numpy_us(calls, repeats),
            _to_torch_us(calls, repeats),
            _host_copy(host_bytes, repeats),
            _save_npy_rss(rss_bytes),
        ]
    except BackendUnavailableError as exc:
        rows.append(_skipped("host rows", "host rows need PyTorch", "-", str(exc)))
    gc.collect()
    try:
        rows += _gpu_rows(gpu_bytes, repeats, calls // 4)
    except (BackendUnavailableError, NoDeviceError) as exc:
        reason = f"{type(exc).__name__}: {str(exc).split(';')[0]}"
        for name in _GPU_ROWS:
            rows.append(_skipped(name, "GPU row (SPEC 5)", "see docs/benchmarks.md", reason))

    result: dict[str, Any] = {
        "device": _device_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": _git_commit(),
        "quick": quick,
        "config": config.as_dict(),
        "versions": collect_info(),
        "rows": rows,
    }
    print(f"interop bench on {result['device']} ({result['date']}, commit {result['commit'][:12]})")
    print(f"config {result['config']}{' (quick: not a measurement)' if quick else ''}")
    for row in rows:
        print(_fmt(row))
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"wrote {json_path}")
    return 0
