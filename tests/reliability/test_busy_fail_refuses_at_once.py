"""`on_busy="fail"` refuses at once: a call on a thread another run holds raises
`ThreadBusyError` without waiting for the holder, in the same process and from another
process, on every storage, for every call that takes the thread (send, stream, retry,
rewind, delete), and changes nothing.

The storages here have `busy_timeout_secs=inf`, and the holder keeps the thread until the
refused call has returned: a "fail" caller that waited like a "wait" one would never
return. `asyncio.wait_for` bounds each call to catch exactly that (a bound, not a timing
assertion: it is generous for a loaded machine)."""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import (
    Agent,
    FakeReply,
    FunctionModel,
    Storage,
    ThreadBusyError,
    ToolContext,
    tool,
)
from tests.conftest import storage_url
from tests.reliability._report import report
from tests.reliability.conftest import run_child

#: How long a refused call may take before the test calls it a wait (generous: the
#: refusal itself is a lock attempt, milliseconds even on a loaded machine).
BOUND_SECS = 20


def holding_agent(storage: Storage, holding: Callable[[], None], release: Any) -> Agent[Any]:
    """Calls `hold` once, then answers "done". `hold` calls `holding()` and returns only
    once `release` (an `asyncio.Event`, or a process `Event`) is set."""

    @tool
    async def hold(ctx: ToolContext) -> str:
        """Keep the thread busy."""
        holding()
        if isinstance(release, asyncio.Event):
            await release.wait()
        else:
            await asyncio.to_thread(release.wait)
        return "held"

    def script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if messages[-1]["role"] == "user":
            return FakeReply.tool_call("hold", {})
        return "done"

    return Agent(FunctionModel(script), tools=[hold], storage=storage)


async def first_run(storage: Storage, thread_id: str) -> tuple[str, list[dict[str, Any]]]:
    """A finished run on the thread (for retry and rewind to act on): its head's
    checkpoint id and its messages."""
    release = asyncio.Event()
    release.set()
    thread = holding_agent(storage, lambda: None, release).thread(thread_id)
    await thread.send("first")
    return (await thread.history(limit=1))[0]["id"], await thread.messages()


async def drain(stream: Any) -> Any:
    async for _ in stream:
        pass
    return await stream.reply()


def calls(agent: Agent[Any], thread_id: str, first_checkpoint: str) -> dict[str, Any]:
    """Each call that takes the thread, as a factory of its awaitable."""
    thread = agent.thread(thread_id, actor="second")
    return {
        "send": lambda: thread.send("second"),
        "stream": lambda: drain(thread.stream("second")),
        "retry": thread.retry,
        "rewind": lambda: thread.rewind(first_checkpoint),
        "delete": thread.delete,
    }


async def refused(call: Callable[[], Awaitable[Any]], what: str) -> ThreadBusyError:
    """`call()` raises `ThreadBusyError` within the bound (fails the test if it waits)."""
    try:
        with pytest.raises(ThreadBusyError) as info:
            await asyncio.wait_for(call(), BOUND_SECS)
    except TimeoutError:
        pytest.fail(f"{what}: on_busy='fail' waited for the holder instead of refusing")
    assert info.value.code == "thread_busy"
    return info.value


async def test_fail_refuses_at_once_in_one_process(backend: str, tmp_path: Path) -> None:
    url = storage_url(backend, tmp_path)
    thread_id = f"busy-fail-{uuid.uuid4().hex}"
    storage = Storage(url, on_busy="fail", busy_timeout_secs=math.inf)
    try:
        first_checkpoint, before = await first_run(storage, thread_id)
        holding, release = asyncio.Event(), asyncio.Event()
        agent = holding_agent(storage, holding.set, release)
        holder = asyncio.create_task(agent.thread(thread_id).send("holder"))
        await asyncio.wait_for(holding.wait(), BOUND_SECS)
        for name, call in calls(agent, thread_id, first_checkpoint).items():
            exc = await refused(call, name)
            assert "in this process" in str(exc)
            assert not holder.done()  # refused while the holder still ran
        release.set()
        reply = await asyncio.wait_for(holder, BOUND_SECS)
        # Nothing the refused calls asked for happened: the holder's run follows the first.
        users = [m["content"] for m in reply.messages if m["role"] == "user"]
        assert users == ["first", "holder"]
        assert reply.messages[: len(before)] == before
        assert all(a["actor"] != "second" for a in await storage.audit(thread_id))
    finally:
        await storage.close()
    report(f"busy_fail_in_process_{backend}", calls_refused=5, waited=0)


def hold_in_child(url: str, thread_id: str, holding: Any, release: Any) -> None:
    """Child: send on the thread and keep it until `release` is set."""

    async def main() -> None:
        async with Storage(url) as storage:
            await holding_agent(storage, holding.set, release).thread(thread_id).send("holder")

    asyncio.run(main())


@pytest.mark.timeout(300)
async def test_fail_refuses_at_once_across_processes(
    durable_backend: str, tmp_path: Path, forkserver: Any
) -> None:
    url = storage_url(durable_backend, tmp_path)
    thread_id = f"busy-fail-{uuid.uuid4().hex}"
    storage = Storage(url, on_busy="fail", busy_timeout_secs=math.inf)
    try:
        first_checkpoint, before = await first_run(storage, thread_id)
        agent = holding_agent(storage, lambda: None, asyncio.Event())
        holding, held = forkserver.Event(), forkserver.Event()
        proc = run_child(forkserver, hold_in_child, url, thread_id, holding, held)
        try:
            assert await asyncio.to_thread(holding.wait, 60), "the child never held the thread"
            for name, call in calls(agent, thread_id, first_checkpoint).items():
                exc = await refused(call, name)
                assert "another process" in str(exc)
                assert proc.is_alive()  # refused while the holder still ran
        finally:
            held.set()
            await asyncio.to_thread(proc.join, 60)
        assert proc.exitcode == 0
        after = await agent.thread(thread_id).messages()
        assert [m["content"] for m in after if m["role"] == "user"] == ["first", "holder"]
        assert after[: len(before)] == before
        assert all(a["actor"] != "second" for a in await storage.audit(thread_id))
    finally:
        await storage.close()
    report(f"busy_fail_across_processes_{durable_backend}", calls_refused=5, waited=0)
