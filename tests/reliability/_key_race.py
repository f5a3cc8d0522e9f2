"""Child process of test_encryption_key_race: open a fresh storage with a key (or none)
at the same moment as other processes, and write a thread if the storage let it in."""

from __future__ import annotations

import asyncio
from typing import Any

from criogen_graph import StorageError
from tests.reliability._workers import echo_agent


async def _open_and_write(
    url: str, key: str | None, thread_id: str, secret: str, barrier: Any
) -> dict[str, Any]:
    from criogen_graph import Storage

    storage = Storage(url, encryption_key=key)
    agent = echo_agent(storage)
    await asyncio.to_thread(barrier.wait, 60)  # every process opens at the same moment
    try:
        await storage.open()
    except StorageError as exc:
        return {"key": key, "refused": exc.code, "message": str(exc)}
    try:
        await agent.thread(thread_id, actor="race").send(f"say {secret}")
        return {"key": key, "thread_id": thread_id, "wrote": secret}
    finally:
        await storage.close()


def open_and_write(
    url: str, key: str | None, thread_id: str, secret: str, barrier: Any, out: Any
) -> None:
    """Child: puts `{"key", "thread_id", "wrote"}`, `{"key", "refused", "message"}` or
    `{"key", "error"}`. (Thread ids are stored in the clear by design: the secret is only
    in the message.)"""
    try:
        out.put(asyncio.run(_open_and_write(url, key, thread_id, secret, barrier)))
    except BaseException as exc:
        out.put({"key": key, "error": f"{type(exc).__name__}: {exc}"})
