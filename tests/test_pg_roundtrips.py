"""Round trips to PostgreSQL per `thread.send`, counted by a proxy in front of the server
(tests/pg_proxy.py): a regression guard for what a remote database costs per turn.

A send of the benchmarks' job (the model calls a tool, then answers) needs four: the
lock taken with the head read, the model's tool call saved before the tool runs, the
tool's result saved as it exists, and the last checkpoint saved with the lock's release.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

from criogen_graph import Agent, FakeReply, FunctionModel, Storage, tool
from tests.conftest import PG_URL, require_postgres
from tests.pg_proxy import PgProxy

#: Round trips per send of a fresh thread and of a thread with history (at most).
MAX_PER_SEND = 4


@pytest.fixture(scope="module")
def proxy() -> Iterator[PgProxy]:
    require_postgres()
    with PgProxy(PG_URL) as p:
        yield p


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
    proxy: PgProxy, storage: Storage
) -> None:
    agent = tool_then_done(storage)
    await agent.thread(uuid.uuid4().hex).send("warm up")  # pools, first-use imports
    n = await per_send(proxy, agent, [uuid.uuid4().hex for _ in range(5)])
    assert n <= MAX_PER_SEND, f"{n} round trips per send"


async def test_a_send_on_a_thread_with_history_costs_four_round_trips(
    proxy: PgProxy, storage: Storage
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
