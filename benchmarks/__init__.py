"""interop's benchmark lab: for contributors, run from a checkout, not in the wheel.

One script per question, each ``python -m benchmarks.<script> [--quick] [--json PATH]``:
``host_limit`` (what bounds the staging ring), ``d2h`` (copy_to_host), ``h2d``
(copy_to_device), ``npy`` (save_npy), ``torch_op`` (what a call costs), ``dask_save``
(interop.dask.save_npy) and ``sweep`` (which settings). They share :mod:`benchmarks.lab`
(the runner, the report, diagnoses) and :mod:`benchmarks.targets` (the verdicts);
:mod:`benchmarks.keep` keeps a GPU run under ``benchmarks/results/``.
``python -m benchmarks {run,sweep,plot,keep}`` runs them from one command.
"""
