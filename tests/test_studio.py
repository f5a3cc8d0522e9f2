"""LangGraph Studio: the real `langgraph dev` server (with its `blockbuster` checks, no
`--allow-blocking`) serves the example agents of `langgraph.json` offline, and the
official `langgraph_sdk` client drives them: approvals answered with JSON resume values,
thread history, long-term memory in the server's store, and a SQLite-backed collection
opened inside a node."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from criogen_graph import CollectionTool, Storage
from tests.conftest import ROOT

STUDIO_MODULES = ("langgraph_cli", "langgraph_api", "langgraph_runtime_inmem", "langgraph_sdk")
DEV_ARGS = ("dev", "--no-browser", "--no-reload", "--host", "127.0.0.1")
REFUND_REQUEST = "Order A-1 arrived damaged. Please refund it."


def require_studio() -> None:
    """Skip (on a developer machine) or fail (in CI) when the dev server is missing."""
    missing = [m for m in STUDIO_MODULES if importlib.util.find_spec(m) is None]
    if not missing:
        return
    problem = f"{', '.join(missing)} not installed (pip install -e '.[studio]' in the criogen_graph checkout)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI must run the Studio tests: {problem}")
    pytest.skip(problem)


@dataclass
class DevServer:
    url: str
    log: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_until_up(proc: subprocess.Popen[bytes], url: str, log: Path, within: float) -> None:
    """Poll `GET /ok` until the server answers (or the process dies)."""
    deadline = time.monotonic() + within
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"langgraph dev exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/ok", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"langgraph dev did not answer /ok:\n{log.read_text()}")
        time.sleep(0.05)


async def _seed_docs(db: Path) -> None:
    async with Storage(f"sqlite:///{db}") as storage:
        docs = CollectionTool("search_policies", storage=storage)
        await docs.add("refunds", "Refunds are possible within 30 days of delivery.")


@pytest.fixture(scope="module")
def dev_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """`langgraph dev` on a free loopback port, in a copy of the project (the server
    writes `.langgraph_api/` into its project directory), stopped by its process group."""
    require_studio()
    project = tmp_path_factory.mktemp("studio")
    shutil.copytree(ROOT / "examples", project / "examples")
    shutil.copy(ROOT / "tests" / "studio_docs_graph.py", project / "docs_graph.py")
    config = json.loads((ROOT / "langgraph.json").read_text())
    config["graphs"]["docs"] = "./docs_graph.py:graph"
    (project / "langgraph.json").write_text(json.dumps(config))
    db = project / "docs.db"
    asyncio.run(_seed_docs(db))

    with serve_project(project, CRIOGEN_STUDIO_DOCS_DB=str(db)) as server:
        yield server


@contextmanager
def serve_project(project: Path, **extra_env: str) -> Iterator[DevServer]:
    """`langgraph dev` serving `project` (its `langgraph.json`) on a free loopback port,
    offline (no example model from the environment, no analytics, no tracing), until
    the block ends; then stopped by its process group."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "CRIOGEN_EXAMPLE_MODEL"}
    env.update(
        LANGGRAPH_CLI_NO_ANALYTICS="1",
        LANGSMITH_TRACING="false",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        **extra_env,
    )
    log = project / "dev.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "langgraph_cli", *DEV_ARGS, "--port", str(port)],
            cwd=project,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(proc, url, log, within=60)
        yield DevServer(url, log)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


@pytest.fixture
async def client(dev_server: DevServer) -> AsyncIterator[Any]:
    from langgraph_sdk import get_client

    c = get_client(url=dev_server.url)
    try:
        yield c
    finally:
        await c.aclose()


def _tools(values: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in values["messages"] if m["role"] == "tool"]


async def test_the_server_lists_the_examples_and_draws_their_graphs(
    client: Any, dev_server: DevServer
) -> None:
    assistants = await client.assistants.search(limit=20)
    by_graph = {a["graph_id"]: a["assistant_id"] for a in assistants}
    assert {"support", "memory"} <= set(by_graph)

    drawn = await client.assistants.get_graph(by_graph["support"])
    assert {n["id"] for n in drawn["nodes"]} == {
        "__start__",
        "model",
        "approval",
        "tools",
        "__end__",
    }
    edges = {(e["source"], e["target"]) for e in drawn["edges"]}
    assert {("model", "approval"), ("model", "tools"), ("approval", "tools")} <= edges
    assert ("tools", "model") in edges

    # The API reference is served by the local server itself (no hosted UI needed).
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{dev_server.url}/docs")).status_code == 200


async def test_the_server_reports_an_input_schema_for_each_graph(
    client: Any, dev_server: DevServer
) -> None:
    """What Studio builds its input form from: on Python 3.11 too, without the graph's
    internal `run` channel."""
    assistants = await client.assistants.search(limit=20)
    graphs = {a["graph_id"]: a["assistant_id"] for a in assistants}
    assert {"support", "memory", "docs"} <= set(graphs)
    for graph_id, assistant_id in graphs.items():
        schemas = await client.assistants.get_schemas(assistant_id)
        assert schemas["input_schema"], (graph_id, schemas)
        assert set(schemas["input_schema"]["properties"]) == {"messages", "state"}
        assert "run" in schemas["output_schema"]["properties"]
    assert "Failed to get input schema" not in dev_server.log.read_text(errors="replace")


