"""Agent: options, bad input at construction, results, typed output, limits, retries and
fallbacks, approvals in run(), agents as tools, cancellation."""

from __future__ import annotations

import asyncio
from typing import Any

import pydantic
import pytest

from criogen_graph import (
    Agent,
    FakeModel,
    FakeReply,
    FunctionModel,
    LimitExceededError,
    Limits,
    ModelError,
    Retry,
    ValidationError,
    tool,
)

FAST = Retry(max_attempts=3, initial_backoff_secs=0, jitter=False)


@tool
async def echo(text: str) -> str:
    """Echo the text back."""
    return text


@tool
async def refund(order_id: str) -> str:
    """Refund an order."""
    return f"refunded {order_id}"


# -- bad input at Agent(...) ---------------------------------------------------------


def test_non_tool_in_tools_names_the_entry() -> None:
    def plain(x: int) -> int:
        return x

    with pytest.raises(TypeError, match=r"plain.*not a tool.*@tool"):
        Agent(FakeModel([]), tools=[plain])
    with pytest.raises(TypeError, match="'oops' is not a tool"):
        Agent(FakeModel([]), tools=["oops"])


def test_model_must_be_a_model() -> None:
    with pytest.raises(TypeError, match="model must be"):
        Agent(42)
    with pytest.raises(TypeError, match="unknown model provider 'acme'"):
        Agent("acme:big-model")
    with pytest.raises(TypeError, match="provider:model"):
        Agent("gpt-5")


def test_provider_without_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ValidationError) as info:
        Agent("anthropic:claude-sonnet-4-5")
    assert info.value.code == "invalid_value"
    assert "ANTHROPIC_API_KEY" in str(info.value)
    monkeypatch.delenv("AZURE_OPENAI_ENDPOINT", raising=False)
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", "k")
    with pytest.raises(ValidationError, match="AZURE_OPENAI_ENDPOINT"):
        Agent("azure:my-deployment")
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    with pytest.raises(ValidationError, match="OPENROUTER_API_KEY"):
        Agent(FakeModel([]), fallbacks=["openrouter:some/model"])


def test_bad_limits() -> None:
    with pytest.raises(ValidationError) as info:
        Agent(FakeModel([]), limits={"model_call": 3})
    assert info.value.code == "unknown" and "model_call" in str(info.value)
    with pytest.raises(TypeError, match=r"Limits\.model_calls must be a number"):
        Agent(FakeModel([]), limits={"model_calls": "3"})
    with pytest.raises(ValidationError, match="model_calls must be >= 1"):
        Limits(model_calls=0)
    with pytest.raises(TypeError):
        Agent(FakeModel([]), limits=[1, 2])


def test_bad_options() -> None:
    with pytest.raises(ValidationError, match="on_tool_exception"):
        Agent(FakeModel([]), on_tool_exception="ignore")
    with pytest.raises(ValidationError, match="unknown error kind"):
        Agent(FakeModel([]), fallback_on=["oops"])
    with pytest.raises(ValidationError) as info:
        Agent(FakeModel([]), tools=[echo], approve=["refund"])
    assert info.value.code == "unknown" and "refund" in str(info.value)
    with pytest.raises(TypeError, match="approve must be a list"):
        Agent(FakeModel([]), tools=[echo], approve="echo")
    with pytest.raises(ValidationError, match="two tools are named 'echo'"):
        Agent(FakeModel([]), tools=[echo, echo])
    with pytest.raises(TypeError, match="output must be"):
        Agent(FakeModel([]), output=int)
    with pytest.raises(ValidationError, match="not a valid JSON Schema"):
        Agent(FakeModel([]), output={"type": "nope"})
    with pytest.raises(ValidationError, match="model_retry"):
        Agent(FakeModel([]), model_retry={"attempts": 3})
    with pytest.raises(TypeError, match="instructions"):
        Agent(FakeModel([]), instructions=["be nice"])


async def test_bad_run_input() -> None:
    agent = Agent(FakeModel(["x"]))
    with pytest.raises(TypeError, match="input must be a str"):
        await agent.run(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="state must be a dict"):
        await agent.run("hi", state=["x"])  # type: ignore[arg-type]


# -- results -------------------------------------------------------------------------


