"""Agents and an auth callable for `criogen-graph serve` in tests/test_serve.py (imported
by the server subprocess as `tests.serve_agents:...`)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from criogen_graph import Agent, FakeReply, FunctionModel, tool

#: The streamed answer of the `chunky` agent, in the pieces it is written.
CHUNKS = [f"part {i}; " for i in range(40)]


@tool(timeout_secs=600)  # outlives the default tool timeout: runs are cancelled first
async def pause(seconds: float) -> str:
    """Wait (a long-running tool, for cancellation)."""
    await asyncio.sleep(seconds)
    return "waited"


def _slow(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    if messages[-1]["role"] == "user":
        return FakeReply.tool_call("pause", {"seconds": 300})
    return "finished waiting"


def _chunky(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    return FakeReply.text("".join(CHUNKS), chunks=CHUNKS)


slow = Agent(FunctionModel(_slow, name="slow"), tools=[pause], name="slow")
chunky = Agent(FunctionModel(_chunky, name="chunky"), name="chunky")


def bearer(headers: Mapping[str, str]) -> str | None:
    """The identity is the bearer token itself (tests only); no token refuses."""
    value = headers.get("authorization", "")
    if not value.startswith("Bearer ") or not value[7:].strip():
        return None
    return value[7:].strip()


#: The `flood` agent's answer: many pieces, so a client asking for the `messages` mode
#: (whose every `messages/partial` event carries the text so far) would be sent
#: FLOOD_PIECES * (FLOOD_PIECES + 1) / 2 * len(piece) bytes: about 250 MB.
FLOOD_PIECES = 1000
FLOOD = [f"{i:04d}" + "x" * 495 + " " for i in range(FLOOD_PIECES)]


def _flood(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    return FakeReply.text("".join(FLOOD), chunks=FLOOD)


flood = Agent(FunctionModel(_flood, name="flood"), name="flood")
