"""The OpenAI Responses API adapter over real HTTP against a loopback server speaking the
wire format (shapes from recorded traffic in tests/fixtures/openai_responses/), with
faults. Every request body is checked against the `openai` SDK's typed request params."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pydantic
import pytest
from openai.types.responses.response_create_params import (
    ResponseCreateParamsNonStreaming,
    ResponseCreateParamsStreaming,
)

from criogen_graph import (
    Agent,
    FakeModel,
    ModelError,
    ModelRequest,
    ReasoningEvent,
    Retry,
    TextEvent,
    ValidationError,
    openai,
    tool,
)
from criogen_graph.models.openai_responses import (
    OpenAIResponsesModel,
    openai_responses,
    strict_schema,
)
from tests.servers import openai_responses_server as rs
from tests.typed_bodies import assert_request

NO_WAIT = Retry(max_attempts=3, initial_backoff_secs=0, jitter=False)


@pytest.fixture
def server() -> Iterator[rs.ResponsesServer]:
    with rs.ResponsesServer() as srv:
        yield srv


@tool
async def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool
async def get_weather(location: str) -> str:
    """Get the current weather for a location."""
    return "Sunny"


@tool
async def get_capital(country: str) -> str:
    """Get the capital of a country."""
    return "Potato City"


class Answer(pydantic.BaseModel):
    value: int
    note: str | None = None


def model(server: rs.ResponsesServer, name: str = "gpt-5-mini", **kw: Any) -> Any:
    return openai(name, api_key="sk-test", base_url=server.base_url, api="responses", **kw)


async def ask(thread: Any, text: str, *, streamed: bool) -> Any:
    """The thread's reply to `text`, sent or streamed (every event read)."""
    if not streamed:
        return await thread.send(text)
    stream = thread.stream(text)
    _ = [e async for e in stream]
    return await stream.reply()


def check_bodies(server: rs.ResponsesServer) -> None:
    for body in server.requests:
        assert_request(
            body,
            ResponseCreateParamsStreaming
            if body.get("stream")
            else ResponseCreateParamsNonStreaming,
        )
        json.dumps(body, allow_nan=False)


async def test_recorded_json_tool_call_then_answer(server: rs.ResponsesServer) -> None:
    server.add(rs.fixture("json_function_call.json"), rs.fixture("json_text.json"))
    agent = Agent(model(server, "gpt-4o"), instructions="Answer briefly.", tools=[get_capital])
    result = await agent.run("What is the capital of PotatoLand?")
    assert result.text == "The capital of PotatoLand is Potato City."
    assert result.answered_by == {"provider": "openai", "model": "gpt-4o"}
    assert result.usage == {
        "input_tokens": 256 + 287,
        "output_tokens": 18 + 11,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
        "reasoning_tokens": 0,
    }
    first, second = server.requests
    assert server.paths == ["/v1/responses", "/v1/responses"]
    assert server.headers[0]["authorization"] == "Bearer sk-test"
    assert first["model"] == "gpt-4o" and first["instructions"] == "Answer briefly."
    assert first["store"] is False
    # gpt-4o does not reason: OpenAI refuses encrypted reasoning for it
    assert "include" not in first and "reasoning" not in first
    assert first["input"] == [
        {"type": "message", "role": "user", "content": "What is the capital of PotatoLand?"}
    ]
    assert first["tools"] == [{"type": "function", **get_capital.spec(), "strict": False}]
    assert second["input"][1:] == [
        {
            "type": "function_call",
            "call_id": "call_61cRAI5gleGxCN89umufHn2a",
            "name": "get_capital",
            "arguments": json.dumps({"country": "PotatoLand"}),
        },
        {
            "type": "function_call_output",
            "call_id": "call_61cRAI5gleGxCN89umufHn2a",
            "output": "Potato City",
        },
    ]
    calls = next(m for m in result.messages if m.get("tool_calls"))["tool_calls"]
    assert calls[0]["name"] == "get_capital" and calls[0]["args"] == {"country": "PotatoLand"}
    check_bodies(server)


