"""Typical user code, checked by `mypy --strict` in tests/test_typing.py: what users write
must type-check without annotations, and the revealed types must be the useful ones."""

import asyncio
from typing import reveal_type

from pydantic import BaseModel

from criogen_graph import Agent, FakeModel, FakeReply, Hook, HookContext, ToolError, tool
from criogen_graph.middleware import ModelCall, ModelHandler, model_middleware
from criogen_graph.models.base import ModelResponse


@tool
async def get_order(order_id: str) -> dict[str, str]:
    """Look up an order by id."""
    if order_id != "A-1":
        raise ToolError(f"No order {order_id}")
    return {"id": order_id, "status": "shipped"}


class Invoice(BaseModel):
    number: str
    total: float


class Audit(Hook):
    def before_model(self, ctx: HookContext) -> None:
        print(ctx.model_calls)


@model_middleware
async def logged(call: ModelCall, handler: ModelHandler) -> ModelResponse:
    print(call.model.name, call.thread_id)
    return await handler(call)


async def main() -> None:
    agent = Agent(
        FakeModel([FakeReply.tool_call("get_order", {"order_id": "A-1"}), "It shipped."]),
        instructions="You answer questions about orders.",
        tools=[get_order],
        hooks=[Audit()],
        middleware=[logged],
    )
    reveal_type(agent)  # R: Agent[str]
    result = await agent.run("Where is order A-1?")
    reveal_type(result.text)  # R: str | None
    reveal_type(result.output)  # R: str | None

    invoices = Agent(FakeModel(['{"number": "7", "total": 3.5}']), output=Invoice)
    reveal_type(invoices)  # R: Agent[Invoice]
    typed = await invoices.run("invoice please")
    reveal_type(typed.output)  # R: Invoice | None
    if typed.output is not None:
        print(typed.output.total + 1)

    thread = invoices.thread("customer-1")
    reveal_type(thread)  # R: Thread[Invoice]
    reply = await thread.send("hi")
    reveal_type(reply.output)  # R: Invoice | None
    if reply.needs_approval:
        done = await thread.approve(expected=reply)
        reveal_type(done)  # R: Reply[Invoice]
        decided = await thread.decide({a.call_id: "reject" for a in reply.approvals})
        print(decided.text)
    async with thread.stream("more") as stream:
        async for event in stream:
            print(event.type)
    streamed = await stream.reply()
    reveal_type(streamed)  # R: Reply[Invoice]


asyncio.run(main())
