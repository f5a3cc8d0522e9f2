"""Real models in the field: the OpenAI Chat Completions (and compatible), Anthropic and
Gemini adapters against replies recorded from real traffic (the replay corpus in
tests/fixtures/provider_replay/), over loopback HTTP: errors inside a 200 stream, answers
cut off by the output-token cap, reasoning models with tools, empty input, and replies the
adapter cannot read."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from anthropic.types.message_create_params import (
    MessageCreateParamsNonStreaming,
    MessageCreateParamsStreaming,
)
from openai.types.chat.completion_create_params import (
    CompletionCreateParamsNonStreaming,
    CompletionCreateParamsStreaming,
)

from criogen_graph import (
    Agent,
    MessageEvent,
    Model,
    ModelError,
    ReasoningEvent,
    Redactor,
    Retry,
    TextEvent,
    ValidationError,
    anthropic,
    gemini,
    openai,
    tool,
)
from tests.servers.replay_server import CORPUS, ReplayServer
from tests.typed_bodies import assert_gemini_request, assert_request

NO_WAIT = Retry(max_attempts=3, initial_backoff_secs=0, jitter=False)
PROVIDERS = ("openai", "anthropic", "gemini")
_OPEN: list[Model] = []


@tool
async def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@pytest.fixture
def srv() -> Iterator[ReplayServer]:
    with ReplayServer() as server:
        yield server


@pytest.fixture(autouse=True)
async def close_models() -> AsyncIterator[None]:
    yield
    while _OPEN:
        await _OPEN.pop().aclose()


def make(provider: str, server: ReplayServer, **kw: Any) -> Any:
    if provider == "openai":
        m: Any = openai("gpt-test", api_key="sk-test", base_url=server.base_url + "/v1", **kw)
    elif provider == "anthropic":
        m = anthropic("claude-test", api_key="test", base_url=server.base_url, **kw)
    else:
        m = gemini("gemini-test", api_key="test", base_url=server.base_url, **kw)
    _OPEN.append(m)
    return m


def agent(provider: str, server: ReplayServer, **kw: Any) -> Agent[Any]:
    model_kw = kw.pop("model_kw", {})
    kw.setdefault("model_retry", NO_WAIT)
    return Agent(make(provider, server, **model_kw), tools=[add], **kw)


async def run(a: Agent[Any], prompt: str, *, streamed: bool, thread: str = "t") -> Any:
    """The reply and, when streamed, its events."""
    if not streamed:
        return await a.thread(thread).send(prompt), []
    stream = a.thread(thread).stream(prompt)
    events = [e async for e in stream]
    return await stream.reply(), events


def check_bodies(provider: str, server: ReplayServer) -> None:
    """Every request fits the official SDK's typed request (no unknown keys)."""
    assert server.requests
    for body in server.requests:
        if provider == "openai":
            typed: Any = (
                CompletionCreateParamsStreaming
                if body.get("stream")
                else CompletionCreateParamsNonStreaming
            )
            assert_request(body, typed)
        elif provider == "anthropic":
            streamed = body.get("stream")
            assert_request(
                body, MessageCreateParamsStreaming if streamed else MessageCreateParamsNonStreaming
            )
        else:
            assert_gemini_request(body)


def test_every_fixture_names_its_source() -> None:
    names = sorted(CORPUS.glob("*/*.json"))
    assert len(names) >= 50
    for path in names:
        data = json.loads(path.read_text("utf-8"))
        assert data["source"].strip(), path
        assert ("body" in data) != ("sse" in data), path