async def test_recorded_stream_keeps_reasoning_across_the_tool_turn(
    server: rs.ResponsesServer,
) -> None:
    server.add(rs.fixture("stream_reasoning_function_call.sse"), rs.fixture("stream_text.sse"))
    agent = Agent(
        model(server, "gpt-5"),
        instructions="You are a helpful assistant that reports weather updates.",
        tools=[get_weather],
    )
    thread = agent.thread("weather")
    stream = thread.stream("What is the weather in New York City, USA?")
    events = [e async for e in stream]
    reply = await stream.reply()
    texts = [e.text for e in events if isinstance(e, TextEvent)]
    assert "".join(texts) == reply.text == "Current weather in New York City, USA: Sunny."
    assert len(texts) > 1
    assistant = next(m for m in reply.messages if m.get("tool_calls"))
    assert assistant["tool_calls"][0]["args"] == {"location": "New York City, USA"}
    # the item of output_item.done, not the incomplete one of output_item.added
    assert assistant["reasoning_items"] == [
        {
            "id": "rs_68d9303e94ac819ead3d9e066f405eae03aa6e5a972b3b23",
            "summary": [],
            "encrypted_content": "gAAAAABo2TA_9aBcwzsKm0jKc1AOjWhLaOBwJbo7JTTTcQtPJiM2LT1n7o9DY7uzvo",
        }
    ]
    assert reply.usage["reasoning_tokens"] == 128 and reply.usage["input_tokens"] == 75 + 114
    first, second = server.requests
    for body in (first, second):
        assert body["stream"] is True and body["store"] is False
        assert body["include"] == ["reasoning.encrypted_content"]
        assert body["reasoning"] == {"summary": "auto"}
    assert [item.get("type") for item in second["input"]] == [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
    ]
    assert second["input"][1] == {
        "type": "reasoning",
        "id": "rs_68d9303e94ac819ead3d9e066f405eae03aa6e5a972b3b23",
        "summary": [],
        "encrypted_content": "gAAAAABo2TA_9aBcwzsKm0jKc1AOjWhLaOBwJbo7JTTTcQtPJiM2LT1n7o9DY7uzvo",
    }
    assert second["input"][2]["call_id"] == "call_5dp5Uj0Loqn1YcyIpqSq6sLX"
    assert second["input"][3] == {
        "type": "function_call_output",
        "call_id": "call_5dp5Uj0Loqn1YcyIpqSq6sLX",
        "output": "Sunny",
    }
    # what the thread saved reads back the same (plain JSON), and goes out again next turn
    server.add(rs.text("Still sunny."))
    again = await thread.send("And now?")
    assert again.text == "Still sunny."
    third = server.requests[2]["input"]
    assert [i.get("type") for i in third[:4]] == [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
    ]
    assert third[4:] == [
        {
            "type": "message",
            "role": "assistant",
            "content": "Current weather in New York City, USA: Sunny.",
        },
        {"type": "message", "role": "user", "content": "And now?"},
    ]
    check_bodies(server)


async def test_recorded_reasoning_summary_is_the_reasoning_text(
    server: rs.ResponsesServer,
) -> None:
    server.add(rs.fixture("json_reasoning.json"), rs.text("Walk."))
    thread = Agent(model(server, "gpt-5")).thread("street")
    reply = await thread.send("How do I cross the street?")
    assert reply.text.startswith("Find a crosswalk")
    assistant = reply.messages[-1]
    assert assistant["reasoning"] == (
        "**Considering street crossing safety**\n\nI need to parse the user's query about "
        "crossing the street.\n\n**Providing street crossing advice**\n\nI can give "
        "step-by-step general advice for crossing the street."
    )
    (item,) = assistant["reasoning_items"]
    assert item["id"] == "rs_68c42c90b950819c9e32c46d4f8326ca07460311b0c8d3de"
    assert len(item["summary"]) == 2
    assert reply.usage["reasoning_tokens"] == 1664
    await thread.send("Thanks")
    sent = server.requests[1]["input"]
    assert sent[1]["type"] == "reasoning" and sent[1]["summary"][1]["type"] == "summary_text"
    assert sent[1]["encrypted_content"].startswith("gAAAAABoxCyz")
    check_bodies(server)