async def test_result_fields() -> None:
    model = FakeModel(
        [
            FakeReply.tool_call(
                "echo", {"text": "hi"}, usage={"input_tokens": 10, "output_tokens": 3}
            ),
            FakeReply.text(
                "done", usage={"input_tokens": 20, "output_tokens": 2, "cache_read_tokens": 5}
            ),
        ],
        name="scripted",
    )
    result = await Agent(model, tools=[echo]).run("go")
    assert result.text == "done" and result.output == "done"
    assert result.stop_reason == "final_answer"
    assert result.usage == {
        "input_tokens": 30,
        "output_tokens": 5,
        "cache_read_tokens": 5,
        "cache_write_tokens": 0,
        "reasoning_tokens": 0,
    }
    assert (result.model_calls, result.tool_calls) == (2, 1)
    assert result.needs_approval is False and result.approvals == []
    assert len(result.run_id) == 32
    assert result.duration_ms > 0
    assert result.answered_by == {"provider": "fake", "model": "scripted"}
    assert result.models == [{"provider": "fake", "model": "scripted"}]
    assert [m["role"] for m in result.messages] == ["user", "assistant", "tool", "assistant"]


async def test_instructions_are_the_system_message_and_tools_are_offered() -> None:
    seen: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []

    def script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        seen.append((messages, tools))
        return "ok"

    await Agent(FunctionModel(script), instructions="Be brief.", tools=[echo]).run("hi")
    messages, tools = seen[0]
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[1] == {"role": "user", "content": "hi"}
    assert tools == [echo.spec()]


async def test_function_model_can_be_async() -> None:
    async def script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        await asyncio.sleep(0)
        return f"you said {messages[-1]['content']}"

    result = await Agent(FunctionModel(script)).run("hello")
    assert result.text == "you said hello"
    assert result.answered_by == {"provider": "function", "model": "script"}


async def test_fake_model_that_runs_out_fails_clearly() -> None:
    agent = Agent(FakeModel([FakeReply.tool_call("echo", {"text": "x"})]), tools=[echo])
    with pytest.raises(ModelError) as info:
        await agent.run("go")
    assert "ran out of replies after 1 call" in str(info.value)
    assert info.value.kind == "bad_request"


async def test_runs_share_the_fake_script() -> None:
    agent = Agent(FakeModel(["one", "two"]))
    assert (await agent.run("a")).text == "one"
    assert (await agent.run("b")).text == "two"


# -- typed output --------------------------------------------------------------------


class Verdict(pydantic.BaseModel):
    approved: bool
    reason: str


async def test_pydantic_output() -> None:
    result = await Agent(FakeModel(['{"approved": true, "reason": "fine"}']), output=Verdict).run(
        "ok?"
    )
    assert result.stop_reason == "output"
    assert result.output == Verdict(approved=True, reason="fine")
    assert result.text is None


async def test_json_schema_output_and_code_fences() -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "temp": {"type": "number"}},
        "required": ["city", "temp"],
    }
    result = await Agent(
        FakeModel(['```json\n{"city": "Oslo", "temp": -3}\n```']), output=schema
    ).run("weather?")
    assert result.output == {"city": "Oslo", "temp": -3}


async def test_invalid_output_goes_back_to_the_model_and_counts() -> None:
    seen: list[list[dict[str, Any]]] = []
    replies = iter(["not json", '{"approved": "maybe"}', '{"approved": false, "reason": "no"}'])

    def script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        seen.append(messages)
        return next(replies)

    result = await Agent(FunctionModel(script), output=Verdict).run("ok?")
    assert result.output == Verdict(approved=False, reason="no")
    assert result.model_calls == 3
    corrections = [m for m in result.messages if m.get("kind") == "output_retry"]
    assert len(corrections) == 2
    assert "not JSON" in corrections[0]["content"]
    assert "approved" in corrections[1]["content"] and "reason" in corrections[1]["content"]
    assert seen[1][-1] == corrections[0]  # the model saw what was wrong

    with pytest.raises(LimitExceededError) as info:
        await Agent(
            FakeModel(["nope", "still nope"]), output=Verdict, limits={"model_calls": 2}
        ).run("?")
    assert info.value.limit == "model_calls"


async def test_json_value_replies_stand_for_json_text() -> None:
    result = await Agent(FakeModel([{"approved": True, "reason": "r"}]), output=Verdict).run("?")
    assert result.output.approved is True


# -- limits --------------------------------------------------------------------------