# -- 1. errors inside a 200 stream ---------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "kind", "message", "attempts"),
    [
        ("openai/groq_stream_error", "bad_request", "Failed to call a function", 1),
        ("openai/openrouter_chunk_error", "transient", "Provider disconnected unexpectedly", 3),
        ("openai/openrouter_chunk_error_400", "bad_request", "context too long", 1),
        ("openai/openrouter_body_error", "transient", "Provider returned error", 3),
        ("anthropic/stream_overloaded", "transient", "Overloaded", 3),
        ("gemini/stream_error", "transient", "The model is overloaded", 3),
        ("gemini/stream_error_400", "bad_request", "invalid argument", 1),
    ],
)
async def test_error_inside_a_200_is_a_classified_model_error(
    srv: ReplayServer, fixture: str, kind: str, message: str, attempts: int
) -> None:
    provider = fixture.split("/")[0]
    srv.replay(*[fixture] * 3)
    streamed = "body_error" not in fixture
    with pytest.raises(ModelError) as info:
        await run(agent(provider, srv), "hi", streamed=streamed)
    assert info.value.kind == kind
    assert message in str(info.value) and provider in str(info.value)
    assert len(srv.requests) == attempts  # a 400-type error is not retried


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_overload_inside_a_stream_is_retried_without_repeating_text(
    srv: ReplayServer, provider: str
) -> None:
    first = {
        "openai": "openai/openrouter_chunk_error",
        "anthropic": "anthropic/stream_overloaded",
        "gemini": "gemini/stream_error",
    }[provider]
    second = "openai/streamed_text" if provider == "openai" else f"{provider}/stream_text"
    srv.replay(first, second)
    reply, events = await run(agent(provider, srv), "hi", streamed=True)
    text = "".join(e.text for e in events if isinstance(e, TextEvent))
    assert text == reply.text and reply.stop_reason == "final_answer"
    assert len(srv.requests) == 2


# -- 2. truncation at the output-token cap -------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "streamed"),
    [
        ("openai/length_text", False),
        ("anthropic/max_tokens_text", False),
        ("gemini/max_tokens", False),
        ("gemini/max_tokens_stream", True),
    ],
)
async def test_cut_off_answer_ends_with_max_tokens_and_keeps_its_text(
    srv: ReplayServer, fixture: str, streamed: bool
) -> None:
    provider = fixture.split("/")[0]
    srv.replay(fixture)
    reply, _ = await run(agent(provider, srv), "Tell me about Rome", streamed=streamed)
    assert reply.stop_reason == "max_tokens"
    assert reply.messages[-1]["role"] == "assistant"
    assert reply.messages[-1]["content"].startswith("The history of Rome begins with")
    assert reply.text == reply.messages[-1]["content"]  # the cut text is the answer so far


@pytest.mark.parametrize(
    ("fixture", "after"),
    [
        ("openai/length_tool_call_stream", "openai/streamed_text"),
        ("anthropic/max_tokens_tool_use_stream", "anthropic/stream_text"),
    ],
)
async def test_a_tool_call_cut_at_max_tokens_never_runs_and_the_thread_goes_on(
    srv: ReplayServer, fixture: str, after: str
) -> None:
    provider = fixture.split("/")[0]
    ran: list[Any] = []

    @tool
    async def add(a: int, b: int) -> int:
        """Add two numbers."""
        ran.append((a, b))
        return a + b

    srv.replay(fixture, after)
    a: Agent[Any] = Agent(make(provider, srv), tools=[add], model_retry=NO_WAIT)
    reply, _ = await run(a, "What is 2 + 3?", streamed=True)
    assert reply.stop_reason == "max_tokens" and not ran
    tool_msgs = [m for m in reply.messages if m["role"] == "tool"]
    assert len(tool_msgs) == 1 and tool_msgs[0]["status"] == "skipped"
    assert tool_msgs[0]["content"].startswith("Not run")
    # The next send works: the cut call is answered in the transcript it sends.
    reply2, _ = await run(a, "Try again", streamed=True)
    assert reply2.stop_reason == "final_answer" and not ran
    check_bodies(provider, srv)


