"""The one place that touches private attributes of other libraries.

Each is used because the library offers no public way to do what storage needs:

- aiosqlite: `Connection._execute(fn, *args)` runs `fn` on the connection's own thread
  with its `sqlite3.Connection` (`Connection._conn`), so a whole transaction runs in one
  hop instead of one per statement; `Connection._thread` is made a daemon, so a storage
  nobody closed does not keep the interpreter alive at exit.
- psycopg_pool: `AsyncConnectionPool._pool` (its idle connections), `_workers` and
  `_sched_runner` (its tasks), closed by hand when the pool's own close was cut short
  or its event loop is gone.
- LangGraph's batched stores: `_task`, their batching task, which they do not stop when
  their connection closes.
- LangChain: `langchain_core.tracers.context._configure_hooks`, the registry of the
  context variables that add callback handlers to a chat model's run.

`tests/test_driver_internals.py` checks every one of them against the installed
versions, so an upgrade that renames one fails there, loudly, rather than in storage,
silently. `tests/test_layers.py` checks that no other module reaches for them.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = [
    "configure_hook_vars",
    "daemon_thread",
    "pool_idle_connections",
    "pool_tasks",
    "run_on_sqlite_thread",
    "store_batch_task",
]

T = TypeVar("T")


async def run_on_sqlite_thread(conn: Any, fn: Callable[..., T], *args: Any) -> T:
    """`fn(db, *args)` on aiosqlite connection `conn`'s thread, `db` being its
    `sqlite3.Connection`."""
    result: T = await conn._execute(fn, conn._conn, *args)
    return result


def daemon_thread(conn: Any) -> None:
    """Make the thread of aiosqlite connection `conn` (not yet awaited) a daemon."""
    conn._thread.daemon = True


def pool_idle_connections(pool: Any) -> list[Any]:
    """The idle connections of a psycopg_pool `AsyncConnectionPool` (none for None)."""
    return list(getattr(pool, "_pool", ()))


def pool_tasks(pool: Any) -> list[Any]:
    """The tasks (workers and scheduler) of a psycopg_pool `AsyncConnectionPool`."""
    return [*getattr(pool, "_workers", ()), getattr(pool, "_sched_runner", None)]


def store_batch_task(store: Any) -> Any:
    """The batching task of a LangGraph batched store (None if it has none)."""
    return getattr(store, "_task", None)


def configure_hook_vars() -> list[contextvars.ContextVar[Any]]:
    """The context variables LangChain reads to add callback handlers to a run
    (`register_configure_hook`). Empty if this LangChain has no such registry."""
    from langchain_core.tracers import context as lc_context

    return [entry[0] for entry in getattr(lc_context, "_configure_hooks", ())]