async def test_a_support_thread_stops_for_approval_and_resumes_with_a_json_answer(
    client: Any,
) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    # What Studio's chat sends: a LangChain-style message with content blocks and an id.
    human = {
        "id": str(uuid.uuid4()),
        "type": "human",
        "content": [{"type": "text", "text": REFUND_REQUEST}],
    }
    out = await client.runs.wait(thread_id, "support", input={"messages": [human]})

    (question,) = out["__interrupt__"]
    value = question["value"]
    assert value["type"] == "approval" and value["agent"] == "support"
    (request,) = value["requests"]
    assert request["tool"] == "refund"
    assert request["args"] == {"order_id": "A-1", "reason": "requested by the customer"}
    # Studio's message id is kept: its chat matches the thread's messages on it.
    assert out["messages"][0] == {"role": "user", "content": REFUND_REQUEST, "id": human["id"]}
    assert [m["name"] for m in _tools(out)] == ["get_order"]  # the refund waits
    state = await client.threads.get_state(thread_id)
    assert state["next"] == ["approval"]
    assert (await client.threads.get(thread_id))["status"] == "interrupted"

    # An answer that does not fit is asked again, with the reason; nothing ran.
    out = await client.runs.wait(
        thread_id, "support", command={"resume": {"call_nope": {"type": "approve"}}}
    )
    (again,) = out["__interrupt__"]
    assert "no pending call has id 'call_nope'" in again["value"]["error"]
    assert again["value"]["requests"] == [request]
    assert [m["name"] for m in _tools(out)] == ["get_order"]

    out = await client.runs.wait(
        thread_id, "support", command={"resume": {request["call_id"]: {"type": "approve"}}}
    )
    assert "__interrupt__" not in out
    refund = _tools(out)[-1]
    assert (refund["name"], refund["status"]) == ("refund", "ok")
    assert refund["content"] == "refunded A-1 (requested by the customer)"
    assert out["messages"][-1]["content"] == "Done: refunded A-1 (requested by the customer)."
    assert out["run"]["stop_reason"] == "final_answer"
    assert out["run"]["tool_calls"] == 2
    assert (await client.threads.get(thread_id))["status"] == "idle"

    history = await client.threads.get_history(thread_id, limit=50)
    assert len(history) >= 6
    assert history[0]["next"] == []
    assert ["approval"] in [h["next"] for h in history]
    assert history[-1]["metadata"]["source"] == "input"


async def test_the_server_streams_our_events_in_the_custom_mode(client: Any) -> None:
    """What `thread.stream` yields, the server streams as `custom` events: the answer's
    text as it is written, each tool call started and finished, each finished message."""
    thread_id = (await client.threads.create())["thread_id"]
    parts = [
        chunk.data
        async for chunk in client.runs.stream(
            thread_id,
            "support",
            input={"messages": [{"role": "user", "content": "Where is order A-1?"}]},
            stream_mode="custom",
        )
        if chunk.event == "custom"
    ]
    kinds = [p["type"] for p in parts]
    assert ("tool_call_started", "get_order") in [(p["type"], p.get("tool")) for p in parts]
    finished = [p for p in parts if p["type"] == "tool_call_finished"]
    assert [(p["tool"], p["status"]) for p in finished] == [("get_order", "ok")]
    text = "".join(p["text"] for p in parts if p["type"] == "text")
    assert text.startswith("Here is the order:")
    messages = [p["message"] for p in parts if p["type"] == "message"]
    assert [m["role"] for m in messages] == ["assistant", "tool", "assistant"]
    assert messages[-1]["content"] == text
    assert kinds.index("tool_call_started") < kinds.index("tool_call_finished")


async def test_a_refund_rejected_from_studio_does_not_run(client: Any) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    out = await client.runs.wait(
        thread_id, "support", input={"messages": [{"role": "user", "content": REFUND_REQUEST}]}
    )
    assert out["__interrupt__"][0]["value"]["requests"][0]["tool"] == "refund"

    out = await client.runs.wait(
        thread_id, "support", command={"resume": {"type": "reject", "message": "not eligible"}}
    )
    refund = _tools(out)[-1]
    assert (refund["name"], refund["status"]) == ("refund", "rejected")
    assert "not eligible" in refund["content"]
    assert out["messages"][-1]["content"] == (
        "The refund was not approved; a colleague will follow up."
    )


async def test_the_memory_agent_recalls_a_fact_in_another_thread_of_the_same_user(
    client: Any,
) -> None:
    user = f"user-{uuid.uuid4().hex[:8]}"

    async def ask(text: str, user_id: str) -> str:
        thread_id = (await client.threads.create())["thread_id"]
        out = await client.runs.wait(
            thread_id,
            "memory",
            input={"messages": [{"role": "user", "content": text}], "state": {"user_id": user_id}},
        )
        answer: str = out["messages"][-1]["content"]
        return answer

    assert await ask("Remember that I prefer email.", user) == "Noted, I will remember that."
    # The fact is in the server's store, in the pool of that user.
    found = await client.store.search_items(["criogen", "memory", "facts", "by", "user_id", user])
    assert [i["value"]["text"] for i in found["items"]] == ["The user says: I prefer email."]

    answer = await ask("How should you contact me?", user)
    assert answer == "From my memory: The user says: I prefer email."
    other = await ask("How should you contact me?", f"{user}-other")
    assert other.startswith("I know nothing about you yet")


async def test_a_sqlite_collection_opens_inside_a_node_of_the_dev_server(
    client: Any, dev_server: DevServer
) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    out = await client.runs.wait(
        thread_id, "docs", input={"messages": [{"role": "user", "content": "refunds"}]}
    )
    (result,) = _tools(out)
    assert result["status"] == "ok", result["content"]
    assert json.loads(result["content"])[0]["id"] == "refunds"
    assert "BlockingError" not in dev_server.log.read_text(errors="replace")
