"""Hooks that could break a thread (issue 15, item 11).

A `before_model` hook that returns a malformed transcript (`tool_calls` that is a string,
a call without `id` or `name`, ...) must fail the run with `hook_failed` and the reason,
before anything of it is saved, so later `send` / `retry` keep working. And a hook that
changes what it is shown in place (`ctx.messages`, a call's args, its state) must not
change the run: hooks get copies, so this process's cached transcript always matches
what storage holds.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import (
    Agent,
    FakeReply,
    FunctionModel,
    HookAction,
    HookFailedError,
    Storage,
    ToolCall,
    tool,
)
from tests.conftest import storage_url
from tests.reliability._report import report

CALL = {"id": "c1", "name": "lookup", "args": {"order": "A-1", "tags": ["x"]}}

MALFORMED: dict[str, tuple[list[Any], str]] = {
    "tool_calls is a string": (
        [{"role": "assistant", "content": "", "tool_calls": "lookup"}],
        "tool_calls must be a list",
    ),
    "a call is a string": (
        [{"role": "assistant", "content": "", "tool_calls": ["lookup"]}],
        "each tool call",
    ),
    "a call without id": (
        [{"role": "assistant", "content": "", "tool_calls": [{"name": "lookup", "args": {}}]}],
        "'id'",
    ),
    "a call with an empty id": (
        [{"role": "assistant", "tool_calls": [{"id": "", "name": "lookup", "args": {}}]}],
        "'id'",
    ),
    "a call without name": (
        [{"role": "assistant", "content": "", "tool_calls": [{"id": "c9", "args": {}}]}],
        "'name'",
    ),
    "args that are not a dict": (
        [{"role": "assistant", "tool_calls": [{"id": "c9", "name": "lookup", "args": "x"}]}],
        "'args'",
    ),
    "two calls with one id": (
        [
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "c9", "name": "lookup", "args": {}},
                    {"id": "c9", "name": "lookup", "args": {}},
                ],
            }
        ],
        "unique",
    ),
    "a tool result without tool_call_id": (
        [{"role": "tool", "name": "lookup", "content": "ok"}],
        "tool_call_id",
    ),
    "an unknown role": ([{"role": "robot", "content": "hi"}], "role"),
    "a message that is not a dict": ([42], "message"),
}


class OnceBad:
    """Returns a malformed transcript from `before_model` once, then nothing."""

    name = "rewriter"

    def __init__(self, messages: list[Any]) -> None:
        self.messages = messages
        self.calls = 0

    def before_model(self, ctx: Any) -> HookAction | None:
        self.calls += 1
        if self.calls == 1:
            return HookAction(messages=[*ctx.messages, *self.messages])
        return None


@pytest.mark.parametrize("case", list(MALFORMED))
async def test_a_malformed_hook_transcript_fails_the_run_and_saves_nothing_of_it(
    case: str, tmp_path: Path, thread_id: str
) -> None:
    bad, reason = MALFORMED[case]
    hook = OnceBad(bad)
    replies = iter(["first", "after retry", "third"])
    model = FunctionModel(lambda messages, tools: next(replies))

    @tool
    def lookup(order: str) -> str:
        """Look up an order."""
        return "shipped"

    async with Storage(storage_url("sqlite", tmp_path)) as storage:
        thread = Agent(model, tools=[lookup], hooks=[hook], storage=storage).thread(thread_id)
        with pytest.raises(HookFailedError) as info:
            await thread.send("hello")
        assert info.value.code == "hook_failed"
        assert info.value.hook == "rewriter" and info.value.method == "before_model"
        assert reason in str(info.value), str(info.value)
        # Nothing of the hook's transcript was saved: just the user's message.
        assert await thread.messages() == [{"role": "user", "content": "hello"}]
        assert (await thread.retry()).text == "first"
        assert (await thread.send("again")).text == "after retry"
        # A new process reads the same thread.
        async with Storage(storage_url("sqlite", tmp_path)) as other:
            again = Agent(model, tools=[lookup], storage=other).thread(thread_id)
            assert (await again.send("more")).text == "third"
    report(f"hook_transcript_malformed_{case.replace(' ', '_')}", rejected=1, later_runs_ok=3)


class Meddler:
    """Changes everything it is shown, in place, at every hook entry point."""

    name = "meddler"

    def __init__(self) -> None:
        self.seen_states: list[Any] = []

    def _meddle(self, messages: list[dict[str, Any]]) -> None:
        for m in messages:
            m["content"] = "MEDDLED"
            for c in m.get("tool_calls") or ():
                c["args"]["order"] = "MEDDLED"
                c["args"].setdefault("tags", []).append("meddled")
                c["id"] = "meddled"
        messages.append({"role": "user", "content": "injected in place"})

    def on_start(self, ctx: Any) -> HookAction:
        self._meddle(ctx.messages)
        ctx.state["profile"]["tier"] = "MEDDLED"
        return HookAction(state={"runs": [1]})

    def before_model(self, ctx: Any) -> None:
        self.seen_states.append(copy.deepcopy(ctx.hook_state))
        ctx.hook_state["runs"].append("MEDDLED")  # not saved: no HookAction(state=...)
        self._meddle(ctx.messages)
        ctx.state["profile"]["tier"] = "MEDDLED"

    def after_model(self, ctx: Any) -> None:
        self._meddle(ctx.messages)

    def before_tool(self, call: ToolCall) -> None:
        call.args["tags"].append("meddled")

    def after_tool(self, call: ToolCall, result: Any) -> None:
        call.args["tags"].append("meddled")

    def on_end(self, ctx: Any, outcome: str) -> None:
        self._meddle(ctx.messages)


async def test_hooks_that_change_what_they_are_shown_change_nothing(
    backend: str, tmp_path: Path, thread_id: str
) -> None:
    inputs: list[list[dict[str, Any]]] = []
    tool_args: list[Any] = []

    def model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        inputs.append(messages)
        if messages[-1]["role"] == "user":
            return FakeReply.tool_calls(CALL)
        return "done"

    @tool
    def lookup(order: str, tags: list[str]) -> str:
        """Look up an order."""
        tool_args.append((order, list(tags)))
        return "shipped"

    meddler = Meddler()
    async with Storage(storage_url(backend, tmp_path)) as storage:
        thread = Agent(
            FunctionModel(model), tools=[lookup], hooks=[meddler], storage=storage
        ).thread(thread_id)
        state = {"profile": {"tier": "gold"}}
        for text in ("one", "two"):
            reply = await thread.send(text, state=state)
            assert reply.text == "done"
        assert state == {"profile": {"tier": "gold"}}  # the caller's dict is untouched

        cached = await thread.messages()
        storage.checkpointer.transcripts.forget(thread_id)  # read it back from storage
        stored = await thread.messages()
    assert cached == stored
    assert "MEDDLED" not in repr(stored) and "meddled" not in repr(stored)
    assert "injected" not in repr(stored)
    # Every model call was shown exactly what the thread holds at that point.
    for shown in inputs:
        assert shown == stored[: len(shown)]
    assert tool_args == [("A-1", ["x"]), ("A-1", ["x"])]
    # The hook's saved state is what it returned, never what it changed in place.
    assert all(s == {"runs": [1]} for s in meddler.seen_states), meddler.seen_states
    report(f"hook_in_place_changes_{backend}", model_calls=len(inputs), forks=0)