async def test_reasoning_summary_deltas_reach_the_reasoning_sink(
    server: rs.ResponsesServer,
) -> None:
    server.add(
        rs.calls(
            ("add", {"a": 1, "b": 2}),
            reasoning=[
                rs.reasoning_item("rs_1", ["Thinking about adding numbers."]),
                rs.reasoning_item("rs_2", ["Both are small.", "So: call add."], "gAAAA2"),
            ],
        )
    )
    m = model(server)
    text: list[str] = []
    thoughts: list[str] = []
    req = ModelRequest(
        [{"role": "user", "content": "1+2"}],
        [add.spec()],
        on_text=text.append,
        on_reasoning=thoughts.append,
    )
    response = await m.generate(req)
    assert text == [] and len(thoughts) > 3
    message = response.message
    assert (
        "".join(thoughts)
        == message["reasoning"]
        == ("Thinking about adding numbers.\n\nBoth are small.\n\nSo: call add.")
    )
    assert [r["id"] for r in message["reasoning_items"]] == ["rs_1", "rs_2"]
    assert message["tool_calls"][0]["id"] == "call_0_add"
    await m.aclose()


async def test_streamed_reasoning_events_and_a_max_tokens_stop_through_the_agent(
    server: rs.ResponsesServer,
) -> None:
    server.add(
        rs.incomplete(
            "max_output_tokens",
            "The answer was cut off here",
            reasoning=[rs.reasoning_item("rs_a", ["First I think.", "Then I write."])],
        )
    )
    thread = Agent(model(server)).thread("cut")
    stream = thread.stream("write a lot")
    events = [e async for e in stream]
    reply = await stream.reply()
    assert reply.stop_reason == "max_tokens"
    assert reply.messages[-1]["content"] == "The answer was cut off here"
    thoughts = "".join(e.text for e in events if isinstance(e, ReasoningEvent))
    assert thoughts == reply.messages[-1]["reasoning"] == "First I think.\n\nThen I write."
    answer = "".join(e.text for e in events if isinstance(e, TextEvent))
    assert answer == "The answer was cut off here"


async def test_usage_maps_cached_and_reasoning_tokens(server: rs.ResponsesServer) -> None:
    server.add(rs.text("ok", use=rs.usage(100, 40, cached=64, reasoning=32)))
    result = await Agent(model(server)).run("hi")
    assert result.usage == {
        "input_tokens": 100,
        "output_tokens": 40,
        "cache_read_tokens": 64,
        "cache_write_tokens": 0,
        "reasoning_tokens": 32,
    }


async def test_typed_output_uses_a_strict_json_schema(server: rs.ResponsesServer) -> None:
    server.add(rs.text('{"value": 5, "note": null}'))
    result = await Agent(model(server), output=Answer).run("2+3")
    assert result.output == Answer(value=5)
    fmt = server.requests[0]["text"]["format"]
    assert fmt["type"] == "json_schema" and fmt["name"] == "output" and fmt["strict"] is True
    assert fmt["schema"]["additionalProperties"] is False
    assert fmt["schema"]["required"] == ["value", "note"]
    check_bodies(server)


