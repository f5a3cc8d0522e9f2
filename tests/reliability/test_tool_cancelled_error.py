"""A tool or hook that raises `asyncio.CancelledError` itself (issue 15, item 13).

Code may raise `CancelledError` without anyone cancelling the run: a client library that
maps its own aborts to it, a future some other task cancelled. While the run's task has
no cancellation requested (`asyncio.current_task().cancelling() == 0`), that is a failure
of the tool (under `on_tool_exception`) or of the hook (`hook_failed`), never LangGraph's
`NodeCancelledError` or a cancelled run. A real cancellation of the run still ends in a
plain `asyncio.CancelledError` for its awaiter, saved, and `retry()` continues it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import (
    Agent,
    FakeReply,
    FunctionModel,
    HookFailedError,
    Storage,
    ToolCall,
    ToolContext,
    ToolExecutionError,
    tool,
)
from tests.conftest import storage_url
from tests.reliability._report import report


def calling(name: str) -> Any:
    def model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if messages[-1]["role"] == "user":
            return FakeReply.tool_call(name, {}, id="c1")
        return "done"

    return model


def make_tools(runs: Counter[str]) -> list[Any]:
    @tool
    async def aborts(ctx: ToolContext) -> str:
        """An async tool whose client raises CancelledError on its own."""
        runs[ctx.call_id] += 1
        raise asyncio.CancelledError()

    @tool
    def aborts_sync(ctx: ToolContext) -> str:
        """A sync tool that raises CancelledError in its worker thread."""
        runs[ctx.call_id] += 1
        raise asyncio.CancelledError()

    @tool
    async def awaits_cancelled(ctx: ToolContext) -> str:
        """Awaits a future that another task cancelled."""
        runs[ctx.call_id] += 1
        fut = asyncio.get_running_loop().create_future()
        fut.cancel()
        return str(await fut)

    return [aborts, aborts_sync, awaits_cancelled]


@pytest.mark.parametrize("name", ["aborts", "aborts_sync", "awaits_cancelled"])
@pytest.mark.parametrize("policy", ["return_to_model", "fail"])
async def test_a_tool_that_raises_cancelled_error_failed(
    name: str, policy: str, backend: str, tmp_path: Path, thread_id: str
) -> None:
    runs: Counter[str] = Counter()
    async with Storage(storage_url(backend, tmp_path)) as storage:
        agent = Agent(
            FunctionModel(calling(name)),
            tools=make_tools(runs),
            on_tool_exception=policy,
            storage=storage,
        )
        thread = agent.thread(thread_id)
        if policy == "fail":
            with pytest.raises(ToolExecutionError) as info:
                await asyncio.wait_for(thread.send("go"), 30)
            assert info.value.call_id == "c1" and "CancelledError" in str(info.value)
            assert (await thread.history(limit=1))[0]["status"] == "failed"
            # It raised: it did not finish, and a retry runs it again (and it fails again).
            with pytest.raises(ToolExecutionError):
                await thread.retry()
            assert runs == Counter({"c1": 2})
        else:
            reply = await asyncio.wait_for(thread.send("go"), 30)
            assert reply.text == "done"
            [result] = [m for m in await thread.messages() if m["role"] == "tool"]
            assert result["status"] == "error" and "CancelledError" in result["content"]
            assert runs == Counter({"c1": 1})
    report(f"tool_raises_cancelled_{name}_{policy}_{backend}", tool_runs=sum(runs.values()))


class Aborting:
    """A hook whose method `where` raises CancelledError on its own."""

    name = "aborting"

    def __init__(self, where: str) -> None:
        self.where = where

    async def _maybe(self, method: str) -> None:
        if method == self.where:
            raise asyncio.CancelledError()

    async def before_model(self, ctx: Any) -> None:
        await self._maybe("before_model")

    async def after_model(self, ctx: Any) -> None:
        await self._maybe("after_model")

    async def before_tool(self, call: ToolCall) -> None:
        await self._maybe("before_tool")

    async def after_tool(self, call: ToolCall, result: Any) -> None:
        await self._maybe("after_tool")


@pytest.mark.parametrize("where", ["before_model", "after_model", "before_tool", "after_tool"])
async def test_a_hook_that_raises_cancelled_error_failed(
    where: str, tmp_path: Path, thread_id: str
) -> None:
    runs: Counter[str] = Counter()

    @tool
    def lookup(ctx: ToolContext) -> str:
        """Look something up."""
        runs[ctx.call_id] += 1
        return "found"

    async with Storage(storage_url("sqlite", tmp_path)) as storage:
        thread = Agent(
            FunctionModel(calling("lookup")),
            tools=[lookup],
            hooks=[Aborting(where)],
            storage=storage,
        ).thread(thread_id)
        if where in ("before_model", "after_model"):
            with pytest.raises(HookFailedError) as info:
                await asyncio.wait_for(thread.send("go"), 30)
            assert info.value.method == where and "CancelledError" in str(info.value)
        else:
            reply = await asyncio.wait_for(thread.send("go"), 30)
            assert reply.text == "done"
            [result] = [m for m in await thread.messages() if m["role"] == "tool"]
            assert result["status"] == "error" and "CancelledError" in result["content"]
            assert runs == Counter({"c1": 1} if where == "after_tool" else {})
    report(f"hook_raises_cancelled_{where}", tool_runs=sum(runs.values()))


async def test_a_real_cancellation_still_cancels(
    backend: str, tmp_path: Path, thread_id: str
) -> None:
    runs: Counter[str] = Counter()
    started = asyncio.Event()
    release = asyncio.Event()

    @tool
    async def waits(ctx: ToolContext) -> str:
        """Waits to be released."""
        runs[ctx.call_id] += 1
        started.set()
        await release.wait()
        return "released"

    async with Storage(storage_url(backend, tmp_path)) as storage:
        thread = Agent(FunctionModel(calling("waits")), tools=[waits], storage=storage).thread(
            thread_id
        )
        task = asyncio.ensure_future(thread.send("go"))
        await asyncio.wait_for(started.wait(), 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 30)
        assert task.cancelled()  # a plain cancellation for the awaiter
        release.set()
        reply = await asyncio.wait_for(thread.retry(), 30)
        assert reply.text == "done"
    assert runs == Counter({"c1": 2})  # cancelled before it finished: the retry ran it
    report(f"run_cancelled_while_tool_waits_{backend}", tool_runs=sum(runs.values()))
