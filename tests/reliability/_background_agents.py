"""The agent that background-run tests submit to and their worker subprocesses serve
(`criogen-graph worker --agent tests.reliability._background_agents:agent`).

Every tool appends a line to the ledger in $CRIOGEN_BG_WORKDIR:
`<event> <thread id> <call id> <idempotency key> <pid>`, so a test can count what ran,
in which process, in what order."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from criogen_graph import Agent, FakeReply, FunctionModel, Storage, ToolContext, tool


def workdir() -> Path:
    return Path(os.environ.get("CRIOGEN_BG_WORKDIR", "."))


def ledger(where: Path) -> list[list[str]]:
    path = where / "ledger"
    if not path.exists():
        return []
    return [line.split(" ") for line in path.read_text().splitlines()]


def _append(event: str, ctx: ToolContext) -> None:
    line = f"{event} {ctx.thread_id} {ctx.call_id} {ctx.idempotency_key} {os.getpid()}\n"
    # O_APPEND + fsync: a line is wholly in the file or not at all, even under SIGKILL.
    fd = os.open(workdir() / "ledger", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@tool
async def fast(ctx: ToolContext) -> str:
    """Finishes at once."""
    _append("fast", ctx)
    return "fast done"


@tool
async def slow(ctx: ToolContext) -> str:
    """Waits until the file `release` exists in the work directory."""
    _append("slow-started", ctx)
    # The release comes from the test process: a file is what both can see.
    while not (workdir() / "release").exists():  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    _append("slow", ctx)
    return "slow done"


@tool
async def mark(n: int, ctx: ToolContext) -> int:
    """Marks the start and end of step n (with a pause between, for overlaps to show)."""
    _append(f"start-{n}", ctx)
    await asyncio.sleep(0.05)
    _append(f"end-{n}", ctx)
    return n


@tool
async def block(ctx: ToolContext) -> str:
    """Blocks its worker's event loop for the seconds in $CRIOGEN_BG_BLOCK (a tool
    calling a synchronous client by mistake): no heartbeat goes out meanwhile."""
    _append("block-started", ctx)
    time.sleep(float(os.environ.get("CRIOGEN_BG_BLOCK", "3")))  # noqa: ASYNC251
    _append("block", ctx)
    return "blocked"


@tool
async def nap(ctx: ToolContext) -> str:
    """Sleeps 50 ms (the scale benchmark's tool)."""
    await asyncio.sleep(0.05)
    _append("nap", ctx)
    return "rested"


def _script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    last = messages[-1]
    if last["role"] != "user":
        return f"done: {messages[-1].get('content')}"
    text = str(last["content"])
    if text.startswith("kill"):
        return FakeReply.tool_calls(("fast", {}), ("slow", {}))
    if text.startswith("block"):
        return FakeReply.tool_call("block", {})
    if text.startswith("seq "):
        return FakeReply.tool_call("mark", {"n": int(text.split(" ")[1])})
    return FakeReply.tool_call("nap", {})


def make_agent(storage: Storage | str = "memory://") -> Agent[Any]:
    return Agent(
        FunctionModel(_script),
        tools=[fast, slow, mark, nap, block],
        storage=storage,
        name="bg-agent",
    )


def make_approver(storage: Storage | str = "memory://") -> Agent[Any]:
    """The same agent, but every `nap` waits for a person's approval."""
    return Agent(
        FunctionModel(_script),
        tools=[fast, slow, mark, nap, block],
        approve=["nap"],
        storage=storage,
        name="bg-approver",
    )


agent = make_agent()
approver = make_approver()


def _keyed() -> Agent[Any] | None:
    """The agent on an encrypted storage at $CRIOGEN_BG_KEYED_URL (key "bg-key"), for
    the CLI worker to take the key from."""
    url = os.environ.get("CRIOGEN_BG_KEYED_URL")
    return make_agent(Storage(url, encryption_key="bg-key")) if url else None


keyed_agent = _keyed()
