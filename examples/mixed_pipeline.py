"""CuPy preprocessing → PyTorch model → CuPy postprocessing, on one stream and one pool.

Two libraries on one GPU usually means two current streams (each library has
its own) and two memory pools (each caches what it freed, and neither can use
the other's cache). Hand-overs between them then need synchronisation, and
memory runs out early. Two interop calls fix both:

* ``with interop.stream(s):`` makes ``s`` the current stream of PyTorch *and*
  CuPy, so every kernel of the pipeline is queued on ``s`` in program order
  and the hand-overs (``interop.to_torch`` / ``interop.to_cupy``, zero-copy)
  need no synchronisation at all;
* ``with interop.use_torch_allocator():`` serves CuPy's allocations from
  PyTorch's caching allocator: one pool, and ``torch.cuda.memory_allocated()``
  counts CuPy's arrays too.

Nothing in the loop waits for the device (the postprocessing counts classes
with a comparison and a sum instead of boolean indexing, which would have to
ask the device for the result's size). The host waits once, for the final
counts.

Without a CUDA device NumPy stands in for CuPy and the model runs on the CPU;
``interop.stream`` and ``interop.use_torch_allocator`` need a device and are
left out (the script says so). The result is checked against the same
pipeline written in PyTorch alone.

Run::

    python examples/mixed_pipeline.py            # 4 batches of 16 RGB 64x64 images
    python examples/mixed_pipeline.py --full     # 50 batches of 64 RGB 224x224, on a GPU
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

import interop
from interop.info import install_command

try:
    import torch
    from torch import nn
except ImportError as exc:  # an optional dependency: say what to install
    sys.stderr.write(
        f"{__file__}: this example needs PyTorch ({exc}).\n"
        f"Install it with: {install_command('examples')}\n"
    )
    raise SystemExit(2) from None

CLASSES = 10
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


@dataclass
class Result:
    device: str
    counts: list[int]  # images per predicted class; the last entry: below the threshold
    reference_counts: list[int]  # the same pipeline in PyTorch alone
    max_prob_difference: float  # largest |p - p_reference| over every image and class
    zero_copy: bool  # every hand-over shared memory
    one_stream: bool | None  # PyTorch and CuPy had the same current stream (GPU only)
    cupy_pool_growth_bytes: int | None  # CuPy's own pool (0: everything came from PyTorch's)
    torch_peak_bytes: int | None  # PyTorch's allocator peak, CuPy's arrays included
    images_per_second: float


def cuda_status() -> str | None:
    """None when PyTorch and CuPy both see a CUDA device, else the reason."""
    if not torch.cuda.is_available():
        return f"PyTorch {torch.__version__} sees no CUDA device"
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() == 0:
            return "CuPy sees no CUDA device"
    except Exception as exc:  # not installed, or no driver
        return f"CuPy is not usable ({type(exc).__name__})"
    return None


def pointer(a: Any) -> int:
    return int(a.data.ptr) if hasattr(a.data, "ptr") else int(a.ctypes.data)


def synthetic_images(xp: ModuleType, rng: Any, shape: tuple[int, ...]) -> Any:
    """uint8 NHWC images: a random tint per image plus noise."""
    tint = rng.random(size=(shape[0], 1, 1, 3), dtype=xp.float32)
    noise = rng.random(size=shape, dtype=xp.float32)
    return (tint * 191 + noise * 64).astype(xp.uint8)


def preprocess(xp: ModuleType, raw: Any) -> Any:
    """uint8 NHWC images → normalised float32 NCHW, contiguous (CuPy or NumPy)."""
    mean = xp.asarray(MEAN, dtype=xp.float32)
    std = xp.asarray(STD, dtype=xp.float32)
    x = (raw.astype(xp.float32) / 255 - mean) / std
    return xp.ascontiguousarray(x.transpose(0, 3, 1, 2))


def postprocess(xp: ModuleType, probs: Any, threshold: float) -> Any:
    """Images per predicted class; the last bin counts those below ``threshold``."""
    label = xp.where(probs.max(axis=1) >= threshold, probs.argmax(axis=1), CLASSES)
    return (label[:, None] == xp.arange(CLASSES + 1)[None, :]).sum(axis=0)


def reference(
    raw: torch.Tensor, model: nn.Module, threshold: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole pipeline in PyTorch alone, for the check: probabilities and counts."""
    mean = torch.tensor(MEAN, device=raw.device)
    std = torch.tensor(STD, device=raw.device)
    x = ((raw.float() / 255 - mean) / std).permute(0, 3, 1, 2).contiguous()
    probs = torch.softmax(model(x), dim=1)
    confidence, label = probs.max(dim=1)
    label = torch.where(confidence >= threshold, label, CLASSES)
    return probs, torch.bincount(label, minlength=CLASSES + 1)


def make_model(device: torch.device) -> nn.Module:
    """A small convolutional classifier with fixed random weights."""
    torch.manual_seed(0)
    return (
        nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(32, CLASSES),
        )
        .to(device)
        .eval()
    )


