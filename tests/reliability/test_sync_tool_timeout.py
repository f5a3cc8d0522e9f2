"""A sync tool past its timeout (issue 15, item 13).

A sync tool runs in a worker thread, and Python cannot stop a thread. What the docs
promise, and this test pins: the model is told the call timed out and the run goes on;
the function keeps running in its worker thread until it returns by itself; its late
result is discarded, never saved or shown to the model; and the thread can be used
meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from criogen_graph import Agent, FakeReply, FunctionModel, Storage, ToolContext, tool
from tests.conftest import storage_url, wait_until
from tests.reliability._report import report

TIMEOUT = 0.2


async def test_a_sync_tool_past_its_timeout_runs_on_and_its_result_is_dropped(
    backend: str, tmp_path: Path, thread_id: str
) -> None:
    runs: Counter[str] = Counter()
    started = threading.Event()
    release = threading.Event()
    returned = threading.Event()
    shown: list[list[dict[str, Any]]] = []

    @tool(timeout_secs=TIMEOUT)
    def slow_export(ctx: ToolContext) -> str:
        """Export a report (blocks its worker thread)."""
        runs[ctx.call_id] += 1
        started.set()
        release.wait(60)
        returned.set()
        return "LATE RESULT"

    def model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        shown.append(messages)
        if messages[-1]["role"] == "user" and messages[-1]["content"] == "export":
            return FakeReply.tool_call("slow_export", {}, id="c1")
        return "done"

    try:
        async with Storage(storage_url(backend, tmp_path)) as storage:
            thread = Agent(FunctionModel(model), tools=[slow_export], storage=storage).thread(
                thread_id
            )
            reply = await asyncio.wait_for(thread.send("export"), 30)
            assert reply.text == "done"
            # The model was told it timed out, and the run went on.
            [result] = [m for m in shown[-1] if m["role"] == "tool"]
            assert (result["status"], result["content"]) == (
                "timeout",
                f"Error: the tool slow_export timed out after {TIMEOUT:g} s.",
            )
            # The function is still running in its worker thread.
            assert started.is_set() and not returned.is_set()
            # The thread is usable meanwhile.
            assert (await asyncio.wait_for(thread.send("anything else?"), 30)).text == "done"
            before = await thread.messages()

            release.set()
            await wait_until(returned.is_set, what="the sync tool to return by itself")
            assert (await asyncio.wait_for(thread.send("and now?"), 30)).text == "done"
            after = await thread.messages()
            # The late result is not saved: only the last send's messages were added.
            assert after[: len(before)] == before
            assert [m["role"] for m in after[len(before) :]] == ["user", "assistant"]
            audit = [r for r in await storage.audit(thread_id) if r["action"] == "tool_call"]
        assert "LATE RESULT" not in repr(shown) and "LATE RESULT" not in repr(after)
        assert [r["details"]["status"] for r in audit] == ["timeout"]
        assert runs == Counter({"c1": 1})
    finally:
        release.set()
    report(
        f"sync_tool_past_timeout_{backend}",
        tool_runs=sum(runs.values()),
        late_results_saved=0,
        sends_while_running=1,
    )
