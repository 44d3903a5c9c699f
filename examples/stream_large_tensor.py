"""Stream an array too large for comfort through bounded memory.

Saves a tensor to a ``.npy`` file chunk by chunk (peak extra host memory is the
staging ring, not the tensor), reads it back chunk by chunk, and copies it into
a preallocated host buffer with a progress bar. On a GPU machine the tensor
lives on the device; elsewhere the same calls run on the host engine.

Run: ``python examples/stream_large_tensor.py [MiB] [DIR]``. The tests run
``main()`` with a small size.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

import interop


def main(mib: int = 256, directory: str | None = None, progress: bool = True) -> dict[str, object]:
    """Round-trip ``mib`` MiB of float32 through a file; return what was checked."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n = mib * (1 << 20) // 4
    x = torch.arange(n, dtype=torch.float32, device=device).reshape(-1, 1024)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        path = interop.save_npy(x, Path(tmp) / "big.npy", progress=progress)
        header = interop.npy.read_npy_header(path)
        target = "cpu" if device == "cpu" else None
        back = interop.load_npy(path, device=target, progress=progress)
        host = np.empty(tuple(x.shape), np.float32)  # preallocated, e.g. a memmap
        interop.copy_to_host(x.T.T, host, progress=progress)
        back_host = interop.to_numpy(back)
        same = bool(np.array_equal(back_host, host))
    result = {
        "device": device,
        "shape": tuple(x.shape),
        "file_bytes": header.offset + header.nbytes,
        "round_trip_equal": same,
        "last": float(host[-1, -1]),
    }
    print(result)
    return result


if __name__ == "__main__":
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    main(size, sys.argv[2] if len(sys.argv) > 2 else None)
