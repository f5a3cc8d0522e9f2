"""Every malformed reply body an adapter can get (a broken proxy, a compatible server that
gets the format wrong) is a `ModelError` of kind `transient` naming the provider and
saying it could not read the reply: never an empty successful answer, never a raw
exception. Served over loopback HTTP, as JSON bodies and as event streams, per provider
(OpenAI Chat Completions, OpenAI Responses, Anthropic, Gemini)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from criogen_graph import (
    Agent,
    Model,
    ModelError,
    Retry,
    anthropic,
    gemini,
    openai,
    openai_responses,
)
from tests.servers.replay_server import ReplayServer

_OPEN: list[Model] = []
ONE_TRY = Retry(max_attempts=1)


@pytest.fixture
def srv() -> Iterator[ReplayServer]:
    with ReplayServer() as server:
        yield server


@pytest.fixture(autouse=True)
async def close_models() -> AsyncIterator[None]:
    yield
    while _OPEN:
        await _OPEN.pop().aclose()


def make(provider: str, server: ReplayServer) -> Any:
    if provider == "openai":
        m: Any = openai("gpt-test", api_key="sk-test", base_url=server.base_url + "/v1")
    elif provider == "responses":
        m = openai_responses("gpt-5-mini", api_key="sk-test", base_url=server.base_url + "/v1")
    elif provider == "anthropic":
        m = anthropic("claude-test", api_key="test", base_url=server.base_url)
    else:
        m = gemini("gemini-test", api_key="test", base_url=server.base_url)
    _OPEN.append(m)
    return m


def sse(*events: Any) -> list[str]:
    return [line for e in events for line in (f"data: {json.dumps(e)}", "")]


def _responses_stream(final: Any, *before: Any) -> list[str]:
    return sse(*before, {"type": "response.completed", "response": final})


def _anthropic_stream(*events: Any) -> list[str]:
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": [],
            "usage": {"input_tokens": 1, "output_tokens": 0},
        },
    }
    stop = [
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 1},
        },
        {"type": "message_stop"},
    ]
    return sse(start, *events, *stop)


def _chat_stream(*deltas: Any) -> list[str]:
    chunks = [{"id": "c", "object": "chat.completion.chunk", "choices": [c]} for c in deltas]
    return [*sse(*chunks), "data: [DONE]", ""]


async def ask(agent: Agent[Any], *, streamed: bool) -> Any:
    if not streamed:
        return await agent.run("hi")
    stream = agent.thread("t").stream("hi")
    _ = [e async for e in stream]
    return await stream.reply()


CASES: list[tuple[str, str, dict[str, Any]]] = [
    # -- OpenAI Chat Completions
    (
        "openai",
        "choice without a message",
        {"body": {"choices": [{"index": 0, "finish_reason": "stop"}]}},
    ),
    ("openai", "no choices", {"body": {"object": "chat.completion", "choices": []}}),
    (
        "openai",
        "content a number",
        {
            "body": {
                "choices": [
                    {"message": {"role": "assistant", "content": 5}, "finish_reason": "stop"}
                ]
            }
        },
    ),
    (
        "openai",
        "content an object",
        {
            "body": {
                "choices": [
                    {
                        "message": {"role": "assistant", "content": {"text": "hi"}},
                        "finish_reason": "stop",
                    }
                ]
            }
        },
    ),
    (
        "openai",
        "content chunks not objects",
        {
            "body": {
                "choices": [
                    {"message": {"role": "assistant", "content": ["hi"]}, "finish_reason": "stop"}
                ]
            }
        },
    ),
    (
        "openai",
        "tool call without a name",
        {
            "body": {
                "choices": [
                    {
                        "message": {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {"id": "c1", "type": "function", "function": {"arguments": "{}"}}
                            ],
                        },
                        "finish_reason": "tool_calls",
                    }
                ]
            }
        },
    ),
    (
        "openai",
        "tool call name a number",
        {
            "body": {
                "choices": [
                    {
                        "message": {
                            "role": "assistant",
                            "tool_calls": [
                                {
                                    "id": "c1",
                                    "type": "function",
                                    "function": {"name": 5, "arguments": "{}"},
                                }
                            ],
                        },
                        "finish_reason": "tool_calls",
                    }
                ]
            }
        },
    ),
    (
        "openai",
        "stream: content a number",
        {"sse": _chat_stream({"index": 0, "delta": {"content": 5}, "finish_reason": "stop"})},
    ),
    (
        "openai",
        "stream: content an object",
        {
            "sse": _chat_stream(
                {"index": 0, "delta": {"content": {"t": 1}}},
                {"index": 0, "delta": {}, "finish_reason": "stop"},
            )
        },
    ),
    ("openai", "stream: choices not a list", {"sse": _chat_stream("x")}),
    (
        "openai",
        "stream: tool call without a name",
        {
            "sse": _chat_stream(
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [{"index": 0, "id": "c1", "function": {"arguments": "{}"}}]
                    },
                    "finish_reason": "tool_calls",
                }
            )
        },
    ),
    (
        "openai",
        "stream: choice without a delta",
        {"sse": _chat_stream({"index": 0, "finish_reason": "stop"})},
    ),
    # -- OpenAI Responses
    ("responses", "empty object", {"body": {}}),
    ("responses", "no output", {"body": {"object": "response", "status": "completed"}}),
    ("responses", "output null", {"body": {"status": "completed", "output": None}}),
    (
        "responses",
        "message content a string",
        {
            "body": {
                "status": "completed",
                "output": [{"type": "message", "role": "assistant", "content": "Hi"}],
            }
        },
    ),
    (
        "responses",
        "message without content",
        {"body": {"status": "completed", "output": [{"type": "message", "role": "assistant"}]}},
    ),
    (
        "responses",
        "output_text without text",
        {
            "body": {
                "status": "completed",
                "output": [{"type": "message", "content": [{"type": "output_text"}]}],
            }
        },
    ),
    (
        "responses",
        "output_text text a number",
        {
            "body": {
                "status": "completed",
                "output": [{"type": "message", "content": [{"type": "output_text", "text": 5}]}],
            }
        },
    ),
    (
        "responses",
        "content parts not objects",
        {"body": {"status": "completed", "output": [{"type": "message", "content": [None, "Hi"]}]}},
    ),
    ("responses", "item without a type", {"body": {"status": "completed", "output": [{}]}}),
    (
        "responses",
        "function_call without a name",
        {
            "body": {
                "status": "completed",
                "output": [{"type": "function_call", "call_id": "c1", "arguments": "{}"}],
            }
        },
    ),
    (
        "responses",
        "output not a list",
        {"body": {"status": "completed", "output": {"type": "message"}}},
    ),
    ("responses", "items not objects", {"body": {"status": "completed", "output": ["Hi"]}}),
    ("responses", "a list", {"body": [1, 2]}),
    ("responses", "stream: completed response empty", {"sse": _responses_stream({})}),
    (
        "responses",
        "stream: completed response without output",
        {"sse": _responses_stream({"status": "completed"})},
    ),
    (
        "responses",
        "stream: item content a string",
        {
            "sse": _responses_stream(
                {"status": "completed", "output": [{"type": "message", "content": "Hi"}]}
            )
        },
    ),
    (
        "responses",
        "stream: done item without type",
        {
            "sse": _responses_stream(
                {"status": "completed", "output": []},
                {"type": "response.output_item.done", "output_index": 0, "item": {}},
            )
        },
    ),
    ("responses", "stream: completed response not an object", {"sse": _responses_stream("done")}),
    # -- Anthropic
    ("anthropic", "empty object", {"body": {}}),
    ("anthropic", "content null", {"body": {"type": "message", "content": None}}),
    (
        "anthropic",
        "text block without text",
        {
            "body": {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "text"}],
                "stop_reason": "end_turn",
            }
        },
    ),
    (
        "anthropic",
        "text a number",
        {
            "body": {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "text", "text": 5}],
                "stop_reason": "end_turn",
            }
        },
    ),
    (
        "anthropic",
        "block not an object",
        {
            "body": {
                "type": "message",
                "role": "assistant",
                "content": ["Hi"],
                "stop_reason": "end_turn",
            }
        },
    ),
    (
        "anthropic",
        "block without a type",
        {
            "body": {
                "type": "message",
                "role": "assistant",
                "content": [{}],
                "stop_reason": "end_turn",
            }
        },
    ),
    (
        "anthropic",
        "tool_use without a name",
        {
            "body": {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "input": {}}],
                "stop_reason": "tool_use",
            }
        },
    ),
    (
        "anthropic",
        "thinking without thinking",
        {
            "body": {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "thinking"}],
                "stop_reason": "end_turn",
            }
        },
    ),
    ("anthropic", "stream: no message_start", {"sse": sse({"type": "message_stop"})}),
    (
        "anthropic",
        "stream: text a number",
        {
            "sse": _anthropic_stream(
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": 5},
                }
            )
        },
    ),
    (
        "anthropic",
        "stream: text delta a number",
        {
            "sse": _anthropic_stream(
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": 5},
                },
            )
        },
    ),
    (
        "anthropic",
        "stream: block null",
        {
            "sse": _anthropic_stream(
                {"type": "content_block_start", "index": 0, "content_block": None}
            )
        },
    ),
    (
        "anthropic",
        "stream: delta not an object",
        {
            "sse": _anthropic_stream(
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
                {"type": "content_block_delta", "index": 0, "delta": "Hi"},
            )
        },
    ),
    (
        "anthropic",
        "stream: tool_use without a name",
        {
            "sse": _anthropic_stream(
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "tool_use", "id": "t1", "input": {}},
                }
            )
        },
    ),
    # -- Gemini
    ("gemini", "empty object", {"body": {}}),
    (
        "gemini",
        "parts an object",
        {
            "body": {
                "candidates": [
                    {"content": {"parts": {"text": "x"}, "role": "model"}, "finishReason": "STOP"}
                ]
            }
        },
    ),
    (
        "gemini",
        "text a number",
        {
            "body": {
                "candidates": [
                    {"content": {"parts": [{"text": 5}], "role": "model"}, "finishReason": "STOP"}
                ]
            }
        },
    ),
    (
        "gemini",
        "parts not objects",
        {
            "body": {
                "candidates": [
                    {"content": {"parts": ["Hi"], "role": "model"}, "finishReason": "STOP"}
                ]
            }
        },
    ),
    (
        "gemini",
        "functionCall without a name",
        {
            "body": {
                "candidates": [
                    {
                        "content": {"parts": [{"functionCall": {"args": {}}}], "role": "model"},
                        "finishReason": "STOP",
                    }
                ]
            }
        },
    ),
    ("gemini", "candidate not an object", {"body": {"candidates": ["Hi"]}}),
    (
        "gemini",
        "stream: text a number",
        {
            "sse": sse(
                {
                    "candidates": [
                        {
                            "content": {"parts": [{"text": 5}], "role": "model"},
                            "finishReason": "STOP",
                        }
                    ]
                }
            )
        },
    ),
    (
        "gemini",
        "stream: parts an object",
        {
            "sse": sse(
                {"candidates": [{"content": {"parts": {"text": "x"}}, "finishReason": "STOP"}]}
            )
        },
    ),
]


@pytest.mark.parametrize(
    ("provider", "shape", "reply"), CASES, ids=[f"{p}: {s}" for p, s, _ in CASES]
)
async def test_a_malformed_reply_is_a_transient_model_error(
    srv: ReplayServer, provider: str, shape: str, reply: dict[str, Any]
) -> None:
    srv.add({"source": f"a malformed {provider} reply: {shape}", "status": 200, **reply})
    agent = Agent(make(provider, srv), model_retry=ONE_TRY)
    with pytest.raises(ModelError) as info:
        await ask(agent, streamed="sse" in reply)
    err = info.value
    name = {"responses": "openai"}.get(provider, provider)
    assert err.kind == "transient", str(err)
    assert err.provider == name
    assert str(err).startswith(f"{name}:") and "could not read the reply" in str(err), str(err)


def test_the_catalogue_covers_every_provider_both_ways() -> None:
    for provider in ("openai", "responses", "anthropic", "gemini"):
        kinds = {"sse" in r for p, _, r in CASES if p == provider}
        assert kinds == {True, False}, provider


async def test_an_error_choice_without_a_message_keeps_the_providers_error(
    srv: ReplayServer,
) -> None:
    # OpenRouter ends a failed generation with finish_reason "error": that is the
    # provider's error, not an unreadable reply.
    choice = {
        "index": 0,
        "finish_reason": "error",
        "error": {"code": 502, "message": "Upstream overloaded"},
    }
    srv.add(
        {"source": "OpenRouter's error choice without a message", "body": {"choices": [choice]}}
    )
    with pytest.raises(ModelError) as info:
        await Agent(make("openai", srv), model_retry=ONE_TRY).run("hi")
    assert "Upstream overloaded" in str(info.value)
