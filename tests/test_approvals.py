"""Approvals on every backend: rules, suspension, approve / reject / decide with each
kind of decision, bad decisions that change nothing, records, hooks across segments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from criogen_graph import (
    Agent,
    Approval,
    Decision,
    FakeModel,
    FakeReply,
    FunctionModel,
    Hook,
    HookAction,
    HookContext,
    Storage,
    ThreadSuspendedError,
    ValidationError,
    tool,
)
from tests.conftest import storage_url

Ledger = list[str]


def make_agent(storage: Storage, ledger: Ledger, script: Any, **kw: Any) -> Agent[Any]:
    @tool
    async def refund(order_id: str, amount: float = 0) -> str:
        """Refund an order."""
        ledger.append(f"refund {order_id} {amount:g}")
        return f"refunded {order_id}"

    @tool
    async def partial_refund(order_id: str, amount: float) -> str:
        """Refund part of an order."""
        ledger.append(f"partial {order_id} {amount:g}")
        return f"partially refunded {order_id}"

    @tool
    async def lookup(order_id: str) -> str:
        """Look an order up."""
        ledger.append(f"lookup {order_id}")
        return f"{order_id}: delivered"

    kw.setdefault("approve", ["refund", "partial_refund"])
    return Agent(
        FunctionModel(script), tools=[refund, partial_refund, lookup], storage=storage, **kw
    )


def scripted(*first: tuple[str, dict[str, Any]]) -> tuple[Any, list[list[dict[str, Any]]]]:
    """A model that makes `first` calls, then reports the tool results it got."""
    seen: list[list[dict[str, Any]]] = []

    def fn(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        seen.append(messages)
        if messages[-1]["role"] == "user":
            return FakeReply.tool_calls(*first)
        results = [m["content"] for m in messages if m["role"] == "tool"]
        return "results: " + " / ".join(results)

    return fn, seen


async def test_gated_and_ungated_calls_of_one_reply(storage: Storage, thread_id: str) -> None:
    ledger: Ledger = []
    script, _ = scripted(
        ("lookup", {"order_id": "A-1"}),
        ("refund", {"order_id": "A-1"}),
        ("partial_refund", {"order_id": "B-2", "amount": 5}),
    )
    thread = make_agent(storage, ledger, script).thread(thread_id, actor="ada")
    reply = await thread.send("sort out my orders")
    assert reply.needs_approval and reply.stop_reason is None and reply.text is None
    assert [(a.tool, a.args) for a in reply.approvals] == [
        ("refund", {"order_id": "A-1"}),
        ("partial_refund", {"order_id": "B-2", "amount": 5}),
    ]
    calls = reply.messages[-1]["tool_calls"]
    assert [a.call_id for a in reply.approvals] == [calls[1]["id"], calls[2]["id"]]
    assert ledger == []  # the ungated lookup waits with the gated calls
    assert [p.call_id for p in await thread.pending_approvals()] == [
        a.call_id for a in reply.approvals
    ]
    with pytest.raises(ThreadSuspendedError):
        await thread.send("hello?")

    done = await thread.approve()
    assert sorted(ledger) == ["lookup A-1", "partial B-2 5", "refund A-1 0"]  # each exactly once
    # results come back in call order, in one step
    assert done.text == "results: A-1: delivered / refunded A-1 / partially refunded B-2"
    assert done.tool_calls == 3 and done.model_calls == 2 and done.run_id == reply.run_id


async def test_decide_each_kind(storage: Storage, thread_id: str) -> None:
    ledger: Ledger = []
    script, seen = scripted(
        ("refund", {"order_id": "A-1", "amount": 100}),
        ("refund", {"order_id": "B-2", "amount": 50}),
        ("partial_refund", {"order_id": "C-3", "amount": 10}),
        ("refund", {"order_id": "D-4", "amount": 1}),
    )
    thread = make_agent(storage, ledger, script).thread(thread_id, actor="boss")
    reply = await thread.send("refund everything")
    a, b, c, d = (r.call_id for r in reply.approvals)
    done = await thread.decide(
        {
            a: Decision.approve(),
            b: Decision.edit({"order_id": "B-2", "amount": 20}),
            c: Decision.reject("over the limit"),
            d: Decision.respond("Refunds for D-4 go through the warehouse."),
        }
    )
    assert sorted(ledger) == [
        "refund A-1 100",
        "refund B-2 20",
    ]  # the decision applies to its call only
    results = {m["tool_call_id"]: m for m in done.messages if m["role"] == "tool"}
    assert results[a]["status"] == "ok" and results[a]["content"] == "refunded A-1"
    assert results[b]["status"] == "ok" and results[b]["decision"] == "edit"
    assert "edited this call" in results[b]["content"] and '"amount": 20' in results[b]["content"]
    assert "Do not repeat the original call" in results[b]["content"]
    assert results[c]["status"] == "rejected"
    assert results[c]["content"].startswith(
        "A reviewer rejected this call to partial_refund: over the limit."
    )
    assert results[d]["status"] == "skipped"
    assert results[d]["content"] == "Refunds for D-4 go through the warehouse."
    # the model saw every answer
    assert [m["tool_call_id"] for m in seen[-1] if m["role"] == "tool"] == [a, b, c, d]


async def test_edit_can_switch_to_another_tool(storage: Storage, thread_id: str) -> None:
    ledger: Ledger = []
    script, _ = scripted(("refund", {"order_id": "A-1", "amount": 100}))
    thread = make_agent(storage, ledger, script).thread(thread_id)
    reply = await thread.send("refund A-1")
    (req,) = reply.approvals
    done = await thread.decide(
        {req.call_id: Decision.edit({"order_id": "A-1", "amount": 30}, name="partial_refund")}
    )
    assert ledger == ["partial A-1 30"]
    result = done.messages[-2]
    assert result["tool"] == "partial_refund" and result["name"] == "refund"


async def test_reject_all(storage: Storage, thread_id: str) -> None:
    ledger: Ledger = []
    script, _ = scripted(("refund", {"order_id": "A-1"}), ("lookup", {"order_id": "A-1"}))
    thread = make_agent(storage, ledger, script).thread(thread_id)
    await thread.send("refund A-1")
    done = await thread.reject()
    assert ledger == ["lookup A-1"]  # ungated calls still run, exactly once
    refund_msg = next(m for m in done.messages if m["role"] == "tool" and m["name"] == "refund")
    assert refund_msg["status"] == "rejected"
    assert (
        refund_msg["content"]
        == "A reviewer rejected this call to refund. Do not retry it; continue without it."
    )
    thread2 = make_agent(storage, [], scripted(("refund", {"order_id": "Z"}))[0]).thread(
        thread_id + "-2"
    )
    await thread2.send("refund Z")
    done = await thread2.reject("policy: no refunds on Sundays")
    assert "policy: no refunds on Sundays" in done.messages[-2]["content"]


@pytest.mark.parametrize(
    ("make", "code", "needle"),
    [
        (lambda a, b: {a: Decision.approve()}, "missing", "missing"),
        (
            lambda a, b: {
                a: Decision.approve(),
                b: Decision.approve(),
                "call_nope": Decision.approve(),
            },
            "unknown",
            "call_nope",
        ),
        (
            lambda a, b: {a: Decision.approve(), b: Decision.edit({"order_id": 7})},
            "invalid_value",
            "do not fit",
        ),
        (
            lambda a, b: {a: Decision.approve(), b: Decision.edit({"order_id": "x"}, name="nope")},
            "unknown",
            "nope",
        ),
        (lambda a, b: {a: Decision.approve(), b: {"type": "maybe"}}, "invalid_value", "maybe"),
        (lambda a, b: {a: Decision.approve(), b: {"type": "respond"}}, "missing", "message"),
    ],
)
async def test_bad_decisions_change_nothing(
    storage: Storage, thread_id: str, make: Any, code: str, needle: str
) -> None:
    ledger: Ledger = []
    script, _ = scripted(("refund", {"order_id": "A-1"}), ("refund", {"order_id": "B-2"}))
    thread = make_agent(storage, ledger, script).thread(thread_id)
    reply = await thread.send("refund both")
    a, b = (r.call_id for r in reply.approvals)
    history = await thread.history(limit=100)
    audit = await storage.audit(thread_id)
    with pytest.raises(ValidationError) as info:
        await thread.decide(make(a, b))
    assert info.value.code == code and needle in str(info.value)
    # nothing saved, still suspended and answerable
    assert await thread.history(limit=100) == history
    assert await storage.audit(thread_id) == audit
    assert ledger == []
    assert [p.call_id for p in await thread.pending_approvals()] == [a, b]
    done = await thread.approve()
    assert sorted(ledger) == ["refund A-1 0", "refund B-2 0"]
    assert done.needs_approval is False


async def test_approval_rules(storage: Storage, thread_id: str) -> None:
    ledger: Ledger = []
    script, _ = scripted(
        ("refund", {"order_id": "small", "amount": 10}),
        ("refund", {"order_id": "big", "amount": 500}),
        ("partial_refund", {"order_id": "p", "amount": 5}),
    )
    rules = [
        Approval(
            "refund",
            description=lambda args: f"Refund {args['amount']} on {args['order_id']}",
            when=lambda args: args["amount"] > 100,
        ),
        Approval("partial_refund", description="Partial refund", allowed=["approve", "reject"]),
    ]
    thread = make_agent(storage, ledger, script, approve=rules).thread(thread_id)
    reply = await thread.send("refunds")
    big, part = reply.approvals
    assert (big.tool, big.args["order_id"], big.description, big.allowed) == (
        "refund",
        "big",
        "Refund 500 on big",
        None,
    )
    assert (part.description, part.allowed) == ("Partial refund", ["approve", "reject"])
    with pytest.raises(ValidationError, match="'edit' is not allowed"):
        await thread.decide(
            {
                big.call_id: Decision.approve(),
                part.call_id: Decision.edit({"order_id": "p", "amount": 1}),
            }
        )
    await thread.decide({big.call_id: Decision.reject(), part.call_id: Decision.approve()})
    assert sorted(ledger) == ["partial p 5", "refund small 10"]  # "small" never needed review


def test_bad_rules() -> None:
    with pytest.raises(ValidationError):
        Approval("refund", allowed=["approve", "escalate"])
    with pytest.raises(TypeError):
        Approval("refund", allowed="approve")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Approval("")
    with pytest.raises(ValidationError, match="twice"):
        Agent(FunctionModel(lambda m, t: "x"), tools=[], approve=[Approval("a"), "a"])


async def test_decisions_are_recorded(storage: Storage, thread_id: str) -> None:
    ledger: Ledger = []
    script, _ = scripted(
        ("refund", {"order_id": "A-1", "amount": 100}), ("refund", {"order_id": "B-2", "amount": 9})
    )
    thread = make_agent(storage, ledger, script).thread(thread_id, actor="clerk")
    reply = await thread.send("refunds")
    a, b = (r.call_id for r in reply.approvals)
    await (
        make_agent(storage, ledger, script)
        .thread(thread_id, actor="manager")
        .decide({a: Decision.edit({"order_id": "A-1", "amount": 40}), b: Decision.reject("no")})
    )
    (record,) = [r for r in await storage.audit(thread_id) if r["action"] == "decide"]
    assert record["actor"] == "manager" and record["run_id"] == reply.run_id
    by_call = {d["call_id"]: d for d in record["details"]["decisions"]}
    assert by_call[a]["args"] == {"order_id": "A-1", "amount": 100}  # what the model asked
    assert by_call[a]["decision"] == {"type": "edit", "args": {"order_id": "A-1", "amount": 40}}
    import hashlib
    import json

    approved = hashlib.sha256(
        json.dumps(
            {"order_id": "A-1", "amount": 40}, sort_keys=True, separators=(",", ":")
        ).encode()
    ).hexdigest()
    assert by_call[a]["approved_args_sha256"] == approved
    assert by_call[b]["decision"] == {"type": "reject", "message": "no"}
    assert by_call[b]["approved_args_sha256"] is None
    tool_records = [r for r in await storage.audit(thread_id) if r["action"] == "tool_call"]
    assert {
        (r["details"]["call_id"], r["details"]["status"], r["details"].get("decision"))
        for r in tool_records
    } == {
        (a, "ok", "edit"),
        (b, "rejected", "reject"),
    }


async def test_hooks_across_segments(backend: str, tmp_path: Path, thread_id: str) -> None:
    events: list[str] = []

    class Tracker(Hook):
        def on_start(self, ctx: HookContext) -> HookAction:
            count = (ctx.hook_state or {}).get("segments", 0) + 1
            events.append(f"start {count} msgs={len(ctx.messages)}")
            return HookAction(state={"segments": count})

        def on_end(self, ctx: HookContext, outcome: str) -> None:
            events.append(f"end {outcome} state={ctx.hook_state}")

    url = storage_url(backend, tmp_path)
    ledger: Ledger = []
    script, _ = scripted(("refund", {"order_id": "A-1"}))
    storage = Storage(url)
    reply = (
        await make_agent(storage, ledger, script, hooks=[Tracker()])
        .thread(thread_id)
        .send("refund")
    )
    assert reply.needs_approval
    if backend != "memory":
        # a restart: new storage and agent objects
        await storage.close()
        storage = Storage(url)
    await make_agent(storage, ledger, script, hooks=[Tracker()]).thread(thread_id).approve()
    assert events == [
        "start 1 msgs=1",
        "end suspended state={'segments': 1}",
        "start 2 msgs=2",
        "end completed state={'segments': 2}",
    ]
    await storage.close()


async def test_studio_style_plain_json_answers(storage: Storage, thread_id: str) -> None:
    """The graph itself accepts plain JSON, as LangGraph Studio sends it."""
    from langgraph.types import Command

    ledger: Ledger = []
    script, _ = scripted(("refund", {"order_id": "A-1"}))
    agent = make_agent(storage, ledger, script)
    reply = await agent.thread(thread_id).send("refund")
    graph = agent.thread_graph(storage)
    cfg: Any = {"configurable": {"thread_id": thread_id}}
    snap = await graph.aget_state(cfg)
    (intr,) = snap.interrupts
    out = await graph.ainvoke(
        Command(resume={intr.id: {reply.approvals[0].call_id: {"type": "approve"}}}), cfg
    )
    assert out["messages"][-1]["content"] == "results: refunded A-1"
    assert ledger == ["refund A-1 0"]
    assert await agent.thread(thread_id).pending_approvals() == []


async def test_a_reject_reason_ending_in_a_period_reads_cleanly() -> None:
    @tool
    def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    agent = Agent(
        FakeModel([FakeReply.tool_call("refund", {"order_id": "A-1"}), "ok"]),
        tools=[refund],
        approve=["refund"],
    )
    thread = agent.thread("reject-period")
    await thread.send("refund A-1")
    reply = await thread.reject("Refunded already.")
    (result,) = [m for m in reply.messages if m["role"] == "tool"]
    assert result["content"] == (
        "A reviewer rejected this call to refund: Refunded already. Do not retry it; "
        "continue without it."
    )


def _three_refunds() -> tuple[Agent[Any], Ledger]:
    ledger: Ledger = []
    script, _ = scripted(
        ("lookup", {"order_id": "Z-9"}),
        ("refund", {"order_id": "A-1", "amount": 100}),
        ("refund", {"order_id": "B-2", "amount": 50}),
        ("partial_refund", {"order_id": "C-3", "amount": 10}),
    )
    return make_agent(Storage("memory://"), ledger, script), ledger


@pytest.mark.parametrize("shape", ["decisions", "list"])
async def test_langchain_hitl_decisions_resume_the_graph_in_call_order(shape: str) -> None:
    """What `create_agent`'s `HumanInTheLoopMiddleware` resumes with,
    `{"decisions": [...]}` (one per pending call, in call order), and the bare list."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    agent, ledger = _three_refunds()
    graph = agent.graph.builder.compile(checkpointer=InMemorySaver())
    cfg: Any = {"configurable": {"thread_id": f"hitl-{shape}"}}
    out = await graph.ainvoke({"messages": [("user", "refund all")]}, cfg, version="v2")
    (pending,) = out.interrupts
    assert [r["tool"] for r in pending.value["requests"]] == ["refund", "refund", "partial_refund"]
    decisions: list[dict[str, Any]] = [
        {"type": "approve"},
        {
            "type": "edit",
            "edited_action": {"name": "partial_refund", "args": {"order_id": "B-2", "amount": 20}},
        },
        {"type": "reject", "message": "over the limit"},
    ]
    answer: Any = {"decisions": decisions} if shape == "decisions" else decisions
    out = await graph.ainvoke(Command(resume=answer), cfg, version="v2")
    assert out.interrupts == ()
    assert sorted(ledger) == ["lookup Z-9", "partial B-2 20", "refund A-1 100"]
    results = [m for m in out.value["messages"] if m["role"] == "tool"]
    assert [(m["name"], m["status"]) for m in results] == [
        ("lookup", "ok"),
        ("refund", "ok"),
        ("refund", "ok"),
        ("partial_refund", "rejected"),
    ]
    assert results[2]["decision"] == "edit" and results[2]["tool"] == "partial_refund"
    assert "over the limit" in results[3]["content"]


