"""Plot a large device array: only the pixels you draw cross the link.

``plt.imshow(t.cpu().numpy())`` copies the whole field to the host to draw a
few hundred thousand pixels of it. Here the field is downsampled on the device
through a strided view (``field[::step, ::step]``, no kernel, no copy) and
``interop.copy_to_host`` packs that view on the device chunk by chunk, so only
the drawn pixels travel, with bounded extra device memory. A ``bfloat16``
tensor is cast to float32 on the way (``dtype=np.float32``: chunk by chunk
on the device, no full-size float32 temporary), because matplotlib draws a
blank image for ``ml_dtypes.bfloat16`` arrays larger than the axes.

Rendering uses matplotlib's Agg backend through ``matplotlib.figure.Figure``
(no display, no global pyplot state) and writes a PNG.

Without a CUDA device a NumPy array stands in for the CuPy field and a CPU
tensor for the CUDA one (the script says so); the calls are the same.

A strided view picks every ``step``-th sample. That is right for smooth
fields; for noisy ones average on the device first
(``field.reshape(h // s, s, w // s, s).mean((1, 3))``, one small temporary).

Run::

    python examples/plot_device_array.py                 # a 2048 x 2048 field
    python examples/plot_device_array.py --full          # 32768 x 32768 (4 GiB) on a GPU
    python examples/plot_device_array.py --pixels 1024 --out plots/
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

import interop
from interop.info import install_command

try:
    import torch
    from matplotlib.figure import Figure
except ImportError as exc:  # an optional dependency: say what to install
    sys.stderr.write(
        f"{__file__}: this example needs PyTorch and matplotlib ({exc}).\n"
        f"Install it with: {install_command('examples')}\n"
    )
    raise SystemExit(2) from None

FULL_SIDE = 32768


@dataclass
class Row:
    source: str
    dtype: str
    field_shape: tuple[int, ...]
    field_bytes: int
    drawn_shape: tuple[int, ...]
    moved_bytes: int  # bytes of the array that reached the host
    seconds: float
    values_match: bool  # the host image equals the same view read back another way


@dataclass
class Result:
    device: str
    step: int
    rows: list[Row]
    png: Path


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


def make_field(xp: ModuleType, side: int) -> Any:
    """A smooth float32 test field (waves plus two bumps), computed where xp lives."""
    axis = xp.linspace(-1.0, 1.0, side, dtype=xp.float32)
    y, x = axis[:, None], axis[None, :]
    field = xp.sin(9 * x) * xp.cos(6 * y)
    field += 1.5 * xp.exp(-((x - 0.4) ** 2 + (y + 0.3) ** 2) / 0.02)
    field -= 1.2 * xp.exp(-((x + 0.5) ** 2 + (y - 0.5) ** 2) / 0.05)
    return field


def the_usual_way(view: Any) -> np.ndarray:
    """The same view brought to the host without interop's chunked copy."""
    if isinstance(view, torch.Tensor):  # .numpy() refuses bfloat16: go through float32
        return view.float().cpu().numpy()
    if type(view).__module__.startswith("cupy"):
        import cupy

        return cupy.asnumpy(view)
    return np.array(view)


def fetch(name: str, view: Any) -> tuple[Row, np.ndarray]:
    """Bring ``view`` (a strided device view) to the host with interop; time it."""
    start = time.perf_counter()
    image = interop.copy_to_host(view, dtype=np.float32)  # bfloat16 is cast on the way
    seconds = time.perf_counter() - start
    check = the_usual_way(view)
    row = Row(
        source=name,
        dtype=str(view.dtype).removeprefix("torch."),  # the source's; the image is float32
        field_shape=(),
        field_bytes=0,
        drawn_shape=tuple(image.shape),
        moved_bytes=int(image.nbytes),
        seconds=seconds,
        values_match=bool(np.array_equal(image, check)),
    )
    return row, image


def render(images: list[tuple[str, np.ndarray]], path: Path) -> None:
    fig = Figure(figsize=(5 * len(images), 4.4), layout="constrained")
    for ax, (title, image) in zip(fig.subplots(1, len(images)), images, strict=True):
        shown = ax.imshow(image, cmap="RdBu_r", origin="lower")
        ax.set_title(title, fontsize=9)
        fig.colorbar(shown, ax=ax, shrink=0.8)
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> Result:
    """Downsample a float32 and a bfloat16 field on the device, plot them; return rows."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", type=int, default=2048, help="field is side x side (2048)")
    parser.add_argument("--pixels", type=int, default=512, help="drawn pixels per axis (512)")
    parser.add_argument("--full", action="store_true", help=f"GPU size: side {FULL_SIDE}")
    parser.add_argument("--cpu", action="store_true", help="use host arrays even with a GPU")
    parser.add_argument("--out", default=".", help="directory for the PNG (default: .)")
    args = parser.parse_args(argv)
    side = FULL_SIDE if args.full else args.side
    if side < 2 or args.pixels < 2:
        parser.error(f"expected --side and --pixels of at least 2 (got {side!r}, {args.pixels!r})")

    why_not = "--cpu given" if args.cpu else cuda_status()
    if why_not is None:
        import cupy as xp

        device = "cuda"
    else:
        xp, device = np, "cpu"
        print(f"No GPU run ({why_not}): NumPy and CPU tensors stand in for device arrays.")

    step = max(1, math.ceil(side / args.pixels))
    field = make_field(xp, side)  # CuPy (or NumPy) float32
    # The same field as a bfloat16 PyTorch tensor, made from the CuPy array on the device.
    field_bf16 = interop.to_torch(field).to(torch.bfloat16)

    rows: list[Row] = []
    images: list[tuple[str, np.ndarray]] = []
    sources = [("CuPy" if device == "cuda" else "NumPy", field), (f"torch ({device})", field_bf16)]
    for name, array in sources:
        row, image = fetch(name, array[::step, ::step])
        row.field_shape = tuple(array.shape)
        row.field_bytes = int(array.nbytes)
        rows.append(row)
        images.append((f"{name} {row.dtype}: every {step}th sample of {side}x{side}", image))

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / "device_field.png"
    render(images, png)

    table = [("source", "dtype", "field", "field MiB", "drawn", "moved KiB", "ms", "values")]
    for r in rows:
        table.append(
            (
                r.source,
                r.dtype,
                "x".join(map(str, r.field_shape)),
                f"{r.field_bytes / 2**20:,.1f}",
                "x".join(map(str, r.drawn_shape)),
                f"{r.moved_bytes / 1024:,.0f}",
                f"{r.seconds * 1e3:.1f}",
                "ok" if r.values_match else "WRONG",
            )
        )
    widths = [max(len(t[i]) for t in table) for i in range(len(table[0]))]
    for j, t in enumerate(table):
        print("  ".join(cell.ljust(w) for cell, w in zip(t, widths, strict=True)).rstrip())
        if j == 0:
            print("  ".join("-" * w for w in widths))
    moved = sum(r.moved_bytes for r in rows)
    total = sum(r.field_bytes for r in rows)
    print(f"\nmoved {moved / total:.2%} of the fields' bytes; wrote {png}")
    return Result(device=device, step=step, rows=rows, png=png)


if __name__ == "__main__":
    wrong = [row.source for row in main().rows if not row.values_match]
    if wrong:
        sys.exit(f"the host image differs from the usual way's for: {', '.join(wrong)}")
