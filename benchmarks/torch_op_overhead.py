"""Per-call overhead of an ``interop.torch_op`` (the ``torch_op_us`` row).

The same operator twice, on 16 float32 values, so the call's cost is the
overhead: ``x + y``

* as ``interop.torch_op`` (zero-copy exchange through ``interop.to_numpy`` /
  ``interop.to_cupy`` and ``interop.to_torch``, aliasing and layout checks,
  on a GPU PyTorch's current stream and caching allocator for CuPy);
* as a hand-written ``torch.library.custom_op`` doing its own exchange:
  ``numpy.from_dlpack`` (CPU) or ``cupy.from_dlpack`` (CUDA) in,
  ``torch.from_dlpack`` out, nothing else.

Both go through PyTorch's dispatcher and custom-op machinery (autograd
wrapper included), which dominate a call; the ratio is interop's cost on
top. Target: at most 1.3. Timed in interleaved blocks (interop, then the
hand-written op, ``repeats`` times), each block ``n_calls`` calls; the
figures are the medians, so a noisy, shared machine moves both alike.

Run::

    python benchmarks/torch_op_overhead.py                 # CPU, and CUDA if present
    python benchmarks/torch_op_overhead.py --device cpu --calls 20000
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

import interop
from interop.info import install_command

try:
    import torch
except ImportError as exc:  # an optional dependency: say what to install
    sys.stderr.write(
        f"{__file__}: this benchmark needs PyTorch ({exc}).\n"
        f"Install it with: {install_command('torch')}\n"
    )
    raise SystemExit(2) from None

TARGET = 1.3
_OPS: dict[str, tuple[Any, Any]] = {}
_COPY = uuid.uuid4().hex[:8]


def _make_ops(device: str) -> tuple[Any, Any]:
    """(the interop.torch_op, the hand-written custom_op) for ``device``."""
    if device in _OPS:
        return _OPS[device]
    # operators are registered with PyTorch process-wide: a name of this module copy's
    # own, so that another copy (a test loads the file by path) registers its own ops
    tag = f"{device.replace(':', '_')}_{_COPY}"

    @interop.torch_op(f"interop_bench::interop_add_{tag}", like=0)
    def interop_add(x, y):
        return x + y

    @torch.library.custom_op(f"interop_bench::hand_add_{tag}", mutates_args=())
    def hand_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            import cupy

            return torch.from_dlpack(cupy.from_dlpack(x) + cupy.from_dlpack(y))
        return torch.from_dlpack(np.from_dlpack(x) + np.from_dlpack(y))

    @hand_add.register_fake
    def _(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

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
    """Time both operators per call on ``device`` ("cpu" or "cuda").

    Returns
    -------
    dict
        ``interop_us`` and ``custom_op_us`` (medians over ``repeats``
        interleaved blocks of ``n_calls`` calls, microseconds per call),
        ``ratio`` (interop over the hand-written op), ``target``, and the
        samples behind the medians.
    """
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
    ours_us = statistics.median(samples["interop.torch_op"])
    hand_us = statistics.median(samples["custom_op"])
    return {
        "row": "torch_op_us",
        "device": device,
        "size": "16 float32, x + y",
        "n_calls": n_calls,
        "repeats": repeats,
        "interop_us": ours_us,
        "custom_op_us": hand_us,
        "ratio": ours_us / hand_us,
        "target": TARGET,
        "samples": samples,
    }


def _cuda_usable() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:  # not installed, or no driver
        return False


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Measure on the CPU (and on CUDA when usable); print one line each."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=5000, help="calls per block (5000)")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved blocks (7)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    args = parser.parse_args(argv)
    devices = ["cpu", "cuda"] if args.device == "auto" else [args.device]
    if args.device == "auto" and not _cuda_usable():
        devices = ["cpu"]
    results = []
    for device in devices:
        r = measure(args.calls, repeats=args.repeats, device=device)
        verdict = "ok" if r["ratio"] <= TARGET else f"over the {TARGET} target"
        print(
            f"torch_op_us {device}: interop.torch_op {r['interop_us']:.1f} us, "
            f"hand-written custom_op {r['custom_op_us']:.1f} us per call, "
            f"ratio {r['ratio']:.2f} ({verdict})"
        )
        results.append(r)
    return results


if __name__ == "__main__":
    main()
