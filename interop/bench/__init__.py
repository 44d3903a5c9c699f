"""The benchmark behind ``python -m interop bench``.

Every figure is reported beside anchors measured in the same run, as ratios,
so a result holds on a noisy machine. GPU rows run only where CuPy and
PyTorch both see a CUDA device; host rows run anywhere PyTorch is installed.
A row whose interop function is missing from this build is reported as
``"not available"``, never faked.

The modules, in the order a run uses them:

- :mod:`~interop.bench.sizes`: array sizes, loop counts, ``INTEROP_BENCH_SCALE``;
- :mod:`~interop.bench.measure`: timers, peak host and device memory, checked first calls;
- :mod:`~interop.bench.context`: what rows share (GPU arrays, cache release);
- :mod:`~interop.bench.rows`: one function per row (host and GPU) and the table of rows;
- :mod:`~interop.bench.ratios`: ratios with their direction, targets and the verdict;
- :mod:`~interop.bench.run`: runs the rows; :mod:`~interop.bench.results`: the JSON;
- :mod:`~interop.bench.report`: the printed report;
- :mod:`~interop.bench.sweep`: throughput over ``chunk_bytes`` x ``host_threads`` x
  ``num_buffers``;
- :mod:`~interop.bench.plot`: a PNG from bench and sweep results (matplotlib).
"""

from __future__ import annotations

from .measure import PeakRss, WrongResultError
from .ratios import Ratio
from .report import format_table
from .results import SCHEMA, write_json
from .rows import ROWS, RowSpec
from .run import collect_results, run_bench
from .sizes import BenchSizes
from .sweep import run_sweep

__all__ = [
    "ROWS",
    "SCHEMA",
    "BenchSizes",
    "PeakRss",
    "Ratio",
    "RowSpec",
    "WrongResultError",
    "collect_results",
    "format_table",
    "run_bench",
    "run_sweep",
    "write_json",
]
