"""Child processes of the storage-layer reliability tests (run by the reliability
forkserver): a thread deleted while the parent may SIGKILL it, and a worker that opens a
fresh PostgreSQL schema together with others."""

from __future__ import annotations

import asyncio
import faulthandler
import os
import signal
import time
from typing import Any

from criogen_graph import Agent, FakeReply, FunctionModel, Memory, Storage


def echo_agent(storage: Storage | str) -> Agent[Any]:
    """Answers each message with "ack <message>"."""

    def script(messages: list[dict[str, Any]], tools: Any) -> Any:
        return FakeReply.text(f"ack {messages[-1]['content']}")

    return Agent(FunctionModel(script), storage=storage)


async def _delete(
    url: str, thread_id: str, audit: bool, began: Any, took: Any, started: Any
) -> None:
    storage = Storage(url)
    try:
        await storage.open()
        thread = echo_agent(storage).thread(thread_id, actor="deleter")
        began.set()  # the parent kills this process at a random moment from now on
        t0 = time.perf_counter()
        started.value = time.monotonic()  # (system-wide: the parent aims from it)
        await thread.delete(audit=audit)
        # A lock-free shared value, not an Event: a kill inside `Event.set()` would leave
        # its lock held, and the parent's next look at it would wait forever.
        took.value = time.perf_counter() - t0
    finally:
        await storage.close()


def delete(url: str, thread_id: str, audit: bool, began: Any, took: Any, started: Any) -> None:
    """Child: delete the thread (the parent may kill it along the way); `started` (a
    `RawValue("d")`) gets the `time.monotonic()` at which `delete()` was called, `took`
    how long it took once it returned."""
    asyncio.run(_delete(url, thread_id, audit, began, took, started))


def _dump_tasks(path: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        for task in asyncio.all_tasks():
            f.write(f"\n{task!r}\n")
            task.print_stack(file=f)


async def _first_start(url: str, me: int, barrier: Any, out: Any, stacks: str) -> None:
    # SIGUSR2: where each task of this process waits (for a hang).
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, _dump_tasks, stacks)
    storage = Storage(url)
    try:
        # Every worker is at this line before any of them touches the database.
        await asyncio.to_thread(barrier.wait, 60)
        agent = echo_agent(storage)
        reply = await agent.thread(f"first-start-{me}").send(f"hello {me}")
        memory_agent = Agent(
            FunctionModel(lambda messages, tools: "noted"),
            memory=Memory.by_state("user_id"),
            storage=storage,
        )
        remembered = await memory_agent.thread(f"first-memory-{me}").send(
            "I prefer email", state={"user_id": f"user-{me}"}
        )
        store = await storage.get_store()
        await store.aput(("first-start",), f"k{me}", {"me": me})
        out.put({"me": me, "reply": reply.text, "memory": remembered.text})
    finally:
        await storage.close()


def first_start(url: str, me: int, barrier: Any, out: Any, stacks: str) -> None:
    """Child: open a storage at the same moment as the other workers, then send and use
    memory. For a hang, `SIGUSR2` appends every task's stack to the file `stacks`, and
    `SIGUSR1` every thread's."""
    fd = os.open(stacks, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    faulthandler.register(signal.SIGUSR1, file=fd, all_threads=True)
    try:
        asyncio.run(_first_start(url, me, barrier, out, stacks))
    except BaseException as exc:
        code = getattr(exc, "code", None)
        out.put({"me": me, "error": f"{type(exc).__name__}({code}): {exc}"})
