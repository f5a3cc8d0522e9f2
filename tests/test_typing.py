"""`mypy --strict` on typical user code (tests/typing/user_code.py) and on the README's
quickstart: no errors, and every `reveal_type` shows the type a user relies on (the
agent's output type carried to `run()`, threads, replies and streams)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
USER_CODE = ROOT / "tests" / "typing" / "user_code.py"


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One mypy run over both files (it analyses the package once): its lines per file."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    quick = next((b for b in blocks if "Agent(" in b and "asyncio.run" in b), None)
    if quick is None:
        pytest.fail("README has no runnable quickstart block (Agent(...) and asyncio.run)")
    path = tmp_path_factory.mktemp("readme") / "quickstart.py"
    path.write_text(quick)
    out = _mypy(USER_CODE, path)
    return {
        name: "\n".join(line for line in out.splitlines() if f"{name}:" in line)
        for name in ("user_code.py", "quickstart.py")
    }


def _mypy(*paths: Path) -> str:
    # Only the given files' own lines matter here: the package itself is checked by
    # `mypy --strict criogen_graph` in CI.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--hide-error-context",
            "--no-error-summary",
            "--show-absolute-path",
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            *map(str, paths),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    return done.stdout + done.stderr


def _short(revealed: str) -> str:
    """`criogen_graph.agent.Agent[user_code.Invoice]` -> `Agent[Invoice]`."""
    return re.sub(r"\b(?:[A-Za-z_][A-Za-z0-9_]*\.)+([A-Za-z_][A-Za-z0-9_]*)", r"\1", revealed)


def test_user_code_type_checks_with_the_types_users_rely_on(checked: dict[str, str]) -> None:
    out = checked["user_code.py"]
    lines = USER_CODE.read_text().splitlines()
    expected = {
        n: line.split("# R: ", 1)[1].strip() for n, line in enumerate(lines, 1) if "# R: " in line
    }
    assert len(expected) >= 8
    revealed: dict[int, str] = {}
    errors = []
    for line in out.splitlines():
        m = re.match(r".*user_code\.py:(\d+): (\w+): (.*)$", line)
        if not m:
            continue
        lineno, level, text = int(m[1]), m[2], m[3]
        if level == "note" and text.startswith("Revealed type is "):
            revealed[lineno] = _short(text.removeprefix("Revealed type is ").strip('"'))
        elif level == "error":
            errors.append(line)
    assert errors == [], out
    assert {n: revealed.get(n) for n in expected} == expected, out


def test_readme_quickstart_type_checks_without_annotations(checked: dict[str, str]) -> None:
    out = checked["quickstart.py"]
    assert ": error:" not in out, out
