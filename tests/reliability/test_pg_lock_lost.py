"""A run whose PostgreSQL lock session is ended under it (an administrator's
`pg_terminate_backend`, `idle_session_timeout`, a proxy dropping an idle connection):
PostgreSQL releases the thread's lock with the session, so another worker may take the
thread. The run must write nothing more (a write could fork the thread) and say why;
`retry()` continues from what was saved, and a tool that finished after the lock was lost
keeps its result (saved when this process takes the lock again), so it does not run
again."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest

from criogen_graph import Agent, FakeReply, FunctionModel, Storage, StorageError, tool
from tests.conftest import PG_URL, require_postgres
from tests.reliability._report import report


def _saved_rows(thread_id: str) -> tuple[int, int]:
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        checkpoints = conn.execute(
            "SELECT count(*) FROM checkpoints WHERE thread_id = %s", (thread_id,)
        ).fetchone()
        writes = conn.execute(
            "SELECT count(*) FROM checkpoint_writes WHERE thread_id = %s", (thread_id,)
        ).fetchone()
    assert checkpoints is not None and writes is not None
    return checkpoints[0], writes[0]


def _terminate(pid: int) -> None:
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        row = conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()
    assert row is not None and row[0], f"backend {pid} was not terminated"


def _take_over(thread_id: str) -> None:
    """What another process taking the thread's lock does to the lock's epoch."""
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        cur = conn.execute(
            "UPDATE criogen_locks SET epoch = epoch + 1 WHERE thread_id = %s", (thread_id,)
        )
    assert cur.rowcount == 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["session terminated", "taken over unseen"])
async def test_a_run_that_lost_its_lock_writes_nothing_more_and_retry_completes(
    how: str,
) -> None:
    """`session terminated`: the server ends the session holding the lock (the run sees
    it on the session's socket). `taken over unseen`: the lock's epoch moves on while the
    session looks alive (a loss the run cannot see, e.g. a network that dropped the
    session silently and another worker that took the lock): the database refuses the
    run's next write."""
    require_postgres()
    started, release = asyncio.Event(), asyncio.Event()
    ran: list[str] = []

    @tool
    async def slow(order_id: str) -> str:
        """Check an order (slowly)."""
        ran.append(order_id)
        started.set()
        await release.wait()
        return f"{order_id} checked"

    def script(messages: list[dict[str, Any]], tools: Any) -> Any:
        if messages[-1]["role"] == "user":
            return FakeReply.tool_call("slow", {"order_id": "A-1"})
        return "all done"

    thread_id = f"lock-lost-{uuid.uuid4().hex[:8]}"
    storage = Storage(PG_URL)
    other = Storage(PG_URL)  # another worker on the same database
    try:
        agent = Agent(FunctionModel(script), tools=[slow], storage=storage)
        thread = agent.thread(thread_id)
        run = asyncio.create_task(thread.send("check A-1"))
        await asyncio.wait_for(started.wait(), 30)

        backend: Any = storage._backend
        lock_session, _ = backend._held[thread_id]
        if how == "session terminated":
            await asyncio.to_thread(_terminate, lock_session.info.backend_pid)
            # The lock went with the session: another worker can take the thread now.
            await other.open()
            other_backend: Any = other._backend
            assert await other_backend.try_lock(thread_id)
            await other_backend.unlock(thread_id)
        else:
            await asyncio.to_thread(_take_over, thread_id)
        before = await asyncio.to_thread(_saved_rows, thread_id)

        release.set()  # the tool finishes; its result must not be written
        with pytest.raises(StorageError) as info:
            await asyncio.wait_for(run, 30)
        assert info.value.code == "lock_lost"
        assert thread_id in str(info.value) and "retry()" in str(info.value)
        assert await asyncio.to_thread(_saved_rows, thread_id) == before

        reply = await thread.retry()
        assert reply.text == "all done"
        assert [m["role"] for m in reply.messages] == ["user", "assistant", "tool", "assistant"]
        # The result refused by the fence was kept and saved once the lock was taken
        # again: the finished call did not run again.
        assert ran == ["A-1"]
        report("postgres_lock_lost", how=how, runs=1, completed=1, code=str(info.value.code))
    finally:
        await storage.close()
        await other.close()


async def test_a_write_of_the_previous_holder_in_flight_makes_the_thread_busy() -> None:
    """Taking a lock that a lost holder's write still uses (its statement has not
    committed) answers busy at once and keeps nothing; once the write is done, the lock
    is taken."""
    require_postgres()
    from criogen_graph.storage.postgres import lock_key, write_key

    thread_id = f"in-flight-{uuid.uuid4().hex[:8]}"
    storage = Storage(PG_URL)
    await storage.open()
    backend: Any = storage._backend
    writer = await psycopg.AsyncConnection.connect(PG_URL)
    try:
        # What `criogen_fence` holds while a write is in flight.
        await writer.execute("SELECT pg_advisory_xact_lock_shared(%s)", (write_key(thread_id),))
        assert await backend.try_lock(thread_id) is False
        async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as probe:
            cur = await probe.execute("SELECT pg_try_advisory_lock(%s)", (lock_key(thread_id),))
            row = await cur.fetchone()
            assert row is not None and row[0], "the session lock was not given back"
            await probe.execute("SELECT pg_advisory_unlock(%s)", (lock_key(thread_id),))
        await writer.commit()  # the write is done
        assert await backend.try_lock(thread_id) is True
        await backend.unlock(thread_id)
    finally:
        await writer.close()
        await storage.close()
