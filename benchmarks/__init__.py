"""interop's benchmark lab, for contributors, run from a checkout (not in the wheel): one
script per question over :mod:`benchmarks.lab`, verdicts in :mod:`benchmarks.targets`, the
docs' tables from the kept runs by :mod:`benchmarks.tables`; ``python -m benchmarks -h``
lists the commands.
"""
