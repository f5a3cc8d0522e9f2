"""A `runs.wait` request cancelled at every event-loop iteration after its payment tool
returned (a server shutting down, a client gone): `serve` adds a shorter wait path (its
answer taken from the run's own end values, the approval check left to the thread), so the
guarantee of `thread.send` is checked through HTTP as well: whatever iteration the
cancellation lands on, the finished payment is saved, `retry()` never pays again, and the
thread is left free for the next request.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from criogen_graph import Agent, Storage
from tests.reliability.test_cancel_after_tool import Bank, _finish, _model

pytest.importorskip("starlette")

#: Event-loop iterations after the tool's return at which the cancellation lands.
K = 30


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_cancelled_wait_never_pays_twice_and_leaves_the_thread_free(
    backend: str, tmp_path: Path, pg_schema_url: str
) -> None:
    from criogen_graph.serve import create_app

    url = f"sqlite:///{tmp_path / 'threads.db'}" if backend == "sqlite" else pg_schema_url
    storage = Storage(url)
    bank = Bank()
    agent = Agent(_model(), tools=[bank.tool], storage=storage, name="bank")
    app = create_app([agent], storage=storage)
    transport = httpx.ASGITransport(app=app)
    cancelled = 0
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://app") as http,
        ):
            for k in range(K + 1):
                thread_id = f"t-{k}"
                assert (await http.post("/threads", json={"thread_id": thread_id})).is_success
                body: dict[str, Any] = {
                    "assistant_id": "bank",
                    "input": {"messages": [{"role": "user", "content": "pay 50"}]},
                }
                task = asyncio.ensure_future(
                    http.post(f"/threads/{thread_id}/runs/wait", json=body)
                )
                bank.victim, bank.k = task, k
                try:
                    await task
                except asyncio.CancelledError:
                    cancelled += 1
                bank.victim = None
                # Whatever the run did after the cancellation, it ends: join each run.
                for run in (await http.get(f"/threads/{thread_id}/runs")).json():
                    await http.get(f"/threads/{thread_id}/runs/{run['run_id']}/join")
                thread = agent.thread(thread_id)
                await _finish(thread)
                messages = await thread.messages()
                assert messages[-1]["content"] == "Paid.", (k, messages[-1])
                tools = [m for m in messages if m["role"] == "tool"]
                assert len(tools) == 1 and tools[0]["status"] == "ok", (k, tools)
                # The thread is free: the next request runs at once, and pays its own call.
                again = await http.post(f"/threads/{thread_id}/runs/wait", json=body)
                assert again.status_code == 200, (k, again.text)
    finally:
        await storage.close()
    assert all(n == 1 for n in bank.paid.values()), f"paid again after a cancel: {bank.paid}"
    assert len(bank.paid) == 2 * (K + 1)
    assert cancelled >= 3, cancelled
