"""`criogen-graph serve`: the official Python client (`langgraph_sdk`) against a real
server process on SQLite and on PostgreSQL, with auth: a thread through an approval
(streamed, resumed with a Command), state and history, cancellation, a stream joined
again after a disconnect with `Last-Event-ID`, other users' threads answered with 404,
and bad input answered with a 4xx `{"detail": ...}`. The same client flow runs against
`langgraph dev` serving `agent.graph`, as the reference."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from criogen_graph import Storage
from tests.conftest import PG_URL, ROOT, require_postgres, wait_until
from tests.serve_agents import CHUNKS
from tests.test_studio import _free_port, _wait_until_up, require_studio, serve_project

pytest.importorskip("langgraph_sdk")
pytest.importorskip("starlette")

AGENTS = ("examples.support_agent:agent", "tests.serve_agents:slow", "tests.serve_agents:chunky")
REFUND = "Order A-1 arrived damaged. Please refund it."


@dataclass
class Server:
    url: str
    log: Path
    storage: str
    pid: int = 0


@contextmanager
def serve(
    storage: str, workdir: Path, *options: str, agents: tuple[str, ...] = AGENTS
) -> Iterator[Server]:
    """`criogen-graph serve` of the test agents on a free loopback port until the block
    ends; stopped with SIGTERM (SIGKILL if it hangs)."""
    port = _free_port()
    args = [a for spec in agents for a in ("--agent", spec)]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    env.pop("CRIOGEN_EXAMPLE_MODEL", None)
    log = workdir / f"serve-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "criogen_graph",
                "serve",
                *args,
                "--storage",
                storage,
                "--port",
                str(port),
                *options,
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(proc, url, log, within=60)
        yield Server(url, log, storage, proc.pid)
    finally:
        if proc.poll() is None:  # not killed by the test already
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("serve")
    if request.param == "postgres":
        require_postgres()
        storage = PG_URL
    else:
        storage = f"sqlite:///{workdir / 'threads.db'}"
    with serve(
        storage, workdir, "--auth", "tests.serve_agents:bearer", "--host", "127.0.0.1"
    ) as running:
        yield running


@pytest.fixture
def alice() -> str:
    return f"alice-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def bob() -> str:
    return f"bob-{uuid.uuid4().hex[:8]}"


def _client(url: str, who: str | None = None) -> Any:
    from langgraph_sdk import get_client

    headers = {"Authorization": f"Bearer {who}"} if who else {}
    return get_client(url=url, headers=headers, api_key=None)


@pytest.fixture
async def client(server: Server, alice: str) -> AsyncIterator[Any]:
    c = _client(server.url, alice)
    try:
        yield c
    finally:
        await c.aclose()


def _texts(parts: list[Any]) -> str:
    return "".join(
        p.data["text"] for p in parts if p.event == "custom" and p.data.get("type") == "text"
    )


async def approval_flow(client: Any, assistant: str) -> str:
    """What a chat page does: stream a message, meet the approval, answer it with a
    Command, read the state and history. Passes against `langgraph dev` too."""
    thread_id: str = (await client.threads.create())["thread_id"]
    parts = [
        p
        async for p in client.runs.stream(
            thread_id,
            assistant,
            input={"messages": [{"role": "user", "content": REFUND}]},
            stream_mode=["values", "updates", "custom"],
        )
    ]
    assert parts[0].event == "metadata"
    assert _texts(parts) == "Order A-1 is on file; I will refund it."
    asked = [
        p.data["__interrupt__"]
        for p in parts
        if p.event in ("values", "updates") and "__interrupt__" in p.data
    ]
    assert asked, [p.event for p in parts]
    (request,) = asked[-1][0]["value"]["requests"]
    assert (request["tool"], request["args"]["order_id"]) == ("refund", "A-1")
    values = [p.data for p in parts if p.event == "values" and "messages" in p.data]
    assert [m["role"] for m in values[-1]["messages"]] == ["user", "assistant", "tool", "assistant"]

    state = await client.threads.get_state(thread_id)
    assert state["next"] == ["approval"]
    assert state["interrupts"][0]["value"]["requests"] == [request]
    assert (await client.threads.get(thread_id))["status"] == "interrupted"

    out = await client.runs.wait(
        thread_id, assistant, command={"resume": {request["call_id"]: {"type": "approve"}}}
    )
    assert "__interrupt__" not in out
    refund = [m for m in out["messages"] if m["role"] == "tool"][-1]
    assert (refund["name"], refund["status"]) == ("refund", "ok")
    assert out["messages"][-1]["content"] == "Done: refunded A-1 (requested by the customer)."
    assert (await client.threads.get(thread_id))["status"] == "idle"

    history = await client.threads.get_history(thread_id, limit=50)
    assert history[0]["next"] == []
    assert ["approval"] in [h["next"] for h in history]
    return thread_id


async def test_a_thread_streams_stops_for_approval_and_resumes_with_a_command(
    client: Any, server: Server, alice: str
) -> None:
    thread_id = await approval_flow(client, "support")
    # The request's identity is the audit actor of what it did.
    async with Storage(server.storage) as storage:
        records = await storage.audit(thread_id)
    actions = [(r["action"], r["actor"]) for r in records]
    assert ("send", alice) in actions and ("decide", alice) in actions
    assert {r["actor"] for r in records} == {alice}


async def test_the_answer_streams_token_by_token_as_message_tuples(client: Any) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    parts = [
        p
        async for p in client.runs.stream(
            thread_id,
            "chunky",
            input={"messages": [{"role": "human", "content": [{"type": "text", "text": "hi"}]}]},
            stream_mode="messages-tuple",
        )
    ]
    chunks = [p.data[0] for p in parts if p.event == "messages"]
    # The answer's pieces, once each (a client adds them up by message id).
    assert [c["type"] for c in chunks] == ["AIMessageChunk"] * len(CHUNKS)
    assert [c["content"] for c in chunks] == CHUNKS
    assert len({c["id"] for c in chunks}) == 1
    assert {p.event for p in parts} == {"metadata", "messages"}


async def test_each_message_has_one_id_in_values_and_message_events(client: Any) -> None:
    """A client merging a stream's messages by id (`useStream`) shows each message once:
    a tool result carries the same id in `values` (and the thread's state) as in its
    `messages-tuple` event."""
    thread_id = (await client.threads.create())["thread_id"]
    parts = [
        p
        async for p in client.runs.stream(
            thread_id,
            "support",
            input={"messages": [{"role": "user", "content": REFUND}]},
            stream_mode=["values", "messages-tuple"],
        )
    ]
    streamed = {
        p.data[0]["id"] for p in parts if p.event == "messages" and p.data[0]["type"] == "tool"
    }
    assert streamed
    values = [p.data for p in parts if p.event == "values" and "messages" in p.data]
    in_values = {m.get("id") for m in values[-1]["messages"] if m["role"] == "tool"}
    assert in_values == streamed
    state = await client.threads.get_state(thread_id)
    assert {m.get("id") for m in state["values"]["messages"] if m["role"] == "tool"} == streamed


async def test_the_messages_mode_sends_the_answer_growing_then_complete(client: Any) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    parts = [
        p
        async for p in client.runs.stream(
            thread_id, "chunky", input={"messages": ["hi"]}, stream_mode="messages"
        )
    ]
    partial = [p.data[0]["content"] for p in parts if p.event == "messages/partial"]
    assert partial == ["".join(CHUNKS[: i + 1]) for i in range(len(CHUNKS))]
    (complete,) = [p.data[0] for p in parts if p.event == "messages/complete"]
    assert (complete["type"], complete["content"]) == ("ai", "".join(CHUNKS))
    assert [p.event for p in parts].count("messages/metadata") == 1


async def test_a_stream_joined_again_after_a_disconnect_gets_every_event_once(
    client: Any,
) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    run = await client.runs.create(
        thread_id,
        "chunky",
        input={"messages": [{"role": "user", "content": "go"}]},
        stream_mode=["custom"],
    )
    first: list[Any] = []
    async for part in client.runs.join_stream(thread_id, run["run_id"]):
        first.append(part)
        if sum(p.data.get("type") == "text" for p in first if p.event == "custom") == 5:
            break  # the connection drops here
    last_id = first[-1].id
    assert last_id is not None
    rest = [
        p async for p in client.runs.join_stream(thread_id, run["run_id"], last_event_id=last_id)
    ]
    texts = [
        p.data["text"]
        for p in [*first, *rest]
        if p.event == "custom" and p.data.get("type") == "text"
    ]
    assert texts == CHUNKS
    ids = [int(p.id) for p in [*first, *rest] if p.id is not None]
    assert ids == sorted(set(ids))
    done = await client.runs.join(thread_id, run["run_id"])
    assert done["messages"][-1]["content"] == "".join(CHUNKS)
    assert (await client.runs.get(thread_id, run["run_id"]))["status"] == "success"


async def test_a_cancelled_run_stops_and_other_strategies_are_refused(client: Any) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    run = await client.runs.create(
        thread_id,
        "slow",
        input={"messages": [{"role": "user", "content": "wait"}]},
        stream_mode=["custom"],
    )
    async for part in client.runs.join_stream(thread_id, run["run_id"]):
        if part.event == "custom" and part.data.get("type") == "tool_call_started":
            break
    assert (await client.threads.get(thread_id))["status"] == "busy"

    from langgraph_sdk.errors import ConflictError, UnprocessableEntityError

    with pytest.raises(ConflictError, match="already running"):
        await client.runs.create(
            thread_id,
            "slow",
            input={"messages": [{"role": "user", "content": "again"}]},
            multitask_strategy="reject",
        )
    with pytest.raises(UnprocessableEntityError, match="one writer"):
        await client.runs.create(
            thread_id,
            "slow",
            input={"messages": [{"role": "user", "content": "again"}]},
            multitask_strategy="interrupt",
        )

    await client.runs.cancel(thread_id, run["run_id"], wait=True)
    assert (await client.runs.get(thread_id, run["run_id"]))["status"] == "interrupted"
    assert (await client.threads.get(thread_id))["status"] != "busy"
    listed = await client.runs.list(thread_id)
    assert [r["run_id"] for r in listed] == [run["run_id"]]
    # The tool did not finish: the transcript has no result for it.
    state = await client.threads.get_state(thread_id)
    assert [m["role"] for m in state["values"]["messages"]] == ["user", "assistant"]


async def test_a_client_that_leaves_cancels_its_run_only_when_it_asked_to(client: Any) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    created: list[str] = []
    parts = client.runs.stream(
        thread_id,
        "slow",
        input={"messages": [{"role": "user", "content": "wait"}]},
        stream_mode="custom",
        on_disconnect="cancel",
        on_run_created=lambda meta: created.append(str(meta["run_id"])),
    )
    async for part in parts:
        if part.event == "custom" and part.data.get("type") == "tool_call_started":
            break  # the client goes away mid-run
    await parts.aclose()
    (run_id,) = created

    async def status() -> str:
        run = await client.runs.get(thread_id, run_id)
        return str(run["status"])

    await wait_until(lambda: _is(status, "interrupted"), what="the run to be cancelled")
    state = await client.threads.get_state(thread_id)
    assert [m["role"] for m in state["values"]["messages"]] == ["user", "assistant"]

    # A client that did not ask for it leaves a run going (the default, "continue").
    run = await client.runs.create(
        thread_id, "chunky", input={"messages": [{"role": "user", "content": "go"}]}
    )
    async for _ in client.runs.join_stream(thread_id, run["run_id"]):
        break
    done = await client.runs.join(thread_id, run["run_id"])
    assert done["messages"][-1]["content"] == "".join(CHUNKS)


async def _is(read: Any, wanted: str) -> bool:
    return bool(await read() == wanted)


async def test_queued_runs_of_one_thread_run_in_order(client: Any) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    runs = [
        await client.runs.create(
            thread_id, "chunky", input={"messages": [{"role": "user", "content": text}]}
        )
        for text in ("one", "two")
    ]
    for run in runs:
        await client.runs.join(thread_id, run["run_id"])
    state = await client.threads.get_state(thread_id)
    said = [m["content"] for m in state["values"]["messages"] if m["role"] == "user"]
    assert said == ["one", "two"]
    assert len(state["values"]["messages"]) == 4


async def test_another_identity_gets_404_on_every_endpoint(
    server: Server, client: Any, bob: str
) -> None:
    thread_id = (await client.threads.create(metadata={"topic": "refund"}))["thread_id"]
    run = await client.runs.create(
        thread_id, "chunky", input={"messages": [{"role": "user", "content": "mine"}]}
    )
    await client.runs.join(thread_id, run["run_id"])
    base = f"/threads/{thread_id}"
    rid = run["run_id"]
    calls = [
        ("GET", base, None),
        ("PATCH", base, {"metadata": {"x": 1}}),
        ("GET", f"{base}/state", None),
        ("POST", f"{base}/state", {"checkpoint_id": "x"}),
        ("POST", f"{base}/history", {"limit": 5}),
        ("GET", f"{base}/runs", None),
        ("GET", f"{base}/runs/{rid}", None),
        ("GET", f"{base}/runs/{rid}/join", None),
        ("GET", f"{base}/runs/{rid}/stream", None),
        ("POST", f"{base}/runs/{rid}/cancel", None),
        ("POST", f"{base}/runs", {"assistant_id": "chunky", "input": {"messages": ["hi"]}}),
        ("POST", f"{base}/runs/wait", {"assistant_id": "chunky", "input": {"messages": ["x"]}}),
        ("POST", f"{base}/runs/stream", {"assistant_id": "chunky", "input": {"messages": ["x"]}}),
        ("DELETE", base, None),
    ]
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {bob}"}
    ) as http:
        for method, path, body in calls:
            r = await http.request(method, path, json=body)
            assert r.status_code == 404, (method, path, r.text)
            assert r.json() == {"detail": f"thread {thread_id!r} not found"}
        found = (await http.post("/threads/search", json={"metadata": {"topic": "refund"}})).json()
        assert thread_id not in [t["thread_id"] for t in found]
        # Someone else's id cannot be taken over either.
        taken = await http.post(
            "/threads", json={"thread_id": thread_id, "if_exists": "do_nothing"}
        )
        assert taken.status_code == 409
    async with httpx.AsyncClient(base_url=server.url) as anonymous:
        r = await anonymous.get(base)
        assert (r.status_code, r.json()) == (401, {"detail": "not authenticated"})
    # The owner still has it, untouched.
    mine = await client.threads.search(metadata={"topic": "refund"})
    assert thread_id in [t["thread_id"] for t in mine]
    assert (await client.threads.get(thread_id))["metadata"] == {"topic": "refund"}


async def test_bad_input_gets_a_4xx_naming_the_problem(
    server: Server, client: Any, alice: str
) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    runs = f"/threads/{thread_id}/runs/wait"
    message = {"messages": [{"role": "user", "content": REFUND}]}
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {alice}"}, timeout=60
    ) as http:

        async def refused(status: int, method: str, path: str, **kw: Any) -> str:
            r = await http.request(method, path, **kw)
            assert r.status_code == status, (path, r.status_code, r.text)
            body = r.json()
            assert set(body) == {"detail"} and "Traceback" not in r.text
            detail: str = body["detail"]
            return detail

        assert "not valid JSON" in await refused(
            422,
            "POST",
            runs,
            content=b'{"assistant_id": "support", "input": ',
            headers={"Content-Type": "application/json"},
        )
        assert "assistant 'nope' not found" in await refused(
            404, "POST", runs, json={"assistant_id": "nope", "input": message}
        )
        assert "not found" in await refused(
            404,
            "POST",
            "/threads/no-such-thread/runs/wait",
            json={"assistant_id": "support", "input": message},
        )
        assert "not waiting for approval" in await refused(
            409, "POST", runs, json={"assistant_id": "support", "command": {"resume": "approve"}}
        )
        assert "exactly one new user message" in await refused(
            422, "POST", runs, json={"assistant_id": "support", "input": {"messages": []}}
        )
        assert "unknown stream_mode" in await refused(
            422,
            "POST",
            f"/threads/{thread_id}/runs/stream",
            json={"assistant_id": "support", "input": message, "stream_mode": ["nope"]},
        )
        # The thread stops for approval; a second message must answer it first.
        asked = await http.post(runs, json={"assistant_id": "support", "input": message})
        first = asked.json()["__interrupt__"][0]["value"]["requests"][0]
        assert "waits for approval" in await refused(
            409, "POST", runs, json={"assistant_id": "support", "input": message}
        )
        # A resume pinned to a checkpoint the thread has left is stale: nothing runs.
        state = (await http.get(f"/threads/{thread_id}/state")).json()
        history = (await http.post(f"/threads/{thread_id}/history", json={"limit": 3})).json()
        old = history[-1]["checkpoint"]["checkpoint_id"]
        assert "stale" in await refused(
            409,
            "POST",
            runs,
            json={
                "assistant_id": "support",
                "command": {"resume": "approve"},
                "checkpoint_id": old,
            },
        )
        assert (await http.get(f"/threads/{thread_id}/state")).json() == state
        assert "command.resume must be" in await refused(
            422, "POST", runs, json={"assistant_id": "support", "command": {"resume": 42}}
        )
        # The pinned, well-formed answer goes through.
        done = await http.post(
            runs,
            json={
                "assistant_id": "support",
                "command": {"resume": {first["call_id"]: "approve"}},
                "checkpoint_id": state["checkpoint"]["checkpoint_id"],
            },
        )
        assert done.json()["messages"][-1]["content"].startswith("Done: refunded A-1")
        # A body of 100 MB is refused from its declared size, before it is read; one
        # sent in chunks without a size is cut off once it passes the limit.
        host, port = server.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            f"POST {runs} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {alice}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {100 * 2**20}\r\n\r\n{{".encode()
        )
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 30)
        writer.close()
        assert status_line.split()[1] == b"413"

        async def endless() -> AsyncIterator[bytes]:
            yield b'{"input": "'
            for _ in range(9):
                yield b"x" * 2**20

        assert "over" in await refused(413, "POST", runs, content=endless())
        assert "no endpoint" in await refused(404, "GET", "/nowhere")


def test_without_auth_the_server_listens_on_loopback_and_says_so(tmp_path: Path) -> None:
    with serve("memory://", tmp_path) as running:
        assert httpx.get(f"{running.url}/ok").json() == {"ok": True}
        info = httpx.get(f"{running.url}/info").json()
        assert info["server"] == "criogen-graph"
        document = httpx.get(f"{running.url}/openapi.json").json()
        assert {
            "/threads/{thread_id}/runs/stream",
            "/threads/{thread_id}/runs/{run_id}/stream",
            "/threads/{thread_id}/history",
        } <= set(document["paths"])
        # (found by the fuzz test) a graph whose state types have no JSON schema still
        # answers; a thread id outside Latin-1 still streams (its Location is quoted).
        schemas = httpx.get(f"{running.url}/assistants/chunky/schemas")
        assert schemas.status_code == 200 and schemas.json()["graph_id"] == "chunky"
        thread_id = "tíquet-ü-€-😀"
        httpx.post(f"{running.url}/threads", json={"thread_id": thread_id})
        body = {"assistant_id": "chunky", "input": {"messages": ["hi"]}}
        with httpx.stream(
            "POST", f"{running.url}/threads/{thread_id}/runs/stream", json=body, timeout=30
        ) as streamed:
            assert streamed.status_code == 200
            assert "%E2%82%AC" in streamed.headers["location"]
            assert "event: values" in streamed.read().decode()
    said = running.log.read_text()
    assert "127.0.0.1" in said and "loopback only: no --auth" in said


@pytest.fixture(scope="module")
def dev_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`langgraph dev` serving the support agent's `graph`: the reference."""
    require_studio()
    project = tmp_path_factory.mktemp("dev")
    shutil.copytree(ROOT / "examples", project / "examples")
    (project / "langgraph.json").write_text(
        json.dumps(
            {"dependencies": ["."], "graphs": {"support": "./examples/support_agent.py:graph"}}
        )
    )
    with serve_project(project) as running:
        yield running.url


async def test_the_same_client_flow_passes_against_langgraph_dev(dev_server: str) -> None:
    client = _client(dev_server)
    try:
        await approval_flow(client, "support")
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:
    """Two `serve` processes on one PostgreSQL."""
    require_postgres()
    workdir = tmp_path_factory.mktemp("two")
    options = ("--auth", "tests.serve_agents:bearer", "--host", "127.0.0.1")
    with serve(PG_URL, workdir, *options) as a, serve(PG_URL, workdir, *options) as b:
        yield a, b


async def test_two_servers_on_one_postgresql_share_threads_and_one_writer(
    two_servers: tuple[Server, Server], alice: str, bob: str
) -> None:
    a, b = (_client(s.url, alice) for s in two_servers)
    stranger = _client(two_servers[1].url, bob)
    try:
        thread_id = (await a.threads.create())["thread_id"]
        out = await a.runs.wait(
            thread_id, "support", input={"messages": [{"role": "user", "content": REFUND}]}
        )
        (request,) = out["__interrupt__"][0]["value"]["requests"]
        # The approval is answered through the other server.
        state = await b.threads.get_state(thread_id)
        assert state["next"] == ["approval"]
        done = await b.runs.wait(
            thread_id,
            "support",
            command={"resume": {request["call_id"]: "approve"}},
            checkpoint_id=state["checkpoint"]["checkpoint_id"],
        )
        assert done["messages"][-1]["content"].startswith("Done: refunded A-1")
        assert (await a.threads.get(thread_id))["status"] == "idle"
        from langgraph_sdk.errors import NotFoundError

        with pytest.raises(NotFoundError):
            await stranger.threads.get(thread_id)

        # One writer per thread across servers: B's run waits for A's to end.
        slow = await a.runs.create(
            thread_id,
            "slow",
            input={"messages": [{"role": "user", "content": "wait"}]},
            stream_mode=["custom"],
        )
        async for part in a.runs.join_stream(thread_id, slow["run_id"]):
            if part.event == "custom" and part.data.get("type") == "tool_call_started":
                break
        queued = await b.runs.create(
            thread_id, "chunky", input={"messages": [{"role": "user", "content": "next"}]}
        )
        # The other server's join waits for the run to end too.
        joined = asyncio.ensure_future(b.runs.join(thread_id, slow["run_id"]))
        early, _ = await asyncio.wait({joined}, timeout=1)
        assert not early, "join answered while the run was still going"
        await a.runs.cancel(thread_id, slow["run_id"], wait=True)
        assert [m["role"] for m in (await joined)["messages"]][-2:] == ["user", "assistant"]
        after = await b.runs.join(thread_id, queued["run_id"])
        said = [m["content"] for m in after["messages"] if m["role"] == "user"]
        assert said[-2:] == ["wait", "next"]
        assert after["messages"][-1]["content"] == "".join(CHUNKS)
    finally:
        for c in (a, b, stranger):
            await c.aclose()


async def test_a_run_on_one_server_is_followed_and_cancelled_through_the_other(
    two_servers: tuple[Server, Server], alice: str
) -> None:
    a, b = (_client(s.url, alice) for s in two_servers)
    try:
        thread_id = (await a.threads.create())["thread_id"]
        run = await a.runs.create(
            thread_id,
            "chunky",
            input={"messages": [{"role": "user", "content": "go"}]},
            stream_mode=["custom", "values"],
        )
        # Followed through B, which does not run it: every event, once, in order.
        seen = [p async for p in b.runs.join_stream(thread_id, run["run_id"])]
        assert seen[0].event == "metadata"
        assert _texts(seen) == "".join(CHUNKS)
        ids = [int(p.id) for p in seen]
        assert ids == sorted(set(ids))
        # ... and again from the middle, as a reconnecting client does.
        middle = seen[len(seen) // 2].id
        rest = [p async for p in b.runs.join_stream(thread_id, run["run_id"], last_event_id=middle)]
        assert [p.id for p in rest] == [p.id for p in seen[len(seen) // 2 + 1 :]]
        assert seen[-1].event == "values" and seen[-1].data["messages"][-1]["content"] == "".join(
            CHUNKS
        )

        # Clients that leave B mid-stream leave it able to serve the next one.
        for _ in range(5):
            async for part in b.runs.join_stream(thread_id, run["run_id"]):
                if part.event == "custom":
                    break
        again = [p async for p in b.runs.join_stream(thread_id, run["run_id"])]
        assert [p.id for p in again] == [p.id for p in seen]
        slow = await a.runs.create(
            thread_id,
            "slow",
            input={"messages": [{"role": "user", "content": "wait"}]},
            stream_mode=["custom"],
        )
        async for part in b.runs.join_stream(thread_id, slow["run_id"]):
            if part.event == "custom" and part.data.get("type") == "tool_call_started":
                break
        await b.runs.cancel(thread_id, slow["run_id"], wait=True)
        assert (await a.runs.get(thread_id, slow["run_id"]))["status"] == "interrupted"
    finally:
        for c in (a, b):
            await c.aclose()


async def test_run_events_in_postgresql_are_sealed_and_go_with_their_thread(
    pg_schema_url: str,
) -> None:
    """What `serve` keeps of a run's events on PostgreSQL is encrypted with the storage's
    key (no answer in clear in the table) and deleted with the thread."""
    import psycopg

    from criogen_graph.serve import create_app
    from tests.serve_agents import chunky

    storage = Storage(pg_schema_url, encryption_key="k" * 32)
    app = create_app([chunky], storage=storage)
    secret = "".join(CHUNKS)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://app") as http,
    ):
        await http.post("/threads", json={"thread_id": "sealed"})
        body = {"assistant_id": "chunky", "input": {"messages": ["hi"]}}
        run = (await http.post("/threads/sealed/runs", json=body)).json()
        joined = await http.get(f"/threads/sealed/runs/{run['run_id']}/join")
        assert joined.json()["messages"][-1]["content"] == secret
        with psycopg.connect(pg_schema_url) as conn:
            rows = conn.execute("SELECT kind, data FROM criogen_serve_events").fetchall()
        assert rows and all("aes" in kind for kind, _ in rows)
        assert not any(b"part 1; " in bytes(data) for _, data in rows)
        assert (await http.delete("/threads/sealed")).status_code == 204
        with psycopg.connect(pg_schema_url) as conn:
            left = conn.execute("SELECT count(*) FROM criogen_serve_events").fetchone()
        assert left == (0,)
    await storage.close()
