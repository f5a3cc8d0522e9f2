"""The README's demo: a support agent on the embedded SQLite storage, with tools, an
approval gate, and a thread that is answered after a restart (in a second process)."""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from criogen_graph.agent import Agent
from criogen_graph.errors import ToolError
from criogen_graph.messages import Message
from criogen_graph.models.testing import FakeReply, FunctionModel
from criogen_graph.storage import Storage
from criogen_graph.tools import tool

ORDERS = {"A-1": {"id": "A-1", "status": "delivered", "total": 42.0}}


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


def scripted_model() -> FunctionModel:
    """What the demo plays without a provider key: the reply depends only on the
    transcript, so a restarted process picks the conversation up where it stopped."""

    def support(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        last = messages[-1]
        if last["role"] == "user":
            return FakeReply.tool_call("get_order", {"order_id": "A-1"})
        if last.get("name") == "get_order":
            return FakeReply.tool_call(
                "refund",
                {"order_id": "A-1", "reason": "arrived damaged"},
                text="Order A-1 was delivered; I will refund it.",
            )
        if last.get("status") == "rejected":
            return "The refund was not approved; a colleague will follow up."
        return "Done: order A-1 is refunded. Sorry about the damage!"

    return FunctionModel(support, name="scripted-support")


#: Provider models the demo uses when their key is set (first found wins).
REAL_MODELS = (
    ("OPENAI_API_KEY", "openai:gpt-5-mini"),
    ("ANTHROPIC_API_KEY", "anthropic:claude-sonnet-4-5"),
    ("GEMINI_API_KEY", "gemini:gemini-2.5-flash"),
    ("OPENROUTER_API_KEY", "openrouter:openai/gpt-5-mini"),
)


def demo_model() -> Any:
    """`CRIOGEN_DEMO_MODEL` if set (a "provider:model" string, or "scripted"), else a
    provider whose key is in the environment (or in a .env file), else the scripted
    model."""
    import os

    from criogen_graph.env import load_env

    load_env()
    chosen = os.environ.get("CRIOGEN_DEMO_MODEL")
    if chosen == "scripted":
        return scripted_model()
    if chosen:
        return chosen
    for env, model in REAL_MODELS:
        if os.environ.get(env):
            return model
    return scripted_model()


def build_agent(storage: Storage | str, model: Any = None) -> Agent[Any]:
    return Agent(
        model if model is not None else demo_model(),
        instructions="You are a support agent. Look orders up before acting on them.",
        tools=[get_order, refund],
        approve=["refund"],
        storage=storage,
        name="support",
    )


def show(out: Any, messages: list[Message]) -> None:
    for m in messages:
        if m["role"] in ("user", "assistant") and m.get("content"):
            out(f"  {m['role']}: {m['content']}")
        if m["role"] == "assistant":
            for c in m.get("tool_calls") or ():
                out(f"  model calls {c['name']}({json.dumps(c['args'])})")
        elif m["role"] == "tool":
            out(f"  {m['name']} -> [{m['status']}] {m['content']}")


async def run_demo(db: Path, out: Any = print) -> int:
    """First process: start the conversation; it stops for approval. Then a second
    process answers it from storage."""
    thread_id = f"demo-{int(time.time() * 1000)}"
    storage = Storage(f"sqlite:///{db}")
    agent = build_agent(storage)
    out(f"== process 1 (pid {_pid()}): {agent!r} on {db}")
    reply = await agent.thread(thread_id, actor="customer").send(
        "Order A-1 arrived damaged. Please refund it."
    )
    show(out, reply.messages)
    for r in reply.approvals:
        out(f"  waiting for approval: {r.tool}({json.dumps(r.args)})")
    out(f"  saved as version {reply.version}; process 1 exits")
    await storage.close()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "criogen_graph", "demo", "--db", str(db), "--resume", thread_id
    )
    code = await proc.wait()
    if code == 0:
        out("\nInspect the thread it made (its messages, then who did what):")
        for command in inspect_commands(db, thread_id):
            out(f"  {command}")
    return code


def inspect_commands(db: Path, thread_id: str) -> list[str]:
    """The `threads show` and `threads audit` commands for the demo's thread, runnable
    from the current directory: the storage URL is explicit because the demo's file is
    not the CLI's default `criogen.db`."""
    cli = _cli_command()
    storage = shlex.quote(f"sqlite:///{db}")
    return [
        f"{cli} threads --storage {storage} show {thread_id}",
        f"{cli} threads --storage {storage} audit {thread_id}",
    ]


def _cli_command() -> str:
    """How to run the CLI from the current directory with this interpreter: the
    `criogen-graph` script installed beside it (a relative path such as
    `.venv/bin/criogen-graph` when it is under the current directory), else
    `python -m criogen_graph`."""
    script = Path(sys.executable).parent / "criogen-graph"
    if script.is_file():
        try:
            return shlex.quote(str(script.relative_to(Path.cwd())))
        except ValueError:
            return shlex.quote(str(script))
    return f"{shlex.quote(sys.executable)} -m criogen_graph"


async def resume_demo(db: Path, thread_id: str, out: Any = print) -> int:
    """Second process: read the pending approval from storage and approve it."""
    async with Storage(f"sqlite:///{db}") as storage:
        agent = build_agent(storage)
        thread = agent.thread(thread_id, actor="reviewer")
        out(f"== process 2 (pid {_pid()}): a fresh agent on the same file")
        pending = await thread.pending_approvals()
        if not pending:
            # A real model may answer without asking for the refund.
            out("  nothing is waiting for approval")
            out(f"  final answer: {(await thread.messages())[-1].get('content')}")
        for r in pending:
            out(f"  found pending {r.tool}({json.dumps(r.args)}); approving it")
        if pending:
            before = len(await thread.messages())
            # Pinned to what was shown: if the thread moved on meanwhile, this raises
            # ValidationError(code="stale") instead of approving something else.
            reply = await thread.approve(expected=pending)
            show(out, reply.messages[before:])
            out(f"  final answer: {reply.text}")
            out(f"  tool calls: {reply.tool_calls}, version {reply.version}")
        out("  audit trail:")
        for a in await storage.audit(thread_id):
            detail = a["details"].get("tool") or a["details"].get("input") or ""
            out(f"    {a['action']:<10} by {a['actor']:<9} {detail}")
    return 0


def _pid() -> int:
    import os

    return os.getpid()