def test_a_schema_open_to_extra_keys_is_sent_non_strict() -> None:
    open_schema = {"type": "object", "properties": {"a": {"type": "object"}}}
    nested_open = {
        "type": "object",
        "properties": {"tags": {"type": "object", "additionalProperties": {"type": "string"}}},
    }
    assert strict_schema(nested_open) == (nested_open, False)
    schema, strict = strict_schema(open_schema)
    assert strict and schema["properties"]["a"]["additionalProperties"] is False
    assert "additionalProperties" not in open_schema  # the caller's schema is not changed

    # pydantic's `$ref` with a description and `default: null`, as the openai SDK fixes them
    class Inner(pydantic.BaseModel):
        x: int

    class Outer(pydantic.BaseModel):
        inner: Inner = pydantic.Field(description="the inner part")
        maybe: int | None = None

    schema, strict = strict_schema(Outer.model_json_schema())
    assert strict
    inner = schema["properties"]["inner"]
    assert "$ref" not in inner and inner["description"] == "the inner part"
    assert inner["additionalProperties"] is False and inner["required"] == ["x"]
    assert "default" not in schema["properties"]["maybe"]
    assert schema["required"] == ["inner", "maybe"]
    assert (
        strict_schema({"type": "object", "properties": {"a": {"$ref": "#/nope", "title": "A"}}})[1]
        is False
    )


async def test_empty_and_unicode_user_input(server: rs.ResponsesServer) -> None:
    server.add(rs.text(""), rs.text("ünïcødé ✓ 𝄞"))
    thread = Agent(model(server)).thread("empty")
    await thread.send("")
    assert server.requests[0]["input"] == [{"type": "message", "role": "user", "content": ""}]
    reply = await thread.send("𝄞 " * 5000)
    assert reply.text == "ünïcødé ✓ 𝄞"
    # an empty assistant answer goes back as an empty assistant message
    assert server.requests[1]["input"][1] == {
        "type": "message",
        "role": "assistant",
        "content": "",
    }
    check_bodies(server)


async def test_max_output_tokens_is_a_max_tokens_stop(server: rs.ResponsesServer) -> None:
    m = model(server, extra_body={"max_output_tokens": 16})
    server.add(rs.incomplete("max_output_tokens", "A long answer that was cu"))
    response = await m.generate(ModelRequest([{"role": "user", "content": "go"}], []))
    assert response.stop_reason == "max_tokens"
    assert response.message["content"] == "A long answer that was cu"
    assert server.requests[0]["max_output_tokens"] == 16
    # streamed: response.incomplete ends the stream
    server.add(rs.incomplete("max_output_tokens", "A long answer that was cu"))
    pieces: list[str] = []
    response = await m.generate(
        ModelRequest([{"role": "user", "content": "go"}], [], on_text=pieces.append)
    )
    assert response.stop_reason == "max_tokens" and "".join(pieces) == "A long answer that was cu"
    check_bodies(server)
    await m.aclose()


@pytest.mark.parametrize("streamed", [False, True])
async def test_content_filter_and_refusal_stop(server: rs.ResponsesServer, streamed: bool) -> None:
    server.add(rs.incomplete("content_filter"), rs.refusal("I can't help with that."))
    for _ in range(2):
        thread = Agent(model(server)).thread(f"filter-{streamed}-{_}")
        if streamed:
            stream = thread.stream("something bad")
            _events = [e async for e in stream]
            reply = await stream.reply()
        else:
            reply = await thread.send("something bad")
        assert reply.stop_reason == "content_filter"
    assert reply.messages[-1]["content"] == "I can't help with that."


@pytest.mark.parametrize("status", [429, 500, 502, 503, 529])
async def test_transient_http_errors_are_retried(server: rs.ResponsesServer, status: int) -> None:
    server.add(rs.error(status, "try again", headers={"retry-after": "0"}), rs.text("fine"))
    result = await Agent(model(server), model_retry=NO_WAIT).run("hi")
    assert result.text == "fine" and len(server.requests) == 2


