"""The Anthropic Messages API adapter, through real agents over loopback HTTP: the wire
format both ways (every request checked against the official SDK's request types),
streaming, and how each failure is classified, retried or failed over."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic as anthropic_sdk
import pytest
from anthropic.types.message_create_params import (
    MessageCreateParamsNonStreaming,
    MessageCreateParamsStreaming,
)

from criogen_graph import (
    Agent,
    AnthropicModel,
    Model,
    ModelError,
    Retry,
    TextEvent,
    ToolCallFinishedEvent,
    ToolCallStartedEvent,
    ToolError,
    ValidationError,
    anthropic,
    tool,
)
from tests.servers import anthropic_server as an
from tests.typed_bodies import assert_request

NO_WAIT = Retry(initial_backoff_secs=0, jitter=False)
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
}


@pytest.fixture
def server() -> Iterator[an.AnthropicServer]:
    """A scripted Anthropic Messages API server on 127.0.0.1."""
    with an.AnthropicServer() as srv:
        yield srv


@tool
async def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool
async def divide(a: int, b: int) -> float:
    """Divide a by b."""
    if b == 0:
        raise ToolError("cannot divide by zero")
    return a / b


_OPEN: list[Model] = []


@pytest.fixture(autouse=True)
async def close_models() -> AsyncIterator[None]:
    """Close the models' connection pools in the test's own event loop."""
    yield
    while _OPEN:
        await _OPEN.pop().aclose()


def model(server: an.AnthropicServer, name: str = "claude-test", **kw: Any) -> AnthropicModel:
    m = anthropic(name, base_url=server.base_url, api_key="test", **kw)
    _OPEN.append(m)
    return m


def check_requests(server: an.AnthropicServer) -> None:
    """Every request the server got is a valid Messages API call: the body fits the
    official SDK's request type (no unknown keys at any depth), on the right path, with
    the version header."""
    assert server.requests
    for body, headers, path in zip(server.requests, server.headers, server.paths, strict=True):
        streamed = body.get("stream")
        assert_request(
            body, MessageCreateParamsStreaming if streamed else MessageCreateParamsNonStreaming
        )
        assert path == "/v1/messages"
        assert headers["anthropic-version"] == "2023-06-01"
        assert headers["content-type"] == "application/json"


async def run(agent: Agent[Any], prompt: str, *, streamed: bool) -> tuple[Any, list[Any]]:
    """The run's result and, when streamed, its events."""
    if not streamed:
        return await agent.run(prompt), []
    stream = agent.thread("t").stream(prompt)
    events = [e async for e in stream]
    return await stream.reply(), events


def text_of(events: list[Any]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextEvent))


# -- answers -----------------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
async def test_plain_answer_with_system_prompt_and_usage(
    server: an.AnthropicServer, streamed: bool
) -> None:
    server.add(
        an.text(
            "Hello there, how can I help?",
            usage={
                "input_tokens": 20,
                "output_tokens": 9,
                "cache_read_input_tokens": 100,
                "cache_creation_input_tokens": 30,
            },
        )
    )
    agent = Agent(model(server), instructions="Be brief.")
    result, events = await run(agent, "hi", streamed=streamed)

    assert result.text == "Hello there, how can I help?"
    assert result.stop_reason == "final_answer"
    assert result.answered_by == {"provider": "anthropic", "model": "claude-test"}
    # the whole prompt as input (uncached + read + written), the cached parts broken out
    assert result.usage == {
        "input_tokens": 150,
        "output_tokens": 9,
        "cache_read_tokens": 100,
        "cache_write_tokens": 30,
        "reasoning_tokens": 0,
    }
    if streamed:
        assert text_of(events) == result.text
        assert len([e for e in events if isinstance(e, TextEvent)]) > 1
    check_requests(server)
    (body,) = server.requests
    assert server.headers[0]["x-api-key"] == "test"
    expected = {
        "model": "claude-test",
        "max_tokens": 4096,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }
    assert body == ({**expected, "stream": True} if streamed else expected)


