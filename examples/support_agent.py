"""A support agent with a gated tool, served in LangGraph Studio or run as a script.

It looks orders up with `get_order` (read-only, runs at once) and refunds them with
`refund`, which waits for a person's approval (a LangGraph interrupt). `graph` is the
compiled LangGraph graph that `langgraph.json` exposes to `langgraph dev`; in Studio,
answer the approval with a JSON resume value: `"approve"`, `{"type": "reject",
"message": "..."}`, or `{"<call_id>": {"type": "edit", "args": {...}}}`.

Offline by default: a scripted model decides each reply from the transcript alone, so
every Studio thread works without a key. Set `CRIOGEN_EXAMPLE_MODEL=openai:gpt-5-mini`
(or any "provider:model") to talk to a real provider instead.

    python examples/support_agent.py   # one thread through an approval, on a temp SQLite file
"""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from criogen_graph import Agent, FakeReply, FunctionModel, ToolError, tool

ORDERS: dict[str, dict[str, Any]] = {
    "A-1": {"id": "A-1", "status": "delivered", "total": 42.0},
    "A-2": {"id": "A-2", "status": "shipped", "total": 15.5},
}
_ORDER_ID = re.compile(r"\b[A-Z]-\d+\b")


@tool(read_only=True)
async def get_order(order_id: str) -> dict[str, Any]:
    """Look up an order by its id.

    Args:
        order_id: The order id, like "A-1".
    """
    order = ORDERS.get(order_id)
    if order is None:
        raise ToolError(f"No order {order_id}")
    return order


@tool
async def refund(order_id: str, reason: str) -> str:
    """Refund an order in full. A person approves every refund before it runs.

    Args:
        order_id: The order to refund.
        reason: Why the customer wants a refund.
    """
    return f"refunded {order_id} ({reason})"


def scripted(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    """The offline model: each reply follows from the transcript (no hidden state), so
    any number of threads, resumes and restarts work."""
    last = messages[-1]
    asked = next(m for m in reversed(messages) if m["role"] == "user")
    text = str(asked.get("content") or "")
    found = _ORDER_ID.search(text)
    if last["role"] == "user":
        if found is None:
            return "Which order is it about? Give me its id, like A-1."
        return FakeReply.tool_call("get_order", {"order_id": found.group()})
    if last.get("name") == "get_order":
        if last["status"] != "ok":
            return f"I could not find that order ({last['content']})."
        if "refund" in text.lower() and found is not None:
            return FakeReply.tool_call(
                "refund",
                {"order_id": found.group(), "reason": "requested by the customer"},
                text=f"Order {found.group()} is on file; I will refund it.",
            )
        return f"Here is the order: {last['content']}"
    if last.get("status") == "rejected":
        return "The refund was not approved; a colleague will follow up."
    return f"Done: {last['content']}."


def build_agent(storage: str | None = None) -> Agent[Any]:
    """The support agent (`storage=None`: threads in memory; Studio brings its own)."""
    model = os.environ.get("CRIOGEN_EXAMPLE_MODEL") or FunctionModel(scripted, name="scripted")
    return Agent(
        model,
        instructions="You are a support agent. Look orders up before acting on them.",
        tools=[get_order, refund],
        approve=["refund"],
        storage=storage,
        name="support",
    )


agent = build_agent()
graph = agent.graph


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        support = build_agent(f"sqlite:///{Path(tmp) / 'support.db'}")
        thread = support.thread("ticket-1", actor="reviewer")
        reply = await thread.send("Order A-1 arrived damaged. Please refund it.")
        for request in reply.approvals:
            print(f"waiting for approval: {request.tool}({request.args})")
        if reply.needs_approval:
            reply = await thread.approve(expected=reply)  # only what was shown
        print(f"answer: {reply.text}")
        print(f"tool calls: {reply.tool_calls}, checkpoints: {len(await thread.history())}")
        await support.storage.close()


if __name__ == "__main__":
    asyncio.run(main())
