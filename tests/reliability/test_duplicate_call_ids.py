"""Tool-call ids that are not unique (issue 15, item 3).

Some OpenAI-compatible servers give two calls of one reply the same id, start again at
`call_0` every turn, or send no id at all. Everything keyed on a call id (the reviewer's
decisions, the tool messages that answer calls, the audit records, the closing of an
unfinished run) would then mix calls up: an edit meant for one refund ran on another, an
ungated call was rejected with the gated one.

The rule under test: the model node makes every call id unique in its thread before
anything keys on it. A call keeps the provider's id when that id is new in the thread;
otherwise it gets `<id>-<n>` (the smallest n >= 2 not used yet), or a fresh
`call_<hex>` when it had none; the provider's own id is kept as `provider_id`, and is
what goes back to the provider on the wire.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import (
    Agent,
    Approval,
    Decision,
    FakeReply,
    FunctionModel,
    Storage,
    ToolContext,
    ToolExecutionError,
    openai,
    tool,
)
from tests.conftest import storage_url
from tests.reliability._report import report
from tests.servers import openai_server as oa


class Shop:
    """A refund tool (gated above 50) and a lookup tool, counting what ran."""

    def __init__(self) -> None:
        self.refunds: list[int] = []
        self.lookups: list[str] = []
        self.by_call: Counter[str] = Counter()
        self.broken = False
        self.other_done = asyncio.Event()

        @tool
        def refund(amount: int, ctx: ToolContext) -> str:
            """Refund an amount."""
            self.by_call[ctx.call_id] += 1
            self.refunds.append(amount)
            return f"refunded {amount}"

        @tool
        async def lookup(order: str, ctx: ToolContext) -> str:
            """Look up an order."""
            self.by_call[ctx.call_id] += 1
            if self.broken and order == "BROKEN":
                await self.other_done.wait()  # the other call of the reply has returned
                raise OSError("disk full")
            self.lookups.append(order)
            self.other_done.set()
            return f"order {order}: shipped"

        self.tools = [refund, lookup]


def check_transcript(messages: list[dict[str, Any]]) -> list[str]:
    """Every call id is unique in the thread and answered by exactly one tool message
    right after its reply, naming the same tool; returns the ids in order."""
    ids: list[str] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        i += 1
        calls = m.get("tool_calls") if m["role"] == "assistant" else None
        if not calls:
            continue
        results = []
        while i < len(messages) and messages[i]["role"] == "tool":
            results.append(messages[i])
            i += 1
        assert [r["tool_call_id"] for r in results] == [c["id"] for c in calls]
        assert [r["name"] for r in results] == [c["name"] for c in calls]
        ids.extend(c["id"] for c in calls)
    assert len(ids) == len(set(ids)), f"duplicate call ids in the thread: {ids}"
    assert all(isinstance(c, str) and c for c in ids)
    return ids


def dup_reply() -> FakeReply:
    return FakeReply.tool_calls(
        {"id": "call_0", "name": "refund", "args": {"amount": 100}},  # gated
        {"id": "call_0", "name": "refund", "args": {"amount": 5}},  # not gated
        {"id": "call_0", "name": "lookup", "args": {"order": "A-1"}},
    )


@pytest.mark.parametrize("kind", ["edit", "reject", "approve"])
async def test_a_decision_applies_only_to_the_call_the_reviewer_saw(
    kind: str, backend: str, tmp_path: Path, thread_id: str
) -> None:
    shop = Shop()
    seen: list[list[dict[str, Any]]] = []

    def model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        seen.append(messages)
        return dup_reply() if messages[-1]["role"] == "user" else "done"

    async with Storage(storage_url(backend, tmp_path)) as storage:
        agent = Agent(
            FunctionModel(model),
            tools=shop.tools,
            approve=[Approval("refund", when=lambda args: args["amount"] > 50)],
            storage=storage,
        )
        thread = agent.thread(thread_id)
        reply = await thread.send("refund order A-1")
        assert reply.needs_approval
        [request] = reply.approvals
        assert (request.tool, request.args) == ("refund", {"amount": 100})
        assert [r.call_id for r in await thread.pending_approvals()] == [request.call_id]
        assert shop.by_call == Counter()  # nothing ran before the decision

        decision = {
            "edit": Decision.edit({"amount": 40}),
            "reject": Decision.reject("too much"),
            "approve": Decision.approve(),
        }[kind]
        done = await thread.decide({request.call_id: decision})
        assert done.text == "done"

        gated_amount = {"edit": [40], "reject": [], "approve": [100]}[kind]
        assert sorted(shop.refunds) == sorted([*gated_amount, 5])
        assert shop.lookups == ["A-1"]
        assert all(n == 1 for n in shop.by_call.values())  # each call ran at most once

        messages = await thread.messages()
        ids = check_transcript(messages)
        assert len(ids) == 3
        calls = messages[1]["tool_calls"]
        # The first call keeps the provider's id; the others are renamed and remember it.
        assert [c["id"] for c in calls] == ["call_0", "call_0-2", "call_0-3"]
        assert [c.get("provider_id") for c in calls] == [None, "call_0", "call_0"]
        results = {m["tool_call_id"]: m for m in messages if m["role"] == "tool"}
        gated = results[request.call_id]
        assert gated.get("decision") == (None if kind == "approve" else kind)
        assert "decision" not in results["call_0-2"] and "decision" not in results["call_0-3"]
        assert results["call_0-2"]["content"] == "refunded 5"
        assert results["call_0-3"]["content"] == "order A-1: shipped"
        # What the model was shown matches the saved thread.
        assert seen[-1] == messages[:-1]

        audit = [r for r in await storage.audit(thread_id) if r["action"] == "tool_call"]
        assert sorted(r["details"]["call_id"] for r in audit) == sorted(ids)
        decided = next(r for r in await storage.audit(thread_id) if r["action"] == "decide")
        assert [d["call_id"] for d in decided["details"]["decisions"]] == [request.call_id]
    report(
        f"duplicate_ids_decision_{kind}_{backend}",
        calls=3,
        gated=1,
        runs=sum(shop.by_call.values()),
        run_twice=sum(n > 1 for n in shop.by_call.values()),
    )


async def test_ids_reused_every_turn_and_a_failed_run_closed_by_a_new_message(
    backend: str, tmp_path: Path, thread_id: str
) -> None:
    """A server that starts at `call_0` every turn; one turn waits for approval, one
    fails (policy "fail") with a finished call beside the failing one, and the next
    message closes it: the finished result is kept for its own call, the failed call is
    answered "not run", and nothing runs twice."""
    shop = Shop()
    shop.broken = True
    script = iter(
        [
            FakeReply.tool_calls({"id": "call_0", "name": "lookup", "args": {"order": "A-1"}}),
            "turn 1 done",
            FakeReply.tool_calls({"id": "call_0", "name": "refund", "args": {"amount": 90}}),
            "turn 2 done",
            FakeReply.tool_calls(
                {"id": "call_0", "name": "lookup", "args": {"order": "A-2"}},
                {"id": "call_0", "name": "lookup", "args": {"order": "BROKEN"}},
            ),
            FakeReply.tool_calls({"id": "call_0", "name": "lookup", "args": {"order": "A-3"}}),
            "turn 4 done",
        ]
    )
    model = FunctionModel(lambda messages, tools: next(script))
    async with Storage(storage_url(backend, tmp_path)) as storage:
        agent = Agent(
            model,
            tools=shop.tools,
            approve=["refund"],
            on_tool_exception="fail",
            storage=storage,
        )
        thread = agent.thread(thread_id)
        assert (await thread.send("one")).text == "turn 1 done"
        waiting = await thread.send("two")
        [request] = waiting.approvals
        assert request.call_id == "call_0-2"
        assert (await thread.approve()).text == "turn 2 done"
        with pytest.raises(ToolExecutionError) as info:
            await thread.send("three")
        assert info.value.call_id == "call_0-4"
        assert (await thread.send("four")).text == "turn 4 done"

        messages = await thread.messages()
        ids = check_transcript(messages)
        assert ids == ["call_0", "call_0-2", "call_0-3", "call_0-4", "call_0-5"]
        results = {m["tool_call_id"]: m for m in messages if m["role"] == "tool"}
        assert results["call_0-3"]["content"] == "order A-2: shipped"
        assert results["call_0-4"]["status"] == "skipped"
        assert results["call_0-4"]["content"].startswith("Not run")
        calls = [c for m in messages for c in m.get("tool_calls") or ()]
        assert all(c.get("provider_id", c["id"]) == "call_0" for c in calls)
    assert shop.lookups == ["A-1", "A-2", "A-3"]
    assert shop.refunds == [90]
    assert all(n == 1 for n in shop.by_call.values())
    report(
        f"duplicate_ids_across_turns_{backend}",
        turns=4,
        calls=len(ids),
        unique_ids=len(set(ids)),
        run_twice=sum(n > 1 for n in shop.by_call.values()),
    )


def strict_json(raw: bytes) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"not JSON: {name}")

    return json.loads(raw, parse_constant=refuse)


@pytest.mark.parametrize("streamed", [False, True])
async def test_openai_wire_carries_the_providers_own_ids(
    streamed: bool, openai_server: oa.OpenAIServer, tmp_path: Path, thread_id: str
) -> None:
    """Over real HTTP: duplicate ids, a call without an id, and the same id again next
    turn. Each request carries back exactly the ids the server gave (and, for the call
    without one, the id we made up, in both places), while the saved thread's ids are
    unique."""
    openai_server.add(
        oa.tool_calls(
            ("lookup", {"order": "A-1"}),
            ("lookup", {"order": "A-2"}),
            ("lookup", {"order": "A-3"}),
            ids=["call_0", "call_0", None],
        ),
        oa.text("turn 1 done"),
        oa.tool_calls(("lookup", {"order": "A-4"}), ids=["call_0"]),
        oa.text("turn 2 done"),
    )
    shop = Shop()
    model = openai("m", base_url=openai_server.base_url, api_key="k")
    async with Storage(storage_url("sqlite", tmp_path)) as storage:
        thread = Agent(model, tools=shop.tools, storage=storage).thread(thread_id)
        for text in ("one", "two"):
            if streamed:
                stream = thread.stream(text)
                async for _ in stream:
                    pass
                await stream.reply()
            else:
                await thread.send(text)
        messages = await thread.messages()
    ids = check_transcript(messages)
    assert ids[:2] == ["call_0", "call_0-2"] and ids[3] == "call_0-3"
    made_up = ids[2]
    assert made_up.startswith("call_") and "provider_id" not in messages[1]["tool_calls"][2]
    assert shop.lookups == ["A-1", "A-2", "A-3", "A-4"]

    for raw in openai_server.raw:
        strict_json(raw)
    second, fourth = openai_server.requests[1], openai_server.requests[3]

    def wire(body: dict[str, Any]) -> tuple[list[list[str]], list[str]]:
        calls = [
            [c["id"] for c in m["tool_calls"]] for m in body["messages"] if m.get("tool_calls")
        ]
        answers = [m["tool_call_id"] for m in body["messages"] if m["role"] == "tool"]
        return calls, answers

    assert wire(second) == ([["call_0", "call_0", made_up]], ["call_0", "call_0", made_up])
    assert wire(fourth) == (
        [["call_0", "call_0", made_up], ["call_0"]],
        ["call_0", "call_0", made_up, "call_0"],
    )
    report(
        f"duplicate_ids_openai_wire_{'streamed' if streamed else 'sent'}",
        requests=len(openai_server.requests),
        calls=len(ids),
        wire_ids_kept=sum(len(c) for c in wire(fourth)[0]),
    )
