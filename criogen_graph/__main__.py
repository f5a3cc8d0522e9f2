"""The `criogen-graph` command line (also `python -m criogen_graph`)."""

from __future__ import annotations

import argparse
import asyncio
import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `criogen-graph` command."""
    parser = argparse.ArgumentParser(
        prog="criogen-graph", description="Durable agents on LangGraph."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("demo", help="run the demo agent (tools and an approval gate)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from criogen_graph._demo import run_demo

        return asyncio.run(run_demo())
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
