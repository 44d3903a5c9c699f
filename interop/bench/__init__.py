"""The benchmark behind ``python -m interop bench``.

Every figure is reported beside anchors measured in the same run (what people
write by hand, and the link's limit), as ratios, so a result holds on a noisy
machine. GPU rows run where CuPy and PyTorch both see a CUDA device; host rows
anywhere PyTorch is installed. Modules, in the order a run uses them:
:mod:`~interop.bench.measure` (sizes, timers, peak memory),
:mod:`~interop.bench.context` (what rows share), :mod:`~interop.bench.rows`,
:mod:`~interop.bench.run`, :mod:`~interop.bench.results` (ratios, the run's
header and machine, the JSON) and :mod:`~interop.bench.report`.
"""

from __future__ import annotations

from .results import SCHEMA, Ratio, write_json
from .rows import ROWS, RowSpec
from .run import collect_results, run_bench

__all__ = ["ROWS", "SCHEMA", "Ratio", "RowSpec", "collect_results", "run_bench", "write_json"]
