"""`load_env`: read provider keys (and any `KEY=value` line) from a `.env` file."""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["load_env"]

_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


def _unquote(raw: str) -> str:
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
        inner = raw[1:-1]
        if raw[0] == '"':
            inner = inner.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")
        return inner
    # An unquoted value ends at an inline comment.
    return re.split(r"\s+#", raw, maxsplit=1)[0].strip()


def load_env(path: str | os.PathLike[str] = ".env") -> list[str]:
    """Set the variables of a `.env` file (e.g. `OPENAI_API_KEY`, `ANTHROPIC_API_KEY`,
    `GEMINI_API_KEY`, `OPENROUTER_API_KEY`) that are not set yet.

    Never replaces a variable that is already set. Returns the names it set (never the
    values). A missing file sets nothing and returns `[]`.
    """
    file = Path(path)
    if not file.is_file():
        return []
    names: list[str] = []
    for line in file.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        key, raw = m.group(1), m.group(2)
        if key in os.environ:
            continue
        os.environ[key] = _unquote(raw)
        names.append(key)
    return names
