"""Checkpoint a model as a sharded safetensors checkpoint and reload it in place.

A small MLP is trained a few steps (on the GPU where there is one; the script
says when it runs on the CPU). Its ``state_dict()`` is saved with
``interop.safetensors.save_sharded``: the Hugging Face layout, shards of at most
``--shard-mb`` and an index, every tool that reads safetensors can load, the
device tensors streamed through interop's pinned staging ring into the files,
never copied whole to host memory. A fresh model is then filled *in place*
from the index with ``interop.safetensors.load_into``: its own tensors, where
they are, so the model is never held twice. Progress bars show both.

Run::

    python examples/checkpoint_model.py                # ~1 M parameters, 1 MB shards
    python examples/checkpoint_model.py --full         # ~1 B parameters (4 GB), 1 GB shards
    python examples/checkpoint_model.py --dir ckpt     # keep the checkpoint in ./ckpt
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import interop.safetensors as ist
from interop.info import install_command

try:
    import torch
except ImportError as exc:  # an optional dependency: say what to install
    sys.stderr.write(
        f"{__file__}: this example needs PyTorch ({exc}).\n"
        f"Install it with: {install_command('examples')}\n"
    )
    raise SystemExit(2) from None

FULL = {"width": 8192, "depth": 16, "shard_mb": 1000}  # 1.07 B float32 parameters


def _gpu_status() -> str | None:
    """None where PyTorch sees a CUDA device, else the reason."""
    return None if torch.cuda.is_available() else "PyTorch sees no CUDA device"


def _model(width: int, depth: int, device: str) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 1)).to(device)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train, save sharded, reload in place, compare; return what was checked."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=256, help="units per layer (default 256)")
    parser.add_argument("--depth", type=int, default=16, help="hidden layers (default 16)")
    parser.add_argument("--steps", type=int, default=5, help="training steps (default 5)")
    parser.add_argument("--shard-mb", type=float, default=1.0, help="largest shard, MB (1.0)")
    parser.add_argument("--full", action="store_true", help="8192 units x 16 layers, 1 GB shards")
    parser.add_argument("--cpu", action="store_true", help="train on the CPU even with a GPU")
    parser.add_argument("--dir", default=None, help="keep the checkpoint there (default: tmp)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    size = (
        FULL if args.full else {"width": args.width, "depth": args.depth, "shard_mb": args.shard_mb}
    )
    why = "--cpu was given" if args.cpu else _gpu_status()
    device = "cpu" if why else "cuda"
    if why:
        print(f"On the CPU: {why}")
    progress = not args.no_progress

    torch.manual_seed(0)
    model = _model(size["width"], size["depth"], device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(64, size["width"], device=device)
    y = x.sum(dim=1, keepdim=True).sin()
    losses = []
    for _ in range(args.steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))

    keep = Path(args.dir) if args.dir else None
    with contextlib.ExitStack() as stack:
        where = keep or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        start = time.perf_counter()
        index = ist.save_sharded(
            model.state_dict(), where, max_shard_size=f"{size['shard_mb']}MB", progress=progress
        )
        saved = time.perf_counter() - start
        files = sorted(p.name for p in where.glob("model*.safetensors*"))

        fresh = _model(size["width"], size["depth"], device)  # other random weights
        state = fresh.state_dict()
        pointers = {name: t.data_ptr() for name, t in state.items()}
        start = time.perf_counter()
        missing, unexpected = ist.load_into(index, state, progress=progress)
        loaded = time.perf_counter() - start
    trained = model.state_dict()
    equal = all(torch.equal(t, trained[name]) for name, t in fresh.state_dict().items())
    in_place = {name: t.data_ptr() for name, t in fresh.state_dict().items()} == pointers
    nbytes = sum(t.nbytes for t in trained.values())
    result = {
        "device": device,
        "parameters": sum(t.numel() for t in trained.values()),
        "files": files,
        "index": index.name,
        "losses": losses,
        "equal": equal and not missing and not unexpected,
        "in_place": in_place,
        "save_gbps": nbytes / saved / 1e9,
        "load_gbps": nbytes / loaded / 1e9,
    }
    print(f"{'model':<10}{result['parameters']:,} float32 parameters on {device}")
    print(f"{'trained':<10}{args.steps} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    print(f"{'saved':<10}{len(files)} files ({index.name} to load), {result['save_gbps']:.2f} GB/s")
    print(
        f"{'reloaded':<10}in place: {'yes' if in_place else 'NO'}, {result['load_gbps']:.2f} GB/s"
    )
    print(f"{'compared':<10}{'equal' if result['equal'] else 'DIFFERENT'}")
    return result


if __name__ == "__main__":
    got = main()
    if not (got["equal"] and got["in_place"]):
        sys.exit("the model reloaded differs from the one saved, or was not filled in place")
