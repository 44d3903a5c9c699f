"""The benchmark's rows: what each measures, its target in words, and the function that runs it.

Host rows (:mod:`.host`) run on any machine with PyTorch; GPU rows
(:mod:`.gpu`) where CuPy and PyTorch both see a CUDA device. A row function
returns measured fields only; whether it met its target follows from the
targets carried by its ratios (:mod:`interop.bench.ratios`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..context import BenchContext

__all__ = ["ROWS", "RowSpec"]


@dataclasses.dataclass(frozen=True)
class RowSpec:
    """One row of the benchmark.

    Attributes
    ----------
    name : str
        The row's name in the table and the JSON.
    what : str
        What it measures, in words.
    target : str
        Its target in words (the judged form is in the ratios it returns).
    needs : tuple of str
        The ``interop`` functions the row measures; missing ones make the row
        ``"not available"``.
    gpu : bool
        Needs a CUDA device visible to both CuPy and PyTorch.
    run : callable
        Measures the row; returns its fields.
    figure : str
        What the report shows first: ``"gbps"``, ``"us"`` or ``"memory"``.
    unavailable : callable, optional
        Says why the row cannot run in this installation (an optional
        library missing), or returns None when it can; a reason makes the
        row ``"not available"`` with it.
    """

    name: str
    what: str
    target: str
    needs: tuple[str, ...]
    gpu: bool
    run: Callable[[BenchContext], dict[str, Any]]
    figure: str = "gbps"
    unavailable: Callable[[], str | None] | None = None


def _rows() -> tuple[RowSpec, ...]:
    from . import dask_save, gpu, host

    return (
        RowSpec(
            "to_numpy_us",
            "interop.to_numpy(small CPU tensor), per call",
            "at most 2x the time of numpy.from_dlpack",
            ("to_numpy",),
            False,
            host.to_numpy_us,
            "us",
        ),
        RowSpec(
            "to_torch_us",
            "interop.to_torch(small NumPy array), per call",
            "at most 2x the time of torch.from_dlpack",
            ("to_torch",),
            False,
            host.to_torch_us,
            "us",
        ),
        RowSpec(
            "host_copy",
            "copy_to_host(cpu_tensor, out)",
            "at least 1.0x the throughput of one numpy.copyto",
            ("copy_to_host",),
            False,
            host.host_copy,
        ),
        RowSpec(
            "save_npy_rss",
            "peak extra RSS while saving a CPU tensor with save_npy (fresh process)",
            "extra RSS at most 2 x num_buffers x chunk_bytes",
            ("save_npy",),
            False,
            host.save_npy_rss,
            "memory",
        ),
        RowSpec(
            "dask_save_npy",
            "interop.dask.save_npy of NumPy blocks persisted on a distributed.LocalCluster "
            "of 2 worker processes (1 thread each)",
            "at least 1x the throughput of da.store into an open_memmap and of "
            "da.to_npy_stack; peak extra RSS per worker at most one block + "
            "2 x num_buffers x chunk_bytes",
            (),
            False,
            dask_save.dask_save_npy,
            unavailable=dask_save.cluster_unavailable,
        ),
        RowSpec(
            "d2h_limit",
            "one cudaMemcpyAsync of the whole array into a pinned buffer",
            "none: the link's device-to-host limit, a reference for other rows",
            (),
            True,
            gpu.d2h_limit,
        ),
        RowSpec(
            "d2h_prealloc",
            "copy_to_host(x, out), out pageable and already touched",
            "at least 0.90x the throughput of d2h_limit",
            ("copy_to_host",),
            True,
            gpu.d2h_prealloc,
        ),
        RowSpec(
            "d2h_fresh",
            "copy_to_host(x), allocating out",
            "at least 2x the throughput of cupy.asnumpy(x) and of t.cpu().numpy()",
            ("copy_to_host",),
            True,
            gpu.d2h_fresh,
        ),
        RowSpec(
            "d2h_strided",
            "copy_to_host(x.T, out), transposed source (CuPy and torch)",
            "at least 0.80x the throughput of d2h_prealloc; "
            "extra device memory at most num_buffers x chunk_bytes",
            ("copy_to_host",),
            True,
            gpu.d2h_strided,
        ),
        RowSpec(
            "h2d_limit",
            "one cudaMemcpyAsync of the whole array from a pinned buffer",
            "none: the link's host-to-device limit, a reference for other rows",
            (),
            True,
            gpu.h2d_limit,
        ),
        RowSpec(
            "h2d_pageable",
            "copy_to_device(host), host pageable",
            "at least 0.90x the throughput of h2d_limit; "
            "extra host memory at most num_buffers x chunk_bytes",
            ("copy_to_device",),
            True,
            gpu.h2d_pageable,
        ),
        RowSpec(
            "exchange_us",
            "to_cupy(t) / to_torch(c) per call, small CUDA arrays",
            "at most 1.5x the time of cupy.from_dlpack(t) / torch.from_dlpack(c)",
            ("to_cupy", "to_torch"),
            True,
            gpu.exchange_us,
            "us",
        ),
        RowSpec(
            "save_npy",
            "save_npy(device array, path)",
            "at least 0.80x the throughput of min(d2h_limit, sequential file write)",
            ("save_npy",),
            True,
            gpu.save_npy,
        ),
        RowSpec(
            "dask_save_npy_cupy",
            "interop.dask.save_npy of CuPy blocks on the threaded scheduler (2 threads)",
            "at least 1x the throughput of cupy.asnumpy + numpy.save per block; "
            "extra host RSS at most 2 threads x 2 x num_buffers x chunk_bytes",
            (),
            True,
            dask_save.dask_save_npy_cupy,
            unavailable=dask_save.dask_unavailable,
        ),
    )


#: Every row, in the order a run measures them.
ROWS: tuple[RowSpec, ...] = _rows()
