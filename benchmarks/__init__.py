"""interop's benchmark lab, for contributors, from a checkout; ``python -m benchmarks -h``."""
