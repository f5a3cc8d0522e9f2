"""The agent as a node of a LangGraph user's own app: `StateGraph(MessagesState)` with
`add_node("agent", agent.graph)`, on LangGraph's `InMemorySaver` and
`AsyncPostgresSaver`. The messages the agent hands its parent are LangChain messages
that `add_messages` accepts (tool status `success` / `error`, our own status kept in
`additional_kwargs["criogen"]`), their ids survive the next turn (nothing is duplicated),
and an approval interrupt is resumed at the parent with `Command(resume=...)`."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command

from criogen_graph import Agent, FakeReply, FunctionModel, tool
from tests.conftest import require_postgres


@tool
async def get_order(order_id: str) -> str:
    """Look an order up."""
    return f"order {order_id}: shipped"


@tool
async def refund(order_id: str) -> str:
    """Refund an order in full."""
    return f"refunded {order_id}"


def _script(messages: list[dict[str, Any]], tools: Any) -> Any:
    last = messages[-1]
    if last["role"] == "user":
        text = str(last["content"]).lower()
        if "refund" in text:
            return FakeReply.tool_call("refund", {"order_id": "A-1"})
        return FakeReply.tool_call("get_order", {"order_id": "A-1"})
    return f"Done: {last['content']}."


def _agent() -> Agent[Any]:
    return Agent(FunctionModel(_script), tools=[get_order, refund], approve=["refund"])


def _parent(agent: Agent[Any], saver: BaseCheckpointSaver[Any]) -> Any:
    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent.graph)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    return builder.compile(checkpointer=saver)


@asynccontextmanager
async def _saver(kind: str) -> AsyncIterator[BaseCheckpointSaver[Any]]:
    if kind == "memory":
        yield InMemorySaver()
        return
    require_postgres()
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    from tests.conftest import PG_URL

    async with AsyncPostgresSaver.from_conn_string(PG_URL) as saver:
        await saver.setup()
        yield saver


@pytest.fixture(params=["memory", "postgres"])
def saver_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_the_agent_is_a_node_of_a_messages_state_graph(saver_kind: str) -> None:
    async with _saver(saver_kind) as saver:
        app = _parent(_agent(), saver)
        config: Any = {"configurable": {"thread_id": f"t-{uuid.uuid4().hex}"}}

        # Turn 1: a tool runs inside the agent; its result reaches the parent's state.
        out = await app.ainvoke({"messages": [("user", "Where is A-1?")]}, config, version="v2")
        assert out.interrupts == ()
        msgs = out.value["messages"]
        assert [type(m) for m in msgs] == [HumanMessage, AIMessage, ToolMessage, AIMessage]
        call = msgs[1].tool_calls[0]
        assert (call["name"], call["args"]) == ("get_order", {"order_id": "A-1"})
        result = msgs[2]
        assert result.tool_call_id == call["id"]
        assert (result.name, result.status, result.content) == (
            "get_order",
            "success",
            "order A-1: shipped",
        )
        assert result.additional_kwargs["criogen"]["status"] == "ok"
        assert msgs[3].content == "Done: order A-1: shipped."

        # Turn 2: the gated refund stops the parent with the agent's approval question.
        out = await app.ainvoke({"messages": [("user", "Refund A-1.")]}, config, version="v2")
        (pending,) = out.interrupts
        assert pending.value["type"] == "approval"
        assert [r["tool"] for r in pending.value["requests"]] == ["refund"]
        state = await app.aget_state(config)
        assert state.next == ("agent",)

        # Resumed at the parent: the refund runs, and the first turn is not repeated.
        out = await app.ainvoke(Command(resume="approve"), config, version="v2")
        assert out.interrupts == ()
        msgs = out.value["messages"]
        assert [type(m).__name__ for m in msgs] == [
            "HumanMessage",
            "AIMessage",
            "ToolMessage",
            "AIMessage",
            "HumanMessage",
            "AIMessage",
            "ToolMessage",
            "AIMessage",
        ]
        assert len({m.id for m in msgs}) == len(msgs)
        assert (msgs[6].name, msgs[6].status, msgs[6].content) == (
            "refund",
            "success",
            "refunded A-1",
        )
        assert msgs[6].additional_kwargs["criogen"]["status"] == "ok"
        assert msgs[7].content == "Done: refunded A-1."

        # Turn 3: a rejected refund is an `error` result for LangChain, `rejected` for us.
        await app.ainvoke({"messages": [("user", "Refund A-1 again.")]}, config, version="v2")
        out = await app.ainvoke(
            Command(resume={"type": "reject", "message": "not eligible"}), config, version="v2"
        )
        msgs = out.value["messages"]
        assert len(msgs) == 12
        rejected = msgs[10]
        assert isinstance(rejected, ToolMessage)
        assert rejected.status == "error"
        assert rejected.additional_kwargs["criogen"]["status"] == "rejected"
        assert "not eligible" in str(rejected.content)


async def test_messages_from_the_parent_keep_their_ids_and_our_data() -> None:
    """A parent's LangChain messages go in with their ids, and ours come back with our
    own statuses, so a second turn replaces (not duplicates) what the first returned."""
    agent = _agent()
    app = _parent(agent, InMemorySaver())
    config: Any = {"configurable": {"thread_id": f"t-{uuid.uuid4().hex}"}}
    human = HumanMessage("Where is A-1?", id="h-1")
    first = (await app.ainvoke({"messages": [human]}, config))["messages"]
    assert first[0].id == "h-1"
    second = (await app.ainvoke({"messages": [HumanMessage("And now?", id="h-2")]}, config))[
        "messages"
    ]
    assert [m.id for m in second[:4]] == [m.id for m in first]
    assert second[4].id == "h-2"
    assert len(second) == 8

    # Read back through the agent, our message dicts are whole again.
    from criogen_graph.graph.state import as_langchain_message, normalize_message

    plain = normalize_message(first[2])
    assert plain["role"] == "tool"
    assert plain.get("status") == "ok"
    assert plain.get("name") == "get_order"
    again = as_langchain_message(plain)
    assert again.id == first[2].id
    assert again.additional_kwargs == first[2].additional_kwargs


async def test_an_agent_run_directly_keeps_plain_message_dicts() -> None:
    """Only a parent graph gets LangChain messages: `agent.graph.ainvoke` at the top
    level still returns the transcript as plain dicts."""
    agent = _agent()
    out = await agent.graph.ainvoke({"messages": [{"role": "user", "content": "Where is A-1?"}]})
    assert [m["role"] for m in out["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert out["messages"][2]["status"] == "ok"
