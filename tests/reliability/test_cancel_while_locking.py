"""Cancelling a call at any point of taking or giving back the thread's lock leaks
nothing: not the PostgreSQL session lock (cancelling `send()` while the lock statement
was in flight used to leave the session holding it, so every other process found the
thread busy until this one closed its storage), not a `flock`, not the in-process lock,
and no waiter of this process stays stuck.

A sweep cancels the call at the start of event-loop iteration k = 0, 1, 2, ... after the
call starts, until the call finishes first. The sweep runs on an event loop that counts
its iterations (each a round of callbacks, however long it waited for I/O), so every
point where the call could be cancelled is hit, with no busy-waiting in between. After
each cancellation, a second storage on the same database (which holds locks as another
process would: its own session, its own lock files) must find the thread free at once
(`on_busy="fail"`)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import Agent, FakeReply, FunctionModel, Storage
from tests.conftest import storage_url
from tests.reliability._loops import counting_loop, on_counting_loop
from tests.reliability._report import report

#: The sweep fails past this many iterations (a send takes a few hundred at most).
MAX_K = 3000


def _url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """The backend's URL; on PostgreSQL a fresh schema of this test's own, which no other
    process's setup or locks can hold up."""
    if backend == "postgres":
        return str(request.getfixturevalue("pg_schema_url"))
    return storage_url(backend, tmp_path)


def _echo(storage: Storage) -> Agent[Any]:
    def script(messages: list[dict[str, Any]], tools: Any) -> Any:
        return FakeReply.text(f"ack {messages[-1]['content']}")

    return Agent(FunctionModel(script), storage=storage)


async def _outcome(task: asyncio.Task[Any]) -> str:
    try:
        await asyncio.wait_for(task, 30)
    except asyncio.CancelledError:
        return "cancelled"
    return "completed"


def _assert_nothing_held_here(storage: Storage) -> None:
    locks = storage._locks
    assert not locks._held, f"in-process locks still held: {locks._held}"
    assert not any(q for q in locks._waiters.values()), "a waiter is still queued"
    backend: Any = storage._backend
    held = getattr(backend, "_held", None)
    assert not held, f"the PostgreSQL backend still counts locks: {held}"
    files = getattr(backend, "_files", None)
    assert files is None or not files._fds, f"lock files still flocked: {files._fds}"


@pytest.mark.timeout(600)
async def test_cancel_send_at_every_iteration_leaves_the_thread_free(
    durable_backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = _url(durable_backend, tmp_path, request)
    counts: Counter[str] = Counter()

    async def sweep() -> None:
        storage = Storage(url)
        other = Storage(url)  # another process, as far as locks go
        thread_id = f"cancel-lock-{uuid.uuid4().hex}"
        try:
            agent, other_agent = _echo(storage), _echo(other)
            await agent.thread(thread_id).send("warm up")  # opens both lock paths once
            await other_agent.thread(thread_id).send("warm up")
            loop = counting_loop()
            for k in range(MAX_K + 1):
                task = asyncio.create_task(agent.thread(thread_id).send(f"k={k}"))
                loop.at(loop.iteration + 1 + k, task.cancel)
                outcome = await _outcome(task)
                if not loop.disarm():
                    assert outcome == "completed"
                    counts["finished_before_cancel"] += 1
                    break
                counts[outcome] += 1
                # Free at once for everyone else, and nothing left over here (the next
                # send of this storage finds the thread free too).
                reply = await other_agent.thread(thread_id).send(f"after k={k}")
                assert reply.text == f"ack after k={k}"
                _assert_nothing_held_here(storage)
                counts["iterations_swept"] = k + 1
        finally:
            await storage.close()
            await other.close()

    await on_counting_loop(sweep)
    assert counts["finished_before_cancel"] == 1, f"the sweep never got past k={MAX_K}"
    report(
        f"cancel_send_lock_{durable_backend}",
        iterations_swept=counts["iterations_swept"],
        cancelled=counts["cancelled"],
        completed_despite_cancel=counts["completed"],
        busy_after_cancel=0,
    )


@pytest.mark.timeout(600)
@pytest.mark.parametrize("cancelled", ["holder", "waiter"])
async def test_cancel_holder_or_waiter_at_every_iteration_strands_no_waiter(
    durable_backend: str, tmp_path: Path, cancelled: str, request: pytest.FixtureRequest
) -> None:
    """Two sends on one thread of one storage (`on_busy="wait"`): the second waits in
    this process for the first. Cancelling either of them at any iteration lets the other
    one run (the lock passes on, or comes back), and leaves the thread free."""
    url = _url(durable_backend, tmp_path, request)
    counts: Counter[str] = Counter()

    async def sweep() -> None:
        storage = Storage(url, on_busy="wait", busy_timeout_secs=60)
        other = Storage(url)
        thread_id = f"cancel-wait-{uuid.uuid4().hex}"
        try:
            agent, other_agent = _echo(storage), _echo(other)
            await agent.thread(thread_id).send("warm up")
            loop = counting_loop()
            for k in range(MAX_K + 1):
                first = asyncio.create_task(agent.thread(thread_id).send(f"first k={k}"))
                second = asyncio.create_task(agent.thread(thread_id).send(f"second k={k}"))
                victim, survivor = (first, second) if cancelled == "holder" else (second, first)
                loop.at(loop.iteration + 1 + k, victim.cancel)
                outcome = await _outcome(victim)
                fired = loop.disarm()
                # The other one is not stranded: it runs to its end.
                await asyncio.wait_for(survivor, 30)
                if not fired:
                    assert outcome == "completed"
                    counts["finished_before_cancel"] += 1
                    break
                counts[outcome] += 1
                _assert_nothing_held_here(storage)
                await other_agent.thread(thread_id).send(f"after k={k}")
                counts["iterations_swept"] = k + 1
        finally:
            await storage.close()
            await other.close()

    await on_counting_loop(sweep)
    assert counts["finished_before_cancel"] == 1, f"the sweep never got past k={MAX_K}"
    report(
        f"cancel_{cancelled}_lock_{durable_backend}",
        iterations_swept=counts["iterations_swept"],
        cancelled=counts["cancelled"],
        completed_despite_cancel=counts["completed"],
        stranded=0,
    )
