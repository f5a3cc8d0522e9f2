"""LangChain chat models when LangGraph itself drives the agent's graph
(`agent.graph.ainvoke` / `astream`, a parent graph, LangGraph's server): the model streams
only when someone listens (so `ChatOpenAI` reports its usage, and LangChain's
`GenericFakeChatModel` with tool calls works), callback handlers see one chat-model run
per model call, and the run has its `invoke_agent` span."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from criogen_graph import Agent, Telemetry, tool
from tests.servers import openai_server as oa


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


class ToolCallingFake(GenericFakeChatModel):
    """LangChain's own scripted chat model, taking tools as a real one does."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def _fake(*replies: AIMessage) -> ToolCallingFake:
    messages: Iterator[AIMessage] = iter(replies)
    return ToolCallingFake(messages=messages)


def _two_turns() -> ToolCallingFake:
    return _fake(
        AIMessage(
            "",
            tool_calls=[{"id": "c1", "name": "add", "args": {"a": 2, "b": 3}}],
            usage_metadata={"input_tokens": 20, "output_tokens": 5, "total_tokens": 25},
        ),
        AIMessage(
            "2 + 3 = 5",
            usage_metadata={"input_tokens": 30, "output_tokens": 4, "total_tokens": 34},
        ),
    )


def _start(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def chat_openai(server: oa.OpenAIServer) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(base_url=server.base_url, api_key="test-key", model="gpt-test", max_retries=0)


async def test_chat_openai_reports_its_usage_when_langgraph_drives_the_graph(
    openai_server: oa.OpenAIServer,
) -> None:
    openai_server.add(
        oa.tool_calls(
            ("add", {"a": 2, "b": 3}), usage={"prompt_tokens": 24, "completion_tokens": 14}
        ),
        oa.text("2 + 3 = 5", usage={"prompt_tokens": 30, "completion_tokens": 4}),
    )
    agent = Agent(chat_openai(openai_server), tools=[add])
    out = await agent.graph.ainvoke(_start("What is 2 + 3?"))
    assert out["messages"][-1]["content"] == "2 + 3 = 5"
    usage = out["run"]["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == (54, 18)
    # Nobody listened to its text: it was not asked to stream.
    assert not any(r.get("stream") for r in openai_server.requests)


async def test_generic_fake_chat_model_with_tool_calls_runs_in_a_langgraph_run() -> None:
    agent = Agent(_two_turns(), tools=[add])
    out = await agent.graph.ainvoke(_start("What is 2 + 3?"))
    assert [m["role"] for m in out["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert out["messages"][2]["content"] == "5"
    assert out["messages"][-1]["content"] == "2 + 3 = 5"
    assert out["run"]["usage"]["input_tokens"] == 50


async def test_someone_listening_still_gets_the_text_as_it_is_written() -> None:
    # LangGraph's `messages` stream mode: the model streams, its chunks come once each.
    agent = Agent(_fake(AIMessage("shipped on monday")))
    chunks = [
        m
        async for m, _meta in agent.graph.astream(_start("where?"), stream_mode="messages")
        if isinstance(m, AIMessageChunk)
    ]
    assert "".join(str(c.content) for c in chunks) == "shipped on monday"
    assert len(chunks) > 1
    # Our events in the `custom` mode: the text as it is written.
    agent = Agent(_fake(AIMessage("shipped on monday")))
    texts = [
        p["text"]
        async for p in agent.graph.astream(_start("where?"), stream_mode="custom")
        if p["type"] == "text"
    ]
    assert "".join(texts) == "shipped on monday" and len(texts) > 1


class ChatRuns(BaseCallbackHandler):
    def __init__(self) -> None:
        self.started: list[UUID] = []
        self.ended: list[UUID] = []

    def on_chat_model_start(
        self, serialized: Any, messages: Any, *, run_id: UUID, **kw: Any
    ) -> None:
        self.started.append(run_id)

    def on_llm_end(self, response: Any, *, run_id: UUID, **kw: Any) -> None:
        self.ended.append(run_id)


async def test_a_handler_sees_one_chat_model_run_per_model_call() -> None:
    handler = ChatRuns()
    agent = Agent(_two_turns(), tools=[add])
    await agent.graph.ainvoke(_start("What is 2 + 3?"), {"callbacks": [handler]})
    assert len(handler.started) == 2 and len(set(handler.started)) == 2
    assert sorted(handler.ended) == sorted(handler.started)

    # Streamed (someone listens), still one run per call. (LangChain's fake model drops
    # tool calls when it streams, so this one only answers.)
    handler = ChatRuns()
    agent = Agent(_fake(AIMessage("shipped on monday")))
    async for _ in agent.graph.astream(
        _start("where?"), {"callbacks": [handler]}, stream_mode="messages"
    ):
        pass
    assert len(handler.started) == 1

    # Through our API too, called from a LangChain runnable with the handler.
    from langchain_core.runnables import RunnableLambda

    handler = ChatRuns()
    agent = Agent(_two_turns(), tools=[add])

    async def ask(text: str) -> str:
        return str((await agent.run(text)).text)

    answer = await RunnableLambda(ask).ainvoke("What is 2 + 3?", {"callbacks": [handler]})
    assert answer == "2 + 3 = 5"
    assert len(handler.started) == 2


def _named(spans: Sequence[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


async def test_a_langgraph_driven_run_has_its_invoke_agent_span() -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    agent = Agent(_two_turns(), tools=[add], name="calc", telemetry=Telemetry(provider))
    config: Any = {"configurable": {"thread_id": "t-span"}}
    await agent.graph.ainvoke(_start("What is 2 + 3?"), config)
    spans = memory.get_finished_spans()
    (run,) = _named(spans, "invoke_agent calc")
    attrs = dict(run.attributes or {})
    assert attrs["gen_ai.operation.name"] == "invoke_agent"
    assert attrs["gen_ai.conversation.id"] == "t-span"
    assert attrs["criogen.outcome"] == "completed"
    assert attrs["criogen.stop_reason"] == "final_answer"
    assert attrs["gen_ai.usage.input_tokens"] == 50
    assert attrs["criogen.run_id"]
    chats = _named(spans, "chat")
    assert len(chats) == 2
    assert run.context is not None
    assert all(c.parent is not None and c.parent.span_id == run.context.span_id for c in chats)


async def test_a_context_handler_sees_one_chat_model_run_per_model_call() -> None:
    """Handlers LangChain adds from context (`register_configure_hook`, as
    `get_openai_callback()` and `collect_runs()` do) and `tracing_v2_enabled()` see the
    model node's run only, not the chat model's own too."""
    from contextvars import ContextVar

    from langchain_core.tracers.context import register_configure_hook

    var: ContextVar[ChatRuns | None] = ContextVar("criogen_test_context_handler", default=None)
    register_configure_hook(var, True)
    handler = ChatRuns()
    token = var.set(handler)
    try:
        await Agent(_two_turns(), tools=[add]).graph.ainvoke(_start("What is 2 + 3?"))
        assert len(handler.started) == 2
        handler.started.clear()
        await Agent(_two_turns(), tools=[add]).run("What is 2 + 3?")
        assert len(handler.started) == 2
    finally:
        var.reset(token)
