"""interop's benchmark lab: for contributors, not shipped in the wheel.

``python -m interop bench`` (the package ``interop.bench``) measures the calls
users make against what they would write instead. The lab builds on it:

- :mod:`benchmarks.lab`: a run of the package's rows with their diagnoses
  (:mod:`benchmarks.diagnostics`), the lab's own rows (:mod:`benchmarks.host_limit`,
  :mod:`benchmarks.dask_save`, ``torch_op_us``), judged against
  :mod:`benchmarks.targets`, reported by :mod:`benchmarks.report`;
- :mod:`benchmarks.sweep`: throughput over ``chunk_bytes`` x ``host_threads`` x
  ``num_buffers``, and the defaults it suggests;
- :mod:`benchmarks.plot`: a PNG of bench and sweep results (matplotlib);
- :mod:`benchmarks.keep_results`: a GPU runner's results kept under
  ``benchmarks/results/``, with the report for the docs.

Entry point: ``python -m benchmarks {run,sweep,plot,keep}``, from the repository root.
"""
