"""Counts the reliability tests report: a `RELIABILITY:` line on stdout, and a JSON line in
the file named by `CRIOGEN_RELIABILITY_REPORT` when it is set (for CI summaries)."""

from __future__ import annotations

import json
import os
import time


def report(name: str, **counts: int | str) -> None:
    """Print `RELIABILITY: <name> <counts>` and append `{"name", "counts", "ts"}` as one
    JSON line to `$CRIOGEN_RELIABILITY_REPORT` (if set)."""
    path = os.environ.get("CRIOGEN_RELIABILITY_REPORT")
    if path:
        line = json.dumps({"name": name, "counts": counts, "ts": time.time()}, sort_keys=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    print(f"RELIABILITY: {name} {counts}")
