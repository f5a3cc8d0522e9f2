"""The pieces of code several places now share (issue 19) keep each place's behaviour: the
errors and messages every caller gave before, the defaults, the merged provider turns."""

from __future__ import annotations

from typing import Any

import pytest

from criogen_graph import Agent, FakeModel, Limits, Memory, Retry, ValidationError, tool
from criogen_graph.messages import Message
from criogen_graph.models.anthropic import anthropic, to_anthropic_messages
from criogen_graph.models.gemini import gemini, to_gemini_contents
from criogen_graph.models.openai import OpenAIModel, azure, openai
from criogen_graph.models.openai_responses import openai_responses
from criogen_graph.tools import Tool, ToolSource


def _echo(name: str) -> Tool:
    return tool(name=name, description="Echo.", run=lambda args: args)


class _Source(ToolSource):
    name = "shop-server"

    def __init__(self, *tools: Tool) -> None:
        self.tools = list(tools)

    async def load_tools(self) -> list[Tool]:
        return self.tools


def test_a_tool_named_like_a_memory_tool_is_refused_with_the_fix() -> None:
    with pytest.raises(ValidationError, match=r"'remember', like a memory tool.*tools=False"):
        Agent(FakeModel(["hi"]), tools=[_echo("remember")], memory=Memory.shared())


async def test_a_source_tool_named_like_another_tool_is_refused_naming_the_source() -> None:
    agent = Agent(FakeModel(["hi"]), tools=[_echo("lookup"), _Source(_echo("lookup"))])
    with pytest.raises(ValidationError, match=r"shop-server has a tool named 'lookup'") as exc:
        await agent.run("hi")
    assert exc.value.code == "invalid_value"


async def test_source_tools_join_the_agents_when_names_differ() -> None:
    agent = Agent(FakeModel(["hi"]), tools=[_echo("lookup"), _Source(_echo("order"))])
    await agent.run("hi")
    assert sorted(agent.spec.tools) == ["lookup", "order"]


@pytest.mark.parametrize(
    ("option", "value", "error", "message"),
    [
        ("limits", {"model_call": 3}, ValidationError, r"unknown limits key\(s\) \['model_call'\]"),
        ("limits", [1], TypeError, "limits must be a Limits or a dict, got list"),
        ("model_retry", {"tries": 2}, ValidationError, r"unknown model_retry key\(s\)"),
        ("tool_retry", 3, TypeError, "tool_retry must be a Retry or a dict, got int"),
    ],
)
def test_option_records_name_the_option_that_is_wrong(
    option: str, value: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        Agent(FakeModel([]), **{option: value})


def test_option_records_from_dicts_and_defaults() -> None:
    assert Limits.coerce(None) == Limits()
    assert Limits.coerce({"model_calls": 3}).model_calls == 3
    given = Retry(max_attempts=5)
    assert Retry.coerce(given, name="model_retry") is given
    assert Retry.coerce({"jitter": False}, name="tool_retry") == Retry(jitter=False)


_TRANSCRIPT: list[Message] = [
    {"role": "system", "content": "Be brief."},
    {"role": "assistant", "content": "Hello.", "tool_calls": [{"id": "c1", "name": "f"}]},
    {"role": "tool", "content": "done", "tool_call_id": "c1", "name": "f", "status": "ok"},
    {"role": "user", "content": "thanks"},
]


def test_anthropic_turns_alternate_and_start_with_a_user_turn() -> None:
    system, turns = to_anthropic_messages(_TRANSCRIPT)
    assert system == "Be brief."
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    # The tool result and the user's message merge into one user turn.
    assert [b["type"] for b in turns[2]["content"]] == ["tool_result", "text"]
    assert turns[0]["content"][0]["type"] == "text"


def test_gemini_contents_alternate_and_start_with_a_user_turn() -> None:
    system, contents = to_gemini_contents(_TRANSCRIPT)
    assert system == ["Be brief."]
    assert [c["role"] for c in contents] == ["user", "model", "user"]
    assert [next(iter(p)) for p in contents[2]["parts"]] == ["functionResponse", "text"]
    assert to_gemini_contents([])[1] == [{"role": "user", "parts": contents[0]["parts"]}]


def test_http_options_defaults_and_extra_body_reach_every_provider(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "GEMINI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant")
    monkeypatch.setenv("GEMINI_API_KEY", "g-key")
    models = [
        openai("m", api_key="k", extra_body={"temperature": 0}),
        openai("m", api_key="k", api="responses", extra_body={"temperature": 0}),
        anthropic("m", extra_body={"temperature": 0}),
        gemini("m", extra_body={"temperature": 0}),
        azure("d", endpoint="https://x.example", api_key="k", extra_body={"temperature": 0}),
    ]
    for m in models:
        assert (m.timeout.read, m.timeout.connect) == (60, 10)
        assert m._extra == {"temperature": 0}
    assert models[2].headers["x-api-key"] == "sk-ant"
    assert models[3].headers["x-goog-api-key"] == "g-key"
    assert models[4].headers["api-key"] == "k"
    fast = anthropic("m", timeout_secs=5, connect_timeout_secs=1, headers={"x-api-key": "own"})
    assert (fast.timeout.read, fast.timeout.connect) == (5, 1)
    assert fast.headers["x-api-key"] == "own"  # the caller's headers come last


def test_a_key_is_required_only_at_the_providers_own_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ValidationError, match="openai-responses:m needs an API key: set OPENAI"):
        openai_responses("m")
    local = openai("m", base_url="http://localhost:11434/v1", organization="org-1")
    assert isinstance(local, OpenAIModel)
    assert local.base_url == "http://localhost:11434/v1"
    assert "authorization" not in local.headers
    assert local.headers["openai-organization"] == "org-1"
    monkeypatch.setenv("OPENAI_BASE_URL", "http://proxy.example/v1")
    assert openai_responses("m").base_url == "http://proxy.example/v1"
