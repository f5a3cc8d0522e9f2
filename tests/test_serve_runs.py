"""`criogen-graph serve`'s run records as clients see them, with fewer storage round
trips per run: a `wait` answered from the run's own end (no state read after it), a
message to a thread waiting for approval refused by the thread itself (no state read
before it) and leaving no run behind, a `wait`'s record saved once on SQLite (this
process answers for it from memory until it ends) and while it runs on PostgreSQL, and
`runs.list` telling this process's runs as they are now. Real server processes on SQLite
and PostgreSQL, through `langgraph_sdk`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from criogen_graph import Storage
from criogen_graph.serve._records import Records
from tests.conftest import PG_URL, require_postgres, wait_until
from tests.serve_agents import CHUNKS
from tests.test_serve import REFUND, Server, _client, serve

pytest.importorskip("langgraph_sdk")
pytest.importorskip("starlette")

SLOW = {"messages": [{"role": "user", "content": "wait"}]}


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("serve-runs")
    if request.param == "postgres":
        require_postgres()
        storage = PG_URL
    else:
        storage = f"sqlite:///{workdir / 'threads.db'}"
    with serve(storage, workdir) as running:
        yield running


@pytest.fixture
async def client(server: Server) -> AsyncIterator[Any]:
    c = _client(server.url)
    try:
        yield c
    finally:
        await c.aclose()


async def _saved(server: Server, thread_id: str, run_id: str) -> dict[str, Any] | None:
    """The run's record as saved in the storage (read by this test process)."""
    async with Storage(server.storage) as storage:
        return await Records(storage).run(thread_id, run_id)


async def test_a_wait_answers_the_state_the_run_saved(client: Any) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    out = await client.runs.wait(
        thread_id, "support", input={"messages": [{"role": "user", "content": REFUND}]}
    )
    state = await client.threads.get_state(thread_id)
    interrupts = out.pop("__interrupt__")
    assert out == state["values"]
    assert [i["id"] for i in interrupts] == [i["id"] for i in state["interrupts"]]
    assert interrupts[0]["value"]["requests"][0]["tool"] == "refund"


async def test_a_message_to_a_thread_waiting_for_approval_is_refused_and_leaves_no_run(
    client: Any,
) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    message = {"messages": [{"role": "user", "content": REFUND}]}
    await client.runs.wait(thread_id, "support", input=message)
    before = [r["run_id"] for r in await client.runs.list(thread_id)]
    assert len(before) == 1

    with pytest.raises(httpx.HTTPStatusError) as refused:
        await client.runs.wait(thread_id, "support", input=message)
    assert refused.value.response.status_code == 409
    detail = refused.value.response.json()["detail"]
    assert "waits for approval" in detail and "command={'resume': ...}" in detail

    assert [r["run_id"] for r in await client.runs.list(thread_id)] == before
    state = await client.threads.get_state(thread_id)
    assert state["next"] == ["approval"]
    assert [m["role"] for m in state["values"]["messages"]] == [
        "user",
        "assistant",
        "tool",
        "assistant",
    ]


async def test_runs_list_tells_a_running_run_as_running(client: Any) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    run = await client.runs.create(thread_id, "slow", input=SLOW)

    async def listed() -> list[str]:
        return [str(r["status"]) for r in await client.runs.list(thread_id)]

    await wait_until(lambda: _equals(listed, ["running"]), what="the run listed as running")
    await client.runs.cancel(thread_id, run["run_id"], wait=True)
    assert await listed() == ["interrupted"]


async def test_a_wait_is_listed_while_it_runs_and_saved_as_it_ended(
    client: Any, server: Server
) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    waiting = asyncio.ensure_future(client.runs.wait(thread_id, "slow", input=SLOW))
    try:

        async def running() -> list[dict[str, Any]]:
            runs = await client.runs.list(thread_id)
            return runs if [r["status"] for r in runs] == ["running"] else []

        (run,) = await wait_until(running, what="the waited run listed as running")
        assert (await client.runs.get(thread_id, run["run_id"]))["status"] == "running"
        await client.runs.cancel(thread_id, run["run_id"], wait=True)
        with pytest.raises(httpx.HTTPStatusError) as refused:
            await waiting
        assert refused.value.response.status_code == 409
        assert "was cancelled" in refused.value.response.json()["detail"]
    finally:
        waiting.cancel()

    saved = await _saved(server, thread_id, run["run_id"])
    assert saved is not None and saved["status"] == "interrupted"
    assert [r["status"] for r in await client.runs.list(thread_id)] == ["interrupted"]
    # The thread's record names the assistant of its first run (saved with it).
    async with Storage(server.storage) as storage:
        thread = await Records(storage).thread(thread_id)
    assert thread is not None and thread["assistant_id"] == "slow"


async def _equals(read: Any, wanted: Any) -> bool:
    return bool(await read() == wanted)


async def test_a_waited_run_is_followed_from_another_server_with_every_event(
    server: Server, client: Any, tmp_path: Path
) -> None:
    if not server.storage.startswith("postgres"):
        pytest.skip("one serve process per SQLite storage")
    thread_id = (await client.threads.create())["thread_id"]
    out = await client.runs.wait(thread_id, "chunky", input={"messages": ["go"]})
    assert out["messages"][-1]["content"] == "".join(CHUNKS)
    (run,) = await client.runs.list(thread_id)
    modes = ["values", "updates", "messages-tuple", "custom"]

    async def followed(c: Any) -> list[tuple[str | None, str, Any]]:
        stream = c.runs.join_stream(thread_id, run["run_id"], stream_mode=modes)
        return [(p.id, p.event, p.data) async for p in stream]

    here = await followed(client)
    with serve(server.storage, tmp_path) as other:
        b = _client(other.url)
        try:
            there = await followed(b)
        finally:
            await b.aclose()
    # The other server tells the same events, with the same ids, as the one that ran it.
    assert there == here
    assert there[0][1] == "metadata" and there[0][0] == "1"
    texts = [d["text"] for _, e, d in there if e == "custom" and d["type"] == "text"]
    assert texts == CHUNKS
    assert there[-1][1] == "values" and there[-1][2] == out
