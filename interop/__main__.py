"""Command line: ``python -m interop {info,bench}``."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m interop``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m interop", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="versions, CUDA driver/runtime and visible devices")
    info.add_argument("--json", action="store_true", help="print JSON instead of text")
    bench = sub.add_parser("bench", help="benchmark exchange and transfers (SPEC §5)")
    bench.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    bench.add_argument("--json", metavar="PATH", help="also write results as JSON to PATH")
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
