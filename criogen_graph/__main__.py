"""The `criogen-graph` command line (also `python -m criogen_graph`): `demo`, `chat` and
`threads`; see `criogen_graph._cli`."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `criogen-graph` command; returns the exit code."""
    from criogen_graph._cli import main as run

    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
