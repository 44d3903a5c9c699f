"""What does a call cost? ``python -m benchmarks.torch_op [--quick] [--json PATH]``"""

from __future__ import annotations

import cProfile
import gc
import pstats
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

import interop
from benchmarks import lab
from interop.bench.measure import Ratio, gpu_unavailable
from interop.bench.rows import BenchContext, RowSpec

HAND = "a hand-written torch.library.custom_op"
_OPS: dict[str, tuple[Any, Any]] = {}
_COPY = uuid.uuid4().hex[:8]  # operators are process-wide: a name of this module copy's own


def _make_ops(device: str) -> tuple[Any, Any]:
    """(the interop.torch_op, the hand-written custom_op) for ``device``."""
    import torch

    if device not in _OPS:
        tag = f"{device.replace(':', '_')}_{_COPY}"

        @interop.torch_op(f"interop_bench::interop_add_{tag}", like=0)
        def interop_add(x, y):
            return x + y

        @torch.library.custom_op(
            f"interop_bench::hand_add_{tag}",
            mutates_args=(),
            schema="(Tensor x, Tensor y) -> Tensor",
        )
        def hand_add(x, y):
            if x.is_cuda:
                import cupy

                return torch.from_dlpack(cupy.from_dlpack(x) + cupy.from_dlpack(y))
            return torch.from_dlpack(np.from_dlpack(x) + np.from_dlpack(y))

        hand_add.register_fake(lambda x, y: torch.empty_like(x))
        _OPS[device] = (interop_add, hand_add)
    return _OPS[device]


def _block(call: Callable[[], Any], n_calls: int, sync: Callable[[], None]) -> float:
    """Seconds per call over ``n_calls`` calls (queued work included)."""
    sync()
    start = time.perf_counter()
    for _ in range(n_calls):
        call()
    sync()
    return (time.perf_counter() - start) / n_calls


def measure(n_calls: int = 5000, *, repeats: int = 7, device: str = "cpu") -> dict[str, Any]:
    """Both operators' microseconds per call on ``device``, interleaved blocks."""
    import torch

    if n_calls < 1 or repeats < 1:
        raise ValueError(f"expected n_calls >= 1 and repeats >= 1 (got {n_calls}, {repeats})")
    ours, hand = _make_ops(device)
    x = torch.arange(16, dtype=torch.float32, device=device)
    y = torch.ones(16, dtype=torch.float32, device=device)
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    if not (torch.equal(ours(x, y), x + y) and torch.equal(hand(x, y), x + y)):
        raise AssertionError("the two operators disagree with x + y")
    for op in (ours, hand):  # warm up: kernels compiled, caches filled
        _block(lambda op=op: op(x, y), min(n_calls, 200), sync)
    samples: dict[str, list[float]] = {"interop.torch_op": [], "custom_op": []}
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            samples["interop.torch_op"].append(_block(lambda: ours(x, y), n_calls, sync) * 1e6)
            samples["custom_op"].append(_block(lambda: hand(x, y), n_calls, sync) * 1e6)
    finally:
        if enabled:
            gc.enable()
    ours_us, hand_us = (statistics.median(v) for v in samples.values())
    return {
        "row": "torch_op_us",
        "device": device,
        "size": "16 float32, x + y",
        "interop_us": ours_us,
        "custom_op_us": hand_us,
        "ratio": ours_us / hand_us,
        "samples": samples,
    }


def torch_op_us(ctx: BenchContext) -> dict[str, Any]:
    """The ``torch_op_us`` row, in blocks of a quarter of the per-call rows' calls."""
    device = "cpu" if gpu_unavailable() is not None else "cuda"
    calls = max(100, ctx.sizes.calls // 4)
    got = measure(calls, repeats=ctx.sizes.repeats, device=device)
    ours, hand = got["interop_us"], got["custom_op_us"]
    samples = {k: [us * calls / 1e6 for us in v] for k, v in got["samples"].items()}
    fields = {"size": f"{got['size']}, {device}", "us": ours, "anchors": {f"{HAND} us": hand}}
    fields["ratios"] = [Ratio.between("interop.torch_op", "time", HAND, ours, hand)]
    return fields | {"samples": {k: {"seconds": v, "calls": calls} for k, v in samples.items()}}


def profile_per_call(fn: Callable[[], Any], calls: int, top: int = 10) -> list[dict[str, Any]]:
    """The ``top`` functions by own time per call of ``fn`` under cProfile."""
    for _ in range(max(1, calls // 10)):  # imports and caches are not the call's
        fn()

    def run() -> None:  # each result is dropped inside the profile (its free is the call's)
        for _ in range(calls):
            fn()

    profiler = cProfile.Profile()
    collecting = gc.isenabled()
    gc.disable()  # as timeit: a collection would be charged to whatever it interrupts
    try:
        profiler.runcall(run)
    finally:
        if collecting:
            gc.enable()
    rows = []
    for (path, line, name), (_, ncalls, own, cumulative, _) in pstats.Stats(profiler).stats.items():  # type: ignore[attr-defined]
        if path == __file__ or "_lsprof.Profiler" in name:
            continue  # the loop that made the calls, and the profiler stopping
        where = "/".join(path.replace("\\", "/").split("/")[-2:]) if path != "~" else ""
        function = f"{where}:{line}({name})" if where else name
        per_call = {"own_us": own / calls * 1e6, "cumulative_us": cumulative / calls * 1e6}
        rows.append({"function": function, **per_call, "calls": ncalls / calls})
    return sorted(rows, key=lambda r: r["own_us"], reverse=True)[:top]


def _profiled(ctx: BenchContext, fields: dict[str, Any]) -> dict[str, Any]:
    g = ctx.gpu()
    t = g.th.arange(16, dtype=g.th.float32, device="cuda")
    c = g.cp.arange(16, dtype=g.cp.float32)
    calls = max(1, ctx.sizes.calls // 4)
    profile = {
        "to_cupy(t)": profile_per_call(lambda: interop.to_cupy(t), calls),
        "to_torch(c)": profile_per_call(lambda: interop.to_torch(c), calls),
    }
    g.sync()
    return fields | {"profile": profile}


ROWS = (
    lab.package_row("to_numpy_us"),
    lab.package_row("to_torch_us"),
    lab.diagnosed(lab.package_row("exchange_us"), _profiled),
    RowSpec("torch_op_us", "an interop.torch_op call, per call", False, torch_op_us),
)

if __name__ == "__main__":
    sys.exit(lab.main(ROWS, __spec__.name, __doc__))
