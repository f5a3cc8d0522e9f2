"""Every script in examples/ runs offline as documented, and the README's first example
is the quickstart script."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

EXAMPLES = sorted((ROOT / "examples").glob("*.py"))

#: A line each example must print (what a reader is told it shows).
EXPECTED = {
    "quickstart.py": "It shipped. 1",
    "support_agent.py": "answer: Done: refunded A-1",
    "memory_agent.py": "friday: From my memory: The user says: I prefer email.",
    "streaming_redaction.py": "saved: [NAME] is at [EMAIL]; call [PHONE] after 9.",
    "token_auth.py": "Bearer guessed -> None",
}

KEYS = (
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "GEMINI_API_KEY",
    "OPENROUTER_API_KEY",
    "CRIOGEN_EXAMPLE_MODEL",
)


def test_every_example_is_listed() -> None:
    assert {p.name for p in EXAMPLES} == set(EXPECTED)


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs_offline(script: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in KEYS}
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,  # no .env, nothing written into the checkout
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert EXPECTED[script.name] in proc.stdout, proc.stdout
    assert list(tmp_path.iterdir()) == [], "an example left files behind"


def test_the_readme_quickstart_is_the_quickstart_example() -> None:
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"```python\n(.*?)```", readme, re.S)
    assert first is not None
    script = (ROOT / "examples" / "quickstart.py").read_text()
    # The README shows the body of the script (the script adds a docstring and a main guard).
    for line in first.group(1).splitlines():
        if line.strip() and not line.startswith(("result =", "print(")):
            assert line in script, f"README quickstart line not in examples/quickstart.py: {line}"
