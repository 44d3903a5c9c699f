"""Command line of interop: ``python -m interop {info,bench}``."""

from __future__ import annotations

import argparse
import json
import sys

DESCRIPTION = "interop: zero-copy exchange and chunked transfers between PyTorch, CuPy and NumPy."

BENCH_DESCRIPTION = """\
Measure interop's calls against what people write by hand (numpy.from_dlpack,
cupy.asnumpy, t.cpu(), ...) and the link's limit, as ratios measured in the same
run. GPU rows run where CuPy and PyTorch see a CUDA device (else: skipped)."""

BENCH_EPILOG = """\
environment variables:
  INTEROP_BENCH_SCALE   multiplies every array size and loop count (default 1:
                        1 GiB GPU arrays; --quick a quarter of that or less)
  INTEROP_BENCH_DIR     where the file rows write (default: the temporary directory)
  INTEROP_CHUNK_BYTES, INTEROP_NUM_BUFFERS, INTEROP_HOST_THREADS
                        the transfer settings the bench runs with and reports

exit status: 0 when every row ran or was skipped for a stated reason; 1 when a
row raised or returned wrong data; 2 for bad arguments, a bad
INTEROP_BENCH_SCALE or a --json PATH that cannot be written.

example: python -m interop bench --quick --json results/bench.json"""


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m interop``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m interop", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="versions, CUDA driver/runtime and visible devices")
    info.add_argument("--json", action="store_true", help="print JSON instead of text")
    bench = sub.add_parser(
        "bench",
        help="benchmark exchange and transfers against the usual ways",
        description=BENCH_DESCRIPTION,
        epilog=BENCH_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument("--quick", action="store_true", help="a smoke run: small sizes, few repeats")
    bench.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = parser.parse_args(argv)

    if args.command == "info":
        from .info import collect_info, format_info

        data = collect_info()
        print(json.dumps(data, indent=2) if args.json else format_info(data))
        return 0
    from .bench import run_bench

    return run_bench(quick=args.quick, json_path=args.json)


if __name__ == "__main__":
    sys.exit(main())
