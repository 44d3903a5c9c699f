"""``python -m benchmarks {run,sweep,plot,keep}``: the benchmark lab's command line."""

from __future__ import annotations

import argparse
import sys

DESCRIPTION = """\
interop's benchmark lab (run from the repository root).
  run     every row of python -m interop bench with its diagnoses, plus host_limit,
          dask_save_npy, dask_save_npy_cupy and torch_op_us, judged against targets
  sweep   throughput of d2h_prealloc, h2d_pageable (GPU) and host_copy over
          chunk_bytes x host_threads x num_buffers, and the defaults it suggests
  plot    draw bench and sweep JSON files into a PNG (needs matplotlib)
  keep    keep a GPU runner's results (scripts/gpu-check OUTDIR) in the repository"""

EPILOG = """\
environment variables:
  INTEROP_BENCH_SCALE   multiplies every array size and loop count (default 1).
                        At scale 1 the GPU rows move 1 GiB float32 arrays,
                        host_copy copies 256 MiB and save_npy_rss saves 768 MiB;
                        --quick uses a quarter of that or less.
  INTEROP_BENCH_DIR     where the file rows write (default: the system
                        temporary directory); point it at the disk you use.
  INTEROP_CHUNK_BYTES, INTEROP_NUM_BUFFERS, INTEROP_HOST_THREADS
                        interop's transfer settings: run measures with them and
                        reports them; the sweep varies them itself

exit status: 0 when every row ran or was skipped for a stated reason (a missed
target is a result, not a failure); 1 when a row or sweep point raised or
returned wrong data (its traceback is on stderr), or keep refused the results;
2 for bad arguments.

examples:
  python -m benchmarks run --quick
  python -m benchmarks run --json results/bench.json
  python -m benchmarks sweep --json results/sweep.json
  python -m benchmarks plot results/throughput.png results/*.json
  python -m benchmarks keep /tmp/gpu-check > /tmp/report.md"""


def _positive_ints(text: str) -> list[int]:
    """``"4,8,16"`` -> ``[4, 8, 16]``."""
    try:
        values = [int(part, 0) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of positive integers, e.g. 4,8,16 (got {text!r})"
        )
    return values


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds (got {text!r})")
    return value


def parser() -> argparse.ArgumentParser:
    """The command line's parser."""
    top = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = top.add_subparsers(dest="command", required=True)
    quick = "a smoke run: small sizes, few repeats; checks that every row runs, judges nothing"
    run = sub.add_parser("run", help="every row, judged against its targets")
    run.add_argument("--quick", action="store_true", help=quick)
    run.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    run.add_argument("--rows", type=_names, metavar="LIST", help="only these rows")
    sweep = sub.add_parser("sweep", help="throughput over chunk_bytes x host_threads x num_buffers")
    sweep.add_argument("--quick", action="store_true", help=quick)
    sweep.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    sweep.add_argument(
        "--chunk-mib",
        type=_positive_ints,
        metavar="LIST",
        help="chunk sizes in MiB (default 4,8,16,32,64,128; --quick 8,32; "
        "each default list also has the current setting)",
    )
    sweep.add_argument(
        "--host-threads",
        type=_positive_ints,
        metavar="LIST",
        help="host thread counts (default powers of two up to the core count, and the count)",
    )
    sweep.add_argument(
        "--num-buffers",
        type=_positive_ints,
        metavar="LIST",
        help="staging buffer counts (default 2,3,4,6; --quick 2,4)",
    )
    sweep.add_argument(
        "--rows", type=_names, metavar="LIST", help="default host_copy,d2h_prealloc,h2d_pageable"
    )
    sweep.add_argument(
        "--max-seconds",
        type=_seconds,
        metavar="S",
        help="time budget: points not started within it are listed as not run",
    )
    plot = sub.add_parser("plot", help="draw bench and sweep JSON files into a PNG")
    plot.add_argument("png", metavar="PNG")
    plot.add_argument("inputs", nargs="+", metavar="JSON", help="bench or sweep results")
    # listed for the help; main() hands keep's arguments to its own parser
    sub.add_parser("keep", help="keep a GPU runner's results in the repository")
    return top


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m benchmarks``; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["keep"]:  # its own parser reads the rest, --help included
        from benchmarks.keep_results import main as keep

        return keep(argv[1:])
    args = parser().parse_args(argv)
    if args.command == "run":
        from benchmarks.lab import run_lab

        return run_lab(quick=args.quick, json_path=args.json, rows=args.rows)
    if args.command == "sweep":
        from benchmarks.sweep import run_sweep

        grid: dict[str, list[int]] = {}
        if args.chunk_mib:
            grid["chunk_bytes"] = [n << 20 for n in args.chunk_mib]
        if args.host_threads:
            grid["host_threads"] = args.host_threads
        if args.num_buffers:
            grid["num_buffers"] = args.num_buffers
        return run_sweep(
            quick=args.quick,
            json_path=args.json,
            grid=grid,
            max_seconds=args.max_seconds,
            rows=args.rows,
        )
    if args.command == "plot":
        from benchmarks.plot import run_plot

        return run_plot(args.png, args.inputs)
    raise AssertionError(f"unknown command {args.command!r}")  # argparse refused it


if __name__ == "__main__":
    sys.exit(main())
