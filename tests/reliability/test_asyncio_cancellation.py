"""Cancellation that composes with asyncio (issue 19, item 5).

`asyncio.timeout`, `asyncio.wait_for` and a `TaskGroup` whose sibling fails all cancel
the task awaiting a run. Each must behave as asyncio documents it: `timeout` and
`wait_for` raise `TimeoutError`, the group raises the sibling's error in an
`ExceptionGroup`, and a plain cancellation is a plain `asyncio.CancelledError` that an
`except Exception` around the call does not swallow. After each, the thread is saved and
usable: `retry()` continues it and a tool that finished never runs again. On memory,
SQLite and PostgreSQL, for `send`, a consumed `stream`, `approve` and `Agent.run`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import Agent, FakeReply, FunctionModel, Storage, Thread, tool
from tests.conftest import storage_url

Construct = Callable[[Callable[[], Awaitable[Any]]], Awaitable[None]]


class Sibling(Exception):
    """What the failing sibling task of the group raises."""


class World:
    """A payment tool that finishes, then a slow lookup that hangs until cancelled (so the
    cancellation lands after a finished tool); counts every payment by call id."""

    def __init__(self) -> None:
        self.paid: Counter[str] = Counter()
        self.hanging = asyncio.Event()
        self.hang = True

        @tool
        async def pay(amount: int) -> str:
            """Pay an amount."""
            self.paid[str(amount)] += 1
            return f"paid {amount}"

        @tool
        async def lookup() -> str:
            """Look something up (slowly)."""
            if self.hang:
                self.hanging.set()
                await asyncio.Event().wait()
            return "found"

        self.tools = [pay, lookup]

    def model(self) -> FunctionModel:
        def answer(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
            ran = {m.get("name") for m in messages if m["role"] == "tool"}
            if "pay" not in ran:
                return FakeReply.tool_call("pay", {"amount": 7})
            if "lookup" not in ran:
                return FakeReply.tool_call("lookup", {})
            return "all done"

        return FunctionModel(answer)


async def _timeout(start: Callable[[], Awaitable[Any]], world: World) -> None:
    # The deadline is set to "now" once the run hangs in the tool after the payment, so
    # it lands there whatever the machine's speed.
    async def timed() -> None:
        async with asyncio.timeout(None) as deadline:

            async def expire() -> None:
                await world.hanging.wait()
                deadline.reschedule(asyncio.get_running_loop().time())

            watcher = asyncio.create_task(expire())
            try:
                await start()
            finally:
                watcher.cancel()

    with pytest.raises(TimeoutError):
        await timed()


async def _wait_for(start: Callable[[], Awaitable[Any]]) -> None:
    # wait_for's deadline cannot be moved: long enough for the payment to finish on a
    # loaded machine (the storage is open already), short enough to keep the test quick.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(start(), 3)


async def _task_group(start: Callable[[], Awaitable[Any]], world: World) -> None:
    async def sibling() -> None:
        await world.hanging.wait()
        raise Sibling("the sibling failed")

    async def grouped() -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(start())
            group.create_task(sibling())

    with pytest.raises(ExceptionGroup) as info:
        await grouped()
    # Only the sibling's error: the cancelled run adds no error of its own.
    assert [type(e) for e in info.value.exceptions] == [Sibling]


async def _cancel_through_except_exception(
    start: Callable[[], Awaitable[Any]], world: World
) -> None:
    swallowed = False

    async def guarded() -> None:
        nonlocal swallowed
        try:
            await start()
        except Exception:
            swallowed = True

    task = asyncio.create_task(guarded())
    await world.hanging.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError) as info:
        await task
    assert type(info.value) is asyncio.CancelledError
    assert not swallowed


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    url = storage_url(request.param, tmp_path)
    store = Storage(url)
    yield store
    await store.close()


CONSTRUCTS = ["timeout", "wait_for", "task_group", "except_exception"]
ACTIONS = ["send", "stream", "approve"]


async def _apply(construct: str, start: Callable[[], Awaitable[Any]], world: World) -> None:
    if construct == "timeout":
        await _timeout(start, world)
    elif construct == "wait_for":
        await _wait_for(start)
    elif construct == "task_group":
        await _task_group(start, world)
    else:
        await _cancel_through_except_exception(start, world)


def _action(action: str, thread: Thread[Any]) -> Callable[[], Awaitable[Any]]:
    if action == "send":
        return lambda: thread.send("pay and look up")
    if action == "stream":

        async def consume() -> Any:
            async with thread.stream("pay and look up") as stream:
                async for _ in stream:
                    pass
            return await stream.reply()

        return consume
    return lambda: thread.approve()


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("construct", CONSTRUCTS)
async def test_asyncio_constructs_cancel_cleanly_and_the_thread_continues(
    storage: Storage, construct: str, action: str
) -> None:
    world = World()
    approve = ["pay"] if action == "approve" else []
    agent = Agent(world.model(), tools=world.tools, approve=approve, storage=storage)
    await storage.open()
    thread = agent.thread(f"aio-{construct}-{action}-{uuid.uuid4().hex}")
    if action == "approve":
        asked = await thread.send("pay and look up")
        assert asked.needs_approval and not world.paid
    start = _action(action, thread)
    await _apply(construct, start, world)
    assert world.paid == Counter({"7": 1})
    world.hang = False
    reply = await thread.retry()
    assert reply.text == "all done"
    assert world.paid == Counter({"7": 1}), "a finished payment ran again"
    saved = [m.get("name") for m in await thread.messages() if m["role"] == "tool"]
    assert saved == ["pay", "lookup"]


@pytest.mark.parametrize("construct", CONSTRUCTS)
async def test_agent_run_composes_with_asyncio(construct: str) -> None:
    world = World()
    agent = Agent(world.model(), tools=world.tools)
    await _apply(construct, lambda: agent.run("pay and look up"), world)
    assert world.paid == Counter({"7": 1})
