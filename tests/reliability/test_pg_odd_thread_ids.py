"""An odd thread id (too long for a database key, a NUL, a lone surrogate) must be refused
at once with `ValidationError`, and must never disturb the other runs of the process: on
PostgreSQL one oversized id used to make the lock-table insert fail, the error was taken
for a dead connection, the shared lock connection was closed, and every other run in
flight lost its lock (`lock_lost`), so `retry()` ran finished tools again. A statement
error on the lock connection or a pooled one (whatever its exception class) is the
statement's, never a lost connection."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from criogen_graph import (
    Agent,
    FakeReply,
    FunctionModel,
    Storage,
    StorageError,
    ToolContext,
    ValidationError,
    tool,
)
from tests.conftest import storage_url
from tests.reliability._report import report

#: The documented maximum length of a thread id, in UTF-8 bytes.
MAX_BYTES = 1024


def _incompressible(n_bytes: int, seed: str) -> str:
    """A thread id of exactly `n_bytes` UTF-8 bytes of random characters of every width
    (1 to 4 bytes), which no database can compress into a shorter key."""
    rng = random.Random(seed)
    ranges = [(0x21, 0x7E), (0xA1, 0x7FF), (0x800, 0xD7FF), (0xE000, 0xFFFD), (0x10000, 0x10FFFF)]
    out: list[str] = []
    size = 0
    while size < n_bytes:
        lo, hi = rng.choice(ranges)
        ch = chr(rng.randint(lo, hi))
        width = len(ch.encode("utf-8"))
        if size + width > n_bytes:
            ch = chr(rng.randint(0x21, 0x7E))
            width = 1
        out.append(ch)
        size += width
    text = "".join(out)
    assert len(text.encode("utf-8")) == n_bytes
    return text


#: Ids no backend can keep: each must be refused before anything is read or written.
ODD_IDS: dict[str, str] = {
    "oversized_random_3kB": _incompressible(3000, "big"),
    "oversized_ascii_4kB": "x" * 4096,
    "one_byte_over_max": _incompressible(MAX_BYTES + 1, "over"),
    "one_byte_over_max_multibyte": "é" * (MAX_BYTES // 2) + "a",
    "nul": "ticket\x00-42",
    "lone_high_surrogate": "ticket-\ud800",
    "lone_low_surrogate": "\udfff",
}


def _url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """The backend's URL; on PostgreSQL a fresh schema of this test's own, which no other
    process's setup or locks can hold up."""
    if backend == "postgres":
        return str(request.getfixturevalue("pg_schema_url"))
    return storage_url(backend, tmp_path)


def _gated_agent(storage: Storage, gate: asyncio.Event, ran: Counter[str]) -> Agent[Any]:
    """One tool call per run (`work`, which counts its runs per call id and waits at
    `gate`), then "done"."""

    @tool
    async def work(job: str, ctx: ToolContext) -> str:
        """Do a job."""
        ran[ctx.call_id] += 1
        await gate.wait()
        return f"{job} done"

    def script(messages: list[dict[str, Any]], tools: Any) -> Any:
        if messages[-1]["role"] == "user":
            return FakeReply.tool_call("work", {"job": messages[-1]["content"]})
        return "done"

    return Agent(FunctionModel(script), tools=[work], storage=storage)


async def _in_flight(
    agent: Agent[Any], ran: Counter[str], runs: list[asyncio.Task[Any]], n: int
) -> list[str]:
    """Start `n` runs on threads of their own (into `runs`); return once each one's tool
    is running (holding its thread's lock)."""
    ids = [f"inflight-{i}-{uuid.uuid4().hex[:8]}" for i in range(n)]
    runs += [asyncio.create_task(agent.thread(t).send(f"job {i}")) for i, t in enumerate(ids)]
    for _ in range(2000):
        if len(ran) == n or any(r.done() for r in runs):
            break
        await asyncio.sleep(0.005)
    assert len(ran) == n, [r.exception() for r in runs if r.done()]
    return ids


async def _settle(runs: list[asyncio.Task[Any]]) -> None:
    """Let the runs end before their storage closes (a failing test leaves them)."""
    if runs:
        await asyncio.wait(runs, timeout=30)


@pytest.mark.timeout(120)
async def test_odd_thread_ids_are_refused_at_once_and_no_run_in_flight_is_disturbed(
    pg_schema_url: str,
) -> None:
    storage = Storage(pg_schema_url)
    gate = asyncio.Event()
    ran: Counter[str] = Counter()
    runs: list[asyncio.Task[Any]] = []
    try:
        agent = _gated_agent(storage, gate, ran)
        ids = await _in_flight(agent, ran, runs, 3)
        backend: Any = storage._backend
        lock_session = backend._lock_conn

        refused: Counter[str] = Counter()
        for name, bad in ODD_IDS.items():
            with pytest.raises(ValidationError) as info:
                await agent.thread(bad).send("hello")
            assert info.value.code == "invalid_value", name
            assert "thread id" in str(info.value), name
            with pytest.raises(ValidationError):
                await storage.audit(bad)
            # LangGraph's own entry (the checkpointer, as `langgraph dev` or a parent
            # graph uses it) refuses it too, before any statement.
            with pytest.raises(ValidationError):
                await storage.checkpointer.aget_tuple({"configurable": {"thread_id": bad}})
            refused[name] += 1
        assert (
            "1024" in str(info.value) or "NUL" in str(info.value) or "surrogate" in str(info.value)
        )

        # The runs in flight never noticed: same lock session, all complete, each tool
        # ran once.
        assert backend._lock_conn is lock_session and not lock_session.closed
        gate.set()
        replies = await asyncio.wait_for(asyncio.gather(*runs, return_exceptions=True), 60)
        errors = [r for r in replies if isinstance(r, BaseException)]
        assert not errors, errors
        assert [r.text for r in replies] == ["done"] * len(ids)  # type: ignore[union-attr]
        assert sorted(ran.values()) == [1] * len(ids)
        report(
            "postgres_odd_thread_ids",
            odd_ids=len(ODD_IDS),
            refused=sum(refused.values()),
            runs_in_flight=len(ids),
            completed=len(replies) - len(errors),
            lock_lost=sum(getattr(e, "code", "") == "lock_lost" for e in errors),
            tools_rerun=sum(n - 1 for n in ran.values()),
        )
    finally:
        gate.set()
        await _settle(runs)
        await storage.close()


