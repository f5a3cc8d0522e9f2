"""What a middleware returns is checked in one place before anything is saved: a model
middleware's reply must be a `ModelResponse` holding an assistant message, a tool
middleware's result must be a value (not an un-awaited coroutine). Anything else is a
`MiddlewareError` naming the middleware, what it returned and what was expected, and the
thread stays usable."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import (
    Agent,
    CriogenError,
    FakeModel,
    FakeReply,
    FunctionModel,
    ModelResponse,
    Storage,
    tool,
)
from criogen_graph.middleware import (
    Middleware,
    MiddlewareError,
    ModelCall,
    ModelHandler,
    ToolCallRequest,
    ToolHandler,
    model_middleware,
    tool_middleware,
)


def _bad_message(message: Any) -> Any:
    async def fn(call: ModelCall, handler: ModelHandler) -> ModelResponse:
        response = await handler(call)
        response.message = message
        return response

    fn.__name__ = "rewrite"
    return fn


async def _returns_str(call: ModelCall, handler: ModelHandler) -> Any:
    await handler(call)
    return "just text"


async def _returns_none(call: ModelCall, handler: ModelHandler) -> Any:
    await handler(call)


async def _forgot_await(call: ModelCall, handler: ModelHandler) -> Any:
    return handler(call)


CASES = {
    "no role": (_bad_message({"content": "hello"}), "role"),
    "user role": (_bad_message({"role": "user", "content": "hi"}), "assistant"),
    "content a number": (_bad_message({"role": "assistant", "content": 42}), "content"),
    "calls not a list": (
        _bad_message({"role": "assistant", "content": "", "tool_calls": "echo"}),
        "tool_calls",
    ),
    "call without a name": (
        _bad_message({"role": "assistant", "content": "", "tool_calls": [{"args": {}}]}),
        "name",
    ),
    "message a str": (_bad_message("hello"), "message"),
    "a str": (_returns_str, "str"),
    "None": (_returns_none, "None"),
    "a coroutine": (_forgot_await, "await"),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_malformed_model_reply_is_refused_before_saving(case: str, tmp_path: Path) -> None:
    fn, named = CASES[case]
    broken = [True]

    @model_middleware
    async def gate(call: ModelCall, handler: ModelHandler) -> ModelResponse:
        if broken[0]:
            result: ModelResponse = await fn(call, handler)
            return result
        return await handler(call)

    storage = Storage(f"sqlite:///{tmp_path / 'mw.db'}")
    agent = Agent(FunctionModel(lambda m, t: "fine"), middleware=[gate], storage=storage)
    thread = agent.thread("t")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # no "never awaited"
            with pytest.raises(MiddlewareError) as info:
                await thread.send("hello")
        err = info.value
        assert isinstance(err, CriogenError) and err.code == "middleware_failed"
        assert err.middleware == "gate" and err.method == "wrap_model_call"
        assert "gate" in str(err) and named in str(err)
        assert "ModelResponse" in str(err) or "assistant" in str(err)
        # Nothing malformed was saved: the thread reads, and goes on.
        assert [m["content"] for m in await thread.messages()] == ["hello"]
        assert await thread.pending_approvals() == []
        broken[0] = False
        reply = await thread.retry()
        assert reply.text == "fine"
        assert [m["content"] for m in await thread.messages()] == ["hello", "fine"]
    finally:
        await storage.close()


async def test_text_blocks_from_a_middleware_become_the_reply_text() -> None:
    @model_middleware
    async def blocks(call: ModelCall, handler: ModelHandler) -> ModelResponse:
        response = await handler(call)
        text = response.message["content"]
        return ModelResponse({"role": "assistant", "content": [{"type": "text", "text": text}]})

    result = await Agent(FakeModel(["hi there"]), middleware=[blocks]).run("hello")
    assert result.text == "hi there"
    assert result.messages[-1]["content"] == "hi there"


async def test_a_synchronous_wrap_model_call_is_named() -> None:
    class Sync(Middleware):
        def wrap_model_call(self, call: ModelCall, handler: ModelHandler) -> Any:  # type: ignore[override]
            return ModelResponse({"role": "assistant", "content": "x"})

    with pytest.raises(MiddlewareError, match=r"Sync.*async def"):
        await Agent(FakeModel(["x"]), middleware=[Sync()]).run("hello")


async def test_an_unawaited_tool_handler_is_an_error_not_a_saved_coroutine() -> None:
    ran: list[int] = []

    @tool
    async def pay(amount: int) -> str:
        """Pay."""
        ran.append(amount)
        return "paid"

    @tool_middleware
    async def forgot(call: ToolCallRequest, handler: ToolHandler) -> Any:
        return handler(call)

    agent = Agent(
        FakeModel([FakeReply.tool_call("pay", {"amount": 5}), "done"]),
        tools=[pay],
        middleware=[forgot],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        result = await agent.run("go")
    (msg,) = [m for m in result.messages if m["role"] == "tool"]
    assert msg["status"] == "error"
    assert "coroutine object" not in msg["content"]
    assert "forgot" in msg["content"] and "await" in msg["content"]
    assert ran == []