async def test_langchain_hitl_decisions_that_do_not_fit_are_asked_again() -> None:
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    agent, ledger = _three_refunds()
    graph = agent.graph.builder.compile(checkpointer=InMemorySaver())
    cfg: Any = {"configurable": {"thread_id": "hitl-bad"}}
    await graph.ainvoke({"messages": [("user", "refund all")]}, cfg)
    for bad, why in [
        ({"decisions": [{"type": "approve"}]}, "3 pending calls"),
        ([{"type": "approve"}] * 4, "3 pending calls"),
        ({"decisions": "approve"}, "a list"),
        (
            {"decisions": [{"type": "edit"}, {"type": "approve"}, {"type": "approve"}]},
            "edited_action",
        ),
        (
            {"decisions": [{"type": "edit", "edited_action": {"args": {"order_id": 1}}}] * 3},
            "do not fit",
        ),
    ]:
        out = await graph.ainvoke(Command(resume=bad), cfg, version="v2")
        (again,) = out.interrupts
        assert why in again.value["error"], (bad, again.value["error"])
    assert ledger == []

    # Our own API takes the same shapes.
    thread_agent, ledger = _three_refunds()
    thread = thread_agent.thread("hitl-thread")
    await thread.send("refund all")
    with pytest.raises(ValidationError, match="3 pending calls"):
        await thread.decide({"decisions": [Decision.approve()]})
    done = await thread.decide(
        {"decisions": [{"type": "approve"}, {"type": "reject"}, {"type": "approve"}]}
    )
    assert sorted(ledger) == ["lookup Z-9", "partial C-3 10", "refund A-1 100"]
    assert done.text is not None
