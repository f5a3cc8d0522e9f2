"""Agents shared by the tests and the worker subprocesses (same tools, same script)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from criogen_graph import Agent, FakeReply, FunctionModel, Storage, ToolContext, tool


def ledger_lines(workdir: Path) -> list[str]:
    path = workdir / "ledger"
    return path.read_text().splitlines() if path.exists() else []


def _append(workdir: Path, line: str) -> None:
    with open(workdir / "ledger", "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def tools_agent(storage: Storage | str, workdir: Path, **kw: Any) -> Agent[Any]:
    """The model calls `fast` and `slow` in one reply, then answers "done".

    `fast` appends to the ledger. `slow` appends "slow-started", then waits until the
    file `release` exists (or forever), then appends its own entry."""

    @tool
    async def fast(ctx: ToolContext) -> str:
        """Finishes at once."""
        _append(workdir, f"fast {ctx.call_id}")
        return "fast done"

    @tool
    async def slow(ctx: ToolContext) -> str:
        """Waits for the release file."""
        _append(workdir, f"slow-started {ctx.call_id}")
        # The release comes from another process: a file is what both can see.
        while not (workdir / "release").exists():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        _append(workdir, f"slow {ctx.call_id}")
        return "slow done"

    def script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if messages[-1]["role"] == "user":
            return FakeReply.tool_calls(("fast", {}), ("slow", {}))
        return "done"

    return Agent(FunctionModel(script), tools=[fast, slow], storage=storage, **kw)


def approval_agent(storage: Storage | str, workdir: Path, **kw: Any) -> Agent[Any]:
    """The model asks to refund (gated) and look up (not gated) in one reply."""

    @tool
    async def refund(order_id: str) -> str:
        """Refund an order."""
        _append(workdir, f"refund {order_id}")
        return f"refunded {order_id}"

    @tool
    async def lookup(order_id: str) -> str:
        """Look an order up."""
        _append(workdir, f"lookup {order_id}")
        return f"{order_id} shipped"

    def script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if messages[-1]["role"] == "user":
            return FakeReply.tool_calls(
                ("refund", {"order_id": "A-1"}), ("lookup", {"order_id": "A-1"})
            )
        return "handled"

    return Agent(
        FunctionModel(script), tools=[refund, lookup], approve=["refund"], storage=storage, **kw
    )
