"""The graph is the whole agent: driven by LangGraph itself (a parent graph, `astream`
left early, a cancelled invocation, a retry whose first step is several tool calls), a
run segment still runs `on_start` / `on_end` exactly once with the right outcome,
redacts its new input before LangGraph keeps it, and keeps its audit records in the
run's store. (The behaviour suite in tests/behaviour runs the same agent three ways.)"""

from __future__ import annotations

import asyncio
from typing import Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.store.memory import InMemoryStore
from langgraph.types import Command

from criogen_graph import (
    Agent,
    AgentGraph,
    FakeReply,
    FunctionModel,
    Hook,
    HookAction,
    HookContext,
    Redactor,
    read_audit,
    tool,
)


class Recorder(Hook):
    """Notes every on_start / on_end, and counts segments in its hook state."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []

    def on_start(self, ctx: HookContext) -> HookAction:
        n = (ctx.hook_state or {}).get("segments", 0) + 1
        self.log.append(("start", n))
        return HookAction(state={"segments": n})

    def on_end(self, ctx: HookContext, outcome: str) -> None:
        self.log.append(("end", outcome))


runs: list[str] = []


@tool
async def slow(n: int) -> str:
    """Sleeps a moment."""
    runs.append(f"slow {n}")
    await asyncio.sleep(0.01)
    return f"slow {n} done"


@tool
def charge(card: str) -> str:
    """Charge a card."""
    runs.append(f"charge {card}")
    return "charged"


def _cfg(tid: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": tid}}


def test_agent_graph_is_what_compiling_gives() -> None:
    agent = Agent(FunctionModel(lambda m, t: "hi"))
    assert isinstance(agent.graph, AgentGraph)
    assert isinstance(agent.graph.builder.compile(checkpointer=InMemorySaver()), AgentGraph)
    assert isinstance(agent.graph.with_config(recursion_limit=5), AgentGraph)


async def test_as_a_subgraph_of_a_users_graph_hooks_run_and_the_interrupt_goes_up() -> None:
    rec = Recorder()

    def script(messages: list[dict[str, Any]], tools: Any) -> Any:
        if messages[-1]["role"] == "user":
            return FakeReply.tool_call("charge", {"card": "x"})
        return "charged it"

    agent = Agent(FunctionModel(script), tools=[charge], approve=["charge"], hooks=[rec])

    class Outer(TypedDict, total=False):
        messages: Any
        run: Any
        state: Any

    outer = StateGraph(Outer)
    outer.add_node("agent", agent.graph)
    outer.add_edge(START, "agent")
    parent = outer.compile(checkpointer=InMemorySaver())
    cfg = _cfg("outer-1")
    out = await parent.ainvoke({"messages": [{"role": "user", "content": "charge it"}]}, cfg)
    assert out["__interrupt__"][0].value["type"] == "approval"
    assert rec.log == [("start", 1), ("end", "suspended")]
    runs.clear()
    await parent.ainvoke(Command(resume="approve"), cfg)
    assert runs == ["charge x"]
    assert rec.log[2:] == [("start", 2), ("end", "completed")]


async def test_leaving_astream_early_or_cancelling_ends_the_segment_once_as_failed() -> None:
    rec = Recorder()
    gate, calling = asyncio.Event(), asyncio.Event()

    async def script(messages: list[dict[str, Any]], tools: Any) -> Any:
        calling.set()
        await gate.wait()
        return "late"

    agent = Agent(FunctionModel(script), hooks=[rec])
    graph = agent.graph.builder.compile(checkpointer=InMemorySaver())

    # Cancelled while the model is being called (a server's run cancelled).
    task = asyncio.ensure_future(
        graph.ainvoke({"messages": [{"role": "user", "content": "hi"}]}, _cfg("c-1"))
    )
    await asyncio.wait_for(calling.wait(), 30)
    assert rec.log == [("start", 1)]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert rec.log == [("start", 1), ("end", "failed")]

    # A consumer that stops reading after the first chunk.
    gate.set()
    rec.log.clear()
    stream = graph.astream(
        {"messages": [{"role": "user", "content": "again"}]},
        _cfg("c-2"),
        stream_mode="custom",
    )
    agen: Any = stream
    async for _ in agen:
        break
    await agen.aclose()
    # The first chunk is the model step's start: the run is cut before its answer.
    assert rec.log == [("start", 1), ("end", "failed")]


async def test_a_retry_starting_with_several_tool_calls_runs_on_start_once() -> None:
    rec = Recorder()
    fail = {"on": True}

    def script(messages: list[dict[str, Any]], tools: Any) -> Any:
        if messages[-1]["role"] == "user":
            return FakeReply.tool_calls(("slow", {"n": 1}), ("slow", {"n": 2}))
        return "both done"

    class FailFirst(Hook):
        def before_tool(self, call: Any) -> Any:
            if fail["on"]:
                raise RuntimeError("tool host down")
            return None

    agent = Agent(
        FunctionModel(script),
        tools=[slow],
        hooks=[rec, FailFirst()],
        on_tool_exception="fail",
    )
    graph = agent.graph.builder.compile(checkpointer=InMemorySaver())
    cfg = _cfg("retry-1")
    with pytest.raises(Exception, match="tool host down"):
        await graph.ainvoke({"messages": [{"role": "user", "content": "go"}]}, cfg)
    assert rec.log == [("start", 1), ("end", "failed")]
    fail["on"] = False
    runs.clear()
    out = await graph.ainvoke(None, cfg)
    assert sorted(runs) == ["slow 1", "slow 2"]
    assert rec.log[2:] == [("start", 2), ("end", "completed")]
    # What on_start saved in a tool call's step is written by the model step after it.
    assert out["run"]["hooks"]["Recorder"] == {"segments": 2}


async def test_raw_input_and_answers_are_redacted_before_langgraph_keeps_them() -> None:
    seen: list[str] = []

    def script(messages: list[dict[str, Any]], tools: Any) -> Any:
        seen.append(str(messages[-1]["content"]))
        if messages[-1]["role"] == "user":
            return FakeReply.tool_call("charge", {"card": "x"})
        return "ok"

    agent = Agent(FunctionModel(script), tools=[charge], approve=["charge"], redact=Redactor.pii())
    saver, store = InMemorySaver(), InMemoryStore()
    graph = agent.graph.builder.compile(checkpointer=saver, store=store)
    cfg = _cfg("red.1")  # a '.' in the id: the store label is encoded
    secret_mail, secret_card = "ada@example.com", "4111 1111 1111 1111"
    await graph.ainvoke({"messages": [{"type": "human", "content": f"I am {secret_mail}"}]}, cfg)
    call_id = (await graph.aget_state(cfg)).interrupts[0].value["requests"][0]["call_id"]
    runs.clear()
    await graph.ainvoke(
        Command(resume={call_id: {"type": "edit", "args": {"card": secret_card}}}), cfg
    )
    assert runs == ["charge [CARD]"]
    assert seen[0] == "I am [EMAIL]"
    # Nothing LangGraph saved holds the raw values: checkpoints, writes, resume values.
    dumped = repr(saver.storage) + repr(saver.writes) + repr(saver.blobs)
    assert secret_mail not in dumped and "4111" not in dumped
    records = await read_audit(store, "red.1")
    assert [r["action"] for r in records] == ["send", "decide", "tool_call"]
    assert "4111" not in repr(records) and secret_mail not in repr(records)
    assert records[2]["details"]["decision"] == "edit"


async def test_audit_records_of_a_failed_run_and_none_without_a_store() -> None:
    def script(messages: list[dict[str, Any]], tools: Any) -> Any:
        raise RuntimeError("provider exploded")

    agent = Agent(FunctionModel(script))
    store = InMemoryStore()
    graph = agent.graph.builder.compile(checkpointer=InMemorySaver(), store=store)
    with pytest.raises(Exception, match="provider exploded"):
        await graph.ainvoke({"messages": [{"role": "user", "content": "hi"}]}, _cfg("f-1"))
    records = await read_audit(store, "f-1")
    assert [r["action"] for r in records] == ["send", "run_failed"]
    assert "provider exploded" in records[1]["details"]["message"]
    assert len(await read_audit(store, "f-1", limit=1)) == 1
    # No store: nothing to write to, and the run is otherwise the same.
    bare = agent.graph.builder.compile(checkpointer=InMemorySaver())
    with pytest.raises(Exception, match="provider exploded"):
        await bare.ainvoke({"messages": [{"role": "user", "content": "hi"}]}, _cfg("f-2"))


async def test_a_raw_run_on_our_storages_checkpointer_audits_into_the_storage(
    tmp_path: Any,
) -> None:
    from criogen_graph import Storage

    def script(messages: list[dict[str, Any]], tools: Any) -> Any:
        if messages[-1]["role"] == "user":
            return FakeReply.tool_call("slow", {"n": 7})
        return "done"

    async with Storage(f"sqlite:///{tmp_path}/raw.db") as storage:
        agent = Agent(FunctionModel(script), tools=[slow], storage=storage)
        await storage.open()
        graph = agent.graph.builder.compile(checkpointer=storage.checkpointer)
        cfg = {"configurable": {"thread_id": "raw-1"}, "metadata": {"actor": "ops"}}
        await graph.ainvoke({"messages": [{"role": "user", "content": "go"}]}, cfg)
        records = await read_audit(storage, "raw-1")
        assert [(r["action"], r["actor"]) for r in records] == [
            ("send", "ops"),
            ("tool_call", "ops"),
        ]
        # Our own API on the same thread goes on from there, as usual.
        reply = await agent.thread("raw-1").send("again")
        assert reply.text == "done"
        assert [r["action"] for r in await storage.audit("raw-1")][-2:] == ["send", "tool_call"]


async def test_a_failing_on_start_keeps_the_message_and_retry_runs_it_again() -> None:
    from criogen_graph import HookFailedError

    calls = {"n": 0}

    class Flaky(Hook):
        def on_start(self, ctx: HookContext) -> None:
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("quota service down")

    agent = Agent(FunctionModel(lambda m, t: f"ack {m[-1]['content']}"), hooks=[Flaky()])
    thread = agent.thread("flaky-1")
    with pytest.raises(HookFailedError, match="quota service down"):
        await thread.send("hello")
    assert [m["content"] for m in await thread.messages()] == ["hello"]
    reply = await thread.retry()
    assert reply.text == "ack hello" and calls["n"] == 2


async def test_cancelled_at_every_loop_iteration_on_end_runs_exactly_once_per_started_run() -> None:
    """A LangGraph-driven run cancelled after k event-loop iterations, for every k until it
    outlives the cancellation: a run whose on_start ran gets exactly one on_end ("failed"
    when cut, "completed" otherwise), one that never started gets none."""
    rec = Recorder()

    @tool
    async def quick(n: int) -> str:
        """Returns at once."""
        return str(n)

    def script(messages: list[dict[str, Any]], tools: Any) -> Any:
        if messages[-1]["role"] == "user":
            return FakeReply.tool_call("quick", {"n": 0})
        return "done"

    agent = Agent(FunctionModel(script), tools=[quick], hooks=[rec])
    graph = agent.graph.builder.compile(checkpointer=InMemorySaver(), store=InMemoryStore())
    finished = 0
    for k in range(5000):
        rec.log.clear()
        task = asyncio.ensure_future(
            graph.ainvoke({"messages": [{"role": "user", "content": "go"}]}, _cfg(f"k-{k}"))
        )
        for _ in range(k):
            await asyncio.sleep(0)
        task.cancel()
        try:
            await task
            finished += 1
        except asyncio.CancelledError:
            pass
        starts = [e for e in rec.log if e[0] == "start"]
        ends = [e for e in rec.log if e[0] == "end"]
        assert len(starts) <= 1 and len(ends) == len(starts), (k, rec.log)
        if task.cancelled() and ends:
            assert ends == [("end", "failed")], (k, rec.log)
        if finished:
            assert ends == [("end", "completed")], (k, rec.log)
            break
    assert finished == 1  # the sweep reached a run the cancellation came too late for


@pytest.mark.parametrize(
    "thread_id",
    ["a.b%c", "nul\x00inside", "émoji 🧾 ünïcode", "x" * 3000, ".", "%2E"],
)
async def test_audit_in_a_store_under_odd_thread_ids(thread_id: str) -> None:
    agent = Agent(FunctionModel(lambda m, t: "ok"))
    store = InMemoryStore()
    graph = agent.graph.builder.compile(checkpointer=InMemorySaver(), store=store)
    await graph.ainvoke({"messages": [{"role": "user", "content": "hi"}]}, _cfg(thread_id))
    records = await read_audit(store, thread_id)
    assert [(r["action"], r["thread_id"]) for r in records] == [("send", thread_id)]
    # Ids that encode alike would share a namespace: "." and "%2E" must not.
    others = {".": "%2E", "%2E": "."}
    if thread_id in others:
        assert await read_audit(store, others[thread_id]) == []
