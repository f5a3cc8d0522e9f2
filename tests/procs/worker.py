"""A worker process for cross-process tests: `python -m tests.procs.worker SCENARIO URL
THREAD WORKDIR`. Prints one JSON line with what it saw."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from criogen_graph import CriogenError, Storage
from tests.procs.agents import approval_agent, tools_agent


async def main(scenario: str, url: str, thread_id: str, workdir: Path) -> None:
    storage = Storage(url)
    out: dict[str, object] = {}
    try:
        if scenario in ("send_tools", "retry_tools"):
            agent = tools_agent(storage, workdir)
            thread = agent.thread(thread_id, actor=f"worker-{scenario}")
            reply = await (thread.send("go") if scenario == "send_tools" else thread.retry())
            out = {"text": reply.text, "tool_calls": reply.tool_calls, "version": reply.version}
        elif scenario == "send_approval":
            agent = approval_agent(storage, workdir)
            reply = await agent.thread(thread_id, actor="worker").send("refund A-1")
            out = {
                "needs_approval": reply.needs_approval,
                "approvals": [a.call_id for a in reply.approvals],
            }
        elif scenario == "approve":
            agent = approval_agent(storage, workdir)
            thread = agent.thread(thread_id, actor="reviewer")
            pending = await thread.pending_approvals()
            reply = await thread.approve()
            out = {"pending": [p.tool for p in pending], "text": reply.text}
        else:
            raise SystemExit(f"unknown scenario {scenario}")
    except CriogenError as exc:
        out = {"error": type(exc).__name__, "message": str(exc)}
    finally:
        await storage.close()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])))
