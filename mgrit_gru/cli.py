"""The ``mgrit-gru`` command line."""

from __future__ import annotations

import argparse
import sys

from . import bench


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mgrit-gru", description="GRU training parallel in time with MGRIT"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("bench", help="time torch.nn.GRU, serial and MGRIT side by side")
    bench.add_arguments(p)
    p.set_defaults(func=bench.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"mgrit-gru {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
