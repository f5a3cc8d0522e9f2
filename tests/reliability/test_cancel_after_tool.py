"""Cancellation that lands just after a tool function returned (issue 15, item 1).

A request timeout or a client disconnect cancels the task running `send` / `stream` /
`approve` at some event-loop iteration after a payment tool returned. Whatever iteration it
lands on, the finished payment must be saved before the cancellation takes effect, so that
`retry()` never pays twice. The test cancels at every iteration k = 0..K after the tool's
return (k = 0: the cancel is requested by the tool itself, as its last act), on memory,
SQLite and PostgreSQL, for a sent, a streamed and an approved run, and counts payments per
call id; each call id must pay exactly once and every thread must end completed.

It also checks what the awaiter sees: a plain `asyncio.CancelledError` (the spec's
cancellation rule), so `asyncio.timeout()` turns it into `TimeoutError`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable
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
from tests.reliability._report import report

#: Event-loop iterations after the tool's return at which the cancellation lands.
K = 40


def _after(k: int, fn: Callable[[], None]) -> None:
    """Call `fn` k event-loop iterations from now (k = 0: now)."""
    if k <= 0:
        fn()
        return
    loop = asyncio.get_running_loop()
    loop.call_soon(_after, k - 1, fn)


class Bank:
    """A payment tool whose every effect is counted by call id, and which cancels the
    task of the current trial `k` iterations after it returns."""

    def __init__(self) -> None:
        self.paid: Counter[str] = Counter()
        self.victim: asyncio.Task[Any] | None = None
        self.k = 0

        @tool
        async def pay(amount: int, ctx: ToolContext) -> str:
            """Pay an amount."""
            await asyncio.sleep(0)
            self.paid[ctx.call_id] += 1
            victim = self.victim
            if victim is not None:
                self.victim = None  # only the first run of a trial is cancelled
                _after(self.k, victim.cancel)
            return f"paid {amount}"

        self.tool = pay


def _model() -> FunctionModel:
    def fn(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        last = messages[-1]
        if last.get("role") == "tool":
            return "Paid."
        return FakeReply.tool_call("pay", {"amount": 50})

    return FunctionModel(fn)


async def _finish(thread: Any) -> None:
    """Continue whatever the cancellation left: retry, or approve a pending call."""
    for _ in range(4):
        if await thread.pending_approvals():
            await thread.approve()
            continue
        try:
            await thread.retry()
        except ValidationError as exc:
            if exc.code != "nothing_to_retry":
                raise
            return
    raise AssertionError("the thread did not settle")


async def _trial(agent: Agent[Any], bank: Bank, mode: str, thread_id: str, k: int) -> str:
    """One trial: returns how the cancelled call ended (`cancelled` or `completed`)."""
    thread = agent.thread(thread_id)
    if mode == "approve":
        reply = await thread.send("pay 50")
        assert reply.needs_approval
        coro: Any = thread.approve()
    elif mode == "stream":

        async def consume() -> Any:
            stream = thread.stream("pay 50")
            async for _ in stream:
                pass
            return await stream.reply()

        coro = consume()
    else:
        coro = thread.send("pay 50")
    task = asyncio.ensure_future(coro)
    bank.victim, bank.k = task, k
    outcome = "completed"
    try:
        await task
    except asyncio.CancelledError:
        assert task.cancelled(), "the awaiter must see a plain asyncio.CancelledError"
        outcome = "cancelled"
    bank.victim = None
    await _finish(thread)
    messages = await thread.messages()
    assert messages[-1]["role"] == "assistant" and messages[-1]["content"] == "Paid."
    tool_msgs = [m for m in messages if m["role"] == "tool"]
    assert len(tool_msgs) == 1 and tool_msgs[0]["status"] == "ok", tool_msgs
    return outcome


@pytest.mark.parametrize("mode", ["send", "stream", "approve"])
async def test_cancellation_after_a_tool_returned_never_pays_twice(
    backend: str, mode: str, tmp_path: Path, thread_id: str
) -> None:
    bank = Bank()
    storage = Storage(storage_url(backend, tmp_path))
    agent = Agent(
        _model(),
        tools=[bank.tool],
        approve=["pay"] if mode == "approve" else [],
        storage=storage,
    )
    outcomes: Counter[str] = Counter()
    try:
        for k in range(K + 1):
            outcomes[await _trial(agent, bank, mode, f"{thread_id}-{k}", k)] += 1
    finally:
        await storage.close()
    duplicates = sum(n - 1 for n in bank.paid.values() if n > 1)
    report(
        f"cancel_after_tool_{mode}_{backend}",
        trials=K + 1,
        cancelled=outcomes["cancelled"],
        completed=outcomes["completed"],
        payments=sum(bank.paid.values()),
        duplicates=duplicates,
    )
    assert duplicates == 0, f"payments run again after a cancellation: {bank.paid}"
    assert len(bank.paid) == K + 1  # one call per trial
    # The cancellation lands inside the run for the first iterations at least.
    assert outcomes["cancelled"] >= 3, outcomes


async def test_asyncio_timeout_around_send_raises_timeout_error(tmp_path: Path) -> None:
    """`asyncio.timeout()` recognises the cancellation it caused (by identity of the
    exception class it expects): the caller gets `TimeoutError`, and the run is saved."""
    started = asyncio.Event()

    @tool
    async def slow() -> str:
        """Take a while."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    storage = Storage(f"sqlite:///{tmp_path}/t.db")
    agent = Agent(
        FunctionModel(
            lambda m, t: "done" if m[-1]["role"] == "tool" else FakeReply.tool_call("slow", {})
        ),
        tools=[slow],
        storage=storage,
    )
    thread = agent.thread("timeout")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await thread.send("go")
    assert started.is_set()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(agent.run("go"), 0.2)
    records = [r["action"] for r in await storage.audit("timeout")]
    assert records[-1] == "run_cancelled", records
    await storage.close()


