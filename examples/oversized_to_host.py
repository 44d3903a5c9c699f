"""Stream a device tensor too large for a comfortable ``.cpu()`` into host memory.

The naive ways to bring a device array to the host, ``t.cpu().numpy()`` and
``cupy.asnumpy(c)``, allocate a fresh full-size pageable array and copy into it
in one piece. For a tensor of many GiB that is slow (pageable memory is staged
by the driver) and doubles host memory if you already hold a buffer for it.
interop streams the tensor in chunks through a small ring of pinned buffers:

* ``interop.copy_to_host(t, out)`` into a preallocated NumPy buffer (a
  ``numpy.memmap`` works too), with a progress bar;
* ``interop.save_npy(t, path)`` straight into a ``.npy`` file, without a
  full-size host copy.

The script prints throughput and peak extra device and host memory of each
way beside the naive ones. Without a CUDA device it runs the same calls on a
CPU tensor (the naive row is then ``t.clone().numpy()``, which is what
``.cpu()`` costs on a GPU: a new full-size array) and says so.

Run::

    python examples/oversized_to_host.py            # 64 MiB, CPU or GPU
    python examples/oversized_to_host.py --full     # 8 GiB on a GPU
    python examples/oversized_to_host.py --mib 2048 --dir /scratch
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import interop
from interop.info import install_command

try:
    import torch
except ImportError as exc:  # an optional dependency: say what to install
    sys.stderr.write(
        f"{__file__}: this example needs PyTorch ({exc}).\n"
        f"Install it with: {install_command('examples')}\n"
    )
    raise SystemExit(2) from None

MiB = 1 << 20
FULL_MIB = 8192


@dataclass
class Row:
    """One way of bringing the tensor to the host, measured."""

    method: str
    seconds: float
    extra_device_bytes: int | None
    extra_host_bytes: int | None
    matches: bool

    def gbps(self, nbytes: int) -> float:
        return nbytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")


@dataclass
class Result:
    device: str
    nbytes: int
    rows: list[Row]


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


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class PeakHostMemory:
    """Peak growth of this process's resident memory (RSS) inside a block.

    Linux only (``None`` elsewhere). The kernel's peak (``VmHWM``) is reset on
    entry; where that is refused, a thread samples ``VmRSS`` every millisecond.
    """

    extra_bytes: int | None = None

    def __enter__(self) -> PeakHostMemory:
        self._before = _status_bytes("VmRSS")
        self._samples: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current RSS
            self._hwm = True
        except OSError:
            self._hwm = False
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            self._samples.append(_status_bytes("VmRSS") or 0)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        now = _status_bytes("VmRSS")
        if self._before is None or now is None:
            return
        peak = _status_bytes("VmHWM") if self._hwm else max(self._samples, default=0)
        self.extra_bytes = max(0, max(peak or 0, now) - self._before)


@contextlib.contextmanager
def peak_device_memory(on_gpu: bool) -> Iterator[dict[str, int | None]]:
    """Peak growth of PyTorch's and CuPy's device allocations inside a block."""
    seen: dict[str, int | None] = {"extra_bytes": None}
    if not on_gpu:
        yield seen
        return
    import cupy

    pool = cupy.get_default_memory_pool()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    torch_before, pool_before = torch.cuda.memory_allocated(), pool.total_bytes()
    yield seen
    torch.cuda.synchronize()
    grown = torch.cuda.max_memory_allocated() - torch_before
    seen["extra_bytes"] = max(0, grown) + max(0, pool.total_bytes() - pool_before)


def measure(
    method: str, call: Callable[[], np.ndarray], expected: np.ndarray, on_gpu: bool
) -> tuple[Row, np.ndarray]:
    """Run ``call`` once, timed, with its peak extra memory; check its values."""
    with peak_device_memory(on_gpu) as device, PeakHostMemory() as host:
        start = time.perf_counter()
        got = call()
        seconds = time.perf_counter() - start
    matches = got.shape == expected.shape and bool(np.array_equal(got, expected))
    return Row(method, seconds, device["extra_bytes"], host.extra_bytes, matches), got


def print_table(result: Result, ring_bytes: int) -> None:
    def mib(n: int | None) -> str:
        return "n/a" if n is None else f"{n / MiB:,.0f}"

    header = ("method", "seconds", "GB/s", "extra device MiB", "extra host MiB", "values")
    lines = [header]
    for r in result.rows:
        lines.append(
            (
                r.method,
                f"{r.seconds:.3f}",
                f"{r.gbps(result.nbytes):.2f}",
                mib(r.extra_device_bytes),
                mib(r.extra_host_bytes),
                "ok" if r.matches else "WRONG",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for k, line in enumerate(lines):
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
        if k == 0:
            print("  ".join("-" * w for w in widths))
    if result.device.startswith("cuda"):
        how = (
            f"staging ring {interop.config.num_buffers} x "
            f"{interop.config.chunk_bytes / MiB:g} MiB = {ring_bytes / MiB:g} MiB of pinned memory"
        )
    else:
        how = f"host sources are copied by {interop.config.host_threads} threads, no staging"
    print(f"\n{result.nbytes / MiB:,.0f} MiB of float32 on {result.device}; {how}.")
    print("Extra host memory is the peak growth of resident memory (RSS) during the call.")


def main(argv: list[str] | None = None) -> Result:
    """Measure each way of bringing one large tensor to the host; return the rows."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="tensor size in MiB (default 64)")
    parser.add_argument(
        "--full", action="store_true", help=f"GPU size: {FULL_MIB} MiB (needs as much host RAM x3)"
    )
    parser.add_argument("--cpu", action="store_true", help="use a CPU tensor even with a GPU")
    parser.add_argument("--dir", default=None, help="directory for the .npy file (default: tmp)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)

    mib = FULL_MIB if args.full else args.mib
    if mib <= 0:
        parser.error(f"expected --mib > 0 (got {mib!r})")
    why_not = "--cpu given" if args.cpu else cuda_status()
    on_gpu = why_not is None
    device = "cuda" if on_gpu else "cpu"
    if not on_gpu:
        print(f"No GPU run ({why_not}): using a CPU tensor; the same calls run on the host.")
    progress = not args.no_progress

    n = mib * MiB // 4
    # Values that float32 holds exactly, so every way must give the same bits.
    x = (torch.arange(n, dtype=torch.int32, device=device) % (1 << 24)).to(torch.float32)
    expected = (np.arange(n, dtype=np.int32) % (1 << 24)).astype(np.float32)
    ring = interop.config.num_buffers * interop.config.chunk_bytes
    rows: list[Row] = []

    out = np.empty(n, np.float32)
    out.fill(0)  # preallocated and touched: its pages are not counted as extra
    row, got = measure(
        "interop.copy_to_host(x, out)",
        lambda: interop.copy_to_host(x, out, progress=progress),
        expected,
        on_gpu,
    )
    rows.append(row)
    del got

    row, got = measure("interop.copy_to_host(x)", lambda: interop.copy_to_host(x), expected, on_gpu)
    rows.append(row)
    del got

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "x.npy"

        def save_and_map() -> np.ndarray:
            interop.save_npy(x, path, progress=progress)
            return np.load(path, mmap_mode="r")  # checked through the page cache

        row, got = measure("interop.save_npy(x, path)", save_and_map, expected, on_gpu)
        rows.append(row)
        file_bytes = os.path.getsize(path)
        del got

    naive: list[tuple[str, Callable[[], Any]]]
    if on_gpu:
        import cupy

        c = interop.to_cupy(x)  # zero-copy: the same device memory as x
        naive = [
            ("x.cpu().numpy()", lambda: x.cpu().numpy()),
            ("cupy.asnumpy(c)", lambda: cupy.asnumpy(c)),
        ]
    else:
        naive = [("x.clone().numpy()  (stands in for .cpu())", lambda: x.clone().numpy())]
    for name, call in naive:
        row, got = measure(name, call, expected, on_gpu)
        rows.append(row)
        del got

    result = Result(device=str(x.device), nbytes=n * 4, rows=rows)
    print_table(result, ring)
    print(f".npy file: {file_bytes:,} bytes (header {file_bytes - n * 4} bytes).")
    return result


if __name__ == "__main__":
    wrong = [row.method for row in main().rows if not row.matches]
    if wrong:
        sys.exit(f"wrong values from: {', '.join(wrong)}")
