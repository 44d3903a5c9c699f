"""Command line of interop: ``python -m interop {info,bench}``."""

from __future__ import annotations

import argparse
import json
import sys

DESCRIPTION = (
    "interop: zero-copy exchange and chunked transfers between PyTorch, CuPy and NumPy. "
    "'info' shows versions and devices; 'bench' measures interop against the usual ways."
)

BENCH_DESCRIPTION = """\
Measure interop's exchange and transfer calls against what people write by hand
(numpy.from_dlpack, cupy.asnumpy, t.cpu(), cupy.asarray, numpy.copyto, ...).
Every figure is a ratio to an anchor measured in the same run, so it holds on a
noisy machine. Host rows run anywhere PyTorch is installed; GPU rows where CuPy
and PyTorch both see a CUDA device (elsewhere they are listed as skipped).

Three modes:
  (default)    every row, a report, and with --json PATH the results as JSON
  --sweep      throughput of d2h_prealloc, h2d_pageable (GPU) and host_copy over
               chunk_bytes x host_threads x num_buffers
  --plot PNG   draw bench and sweep JSON files into a PNG (needs matplotlib)"""

BENCH_EPILOG = """\
environment variables:
  INTEROP_BENCH_SCALE   multiplies every array size and loop count (default 1).
                        At scale 1 the GPU rows move 1 GiB float32 arrays,
                        host_copy copies 256 MiB and save_npy_rss saves 768 MiB;
                        --quick uses a quarter of that or less. 0.25 makes a
                        faster run, 4 moves 4 GiB GPU arrays.
  INTEROP_BENCH_DIR     where the file rows write (default: the system
                        temporary directory); point it at the disk you use.
  INTEROP_CHUNK_BYTES   bytes per chunk (one staging buffer) of a transfer
  INTEROP_NUM_BUFFERS   staging buffers in the ring
  INTEROP_HOST_THREADS  threads copying between staging buffers and host memory
                        (the bench runs with these settings and reports them;
                        the sweep varies them itself)

exit status: 0 when every row ran or was skipped for a stated reason (a missed
target is a result, not a failure); 1 when a row or sweep point raised or
returned wrong data (its traceback is on stderr); 2 for bad arguments.

examples:
  python -m interop bench --quick
  python -m interop bench --json results/bench.json
  python -m interop bench --sweep --json results/sweep.json
  python -m interop bench --plot results/throughput.png results/*.json"""

_SWEEP_OPTIONS = ("chunk_mib", "host_threads", "num_buffers", "rows", "max_seconds")


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


def _bench_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    bench = sub.add_parser(
        "bench",
        help="benchmark exchange and transfers against the usual ways; sweep settings; plot",
        description=BENCH_DESCRIPTION,
        epilog=BENCH_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: small sizes, few repeats; checks that every row runs, judges no target",
    )
    bench.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    sweep = bench.add_argument_group("sweep")
    sweep.add_argument(
        "--sweep",
        action="store_true",
        help="measure throughput over chunk_bytes x host_threads x num_buffers instead",
    )
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
        "--rows",
        type=_names,
        metavar="LIST",
        help="rows to sweep (default host_copy,d2h_prealloc,h2d_pageable)",
    )
    sweep.add_argument(
        "--max-seconds",
        type=_seconds,
        metavar="S",
        help="time budget: points not started within it are listed as not run",
    )
    plot = bench.add_argument_group("plot")
    plot.add_argument("--plot", metavar="PNG", help="draw the JSON files given after it into PNG")
    plot.add_argument("inputs", nargs="*", metavar="JSON", help="bench or sweep results to plot")
    return bench


def _check_bench_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse option combinations that would be silently ignored."""
    sweep_only = [
        "--" + name.replace("_", "-") for name in _SWEEP_OPTIONS if getattr(args, name) is not None
    ]
    if args.plot is not None:
        if args.sweep or args.quick or args.json or sweep_only:
            parser.error("--plot draws existing JSON files; use it without other options")
        if not args.inputs:
            parser.error("--plot PNG needs at least one JSON file after it")
    elif args.inputs:
        parser.error(f"unexpected arguments {args.inputs!r}; JSON files are read only with --plot")
    if sweep_only and not args.sweep:
        parser.error(f"{', '.join(sweep_only)} only apply with --sweep")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m interop``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m interop", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="versions, CUDA driver/runtime and visible devices")
    info.add_argument("--json", action="store_true", help="print JSON instead of text")
    bench = _bench_parser(sub)
    args = parser.parse_args(argv)

    if args.command == "info":
        from .info import collect_info, format_info

        data = collect_info()
        print(json.dumps(data, indent=2) if args.json else format_info(data))
        return 0
    _check_bench_args(bench, args)
    if args.plot is not None:
        from .bench.plot import run_plot

        return run_plot(args.plot, args.inputs)
    if args.sweep:
        from .bench import run_sweep

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
    from .bench import run_bench

    return run_bench(quick=args.quick, json_path=args.json)


if __name__ == "__main__":
    sys.exit(main())
