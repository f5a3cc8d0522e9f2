"""`criogen-graph demo`: the support agent that stops for approval and is answered by a
second process (see `criogen_graph._cli.demo_agent`)."""

from __future__ import annotations

import argparse

from criogen_graph._cli.common import run

__all__ = ["cmd_demo"]


def cmd_demo(args: argparse.Namespace) -> int:
    """`criogen-graph demo` (with the hidden `--resume THREAD`: the second process)."""
    from criogen_graph._cli.demo_agent import resume_demo, run_demo

    if args.resume:
        return run(resume_demo(args.db, args.resume))
    return run(run_demo(args.db))
