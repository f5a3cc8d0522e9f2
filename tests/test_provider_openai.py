"""The OpenAI Chat Completions adapter (and OpenRouter, Azure, compatible servers) over real
HTTP against a loopback server speaking the wire format, with faults."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pydantic
import pytest
from openai.types.chat.completion_create_params import (
    CompletionCreateParamsNonStreaming,
    CompletionCreateParamsStreaming,
)

from criogen_graph import (
    Agent,
    FakeModel,
    FakeReply,
    MessageEvent,
    ModelError,
    Retry,
    TextEvent,
    ValidationError,
    azure,
    openai,
    openrouter,
    tool,
)
from tests.servers import openai_server as oa
from tests.typed_bodies import assert_request

NO_WAIT = Retry(max_attempts=3, initial_backoff_secs=0, jitter=False)


@tool
async def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


class Answer(pydantic.BaseModel):
    value: int


def model(server: oa.OpenAIServer, **kw: Any) -> Any:
    return openai("gpt-test", api_key="sk-test", base_url=server.base_url, **kw)


def check_bodies(server: oa.OpenAIServer) -> None:
    for body in server.requests:
        assert_request(
            body,
            CompletionCreateParamsStreaming
            if body.get("stream")
            else CompletionCreateParamsNonStreaming,
        )


async def test_answer_tools_and_usage(openai_server: oa.OpenAIServer) -> None:
    openai_server.add(
        oa.tool_calls(("add", {"a": 2, "b": 3}), ("add", {"a": 1, "b": 1})),
        oa.text(
            "2 + 3 = 5",
            usage={
                "prompt_tokens": 40,
                "completion_tokens": 5,
                "cached_tokens": 32,
                "reasoning_tokens": 2,
            },
        ),
    )
    agent = Agent(model(openai_server), instructions="Use tools.", tools=[add])
    result = await agent.run("What is 2 + 3?")
    assert result.text == "2 + 3 = 5"
    assert [m["content"] for m in result.messages if m["role"] == "tool"] == ["5", "2"]
    assert result.answered_by == {"provider": "openai", "model": "gpt-test"}
    assert result.usage == {
        "input_tokens": 51,
        "output_tokens": 12,
        "cache_read_tokens": 32,
        "cache_write_tokens": 0,
        "reasoning_tokens": 2,
    }
    first, second = openai_server.requests
    assert first["model"] == "gpt-test"
    assert first["messages"] == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "What is 2 + 3?"},
    ]
    assert first["tools"] == [{"type": "function", "function": add.spec()}]
    assistant = second["messages"][2]
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["add", "add"]
    assert [m["tool_call_id"] for m in second["messages"][3:]] == [
        c["id"] for c in assistant["tool_calls"]
    ]
    assert openai_server.headers[0]["authorization"] == "Bearer sk-test"
    check_bodies(openai_server)


async def test_string_form_reads_the_environment(
    openai_server: oa.OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.base_url)
    openai_server.add(oa.text("hi"))
    assert (await Agent("openai:gpt-5-mini").run("hello")).text == "hi"
    assert openai_server.headers[0]["authorization"] == "Bearer sk-env"
    assert openai_server.requests[0]["model"] == "gpt-5-mini"


def test_missing_keys_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "OPENROUTER_API_KEY",
        "AZURE_OPENAI_API_KEY",
        "AZURE_OPENAI_ENDPOINT",
    ):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValidationError, match="OPENAI_API_KEY"):
        openai("gpt-5")
    with pytest.raises(ValidationError, match="OPENROUTER_API_KEY"):
        openrouter("x/y")
    with pytest.raises(ValidationError, match="AZURE_OPENAI_API_KEY"):
        azure("dep")
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", "k")
    with pytest.raises(ValidationError, match="AZURE_OPENAI_ENDPOINT"):
        azure("dep")
    # a compatible server (Ollama, vLLM) needs no key
    assert openai("llama3", base_url="http://127.0.0.1:11434/v1").provider == "openai"


async def test_typed_output_uses_response_format(openai_server: oa.OpenAIServer) -> None:
    openai_server.add(oa.text('{"value": 5}'))
    result = await Agent(model(openai_server), output=Answer).run("2+3")
    assert result.output == Answer(value=5)
    fmt = openai_server.requests[0]["response_format"]
    assert (
        fmt["type"] == "json_schema" and fmt["json_schema"]["schema"] == Answer.model_json_schema()
    )
    check_bodies(openai_server)


async def test_refusal_is_a_content_filter_stop(openai_server: oa.OpenAIServer) -> None:
    openai_server.add(oa.refusal("I can't help with that."))
    result = await Agent(model(openai_server)).run("something bad")
    assert result.stop_reason == "content_filter"
    openai_server.add(oa.text("", finish_reason="content_filter"))
    result = await Agent(model(openai_server)).run("something bad")
    assert result.stop_reason == "content_filter"


async def test_streaming_text_and_tool_calls(openai_server: oa.OpenAIServer) -> None:
    openai_server.add(
        oa.tool_calls(("add", {"a": 20, "b": 22})),
        oa.text(
            "The answer is forty-two, computed with care.",
            usage={"prompt_tokens": 9, "completion_tokens": 9},
        ),
    )
    thread = Agent(model(openai_server), tools=[add]).thread("s")
    stream = thread.stream("add please")
    events = [e async for e in stream]
    reply = await stream.reply()
    texts = [e.text for e in events if isinstance(e, TextEvent)]
    assert (
        len(texts) > 1
        and "".join(texts) == reply.text == "The answer is forty-two, computed with care."
    )
    tool_msg = next(
        e.message for e in events if isinstance(e, MessageEvent) and e.message["role"] == "tool"
    )
    assert tool_msg["content"] == "42"
    assert reply.usage["input_tokens"] == 20
    assert all(
        body["stream"] is True and body["stream_options"] == {"include_usage": True}
        for body in openai_server.requests
    )
    check_bodies(openai_server)


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (429, "rate_limit"),
        (500, "transient"),
        (502, "transient"),
        (503, "transient"),
        (408, "timeout"),
    ],
)
async def test_transient_failures_are_retried(
    openai_server: oa.OpenAIServer, status: int, kind: str
) -> None:
    openai_server.add(oa.error(status, "try again", headers={"retry-after": "0"}), oa.text("fine"))
    result = await Agent(model(openai_server), model_retry=NO_WAIT).run("hi")
    assert result.text == "fine" and len(openai_server.requests) == 2


@pytest.mark.parametrize(
    ("status", "message", "kind"),
    [
        (400, "Invalid value for 'messages'", "bad_request"),
        (400, "This model's maximum context length is 8192 tokens", "context_overflow"),
        (401, "Incorrect API key provided", "auth"),
        (403, "Forbidden", "auth"),
        (404, "The model does not exist", "not_found"),
        (422, "Unprocessable", "bad_request"),
    ],
)
async def test_other_4xx_are_not_retried(
    openai_server: oa.OpenAIServer, status: int, message: str, kind: str
) -> None:
    openai_server.add(oa.error(status, message))
    with pytest.raises(ModelError) as info:
        await Agent(model(openai_server), model_retry=NO_WAIT).run("hi")
    assert info.value.kind == kind and info.value.status == status
    assert message in str(info.value)
    assert len(openai_server.requests) == 1


async def test_retry_after_is_honoured_and_capped(openai_server: oa.OpenAIServer) -> None:
    openai_server.add(oa.error(429, "slow down", headers={"retry-after": "3600"}))
    backup = FakeModel(["from backup"], name="backup")
    agent = Agent(
        model(openai_server), fallbacks=[backup], model_retry=NO_WAIT, max_retry_after_secs=5
    )
    result = await asyncio.wait_for(agent.run("hi"), timeout=30)  # not an hour
    assert result.answered_by == {"provider": "fake", "model": "backup"}
    assert len(openai_server.requests) == 1
    # a Retry-After within the cap is waited for, then the call is retried
    openai_server.add(oa.error(429, "slow down", headers={"retry-after": "0.01"}), oa.text("ok"))
    assert (await Agent(model(openai_server), model_retry=NO_WAIT).run("hi")).text == "ok"


async def test_slow_response_times_out(openai_server: oa.OpenAIServer) -> None:
    openai_server.add(oa.Step("text", text="late", delay=5), oa.Step("text", text="late", delay=5))
    agent = Agent(
        model(openai_server, timeout_secs=0.2),
        model_retry=Retry(max_attempts=2, initial_backoff_secs=0),
    )
    with pytest.raises(ModelError) as info:
        await agent.run("hi")
    assert info.value.kind == "timeout"
    assert len(openai_server.requests) == 2  # a timeout is transient: retried once


async def test_stream_dropped_part_way_is_retried_without_repeating_text(
    openai_server: oa.OpenAIServer,
) -> None:
    answer = "Once upon a time there was a very long answer that streamed."
    openai_server.add(oa.Step("text", text=answer, drop_after=3), oa.text(answer))
    thread = Agent(model(openai_server), model_retry=NO_WAIT).thread("drop")
    stream = thread.stream("tell me")
    events = [e async for e in stream]
    reply = await stream.reply()
    assert reply.text == answer
    assert "".join(e.text for e in events if isinstance(e, TextEvent)) == answer
    assert len(openai_server.requests) == 2


async def test_dropped_stream_falls_back_without_repeating_text(
    openai_server: oa.OpenAIServer,
) -> None:
    openai_server.add(
        oa.Step("text", text="The first model started to say something", drop_after=2)
    )
    backup = FakeModel(
        [FakeReply.text("The first model started to say something else entirely.")], name="b"
    )
    thread = Agent(
        model(openai_server), fallbacks=[backup], model_retry=Retry(max_attempts=1)
    ).thread("fb")
    stream = thread.stream("go")
    events = [e async for e in stream]
    reply = await stream.reply()
    streamed = "".join(e.text for e in events if isinstance(e, TextEvent))
    assert streamed == reply.text == "The first model started to say something else entirely."


async def test_malformed_json_is_transient(openai_server: oa.OpenAIServer) -> None:
    openai_server.add(oa.malformed(), oa.text("recovered"))
    assert (await Agent(model(openai_server), model_retry=NO_WAIT).run("hi")).text == "recovered"
    openai_server.add(oa.malformed())
    with pytest.raises(ModelError) as info:
        await Agent(model(openai_server), model_retry=Retry(max_attempts=1)).run("hi")
    assert info.value.kind == "transient" and "not valid JSON" in str(info.value)


@pytest.mark.parametrize("streamed", [False, True])
async def test_invalid_tool_arguments_go_back_to_the_model(
    openai_server: oa.OpenAIServer, streamed: bool
) -> None:
    openai_server.add(
        oa.tool_calls(("add", '{"a": 2, "b":')),
        oa.tool_calls(("add", {"a": 2, "b": 3})),
        oa.text("5"),
    )
    thread = Agent(model(openai_server), tools=[add]).thread(f"bad-args-{streamed}")
    if streamed:
        stream = thread.stream("add")
        _ = [e async for e in stream]
        reply = await stream.reply()
    else:
        reply = await thread.send("add")
    tools = [m for m in reply.messages if m["role"] == "tool"]
    assert tools[0]["status"] == "error" and "not valid JSON" in tools[0]["content"]
    assert tools[1]["content"] == "5" and reply.text == "5"


async def test_connection_refused_is_a_connection_error() -> None:
    agent = Agent(
        openai("m", base_url="http://127.0.0.1:1/v1", api_key="k"),
        model_retry=Retry(max_attempts=1),
    )
    with pytest.raises(ModelError) as info:
        await agent.run("hi")
    assert info.value.kind == "connection"


async def test_openrouter_and_azure_wire_details(openai_server: oa.OpenAIServer) -> None:
    openai_server.add(oa.text("from openrouter"), oa.text("from azure"))
    router = openrouter(
        "meta/llama",
        api_key="or-key",
        base_url=openai_server.base_url,
        app_name="demo",
        app_url="https://x.test",
    )
    result = await Agent(router).run("hi")
    assert result.answered_by == {"provider": "openrouter", "model": "meta/llama"}
    assert openai_server.headers[0]["authorization"] == "Bearer or-key"
    assert openai_server.headers[0]["x-title"] == "demo"
    endpoint = openai_server.base_url.removesuffix("/v1")
    az = azure("my-deploy", endpoint=endpoint, api_key="az-key", api_version="2024-10-21")
    result = await Agent(az).run("hi")
    assert result.answered_by == {"provider": "azure", "model": "my-deploy"}
    assert (
        openai_server.paths[1]
        == "/openai/deployments/my-deploy/chat/completions?api-version=2024-10-21"
    )
    assert (
        openai_server.headers[1]["api-key"] == "az-key"
        and "authorization" not in openai_server.headers[1]
    )
    assert "model" not in openai_server.requests[1]


async def test_nan_in_tool_arguments_is_refused_not_sent_back(
    openai_server: oa.OpenAIServer,
) -> None:
    # A lenient server may write NaN / Infinity in arguments; Python's json reads them,
    # but no provider takes them back, so the next request of the thread would fail.
    openai_server.add(
        oa.tool_calls(("add", '{"a": NaN, "b": 1}')),
        oa.tool_calls(("add", {"a": 2, "b": 3})),
        oa.text("5"),
    )
    reply = await Agent(model(openai_server), tools=[add]).thread("nan-args").send("add")
    tools = [m for m in reply.messages if m["role"] == "tool"]
    assert tools[0]["status"] == "error" and "NaN is not a JSON number" in tools[0]["content"]
    assert reply.text == "5"
    for body in openai_server.requests[1:]:
        json.dumps(body, allow_nan=False)  # every later request is strict JSON
