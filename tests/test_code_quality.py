"""The code's own bounds, checked where CI runs: `mypy --strict` and `ruff` clean; no
function in the core (the nodes, the agent, the thread, the runner, the CLI) over 80 lines or a
cyclomatic complexity of 15; no module importing another module's private name."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "criogen_graph"
CORE = [
    *sorted((PACKAGE / "graph").glob("*.py")),
    *sorted((PACKAGE / "_cli").glob("*.py")),
    PACKAGE / "agent.py",
    PACKAGE / "thread.py",
    PACKAGE / "runtime" / "runner.py",
    PACKAGE / "middleware.py",
]
MAX_COMPLEXITY = 15
MAX_LINES = 80


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, cwd=ROOT, timeout=900
    )


def test_mypy_strict_is_clean() -> None:
    done = _run("mypy", "--strict", "--cache-dir", str(ROOT / ".mypy_cache"), "criogen_graph")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_is_clean() -> None:
    pytest.importorskip("ruff")
    checked = _run("ruff", "check", "criogen_graph", "tests", "bench")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    formatted = _run("ruff", "format", "--check", "criogen_graph", "tests", "bench")
    assert formatted.returncode == 0, formatted.stdout + formatted.stderr


def test_core_functions_are_small_and_simple() -> None:
    from radon.complexity import cc_visit

    too_big = []
    for path in CORE:
        if not path.exists():
            continue
        for block in cc_visit(path.read_text()):
            for item in [block, *getattr(block, "methods", [])]:
                lines = item.endline - item.lineno + 1
                if item.complexity > MAX_COMPLEXITY or (
                    lines > MAX_LINES and not getattr(item, "methods", None)
                ):
                    too_big.append(
                        f"{path.relative_to(ROOT)}:{item.lineno} {item.name}: "
                        f"complexity {item.complexity}, {lines} lines"
                    )
    assert too_big == []


def _imports_of_private_names(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    own = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.module is None:
            continue
        if not node.module.startswith("criogen_graph") or node.module == own:
            continue
        base = ROOT.joinpath(*node.module.split("."))
        for alias in node.names:
            name = alias.name
            if (base / f"{name}.py").exists() or (base / name).is_dir():
                continue  # a private module of the package, imported whole
            if name.startswith("_") and not name.startswith("__"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.module}.{name}")
    return found


def test_no_module_imports_another_modules_private_names() -> None:
    found = [
        hit for path in sorted(PACKAGE.rglob("*.py")) for hit in _imports_of_private_names(path)
    ]
    assert found == []


@pytest.mark.parametrize(
    "module",
    [
        "thread.py",
        "runtime/runner.py",
        "background/__init__.py",
        "background/jobs.py",
        "background/local.py",
    ],
)
def test_the_runner_and_threads_reach_no_private_attribute(module: str) -> None:
    reaches = [
        f"{module}:{node.lineno} {ast.unparse(node)}"
        for node in ast.walk(ast.parse((PACKAGE / module).read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    ]
    assert reaches == []