async def test_parallel_tool_calls_round_trip(server: an.AnthropicServer) -> None:
    server.add(
        an.tool_use(
            ("add", {"a": 2, "b": 3}),
            ("add", {"a": 1, "b": 1}),
            ("divide", {"a": 1, "b": 0}),
            text="Let me work these out.",
        ),
        an.text("5, 2, and division by zero is undefined."),
    )
    agent = Agent(model(server), tools=[add, divide], instructions="Use the tools.")
    result = await agent.run("2+3, 1+1 and 1/0?")

    assert result.text == "5, 2, and division by zero is undefined."
    assert result.tool_calls == 3 and result.model_calls == 2
    calls = result.messages[1]["tool_calls"]
    assert [(c["id"], c["name"], c["args"]) for c in calls] == [
        ("toolu_1_0", "add", {"a": 2, "b": 3}),
        ("toolu_1_1", "add", {"a": 1, "b": 1}),
        ("toolu_1_2", "divide", {"a": 1, "b": 0}),
    ]
    check_requests(server)
    first, second = server.requests
    assert first["tools"] == [
        {"name": "add", "description": "Add two numbers.", "input_schema": add.parameters},
        {"name": "divide", "description": "Divide a by b.", "input_schema": divide.parameters},
    ]
    assert second["system"] == "Use the tools."
    # the assistant turn goes back as text then tool_use blocks; all three results in one
    # user turn, in call order, each naming its tool_use, the failure flagged
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert second["messages"][1]["content"] == [
        {"type": "text", "text": "Let me work these out."},
        {"type": "tool_use", "id": "toolu_1_0", "name": "add", "input": {"a": 2, "b": 3}},
        {"type": "tool_use", "id": "toolu_1_1", "name": "add", "input": {"a": 1, "b": 1}},
        {"type": "tool_use", "id": "toolu_1_2", "name": "divide", "input": {"a": 1, "b": 0}},
    ]
    assert second["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_1_0", "content": "5"},
        {"type": "tool_result", "tool_use_id": "toolu_1_1", "content": "2"},
        {
            "type": "tool_result",
            "tool_use_id": "toolu_1_2",
            "content": "Error: cannot divide by zero",
            "is_error": True,
        },
    ]


