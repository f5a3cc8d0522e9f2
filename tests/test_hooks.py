"""Hooks: the six methods, their order, HookAction, tool-call rewrites and skips, errors
and on_end outcomes."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from criogen_graph import (
    Agent,
    CriogenError,
    FakeModel,
    FakeReply,
    FunctionModel,
    Hook,
    HookAction,
    HookContext,
    HookFailedError,
    LimitExceededError,
    ModelError,
    ToolCall,
    ToolError,
    ToolExecutionError,
    ToolResult,
    ValidationError,
    tool,
)


@tool
async def get_weather(city: str) -> dict[str, str]:
    """Weather for a city."""
    return {"city": city, "forecast": "rain"}


@tool
async def get_time(city: str) -> str:
    """Local time in a city."""
    return "12:00"


class Recorder(Hook):
    """Records every call; sync methods."""

    def __init__(self, name: str, log: list[str]) -> None:
        self._name = name
        self.log = log

    @property
    def name(self) -> str:
        return self._name

    def on_start(self, ctx: HookContext) -> None:
        self.log.append(f"{self._name}.on_start")

    def before_model(self, ctx: HookContext) -> None:
        self.log.append(f"{self._name}.before_model")

    def after_model(self, ctx: HookContext) -> None:
        self.log.append(f"{self._name}.after_model")

    def before_tool(self, call: ToolCall) -> None:
        self.log.append(f"{self._name}.before_tool")

    def after_tool(self, call: ToolCall, result: Any) -> None:
        self.log.append(f"{self._name}.after_tool")

    def on_end(self, ctx: HookContext, outcome: str) -> None:
        self.log.append(f"{self._name}.on_end:{outcome}")


class AsyncRecorder(Recorder):
    """The same, async."""

    async def on_start(self, ctx: HookContext) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        super().on_start(ctx)

    async def before_model(self, ctx: HookContext) -> None:  # type: ignore[override]
        super().before_model(ctx)

    async def after_model(self, ctx: HookContext) -> None:  # type: ignore[override]
        super().after_model(ctx)

    async def before_tool(self, call: ToolCall) -> None:  # type: ignore[override]
        super().before_tool(call)

    async def after_tool(self, call: ToolCall, result: Any) -> None:  # type: ignore[override]
        super().after_tool(call, result)

    async def on_end(self, ctx: HookContext, outcome: str) -> None:  # type: ignore[override]
        super().on_end(ctx, outcome)


async def test_order_of_hooks_sync_and_async() -> None:
    log: list[str] = []
    agent = Agent(
        FakeModel([FakeReply.tool_call("get_weather", {"city": "Oslo"}), "Rain."]),
        tools=[get_weather],
        hooks=[Recorder("a", log), AsyncRecorder("b", log)],
    )
    await agent.run("weather?")
    assert log == [
        "a.on_start", "b.on_start",
        "a.before_model", "b.before_model",
        "b.after_model", "a.after_model",
        "a.before_tool", "b.before_tool",
        "b.after_tool", "a.after_tool",
        "a.before_model", "b.before_model",
        "b.after_model", "a.after_model",
        "b.on_end:completed", "a.on_end:completed",
    ]  # fmt: skip


async def test_any_object_with_hook_methods_is_a_hook() -> None:
    calls: list[str] = []
    hook = SimpleNamespace(name="plain", before_model=lambda ctx: calls.append(ctx.run_id))
    result = await Agent(FakeModel(["hi"]), hooks=[hook]).run("go")
    assert calls == [result.run_id]


def test_bad_hooks_are_rejected_at_construction() -> None:
    with pytest.raises(TypeError, match="none of the hook methods"):
        Agent(FakeModel([]), hooks=[object()])
    with pytest.raises(TypeError, match="snake_case"):
        Agent(FakeModel([]), hooks=[SimpleNamespace(beforeModel=lambda ctx: None)])
    with pytest.raises(ValidationError, match="two hooks are named"):
        Agent(FakeModel([]), hooks=[Recorder("x", []), Recorder("x", [])])


async def test_hook_context_and_saved_state() -> None:
    seen: list[tuple[str, int, Any, dict[str, Any], int]] = []

    class Counter(Hook):
        def on_start(self, ctx: HookContext) -> HookAction:
            return HookAction(state={"starts": 1, "models": 0})

        def before_model(self, ctx: HookContext) -> HookAction:
            seen.append(
                ("before", ctx.model_calls, ctx.hook_state, dict(ctx.state), len(ctx.messages))
            )
            return HookAction(state={**ctx.hook_state, "models": ctx.hook_state["models"] + 1})

        def after_model(self, ctx: HookContext) -> None:
            seen.append(
                ("after", ctx.model_calls, ctx.hook_state, dict(ctx.state), len(ctx.messages))
            )

    agent = Agent(
        FakeModel([FakeReply.tool_call("get_time", {"city": "Oslo"}), "Noon."]),
        tools=[get_time],
        hooks=[Counter()],
    )
    result = await agent.run("time?", state={"user": "ada"})
    assert seen == [
        ("before", 0, {"starts": 1, "models": 0}, {"user": "ada"}, 1),
        ("after", 1, {"starts": 1, "models": 1}, {"user": "ada"}, 2),
        ("before", 1, {"starts": 1, "models": 1}, {"user": "ada"}, 3),
        ("after", 2, {"starts": 1, "models": 2}, {"user": "ada"}, 4),
    ]
    assert result.text == "Noon."


async def test_hook_context_state_is_read_only() -> None:
    class Mutator(Hook):
        def before_model(self, ctx: HookContext) -> None:
            ctx.state["user"] = "mallory"  # type: ignore[index]

    with pytest.raises(HookFailedError) as info:
        await Agent(FakeModel(["x"]), hooks=[Mutator()]).run("go", state={"user": "ada"})
    assert isinstance(info.value.__cause__, TypeError)


async def test_before_model_replaces_the_transcript_and_it_is_kept() -> None:
    seen: list[list[dict[str, Any]]] = []

    def script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        seen.append(messages)
        return FakeReply.tool_call("get_time", {"city": "Oslo"}) if len(seen) == 1 else "done"

    class Trim(Hook):
        def before_model(self, ctx: HookContext) -> HookAction | None:
            if ctx.model_calls == 0:
                return HookAction(
                    messages=[
                        {"role": "user", "content": "[redacted] " + ctx.messages[-1]["content"]}
                    ]
                )
            return None

    result = await Agent(FunctionModel(script), tools=[get_time], hooks=[Trim()]).run("secret")
    assert seen[0] == [{"role": "user", "content": "[redacted] secret"}]
    assert result.messages[0] == {"role": "user", "content": "[redacted] secret"}
    assert seen[1][0] == {"role": "user", "content": "[redacted] secret"}  # kept for later calls
    assert len(result.messages) == 4


async def test_after_model_replaces_the_reply() -> None:
    class Polite(Hook):
        def after_model(self, ctx: HookContext) -> HookAction:
            reply = ctx.messages[-1]
            return HookAction(message={**reply, "content": reply["content"] + " Thank you!"})

    result = await Agent(FakeModel(["Done."]), hooks=[Polite()]).run("go")
    assert result.text == "Done. Thank you!"
    assert result.messages[-1]["content"] == "Done. Thank you!"


async def test_after_model_can_rewrite_tool_calls() -> None:
    class Redirect(Hook):
        def after_model(self, ctx: HookContext) -> HookAction | None:
            reply = ctx.messages[-1]
            if reply.get("tool_calls"):
                return HookAction(
                    message={
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [{"name": "get_time", "args": {"city": "Rome"}}],
                    }
                )
            return None

    result = await Agent(
        FakeModel([FakeReply.tool_call("get_weather", {"city": "Oslo"}), "ok"]),
        tools=[get_weather, get_time],
        hooks=[Redirect()],
    ).run("go")
    assert result.messages[1]["tool_calls"][0]["name"] == "get_time"
    assert result.messages[2]["tool_call_id"] == result.messages[1]["tool_calls"][0]["id"]
    assert result.messages[2]["content"] == "12:00"


@pytest.mark.parametrize("method", ["before_model", "after_model"])
async def test_hook_end_stops_the_run(method: str) -> None:
    model = FakeModel([FakeReply.tool_call("get_time", {"city": "Oslo"}), "never"])
    ran: list[str] = []

    @tool
    async def get_time(city: str) -> str:
        """Time."""
        ran.append(city)
        return "12:00"

    hook = SimpleNamespace(
        name="stopper", **{method: lambda ctx: HookAction(end=True, output={"stopped": True})}
    )
    result = await Agent(model, tools=[get_time], hooks=[hook]).run("go")
    assert result.stop_reason == "hook_end" and result.output == {"stopped": True}
    assert ran == []
    if method == "before_model":
        assert model.remaining == 2 and result.model_calls == 0
    else:
        assert result.model_calls == 1
        # the reply's calls are answered as not run, so the transcript stays valid
        assert result.messages[-1]["status"] == "skipped"


async def test_before_tool_rewrites_the_call() -> None:
    class ToRome(Hook):
        name = "to-rome"

        def before_tool(self, call: ToolCall) -> ToolCall:
            return ToolCall(call.call_id, "get_time", {"city": "Rome"})

    result = await Agent(
        FakeModel([FakeReply.tool_call("get_weather", {"city": "Oslo"}), "ok"]),
        tools=[get_weather, get_time],
        hooks=[ToRome()],
    ).run("go")
    msg = result.messages[2]
    assert msg["content"] == "12:00" and msg["changed_by"] == ["to-rome"]
    assert msg["name"] == "get_weather"  # the model's call, answered under its own name


async def test_before_tool_skips_with_a_result_and_after_tool_still_runs() -> None:
    ran: list[str] = []
    after: list[Any] = []

    @tool
    async def expensive(q: str) -> str:
        """Expensive."""
        ran.append(q)
        return "computed"

    class Cache(Hook):
        def before_tool(self, call: ToolCall) -> ToolResult | None:
            return ToolResult({"cached": call.args["q"]}) if call.args["q"] == "hit" else None

        def after_tool(self, call: ToolCall, result: Any) -> None:
            after.append(result)

    result = await Agent(
        FakeModel(
            [FakeReply.tool_calls(("expensive", {"q": "hit"}), ("expensive", {"q": "miss"})), "ok"]
        ),
        tools=[expensive],
        hooks=[Cache()],
    ).run("go")
    hit, miss = result.messages[2:4]
    assert hit["content"] == '{"cached": "hit"}' and hit["status"] == "skipped"
    assert miss["content"] == "computed" and miss["status"] == "ok"
    assert ran == ["miss"]
    assert after == [{"cached": "hit"}, "computed"]
    assert result.tool_calls == 1


async def test_tool_error_from_before_tool_reaches_the_model() -> None:
    class Guard(Hook):
        def before_tool(self, call: ToolCall) -> None:
            if call.args.get("city") == "Atlantis":
                raise ToolError("Atlantis is not a real city")

    result = await Agent(
        FakeModel([FakeReply.tool_call("get_weather", {"city": "Atlantis"}), "sorry"]),
        tools=[get_weather],
        hooks=[Guard()],
    ).run("go")
    msg = result.messages[2]
    assert msg["content"] == "Error: Atlantis is not a real city" and msg["status"] == "error"
    assert result.tool_calls == 0


async def test_after_tool_replaces_the_result() -> None:
    class Shorten(Hook):
        def after_tool(self, call: ToolCall, result: Any) -> Any:
            return result["forecast"]

    result = await Agent(
        FakeModel([FakeReply.tool_call("get_weather", {"city": "Oslo"}), "ok"]),
        tools=[get_weather],
        hooks=[Shorten()],
    ).run("go")
    assert result.messages[2]["content"] == "rain"


async def test_tool_hook_exceptions_count_as_the_tools() -> None:
    class Broken(Hook):
        def after_tool(self, call: ToolCall, result: Any) -> Any:
            raise KeyError("nope")

    agent = Agent(
        FakeModel([FakeReply.tool_call("get_weather", {"city": "Oslo"}), "ok"]),
        tools=[get_weather],
        hooks=[Broken()],
    )
    result = await agent.run("go")
    assert result.messages[2]["content"] == "Error: KeyError: 'nope'"
    failing = Agent(
        FakeModel([FakeReply.tool_call("get_weather", {"city": "Oslo"})]),
        tools=[get_weather],
        hooks=[Broken()],
        on_tool_exception="fail",
    )
    with pytest.raises(ToolExecutionError) as info:
        await failing.run("go")
    assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.parametrize("method", ["on_start", "before_model", "after_model"])
async def test_throw_in_run_hooks_fails_with_hook_failed(method: str) -> None:
    boom = RuntimeError("boom")

    def raiser(*args: Any) -> None:
        raise boom

    outcomes: list[str] = []
    hook = SimpleNamespace(name="bad", **{method: raiser})
    watcher = SimpleNamespace(name="watch", on_end=lambda ctx, outcome: outcomes.append(outcome))
    with pytest.raises(CriogenError) as info:
        await Agent(FakeModel(["x"]), hooks=[watcher, hook]).run("go")
    assert info.value.code == "hook_failed"
    assert info.value.__cause__ is boom
    assert "bad" in str(info.value) and method in str(info.value)
    assert outcomes == ["failed"]


async def test_wrong_return_types_fail_clearly() -> None:
    hook = SimpleNamespace(name="h", before_model=lambda ctx: "oops")
    with pytest.raises(HookFailedError, match="must return a HookAction or None"):
        await Agent(FakeModel(["x"]), hooks=[hook]).run("go")
    hook = SimpleNamespace(name="h", on_start=lambda ctx: HookAction(end=True))
    with pytest.raises(HookFailedError, match="may only save state"):
        await Agent(FakeModel(["x"]), hooks=[hook]).run("go")


async def test_on_end_outcomes_and_it_cannot_change_them() -> None:
    outcomes: list[str] = []

    class Watch(Hook):
        def on_end(self, ctx: HookContext, outcome: str) -> None:
            outcomes.append(outcome)
            raise RuntimeError("ignored")

    @tool
    async def refund(order_id: str) -> str:
        """Refund."""
        return "ok"

    await Agent(FakeModel(["hi"]), hooks=[Watch()]).run("go")
    await Agent(
        FakeModel([FakeReply.tool_call("refund", {"order_id": "1"})]),
        tools=[refund],
        approve=["refund"],
        hooks=[Watch()],
    ).run("go")
    with pytest.raises(ModelError):
        await Agent(FakeModel([FakeReply.error("auth")]), hooks=[Watch()]).run("go")
    with pytest.raises(LimitExceededError):
        await Agent(
            FakeModel([FakeReply.tool_call("refund", {"order_id": "1"})] * 2),
            tools=[refund],
            limits={"model_calls": 1},
            hooks=[Watch()],
        ).run("go")
    assert outcomes == ["completed", "suspended", "failed", "failed"]


class _NamedInInit(Hook):
    """A hook configured per instance: its name is set in `__init__`."""

    def __init__(self, name: str, fail: bool = False) -> None:
        self.name = name
        self.fail = fail

    def before_model(self, ctx: HookContext) -> None:
        if self.fail:
            raise RuntimeError("boom")


async def test_a_hook_may_set_its_name_in_init() -> None:
    first, second = _NamedInInit("audit-eu"), _NamedInInit("audit-us", fail=True)
    assert (first.name, second.name) == ("audit-eu", "audit-us")
    assert Hook().name == "Hook"  # unset: the class name, as before
    # Two instances of one class are two hooks because their names differ.
    agent = Agent(FakeModel(["hi"]), hooks=[first, second])
    with pytest.raises(HookFailedError) as info:
        await agent.run("x")
    assert "'audit-us'" in str(info.value)
    with pytest.raises(ValidationError) as bad:
        _NamedInInit("")
    assert bad.value.code == "invalid_value"
    with pytest.raises(ValidationError, match="unique"):
        Agent(FakeModel(["hi"]), hooks=[_NamedInInit("same"), _NamedInInit("same")])
