"""load_env: sets what is missing, never replaces, returns names only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from criogen_graph import load_env


def test_load_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = tmp_path / ".env"
    env.write_text(
        "# keys\n"
        "OPENAI_API_KEY=sk-from-file\n"
        "export ANTHROPIC_API_KEY='ant key'\n"
        'GEMINI_API_KEY="g\\"q"\n'
        "OPENROUTER_API_KEY=or-key # a comment\n"
        "EMPTY=\n"
        "not a line\n"
    )
    monkeypatch.setenv("OPENAI_API_KEY", "already-set")
    for k in ("ANTHROPIC_API_KEY", "GEMINI_API_KEY", "OPENROUTER_API_KEY", "EMPTY"):
        monkeypatch.delenv(k, raising=False)
    names = load_env(env)
    assert names == ["ANTHROPIC_API_KEY", "GEMINI_API_KEY", "OPENROUTER_API_KEY", "EMPTY"]
    assert os.environ["OPENAI_API_KEY"] == "already-set"
    assert os.environ["ANTHROPIC_API_KEY"] == "ant key"
    assert os.environ["GEMINI_API_KEY"] == 'g"q'
    assert os.environ["OPENROUTER_API_KEY"] == "or-key"
    assert all("key" not in n.lower() or n.isupper() for n in names)  # names, not values
    assert load_env(tmp_path / "missing.env") == []