async def test_rejected_call_is_an_error_result_and_turns_alternate(
    server: an.AnthropicServer,
) -> None:
    server.add(
        an.error(401, "invalid x-api-key"),
        an.tool_use(("add", {"a": 1, "b": 2})),
        an.text("Understood, I will not add."),
    )
    agent = Agent(model(server), tools=[add], approve=["add"], model_retry=NO_WAIT)
    thread = agent.thread("t")
    with pytest.raises(ModelError):
        await thread.send("first")  # saved, unanswered
    reply = await thread.send("second")
    assert reply.needs_approval
    reply = await thread.reject("not now")
    assert reply.text == "Understood, I will not add."

    check_requests(server)
    # two user messages in a row merge into one user turn
    assert server.requests[1]["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}],
        }
    ]
    last = server.requests[2]["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "user"]
    (result,) = last[2]["content"]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "toolu_2_0"
    assert result["is_error"] is True and "not now" in result["content"]


async def test_typed_output_is_asked_for_in_the_system_prompt(server: an.AnthropicServer) -> None:
    server.add(an.text("It is five."), an.text('{"answer": 5}'))
    agent = Agent(model(server), instructions="Be exact.", output=SCHEMA)
    result = await agent.run("2+3?")

    assert result.output == {"answer": 5} and result.stop_reason == "output"
    check_requests(server)
    first, second = server.requests
    assert first["system"].startswith("Be exact.\n\n")
    assert "JSON only" in first["system"] and json.dumps(SCHEMA) in first["system"]
    # the answer that did not parse and the correction go back as alternating turns
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert second["messages"][1]["content"] == [{"type": "text", "text": "It is five."}]
    assert second["system"] == first["system"]


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
async def test_refusal_is_a_content_filter_stop(server: an.AnthropicServer, streamed: bool) -> None:
    server.add(an.refusal("I can't help with that."))
    result, events = await run(Agent(model(server)), "something bad", streamed=streamed)
    assert result.stop_reason == "content_filter"
    # what the model wrote before it stopped stays in the transcript, without tool calls
    assert result.messages[-1] == {
        "role": "assistant",
        "content": "I can't help with that.",
        "id": result.messages[-1]["id"],
    }
    if streamed:
        assert text_of(events) == "I can't help with that."
    check_requests(server)


async def test_streamed_tool_calls(server: an.AnthropicServer) -> None:
    server.add(
        an.tool_use(("add", {"a": 2, "b": 3}), ("add", {"a": 4, "b": 5}), text="Adding up."),
        an.text("The sums are 5 and 9.", chunk=4, usage={"input_tokens": 40, "output_tokens": 6}),
    )
    agent = Agent(model(server), tools=[add])
    stream = agent.thread("s").stream("2+3 and 4+5")
    events = [e async for e in stream]
    reply = await stream.reply()

    assert reply.text == "The sums are 5 and 9."
    started = [e for e in events if isinstance(e, ToolCallStartedEvent)]
    assert [(e.call_id, e.args) for e in started] == [
        ("toolu_1_0", {"a": 2, "b": 3}),
        ("toolu_1_1", {"a": 4, "b": 5}),
    ]
    by_message: dict[str, str] = {}
    for e in events:
        if isinstance(e, TextEvent):
            by_message[e.message_id] = by_message.get(e.message_id, "") + e.text
    assert list(by_message.values()) == ["Adding up.", "The sums are 5 and 9."]
    assert by_message[reply.messages[-1]["id"]] == reply.text
    # usage of both calls: input from message_start, output from message_delta
    assert reply.usage["input_tokens"] == 11 + 40 and reply.usage["output_tokens"] == 7 + 6
    check_requests(server)
    assert all(body["stream"] is True for body in server.requests)
    assert [b["tool_use_id"] for b in server.requests[1]["messages"][2]["content"]] == [
        "toolu_1_0",
        "toolu_1_1",
    ]


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
async def test_invalid_tool_input_goes_back_to_the_model(
    server: an.AnthropicServer, streamed: bool
) -> None:
    server.add(
        an.tool_use(("add", '{"a": 2, "b": ')),
        an.text("Sorry, let me stop there."),
    )
    result, events = await run(Agent(model(server), tools=[add]), "2+?", streamed=streamed)

    assert result.text == "Sorry, let me stop there."
    (tool_msg,) = [m for m in result.messages if m["role"] == "tool"]
    assert tool_msg["status"] == "error" and "not valid JSON" in tool_msg["content"]
    if streamed:
        (finished,) = [e for e in events if isinstance(e, ToolCallFinishedEvent)]
        assert finished.status == "error"
    check_requests(server)
    (block,) = server.requests[1]["messages"][2]["content"]
    assert block["tool_use_id"] == "toolu_1_0" and block["is_error"] is True
    # what the model wrote goes back as an empty input, with the problem in the result
    assert server.requests[1]["messages"][1]["content"][0]["input"] == {}


# -- failures ----------------------------------------------------------------------------


async def test_rate_limit_waits_for_retry_after(server: an.AnthropicServer) -> None:
    server.add(an.rate_limited(0.05), an.text("made it"))
    started = time.monotonic()
    result = await Agent(model(server), model_retry=NO_WAIT).run("hi")
    assert result.text == "made it" and len(server.requests) == 2
    assert time.monotonic() - started >= 0.04  # the backoff is 0: the wait is the server's


async def test_retry_after_beyond_the_limit_fails_over(server: an.AnthropicServer) -> None:
    server.add(an.rate_limited(3600), an.text("from the backup"))
    agent = Agent(
        model(server),
        fallbacks=[model(server, "claude-backup")],
        model_retry=NO_WAIT,
        max_retry_after_secs=5,
    )
    result = await asyncio.wait_for(agent.run("hi"), timeout=30)  # not an hour
    assert result.text == "from the backup"
    assert result.answered_by == {"provider": "anthropic", "model": "claude-backup"}
    # the primary was not tried again
    assert [b["model"] for b in server.requests] == ["claude-test", "claude-backup"]

    server.add(an.rate_limited(3600))
    with pytest.raises(ModelError) as info:
        await Agent(model(server), model_retry=NO_WAIT, max_retry_after_secs=5).run("hi")
    assert info.value.kind == "rate_limit" and info.value.retry_after == 3600
    assert len(server.requests) == 3


@pytest.mark.parametrize("status", [500, 503, 529])
async def test_server_errors_are_retried(server: an.AnthropicServer, status: int) -> None:
    server.add(an.error(status, "Overloaded" if status == 529 else "Internal error"))
    server.add(an.text("second time lucky"))
    result = await Agent(model(server), model_retry=NO_WAIT).run("hi")
    assert result.text == "second time lucky" and len(server.requests) == 2


async def test_overloaded_every_time_fails_as_transient(server: an.AnthropicServer) -> None:
    server.add(an.overloaded(), an.overloaded(), an.overloaded())
    with pytest.raises(ModelError) as info:
        await Agent(model(server), model_retry=NO_WAIT).run("hi")
    assert info.value.kind == "transient" and info.value.status == 529
    assert "Overloaded" in str(info.value) and len(server.requests) == 3


@pytest.mark.parametrize(
    ("status", "message", "kind"),
    [
        (400, "messages.0.content: Field required", "bad_request"),
        (400, "prompt is too long: 210344 tokens > 200000 maximum", "context_overflow"),
        (
            400,
            "input length and `max_tokens` exceed context limit: 197000 + 8192 > 200000",
            "context_overflow",
        ),
        (401, "invalid x-api-key", "auth"),
        (403, "Your API key does not have permission to use the specified resource.", "auth"),
        (404, "model: claude-test", "not_found"),
    ],
)
async def test_client_errors_are_not_retried(
    server: an.AnthropicServer, status: int, message: str, kind: str
) -> None:
    server.add(an.error(status, message), an.text("never sent"))
    with pytest.raises(ModelError) as info:
        await Agent(model(server), model_retry=NO_WAIT).run("hi")
    assert info.value.kind == kind and info.value.status == status
    assert message in str(info.value) and len(server.requests) == 1


async def test_context_overflow_can_fail_over(server: an.AnthropicServer) -> None:
    server.add(an.error(400, "prompt is too long: 210344 tokens > 200000 maximum"))
    server.add(an.text("I have a bigger window"))
    agent = Agent(
        model(server), fallbacks=[model(server, "claude-big")], fallback_on=["context_overflow"]
    )
    result = await agent.run("a very long prompt")
    assert result.answered_by == {"provider": "anthropic", "model": "claude-big"}


async def test_slow_response_times_out(server: an.AnthropicServer) -> None:
    server.add(an.slow(an.text("too late")), an.slow(an.text("too late")))
    agent = Agent(
        model(server, timeout_secs=0.2), model_retry=Retry(max_attempts=2, initial_backoff_secs=0)
    )
    with pytest.raises(ModelError) as info:
        await agent.run("hi")
    assert info.value.kind == "timeout" and len(server.requests) == 2


async def test_dropped_stream_is_retried_without_repeating_text(
    server: an.AnthropicServer,
) -> None:
    answer = "The answer to everything is forty-two."
    server.add(an.dropped(answer[:20]), an.text(answer, chunk=5))
    agent = Agent(model(server), model_retry=NO_WAIT)
    result, events = await run(agent, "what is the answer?", streamed=True)
    assert result.text == answer
    assert text_of(events) == answer
    assert len(server.requests) == 2


async def test_dropped_stream_falls_back_without_repeating_text(
    server: an.AnthropicServer,
) -> None:
    answer = "Both models begin the same way, then finish."
    server.add(an.dropped(answer[:16]), an.text(answer, chunk=6))
    agent = Agent(
        model(server), fallbacks=[model(server, "claude-backup")], model_retry=Retry(max_attempts=1)
    )
    result, events = await run(agent, "go", streamed=True)
    assert text_of(events) == result.text == answer
    assert result.answered_by == {"provider": "anthropic", "model": "claude-backup"}


async def test_connection_refused_is_a_connection_error() -> None:
    m = anthropic("claude-test", base_url="http://127.0.0.1:1", api_key="test")
    _OPEN.append(m)
    with pytest.raises(ModelError) as info:
        await Agent(m, model_retry=Retry(max_attempts=1)).run("hi")
    assert info.value.kind == "connection"


async def test_stream_error_event_is_retried_without_repeating_text(
    server: an.AnthropicServer,
) -> None:
    server.add(an.stream_error("overloaded_error", "Overloaded", text="Partial ans"))
    server.add(an.text("Partial answer, then the rest."))
    result, events = await run(Agent(model(server), model_retry=NO_WAIT), "go", streamed=True)
    assert text_of(events) == result.text == "Partial answer, then the rest."
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    ("step", "streamed", "kind"),
    [
        (an.malformed(), False, "transient"),
        (an.malformed(), True, "transient"),
        (an.dropped("The answer is"), False, "connection"),
        (an.dropped("The answer is"), True, "connection"),
        (an.truncated("The answer is"), True, "connection"),
        (an.stream_error("overloaded_error", "Overloaded"), True, "transient"),
        (an.stream_error("api_error", "Internal server error"), True, "transient"),
        (an.stream_error("rate_limit_error", "Too many requests"), True, "rate_limit"),
    ],
    ids=[
        "malformed-json",
        "malformed-sse",
        "dropped-json",
        "dropped-sse",
        "truncated-sse",
        "overloaded-event",
        "api-error-event",
        "rate-limit-event",
    ],
)
async def test_transient_failures_are_retried_then_classified(
    server: an.AnthropicServer, step: an.Step, streamed: bool, kind: str
) -> None:
    server.add(step, step)
    agent = Agent(model(server), model_retry=Retry(max_attempts=2, initial_backoff_secs=0))
    with pytest.raises(ModelError) as info:
        await run(agent, "hi", streamed=streamed)
    assert info.value.kind == kind and len(server.requests) == 2