@pytest.mark.timeout(120)
async def test_the_longest_thread_id_works_on_every_backend(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """An id of exactly the maximum (random characters of every UTF-8 width, which no
    index can compress) is a thread like any other: run, history, audit, list, delete."""
    thread_id = _incompressible(MAX_BYTES, f"max-{uuid.uuid4().hex}")
    storage = Storage(_url(backend, tmp_path, request))
    gate = asyncio.Event()
    gate.set()
    ran: Counter[str] = Counter()
    try:
        agent = _gated_agent(storage, gate, ran)
        thread = agent.thread(thread_id, actor="ada")
        assert thread.id == thread_id
        reply = await thread.send("the longest id")
        assert reply.text == "done"
        again = await thread.send("once more")
        assert again.version > reply.version
        assert [m["role"] for m in await thread.messages()] == [
            "user", "assistant", "tool", "assistant",
            "user", "assistant", "tool", "assistant",
        ]  # fmt: skip
        assert len(await thread.history()) >= 2
        assert thread_id in await storage.threads()
        actions = [r["action"] for r in await storage.audit(thread_id)]
        assert actions.count("send") == 2 and actions.count("tool_call") == 2
        assert await thread.delete()
        assert thread_id not in await storage.threads()
        assert [r["action"] for r in await storage.audit(thread_id)][-1] == "delete"
        report(f"longest_thread_id_{backend}", id_bytes=MAX_BYTES, runs=2, deleted=1)
    finally:
        await storage.close()


_POISON = """
CREATE FUNCTION criogen_test_poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.thread_id LIKE 'poison-%' THEN
        RAISE EXCEPTION 'index row size exceeds btree maximum (simulated)'
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER criogen_test_poison_lock BEFORE INSERT OR UPDATE ON criogen_locks
    FOR EACH ROW WHEN (NEW.thread_id = 'poison-lock') EXECUTE FUNCTION criogen_test_poison();
CREATE TRIGGER criogen_test_poison_write BEFORE INSERT ON checkpoints
    FOR EACH ROW WHEN (NEW.thread_id = 'poison-write') EXECUTE FUNCTION criogen_test_poison();
"""


@pytest.mark.timeout(120)
async def test_a_statement_error_is_never_taken_for_a_lost_connection(pg_schema_url: str) -> None:
    """psycopg raises SQLSTATE class 54 (program_limit_exceeded) as an
    `OperationalError`, the class of a dropped connection. A statement failing that way
    (simulated by a trigger, on the lock statement and on a checkpoint write) fails that
    call alone, with a `StorageError` that names the SQLSTATE; the connection stays, and
    the other runs in flight keep their locks and complete."""
    storage = Storage(pg_schema_url)
    gate = asyncio.Event()
    ran: Counter[str] = Counter()
    runs: list[asyncio.Task[Any]] = []
    try:
        await storage.open()
        with psycopg.connect(pg_schema_url, autocommit=True) as conn:
            conn.execute(_POISON)
        agent = _gated_agent(storage, gate, ran)
        ids = await _in_flight(agent, ran, runs, 3)
        backend: Any = storage._backend
        lock_session = backend._lock_conn

        codes: dict[str, str] = {}
        for poisoned in ("poison-lock", "poison-write"):
            with pytest.raises(StorageError) as info:
                await asyncio.wait_for(agent.thread(poisoned).send("x"), 30)
            assert info.value.code == "database_error", (poisoned, info.value)
            assert "54000" in str(info.value), str(info.value)
            codes[poisoned] = info.value.code
        assert backend._lock_conn is lock_session and not lock_session.closed
        # The poisoned threads' session locks were given back: another session takes them.
        from criogen_graph.storage.postgres import lock_key

        with psycopg.connect(pg_schema_url, autocommit=True) as conn:
            for poisoned in ("poison-lock", "poison-write"):
                row = conn.execute("SELECT pg_try_advisory_lock(%s)", (lock_key(poisoned),))
                assert row.fetchone() == (True,), poisoned
                conn.execute("SELECT pg_advisory_unlock(%s)", (lock_key(poisoned),))

        gate.set()
        replies = await asyncio.wait_for(asyncio.gather(*runs, return_exceptions=True), 60)
        errors = [r for r in replies if isinstance(r, BaseException)]
        assert not errors, errors
        assert sorted(ran.values()) == [1] * len(ids)
        report(
            "postgres_statement_error_not_connection_loss",
            poisoned_calls=len(codes),
            runs_in_flight=len(ids),
            completed=len(replies),
            lock_lost=0,
            tools_rerun=sum(n - 1 for n in ran.values()),
        )
    finally:
        gate.set()
        await _settle(runs)
        await storage.close()
