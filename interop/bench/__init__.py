"""The benchmark behind ``python -m interop bench``: interop's calls against what people
write by hand and against the link's limit, as ratios measured in the same run. GPU rows
run where CuPy and PyTorch see a CUDA device; host rows wherever PyTorch is installed."""

from __future__ import annotations

from .rows import ROWS
from .run import SCHEMA, collect_results, run_bench, write_json

__all__ = ["ROWS", "SCHEMA", "collect_results", "run_bench", "write_json"]
