"""A send cancelled while its first model call runs, after the held-back input was saved
behind it (`HOLD_BACK_SECS`), k = 0..5 event-loop iterations after that became visible:
the caller gets its own CancelledError, the message is saved once, the thread is free for
another process at once (`on_busy="fail"`), and `retry()` answers it once."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import Agent, FunctionModel, Storage
from tests.conftest import storage_url


@pytest.mark.parametrize("k", range(6))
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_cancel_after_the_held_back_input_was_saved(
    backend: str, k: int, tmp_path: Path
) -> None:
    url = storage_url(backend, tmp_path)
    started = asyncio.Event()
    release = asyncio.Event()
    calls: list[int] = []

    async def script(messages: Any, tools: Any) -> Any:
        calls.append(1)
        started.set()
        await release.wait()
        return "answered"

    storage = Storage(url)
    reader = Storage(url)
    try:
        thread = Agent(FunctionModel(script), storage=storage).thread(uuid.uuid4().hex)
        seen = Agent(FunctionModel(script), storage=reader).thread(thread.id)
        task = asyncio.create_task(thread.send("hello"))
        await started.wait()
        deadline = asyncio.get_running_loop().time() + 10
        while not await seen.messages():  # saved behind the model call
            assert asyncio.get_running_loop().time() < deadline, "the input was never saved"
            await asyncio.sleep(0.005)
        for _ in range(k):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [(m["role"], m["content"]) for m in await seen.messages()] == [("user", "hello")]
        release.set()
        fresh = Storage(url, on_busy="fail")
        try:
            reply = await Agent(FunctionModel(script), storage=fresh).thread(thread.id).retry()
            messages = (
                await Agent(FunctionModel(script), storage=fresh).thread(thread.id).messages()
            )
        finally:
            await fresh.close()
    finally:
        await storage.close()
        await reader.close()
    assert reply.text == "answered"
    assert [(m["role"], m["content"]) for m in messages] == [
        ("user", "hello"),
        ("assistant", "answered"),
    ]
    assert len(calls) == 2  # the cancelled call, and retry's
