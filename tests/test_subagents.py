"""Agents used as tools: their approvals surface on the caller's thread and are answered
there; they run as subgraphs of the caller's run, checkpointed in its thread."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from criogen_graph import (
    Agent,
    Decision,
    FakeReply,
    FunctionModel,
    Storage,
    ToolExecutionError,
    ValidationError,
    tool,
)
from tests.conftest import storage_url


def agents(storage: Any, ledger: list[str], **lead_kw: Any) -> tuple[Agent[Any], Agent[Any]]:
    @tool
    async def refund(order_id: str, amount: int = 100) -> str:
        """Refund an order."""
        ledger.append(f"refund {order_id} {amount}")
        return f"refunded {order_id} ({amount})"

    def clerk_script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if messages[-1]["role"] == "user":
            return FakeReply.tool_call(
                "refund", {"order_id": "A-1"}, usage={"input_tokens": 10, "output_tokens": 1}
            )
        return FakeReply.text(
            f"clerk: {messages[-1]['content']}", usage={"input_tokens": 20, "output_tokens": 2}
        )

    def lead_script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if messages[-1]["role"] == "user":
            return FakeReply.tool_call(
                "clerk", {"input": "refund A-1"}, usage={"input_tokens": 1, "output_tokens": 1}
            )
        return FakeReply.text(
            f"lead: {messages[-1]['content']}", usage={"input_tokens": 2, "output_tokens": 2}
        )

    clerk = Agent(FunctionModel(clerk_script), tools=[refund], approve=["refund"], name="clerk")
    lead = Agent(
        FunctionModel(lead_script),
        tools=[clerk.as_tool("clerk", "Does refunds.")],
        storage=storage,
        name="lead",
        **lead_kw,
    )
    return lead, clerk


async def test_sub_agent_approval_surfaces_and_is_answered_on_the_parent_thread(
    storage: Storage, thread_id: str
) -> None:
    ledger: list[str] = []
    lead, _ = agents(storage, ledger)
    thread = lead.thread(thread_id, actor="ada")
    reply = await thread.send("refund A-1 please")
    assert reply.needs_approval and reply.stop_reason is None
    ((request),) = reply.approvals
    assert (request.tool, request.args) == ("refund", {"order_id": "A-1"})
    assert [p.call_id for p in await thread.pending_approvals()] == [request.call_id]
    assert ledger == []
    done = await thread.approve()
    assert ledger == ["refund A-1 100"]
    assert done.text == "lead: clerk: refunded A-1 (100)"
    # the sub-agent's usage adds to the caller's: lead 1+2 in, clerk 10+20 in
    assert done.usage["input_tokens"] == 33 and done.usage["output_tokens"] == 6
    approve = next(a for a in await storage.audit(thread_id) if a["action"] == "approve")
    assert approve["actor"] == "ada" and approve["details"]["decisions"][0]["tool"] == "refund"


async def test_edits_are_checked_against_the_sub_agents_tool(
    storage: Storage, thread_id: str
) -> None:
    ledger: list[str] = []
    lead, _ = agents(storage, ledger)
    thread = lead.thread(thread_id)
    reply = await thread.send("refund A-1 please")
    call_id = reply.approvals[0].call_id
    with pytest.raises(ValidationError, match="do not fit 'refund'"):
        await thread.decide({call_id: Decision.edit({"order_id": "A-1", "amount": "lots"})})
    assert ledger == [] and len(await thread.pending_approvals()) == 1
    done = await thread.decide({call_id: Decision.edit({"order_id": "A-1", "amount": 40})})
    assert ledger == ["refund A-1 40"] and done.text.startswith("lead: clerk: ")


async def test_rejected_in_the_sub_agent(storage: Storage, thread_id: str) -> None:
    ledger: list[str] = []
    lead, _ = agents(storage, ledger)
    thread = lead.thread(thread_id)
    await thread.send("refund A-1 please")
    done = await thread.reject("needs a manager")
    assert ledger == []
    assert done.text.startswith(
        "lead: clerk: A reviewer rejected this call to refund: needs a manager."
    )


async def test_answered_after_a_restart(
    durable_backend: str, tmp_path: Path, thread_id: str
) -> None:
    url = storage_url(durable_backend, tmp_path)
    ledger: list[str] = []
    first = Storage(url)
    lead, _ = agents(first, ledger)
    assert (await lead.thread(thread_id).send("refund A-1 please")).needs_approval
    await first.close()
    again = Storage(url)
    lead2, _ = agents(again, ledger)  # new objects, as in a new process
    done = await lead2.thread(thread_id).approve()
    assert done.text == "lead: clerk: refunded A-1 (100)" and ledger == ["refund A-1 100"]
    await again.close()


async def test_run_without_a_thread_reports_the_sub_agents_approval() -> None:
    lead, _ = agents("memory://", [])
    result = await lead.run("refund A-1")
    assert result.needs_approval and [a.tool for a in result.approvals] == ["refund"]


async def test_retry_resumes_the_sub_agent_without_rerunning_its_finished_calls(
    storage: Storage, thread_id: str
) -> None:
    runs = {"lookup": 0, "flaky": 0}

    @tool
    async def lookup() -> str:
        """Finishes."""
        runs["lookup"] += 1
        return "looked up"

    @tool
    async def flaky() -> str:
        """Fails once."""
        runs["flaky"] += 1
        if runs["flaky"] == 1:
            raise RuntimeError("flaky")
        return "fine"

    def worker_script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        return (
            FakeReply.tool_calls(("lookup", {}), ("flaky", {}))
            if messages[-1]["role"] == "user"
            else "worker done"
        )

    def boss_script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        return (
            FakeReply.tool_call("worker", {"input": "do it"})
            if messages[-1]["role"] == "user"
            else "boss done"
        )

    worker = Agent(
        FunctionModel(worker_script), tools=[lookup, flaky], on_tool_exception="fail", name="worker"
    )
    boss = Agent(
        FunctionModel(boss_script),
        tools=[worker.as_tool("worker", "Works.")],
        storage=storage,
        on_tool_exception="fail",
        name="boss",
    )
    thread = boss.thread(thread_id)
    with pytest.raises(ToolExecutionError):
        await thread.send("go")
    reply = await thread.retry()
    assert reply.text == "boss done"
    assert runs == {"lookup": 1, "flaky": 2}