async def test_model_call_limit() -> None:
    model = FakeModel([FakeReply.tool_call("echo", {"text": str(i)}) for i in range(5)])
    with pytest.raises(LimitExceededError) as info:
        await Agent(model, tools=[echo], limits={"model_calls": 3}).run("loop")
    err = info.value
    assert (err.limit, err.value) == ("model_calls", 3)
    assert err.result is not None and err.result.stop_reason == "limit"
    assert err.result.model_calls == 3 and err.result.tool_calls == 3
    assert model.remaining == 2


async def test_tool_call_limit_is_checked_before_the_tools_run() -> None:
    ran: list[str] = []

    @tool
    async def work(i: int) -> int:
        """Work."""
        ran.append(str(i))
        return i

    agent = Agent(
        FakeModel(
            [
                FakeReply.tool_call("work", {"i": 0}),
                FakeReply.tool_calls(("work", {"i": 1}), ("work", {"i": 2})),
            ]
        ),
        tools=[work],
        limits={"tool_calls": 2},
    )
    with pytest.raises(LimitExceededError) as info:
        await agent.run("go")
    assert info.value.limit == "tool_calls"
    assert ran == ["0"]
    # the reply that went over is kept, its calls answered as not run
    last = info.value.result.messages[-2:]
    assert [m["status"] for m in last] == ["skipped", "skipped"]
    assert "tool call limit" in last[0]["content"]


async def test_token_limit_is_checked_before_each_model_call() -> None:
    model = FakeModel(
        [
            FakeReply.tool_call(
                "echo", {"text": "a"}, usage={"input_tokens": 60, "output_tokens": 50}
            ),
            "never",
        ]
    )
    with pytest.raises(LimitExceededError) as info:
        await Agent(model, tools=[echo], limits=Limits(tokens=100)).run("go")
    assert info.value.limit == "tokens" and info.value.result.usage["input_tokens"] == 60
    assert model.remaining == 1


# -- retries, fallbacks, content filter ----------------------------------------------


async def test_transient_errors_are_retried_without_counting_calls() -> None:
    model = FakeModel([FakeReply.error("rate_limit"), FakeReply.error("transient"), "ok"])
    result = await Agent(model, model_retry=FAST).run("go")
    assert result.text == "ok" and result.model_calls == 1


@pytest.mark.parametrize("kind", ["auth", "bad_request", "not_found", "context_overflow"])
async def test_non_transient_errors_are_not_retried(kind: str) -> None:
    model = FakeModel([FakeReply.error(kind), "never"])
    with pytest.raises(ModelError) as info:
        await Agent(model, model_retry=FAST).run("go")
    assert info.value.kind == kind and model.remaining == 1


async def test_retries_exhausted_then_fallback() -> None:
    primary = FakeModel([FakeReply.error("timeout")] * 3, name="primary")
    backup = FakeModel(["from backup"], name="backup")
    result = await Agent(primary, fallbacks=[backup], model_retry=FAST).run("go")
    assert result.text == "from backup"
    assert result.answered_by == {"provider": "fake", "model": "backup"}
    assert result.models == [{"provider": "fake", "model": "backup"}]
    assert primary.remaining == 0


async def test_fallback_on_extra_kinds_and_final_error_names_everything() -> None:
    primary = FakeModel([FakeReply.error("context_overflow", "too long")], name="small")
    backup = FakeModel([FakeReply.error("auth", "bad key")], name="big")
    agent = Agent(primary, fallbacks=[backup], fallback_on=["context_overflow"], model_retry=FAST)
    with pytest.raises(ModelError) as info:
        await agent.run("go")
    err = info.value
    assert err.kind == "context_overflow" and err.model == "small"
    assert "fake:small failed (context_overflow): too long" in str(err)
    assert "fake:big (auth)" in str(err)
    assert [a["model"] for a in err.attempts] == ["small", "big"]
    # without fallback_on, a context overflow does not move on
    with pytest.raises(ModelError):
        await Agent(
            FakeModel([FakeReply.error("context_overflow")]), fallbacks=[FakeModel(["x"])]
        ).run("go")


async def test_retry_after_beyond_the_cap_is_not_waited() -> None:
    primary = FakeModel([FakeReply.error("rate_limit", retry_after=3600)], name="p")
    backup = FakeModel(["b"], name="b")
    agent = Agent(primary, fallbacks=[backup], model_retry=FAST, max_retry_after_secs=1)
    result = await asyncio.wait_for(agent.run("go"), timeout=10)
    assert result.answered_by["model"] == "b"


