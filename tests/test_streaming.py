"""Streaming: the events of a run as they happen, cancellation at any point, and the same
saved result as `send`."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pydantic
import pytest

from criogen_graph import (
    Agent,
    ApprovalNeededEvent,
    CancelledError,
    Decision,
    FakeModel,
    FakeReply,
    FunctionModel,
    Hook,
    HookContext,
    MessageEvent,
    ModelError,
    OtherEvent,
    Retry,
    Storage,
    TextEvent,
    ThreadSuspendedError,
    ToolCall,
    ToolCallFinishedEvent,
    ToolCallStartedEvent,
    ToolError,
    ToolResult,
    tool,
)
from tests.conftest import wait_until
from tests.procs.agents import ledger_lines, tools_agent


async def collect(stream: Any) -> list[Any]:
    return [e async for e in stream]


@tool
async def lookup(order_id: str) -> str:
    """Look an order up."""
    return f"{order_id} shipped"


@tool
async def fails(x: int) -> str:
    """Always fails."""
    raise ToolError("no such thing")


@tool(timeout_secs=0.05)
async def hangs() -> str:
    """Never returns."""
    await asyncio.Event().wait()
    return "x"


@tool
async def cached(q: str) -> str:
    """Skipped by a hook."""
    return "never"


@tool
async def refund(order_id: str) -> str:
    """Refund."""
    return "refunded"


class SkipCached(Hook):
    def before_tool(self, call: ToolCall) -> ToolResult | None:
        return ToolResult("from cache") if call.name == "cached" else None


async def test_events_of_a_run(storage: Storage, thread_id: str) -> None:
    model = FakeModel(
        [
            FakeReply.tool_calls(
                {"name": "lookup", "args": {"order_id": "A-1"}, "id": "ok"},
                {"name": "fails", "args": {"x": "3"}, "id": "error"},
                {"name": "lookup", "args": {"order": 1}, "id": "invalid"},
                {"name": "hangs", "args": {}, "id": "timeout"},
                {"name": "cached", "args": {"q": "k"}, "id": "skipped"},
                {"name": "refund", "args": {"order_id": "A-1"}, "id": "rejected"},
            ),
            FakeReply.text("All sorted out.", chunks=["All ", "sorted ", "out."]),
        ]
    )
    agent = Agent(
        model,
        tools=[lookup, fails, hangs, cached, refund],
        approve=["refund"],
        hooks=[SkipCached()],
        storage=storage,
    )
    thread = agent.thread(thread_id)
    stream = thread.stream("sort it out")
    events = await collect(stream)
    reply = await stream.reply()
    assert reply.needs_approval
    assert isinstance(events[0], MessageEvent) and events[0].message == {
        "role": "user",
        "content": "sort it out",
    }
    assert isinstance(events[-1], ApprovalNeededEvent)
    assert [r.tool for r in events[-1].requests] == ["refund"]
    assert [type(e).__name__ for e in events if not isinstance(e, OtherEvent)] == [
        "MessageEvent",
        "MessageEvent",
        "ApprovalNeededEvent",
    ]

    stream = thread.stream_decide({"rejected": Decision.reject("no")})
    events = await collect(stream)
    reply = await stream.reply()
    started = {e.call_id: e for e in events if isinstance(e, ToolCallStartedEvent)}
    finished = {e.call_id: e.status for e in events if isinstance(e, ToolCallFinishedEvent)}
    # each call's id is named after the status it ends with
    assert finished == {
        k: k if k != "invalid" else "error"
        for k in ("ok", "error", "invalid", "timeout", "skipped", "rejected")
    }
    # started only for calls that reached their tool, with the validated args
    assert set(started) == {"ok", "error", "timeout"}
    assert started["ok"].args == {"order_id": "A-1"} and started["ok"].tool == "lookup"
    assert started["error"].args == {"x": 3}
    order = [(type(e).__name__, getattr(e, "call_id", None)) for e in events]
    for call_id in started:
        assert order.index(("ToolCallStartedEvent", call_id)) < order.index(
            ("ToolCallFinishedEvent", call_id)
        )
    texts = [e for e in events if isinstance(e, TextEvent)]
    assert [t.text for t in texts] == ["All ", "sorted ", "out."]
    final = next(
        e.message
        for e in events
        if isinstance(e, MessageEvent) and e.message["role"] == "assistant"
    )
    assert {t.message_id for t in texts} == {final["id"]}
    assert final["content"] == reply.text == "All sorted out."
    messages = [e.message for e in events if isinstance(e, MessageEvent)]
    # as each finishes (the timeout comes last); saved in call order
    assert messages[-1] == reply.messages[-1]
    by_id = lambda ms: sorted(ms, key=lambda m: m.get("tool_call_id", ""))  # noqa: E731
    assert by_id(messages[:-1]) == by_id(reply.messages[2:-1])
    assert [m["tool_call_id"] for m in reply.messages[2:-1]] == [
        "ok",
        "error",
        "invalid",
        "timeout",
        "skipped",
        "rejected",
    ]
    others = [e for e in events if isinstance(e, OtherEvent)]
    assert {(e.event, e.node) for e in others} >= {
        ("step_started", "tools"),
        ("step_finished", "tools"),
        ("step_started", "model"),
    }
    assert {f.name for f in dataclasses.fields(OtherEvent)} == {"event", "node", "step", "type"}
    assert all(isinstance(e.step, int) for e in others)


async def test_retry_and_fallback_events_carry_no_content() -> None:
    primary = FakeModel(
        [FakeReply.error("rate_limit", "secret detail"), FakeReply.error("rate_limit")], name="p"
    )
    backup = FakeModel(["hello"], name="b")
    agent = Agent(
        primary, fallbacks=[backup], model_retry=Retry(max_attempts=2, initial_backoff_secs=0)
    )
    stream = agent.thread("retries").stream("hi")
    events = await collect(stream)
    others = [(e.event, e.node) for e in events if isinstance(e, OtherEvent)]
    assert ("model_retry", "model") in others and ("model_fallback", "model") in others
    assert all("secret" not in repr(e) for e in events if isinstance(e, OtherEvent))
    assert (await stream.reply()).answered_by == {"provider": "fake", "model": "b"}


async def test_function_model_streams_in_chunks() -> None:
    agent = Agent(FunctionModel(lambda m, t: "x" * 40))
    events = await collect(agent.thread("chunks").stream("go"))
    texts = [e.text for e in events if isinstance(e, TextEvent)]
    assert len(texts) > 1 and "".join(texts) == "x" * 40


async def test_sub_agent_and_hook_tokens_do_not_leak() -> None:
    inner = Agent(
        FunctionModel(lambda m, t: FakeReply.text("INNER SECRET", chunks=["INNER ", "SECRET"]))
    )

    class Summarize(Hook):
        async def before_model(self, ctx: HookContext) -> None:
            await inner.run("summarize")  # a model call made inside a hook

    lead = Agent(
        FakeModel(
            [
                FakeReply.tool_call("research", {"input": "q"}),
                FakeReply.text("outer answer", chunks=["outer ", "answer"]),
            ]
        ),
        tools=[inner.as_tool("research", "Researches.")],
        hooks=[Summarize()],
    )
    events = await collect(lead.thread("leak").stream("go"))
    texts = [e.text for e in events if isinstance(e, TextEvent)]
    assert "".join(texts) == "outer answer"


async def test_failed_streamed_run_raises_from_the_loop(storage: Storage, thread_id: str) -> None:
    agent = Agent(FakeModel([FakeReply.error("auth")]), storage=storage)
    stream = agent.thread(thread_id).stream("hi")
    seen: list[Any] = []

    async def consume() -> None:
        async for event in stream:
            seen.append(event)

    with pytest.raises(ModelError):
        await consume()
    assert isinstance(seen[0], MessageEvent)
    with pytest.raises(ModelError):
        await stream.reply()


async def test_reply_without_iterating(storage: Storage, thread_id: str) -> None:
    reply = (
        await Agent(FakeModel(["hi"]), storage=storage).thread(thread_id).stream("hello").reply()
    )
    assert reply.text == "hi"


async def test_stream_on_a_suspended_thread(storage: Storage, thread_id: str) -> None:
    agent = Agent(
        FakeModel([FakeReply.tool_call("refund", {"order_id": "1"})]),
        tools=[refund],
        approve=["refund"],
        storage=storage,
    )
    await agent.thread(thread_id).send("refund")
    with pytest.raises(ThreadSuspendedError):
        await collect(agent.thread(thread_id).stream("again"))


# -- cancellation --------------------------------------------------------------------


async def _cancel_and_retry(storage: Storage, thread_id: str, tmp_path: Path, how: str) -> None:
    agent = tools_agent(storage, tmp_path)
    thread = agent.thread(thread_id)
    stream = thread.stream("go")
    consumer_done = asyncio.Event()

    async def consume() -> None:
        try:
            async for event in stream:
                if (
                    how == "break"
                    and isinstance(event, ToolCallStartedEvent)
                    and event.tool == "slow"
                ):
                    break
        finally:
            consumer_done.set()

    consumer = asyncio.create_task(consume())
    await wait_until(
        lambda: any(x.startswith("slow-started") for x in ledger_lines(tmp_path)),
        what="slow to start",
    )
    await wait_until(
        lambda: any(x.startswith("fast ") for x in ledger_lines(tmp_path)), what="fast to finish"
    )
    if how == "cancel":
        stream.cancel()
    elif how == "task":
        consumer.cancel()
    with pytest.raises(CancelledError):
        await stream.reply()
    await consumer_done.wait()
    head = (await thread.history(limit=1))[0]
    # "cancelled" when LangGraph saved the cancelled call's error before the run ended,
    # else "pending" (unfinished); retry() continues it either way.
    assert head["status"] in ("cancelled", "pending")
    assert not any(x.startswith("slow ") for x in ledger_lines(tmp_path))  # the tool was stopped
    (tmp_path / "release").touch()
    reply = await thread.retry()
    assert reply.text == "done"
    ledger = ledger_lines(tmp_path)
    assert sum(x.startswith("fast ") for x in ledger) == 1
    assert sum(x.startswith("slow ") for x in ledger) == 1


@pytest.mark.parametrize("how", ["cancel", "break", "task"])
async def test_cancel_stops_the_run_and_retry_continues(
    storage: Storage, thread_id: str, tmp_path: Path, how: str
) -> None:
    await _cancel_and_retry(storage, thread_id, tmp_path, how)


async def test_cancel_once_the_last_call_of_a_step_finished_then_retry(
    storage: Storage, thread_id: str
) -> None:
    # The tool's result is saved as soon as it finishes; the cancel may come before its
    # step is committed (no `next` task is left): retry still continues the run.
    agent = Agent(
        FakeModel([FakeReply.tool_call("lookup", {"order_id": "A-1"}), "A-1 shipped."]),
        tools=[lookup],
        storage=storage,
    )
    thread = agent.thread(thread_id)
    stream = thread.stream("Where is A-1?")
    async for event in stream:
        if isinstance(event, MessageEvent) and event.message["role"] == "tool":
            stream.cancel()
    with pytest.raises(CancelledError):
        await stream.reply()
    reply = await thread.retry()
    assert reply.text == "A-1 shipped."
    assert [m["role"] for m in reply.messages] == ["user", "assistant", "tool", "assistant"]


# -- streamed and sent runs end the same -----------------------------------------------


class Verdict(pydantic.BaseModel):
    ok: bool


SCRIPTS: dict[str, Any] = {
    "plain": lambda: [
        FakeReply.text("Hello there.", usage={"input_tokens": 3, "output_tokens": 2})
    ],
    "tools": lambda: [
        FakeReply.tool_calls(
            {"name": "lookup", "args": {"order_id": "A-1"}, "id": "c1"},
            {"name": "fails", "args": {"x": 1}, "id": "c2"},
        ),
        "Looked it up.",
    ],
    "approval": lambda: [
        FakeReply.tool_calls({"name": "refund", "args": {"order_id": "A-1"}, "id": "c1"}),
        "Refunded.",
    ],
    "failure": lambda: [
        FakeReply.tool_calls({"name": "lookup", "args": {"order_id": "A-1"}, "id": "c1"}),
        FakeReply.error("auth"),
    ],
    "output": lambda: ["not json", '{"ok": true}'],
}


def normalize(value: Any) -> Any:
    """Drop what differs between any two runs (random ids, times)."""
    if isinstance(value, dict):
        return {
            k: normalize(v)
            for k, v in value.items()
            if k not in ("id", "run_id", "ts_ms", "duration_ms", "checkpoint_id")
        }
    if isinstance(value, list):
        return [normalize(v) for v in value]
    return value


async def play(storage: Storage, thread_id: str, name: str, streamed: bool) -> tuple[Any, Any]:
    kw: dict[str, Any] = {"output": Verdict} if name == "output" else {}
    agent = Agent(
        FakeModel(SCRIPTS[name]()),
        tools=[lookup, fails, refund],
        approve=["refund"],
        storage=storage,
        model_retry=Retry(max_attempts=1),
        **kw,
    )
    thread = agent.thread(thread_id, actor="same")

    async def call(make_stream: Any, plain: Any) -> Any:
        if streamed:
            stream = make_stream()
            try:
                await collect(stream)
            except Exception:
                pass
            return await stream.reply()
        return await plain()

    try:
        reply = await call(lambda: thread.stream("do it"), lambda: thread.send("do it"))
        if reply.needs_approval:
            reply = await call(thread.stream_approve, thread.approve)
        result: Any = reply
    except Exception as exc:
        result = type(exc).__name__
    return result, await thread.messages()


@pytest.mark.parametrize("name", list(SCRIPTS))
async def test_streamed_and_sent_runs_end_the_same(
    storage: Storage, thread_id: str, name: str
) -> None:
    sent, sent_messages = await play(storage, thread_id + "-send", name, streamed=False)
    streamed, streamed_messages = await play(storage, thread_id + "-stream", name, streamed=True)
    assert normalize(streamed_messages) == normalize(sent_messages)
    if isinstance(sent, str):
        assert streamed == sent  # the same error
    else:
        fields = (
            "text",
            "output",
            "usage",
            "stop_reason",
            "needs_approval",
            "model_calls",
            "tool_calls",
            "answered_by",
            "models",
            "version",
        )
        assert {f: getattr(streamed, f) for f in fields} == {f: getattr(sent, f) for f in fields}
        assert normalize(streamed.messages) == normalize(sent.messages)
    assert await audit_of(storage, thread_id + "-stream") == await audit_of(
        storage, thread_id + "-send"
    )


async def audit_of(storage: Storage, thread_id: str) -> tuple[list[Any], list[Any]]:
    """The action records in order, and the tool-call records (concurrent calls finish in
    any order) sorted by call."""
    records = [
        normalize({k: v for k, v in a.items() if k != "thread_id"})
        for a in await storage.audit(thread_id)
    ]
    actions = [r for r in records if r["action"] != "tool_call"]
    calls = sorted(
        (r for r in records if r["action"] == "tool_call"), key=lambda r: r["details"]["call_id"]
    )
    return actions, calls


async def test_the_raw_graph_streams_the_same_payloads_in_langgraphs_custom_mode() -> None:
    """`agent.graph` run by LangGraph itself (a notebook, LangGraph's server) carries the
    events of `thread.stream` as dicts in the `custom` stream mode, and only there."""
    from langgraph.checkpoint.memory import InMemorySaver

    agent = Agent(
        FakeModel(
            [
                FakeReply.tool_call("lookup", {"order_id": "A-1"}, id="c1"),
                FakeReply.text("It shipped.", chunks=["It ", "shipped."]),
                FakeReply.text("Still shipped."),
            ]
        ),
        tools=[lookup],
    )
    graph = agent.graph.copy(update={"checkpointer": InMemorySaver()})
    config = {"configurable": {"thread_id": "raw"}}
    parts = [
        p
        async for p in graph.astream(
            {"messages": [{"role": "user", "content": "where is A-1?"}]},
            config,
            stream_mode="custom",
        )
    ]
    assert "".join(p["text"] for p in parts if p["type"] == "text") == "It shipped."
    started = [p for p in parts if p["type"] == "tool_call_started"]
    assert [(p["tool"], p["call_id"]) for p in started] == [("lookup", "c1")]
    assert [p["message"]["role"] for p in parts if p["type"] == "message"] == [
        "assistant",
        "tool",
        "assistant",
    ]
    # Asked for values only, the caller gets values only.
    values = [
        p
        async for p in graph.astream(
            {"messages": [{"role": "user", "content": "again"}]},
            {"configurable": {"thread_id": "raw-2"}},
            stream_mode="values",
        )
    ]
    assert values[-1]["messages"][-1]["content"] == "Still shipped."
