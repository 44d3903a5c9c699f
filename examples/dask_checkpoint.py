"""Checkpoint a dask array to one ``.npy`` file and load it back, on the workers.

With a GPU the array is made of CuPy blocks (each on its worker's device),
without one of NumPy blocks (the script says so); the calls are the same.
Each worker writes the blocks it holds at their offsets in one standard
``.npy`` file (nothing is gathered on this process, device blocks stream
through interop's pinned staging ring), and the loaded array's blocks are read
by the workers straight from the file.

Run::

    python examples/dask_checkpoint.py                 # 32 MiB, 2 worker processes
    python examples/dask_checkpoint.py --full          # 4 GiB of float32
    python examples/dask_checkpoint.py --workers 0     # dask's threaded scheduler
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import interop
from interop.info import install_command
from interop.io.npy import read_npy_header

try:
    import dask.array as da

    import interop.dask
except ImportError as exc:  # an optional dependency: say what to install
    sys.stderr.write(
        f"{__file__}: this example needs dask ({exc}).\n"
        f"Install it with: {install_command('dask')}\n"
    )
    raise SystemExit(2) from None

FULL = (32768, 32768)  # 4 GiB of float32


def _gpu_status() -> str | None:
    """None where CuPy sees a CUDA device, else the reason."""
    try:
        import cupy

        if int(cupy.cuda.runtime.getDeviceCount()) > 0:
            return None
        return "CuPy sees no CUDA device"
    except Exception as exc:  # not installed, no driver, no device
        return f"CuPy is not usable ({type(exc).__name__})"


def _scheduler(workers: int) -> contextlib.AbstractContextManager[Any]:
    if workers == 0:
        import dask

        return dask.config.set(scheduler="threads")
    try:
        from distributed import Client, LocalCluster
    except ImportError as exc:  # an optional dependency: say what to install
        sys.stderr.write(
            f"{__file__}: worker processes need distributed ({exc}).\n"
            f"Install it with: {install_command('dask')}, "
            "or run on threads: --workers 0\n"
        )
        raise SystemExit(2) from None

    stack = contextlib.ExitStack()
    cluster = stack.enter_context(
        LocalCluster(n_workers=workers, threads_per_worker=1, dashboard_address=None)
    )
    stack.enter_context(Client(cluster))
    return stack


def _digest(block: Any, block_info: Any = None) -> np.ndarray:
    """A 64-bit digest of a float32 block's bits and their places in the whole
    array, and whether the block is on a GPU: a ``(1, 1, 2)`` NumPy block.

    Computed on the worker that holds the block (CuPy blocks stay there:
    ``distributed`` moves them between processes only with numba or RMM
    installed). The digests of all blocks add up (mod 2**64) to the same total
    however the array is chunked, so two arrays of different chunks compare.
    """
    xp = np if isinstance(block, np.ndarray) else __import__("cupy")
    (r0, r1), (c0, c1) = block_info[0]["array-location"]
    ncols = block_info[0]["shape"][1]
    rows = xp.arange(r0, r1, dtype=xp.uint64)[:, None]
    cols = xp.arange(c0, c1, dtype=xp.uint64)[None, :]
    place = (rows * xp.uint64(ncols) + cols) * xp.uint64(0x9E3779B97F4A7C15)
    bits = xp.ascontiguousarray(block).view(xp.uint32).astype(xp.uint64)
    mixed = (bits ^ place) * xp.uint64(0xBF58476D1CE4E5B9)  # wraps mod 2**64
    return np.array([[[int(mixed.sum()), int(xp is not np)]]], dtype=np.uint64)


def _checked(x: Any) -> tuple[int, bool]:
    """The digest of a 2-d float32 dask array and whether all its blocks are on a GPU."""
    parts = x.map_blocks(
        _digest, new_axis=2, chunks=((1,) * x.numblocks[0], (1,) * x.numblocks[1], (2,)),
        dtype=np.uint64, meta=np.empty((0, 0, 0), np.uint64),
    ).compute()  # fmt: skip
    with np.errstate(over="ignore"):
        return int(parts[..., 0].sum(dtype=np.uint64)), bool(parts[..., 1].all())


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Save a float32 dask array, load it back, compare on the workers; return
    what was checked (block type, shape, file size, equality, throughput)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=2048)
    parser.add_argument("--workers", type=int, default=2, help="worker processes (0: threads)")
    parser.add_argument("--dir", default=None, help="where the checkpoint is written")
    parser.add_argument("--cpu", action="store_true", help="NumPy blocks even with a GPU")
    parser.add_argument("--full", action="store_true", help=f"{FULL[0]} x {FULL[1]} (4 GiB)")
    args = parser.parse_args(argv)
    rows, cols = FULL if args.full else (args.rows, args.cols)
    why = "--cpu was given" if args.cpu else _gpu_status()
    if why is not None:
        print(f"NumPy blocks: {why}")
    with _scheduler(args.workers), tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        x = da.random.default_rng(0).standard_normal((rows, cols), chunks=(rows // 4, cols // 2))
        x = x.astype(np.float32)
        if why is None:
            import cupy

            x = x.map_blocks(cupy.asarray)  # CuPy blocks, made on the workers
        x = x.persist()  # made before the clock starts
        start = time.perf_counter()
        path = interop.dask.save_npy(x, Path(tmp) / "checkpoint.npy")
        seconds = time.perf_counter() - start
        header = read_npy_header(path)
        back = interop.dask.load_npy(path, chunks=(rows // 8, cols), device=None if why else "cuda")
        # compared on the workers, through digests: no block leaves its worker
        (saved, _), (loaded, on_gpu) = _checked(x), _checked(back)
        equal = saved == loaded
    result = {
        "blocks": "cupy.ndarray" if on_gpu else "numpy.ndarray",
        "shape": tuple(back.shape),
        "file_bytes": header.offset + header.nbytes,
        "equal": equal,
        "save_gbps": header.nbytes / seconds / 1e9,
    }
    print(f"{'blocks':<12}{result['blocks']}")
    print(f"{'shape':<12}{result['shape']}")
    print(f"{'file':<12}{result['file_bytes'] / 2**20:.1f} MiB")
    print(f"{'save':<12}{result['save_gbps']:.2f} GB/s")
    print(f"{'round trip':<12}{'equal' if equal else 'DIFFERENT'}")
    return result


if __name__ == "__main__":
    if not main()["equal"]:
        sys.exit("the array read back differs from the one saved")
