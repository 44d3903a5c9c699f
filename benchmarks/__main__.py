"""``python -m benchmarks {run,sweep,plot,keep,tables} ...``: the lab's scripts from one command."""

from __future__ import annotations

import sys

USAGE = """\
usage: python -m benchmarks {run,sweep,plot,keep,tables} [-h] ...

interop's benchmark lab (run from the repository root).
  run     every script's rows in one run, judged: [--quick] [--json P] [--rows L] [--busy]
  sweep   throughput over chunk_bytes x host_threads x num_buffers; the defaults it suggests
  plot    draw bench and sweep JSON files into a PNG (needs matplotlib)
  keep    keep a GPU runner's results (scripts/gpu-check OUTDIR) in the repository
  tables  write the README's and docs' figure tables from the kept runs: [--check]

Each script also runs alone: python -m benchmarks.d2h --quick, and so on; -h says more."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m benchmarks``; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    command, rest = (argv[0], argv[1:]) if argv else ("", [])
    if command == "run":
        from benchmarks import lab

        return lab.main(lab.all_rows(), "benchmarks run", "every script's rows, judged", rest)
    if command in ("sweep", "plot"):
        from benchmarks import sweep

        return sweep.main(rest) if command == "sweep" else sweep.plot_main(rest)
    if command in ("keep", "tables"):
        from benchmarks import keep, tables

        return keep.main(rest) if command == "keep" else tables.main(rest)
    print(USAGE, file=sys.stdout if command in ("-h", "--help") else sys.stderr)
    return 0 if command in ("-h", "--help") else 2


if __name__ == "__main__":
    sys.exit(main())
