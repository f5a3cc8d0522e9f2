"""The `criogen-graph` command line (also `python -m criogen_graph`)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `criogen-graph` command."""
    parser = argparse.ArgumentParser(
        prog="criogen-graph", description="Durable agents on LangGraph."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="run the demo: a support agent on SQLite that stops for approval, answered "
        "after a restart",
    )
    demo.add_argument(
        "--db", type=Path, default=Path("criogen-demo.db"), help="the SQLite file to use"
    )
    demo.add_argument("--resume", metavar="THREAD", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.command == "demo":
        from criogen_graph._demo import resume_demo, run_demo

        if args.resume:
            return asyncio.run(resume_demo(args.db, args.resume))
        return asyncio.run(run_demo(args.db))
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