@pytest.mark.parametrize(
    ("status", "message", "kind"),
    [
        (400, "Invalid value: 'input_texts'. Supported values are ...", "bad_request"),
        (400, "Your input exceeds the context window of this model.", "context_overflow"),
        (401, "Incorrect API key provided: sk-test.", "auth"),
        (404, "The model `gpt-9` does not exist", "not_found"),
    ],
)
async def test_other_4xx_are_not_retried(
    server: rs.ResponsesServer, status: int, message: str, kind: str
) -> None:
    server.add(rs.error(status, message, kind="invalid_request_error"))
    with pytest.raises(ModelError) as info:
        await Agent(model(server), model_retry=NO_WAIT).run("hi")
    assert info.value.kind == kind and info.value.status == status
    assert message in str(info.value) and info.value.provider == "openai"
    assert len(server.requests) == 1


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize(
    ("code", "kind", "retried"),
    [
        ("server_error", "transient", True),
        ("rate_limit_exceeded", "rate_limit", True),
        ("context_length_exceeded", "context_overflow", False),
        ("invalid_prompt", "content_filter", False),
        ("invalid_image_url", "bad_request", False),
    ],
)
async def test_failed_responses(
    server: rs.ResponsesServer, streamed: bool, code: str, kind: str, retried: bool
) -> None:
    server.add(rs.failed(code, f"it failed: {code}"), rs.text("second try"))
    agent = Agent(model(server), model_retry=NO_WAIT)
    thread = agent.thread(f"failed-{code}-{streamed}")
    if retried:
        if streamed:
            stream = thread.stream("hi")
            _ = [e async for e in stream]
            reply = await stream.reply()
        else:
            reply = await thread.send("hi")
        assert reply.text == "second try" and len(server.requests) == 2
        return
    if kind == "content_filter":
        # a prompt the provider refuses ends the run with a content-filter stop
        reply = await thread.send("hi")
        assert reply.stop_reason == "content_filter" and len(server.requests) == 1
        return
    with pytest.raises(ModelError) as info:
        await ask(thread, "hi", streamed=streamed)
    assert info.value.kind == kind and f"it failed: {code}" in str(info.value)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("code", "message", "kind", "retried"),
    [
        ("server_error", "The server had an error processing your request.", "transient", True),
        (None, "An error occurred while processing your request.", "transient", True),
        ("rate_limit_exceeded", "Rate limit reached for gpt-5", "rate_limit", True),
        (
            "context_length_exceeded",
            "Your input exceeds the context window",
            "context_overflow",
            False,
        ),
    ],
)
async def test_error_stream_events(
    server: rs.ResponsesServer, code: str | None, message: str, kind: str, retried: bool
) -> None:
    server.add(rs.stream_error(code, message), rs.text("recovered"))
    thread = Agent(model(server), model_retry=NO_WAIT).thread(f"err-{code}")
    if retried:
        assert (await ask(thread, "hi", streamed=True)).text == "recovered"
        return
    with pytest.raises(ModelError) as info:
        await ask(thread, "hi", streamed=True)
    assert info.value.kind == kind and message in str(info.value)


