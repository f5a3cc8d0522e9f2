"""`criogen-graph serve` under the load the issue lists as bad input: a client that never
reads its stream, and many idle SSE connections at once. One real server process on
SQLite, raw sockets and `langgraph_sdk` as the clients: the server's memory stays bounded
(back-pressure: a stream waits for its reader, it is not buffered), nothing of the run is
lost, and another user's run on the same server finishes normally. The idle streams
also follow a run a worker executes, through another server (PostgreSQL). The heavy
version (10,000 idle connections) is bench/bench_idle_streams.py."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tests.conftest import wait_until
from tests.serve_agents import CHUNKS, FLOOD, FLOOD_PIECES
from tests.serve_load import (
    close_all,
    never_reading_stream,
    open_idle_streams,
    raise_nofile,
    read_to_end,
    rss_bytes,
)

pytest.importorskip("langgraph_sdk")
pytest.importorskip("starlette")

from tests.test_serve import Server, _client, serve

if TYPE_CHECKING:
    from tests.test_serve_workers import Cluster

AGENTS = ("tests.serve_agents:flood", "tests.serve_agents:chunky", "tests.serve_agents:slow")
#: Idle SSE connections held at once here (bench/bench_idle_streams.py holds 10,000).
IDLE = 500
#: What a never-read stream may cost the server: far below what it would be sent.
MEMORY_BOUND = 64 * 1024 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    if not sys.platform.startswith("linux"):
        pytest.skip("reads the server's memory from /proc")
    # Before the server starts: it inherits the limit (each connection is a file there).
    limit = raise_nofile(2 * IDLE + 512)
    if limit < 2 * IDLE + 512:
        pytest.skip(f"the open-files limit is {limit}; {IDLE} connections need more")
    workdir = tmp_path_factory.mktemp("serve-load")
    with serve(f"sqlite:///{workdir / 'threads.db'}", workdir, agents=AGENTS) as running:
        yield running


@pytest.fixture
async def client(server: Server) -> AsyncIterator[Any]:
    c = _client(server.url)
    try:
        yield c
    finally:
        await c.aclose()


def _say(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


async def _another_users_run(server: Server) -> None:
    """A run of another thread on the same server, start to end, answered normally."""
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        ok = await http.get("/ok")
        assert (ok.status_code, ok.json()) == (200, {"ok": True})
        thread = await http.post("/threads", json={})
        assert thread.status_code == 200, thread.text
        done = await http.post(
            f"/threads/{thread.json()['thread_id']}/runs/wait",
            json={"assistant_id": "chunky", "input": _say("hi")},
        )
        assert done.status_code == 200, done.text
        assert done.json()["messages"][-1]["content"] == "".join(CHUNKS)


async def test_a_client_that_never_reads_its_stream_costs_bounded_memory_and_delays_no_one(
    server: Server, client: Any
) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    base = rss_bytes(server.pid)
    peak = base
    body = {"assistant_id": "flood", "input": _say("go"), "stream_mode": ["messages", "custom"]}
    sock = never_reading_stream(server.url, f"/threads/{thread_id}/runs/stream", body)
    try:

        async def ended() -> bool:
            nonlocal peak
            peak = max(peak, rss_bytes(server.pid))
            runs = await client.runs.list(thread_id)
            return bool(runs) and runs[0]["status"] == "success"

        # The run does not wait for its reader: it ends, its events kept.
        await wait_until(ended, within=120, what="the flood run to end")
        await _another_users_run(server)
        peak = max(peak, rss_bytes(server.pid))
        # What the stream would carry (each `messages/partial` has the text so far).
        owed = FLOOD_PIECES * (FLOOD_PIECES + 1) // 2 * len(FLOOD[0])
        assert owed > 3 * MEMORY_BOUND
        assert peak - base < MEMORY_BOUND, (peak - base) // 2**20

        # Nothing lost: a client that reads gets the whole answer, in order.
        (run,) = await client.runs.list(thread_id)
        parts = [
            p async for p in client.runs.join_stream(thread_id, run["run_id"], stream_mode="custom")
        ]
        pieces = [p.data["text"] for p in parts if p.event == "custom" and p.data["type"] == "text"]
        assert pieces == FLOOD
    finally:
        sock.close()


@pytest.fixture(scope="module")
def cluster(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two `serve --workers external` processes and a worker on PostgreSQL."""
    pytest.importorskip("procrastinate")
    from tests.test_serve_workers import running_cluster

    workdir = tmp_path_factory.mktemp("serve-load-workers")
    with running_cluster(workdir, agents=AGENTS, workers=1) as running:
        yield running


@pytest.mark.parametrize("where", ["inline", "workers"])
async def test_many_idle_streams_leave_the_server_answering_everyone(
    where: str, server: Server, request: pytest.FixtureRequest
) -> None:
    """`inline`: the streams follow a run of the server's own process; `workers`: a run
    a worker executes, created through one server and followed through the other (each
    follower reads the run's events from PostgreSQL)."""
    follow = server
    if where == "workers":
        cluster: Cluster = request.getfixturevalue("cluster")
        server, follow = cluster.servers
    client = _client(server.url)
    try:
        await _idle_streams(server, follow, client)
    finally:
        await client.aclose()


async def _idle_streams(server: Server, follow: Server, client: Any) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    run = await client.runs.create(thread_id, "slow", input=_say("wait"), stream_mode=["custom"])
    path = f"/threads/{thread_id}/runs/{run['run_id']}/stream"
    streams, errors = await open_idle_streams(follow.url, path, IDLE)
    try:
        assert errors == [] and len(streams) == IDLE, errors[:5]
        await _another_users_run(follow)
        await asyncio.wait_for(client.runs.cancel(thread_id, run["run_id"], wait=True), 60)
        # Every idle stream ends with its run, cleanly (the chunked body's last chunk).
        ends = await asyncio.wait_for(
            asyncio.gather(*(read_to_end(reader) for reader, _ in streams)), 120
        )
        assert all(end.endswith(b"0\r\n\r\n") for end in ends)
    finally:
        close_all(streams)
    assert (await client.runs.get(thread_id, run["run_id"]))["status"] == "interrupted"
