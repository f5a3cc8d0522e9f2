"""Tools: schemas from hints and docstrings, validation, context, concurrency, order,
timeouts, retries, exception policies, return_direct."""

from __future__ import annotations

import asyncio
import threading
from typing import Annotated, Any, Literal

import pydantic
import pytest

from criogen_graph import (
    Agent,
    FakeModel,
    FakeReply,
    FunctionModel,
    Limits,
    Retry,
    Tool,
    ToolContext,
    ToolError,
    ToolExecutionError,
    ValidationError,
    tool,
)


def tool_messages(result: Any) -> list[dict[str, Any]]:
    return [m for m in result.messages if m["role"] == "tool"]


class Address(pydantic.BaseModel):
    city: str
    zip: str | None = None


def test_schema_from_hints_and_docstring() -> None:
    @tool
    def ship(
        order_id: str, address: Address, express: bool = False, mode: Literal["air", "sea"] = "air"
    ) -> str:
        """Ship an order.

        Args:
            order_id: The order to ship.
            address: Where it goes.
        """
        return "ok"

    spec = ship.spec()
    assert spec["name"] == "ship"
    assert spec["description"] == "Ship an order."
    params = spec["parameters"]
    assert params["type"] == "object"
    assert params["required"] == ["order_id", "address"]
    assert params["properties"]["order_id"] == {
        "type": "string",
        "description": "The order to ship.",
    }
    assert params["properties"]["express"]["type"] == "boolean"
    assert params["properties"]["mode"]["enum"] == ["air", "sea"]
    assert params["additionalProperties"] is False
    # nested models are described too
    assert "Address" in params.get("$defs", {})


def test_decorator_options_and_direct_call() -> None:
    @tool(
        name="lookup",
        description="Find things.",
        read_only=True,
        return_direct=True,
        timeout_secs=3,
    )
    async def find(q: str) -> str:
        return q

    assert (find.name, find.description, find.read_only, find.return_direct, find.timeout_secs) == (
        "lookup",
        "Find things.",
        True,
        True,
        3,
    )
    assert find.retryable and not find.idempotent
    assert asyncio.run(find("x")) == "x"  # the function stays callable


def test_context_parameter_is_not_in_schema() -> None:
    @tool
    def whoami(ctx: ToolContext, greeting: str = "hi") -> str:
        """Say who calls."""
        return greeting

    assert list(whoami.spec()["parameters"]["properties"]) == ["greeting"]


@pytest.mark.parametrize(
    ("fn_src", "needle"),
    [
        ("def f(x): return x", "no type hint"),
        ("def f(*args: int): return 1", "*args"),
        ("def f(x: threading.Lock): return 1", "cannot make an input schema"),
        ("def f(x: 'Missing'): return 1", "cannot be resolved"),
    ],
)
def test_hints_that_cannot_make_a_schema_fail_at_decoration(fn_src: str, needle: str) -> None:
    ns: dict[str, Any] = {"threading": threading}
    exec(fn_src, ns)
    with pytest.raises(TypeError, match=needle.replace("*", r"\*")):
        tool(ns["f"])


def test_bad_tool_names_are_rejected() -> None:
    with pytest.raises(ValidationError) as info:
        tool(name="has space", description="d", run=lambda a: a)
    assert info.value.code == "invalid_value"