async def test_max_tokens_is_the_exported_finish_reason(srv: ReplayServer) -> None:
    from criogen_graph import Telemetry
    from tests.servers.otlp_receiver import OtlpReceiver

    srv.replay("gemini/max_tokens")
    with OtlpReceiver() as rx:
        telemetry = Telemetry.otlp(rx.url)
        try:
            await agent("gemini", srv, telemetry=telemetry).run("Tell me about Rome")
            assert telemetry.flush(10)
            (chat,) = [s for s in rx.spans if s.name == "chat gemini-test"]
            assert chat.attributes["gen_ai.response.finish_reasons"] == ["max_tokens"]
        finally:
            telemetry.shutdown()


# -- 3. reasoning models with tools --------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
async def test_anthropic_thinking_blocks_go_back_unchanged_with_the_tool_results(
    srv: ReplayServer, streamed: bool
) -> None:
    first = "anthropic/thinking_stream_tool_use" if streamed else "anthropic/thinking_tool_use"
    srv.replay(
        first, "anthropic/thinking_text_after_tool" if not streamed else "anthropic/stream_text"
    )
    thinking = {"type": "enabled", "budget_tokens": 2048}
    a = agent("anthropic", srv, model_kw={"thinking": thinking})
    reply, events = await run(a, "What is 2 + 3?", streamed=streamed)
    assert reply.stop_reason == "final_answer"
    first_body, second_body = srv.requests
    assert first_body["thinking"] == thinking
    sent = second_body["messages"][1]
    assert sent["role"] == "assistant"
    expected = json.loads((CORPUS / f"{first}.json").read_text())
    if streamed:
        wire_thinking = {
            "type": "thinking",
            "thinking": "This is a straightforward sum: call add.",
            "signature": "Eu4CCkYICxgCKkCptg1Gj6hlyXcXwEx/TWfLRbzj5pHZxehbLo+uxHyNHQBj3v94K/"
            "YaznDPaHK1SaPgHUXNGXLS5ZLCZLLL1JyXEgxQ==",
        }
        reasoning = [e.text for e in events if isinstance(e, ReasoningEvent)]
        assert "".join(reasoning) == wire_thinking["thinking"]
        assert all(not isinstance(e, TextEvent) or "call add" not in e.text for e in events)
    else:
        wire_thinking = expected["body"]["content"][0]
    assert sent["content"][0] == wire_thinking
    assert sent["content"][1]["type"] == "tool_use"
    assistant = reply.messages[1]
    assert assistant["reasoning"] == wire_thinking["thinking"]
    assert assistant["reasoning_blocks"][0]["signature"] == wire_thinking["signature"]
    json.dumps(reply.messages)  # the transcript stays JSON
    check_bodies("anthropic", srv)


async def test_anthropic_redacted_thinking_goes_back_unchanged(srv: ReplayServer) -> None:
    srv.replay("anthropic/redacted_thinking_tool_use", "anthropic/text_after_tools")
    a = agent("anthropic", srv, model_kw={"thinking": {"type": "enabled", "budget_tokens": 1024}})
    reply, _ = await run(a, "What is 2 + 3?", streamed=False)
    assert reply.stop_reason == "final_answer"
    block = json.loads((CORPUS / "anthropic/redacted_thinking_tool_use.json").read_text())
    assert srv.requests[1]["messages"][1]["content"][0] == block["body"]["content"][0]
    check_bodies("anthropic", srv)


