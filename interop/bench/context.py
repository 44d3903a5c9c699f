"""What the rows of one run share: sizes, a scratch directory, the GPU arrays, cache release."""

from __future__ import annotations

import ctypes
import gc
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from .. import _backends
from .measure import BenchSizes, Case, MiB, PeakRss


def log_done(command: str, name: str, status: str, began: float) -> None:
    """One line on stderr for a finished row: its status and seconds since ``began``."""
    took = time.perf_counter() - began
    print(f"{command}: {name} {status} ({took:.1f} s)", file=sys.stderr, flush=True)


class BenchContext:
    """What the rows share: ``sizes``, ``workdir`` (where file rows write), ``notes``
    (run-wide observations for the JSON) and the GPU arrays (made on first use)."""

    def __init__(self, sizes: BenchSizes, workdir: Path) -> None:
        self.sizes = sizes
        self.workdir = workdir
        self.notes: dict[str, Any] = {}
        self._gpu: GpuArrays | None = None

    def gpu(self) -> GpuArrays:
        """The shared GPU arrays, made on first use."""
        if self._gpu is None:
            self._gpu = GpuArrays(self.sizes.gpu_bytes)
            self.notes["pinned_pages_in_rss"] = self._gpu.pinned_in_rss
        return self._gpu

    def release(self) -> None:
        """Free what rows left behind: garbage, pooled blocks, staging rings."""
        gc.collect()
        if self._gpu is not None:
            self._gpu.release()

    def close_keeping_results(self) -> None:
        """Free the GPU arrays and every cache; a failure (a sticky CUDA error) is printed
        and kept in ``notes["close_error"]``, so the results measured stay."""
        try:
            gpu, self._gpu = self._gpu, None
            if gpu is not None:
                gpu.close()
            gc.collect()
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            self.notes["close_error"] = f"{type(exc).__name__}: {exc}"


class GpuArrays:
    """The GPU rows' sources, ``nbytes`` each: CuPy ``x``, torch ``t`` (same values) and a
    pinned copy ``ref``; NoDeviceError or BackendUnavailableError without a usable device."""

    def __init__(self, nbytes: int) -> None:
        self.cp = _backends.require_cupy_device()
        self.th = _backends.require_torch_cuda()
        n = nbytes // 4
        self.nbytes = n * 4
        self.x = self.cp.random.default_rng(0).random(n, dtype=self.cp.float32)
        self.t = self.th.from_dlpack(self.x).clone()  # torch's own memory
        self._pinned_mem = self.cp.cuda.alloc_pinned_memory(self.nbytes)
        self.ref = np.frombuffer(self._pinned_mem, np.float32, n)  # pinned, == x
        self.x.get(out=self.ref)
        self.sync()
        # Whether the driver counts page-locked memory in RSS: where it does not, the
        # host-memory figures of the GPU rows show pageable memory only.
        with PeakRss() as rss:
            ptr = int(self.cp.cuda.runtime.hostAlloc(64 * MiB, 0))
            ctypes.memset(ptr, 1, 64 * MiB)
        self.cp.cuda.runtime.freeHost(ptr)
        self.pinned_in_rss = None if rss.extra_bytes is None else rss.extra_bytes >= 32 * MiB

    def sync(self) -> None:
        """Wait for all work on the device (every stream)."""
        self.cp.cuda.Device().synchronize()

    def _memcpy_case(self, dst: int, src: int, kind: int) -> Case:
        stream = self.cp.cuda.get_current_stream
        runtime = self.cp.cuda.runtime
        return Case(
            lambda: runtime.memcpyAsync(dst, src, self.nbytes, kind, stream().ptr), self.nbytes
        )

    def d2h_limit_case(self) -> Case:
        """The whole array, device to pinned host, in one ``cudaMemcpyAsync`` (the link's limit)."""
        kind = self.cp.cuda.runtime.memcpyDeviceToHost
        return self._memcpy_case(self.ref.ctypes.data, self.x.data.ptr, kind)

    def h2d_limit_case(self, dst: Any) -> Case:
        """The whole array, pinned host to ``dst`` on the device, in one ``cudaMemcpyAsync``."""
        kind = self.cp.cuda.runtime.memcpyHostToDevice
        return self._memcpy_case(dst.data.ptr, self.ref.ctypes.data, kind)

    def release(self) -> None:
        """Empty CuPy's and PyTorch's pools and interop's staging rings."""
        from ..pipeline.ring import free_cached_rings

        gc.collect()
        self.sync()
        free_cached_rings()
        self.cp.get_default_memory_pool().free_all_blocks()
        self.cp.get_default_pinned_memory_pool().free_all_blocks()
        self.th.cuda.empty_cache()
        host_empty = getattr(self.th._C, "_host_emptyCache", None)  # torch's pinned cache
        if host_empty is not None:
            host_empty()

    def close(self) -> None:
        """Free the arrays and every cache."""
        self.sync()
        del self.x, self.t, self.ref, self._pinned_mem
        self.release()
