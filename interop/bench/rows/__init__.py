"""The rows of ``python -m interop bench``: host rows (:mod:`.host`) run wherever PyTorch is
installed, GPU rows (:mod:`.gpu`) where CuPy and PyTorch both see a CUDA device."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import gpu, host

if TYPE_CHECKING:
    from ..context import BenchContext


@dataclasses.dataclass(frozen=True)
class RowSpec:
    """One row: its ``name``, ``what`` it measures in words, whether it needs a ``gpu``,
    the function that measures it (``run``, returning the row's fields), the ``figure``
    the table shows first (``"gbps"``, ``"us"`` or ``"memory"``), and optionally
    ``unavailable``, which says why the row cannot run in this installation or None."""

    name: str
    what: str
    gpu: bool
    run: Callable[[BenchContext], dict[str, Any]]
    figure: str = "gbps"
    unavailable: Callable[[], str | None] | None = None


_RSS = "peak extra RSS while saving a CPU tensor with save_npy (fresh process)"
_H2D = "one cudaMemcpyAsync of the array from pinned memory"

#: Every row, in the order a run measures them.
ROWS: tuple[RowSpec, ...] = (
    RowSpec("to_numpy_us", "to_numpy(small CPU tensor), per call", False, host.to_numpy_us, "us"),
    RowSpec("to_torch_us", "to_torch(small NumPy array), per call", False, host.to_torch_us, "us"),
    RowSpec("host_copy", "copy_to_host(cpu_tensor, out)", False, host.host_copy),
    RowSpec("host_fresh", "copy_to_host(cpu_tensor), allocating out", False, host.host_fresh),
    RowSpec("save_npy_rss", _RSS, False, host.save_npy_rss, "memory"),
    RowSpec("d2h_limit", "one cudaMemcpyAsync of the array to pinned memory", True, gpu.d2h_limit),
    RowSpec("d2h_prealloc", "copy_to_host(x, out), out pageable, touched", True, gpu.d2h_prealloc),
    RowSpec("d2h_pinned", "copy_to_host(x, out), out pinned (empty_pinned)", True, gpu.d2h_pinned),
    RowSpec("d2h_fresh", "copy_to_host(x), allocating out", True, gpu.d2h_fresh),
    RowSpec("d2h_strided", "copy_to_host(x.T, out), transposed source", True, gpu.d2h_strided),
    RowSpec("h2d_limit", _H2D, True, gpu.h2d_limit),
    RowSpec("h2d_pageable", "copy_to_device(host), host pageable", True, gpu.h2d_pageable),
    RowSpec("h2d_pinned", "copy_to_device(host), host pinned (empty_pinned)", True, gpu.h2d_pinned),
    RowSpec("exchange_us", "to_cupy(t) / to_torch(c) per call", True, gpu.exchange_us, "us"),
    RowSpec("save_npy", "save_npy(device array, path)", True, gpu.save_npy),
)