@pytest.mark.parametrize("outcome", ["returns", "times_out"])
async def test_cancelling_a_run_waits_for_a_running_sync_tool(
    durable_backend: str, tmp_path: Path, thread_id: str, outcome: str
) -> None:
    """A sync tool runs in a worker thread that nothing can stop. Cancelling the run
    while it runs waits for it to return (or reach its timeout), saves that outcome, and
    only then cancels: `retry()` never starts it a second time."""
    import threading

    entered = threading.Event()
    release = threading.Event()
    runs: Counter[str] = Counter()

    @tool(timeout_secs=0.5)
    def transfer(amount: int, ctx: ToolContext) -> str:
        """Transfer money (blocking client)."""
        runs[ctx.call_id] += 1
        entered.set()
        if outcome == "returns":
            release.wait(10)
        else:
            release.wait(2)  # past its 0.5 s timeout
        return f"sent {amount}"

    def model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if messages[-1]["role"] == "tool":
            return "Done."
        return FakeReply.tool_call("transfer", {"amount": 7})

    storage = Storage(storage_url(durable_backend, tmp_path))
    agent = Agent(FunctionModel(model), tools=[transfer], storage=storage)
    thread = agent.thread(thread_id)
    task = asyncio.ensure_future(thread.send("send 7"))
    await asyncio.get_running_loop().run_in_executor(None, entered.wait, 10)
    task.cancel()
    if outcome == "returns":
        # The cancellation waits for the function: let it return now.
        await asyncio.sleep(0)
        assert not task.done()
        release.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)
    saved = [m for m in await thread.messages() if m["role"] == "tool"]
    expected = "ok" if outcome == "returns" else "timeout"
    assert [m["status"] for m in saved] == [expected], saved
    reply = await thread.retry()
    assert reply.text == "Done."
    assert list(runs.values()) == [1]
    release.set()
    await storage.close()


async def test_a_rescued_tool_result_is_saved_as_langgraph_saves_it(tmp_path: Path) -> None:
    """A tool result LangGraph dropped (the run cancelled in the inline step of one task)
    is saved by our storage exactly as LangGraph saves a finished task: same task path,
    same channels and slots. This pins the LangGraph internals the rescue relies on."""
    import sqlite3

    bank = Bank()
    storage = Storage(f"sqlite:///{tmp_path}/r.db")
    agent = Agent(_model(), tools=[bank.tool], storage=storage)
    await agent.thread("normal").send("pay 50")
    task = asyncio.ensure_future(agent.thread("rescued").send("pay 50"))
    bank.victim, bank.k = task, 0
    with pytest.raises(asyncio.CancelledError):
        await task
    await storage.close()

    def tool_writes(thread_id: str) -> list[tuple[str, int, str]]:
        with sqlite3.connect(tmp_path / "r.db") as db:
            rows = db.execute(
                "SELECT task_path, idx, channel FROM writes WHERE thread_id = ? AND "
                "task_id IN (SELECT task_id FROM writes WHERE thread_id = ? AND "
                "channel = 'messages' AND task_path LIKE '%push%') ORDER BY idx",
                (thread_id, thread_id),
            ).fetchall()
        return [tuple(r) for r in rows]

    # The graph's own `tools -> model` edge writes the branch once more on the normal path.
    normal = sorted({(path, channel) for path, _, channel in tool_writes("normal")})
    rescued = [(path, channel) for path, _, channel in tool_writes("rescued")]
    assert normal == [
        ("~__pregel_push, 0000000000, 0000000000", "branch:to:model"),
        ("~__pregel_push, 0000000000, 0000000000", "messages"),
    ]
    assert sorted(w for w in rescued if w[1] != "__error__") == normal
    assert sum(bank.paid.values()) == 2


@pytest.mark.parametrize("helper", ["to_the_end", "uncancelled"])
async def test_work_finishing_as_the_cancellation_lands_keeps_its_result(helper: str) -> None:
    """The primitive under the guarantees above: work that must not be cut off (a tool's
    result, the bookkeeping of a stopped run) keeps its outcome whichever iteration the
    cancellation lands on, including the one where the work itself finishes."""
    from criogen_graph import _aio

    finish: Any = getattr(_aio, helper)

    async def work() -> str:
        for _ in range(3):
            await asyncio.sleep(0)
        return "saved"

    for k in range(1, 8):
        outcome: list[Any] = []

        async def runner(outcome: list[Any] = outcome) -> None:
            outcome.append(await finish(work()))
            outcome.append(_aio.cancel_pending())

        task = asyncio.ensure_future(runner())
        await asyncio.sleep(0)  # the runner is inside `finish`
        _after(k - 1, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if helper == "to_the_end":
            # The result is handed back; the cancellation stays pending unless it came
            # after everything was done.
            assert outcome[0] == "saved", (k, outcome)
        else:
            # The work ran to its end; the cancellation is raised after it.
            assert task.cancelled() or outcome == ["saved", False], (k, outcome)