def test_thinking_budget_must_fit_max_tokens() -> None:
    with pytest.raises(ValidationError, match="budget_tokens"):
        anthropic(
            "claude-x",
            api_key="k",
            max_tokens=1024,
            thinking={"type": "enabled", "budget_tokens": 2048},
        )


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
async def test_deepseek_reasoning_content_goes_back_on_the_tool_turn_only(
    srv: ReplayServer, streamed: bool
) -> None:
    first = (
        "openai/deepseek_reasoning_stream_tool_call"
        if streamed
        else "openai/deepseek_reasoning_tool_call"
    )
    srv.replay(first, "openai/streamed_text" if streamed else "openai/deepseek_text")
    srv.replay("openai/streamed_text" if streamed else "openai/text_after_tools")
    a = agent("openai", srv)
    reply, events = await run(a, "What is 2 + 3?", streamed=streamed)
    thought = "The user wants 2+3. " + (
        "I should call add." if streamed else "I should call the add tool."
    )
    assistant = reply.messages[1]
    assert assistant["reasoning"] == thought and assistant["tool_calls"]
    if streamed:
        assert "".join(e.text for e in events if isinstance(e, ReasoningEvent)) == thought
    # On the tool turn the reasoning goes back as reasoning_content ...
    (sent,) = [m for m in srv.requests[1]["messages"] if m["role"] == "assistant"]
    assert sent["reasoning_content"] == thought
    # ... and once a new user turn starts, it is left out.
    await run(a, "And 4 + 4?", streamed=streamed)
    assert all("reasoning_content" not in m for m in srv.requests[2]["messages"])


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
async def test_gemini_thoughts_are_reasoning_and_signatures_go_back(
    srv: ReplayServer, streamed: bool
) -> None:
    first = "gemini/thinking_stream_function_call" if streamed else "gemini/thinking_function_call"
    srv.replay(first, "gemini/stream_text" if streamed else "gemini/text_after_tools")
    reply, events = await run(agent("gemini", srv), "What is 2 + 3?", streamed=streamed)
    assistant = reply.messages[1]
    assert "I will call add." in assistant["reasoning"]
    assert "I will call add" not in (assistant["content"] or "")
    sent = srv.requests[1]["contents"][1]
    assert sent["role"] == "model"
    assert [p.get("thought") for p in sent["parts"]] == [None]  # thoughts are not sent back
    assert sent["parts"][0]["thoughtSignature"].startswith("CiIBVKhc7oDP")
    if streamed:
        assert "I will call add." in "".join(
            e.text for e in events if isinstance(e, ReasoningEvent)
        )
    check_bodies("gemini", srv)


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
async def test_reasoning_goes_through_the_redactor(srv: ReplayServer, streamed: bool) -> None:
    first = "anthropic/thinking_stream_tool_use" if streamed else "anthropic/thinking_tool_use"
    srv.replay(first, "anthropic/stream_text" if streamed else "anthropic/text_after_tools")
    # "add" appears in both thinking texts: the redactor must reach it everywhere.
    a = agent(
        "anthropic",
        srv,
        model_kw={"thinking": {"type": "enabled", "budget_tokens": 1024}},
        redact=Redactor({r"\badd\b": "[TOOL]"}),
    )
    reply, events = await run(a, "What is 2 + 3?", streamed=streamed)
    assistant = reply.messages[1]
    assert "add" not in assistant["reasoning"] and "[TOOL]" in assistant["reasoning"]
    assert "add" not in assistant["reasoning_blocks"][0]["thinking"]
    streamed_reasoning = "".join(e.text for e in events if isinstance(e, ReasoningEvent))
    assert " add" not in streamed_reasoning
    for e in events:
        if isinstance(e, MessageEvent) and e.message.get("reasoning"):
            assert " add" not in e.message["reasoning"]
    # The changed block no longer matches its signature: it is not sent back as it is.
    # The API would reject a tool loop with thinking on and the block missing, so that
    # request goes without thinking.
    sent = srv.requests[1]["messages"][1]["content"]
    assert all(b["type"] != "thinking" for b in sent)
    assert "thinking" in srv.requests[0] and "thinking" not in srv.requests[1]
    assert reply.stop_reason == "final_answer"


