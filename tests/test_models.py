"""The test doubles and LangChain chat models as `model` (over real loopback HTTP)."""

from __future__ import annotations

from typing import Any

import pytest

from criogen_graph import Agent, FakeModel, FakeReply, FunctionModel, ModelError, Retry, tool
from tests.servers import openai_server as oa


@tool
async def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def test_fake_reply_builders() -> None:
    r = FakeReply.tool_calls(
        ("a", {"x": 1}), {"name": "b", "args": {}, "id": "c9"}, text="thinking"
    )
    assert r.content == "thinking"
    assert r.calls == [{"name": "a", "args": {"x": 1}}, {"name": "b", "args": {}, "id": "c9"}]
    with pytest.raises(ValueError, match="unknown error kind"):
        FakeReply.error("explode")
    with pytest.raises(ValueError, match="unknown usage keys"):
        FakeReply.text("x", usage={"tokens": 3})
    with pytest.raises(TypeError, match="list of replies"):
        FakeModel("hello")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="join to its text"):
        FakeReply.text("hello", chunks=["he", "y"])


async def test_fake_model_estimates_usage_and_records_requests() -> None:
    model = FakeModel(["four score and seven"])
    result = await Agent(model, instructions="x" * 40).run("y" * 40)
    assert result.usage["input_tokens"] == 20  # 80 characters / 4
    assert result.usage["output_tokens"] == 5
    assert model.calls[0].messages[0]["role"] == "system"


async def test_several_calls_in_one_fake_reply_run_in_one_step() -> None:
    model = FakeModel(
        [FakeReply.tool_calls(("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})), "3 and 7"]
    )
    result = await Agent(model, tools=[add]).run("add")
    assert [m["content"] for m in result.messages if m["role"] == "tool"] == ["3", "7"]
    assert result.model_calls == 2


async def test_function_model_gets_transcript_and_tools() -> None:
    got: dict[str, Any] = {}

    def fn(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        got.setdefault("calls", []).append((messages, tools))
        if messages[-1]["role"] == "tool":
            return f"sum is {messages[-1]['content']}"
        return FakeReply.tool_call("add", {"a": 2, "b": 3})

    result = await Agent(FunctionModel(fn), tools=[add]).run("2+3")
    assert result.text == "sum is 5"
    assert got["calls"][0][1] == [add.spec()]
    assert got["calls"][1][0][-1]["role"] == "tool"


async def test_function_model_errors_propagate() -> None:
    def fn(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        raise ModelError("upstream said no", kind="auth")

    with pytest.raises(ModelError) as info:
        await Agent(FunctionModel(fn)).run("x")
    assert info.value.kind == "auth" and info.value.provider == "function"


# -- LangChain chat models -----------------------------------------------------------


def chat_openai(server: oa.OpenAIServer, **kw: Any) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        base_url=server.base_url, api_key="test-key", model="gpt-test", max_retries=0, **kw
    )


async def test_langchain_chat_model_with_tools(openai_server: oa.OpenAIServer) -> None:
    openai_server.add(
        oa.tool_calls(("add", {"a": 2, "b": 3}), ("add", {"a": 1, "b": 1})),
        oa.text(
            "2 + 3 = 5", usage={"prompt_tokens": 30, "completion_tokens": 4, "cached_tokens": 8}
        ),
    )
    agent = Agent(chat_openai(openai_server), instructions="Use tools.", tools=[add])
    result = await agent.run("What is 2 + 3?")
    assert result.text == "2 + 3 = 5"
    assert [m["content"] for m in result.messages if m["role"] == "tool"] == ["5", "2"]
    assert result.answered_by == {"provider": "openai", "model": "gpt-test"}
    assert result.usage["input_tokens"] == 41 and result.usage["output_tokens"] == 11
    assert result.usage["cache_read_tokens"] == 8
    first, second = openai_server.requests
    assert first["messages"][0] == {"role": "system", "content": "Use tools."}
    assert first["tools"][0]["function"]["name"] == "add"
    tool_msgs = [m for m in second["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_msgs] == ["5", "2"]
    assert tool_msgs[0]["tool_call_id"] == second["messages"][2]["tool_calls"][0]["id"]


async def test_langchain_errors_are_classified_and_retried(openai_server: oa.OpenAIServer) -> None:
    openai_server.add(oa.error(500, "overloaded"), oa.error(429, "slow down"), oa.text("finally"))
    agent = Agent(
        chat_openai(openai_server), model_retry=Retry(initial_backoff_secs=0, jitter=False)
    )
    result = await agent.run("hi")
    assert result.text == "finally" and len(openai_server.requests) == 3

    openai_server.add(oa.error(401, "bad key"))
    with pytest.raises(ModelError) as info:
        await agent.run("hi")
    assert info.value.kind == "auth" and info.value.status == 401


async def test_langchain_model_as_fallback(openai_server: oa.OpenAIServer) -> None:
    openai_server.add(oa.text("from langchain"))
    agent = Agent(
        FakeModel([FakeReply.error("transient")] * 3),
        fallbacks=[chat_openai(openai_server)],
        model_retry=Retry(initial_backoff_secs=0),
    )
    result = await agent.run("hi")
    assert result.text == "from langchain" and result.answered_by["provider"] == "openai"


async def test_langchain_typed_output(openai_server: oa.OpenAIServer) -> None:
    openai_server.add(oa.text('{"answer": 5}'))
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
    }
    result = await Agent(chat_openai(openai_server), output=schema).run("2+3")
    assert result.output == {"answer": 5}
    system = openai_server.requests[0]["messages"][0]
    assert system["role"] == "system" and '"answer"' in system["content"]


async def test_langchain_chat_model_streams_text_and_tool_calls(
    openai_server: oa.OpenAIServer,
) -> None:
    from criogen_graph import TextEvent, ToolCallStartedEvent

    openai_server.add(
        oa.tool_calls(("add", {"a": 20, "b": 22})),
        oa.text("The sum is forty-two, as the tool said."),
    )
    thread = Agent(chat_openai(openai_server), tools=[add]).thread("lc-stream")
    stream = thread.stream("add 20 and 22")
    events = [e async for e in stream]
    reply = await stream.reply()
    texts = [e.text for e in events if isinstance(e, TextEvent)]
    assert (
        len(texts) > 1 and "".join(texts) == reply.text == "The sum is forty-two, as the tool said."
    )
    started = [e for e in events if isinstance(e, ToolCallStartedEvent)]
    assert [(e.tool, e.args) for e in started] == [("add", {"a": 20, "b": 22})]
    assert all(body.get("stream") is True for body in openai_server.requests)
