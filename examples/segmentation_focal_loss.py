"""Train a small U-Net with focal loss on CuPy-augmented data; score it on the host.

A common split in segmentation code: augmentation written with CuPy (or
inherited from a CuPy pipeline), the model in PyTorch, metrics in NumPy.
Each hand-over here is the interop way:

* CuPy → PyTorch: ``interop.to_torch`` shares the augmented images and masks
  with PyTorch without a copy, ordered on PyTorch's current stream. ``uint8``
  masks stay ``uint8`` (no float round trip); the loss takes ``.long()``.
* CuPy kernels → a PyTorch operator: the focal loss's per-pixel term and its
  derivative are CuPy ``ElementwiseKernel`` s (NumPy on the CPU), made one
  operator with autograd by ``interop.torch_op``; the loss around it is
  compiled with ``torch.compile(fullgraph=True)``: inductor on a GPU, where
  a compiler is available; on the CPU the aot_eager backend, the same
  whole-graph capture without inductor's C++ build (about 9 s of a 2-core
  CPU; ``--compile inductor`` builds it). ``--compile off`` trains without.
* PyTorch → NumPy: each step's predictions leave the device with
  ``interop.copy_to_host_async`` into one of two preallocated host buffers,
  page-locked on a GPU (``pin_memory=True``), which the DMAs write directly.
  The copy runs on its own stream after the step's kernels, so the training
  stream never waits for it; the host scores step *k* (per-class IoU from a
  confusion matrix) while step *k + 1* runs.

Without a CUDA device the augmentation runs in NumPy and the model on the CPU
(the script says so); the hand-overs are the same calls.

Run::

    python examples/segmentation_focal_loss.py           # 32x32 images, 40 steps
    python examples/segmentation_focal_loss.py --full    # 256x256, 300 steps, on a GPU
"""

from __future__ import annotations

import argparse
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
    import torch.nn.functional as F
    from torch import nn
except ImportError as exc:  # an optional dependency: say what to install
    sys.stderr.write(
        f"{__file__}: this example needs PyTorch ({exc}).\n"
        f"Install it with: {install_command('examples')}\n"
    )
    raise SystemExit(2) from None

CLASSES = ("background", "disc", "bar")


@dataclass
class Result:
    device: str
    losses: list[float]
    iou: list[float]  # per class, over every streamed step
    iou_last_host: list[float]  # last step, from the host copies
    iou_last_device: list[float]  # last step, computed on the device by PyTorch
    mask_dtype: str  # dtype of the masks as PyTorch received them
    zero_copy: bool  # every hand-over from the augmentation shared memory
    steps_per_second: float
    loss_gap: float  # first step: |the operator's loss - PyTorch alone's|
    loss_runs: str  # how the loss ran: compiled, or eager and why


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


# -- data: synthetic scenes, generated and augmented with xp (CuPy or NumPy) --


