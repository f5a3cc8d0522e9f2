"""The house's import rules, checked on every module of the package (ast, no import).

Layers, each importing only the ones below it (`vocabulary <- policy <- runtime <-
storage and memory <- facade <- background and serve <- CLI`); the storage backends
import the runtime, never the reverse. Imports under `if TYPE_CHECKING:` carry types
only: they may point anywhere. Imports that run (at the top of a module or in a
function) must follow the layers, except the few deferred calls upward listed in
`UPWARD` with their reason, and form no circle at all (`agent <-> thread` and
`errors <-> results` exist only through a TYPE_CHECKING import).

A second rule: no module but `storage/_driver_internals.py` touches the private
attributes of another library's objects that storage depends on.

The architecture page (docs/concepts/architecture.md) draws the same layers.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "criogen_graph"

#: The layers, lowest first: each a list of module-name patterns (`*` matches any
#: submodule path). A module belongs to the first layer one of its patterns matches.
LAYERS: list[tuple[str, list[str]]] = [
    (
        "vocabulary",
        [
            "criogen_graph.errors",
            "criogen_graph.results",
            "criogen_graph.messages",
            "criogen_graph.options",
            "criogen_graph.stream",
            "criogen_graph._aio",
            "criogen_graph._urls",
            "criogen_graph._retry_after",
            "criogen_graph._version",
            # Imports nothing of the package: any layer may reach a driver through it.
            "criogen_graph.storage._driver_internals",
        ],
    ),
    (
        "policy",
        [
            "criogen_graph.tools",
            "criogen_graph.approvals",
            "criogen_graph.hooks",
            "criogen_graph.middleware",
            "criogen_graph.redact",
            "criogen_graph.audit",
            "criogen_graph.env",
            "criogen_graph.context",
            "criogen_graph.models",
            "criogen_graph.models.*",
            "criogen_graph.telemetry",
            "criogen_graph.telemetry.otlp",
            "criogen_graph.mcp",
        ],
    ),
    (
        "runtime",
        [
            "criogen_graph.runtime",
            "criogen_graph.runtime.*",
            "criogen_graph.graph",
            "criogen_graph.graph.*",
            "criogen_graph.telemetry.observe",
            "criogen_graph.telemetry.callbacks",
        ],
    ),
    (
        "storage",
        [
            "criogen_graph.storage",
            "criogen_graph.storage.*",
            "criogen_graph.memory",
            "criogen_graph.memory.*",
        ],
    ),
    ("facade", ["criogen_graph.agent", "criogen_graph.thread"]),
    (
        "background and serve",
        [
            "criogen_graph.background",
            "criogen_graph.background.*",
            "criogen_graph.serve",
            "criogen_graph.serve.*",
        ],
    ),
    (
        "cli",
        ["criogen_graph", "criogen_graph.__main__", "criogen_graph._cli", "criogen_graph._cli.*"],
    ),
]

#: Deferred imports (inside a function) that go up a layer, each with its reason. Any
#: other import that goes up fails the test.
UPWARD: dict[tuple[str, str], str] = {
    ("criogen_graph.thread", "criogen_graph.background.runs"): (
        "Thread.submit* hand the run to the queue: the public API of a thread includes "
        "its background runs"
    ),
}


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int
    deferred: bool  # inside a function
    typing_only: bool  # under `if TYPE_CHECKING:`


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _resolve(source: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = source.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports_of(source: str, text: str, *, is_package: bool, known: set[str]) -> list[Import]:
    """The package's modules `source` imports, each resolved to a module of `known`
    (`from criogen_graph.x import y` is module `criogen_graph.x.y` when that is one)."""
    tree = ast.parse(text)
    typing_only: set[int] = set()
    deferred: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(n) for n in ast.walk(node))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            deferred.update(id(n) for n in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(source, is_package, node)
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                targets.append(sub if sub in known else module)
        for target in targets:
            if target.split(".")[0] != "criogen_graph" or target == source:
                continue
            while target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            found.append(
                Import(source, target, node.lineno, id(node) in deferred, id(node) in typing_only)
            )
    return found


def layer_of(module: str) -> int:
    for rank, (_, patterns) in enumerate(LAYERS):
        for pattern in patterns:
            if module == pattern or (pattern.endswith(".*") and module.startswith(pattern[:-1])):
                return rank
    raise AssertionError(f"{module} is in no layer: add it to LAYERS in tests/test_layers.py")


@cache
def package_imports(root: Path = ROOT) -> list[Import]:
    paths = sorted((root / "criogen_graph").rglob("*.py"))
    known = {module_name(p, root) for p in paths}
    out: list[Import] = []
    for path in paths:
        out.extend(
            imports_of(
                module_name(path, root),
                path.read_text(),
                is_package=path.name == "__init__.py",
                known=known,
            )
        )
    return out


def layer_violations(found: list[Import]) -> list[str]:
    bad = []
    for imp in found:
        if imp.typing_only:
            continue
        if layer_of(imp.target) <= layer_of(imp.source):
            continue
        if imp.deferred and (imp.source, imp.target) in UPWARD:
            continue
        bad.append(
            f"{imp.source}:{imp.line} ({LAYERS[layer_of(imp.source)][0]}) imports "
            f"{imp.target} ({LAYERS[layer_of(imp.target)][0]})"
        )
    return bad


def cycles(found: list[Import]) -> list[list[str]]:
    """The import circles among the imports that run (strongly connected components of
    more than one module), each as its sorted modules."""
    graph: dict[str, set[str]] = {}
    for imp in found:
        if not imp.typing_only:
            graph.setdefault(imp.source, set()).add(imp.target)
            graph.setdefault(imp.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


# -- the rules, on the package ------------------------------------------------------------


def test_every_module_is_in_a_layer() -> None:
    for path in sorted(PACKAGE.rglob("*.py")):
        layer_of(module_name(path))


def test_imports_that_run_follow_the_layers() -> None:
    assert layer_violations(package_imports()) == []


def test_every_allowed_upward_import_is_still_needed() -> None:
    used = {(i.source, i.target) for i in package_imports() if i.deferred and not i.typing_only}
    assert set(UPWARD) <= used


def test_no_import_circle() -> None:
    assert cycles(package_imports()) == []


def test_the_known_circles_exist_only_through_type_checking_imports() -> None:
    # agent <-> thread and errors <-> results name each other's types; at run time
    # only one of each pair imports the other.
    found = package_imports()
    for pair in (
        {"criogen_graph.agent", "criogen_graph.thread"},
        {"criogen_graph.errors", "criogen_graph.results"},
    ):
        between = [i for i in found if {i.source, i.target} == pair]
        assert len({(i.source, i.target) for i in between}) == 2  # each names the other
        running = {(i.source, i.target) for i in between if not i.typing_only}
        assert len(running) == 1, running


def test_the_runtime_never_imports_storage() -> None:
    runtime = LAYERS.index(next(layer for layer in LAYERS if layer[0] == "runtime"))
    reach = [
        f"{i.source}:{i.line} -> {i.target}"
        for i in package_imports()
        if not i.typing_only
        and layer_of(i.source) <= runtime
        and i.target.startswith("criogen_graph.storage")
        and i.target != "criogen_graph.storage._driver_internals"
    ]
    assert reach == []


# -- the rules catch what they say they catch ----------------------------------------------


def _fake_package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "criogen_graph" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_an_import_up_a_layer_is_caught(tmp_path: Path) -> None:
    root = _fake_package(
        tmp_path,
        {
            "__init__.py": "",
            "errors.py": "from criogen_graph.thread import Thread\n",  # vocabulary -> facade
            "thread.py": "from criogen_graph.errors import CriogenError\n",
            "runtime/__init__.py": "",
            "runtime/runner.py": "def f():\n    from criogen_graph.storage import Storage\n",
            "storage/__init__.py": "",
        },
    )
    found = package_imports(root)
    bad = layer_violations(found)
    assert any(
        b.startswith("criogen_graph.errors:1 (vocabulary) imports criogen_graph.thread")
        for b in bad
    )
    # A deferred import is an import: the runtime may not reach storage from a function.
    assert any(b.startswith("criogen_graph.runtime.runner:2 (runtime)") for b in bad)
    assert cycles(found) == [["criogen_graph.errors", "criogen_graph.thread"]]


def test_a_type_checking_import_is_free_and_makes_no_circle(tmp_path: Path) -> None:
    root = _fake_package(
        tmp_path,
        {
            "__init__.py": "",
            "errors.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from criogen_graph.results import RunResult\n"
            ),
            "results.py": "from criogen_graph.errors import ValidationError\n",
        },
    )
    found = package_imports(root)
    assert layer_violations(found) == [] and cycles(found) == []


def test_a_module_outside_the_layers_is_caught() -> None:
    with pytest.raises(AssertionError, match="in no layer"):
        layer_of("criogen_graph.somewhere_new")


# -- other libraries' private attributes --------------------------------------------------

#: The private attributes of aiosqlite connections, psycopg_pool pools, LangGraph's
#: batched stores and LangChain's tracer context that storage depends on.
PRIVATE = re.compile(r"^_(conn|execute|thread|pool|workers|sched_runner|configure_hooks|task)$")
GUARDED = PACKAGE / "storage" / "_driver_internals.py"


def private_reaches(path: Path) -> list[str]:
    """`x._conn`-like attribute reads (and `getattr(x, "_conn")`) of anything but the
    module's own objects (`self`, `cls`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        name = None
        owner: ast.expr | None = None
        if isinstance(node, ast.Attribute):
            name, owner = node.attr, node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            name, owner = node.args[1].value, node.args[0]
        if name is None or not PRIVATE.match(name):
            continue
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        found.append(f"{path.relative_to(path.parents[1])}:{node.lineno} {ast.unparse(node)}")
    return found