async def test_content_filter_is_a_stop_reason() -> None:
    result = await Agent(FakeModel([FakeReply.error("content_filter")])).run("bad")
    assert result.stop_reason == "content_filter" and result.text is None
    reply = FakeReply("partial", stop_reason="content_filter")
    result = await Agent(FakeModel([reply])).run("bad")
    assert result.stop_reason == "content_filter"
    assert result.messages[-1]["content"] == "partial"


async def test_models_lists_each_model_in_first_use_order() -> None:
    primary = FakeModel(
        [FakeReply.tool_call("echo", {"text": "x"}), FakeReply.error("connection"), "p again"],
        name="p",
    )
    backup = FakeModel(["b answers"], name="b")
    agent = Agent(primary, fallbacks=[backup], model_retry=Retry(max_attempts=1))
    result = await agent.run("go")
    assert result.models == [{"provider": "fake", "model": "p"}, {"provider": "fake", "model": "b"}]
    assert result.answered_by == {"provider": "fake", "model": "b"}


# -- approvals in run() --------------------------------------------------------------


async def test_run_stops_for_approval() -> None:
    model = FakeModel(
        [FakeReply.tool_calls(("refund", {"order_id": "A-1"}), ("echo", {"text": "x"}))]
    )
    ran: list[str] = []

    @tool
    async def audit(text: str) -> str:
        """Never reached."""
        ran.append(text)
        return text

    result = await Agent(model, tools=[refund, echo, audit], approve=["refund"]).run("refund A-1")
    assert result.needs_approval is True and result.stop_reason is None
    (req,) = result.approvals
    assert req.tool == "refund" and req.args == {"order_id": "A-1"}
    assert req.call_id == result.messages[-1]["tool_calls"][0]["id"]
    assert result.text is None
    # nothing ran: ungated calls of the same reply wait with the gated one
    assert [m["role"] for m in result.messages] == ["user", "assistant"]
    assert result.tool_calls == 0


# -- agents as tools -----------------------------------------------------------------


async def test_agent_as_tool_and_usage_adds_up() -> None:
    researcher = Agent(
        FakeModel(
            [
                FakeReply.text(
                    "It shipped on Monday.", usage={"input_tokens": 100, "output_tokens": 10}
                )
            ]
        ),
        instructions="Find facts.",
    )
    lead = Agent(
        FakeModel(
            [
                FakeReply.tool_call(
                    "research",
                    {"input": "When did A-1 ship?"},
                    usage={"input_tokens": 5, "output_tokens": 5},
                ),
                FakeReply.text(
                    "It shipped on Monday.", usage={"input_tokens": 7, "output_tokens": 7}
                ),
            ]
        ),
        tools=[researcher.as_tool("research", "Looks up facts about orders.")],
    )
    result = await lead.run("When did A-1 ship?")
    assert result.text == "It shipped on Monday."
    tool_msg = result.messages[2]
    assert tool_msg["content"] == "It shipped on Monday." and tool_msg["status"] == "ok"
    assert result.usage["input_tokens"] == 112 and result.usage["output_tokens"] == 22


async def test_agent_nesting_is_bounded() -> None:
    def delegate(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if messages[-1]["role"] == "tool":
            return "unreachable"
        return FakeReply.tool_call("deeper", {"input": "go on"})

    # A chain of ten agents, each handing the task to the next.
    agent: Agent[Any] = Agent(FakeModel(["bottom"]))
    for _ in range(10):
        agent = Agent(FunctionModel(delegate), tools=[agent.as_tool("deeper", "Goes deeper.")])
    with pytest.raises(LimitExceededError) as info:
        await agent.run("go")
    assert info.value.limit == "agent_depth" and info.value.value == 8
    assert "9 deep" in str(info.value)


def test_as_tool_validates_its_name() -> None:
    with pytest.raises(ValidationError):
        Agent(FakeModel([])).as_tool("bad name", "d")


# -- cancellation --------------------------------------------------------------------


async def test_cancelling_the_awaiting_task_cancels_the_run() -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    @tool
    async def slow() -> str:
        """Waits forever."""
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "x"

    agent = Agent(FakeModel([FakeReply.tool_call("slow", {})]), tools=[slow])
    task = asyncio.create_task(agent.run("go"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError) as info:
        await task
    # The awaiter's own cancellation, as asyncio made it (so asyncio.timeout and
    # TaskGroup recognise it), not an error of ours.
    assert type(info.value) is asyncio.CancelledError and task.cancelled()
    assert cancelled.is_set()
