"""A process killed while the first model call of a send runs keeps the user's message:
it is saved while the model runs (on PostgreSQL, where the input waits to go in one
round trip with the model's answer, at most `HOLD_BACK_SECS` after the run starts), and
`retry()` in another process answers it, once."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import Agent, FunctionModel, Storage
from tests.conftest import storage_url
from tests.reliability.conftest import run_child

MESSAGE = "my order 1234 never arrived"


async def user_messages(url: str, thread_id: str) -> list[str]:
    storage = Storage(url)
    try:
        messages = (
            await Agent(FunctionModel(lambda m, t: "x"), storage=storage)
            .thread(thread_id)
            .messages()
        )
    finally:
        await storage.close()
    return [m["content"] for m in messages if m["role"] == "user"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_the_message_outlives_a_kill_during_the_first_model_call(
    backend: str, tmp_path: Path, forkserver: Any
) -> None:
    from tests.reliability import _workers

    url = storage_url(backend, tmp_path)
    thread_id = f"stuck-{uuid.uuid4().hex}"
    started = forkserver.Event()
    proc = run_child(forkserver, _workers.stuck_in_first_call, url, thread_id, started)
    try:
        assert await asyncio.to_thread(started.wait, 60), "the child never called the model"
        # The model is running (and never answers): the message must become durable.
        deadline = time.monotonic() + 10
        while not await user_messages(url, thread_id):
            assert time.monotonic() < deadline, (
                "the user's message was not saved while the first model call ran"
            )
            await asyncio.sleep(0.01)
    finally:
        proc.kill()
        await asyncio.to_thread(proc.join, 30)
    assert await user_messages(url, thread_id) == [MESSAGE]

    calls: list[list[dict[str, Any]]] = []

    def answer(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        calls.append(messages)
        return "sorry, a new one is on its way"

    storage = Storage(url, on_busy="wait", busy_timeout_secs=30)
    try:
        thread = Agent(FunctionModel(answer), storage=storage).thread(thread_id)
        reply = await thread.retry()
        assert reply.text == "sorry, a new one is on its way"
        roles = [(m["role"], m["content"]) for m in await thread.messages()]
    finally:
        await storage.close()
    assert roles == [("user", MESSAGE), ("assistant", "sorry, a new one is on its way")]
    assert len(calls) == 1 and calls[0][-1]["content"] == MESSAGE
