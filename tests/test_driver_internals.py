"""The private attributes of other libraries that storage relies on, checked against the
installed versions: an upgrade that renames or changes one fails here, naming it, not
as a storage that silently leaks a thread, a connection or a task.

All of them are reached through `criogen_graph.storage._driver_internals` only (see
`tests/test_layers.py`)."""

from __future__ import annotations

import asyncio
import contextvars
import sqlite3
from pathlib import Path
from typing import Any

from criogen_graph.storage import _driver_internals as internals
from tests.conftest import PG_URL, require_postgres


async def test_aiosqlite_runs_a_function_on_its_thread_with_its_connection(
    tmp_path: Path,
) -> None:
    import aiosqlite

    conn = aiosqlite.connect(str(tmp_path / "x.db"))
    internals.daemon_thread(conn)  # before the thread starts, as storage does
    assert conn._thread.daemon, "aiosqlite.Connection._thread is no longer the worker thread"
    await conn
    try:
        seen: dict[str, Any] = {}

        def work(db: sqlite3.Connection, value: int) -> int:
            seen["db"] = db
            db.execute("CREATE TABLE t (v INTEGER)")
            db.execute("INSERT INTO t VALUES (?)", (value,))
            return int(db.execute("SELECT v FROM t").fetchone()[0])

        assert await internals.run_on_sqlite_thread(conn, work, 42) == 42
        # The function got the connection's own sqlite3 connection, on its own thread.
        assert isinstance(seen["db"], sqlite3.Connection)
        async with conn.execute("SELECT v FROM t") as cursor:
            assert await cursor.fetchone() == (42,)
    finally:
        await conn.close()


async def test_psycopg_pool_exposes_its_idle_connections_and_tasks() -> None:
    require_postgres()
    from psycopg_pool import AsyncConnectionPool

    pool = AsyncConnectionPool(PG_URL, min_size=1, max_size=2, open=False)
    await pool.open(wait=True)
    try:
        idle = internals.pool_idle_connections(pool)
        assert idle, "AsyncConnectionPool._pool no longer lists the idle connections"
        assert all(hasattr(c, "pgconn") for c in idle)
        tasks = [t for t in internals.pool_tasks(pool) if t is not None]
        assert tasks, "AsyncConnectionPool._workers / _sched_runner are no longer its tasks"
        assert all(isinstance(t, asyncio.Task) and not t.done() for t in tasks)
    finally:
        await pool.close()
    assert internals.pool_idle_connections(None) == []


async def test_langgraph_batched_store_keeps_its_batching_task(tmp_path: Path) -> None:
    import aiosqlite
    from langgraph.store.sqlite.aio import AsyncSqliteStore

    conn = await aiosqlite.connect(str(tmp_path / "store.db"), isolation_level=None)
    try:
        store = AsyncSqliteStore(conn)
        task = internals.store_batch_task(store)
        assert isinstance(task, asyncio.Task), "a batched store's `_task` is gone"
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    finally:
        await conn.close()


def test_langchain_registry_of_configure_hooks_lists_a_registered_variable() -> None:
    from langchain_core.tracers.context import register_configure_hook

    var: contextvars.ContextVar[Any] = contextvars.ContextVar("criogen_probe", default=None)
    register_configure_hook(var, inheritable=True)
    found = internals.configure_hook_vars()
    assert any(v is var for v in found), (
        "langchain_core.tracers.context._configure_hooks no longer lists the registered "
        "context variables: criogen_graph's LangChain adapter can no longer keep a chat "
        "model's own callbacks off"
    )


def test_the_guarded_module_has_no_unchecked_entry() -> None:
    # A new entry in the guarded module needs a check of its own in this file.
    assert sorted(internals.__all__) == [
        "configure_hook_vars",
        "daemon_thread",
        "pool_idle_connections",
        "pool_tasks",
        "run_on_sqlite_thread",
        "store_batch_task",
    ]
