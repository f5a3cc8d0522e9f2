"""Graphs that fail on purpose, served by tests/test_server_errors.py through the real
`langgraph dev` server (tests/server_errors/langgraph.json): one of our errors from a
hook, one from a tool, and an exception of no library of ours."""

from __future__ import annotations

from typing import Any

from criogen_graph import Agent, FakeReply, FunctionModel, Hook, tool

HOOK_MESSAGE = "the budget service is down"


class Budget(Hook):
    """A `before_model` hook that raises: the run fails with `HookFailedError`."""

    def before_model(self, ctx: Any) -> None:
        raise ConnectionError(HOOK_MESSAGE)


@tool
def charge(order_id: str) -> str:
    """Charge an order."""
    raise PermissionError(f"card declined for {order_id}")


def call_charge(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    """Asks for `charge` once, then answers."""
    if messages[-1]["role"] == "user":
        return FakeReply.tool_call("charge", {"order_id": "A-1"})
    return "charged"


def crash(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    """A model function with a bug of its own (no library error)."""
    return {"ratio": 1 / 0}


hook = Agent(FunctionModel(lambda m, t: "hi"), hooks=[Budget()], name="hook").graph
tool_fails = Agent(
    FunctionModel(call_charge), tools=[charge], on_tool_exception="fail", name="tool_fails"
).graph
plain = Agent(FunctionModel(crash), name="plain").graph