async def test_stream_cut_part_way_is_retried_without_repeating_text(
    server: rs.ResponsesServer,
) -> None:
    answer = "Once upon a time there was a very long answer that streamed."
    cut = rs.text(answer)
    cut.drop_after = 6  # after a few text deltas, before response.completed
    server.add(cut, rs.text(answer))
    thread = Agent(model(server), model_retry=NO_WAIT).thread("drop")
    stream = thread.stream("tell me")
    events = [e async for e in stream]
    reply = await stream.reply()
    assert reply.text == answer
    assert "".join(e.text for e in events if isinstance(e, TextEvent)) == answer
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    ("body", "what"),
    [
        (b'{"id": "resp_x", "output": [', "not valid JSON"),
        ([1, 2], "not a JSON object"),
        ({"status": "completed", "output": {"type": "message"}}, "'output' is not a list"),
        ({"status": "completed", "output": ["text"]}, "an output item is not an object"),
        ({"status": "queued", "output": []}, "unknown status 'queued'"),
        (
            {"status": "completed", "output": [], "usage": {"input_tokens": "many"}},
            "ValueError",
        ),
        # Bodies that once read as an empty answer.
        ({}, "the response has no 'output'"),
        ({"id": "resp_x"}, "the response has no 'output'"),
        ({"output": []}, "no answer in the response"),
        ({"output": None, "usage": {}}, "the response has no 'output'"),
        ({"status": "completed", "output": [{"type": "mystery"}]}, "no answer in the response"),
        ({"status": "completed", "output": [{"type": "message"}]}, "content is not a list"),
        (
            {"status": "completed", "output": [{"type": "message", "content": "hi"}]},
            "content is not a list",
        ),
        (
            {
                "status": "completed",
                "output": [{"type": "message", "content": [{"type": "output_text"}]}],
            },
            "a content part this adapter cannot read",
        ),
        (
            {"status": "completed", "output": [{"type": "function_call", "arguments": "{}"}]},
            "function_call without a name",
        ),
    ],
)
async def test_unreadable_replies_name_the_provider_and_the_problem(
    server: rs.ResponsesServer, body: Any, what: str
) -> None:
    server.add(rs.malformed(body))
    with pytest.raises(ModelError) as info:
        await Agent(model(server), model_retry=Retry(max_attempts=1)).run("hi")
    assert info.value.kind == "transient"
    assert what in str(info.value) and "openai:gpt-5-mini: " in str(info.value)


async def test_a_stream_whose_final_response_lists_no_items(server: rs.ResponsesServer) -> None:
    # Some compatible servers stream the text deltas but send no output_item.done and
    # an empty `output` in response.completed: the streamed text is the answer.
    deltas = [
        {"type": "response.output_text.delta", "output_index": 0, "delta": piece}
        for piece in ("Hel", "lo ", "✓")
    ]
    final = {"type": "response.completed", "response": rs.response([])}
    raw = "".join(f"data: {json.dumps(e)}\n\n" for e in [*deltas, final]).encode()
    server.add(rs.Step("raw", raw=raw, raw_stream=True))
    stream = Agent(model(server)).thread("bare").stream("hi")
    _ = [e async for e in stream]
    assert (await stream.reply()).text == "Hello ✓"


async def test_unknown_items_and_parts_are_ignored(server: rs.ResponsesServer) -> None:
    step = rs.text("The answer.")
    step.response["output"][0:0] = [
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        {"type": "reasoning"},  # no id: nothing to send back
        {"type": "message", "content": [{"type": "output_audio"}, "junk", None]},
        {"type": "function_call_without_type_we_know"},
    ]
    server.add(step)
    result = await Agent(model(server)).run("hi")
    assert result.text == "The answer."
    assert "reasoning_items" not in result.messages[-1]


@pytest.mark.parametrize("streamed", [False, True])
async def test_invalid_tool_arguments_go_back_to_the_model(
    server: rs.ResponsesServer, streamed: bool
) -> None:
    server.add(
        rs.calls(("add", '{"a": 2, "b":')),
        rs.calls(("add", '{"a": NaN, "b": 1}')),
        rs.calls(("add", {"a": 2, "b": 3})),
        rs.text("5"),
    )
    thread = Agent(model(server), tools=[add]).thread(f"bad-args-{streamed}")
    if streamed:
        stream = thread.stream("add")
        _ = [e async for e in stream]
        reply = await stream.reply()
    else:
        reply = await thread.send("add")
    tools = [m for m in reply.messages if m["role"] == "tool"]
    assert tools[0]["status"] == "error" and "not valid JSON" in tools[0]["content"]
    assert tools[1]["status"] == "error" and "NaN is not a JSON number" in tools[1]["content"]
    assert tools[2]["content"] == "5" and reply.text == "5"
    check_bodies(server)


