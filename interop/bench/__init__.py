"""The benchmark behind ``python -m interop bench``: interop's calls against what people
write by hand and against the link's limit, as ratios measured in the same run. GPU rows
run where CuPy and PyTorch see a CUDA device; host rows wherever PyTorch is installed."""

from __future__ import annotations

from .results import SCHEMA, Ratio, write_json
from .rows import ROWS, RowSpec
from .run import collect_results, run_bench

__all__ = ["ROWS", "SCHEMA", "Ratio", "RowSpec", "collect_results", "run_bench", "write_json"]
