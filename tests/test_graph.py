"""agent.graph is a real LangGraph graph: its nodes, drawing, stepping with a
checkpointer, one task per tool call, the approval interrupt, raw inputs from Studio."""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_config
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command

from criogen_graph import Agent, FakeModel, FakeReply, FunctionModel, HookContext, ToolCall, tool


@tool
async def echo(text: str) -> str:
    """Echo."""
    return text


@tool
async def refund(order_id: str) -> str:
    """Refund."""
    return f"refunded {order_id}"


def test_graph_shape_and_drawing() -> None:
    agent = Agent(FakeModel([]), tools=[echo])
    graph = agent.graph
    assert isinstance(graph, CompiledStateGraph)
    assert graph.checkpointer is None
    drawn = graph.get_graph()
    assert set(drawn.nodes) == {"__start__", "model", "approval", "tools", "__end__"}
    edges = {(e.source, e.target) for e in drawn.edges}
    assert {
        ("__start__", "model"),
        ("model", "tools"),
        ("model", "approval"),
        ("approval", "tools"),
        ("tools", "model"),
        ("model", "__end__"),
    } <= edges
    mermaid = graph.get_graph().draw_mermaid()
    for node in ("model", "approval", "tools"):
        assert f"{node}({node})" in mermaid
    assert agent.graph is graph  # compiled once


async def test_step_by_step_with_a_checkpointer_one_task_per_call() -> None:
    agent = Agent(
        FakeModel([FakeReply.tool_calls(("echo", {"text": "a"}), ("echo", {"text": "b"})), "done"]),
        tools=[echo],
    )
    graph = agent.graph.builder.compile(checkpointer=InMemorySaver())
    cfg: dict[str, Any] = {"configurable": {"thread_id": "step"}}
    await graph.ainvoke(
        {"messages": [{"role": "user", "content": "go"}]}, cfg, interrupt_before=["tools"]
    )
    snap = await graph.aget_state(cfg)
    assert snap.next == ("tools", "tools")  # one task per tool call
    assert snap.values["messages"][-1]["tool_calls"][1]["args"] == {"text": "b"}
    out = await graph.ainvoke(None, cfg)
    assert out["messages"][-1]["content"] == "done"
    assert [m["content"] for m in out["messages"] if m["role"] == "tool"] == ["a", "b"]
    history = [s async for s in graph.aget_state_history(cfg)]
    assert [s.next for s in history][:3] == [(), ("model",), ("tools", "tools")]


async def test_approval_is_a_langgraph_interrupt_answered_with_plain_json() -> None:
    model = FakeModel(
        [FakeReply.tool_calls(("refund", {"order_id": "A-1"}), ("echo", {"text": "x"})), "refunded"]
    )
    agent = Agent(model, tools=[refund, echo], approve=["refund"])
    graph = agent.graph.builder.compile(checkpointer=InMemorySaver())
    cfg: dict[str, Any] = {"configurable": {"thread_id": "appr"}}
    out = await graph.ainvoke(
        {"messages": [{"role": "user", "content": "refund A-1"}]}, cfg, version="v2"
    )
    (intr,) = out.interrupts
    assert intr.value["type"] == "approval"
    (req,) = intr.value["requests"]
    assert req["tool"] == "refund" and req["args"] == {"order_id": "A-1"}
    snap = await graph.aget_state(cfg)
    assert snap.next == ("approval",)

    # An answer that does not fit asks again, saying why; nothing ran.
    out = await graph.ainvoke(Command(resume={"nope": {"type": "approve"}}), cfg, version="v2")
    (again,) = out.interrupts
    assert "no pending call has id 'nope'" in again.value["error"]
    assert all(m["role"] != "tool" for m in out.value["messages"])

    out = await graph.ainvoke(
        Command(resume={req["call_id"]: {"type": "approve"}}), cfg, version="v2"
    )
    assert out.interrupts == ()
    tools = [m for m in out.value["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tools] == ["refunded A-1", "x"]
    assert out.value["messages"][-1]["content"] == "refunded"


async def test_a_new_message_instead_of_an_approval_answers_the_pending_calls() -> None:
    """Driven by LangGraph itself (Studio), a thread waiting for approval can be given a
    new message instead of an answer: LangGraph drops the pending approval, and the
    calls it held get a "Not run" result, so the transcript stays one any provider takes
    (every call answered before the next user message) and the thread goes on."""
    seen: list[list[dict[str, Any]]] = []

    def script(messages: list[dict[str, Any]], tools: Any) -> Any:
        seen.append(messages)
        if len(seen) == 1:
            return FakeReply.tool_calls(("refund", {"order_id": "A-1"}), ("echo", {"text": "x"}))
        return "What else can I do?"

    agent = Agent(FunctionModel(script), tools=[refund, echo], approve=["refund"])
    graph = agent.graph.builder.compile(checkpointer=InMemorySaver())
    cfg: dict[str, Any] = {"configurable": {"thread_id": "moved-on"}}
    out = await graph.ainvoke(
        {"messages": [{"role": "user", "content": "refund A-1"}]}, cfg, version="v2"
    )
    assert out.interrupts
    out = await graph.ainvoke(
        {"messages": [{"role": "user", "content": "actually, never mind"}]}, cfg, version="v2"
    )
    assert out.interrupts == ()
    roles = [(m["role"], m.get("status")) for m in out.value["messages"]]
    assert roles == [
        ("user", None),
        ("assistant", None),
        ("tool", "skipped"),
        ("tool", "skipped"),
        ("user", None),
        ("assistant", None),
    ]
    assert all(m["content"].startswith("Not run") for m in out.value["messages"][2:4])
    # What the model was given: each call answered before the next user message.
    asked = seen[-1]
    calls = {c["id"] for c in asked[1]["tool_calls"]}
    assert {m["tool_call_id"] for m in asked[2:4]} == calls
    assert asked[4]["content"] == "actually, never mind"


async def test_raw_inputs_work_like_studio_sends_them() -> None:
    agent = Agent(FakeModel(["hello", "again", "and again"]))
    out = await agent.graph.ainvoke({"messages": [{"role": "user", "content": "hi"}]})
    assert out["messages"][-1]["content"] == "hello"
    assert out["run"]["stop_reason"] == "final_answer" and out["run"]["model_calls"] == 1
    # LangChain-style messages (Studio's chat) become plain dicts; an id they come with
    # is kept (Studio's chat, a parent graph's `add_messages`, match on it)
    out = await agent.graph.ainvoke({"messages": [{"type": "human", "content": "hey"}]})
    assert out["messages"][0] == {"role": "user", "content": "hey"}
    out = await agent.graph.ainvoke({"messages": [{"type": "human", "content": "yo", "id": "h1"}]})
    assert out["messages"][0] == {"role": "user", "content": "yo", "id": "h1"}


async def test_hooks_run_inside_the_nodes() -> None:
    nodes: list[tuple[str, str]] = []

    class Where:
        name = "where"

        def before_model(self, ctx: HookContext) -> None:
            nodes.append(("before_model", get_config()["metadata"]["langgraph_node"]))

        def before_tool(self, call: ToolCall) -> None:
            nodes.append(("before_tool", get_config()["metadata"]["langgraph_node"]))

    await Agent(
        FakeModel([FakeReply.tool_call("echo", {"text": "x"}), "ok"]), tools=[echo], hooks=[Where()]
    ).run("go")
    assert nodes == [("before_model", "model"), ("before_tool", "tools"), ("before_model", "model")]
