"""The README's first example: an agent with one tool, run once (nothing saved).

    python examples/quickstart.py

Offline it plays a scripted `FakeModel`; pass a `"provider:model"` string instead (e.g.
`Agent("openai:gpt-5-mini", ...)` with `OPENAI_API_KEY` set) for a real model.
"""

import asyncio

from criogen_graph import Agent, FakeModel, FakeReply, ToolError, tool


@tool
async def get_order(order_id: str) -> dict[str, str]:
    """Look up an order by id."""  # docstring -> tool description
    if order_id != "A-1":
        raise ToolError(f"No order {order_id}")  # the model sees this; the run goes on
    return {"id": order_id, "status": "shipped"}


agent = Agent(
    FakeModel([FakeReply.tool_call("get_order", {"order_id": "A-1"}), "It shipped."]),
    instructions="You answer questions about orders.",
    tools=[get_order],
)

if __name__ == "__main__":
    result = asyncio.run(agent.run("Where is order A-1?"))
    print(result.text, result.tool_calls, result.usage)