async def test_repeated_provider_call_ids_keep_their_wire_id(server: rs.ResponsesServer) -> None:
    # Two turns whose calls share the provider's call id: the model node renames the
    # second in the transcript; the wire keeps the provider's id for call and output.
    server.add(
        rs.calls(("add", {"a": 1, "b": 1}), ids=["call_same"]),
        rs.calls(("add", {"a": 2, "b": 2}), ids=["call_same"]),
        rs.text("done"),
    )
    reply = await Agent(model(server), tools=[add]).thread("ids").send("go")
    assert reply.text == "done"
    last = server.requests[2]["input"]
    pairs = [(i["type"], i["call_id"]) for i in last if "call_id" in i]
    assert pairs == [
        ("function_call", "call_same"),
        ("function_call_output", "call_same"),
        ("function_call", "call_same"),
        ("function_call_output", "call_same"),
    ]
    outputs = [i["output"] for i in last if i["type"] == "function_call_output"]
    assert outputs == ["2", "4"]


async def test_string_form_and_factory(
    server: rs.ResponsesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    server.add(rs.text("hi"))
    assert (await Agent("openai-responses:gpt-5-mini").run("hello")).text == "hi"
    assert server.headers[0]["authorization"] == "Bearer sk-env"
    assert server.requests[0]["model"] == "gpt-5-mini"
    assert server.paths == ["/v1/responses"]
    assert isinstance(openai("gpt-5", api="responses"), OpenAIResponsesModel)
    assert not isinstance(openai("gpt-5"), OpenAIResponsesModel)
    with pytest.raises(ValidationError, match="'chat' or 'responses'"):
        openai("gpt-5", api="completions")
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.delenv("OPENAI_BASE_URL")
    with pytest.raises(ValidationError, match="OPENAI_API_KEY"):
        Agent("openai-responses:gpt-5-mini")
    with pytest.raises(ValidationError, match="OPENAI_API_KEY"):
        openai_responses("gpt-5")


async def test_reasoning_options_and_extra_body(server: rs.ResponsesServer) -> None:
    server.add(rs.text("a"), rs.text("b"), rs.text("c"))
    m = openai_responses(
        "o4-mini",
        api_key="k",
        base_url=server.base_url,
        reasoning_summary="detailed",
        extra_body={"reasoning": {"effort": "high"}, "max_output_tokens": 500},
    )
    await Agent(m).run("x")
    body = server.requests[0]
    assert body["reasoning"] == {"summary": "detailed", "effort": "high"}
    assert body["max_output_tokens"] == 500
    off = openai_responses("gpt-5", api_key="k", base_url=server.base_url, reasoning=False)
    await Agent(off).run("x")
    assert "include" not in server.requests[1] and "reasoning" not in server.requests[1]
    # a reasoning model without a summary: encrypted items only
    quiet = openai_responses("gpt-5", api_key="k", base_url=server.base_url, reasoning_summary=None)
    await Agent(quiet).run("x")
    assert server.requests[2]["include"] == ["reasoning.encrypted_content"]
    assert "reasoning" not in server.requests[2]
    check_bodies(server)


async def test_falls_back_after_a_failed_stream(server: rs.ResponsesServer) -> None:
    server.add(rs.stream_error("server_error", "overloaded"))
    backup = FakeModel(["from backup"], name="backup")
    agent = Agent(model(server), fallbacks=[backup], model_retry=Retry(max_attempts=1))
    stream = agent.thread("fb").stream("go")
    _ = [e async for e in stream]
    reply = await stream.reply()
    assert reply.text == "from backup"


async def test_slow_response_times_out(server: rs.ResponsesServer) -> None:
    server.add(rs.Step("response", rs.response([rs.message_item("late")]), delay=5))
    server.add(rs.Step("response", rs.response([rs.message_item("late")]), delay=5))
    agent = Agent(
        model(server, timeout_secs=0.2),
        model_retry=Retry(max_attempts=2, initial_backoff_secs=0),
    )
    with pytest.raises(ModelError) as info:
        await asyncio.wait_for(agent.run("hi"), timeout=30)
    assert info.value.kind == "timeout" and len(server.requests) == 2
