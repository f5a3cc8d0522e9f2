from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from criogen_graph import Storage
from tests.servers.openai_server import OpenAIServer

if TYPE_CHECKING:
    from tests.servers.otlp_receiver import OtlpReceiver

# Files whose tests start processes, servers or browsers, restart PostgreSQL or kill workers:
# `-m "not slow"` leaves them out for an everyday run of a few minutes.
SLOW = (
    "tests/reliability/",
    "tests/test_cli.py",
    "tests/test_mcp.py",
    "tests/test_mcp_http.py",
    "tests/test_processes.py",
    "tests/test_vectors_pg.py",
    "tests/test_docs.py",
    "tests/test_notebooks.py",
    "tests/test_examples.py",
    "tests/test_studio.py",
    "tests/test_background_cli.py",
    "tests/test_serve.py",
    "tests/test_serve_workers.py",
    "tests/test_serve_js.py",
    "tests/test_serve_fuzz.py",
    "tests/test_serve_load.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.path)).resolve().relative_to(ROOT).as_posix()
        if path.startswith(SLOW):
            item.add_marker(pytest.mark.slow)


PG_URL = os.environ.get("CRIOGEN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
ROOT = Path(__file__).resolve().parent.parent


@cache
def postgres_problem() -> str | None:
    """Why the test PostgreSQL cannot be used, or None when it can."""
    try:
        import psycopg
    except ImportError:
        return (
            "psycopg is not installed (pip install -e '.[postgres]' in the criogen_graph checkout)"
        )
    try:
        with psycopg.connect(PG_URL, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return f"PostgreSQL is not reachable at {PG_URL}: {exc}"
    return None


def require_postgres() -> None:
    """Skip (on a developer machine) or fail (in CI) when PostgreSQL is missing."""
    problem = postgres_problem()
    if problem is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI must run the PostgreSQL tests: {problem}")
    pytest.skip(problem)


@pytest.fixture
def openai_server() -> Iterator[OpenAIServer]:
    """A scripted OpenAI-compatible server on 127.0.0.1."""
    with OpenAIServer() as server:
        yield server


@cache
def pgvector_problem() -> str | None:
    """Why the test PostgreSQL has no pgvector extension to offer, or None when it has."""
    import psycopg

    with psycopg.connect(PG_URL, connect_timeout=3) as conn:
        row = conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone()
    if row is None:
        return (
            f"the PostgreSQL server at {PG_URL} has no pgvector extension "
            "(bash .ci/install-pgvector builds it from Debian's source package)"
        )
    return None


def require_pgvector() -> None:
    """Skip (on a developer machine) or fail (in CI, whose .ci/run installs it) when the
    test PostgreSQL lacks pgvector; the extension is then created in its `public` schema,
    where every test schema's vectors find it."""
    require_postgres()
    problem = pgvector_problem()
    if problem is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must run the pgvector tests: {problem}")
        pytest.skip(problem)
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public")


async def python_children(code: str, *args: str, n: int) -> list[str]:
    """Run `python -c code *args` in `n` processes started together; what each printed
    (each must exit 0)."""
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            code,
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(n)
    ]
    outs = [await p.communicate() for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err.decode()
    return [out.decode() for out, _ in outs]


def storage_url(kind: str, tmp_path: Path) -> str:
    if kind == "memory":
        return "memory://"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/threads.db"
    require_postgres()
    return PG_URL


@contextmanager
def fresh_schema(prefix: str = "criogen_test") -> Iterator[str]:
    """A PostgreSQL URL whose tables live in a fresh schema of their own, dropped on
    leaving: for tests that change database-wide settings or start processes of their own."""
    require_postgres()
    import psycopg

    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in PG_URL else "?"
    try:
        yield f"{PG_URL}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def pg_schema_url() -> Iterator[str]:
    """A PostgreSQL URL whose tables live in a fresh schema of their own (dropped after),
    for tests that change database-wide settings such as the encryption key."""
    with fresh_schema() as url:
        yield url


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["sqlite", "postgres"])
def durable_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def storage(backend: str, tmp_path: Path) -> AsyncIterator[Storage]:
    s = Storage(storage_url(backend, tmp_path))
    yield s
    await s.close()


@pytest.fixture
def thread_id() -> str:
    """A thread id no other test uses (tests share the PostgreSQL database)."""
    return f"t-{uuid.uuid4().hex}"


async def wait_until(
    check: Callable[[], Any], *, within: float = 20, what: str = "condition"
) -> Any:
    """Wait for an observable transition: poll `check` (sync or async) until truthy."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def spawn(scenario: str, url: str, thread_id: str, workdir: Path) -> subprocess.Popen[str]:
    """Start a worker process (tests/procs/worker.py)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.procs.worker", scenario, url, thread_id, str(workdir)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def rx() -> Iterator[OtlpReceiver]:
    """A loopback OTLP receiver; every exporter made for it is stopped before it goes."""
    from tests.servers.otlp_receiver import OtlpReceiver

    with OtlpReceiver() as receiver:
        yield receiver
        for telemetry in receiver.users:
            telemetry.shutdown()