# -- 4. empty input ---------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_empty_input_sends_a_user_turn(srv: ReplayServer, provider: str) -> None:
    srv.replay(f"{provider}/text")
    reply, _ = await run(agent(provider, srv), "", streamed=False)
    assert reply.stop_reason == "final_answer"
    body = srv.requests[0]
    if provider == "openai":
        assert [m for m in body["messages"] if m["role"] != "system"] == [
            {"role": "user", "content": ""}
        ]
    elif provider == "anthropic":
        # The API rejects empty and whitespace-only text.
        assert body["messages"] == [
            {"role": "user", "content": [{"type": "text", "text": "(empty)"}]}
        ]
    else:
        # The API rejects an empty text part ("required oneof field 'data'").
        assert body["contents"] == [{"role": "user", "parts": [{"text": " "}]}]
    check_bodies(provider, srv)


# -- 5. replies the adapter cannot read ---------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "streamed", "kind", "says"),
    [
        ("openai/stream_cut_mid_event", True, "connection", "incomplete chunked read"),
        ("openai/unreadable_choice", False, "transient", "could not read the reply"),
        ("anthropic/stream_cut_mid_event", True, "connection", "incomplete chunked read"),
        ("gemini/stream_cut_mid_event", True, "connection", "in the middle of an event"),
        ("gemini/unreadable_parts", False, "transient", "could not read the reply"),
    ],
)
async def test_a_reply_that_cannot_be_read_is_a_model_error(
    srv: ReplayServer, fixture: str, streamed: bool, kind: str, says: str
) -> None:
    provider = fixture.split("/")[0]
    srv.replay(*[fixture] * 3)
    with pytest.raises(ModelError) as info:
        await run(agent(provider, srv), "hi", streamed=streamed)
    assert info.value.kind == kind and says in str(info.value)
    assert str(info.value).startswith(f"{provider}:")


async def test_malformed_tool_arguments_go_back_to_the_model(srv: ReplayServer) -> None:
    srv.replay("openai/malformed_tool_args", "openai/text_after_tools")
    reply, _ = await run(agent("openai", srv), "What is 2 + 3?", streamed=False)
    (result,) = [m for m in reply.messages if m["role"] == "tool"]
    assert result["status"] == "error" and "not valid JSON" in result["content"]
    assert reply.stop_reason == "final_answer"


# -- 6. the corpus: text, tools, usage, safety, HTTP errors ---------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_text_with_cached_and_reasoning_usage(srv: ReplayServer, provider: str) -> None:
    srv.replay(f"{provider}/text")
    reply, _ = await run(agent(provider, srv), "Capital of France?", streamed=False)
    assert reply.stop_reason == "final_answer" and reply.text
    expected = {
        "openai": {
            "input_tokens": 2006,
            "output_tokens": 300,
            "cache_read_tokens": 1920,
            "cache_write_tokens": 0,
            "reasoning_tokens": 256,
        },
        "anthropic": {
            "input_tokens": 21 + 188086 + 1024,
            "output_tokens": 393,
            "cache_read_tokens": 1024,
            "cache_write_tokens": 188086,
            "reasoning_tokens": 0,
        },
        "gemini": {
            "input_tokens": 2006,
            "output_tokens": 44 + 256,
            "cache_read_tokens": 1920,
            "cache_write_tokens": 0,
            "reasoning_tokens": 256,
        },
    }[provider]
    assert reply.usage == expected


@pytest.mark.parametrize(
    ("fixture", "streamed"),
    [
        ("openai/parallel_tool_calls", False),
        ("openai/streamed_tool_calls", True),
        ("anthropic/parallel_tool_use", False),
        ("anthropic/streamed_tool_use", True),
        ("gemini/parallel_function_calls", False),
    ],
)
async def test_parallel_tool_calls_run_and_go_back(
    srv: ReplayServer, fixture: str, streamed: bool
) -> None:
    provider = fixture.split("/")[0]
    after = {
        ("openai", True): "openai/streamed_text",
        ("anthropic", True): "anthropic/stream_text",
    }.get((provider, streamed), f"{provider}/text_after_tools")
    srv.replay(fixture, after)
    reply, _ = await run(agent(provider, srv), "2 + 3 and 1 + 1?", streamed=streamed)
    assert [m["content"] for m in reply.messages if m["role"] == "tool"] == ["5", "2"]
    assert reply.stop_reason == "final_answer"
    check_bodies(provider, srv)