async def test_functional_tool_validates_against_json_schema() -> None:
    seen: list[dict[str, Any]] = []

    def run(args: dict[str, Any]) -> int:
        seen.append(args)
        return args["a"] + args["b"]

    add = tool(
        name="add",
        description="Add two numbers.",
        input={
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
        run=run,
    )
    agent = Agent(
        FakeModel([FakeReply.tool_calls(("add", {"a": 2, "b": 3}), ("add", {"a": 2})), "5"]),
        tools=[add],
    )
    result = await agent.run("2+3?")
    ok, bad = tool_messages(result)
    assert ok["content"] == "5" and ok["status"] == "ok"
    assert bad["status"] == "error" and bad["error_kind"] == "invalid_args"
    assert "'b' is a required property" in bad["content"]
    assert seen == [{"a": 2, "b": 3}]  # the invalid call never reached the function
    assert result.tool_calls == 1


async def test_functional_tool_gets_context_when_it_takes_two_arguments() -> None:
    got: list[ToolContext] = []

    async def run(args: dict[str, Any], ctx: ToolContext) -> str:
        got.append(ctx)
        return "ok"

    t = tool(name="probe", description="Probe.", run=run)
    agent = Agent(FakeModel([FakeReply.tool_call("probe", {}, id="c1"), "done"]), tools=[t])
    result = await agent.run("go", state={"user_id": "ada"})
    assert got[0].call_id == "c1" and got[0].run_id == result.run_id
    assert got[0].tool == "probe" and got[0].thread_id is None
    assert dict(got[0].state) == {"user_id": "ada"}


async def test_sync_tools_run_off_the_event_loop() -> None:
    loop_thread = threading.get_ident()
    ran_in: list[int] = []

    @tool
    def blocking(x: int) -> int:
        """Blocks its thread."""
        ran_in.append(threading.get_ident())
        return x * 2

    agent = Agent(FakeModel([FakeReply.tool_call("blocking", {"x": 21}), "42"]), tools=[blocking])
    result = await agent.run("go")
    assert tool_messages(result)[0]["content"] == "42"
    assert ran_in and ran_in[0] != loop_thread


async def test_arguments_are_coerced_and_models_passed_as_models() -> None:
    got: list[Any] = []

    @tool
    async def ship(address: Address, count: int) -> str:
        """Ship."""
        got.append((address, count))
        return "ok"

    agent = Agent(
        FakeModel(
            [FakeReply.tool_call("ship", {"address": {"city": "Oslo"}, "count": "3"}), "done"]
        ),
        tools=[ship],
    )
    await agent.run("go")
    assert got == [(Address(city="Oslo"), 3)]


async def test_unknown_tool_and_extra_args_go_back_to_the_model() -> None:
    @tool
    async def ping() -> str:
        """Ping."""
        return "pong"

    seen: list[list[dict[str, Any]]] = []

    def script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        seen.append(messages)
        if len(seen) == 1:
            return FakeReply.tool_calls(("pong", {}), ("ping", {"loud": True}))
        return "gave up"

    result = await Agent(FunctionModel(script), tools=[ping]).run("go")
    unknown, extra = tool_messages(result)
    assert unknown["error_kind"] == "unknown_tool" and "Available tools: ping" in unknown["content"]
    assert extra["error_kind"] == "invalid_args" and "loud" in extra["content"]
    # the model saw both errors and the run went on
    assert [m["role"] for m in seen[1][-2:]] == ["tool", "tool"]
    assert result.text == "gave up" and result.tool_calls == 0


async def test_calls_of_one_reply_run_concurrently_and_come_back_in_call_order() -> None:
    second_started = asyncio.Event()
    finished: list[str] = []

    @tool
    async def first() -> str:
        """Waits until the second call has started: deadlocks unless calls run concurrently."""
        await second_started.wait()
        await asyncio.sleep(0)
        finished.append("first")
        return "one"

    @tool
    async def second() -> str:
        """Starts, then finishes before the first."""
        second_started.set()
        finished.append("second")
        return "two"

    agent = Agent(
        FakeModel([FakeReply.tool_calls(("first", {}), ("second", {})), "done"]),
        tools=[first, second],
    )
    result = await asyncio.wait_for(agent.run("go"), timeout=10)
    assert finished == ["second", "first"]
    calls = result.messages[1]["tool_calls"]
    results = tool_messages(result)
    assert [m["tool_call_id"] for m in results] == [c["id"] for c in calls]
    assert [m["content"] for m in results] == ["one", "two"]


async def test_many_calls_keep_call_order() -> None:
    @tool
    async def echo(i: int) -> int:
        """Echo."""
        await asyncio.sleep(0)
        return i

    n = 25
    agent = Agent(
        FakeModel([FakeReply.tool_calls(*[("echo", {"i": i}) for i in range(n)]), "done"]),
        tools=[echo],
        limits={"tool_calls": n},
    )
    result = await agent.run("go")
    assert [m["content"] for m in tool_messages(result)] == [str(i) for i in range(n)]
    assert result.tool_calls == n


async def test_timeout_goes_back_to_the_model_as_an_error() -> None:
    never = asyncio.Event()
    stopped: list[str] = []

    @tool(timeout_secs=0.05)
    async def hang() -> str:
        """Never returns."""
        try:
            await never.wait()
        finally:
            stopped.append("hang")
        return "unreachable"

    @tool
    async def hang_default() -> str:
        """Never returns either; bounded by the agent's limit."""
        try:
            await never.wait()
        finally:
            stopped.append("hang_default")
        return "unreachable"

    agent = Agent(
        FakeModel([FakeReply.tool_calls(("hang", {}), ("hang_default", {})), "moved on"]),
        tools=[hang, hang_default],
        limits=Limits(tool_timeout_secs=0.1),
    )
    # The test's own bound (the timeouts are 0.05 and 0.1 s): a timeout that does not
    # stop the tool fails here, not when the suite's global timeout kills pytest.
    try:
        result = await asyncio.wait_for(agent.run("go"), 20)
    except TimeoutError:
        pytest.fail("the tools' timeouts did not stop them: the run hung")
    a, b = tool_messages(result)
    assert a["status"] == "timeout" and "timed out after 0.05 s" in a["content"]
    assert b["status"] == "timeout" and "0.1 s" in b["content"]
    assert result.text == "moved on"
    # Both hung tools were really cancelled (their `finally` ran) before the run returned.
    assert sorted(stopped) == ["hang", "hang_default"]


async def test_tool_retry_only_for_read_only_or_idempotent_tools() -> None:
    attempts = {"flaky_read": 0, "flaky_write": 0}

    @tool(read_only=True)
    async def flaky_read() -> str:
        """Fails twice, then works."""
        attempts["flaky_read"] += 1
        if attempts["flaky_read"] < 3:
            raise ConnectionError("blip")
        return "read"

    @tool
    async def flaky_write() -> str:
        """Fails once: not retried, it has side effects."""
        attempts["flaky_write"] += 1
        raise ConnectionError("blip")

    agent = Agent(
        FakeModel([FakeReply.tool_calls(("flaky_read", {}), ("flaky_write", {})), "done"]),
        tools=[flaky_read, flaky_write],
        tool_retry=Retry(max_attempts=3, initial_backoff_secs=0, jitter=False),
    )
    result = await agent.run("go")
    read, write = tool_messages(result)
    assert read["status"] == "ok" and read["content"] == "read"
    assert write["status"] == "error" and "ConnectionError: blip" in write["content"]
    assert attempts == {"flaky_read": 3, "flaky_write": 1}
    assert result.tool_calls == 2  # retries of one call count once


async def test_tool_error_always_reaches_the_model() -> None:
    @tool
    async def get_order(order_id: str) -> dict[str, str]:
        """Look up an order."""
        raise ToolError(f"No order {order_id}")

    for policy in ("return_to_model", "return_generic", "fail"):
        agent = Agent(
            FakeModel([FakeReply.tool_call("get_order", {"order_id": "B"}), "sorry"]),
            tools=[get_order],
            on_tool_exception=policy,
        )
        result = await agent.run("where is B?")
        (msg,) = tool_messages(result)
        assert msg["content"] == "Error: No order B" and msg["status"] == "error"
        assert result.text == "sorry"


async def test_exception_policies() -> None:
    @tool
    async def broken() -> str:
        """Raises."""
        raise ValueError("disk full")

    def agent(policy: str) -> Agent[Any]:
        return Agent(
            FakeModel([FakeReply.tool_call("broken", {}, id="c1"), "noted"]),
            tools=[broken],
            on_tool_exception=policy,
        )

    result = await agent("return_to_model").run("go")
    (msg,) = tool_messages(result)
    assert msg["content"] == "Error: ValueError: disk full" and "artifact" not in msg

    result = await agent("return_generic").run("go")
    (msg,) = tool_messages(result)
    assert msg["content"] == "Error: the tool broken failed."
    assert "disk full" not in msg["content"]
    assert msg["artifact"] == {"error": "ValueError: disk full"}

    with pytest.raises(ToolExecutionError) as info:
        await agent("fail").run("go")
    assert isinstance(info.value.__cause__, ValueError)
    assert info.value.tool == "broken" and info.value.call_id == "c1"
    assert "disk full" in str(info.value)


async def test_return_direct_ends_the_run_with_the_tool_result() -> None:
    @tool(return_direct=True)
    async def final_answer(answer: str) -> str:
        """Answer and stop."""
        return answer.upper()

    model = FakeModel([FakeReply.tool_call("final_answer", {"answer": "forty-two"})])
    result = await Agent(model, tools=[final_answer]).run("go")
    assert result.stop_reason == "return_direct"
    assert result.text == "FORTY-TWO" and result.output == "FORTY-TWO"
    assert result.model_calls == 1 and result.tool_calls == 1
    assert model.remaining == 0


async def test_return_direct_does_not_end_the_run_when_the_tool_fails() -> None:
    @tool(return_direct=True)
    async def final_answer(answer: str) -> str:
        """Answer and stop."""
        raise ToolError("not yet")

    model = FakeModel([FakeReply.tool_call("final_answer", {"answer": "x"}), "recovered"])
    result = await Agent(model, tools=[final_answer]).run("go")
    assert result.stop_reason == "final_answer" and result.text == "recovered"


async def test_tool_subclass() -> None:
    class Weather(Tool):
        def __init__(self) -> None:
            super().__init__(
                "weather",
                "Weather in a city.",
                {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
                read_only=True,
            )

        async def run(self, args: Any, ctx: ToolContext) -> Any:
            return {"city": args["city"], "forecast": "sunny"}

    result = await Agent(
        FakeModel([FakeReply.tool_call("weather", {"city": "Paris"}), "Sunny."]), tools=[Weather()]
    ).run("weather?")
    assert tool_messages(result)[0]["content"] == '{"city": "Paris", "forecast": "sunny"}'


def test_annotated_descriptions() -> None:
    @tool
    def f(x: Annotated[int, pydantic.Field(description="How many.")]) -> int:
        """F."""
        return x

    assert f.spec()["parameters"]["properties"]["x"]["description"] == "How many."


def test_a_tool_without_docstring_or_description_fails_at_decoration() -> None:
    def lookup(order_id: str) -> str:
        return order_id

    with pytest.raises(ValidationError) as info:
        tool(lookup)
    assert info.value.code == "missing"
    assert "'lookup'" in str(info.value) and "docstring" in str(info.value)
    with pytest.raises(ValidationError):
        tool(name="find")(lookup)
    with pytest.raises(ValidationError):
        tool(description="   ")(lookup)
    # Either source of a description is enough.
    assert tool(description="Look an order up.")(lookup).description == "Look an order up."

    def documented(order_id: str) -> str:
        """Look an order up."""
        return order_id

    assert tool(documented).description == "Look an order up."


@pytest.mark.parametrize("blocking", [False, True])
async def test_a_tool_raising_generator_exit_is_a_tool_error(blocking: bool) -> None:
    """GeneratorExit is a generator's close signal; raised by a tool it is the tool's
    failure (the model reads it), not a RuntimeError out of `send`."""
    if blocking:

        @tool
        def bad() -> str:
            """Bad."""
            raise GeneratorExit()

    else:

        @tool
        async def bad() -> str:
            """Bad."""
            raise GeneratorExit()

    agent = Agent(FakeModel([FakeReply.tool_call("bad", {}), "It failed."]), tools=[bad])
    result = await agent.run("go")
    (msg,) = [m for m in result.messages if m["role"] == "tool"]
    assert msg["status"] == "error"
    assert "the tool bad raised GeneratorExit" in msg["content"]
    assert result.text == "It failed."
