"""The `criogen-graph` command line: `demo`, `chat`, `threads`, `worker` and `runs`.

Exit codes: 0 when the command did what it was asked, 1 for a runtime error (a
`CriogenError` or a problem with what the command was pointed at, printed as one line
`error: ...` on stderr; `--debug` adds the traceback), 2 for a usage error (argparse),
130 when interrupted, 141 when the reader of its output went away (`| head`: quietly, as a
tool killed by SIGPIPE). Heavy modules are imported when a command runs, not when the
parser is built.

Modules: `parser` (the commands and their options), `loading` (agents, tools, models and
storages the options name), `rendering` (how messages, events and JSON print), `chat`,
`threads`, `background` (`worker` and `runs`) and `demo`.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Sequence

from criogen_graph._cli.common import (
    EXIT_BROKEN_PIPE,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CliError,
)
from criogen_graph._cli.parser import build_parser

__all__ = ["CliError", "build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on `argv` (default: `sys.argv[1:]`); returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[..., int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_USAGE
    debug = bool(getattr(args, "debug", False))
    from criogen_graph.errors import CriogenError

    try:
        return handler(args)
    except BrokenPipeError:
        # The reader of the output went away (`... | head`): exit quietly, as a tool
        # killed by SIGPIPE does; stdout goes to /dev/null so the interpreter's last
        # flush finds nothing to complain about.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (CliError, CriogenError) as exc:
        if debug:
            import traceback

            traceback.print_exc()
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:
        if debug:
            raise
        print(
            f"error: {type(exc).__name__}: {exc} (run with --debug for the traceback)",
            file=sys.stderr,
        )
        return EXIT_ERROR