def main(argv: list[str] | None = None) -> Result:
    """Run the three-stage pipeline over a few batches; return counts and checks."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=4, help="number of batches (4)")
    parser.add_argument("--batch", type=int, default=16, help="images per batch (16)")
    parser.add_argument("--size", type=int, default=64, help="image side in pixels (64)")
    parser.add_argument("--threshold", type=float, default=0.11, help="confidence to count (0.11)")
    parser.add_argument(
        "--full", action="store_true", help="GPU sizes: 50 batches of 64 images of 224x224"
    )
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even with a GPU")
    args = parser.parse_args(argv)
    if args.full:
        args.batches, args.batch, args.size = 50, 64, 224
    if min(args.batches, args.batch, args.size) < 1:
        parser.error("expected --batches, --batch and --size of at least 1")

    why_not = "--cpu given" if args.cpu else cuda_status()
    on_gpu = why_not is None
    if on_gpu:
        import cupy as xp

        device = torch.device("cuda")
        s = torch.cuda.Stream()
        pool = xp.get_default_memory_pool()
        pool.free_all_blocks()
        pool_before = pool.total_bytes()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    else:
        xp, device = np, torch.device("cpu")
        print(
            f"No GPU run ({why_not}): NumPy stands in for CuPy, the model runs on the CPU; "
            "interop.stream and interop.use_torch_allocator need a CUDA device and are left out."
        )

    model = make_model(device)
    counts: Any = None
    probs_all, raws = [], []
    zero_copy, one_stream = True, None
    start = time.perf_counter()
    with contextlib.ExitStack() as together, torch.inference_mode():
        if on_gpu:
            together.enter_context(interop.stream(s))  # one stream for both libraries
            together.enter_context(interop.use_torch_allocator())  # one pool for both
            one_stream = xp.cuda.get_current_stream().ptr == torch.cuda.current_stream().cuda_stream
        rng = xp.random.default_rng(0)  # on the GPU, its state comes from PyTorch's pool too
        for _ in range(args.batches):
            shape = (args.batch, args.size, args.size, 3)
            raw = synthetic_images(xp, rng, shape)  # stands in for decoded images
            x = preprocess(xp, raw)  # CuPy
            xt = interop.to_torch(x)  # zero-copy, ordered on the shared stream
            probs_t = torch.softmax(model(xt), dim=1)  # PyTorch
            probs = interop.to_cupy(probs_t) if on_gpu else interop.to_numpy(probs_t)  # zero-copy
            zero_copy &= xt.data_ptr() == pointer(x) and probs_t.data_ptr() == pointer(probs)
            batch_counts = postprocess(xp, probs, args.threshold)  # CuPy
            counts = batch_counts if counts is None else counts + batch_counts
            probs_all.append(probs)
            raws.append(raw)
        host_counts = interop.to_numpy(counts)  # the one wait for the device
    seconds = time.perf_counter() - start

    cupy_growth = torch_peak = None
    if on_gpu:
        cupy_growth = xp.get_default_memory_pool().total_bytes() - pool_before
        torch_peak = torch.cuda.max_memory_allocated()

    # The check: the same pipeline in PyTorch alone.
    ref_counts = np.zeros(CLASSES + 1, np.int64)
    worst = 0.0
    with torch.inference_mode():
        for raw, probs in zip(raws, probs_all, strict=True):
            ref, ref_batch_counts = reference(interop.to_torch(raw), model, args.threshold)
            worst = max(worst, float((interop.to_torch(probs) - ref).abs().max()))
            ref_counts += interop.to_numpy(ref_batch_counts)
    del raws, probs_all

    result = Result(
        device=str(device),
        counts=[int(c) for c in host_counts],
        reference_counts=[int(c) for c in ref_counts],
        max_prob_difference=worst,
        zero_copy=zero_copy,
        one_stream=one_stream,
        cupy_pool_growth_bytes=cupy_growth,
        torch_peak_bytes=torch_peak,
        images_per_second=args.batches * args.batch / seconds,
    )
    report(result, xp.__name__, args)
    return result


def report(r: Result, xp_name: str, args: argparse.Namespace) -> None:
    n = args.batches * args.batch
    print(
        f"{n} images ({args.batches} x {args.batch}, {args.size}x{args.size} RGB) on {r.device}, "
        f"{r.images_per_second:,.0f} images/s"
    )
    table = [("stage", "library", "hand-over")]
    table.append(("preprocess", xp_name, "interop.to_torch (zero-copy)"))
    table.append(
        (
            "model",
            "torch",
            f"interop.to_{'cupy' if r.one_stream is not None else 'numpy'} (zero-copy)",
        )
    )
    table.append(("postprocess", xp_name, "interop.to_numpy (the final counts)"))
    widths = [max(len(t[i]) for t in table) for i in range(3)]
    for j, t in enumerate(table):
        print("  ".join(cell.ljust(w) for cell, w in zip(t, widths, strict=True)).rstrip())
        if j == 0:
            print("  ".join("-" * w for w in widths))
    print()
    print(f"zero-copy hand-overs: {r.zero_copy}")
    if r.one_stream is not None:
        print(f"one stream for both libraries: {r.one_stream}")
        print(
            f"one pool: CuPy's own pool grew by {r.cupy_pool_growth_bytes:,} bytes; PyTorch's "
            f"allocator peaked at {(r.torch_peak_bytes or 0) / 2**20:,.1f} MiB, "
            "CuPy's arrays included"
        )
    labels = [str(c) for c in range(CLASSES)] + ["unsure"]
    print(f"\nimages per class (confidence >= {args.threshold}):")
    print("  ".join(f"{label:>6}" for label in labels))
    print("  ".join(f"{c:>6}" for c in r.counts))
    same = r.counts == r.reference_counts
    print(
        f"same counts as PyTorch alone: {same}; largest probability difference "
        f"{r.max_prob_difference:.2e}"
    )


if __name__ == "__main__":
    r = main()
    if r.counts != r.reference_counts or not r.zero_copy or r.one_stream is False:
        sys.exit("the pipeline's checks failed: see the lines above")
