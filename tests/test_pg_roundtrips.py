"""Round trips to PostgreSQL per `thread.send`, counted by a proxy in front of the server
(tests/pg_proxy.py): a regression guard for what a remote database costs per turn.

A send of the benchmarks' job (the model calls a tool, then answers) needs four: the
lock taken with the head read, the model's tool call saved before the tool runs, the
tool's result saved as it exists, and the last checkpoint saved with the lock's release.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
import pytest_asyncio

from criogen_graph import Agent, FakeReply, FunctionModel, Storage, tool
from criogen_graph.storage import base as storage_base
from tests.conftest import PG_URL, require_postgres
from tests.pg_proxy import PgProxy

#: Round trips per send of a fresh thread and of a thread with history (at most).
MAX_PER_SEND = 4


@pytest.fixture(scope="module")
def proxy() -> Iterator[PgProxy]:
    require_postgres()
    with PgProxy(PG_URL) as p:
        yield p


@pytest.fixture
def patient_hold_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """The counts below assume the instant scripted model answers within the hold-back
    window; on a loaded machine a 50 ms stall lets the input go alone (one round trip
    more, correctly). The window is widened so the count measures statements, not load."""
    monkeypatch.setattr(storage_base, "HOLD_BACK_SECS", 30.0)


def tool_then_done(storage: Storage) -> Agent:
    @tool
    def echo(text: str) -> str:
        """Echo the text back."""
        return text

    state = {"i": 0}

    def script(messages: Any, tools: Any) -> Any:
        state["i"] += 1
        if state["i"] % 2:
            return FakeReply.tool_call("echo", {"text": "hi"}, id=f"call_{state['i']}")
        return "done"

    return Agent(FunctionModel(script), tools=[echo], storage=storage)


@pytest_asyncio.fixture
async def storage(proxy: PgProxy) -> AsyncIterator[Storage]:
    s = Storage(proxy.url)
    await s.open()
    try:
        yield s
    finally:
        await s.close()


async def per_send(proxy: PgProxy, agent: Agent, thread_ids: list[str]) -> float:
    proxy.reset()
    for tid in thread_ids:
        reply = await agent.thread(tid).send("go")
        assert reply.text == "done"
    return proxy.round_trips() / len(thread_ids)


async def test_a_send_on_a_fresh_thread_costs_four_round_trips(
    proxy: PgProxy, patient_hold_back: None, storage: Storage
) -> None:
    agent = tool_then_done(storage)
    await agent.thread(uuid.uuid4().hex).send("warm up")  # pools, first-use imports
    n = await per_send(proxy, agent, [uuid.uuid4().hex for _ in range(5)])
    assert n <= MAX_PER_SEND, f"{n} round trips per send"


async def test_a_send_on_a_thread_with_history_costs_four_round_trips(
    proxy: PgProxy, patient_hold_back: None, storage: Storage
) -> None:
    agent = tool_then_done(storage)
    tid = uuid.uuid4().hex
    await agent.thread(tid).send("first")
    n = await per_send(proxy, agent, [tid] * 4)
    assert n <= MAX_PER_SEND, f"{n} round trips per send"
    # Everything the sends did is there: 5 user messages, each answered in two turns,
    # and one audit record per tool call.
    messages = await agent.thread(tid).messages()
    assert sum(m["role"] == "user" for m in messages) == 5
    assert sum(m["role"] == "tool" for m in messages) == 5
    audit = await storage.audit(tid)
    assert sum(r["action"] == "tool_call" for r in audit) == 5


async def test_statements_of_new_shapes_cost_no_extra_round_trip(
    proxy: PgProxy, patient_hold_back: None
) -> None:
    """A write's SQL text changes with its number of rows (messages, tool calls, audit
    records), so a real deployment keeps meeting texts its connections have not seen,
    on fresh connections too. A statement psycopg prepares costs a round trip of its
    own the first time a connection sees its text; ours are sent unprepared."""

    @tool
    def echo(text: str) -> str:
        """Echo the text back."""
        return text

    state = {"i": 0}

    def script(messages: Any, tools: Any) -> Any:
        # Send k answers with k tool calls (a new shape each time), then "done".
        last = messages[-1]
        if last["role"] == "user":
            k = int(last["content"])
            return FakeReply(
                tool_calls=[
                    {"name": "echo", "args": {"text": "x" * i}, "id": f"c{state['i']}_{i}"}
                    for i in range(k)
                ]
            )
        state["i"] += 1
        return "done"

    proxy.reset()
    conn = await psycopg.AsyncConnection.connect(proxy.url)
    per_connection = proxy.round_trips()
    await conn.close()
    storage = Storage(proxy.url)
    await storage.open()  # a fresh pool: none of its connections has seen a statement
    try:
        agent = Agent(FunctionModel(script), tools=[echo], storage=storage)
        # Five tools at once open the pool's connections (connecting costs round trips
        # of its own, once), with statements of other shapes than the ones measured.
        assert (await agent.thread(uuid.uuid4().hex).send("5")).text == "done"
        for k in (1, 2, 3, 4):
            tid = uuid.uuid4().hex
            proxy.reset()
            opened = proxy.connections()
            reply = await agent.thread(tid).send(str(k))
            assert reply.text == "done"
            # The lock and head, the tool calls, each tool's result, the answer (and
            # the connections the pool opened meanwhile to run the tools' writes).
            expected = 3 + k + (proxy.connections() - opened) * per_connection
            assert proxy.round_trips() <= expected, (k, proxy.round_trips())
    finally:
        await storage.close()


@pytest.mark.parametrize("k", range(6))
async def test_a_cancel_while_the_held_back_input_is_being_saved_keeps_it(
    proxy: PgProxy, storage: Storage, k: int
) -> None:
    """The model takes longer than `HOLD_BACK_SECS`, so the input goes in on its own while
    the model runs; the send is cancelled k event-loop iterations after that write left
    (it is in flight: the proxy holds each packet 20 ms). The caller gets its
    CancelledError, the message is saved once, the lock is free and retry() answers."""
    model_started = asyncio.Event()
    release = asyncio.Event()

    async def script(messages: Any, tools: Any) -> Any:
        model_started.set()
        await release.wait()
        return "answered"

    agent = Agent(FunctionModel(script), storage=storage)
    thread = agent.thread(uuid.uuid4().hex)
    task = asyncio.create_task(thread.send("hello"))
    await model_started.wait()
    proxy.set_delay_ms(20.0)
    try:
        before = proxy.round_trips()
        deadline = asyncio.get_running_loop().time() + 10
        while proxy.round_trips() == before:  # the held-back input leaves
            assert asyncio.get_running_loop().time() < deadline, "the input was never saved"
            await asyncio.sleep(0.001)
        for _ in range(k):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        proxy.set_delay_ms(0.0)
    messages = await thread.messages()
    assert [(m["role"], m["content"]) for m in messages] == [("user", "hello")]
    release.set()
    fresh = Storage(storage.url, on_busy="fail")  # another process would find it free
    try:
        reply = await Agent(FunctionModel(script), storage=fresh).thread(thread.id).retry()
    finally:
        await fresh.close()
    assert reply.text == "answered"


async def test_opening_a_set_up_database_costs_one_round_trip_beyond_connecting(
    proxy: PgProxy,
) -> None:
    """A worker or web process that opens its storage per request pays the opening each
    time: on a database already set up it connects (the lock session and the pool's
    first connection, side by side) and reads one row set, the schema version with the
    encryption claim; no setup lock, no migration checks."""

    async def quiet() -> None:
        # Every connection closed before has ended (its goodbye counted) before counting.
        deadline = asyncio.get_running_loop().time() + 10
        while proxy.open_connections():
            assert asyncio.get_running_loop().time() < deadline, proxy.open_connections()
            await asyncio.sleep(0.001)
        proxy.reset()

    first = Storage(proxy.url)
    await first.open()  # sets the tables up if this database is new
    await first.close()
    await quiet()
    conn = await psycopg.AsyncConnection.connect(proxy.url)
    per_connection = proxy.round_trips()
    await conn.close()
    for _ in range(3):
        await quiet()
        before = proxy.connections()
        storage = Storage(proxy.url)
        await storage.open()
        try:
            opened = proxy.connections() - before
            statements = proxy.round_trips() - opened * per_connection
            assert opened <= 2, opened
            assert statements <= 1, statements
        finally:
            await storage.close()


#: Round trips of a worker per background run of the send above (at most): the job
#: fetched, the run record started, the four of the send, the record finished, the job
#: finished, one more fetch that finds the queue empty (the runs here come one by one;
#: under a backlog it returns the next job), and one to spare for the worker's own
#: wake-ups. Before: about 20 (procrastinate's pool checked each connection with a
#: round trip, and wrapped each statement in a BEGIN and a COMMIT).
MAX_PER_BACKGROUND_RUN = 10


async def test_a_background_run_costs_its_worker_at_most_ten_round_trips(
    proxy: PgProxy, patient_hold_back: None, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a worker sends per run is what its throughput pays for (each statement costs
    CPU on both ends even on loopback): no statement of its own to check a pooled
    connection, nothing read twice."""
    from urllib.parse import urlsplit, urlunsplit

    from criogen_graph import Worker, close_runs
    from tests.conftest import fresh_schema
    from tests.reliability import _background_agents as bg

    monkeypatch.setenv("CRIOGEN_BG_WORKDIR", str(tmp_path))
    with fresh_schema("criogen_rt") as url:
        through = urlunsplit(urlsplit(url)._replace(netloc=urlsplit(proxy.url).netloc))
        client = Storage(url)
        # Heartbeats, abort polls and stalled-job sweeps every 60 s: none while counting.
        # One run at a time: each wake-up fetches once.
        worker = Worker(
            bg.make_agent(Storage(through)),
            concurrency=1,
            heartbeat_secs=60,
            stalled_after_secs=120,
        )
        task = asyncio.create_task(worker.run())
        try:
            agent = bg.make_agent(client)
            warm = await agent.thread(uuid.uuid4().hex).submit("nap")  # pools, prepares
            assert (await asyncio.wait_for(warm.reply(), 60)).text == "done: rested"
            conn = await psycopg.AsyncConnection.connect(proxy.url)
            await conn.close()
            runs = 6
            proxy.reset()
            conn = await psycopg.AsyncConnection.connect(proxy.url)
            per_connection = proxy.round_trips()
            await conn.close()
            proxy.reset()
            before = proxy.connections()
            for _ in range(runs):
                handle = await agent.thread(uuid.uuid4().hex).submit("nap")
                assert (await asyncio.wait_for(handle.reply(), 60)).text == "done: rested"
            # (Connections a pool opened meanwhile cost round trips of their own, once.)
            opened = proxy.connections() - before
            per_run = (proxy.round_trips() - opened * per_connection) / runs
            assert per_run <= MAX_PER_BACKGROUND_RUN, f"{per_run} round trips per run"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await close_runs(client)
            await client.close()
            await worker.storage.close()