@pytest.mark.parametrize(
    ("error_type", "message", "kind"),
    [
        (
            "invalid_request_error",
            "prompt is too long: 210344 tokens > 200000 maximum",
            "context_overflow",
        ),
        ("invalid_request_error", "tools.0.name: String should match pattern", "bad_request"),
        ("authentication_error", "invalid x-api-key", "auth"),
    ],
)
async def test_stream_error_events_that_are_not_retried(
    server: an.AnthropicServer, error_type: str, message: str, kind: str
) -> None:
    server.add(an.stream_error(error_type, message), an.text("never sent"))
    with pytest.raises(ModelError) as info:
        await run(Agent(model(server), model_retry=NO_WAIT), "hi", streamed=True)
    assert info.value.kind == kind and message in str(info.value)
    assert len(server.requests) == 1


# -- construction ------------------------------------------------------------------------


async def test_model_string_reads_the_environment(
    server: an.AnthropicServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
    server.add(an.text("hello from env"))
    agent = Agent("anthropic:claude-test")
    _OPEN.append(agent.model)
    result = await agent.run("hi")
    assert result.text == "hello from env"
    assert result.answered_by == {"provider": "anthropic", "model": "claude-test"}
    assert server.headers[0]["x-api-key"] == "sk-ant-from-env"
    check_requests(server)


def test_missing_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    with pytest.raises(ValidationError, match="ANTHROPIC_API_KEY"):
        anthropic("claude-test")
    with pytest.raises(ValidationError, match="ANTHROPIC_API_KEY"):
        Agent("anthropic:claude-test")


async def test_custom_server_needs_no_key_and_options_reach_the_body(
    server: an.AnthropicServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    server.add(an.text("ok"))
    m = anthropic(
        "claude-test",
        base_url=server.base_url,
        max_tokens=256,
        headers={"anthropic-beta": "test-beta"},
        extra_body={"stop_sequences": ["END"]},
    )
    _OPEN.append(m)
    await Agent(m).run("hi")
    check_requests(server)
    assert "x-api-key" not in server.headers[0]
    assert server.headers[0]["anthropic-beta"] == "test-beta"
    assert server.requests[0]["max_tokens"] == 256
    assert server.requests[0]["stop_sequences"] == ["END"]
    with pytest.raises(ValidationError, match="max_tokens"):
        anthropic("claude-test", base_url=server.base_url, max_tokens=0)


# -- the test server itself ---------------------------------------------------------------


async def test_the_official_sdk_reads_the_test_server(server: an.AnthropicServer) -> None:
    """The server's JSON and events parse with the official client, so the tests above
    exercise the real wire format."""
    tools: Any = [{"name": "add", "input_schema": add.parameters}]
    server.add(
        an.tool_use(("add", {"a": 1, "b": 2}), text="Adding."),
        an.tool_use(("add", {"a": 1, "b": 2}), text="Adding."),
        an.error(529, "Overloaded"),
    )
    async with anthropic_sdk.AsyncAnthropic(
        base_url=server.base_url, api_key="test", max_retries=0
    ) as client:
        message = await client.messages.create(
            model="claude-test",
            max_tokens=64,
            messages=[{"role": "user", "content": "1+2"}],
            tools=tools,
        )
        async with client.messages.stream(
            model="claude-test",
            max_tokens=64,
            messages=[{"role": "user", "content": "1+2"}],
            tools=tools,
        ) as stream:
            streamed = await stream.get_final_message()
        with pytest.raises(anthropic_sdk.InternalServerError) as info:
            await client.messages.create(
                model="claude-test", max_tokens=64, messages=[{"role": "user", "content": "x"}]
            )
    for msg in (message, streamed):
        assert msg.stop_reason == "tool_use"
        assert [b.type for b in msg.content] == ["text", "tool_use"]
        assert msg.content[1].model_dump(include={"name", "input"}) == {
            "name": "add",
            "input": {"a": 1, "b": 2},
        }
    assert streamed.usage.output_tokens == 7
    assert info.value.status_code == 529 and info.value.body["error"]["type"] == "overloaded_error"


@pytest.mark.parametrize(
    ("body", "what"),
    [
        ({"id": "msg_1", "type": "message", "content": []}, "no content and no stop_reason"),
        ({"content": []}, "no content and no stop_reason"),
        (
            {"type": "message", "content": [{"type": "text"}], "stop_reason": "end_turn"},
            "text block",
        ),
        (
            {
                "type": "message",
                "content": [{"type": "text", "text": 5}],
                "stop_reason": "end_turn",
            },
            "text block",
        ),
        (
            {"type": "message", "content": [{"type": "tool_use", "id": "t", "input": {}}]},
            "tool_use block without a name",
        ),
    ],
)
async def test_malformed_bodies_are_not_read_as_an_empty_answer(
    server: an.AnthropicServer, body: dict[str, Any], what: str
) -> None:
    server.add(an.malformed(json.dumps(body)))
    with pytest.raises(ModelError) as info:
        await Agent(model(server), model_retry=Retry(max_attempts=1)).run("hi")
    assert info.value.kind == "transient"
    assert "could not read the reply" in str(info.value) and what in str(info.value)


async def test_an_empty_answer_with_a_stop_reason_is_an_answer(server: an.AnthropicServer) -> None:
    body = {"type": "message", "content": [], "stop_reason": "end_turn"}
    server.add(an.malformed(json.dumps(body)))
    assert (await Agent(model(server)).run("hi")).text == ""
