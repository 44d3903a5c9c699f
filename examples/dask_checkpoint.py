"""Checkpoint a dask array to one ``.npy`` file and load it back, on the workers.

With a GPU the array is made of CuPy blocks (each on its worker's device),
without one of NumPy blocks; the calls are the same. Each worker writes the
blocks it holds at their offsets in the file (nothing is gathered on this
process), and the loaded array's blocks are read by the workers.

Run: ``python examples/dask_checkpoint.py [ROWS] [COLS] [WORKERS] [DIR]``;
``WORKERS=0`` uses dask's threaded scheduler instead of a local cluster of
worker processes. The tests run ``main()`` with a small size.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path

import dask.array as da
import numpy as np

import interop
import interop.dask


def _blocks_on_gpu() -> bool:
    """True where CuPy sees a CUDA device."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:  # not installed, no driver, no device
        return False


def _cluster(workers: int) -> contextlib.AbstractContextManager[object]:
    if workers == 0:
        import dask

        return dask.config.set(scheduler="threads")
    from distributed import Client, LocalCluster

    stack = contextlib.ExitStack()
    cluster = stack.enter_context(
        LocalCluster(n_workers=workers, threads_per_worker=1, dashboard_address=None)
    )
    stack.enter_context(Client(cluster))
    return stack


def main(
    directory: str | None = None, rows: int = 8192, cols: int = 4096, workers: int = 2
) -> dict[str, object]:
    """Save a ``rows x cols`` float32 dask array, load it back, compare."""
    gpu = _blocks_on_gpu()
    with _cluster(workers), tempfile.TemporaryDirectory(dir=directory) as tmp:
        x = da.random.default_rng(0).standard_normal((rows, cols), chunks=(rows // 4, cols // 2))
        x = x.astype(np.float32)
        if gpu:
            import cupy

            x = x.map_blocks(cupy.asarray)  # CuPy blocks, made on the workers
        path = interop.dask.save_npy(x, Path(tmp) / "checkpoint.npy")
        header = interop.npy.read_npy_header(path)
        back = interop.dask.load_npy(path, chunks=(rows // 8, cols), device="cuda" if gpu else None)
        equal = bool((back == x).all().compute())  # compared on the workers
        first = back.blocks[0, 0].compute()
        result = {
            "blocks": f"{type(first).__module__.split('.')[0]}.{type(first).__name__}",
            "shape": tuple(back.shape),
            "file_bytes": header.offset + header.nbytes,
            "equal": equal,
        }
    print(result)
    return result


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        args[3] if len(args) > 3 else None,
        int(args[0]) if args else 8192,
        int(args[1]) if len(args) > 1 else 4096,
        int(args[2]) if len(args) > 2 else 2,
    )
