"""The README's demo: a support agent with tools and an approval gate."""

from __future__ import annotations

import json
from typing import Any

from criogen_graph.adapters.models.fake import FakeModel, FakeReply
from criogen_graph.agent import Agent
from criogen_graph.errors import ToolError
from criogen_graph.tools import tool

ORDERS = {"A-1": {"id": "A-1", "status": "shipped", "total": 42.0}}


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
    """Refund an order in full.

    Args:
        order_id: The order to refund.
        reason: Why the customer wants a refund.
    """
    return f"refunded {order_id} ({reason})"


def scripted_model() -> FakeModel:
    """The conversation the demo plays when no provider key is set."""
    return FakeModel(
        [
            FakeReply.tool_call("get_order", {"order_id": "A-1"}),
            FakeReply.tool_call(
                "refund",
                {"order_id": "A-1", "reason": "arrived damaged"},
                text="Order A-1 shipped; I will refund it.",
            ),
        ],
        name="scripted-support",
    )


def build_agent(model: Any = None) -> Agent[Any]:
    return Agent(
        model if model is not None else scripted_model(),
        instructions="You are a support agent. Look orders up before acting on them.",
        tools=[get_order, refund],
        approve=["refund"],
        name="support",
    )


async def run_demo(out: Any = print) -> int:
    agent = build_agent()
    out(f"agent: {agent!r}")
    result = await agent.run("Order A-1 arrived damaged. Please refund it.")
    for m in result.messages:
        if m["role"] in ("user", "assistant") and m.get("content"):
            out(f"  {m['role']}: {m['content']}")
        if m["role"] == "assistant":
            for c in m.get("tool_calls") or ():
                out(f"  model calls {c['name']}({json.dumps(c['args'])})")
        elif m["role"] == "tool":
            out(f"  {m['name']} -> [{m['status']}] {m['content']}")
    if result.needs_approval:
        for r in result.approvals:
            out(f"  waiting for approval: {r.tool}({json.dumps(r.args)}) call_id={r.call_id}")
    out(
        f"model calls: {result.model_calls}, tool calls: {result.tool_calls}, "
        f"usage: {result.usage['input_tokens']}+{result.usage['output_tokens']} tokens, "
        f"{result.duration_ms:.1f} ms"
    )
    return 0