def make_dataset(xp: ModuleType, n: int, size: int, seed: int) -> tuple[Any, Any]:
    """``n`` scenes: a disc (class 1) and a bar (class 2) on a background.

    Returns float32 images ``(n, 1, size, size)`` and uint8 masks ``(n, size, size)``.
    """
    rng = np.random.default_rng(seed)
    yy, xx = xp.meshgrid(xp.arange(size), xp.arange(size), indexing="ij")
    masks = xp.zeros((n, size, size), dtype=xp.uint8)
    for i in range(n):
        cy, cx = rng.uniform(0.25, 0.75, 2) * size
        r = rng.uniform(0.1, 0.2) * size
        masks[i][(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = 1
        y0, x0 = rng.integers(0, size * 3 // 4, 2)
        h, w = rng.integers(size // 8, size // 4, 2)
        masks[i, y0 : y0 + h, x0 : x0 + 3 * w] = 2
    # Each class has its own mean brightness; the noise comes with augmentation.
    images = masks.astype(xp.float32)[:, None] * 0.8
    return images, masks


def augment(xp: ModuleType, rng: Any, images: Any, masks: Any, turns: int, flip: bool) -> Any:
    """Rotate/flip a batch (images and masks alike) and add noise, on xp's device.

    ``rot90`` and ``flip`` are views with negative strides; PyTorch has no
    negative strides, so ``to_torch`` would have to copy them. The batch is
    made contiguous here, once, as part of the augmentation.
    """
    images = xp.rot90(images, turns, axes=(-2, -1))
    masks = xp.rot90(masks, turns, axes=(-2, -1))
    if flip:
        images, masks = images[..., ::-1], masks[..., ::-1]
    noise = rng.standard_normal(size=images.shape, dtype=xp.float32) * 0.35
    return xp.ascontiguousarray(images) + noise, xp.ascontiguousarray(masks)


def pointer(a: Any) -> int:
    return int(a.data.ptr) if hasattr(a.data, "ptr") else int(a.ctypes.data)


# -- model and loss --


def block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(cout, cout, 3, padding=1),
        nn.ReLU(),
    )


class UNet(nn.Module):
    """Two-level U-Net: encoder, bottleneck, decoder with skip connections."""

    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        self.enc1, self.enc2 = block(1, width), block(width, 2 * width)
        self.mid = block(2 * width, 4 * width)
        self.up2, self.dec2 = (
            nn.ConvTranspose2d(4 * width, 2 * width, 2, 2),
            block(4 * width, 2 * width),
        )
        self.up1, self.dec1 = nn.ConvTranspose2d(2 * width, width, 2, 2), block(2 * width, width)
        self.head = nn.Conv2d(width, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        m = self.mid(F.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], 1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], 1))
        return self.head(d1)


# The focal term of each pixel, (1 - p) ** gamma * -log(p) of the true class's
# probability p, and its derivative, as CuPy kernels on a GPU and NumPy on the
# CPU. interop.torch_op makes the pair one PyTorch operator: zero-copy in and
# out, on PyTorch's current stream, traceable by torch.compile (like=0: the
# output has the shape and dtype of the input).

_KERNELS: dict[str, Any] = {}


def _cupy_kernel(name: str) -> Any:
    """The CuPy ElementwiseKernel ``name``, made on first use."""
    if name not in _KERNELS:
        import cupy

        body = {
            "focal_forward": "T q = 1 - exp(lp); out = -pow(q, gamma) * lp;",
            "focal_backward": (
                "T p = exp(lp); T q = 1 - p;"
                "out = g * (gamma * p * lp * pow(q, gamma - 1) - pow(q, gamma));"
            ),
        }[name]
        params = "T lp, T gamma" if name == "focal_forward" else "T lp, T g, T gamma"
        _KERNELS[name] = cupy.ElementwiseKernel(params, "T out", body, name)
    return _KERNELS[name]


@interop.torch_op("segmentation_example::focal_term", like=0)
def focal_term(logp: interop.Array, gamma: float) -> interop.Array:
    """``(1 - exp(logp)) ** gamma * -logp`` per element (``logp <= 0``)."""
    xp = interop.array_namespace(logp)
    gamma_ = logp.dtype.type(gamma)
    if xp is np:
        return -((1 - np.exp(logp)) ** gamma_) * logp
    return _cupy_kernel("focal_forward")(logp, gamma_)


@interop.torch_op("segmentation_example::focal_term_backward", like=0)
def focal_term_backward(logp: interop.Array, grad: interop.Array, gamma: float) -> interop.Array:
    """``grad`` times the derivative of :func:`focal_term` by ``logp``."""
    xp = interop.array_namespace(logp)
    gamma_ = logp.dtype.type(gamma)
    if xp is np:
        p = np.exp(logp)
        q = 1 - p
        return grad * (gamma_ * p * logp * q ** (gamma_ - 1) - q**gamma_)
    return _cupy_kernel("focal_backward")(logp, grad, gamma_)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.save_for_backward(inputs[0])
    ctx.gamma = inputs[1]


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
    (logp,) = ctx.saved_tensors
    return focal_term_backward(logp, grad, ctx.gamma), None


focal_term.register_autograd(_backward, setup_context=_setup_context)


def focal_loss(logits: torch.Tensor, target: torch.Tensor, gamma: float = 2.0) -> torch.Tensor:
    """Multi-class focal loss: cross-entropy scaled by ``(1 - p_true) ** gamma``."""
    logp = F.log_softmax(logits, 1).gather(1, target[:, None]).squeeze(1)
    return focal_term(logp, gamma).mean()


def focal_loss_reference(
    logits: torch.Tensor, target: torch.Tensor, gamma: float = 2.0
) -> torch.Tensor:
    """The same loss in PyTorch alone, to check the operator against."""
    ce = F.cross_entropy(logits, target, reduction="none")
    return ((1 - torch.exp(-ce)) ** gamma * ce).mean()


def compiled_loss(device: torch.device, how: str, shape: tuple[int, ...]) -> tuple[Any, str]:
    """``focal_loss`` under ``torch.compile(fullgraph=True)`` for logits of ``shape``, or
    as it is with the reason when ``how`` is "off" or compiling fails here (no C++
    compiler for inductor on the CPU, no Triton on the GPU)."""
    if how == "off":
        return focal_loss, "eager (--compile off)"
    backend = how if how != "auto" else "inductor" if device.type == "cuda" else "aot_eager"
    compiled = torch.compile(focal_loss, fullgraph=True, backend=backend)
    probe = torch.randn(shape, device=device, requires_grad=True)
    target = torch.zeros((shape[0], *shape[2:]), dtype=torch.long, device=device)
    try:  # compile now, forward and backward, at the training shape: compiled once
        compiled(probe, target).backward()
    except Exception as exc:  # any compiler failure: train without it
        torch._dynamo.reset()
        return focal_loss, f"eager (torch.compile failed here: {type(exc).__name__})"
    return compiled, f"torch.compile(fullgraph=True, backend={backend!r})"


# -- metrics on the host --


def confusion(pred: np.ndarray, mask: np.ndarray, k: int) -> np.ndarray:
    """``k x k`` confusion matrix (rows: truth, columns: prediction)."""
    index = mask.astype(np.int64).ravel() * k + pred.astype(np.int64).ravel()
    return np.bincount(index, minlength=k * k).reshape(k, k)


def iou_from(conf: np.ndarray) -> list[float]:
    tp = np.diag(conf).astype(np.float64)
    union = conf.sum(0) + conf.sum(1) - tp
    return [float(v) for v in np.where(union > 0, tp / np.maximum(union, 1), np.nan)]


def iou_on_device(pred: torch.Tensor, mask: torch.Tensor, k: int) -> list[float]:
    out = []
    for c in range(k):
        inter = ((pred == c) & (mask == c)).sum().item()
        union = ((pred == c) | (mask == c)).sum().item()
        out.append(inter / union if union else float("nan"))
    return out


def main(argv: list[str] | None = None) -> Result:
    """Train a few steps; stream predictions to the host for IoU; return the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=32, help="image side, multiple of 4 (32)")
    parser.add_argument("--batch", type=int, default=8, help="batch size (8)")
    parser.add_argument("--steps", type=int, default=40, help="training steps (40)")
    parser.add_argument("--width", type=int, default=8, help="channels of the first level (8)")
    parser.add_argument(
        "--full", action="store_true", help="GPU sizes: 256 px, batch 16, 300 steps, width 32"
    )
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even with a GPU")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--compile",
        choices=("auto", "inductor", "aot_eager", "off"),
        default="auto",
        help="the loss under torch.compile (auto: inductor on a GPU, aot_eager on the CPU)",
    )
    args = parser.parse_args(argv)
    if args.full:
        args.size, args.batch, args.steps, args.width = 256, 16, 300, 32
    if args.size % 4 or args.size < 16:
        parser.error(f"expected --size to be a multiple of 4, at least 16 (got {args.size!r})")
    if args.steps < 1 or args.batch < 1 or args.width < 1:
        parser.error("expected --steps, --batch and --width of at least 1")

    why_not = "--cpu given" if args.cpu else cuda_status()
    if why_not is None:
        import cupy as xp

        device = torch.device("cuda")
        rng: Any = xp.random.default_rng(args.seed)
    else:
        xp = np
        device = torch.device("cpu")
        rng = np.random.default_rng(args.seed)
        print(f"No GPU run ({why_not}): NumPy augments, PyTorch trains on the CPU.")
    torch.manual_seed(args.seed)
    choices = np.random.default_rng(args.seed + 1)

    k = len(CLASSES)
    images, masks = make_dataset(xp, 4 * args.batch, args.size, args.seed)
    model = UNet(args.width, k).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn, loss_runs = compiled_loss(device, args.compile, (args.batch, k, args.size, args.size))
    loss_gap = float("nan")

    # Two host buffers per stream, so step k's copy lands while step k-1 is scored.
    # Reused every step, so on a GPU they are page-locked once: copy_to_host then
    # DMAs straight into them, with no staging ring and no host copy.
    shape = (args.batch, args.size, args.size)
    pinned = device.type == "cuda"

    def host_buffer() -> np.ndarray:
        return torch.empty(shape, dtype=torch.uint8, pin_memory=pinned).numpy()

    pred_host = [host_buffer() for _ in range(2)]
    mask_host = [host_buffer() for _ in range(2)]
    conf = np.zeros((k, k), np.int64)
    pending: tuple[Any, ...] | None = None
    losses: list[float] = []
    zero_copy, mask_dtype = True, ""
    last: tuple[torch.Tensor, torch.Tensor] | None = None

    def score(p: tuple[Any, ...]) -> np.ndarray:
        pred_transfer, mask_transfer, _keep_alive = p
        step_conf = confusion(pred_transfer.result(), mask_transfer.result(), k)
        conf[...] += step_conf
        return step_conf

    start = time.perf_counter()
    for step in range(args.steps):
        pick = choices.choice(len(masks), args.batch, replace=False)
        index = xp.asarray(pick)
        turns, flip = int(choices.integers(4)), bool(choices.integers(2))
        img_x, mask_x = augment(xp, rng, images[index], masks[index], turns, flip)
        img_t, mask_t = interop.to_torch(img_x), interop.to_torch(mask_x)  # zero-copy
        zero_copy &= img_t.data_ptr() == pointer(img_x) and mask_t.data_ptr() == pointer(mask_x)
        mask_dtype = str(mask_t.dtype)

        logits = model(img_t)
        loss = loss_fn(logits, mask_t.long())
        if step == 0:
            with torch.no_grad():
                loss_gap = abs(loss.item() - focal_loss_reference(logits, mask_t.long()).item())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

        with torch.no_grad():
            pred = logits.argmax(1).to(torch.uint8)
        slot = step % 2
        transfers = (
            interop.copy_to_host_async(pred, pred_host[slot]),
            interop.copy_to_host_async(mask_t, mask_host[slot]),
            (pred, mask_t, mask_x),  # keep the sources alive until their copies are done
        )
        if pending is not None:
            score(pending)  # the previous step, while this one's kernels run
        pending = transfers
        losses.append(loss.item())  # one sync per step, after the copies were queued
        last = (pred, mask_t)
    assert pending is not None  # --steps >= 1
    assert last is not None
    last_conf = score(pending)
    seconds = time.perf_counter() - start

    result = Result(
        device=str(device),
        losses=losses,
        iou=iou_from(conf),
        iou_last_host=iou_from(last_conf),
        iou_last_device=iou_on_device(*last, k),
        mask_dtype=mask_dtype,
        zero_copy=zero_copy,
        steps_per_second=args.steps / seconds,
        loss_gap=loss_gap,
        loss_runs=loss_runs,
    )
    print(
        f"{args.steps} steps on {device} ({args.batch} x {args.size}x{args.size}), "
        f"{result.steps_per_second:.1f} steps/s; focal loss {losses[0]:.4f} -> {losses[-1]:.4f}"
    )
    print(f"masks reached PyTorch as {mask_dtype}, zero-copy: {zero_copy}")
    print(f"focal loss: interop.torch_op of CuPy/NumPy kernels, {loss_runs}")
    rows = [("class", "IoU, all steps", "IoU, last step", "last step on device")]
    for c, name in enumerate(CLASSES):
        rows.append(
            (
                name,
                f"{result.iou[c]:.3f}",
                f"{result.iou_last_host[c]:.3f}",
                f"{result.iou_last_device[c]:.3f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for j, r in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
        if j == 0:
            print("  ".join("-" * w for w in widths))
    return result


if __name__ == "__main__":
    # A model this small gains nothing from a second CPU thread, and on a busy CPU
    # PyTorch's threads spin waiting for each other (1 step/s instead of 30 on 2 cores).
    torch.set_num_threads(1)
    r = main()
    same = np.allclose(r.iou_last_host, r.iou_last_device, equal_nan=True)
    if not (same and r.zero_copy):
        sys.exit("the streamed IoU differs from PyTorch's, or a hand-over copied")
    if not r.loss_gap <= 1e-4:
        sys.exit(f"the operator's focal loss differs from PyTorch's by {r.loss_gap}")
