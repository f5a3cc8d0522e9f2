"""Cancellation at every point of a run, and streams left early (issue 15, items 1 and 8).

A `send` is cancelled k event-loop iterations after it started, for every k from 0 until
the run completes before the cancellation lands: while the lock is taken, the head read,
the model called, two tools run concurrently, results saved, the answer saved. After each
cancellation the thread must be free at once (in this process and for another storage
object, i.e. another process's view), continuing it must complete it, each tool effect
must have happened exactly once per call id, and the audit trail must hold exactly one
`run_cancelled` record per cancelled run that had started.

A stream is left with `break` after each of its events in turn; `retry()` right after the
loop must not find the thread busy, and `storage.close()` right after must not lose the
`run_cancelled` record.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import (
    Agent,
    FakeReply,
    FunctionModel,
    Storage,
    ToolContext,
    ValidationError,
    tool,
)
from tests.conftest import storage_url
from tests.reliability._loops import counting_loop, on_counting_loop
from tests.reliability._report import report

#: The most iterations a trial may need before the run outlives the cancellation.
MAX_K = 3000


class Ledger:
    def __init__(self) -> None:
        self.effects: Counter[str] = Counter()

        @tool
        async def pay(amount: int, ctx: ToolContext) -> str:
            """Pay an amount."""
            await asyncio.sleep(0)
            self.effects[ctx.call_id] += 1
            return f"paid {amount}"

        @tool
        def note(text: str, ctx: ToolContext) -> str:
            """Write a note (a sync tool: it runs in a worker thread)."""
            self.effects[ctx.call_id] += 1
            return "noted"

        self.tools = [pay, note]


def _model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    if messages[-1]["role"] == "tool":
        return "All done."
    return FakeReply.tool_calls(("pay", {"amount": 5}), ("note", {"text": "hi"}))


async def _complete(thread: Any) -> None:
    """Bring the thread to a completed answer to the (single) request."""
    for _ in range(3):
        messages = await thread.messages()
        if messages and messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls"):
            return
        try:
            await thread.retry()
        except ValidationError as exc:
            if exc.code != "nothing_to_retry":
                raise
            if not any(m["role"] == "user" for m in messages):
                await thread.send("pay and note")  # the cancelled send saved nothing
    raise AssertionError("the thread did not complete")


def _url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """On PostgreSQL a fresh schema of this test's own (no one else's setup holds it up)."""
    if backend == "postgres":
        return str(request.getfixturevalue("pg_schema_url"))
    return storage_url(backend, tmp_path)


@pytest.mark.timeout(900)
async def test_cancel_send_at_every_iteration(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = _url(backend, tmp_path, request)
    ledger = Ledger()
    counts: Counter[str] = Counter()

    async def sweep() -> None:
        storage = Storage(url, on_busy="fail")
        other = None if backend == "memory" else Storage(url, on_busy="fail")
        agent = Agent(FunctionModel(_model), tools=ledger.tools, storage=storage)
        loop = counting_loop()
        try:
            for k in range(MAX_K + 1):
                thread_id = f"every-{k}-{uuid.uuid4().hex[:8]}"
                thread = agent.thread(thread_id)
                task = asyncio.create_task(thread.send("pay and note"))
                loop.at(loop.iteration + 1 + k, task.cancel)
                try:
                    await asyncio.wait_for(task, 60)
                except asyncio.CancelledError:
                    assert task.cancelled()  # the awaiter's own plain CancelledError
                    counts["cancelled"] += 1
                if not loop.disarm():
                    counts["trials"] = k + 1
                    break
                if other is not None:
                    # Free at once for another process's view of the database.
                    async with other.hold(thread_id):
                        pass
                await _complete(thread)  # right away: never busy
                messages = await thread.messages()
                tools = [m for m in messages if m["role"] == "tool"]
                assert [m["status"] for m in tools] == ["ok", "ok"], messages
                actions = [r["action"] for r in await storage.audit(thread_id)]
                assert actions.count("run_cancelled") <= 1, actions
                counts["run_cancelled_records"] += actions.count("run_cancelled")
        finally:
            await storage.close()
            if other is not None:
                await other.close()

    await on_counting_loop(sweep)
    twice = {c: n for c, n in ledger.effects.items() if n != 1}
    report(
        f"cancel_every_iteration_{backend}",
        iterations_swept=counts["trials"],
        cancelled=counts["cancelled"],
        run_cancelled_records=counts["run_cancelled_records"],
        effects=sum(ledger.effects.values()),
        duplicated_effects=sum(n - 1 for n in twice.values()),
    )
    assert counts["trials"], f"the run never outlived the cancellation (k up to {MAX_K})"
    assert not twice, f"tool calls run more than once: {twice}"
    assert counts["cancelled"] >= 20


@pytest.mark.parametrize("then", ["retry", "close"])
async def test_leaving_a_stream_early_at_every_event(
    backend: str, tmp_path: Path, then: str
) -> None:
    url = storage_url(backend, tmp_path)
    ledger = Ledger()
    storage = Storage(url, on_busy="fail")
    agent = Agent(FunctionModel(_model), tools=ledger.tools, storage=storage)
    left = 0
    index = 0
    try:
        while True:
            thread_id = f"break-{backend}-{then}-{index}-{id(ledger)}"
            thread = agent.thread(thread_id)
            stream = thread.stream("pay and note")
            seen = 0
            async for _ in stream:
                if seen == index:
                    break
                seen += 1
            if seen < index:
                break  # the stream ended before event `index`: every event was tried
            left += 1
            if then == "close" and backend != "memory":
                await storage.close()  # must wait for the run to record its end
                records = await storage.audit(thread_id)
                actions = [r["action"] for r in records]
                finished = "run_cancelled" in actions or (
                    (await thread.messages())[-1].get("content") == "All done."
                )
                assert finished, actions
            await _complete(thread)  # retry() right away: never ThreadBusyError
            index += 1
    finally:
        await storage.close()
    report(
        f"stream_left_early_{then}_{backend}",
        events_tried=index,
        left_early=left,
        duplicated_effects=sum(n - 1 for n in ledger.effects.values() if n > 1),
    )
    assert all(n == 1 for n in ledger.effects.values()), ledger.effects
    assert left >= 8
