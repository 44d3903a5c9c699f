"""The ``emulated_overlap`` row: how well the slot pipeline overlaps its DMAs
with its host copies, measured on a CPU through the emulated device.

The emulated device's link runs at a set rate
(``interop.testing.EmulatedDevice(link_gbps=...)``): each DMA is a memcpy on
the stream's thread, then a wait for the rest of the link's time. The host
copies run at this machine's own speed. Timed in one run, interleaved:

- ``link``: the array's bytes at the emulated rate, or one thread's memcpy of
  the array where that is longer (the emulated DMA is such a memcpy);
- ``host stage``: the pipeline's host side alone, as ``host_limit`` measures
  it: whole chunks from a slot per thread into ``out``, by the same number of
  threads;
- ``copy_to_host(x, out)``: the pipeline through the ring.

A pipeline that overlaps perfectly takes ``max(link, host stage)`` plus one
chunk's copy; one that does not, ``link + host stage``. The row reports
``copy_to_host``'s throughput over that of ``max(link, host stage)``
(1.0: perfect) and ``overlap``, the share of the shorter stage hidden behind
the longer one. Meaningful where the link is well below one thread's memcpy
rate and the machine has a core for the stream besides the host threads;
on a 2-core machine that is a link of a few GB/s.
"""

from __future__ import annotations

import statistics
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

import interop
from benchmarks.host_limit import threaded_copies
from interop.bench.measure import Case, MiB, WrongResultError
from interop.bench.measure import measure as timed
from interop.bench.results import Ratio
from interop.bench.rows import BenchContext
from interop.testing import EmulatedDevice

#: The emulated link's rate, GB/s: below one thread's memcpy on small machines.
LINK_GBPS = 2.0
#: The pipeline's settings for the row: a few slots, two host threads.
SETTINGS = {"chunk_bytes": 8 * MiB, "num_buffers": 4, "host_threads": 2}


def measure(
    nbytes: int, *, link_gbps: float = LINK_GBPS, repeats: int = 5, **settings: int
) -> dict[str, float]:
    """Seconds of the link, the host stage and the pipeline (medians of
    ``repeats``, interleaved, each first call checked) for an ``nbytes``
    float64 array; see the module."""
    settings = SETTINGS | settings
    chunk, threads = settings["chunk_bytes"], settings["host_threads"]
    dev = EmulatedDevice(link_gbps=link_gbps)
    host = np.random.default_rng(0).random(nbytes // 8)
    x = dev.asarray(host)
    out = np.zeros_like(host)  # touched, as d2h_prealloc's out

    def pipeline() -> np.ndarray:
        with interop.config.set(**settings):
            return interop.copy_to_host(x, out)

    def right(got: np.ndarray) -> None:
        if not np.array_equal(got, host):
            raise WrongResultError("copy_to_host through the emulated link gave wrong values")

    with ThreadPoolExecutor(threads) as pool:
        got = timed(
            {
                "memcpy": Case(lambda: np.copyto(out, host), nbytes),
                # as host_limit measures the ring's host side: whole chunks, a slot per thread
                "host stage": threaded_copies(
                    pool, threads, out.reshape(-1).view(np.uint8),
                    np.ones(threads * chunk, np.uint8), chunk, to_flat=True,
                ),
                "copy_to_host(x, out)": Case(pipeline, nbytes, right),
            },
            repeats,
        )  # fmt: skip
    seconds = {label: statistics.median(m.seconds) for label, m in got.items()}
    return {
        "link": max(nbytes / (link_gbps * 1e9), seconds.pop("memcpy")),
        **seconds,
    }


def emulated_overlap(ctx: BenchContext) -> dict[str, Any]:
    """The row (see the module): the pipeline's throughput over the ideal
    overlap's, and the share of the shorter stage it hid."""
    nbytes = min(ctx.sizes.host_bytes, 256 * MiB)
    s = measure(nbytes, repeats=ctx.sizes.repeats)
    link, host, pipe = s["link"], s["host stage"], s["copy_to_host(x, out)"]
    gbps = {k: nbytes / v / 1e9 for k, v in s.items()}
    ideal = nbytes / max(link, host) / 1e9
    return {
        "size": f"{nbytes / MiB:.0f} MiB float64, emulated link {LINK_GBPS:g} GB/s",
        "settings": SETTINGS,
        "gbps": gbps["copy_to_host(x, out)"],
        "anchors": {f"{k} GB/s": v for k, v in gbps.items() if k != "copy_to_host(x, out)"},
        "overlap": (link + host - pipe) / min(link, host),
        "ratios": [
            Ratio.between(
                "copy_to_host(x, out)", "throughput", "max(link, host stage)",
                gbps["copy_to_host(x, out)"], ideal,
            ),
            Ratio.between(
                "copy_to_host(x, out)", "throughput", "link + host stage, one after the other",
                gbps["copy_to_host(x, out)"], nbytes / (link + host) / 1e9,
            ),
        ],
    }  # fmt: skip