def test_only_the_guarded_module_touches_other_libraries_internals() -> None:
    found = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != GUARDED
        for hit in private_reaches(path)
    ]
    assert found == []
    assert private_reaches(GUARDED), "the guarded module is where they are"


def test_a_private_reach_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "criogen_graph" / "x.py"
    path.parent.mkdir()
    path.write_text(
        "async def f(conn, pool):\n"
        "    await conn._execute(len, conn._conn)\n"
        "    return getattr(pool, '_workers', ())\n"
        "def g(self):\n    return self._pool\n"
    )
    hits = sorted(h.split(" ", 1)[1] for h in private_reaches(path))
    # `self._pool` is the module's own attribute: not a reach into a library.
    assert hits == ["conn._conn", "conn._execute", "getattr(pool, '_workers', ())"]


# -- the architecture page stays true ------------------------------------------------------

ARCHITECTURE = ROOT / "docs" / "concepts" / "architecture.md"


def test_the_architecture_page_names_files_that_exist_and_every_top_level_module() -> None:
    text = ARCHITECTURE.read_text()
    named = re.findall(r"(criogen_graph/[\w/]+\.py)", text)
    assert len(named) >= 20
    assert [n for n in named if not (ROOT / n).is_file()] == []
    top = sorted(
        p.name
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py")
        or (p.is_dir() and (p / "__init__.py").exists())
    )
    missing = [
        name
        for name in top
        if not re.search(rf"(?<![\w.]){re.escape(Path(name).stem)}(\.py|/)?(?![\w])", text)
    ]
    assert missing == [], "add these to docs/concepts/architecture.md"