async def test_gemini_streamed_function_call(srv: ReplayServer) -> None:
    srv.replay("gemini/streamed_function_call", "gemini/stream_text")
    reply, _ = await run(agent("gemini", srv), "2 + 3?", streamed=True)
    assert [m["content"] for m in reply.messages if m["role"] == "tool"] == ["5"]
    check_bodies("gemini", srv)


@pytest.mark.parametrize("fixture", ["openai/content_filter", "anthropic/refusal", "gemini/safety"])
async def test_safety_stop(srv: ReplayServer, fixture: str) -> None:
    srv.replay(fixture)
    reply, _ = await run(agent(fixture.split("/")[0], srv), "something bad", streamed=False)
    assert reply.stop_reason == "content_filter"


@pytest.mark.parametrize(
    ("fixture", "kind", "attempts"),
    [
        ("openai/error_400", "bad_request", 1),
        ("openai/error_401", "auth", 1),
        ("openai/error_429", "rate_limit", 3),
        ("openai/error_529", "transient", 3),
        ("anthropic/error_400", "bad_request", 1),
        ("anthropic/error_401", "auth", 1),
        ("anthropic/error_429", "rate_limit", 3),
        ("anthropic/error_529", "transient", 3),
        ("gemini/error_400", "bad_request", 1),
        ("gemini/error_401", "auth", 1),
        ("gemini/error_429", "rate_limit", 3),
        ("gemini/error_503", "transient", 3),
    ],
)
async def test_http_errors(srv: ReplayServer, fixture: str, kind: str, attempts: int) -> None:
    srv.replay(*[fixture] * 3)
    with pytest.raises(ModelError) as info:
        await run(agent(fixture.split("/")[0], srv), "hi", streamed=False)
    assert info.value.kind == kind and len(srv.requests) == attempts
    body = json.loads((CORPUS / f"{fixture}.json").read_text())["body"]
    assert body["error"]["message"][:40] in str(info.value)


def test_a_transcript_without_a_user_turn_still_starts_with_one() -> None:
    from criogen_graph.models.anthropic import to_anthropic_messages
    from criogen_graph.models.gemini import to_gemini_contents

    only_system = [{"role": "system", "content": "Be brief."}]
    model_first = [*only_system, {"role": "assistant", "content": "Hello."}]
    for transcript in (only_system, model_first):
        _, messages = to_anthropic_messages(transcript)
        assert messages[0] == {"role": "user", "content": [{"type": "text", "text": "(empty)"}]}
        _, contents = to_gemini_contents(transcript)
        assert contents[0] == {"role": "user", "parts": [{"text": " "}]}
    assert to_anthropic_messages(model_first)[1][1]["role"] == "assistant"


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_odd_usage_values_do_not_fail_the_answer(srv: ReplayServer, provider: str) -> None:
    fixture = json.loads((CORPUS / f"{provider}/text.json").read_text())
    body = fixture["body"]
    if provider == "openai":
        body["usage"] = {
            "prompt_tokens": "12",
            "prompt_tokens_details": "n/a",
            "completion_tokens": 3,
        }
    elif provider == "anthropic":
        body["usage"] = {"input_tokens": None, "output_tokens": 3, "cache_read_input_tokens": "x"}
    else:
        body["usageMetadata"] = {"promptTokenCount": {"n": 1}, "candidatesTokenCount": 3}
    srv.add({**fixture, "source": "a recorded reply with odd usage values"})
    reply, _ = await run(agent(provider, srv), "hi", streamed=False)
    assert reply.stop_reason == "final_answer" and reply.usage["output_tokens"] == 3
