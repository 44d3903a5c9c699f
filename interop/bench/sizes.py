"""How big a benchmark run is: array sizes, loop counts and repeats, and the scale."""

from __future__ import annotations

import dataclasses
import math
import os

__all__ = ["GB", "GiB", "MiB", "BenchSizes", "scale_from_env"]

GB = 1e9
MiB = 1 << 20
GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class BenchSizes:
    """Array sizes, loop counts and repeats of one run.

    Attributes
    ----------
    repeats : int
        Timed repeats per figure (the median is reported).
    calls : int
        Calls per timed repeat of the per-call (microsecond) rows.
    host_bytes : int
        Size of the ``host_copy`` array.
    rss_bytes : int
        Size of the tensor saved by ``save_npy_rss``.
    gpu_bytes : int
        Size of the float32 arrays of the GPU rows.
    dask_bytes : int
        Size of the array saved by ``dask_save_npy`` on its cluster.
    scale : float
        The factor every size and loop count was multiplied by
        (``INTEROP_BENCH_SCALE``).
    """

    repeats: int
    calls: int
    host_bytes: int
    rss_bytes: int
    gpu_bytes: int
    dask_bytes: int
    scale: float = 1.0

    @classmethod
    def choose(cls, quick: bool, scale: float = 1.0) -> BenchSizes:
        """The sizes of a full run or of a ``--quick`` smoke run, multiplied by ``scale``.

        A full run moves 1 GiB float32 arrays on the GPU, 256 MiB in
        ``host_copy``, saves 768 MiB in ``save_npy_rss`` and 384 MiB in
        ``dask_save_npy``; a smoke run a quarter or less of that, with fewer
        repeats. Sizes stay multiples of
        4 KiB and at least 1 MiB; loop counts at least 100.

        Raises
        ------
        ValueError
            ``scale`` is not a positive finite number.
        """
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
            raise ValueError(f"expected a positive scale (got {scale!r})")
        if quick:
            repeats, calls, host, rss, gpu, dask = 3, 2000, 64 * MiB, 64 * MiB, 256 * MiB, 32 * MiB
        else:
            repeats, calls, host, rss, gpu, dask = 5, 20000, 256 * MiB, 768 * MiB, GiB, 384 * MiB

        def nbytes(n: int) -> int:  # a multiple of 4 KiB, at least 1 MiB
            return max(MiB, int(n * scale) // 4096 * 4096)

        return cls(
            repeats=repeats,
            calls=max(100, int(calls * scale)),
            host_bytes=nbytes(host),
            rss_bytes=nbytes(rss),
            gpu_bytes=nbytes(gpu),
            dask_bytes=nbytes(dask),
            scale=float(scale),
        )


def scale_from_env() -> float:
    """``INTEROP_BENCH_SCALE`` as a float (1.0 when unset or empty).

    Raises
    ------
    ValueError
        The variable is set to something other than a positive number.
    """
    raw = os.environ.get("INTEROP_BENCH_SCALE", "").strip()
    if not raw:
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"expected INTEROP_BENCH_SCALE to be a positive number (got {raw!r}); "
            "unset it or use e.g. 0.25"
        )
    return value
