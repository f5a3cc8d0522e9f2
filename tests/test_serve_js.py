"""`criogen-graph serve` from JavaScript: the official client (`@langchain/langgraph-sdk`)
run by Node through the flow the Python suite runs (a streamed run through an approval,
resumed with a Command; state and history; a stream joined again with `Last-Event-ID`;
a cancelled run; another identity's 404), and a real browser: a React page on
`useStream` (built here with esbuild from the locked npm packages of tests/js) in
Debian's Chromium, driven by Playwright: type a message, watch the answer stream in,
approve the refund, see the tool's result. Each runs against one `serve` process (inline
runs, SQLite and PostgreSQL) and against two `serve --workers external` processes with a
worker process on PostgreSQL (the flow alternates between the two servers; every run is
executed by the worker).

The npm packages come from the registry npm is configured with (`npm ci`, once, into
tests/js/node_modules). Without node/npm or chromium these tests skip with the reason;
under CI=true they fail instead."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.conftest import PG_URL, ROOT, require_postgres
from tests.serve_agents import CHUNKS
from tests.test_serve import AGENTS, REFUND, serve

if TYPE_CHECKING:
    from tests.test_serve_workers import Cluster

JS = ROOT / "tests" / "js"


def _missing(problem: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI must run the JavaScript tests: {problem}")
    pytest.skip(problem)


@pytest.fixture(scope="module")
def node_modules() -> Path:
    """tests/js/node_modules as package-lock.json pins it (`npm ci` when it is not)."""
    pytest.importorskip("starlette")
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        _missing("node and npm are not installed (apt-get install nodejs npm)")
    assert npm is not None
    installed = JS / "node_modules" / ".package-lock.json"
    lock = JS / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=JS,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            _missing(f"npm ci failed in tests/js: {done.stderr[-2000:]}")
    return JS / "node_modules"


@pytest.fixture(scope="module")
def js_cluster(page_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two `serve --workers external` processes (with auth, and CORS for the page) and
    one worker process, on a PostgreSQL schema of their own."""
    pytest.importorskip("procrastinate")
    require_postgres()
    from tests.test_serve_workers import running_cluster

    workdir = tmp_path_factory.mktemp("serve-js-workers")
    options = ("--auth", "tests.serve_agents:bearer", "--host", "127.0.0.1", "--cors", page_url)
    with running_cluster(workdir, *options, agents=AGENTS, workers=1) as cluster:
        yield cluster


def _worker_runs(cluster: Cluster) -> list[str]:
    """The worker (host:pid) that ran each run of the cluster's queue, in order."""
    import psycopg

    with closing(psycopg.connect(cluster.url, autocommit=True)) as conn:
        rows = conn.execute(
            "SELECT coalesce(worker, '') FROM criogen_runs ORDER BY submitted_at"
        ).fetchall()
    return [str(r[0]) for r in rows]


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "workers"])
def test_the_javascript_client_runs_the_same_flow(
    node_modules: Path, kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    who = f"node-{os.urandom(4).hex()}"
    if kind == "workers":
        cluster: Cluster = request.getfixturevalue("js_cluster")
        a, b = cluster.servers
        before = len(_worker_runs(cluster))
        done = subprocess.run(
            ["node", "flow.mjs", a.url, who, b.url],
            cwd=JS,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr + cluster.logs()
        # Every run was executed by the worker process, none by either server.
        ran = _worker_runs(cluster)[before:]
        (worker,) = cluster.workers
        assert len(ran) == 4 and all(w.endswith(f":{worker.pid}") for w in ran), ran
    else:
        if kind == "postgres":
            require_postgres()
            storage = PG_URL
        else:
            storage = f"sqlite:///{tmp_path / 'threads.db'}"
        options = ("--auth", "tests.serve_agents:bearer", "--host", "127.0.0.1")
        with serve(storage, tmp_path, *options) as server:
            done = subprocess.run(
                ["node", "flow.mjs", server.url, who],
                cwd=JS,
                capture_output=True,
                text=True,
                timeout=120,
            )
        assert done.returncode == 0, done.stderr + server.log.read_text()
    seen: dict[str, Any] = json.loads(done.stdout)
    assert seen["first_event"] == "metadata"
    assert seen["streamed_text"] == "Order A-1 is on file; I will refund it."
    assert seen["tuple_chunks"] == seen["streamed_text"]
    assert (seen["asked_tool"], seen["next"], seen["status_waiting"]) == (
        "refund",
        ["approval"],
        "interrupted",
    )
    assert seen["answer"] == "Done: refunded A-1 (requested by the customer)."
    assert seen["status_done"] == "idle"
    assert seen["history_nexts"][0] == [] and ["approval"] in seen["history_nexts"]
    assert seen["rejoined_pieces"] == CHUNKS
    assert seen["rejoined_status"] == "success"
    assert seen["cancelled_status"] == "interrupted"
    assert (seen["other_status"], seen["other_search"]) == (404, 0)


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture(scope="module")
def page_url(node_modules: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The useStream page, bundled with esbuild, on a loopback static server."""
    site = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [
            str(node_modules / ".bin" / "esbuild"),
            "page.jsx",
            "--bundle",
            f"--outfile={site / 'page.js'}",
            "--jsx=automatic",
            "--define:process.env.NODE_ENV='production'",
            "--log-level=warning",
        ],
        cwd=JS,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr
    shutil.copy(JS / "index.html", site / "index.html")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@contextmanager
def _page_server(
    kind: str, page_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[str]:
    """The `api` and `token` parameters of the page, for a server of `kind`."""
    if kind == "workers":
        cluster: Cluster = request.getfixturevalue("js_cluster")
        before = len(_worker_runs(cluster))
        yield f"api={cluster.servers[0].url}&token=browser-{os.urandom(4).hex()}"
        # The message and the approval were both run by the worker process.
        ran = _worker_runs(cluster)[before:]
        (worker,) = cluster.workers
        assert len(ran) == 2 and all(w.endswith(f":{worker.pid}") for w in ran), ran
        return
    storage = f"sqlite:///{tmp_path / 'threads.db'}"
    with serve(storage, tmp_path, "--cors", page_url) as server:
        yield f"api={server.url}"


@pytest.mark.parametrize("kind", ["sqlite", "workers"])
def test_a_react_page_on_use_stream_chats_and_approves_in_chromium(
    page_url: str, kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        _missing("no chromium on PATH (apt-get install chromium)")
    assert chromium is not None
    with (
        _page_server(kind, page_url, tmp_path, request) as api,
        playwright.sync_playwright() as p,
    ):
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 640})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            streams: list[str] = []
            page.on(
                "response",
                lambda r: (
                    streams.append(r.url)
                    if r.url.endswith("/runs/stream")
                    and r.headers.get("content-type", "").startswith("text/event-stream")
                    else None
                ),
            )
            page.goto(f"{page_url}/index.html?{api}&assistant=support")
            page.fill("input[name=message]", REFUND)
            page.click("button[type=submit]")

            answer = page.locator(".message .text", has_text="I will refund it.")
            answer.wait_for(timeout=30_000)
            approval = page.locator(".approval")
            approval.wait_for(timeout=30_000)
            assert "refund" in approval.locator(".request").inner_text()
            assert "A-1" in approval.locator(".request").inner_text()
            assert len(streams) == 1  # the answer came over SSE

            page.get_by_role("button", name="Approve").click()
            result = page.locator(".message.tool .text", has_text="refunded A-1")
            result.wait_for(timeout=30_000)
            page.locator(".message .text", has_text="Done: refunded A-1").wait_for(timeout=30_000)
            approval.wait_for(state="detached", timeout=30_000)
            assert len(streams) == 2  # the resume streamed too
            assert errors == []
            shots = os.environ.get("CRIOGEN_DOCS_SCREENSHOTS")
            if shots and kind == "sqlite":  # the docs show the one-command server
                page.screenshot(path=str(Path(shots) / "serve-use-stream.png"))
        finally:
            browser.close()
