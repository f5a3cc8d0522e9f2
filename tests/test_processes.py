"""Threads shared by real processes over SQLite and PostgreSQL: a run suspended in one
process is answered in another, a process killed mid-tool is retried elsewhere without
running finished calls again, and one writer holds a thread at a time."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import Storage, ThreadBusyError
from tests.conftest import spawn, storage_url, wait_until
from tests.procs.agents import approval_agent, ledger_lines, tools_agent


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def started(workdir: Path) -> bool:
    return any(x.startswith("slow-started") for x in ledger_lines(workdir))


async def fast_result_saved(storage: Storage, thread_id: str) -> bool:
    """Whether the `fast` call's result is saved (a pending write of the head checkpoint)."""
    await storage.open()
    tup = await storage.checkpointer.aget_tuple({"configurable": {"thread_id": thread_id}})
    if tup is None:
        return False
    for _, channel, value in tup.pending_writes or ():
        if channel == "messages":
            items = value if isinstance(value, list | tuple) else [value]
            if any(isinstance(m, dict) and m.get("name") == "fast" for m in items):
                return True
    return False


async def test_suspended_in_one_process_answered_in_another(
    durable_backend: str, tmp_path: Path, thread_id: str
) -> None:
    url = storage_url(durable_backend, tmp_path)
    first = finish(spawn("send_approval", url, thread_id, tmp_path))
    assert first["needs_approval"] is True and len(first["approvals"]) == 1
    assert ledger_lines(tmp_path) == []
    # a second process lists and answers the approval; the first one is gone
    second = finish(spawn("approve", url, thread_id, tmp_path))
    assert second == {"pending": ["refund"], "text": "handled"}
    assert sorted(ledger_lines(tmp_path)) == ["lookup A-1", "refund A-1"]
    # and this process sees the finished thread and the reviewer in the audit trail
    storage = Storage(url)
    thread = approval_agent(storage, tmp_path).thread(thread_id)
    assert (await thread.messages())[-1]["content"] == "handled"
    actors = {(a["action"], a["actor"]) for a in await storage.audit(thread_id)}
    assert {("send", "worker"), ("approve", "reviewer")} <= actors
    await storage.close()


async def test_killed_mid_tool_then_retried_in_another_process(
    durable_backend: str, tmp_path: Path, thread_id: str
) -> None:
    url = storage_url(durable_backend, tmp_path)
    observer = Storage(url)
    proc = spawn("send_tools", url, thread_id, tmp_path)
    try:
        await wait_until(lambda: started(tmp_path), what="the slow tool to start")
        await wait_until(
            lambda: fast_result_saved(observer, thread_id), what="the fast result to be saved"
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    (tmp_path / "release").touch()
    # the retry runs in yet another process
    result = finish(spawn("retry_tools", url, thread_id, tmp_path))
    assert result["text"] == "done"
    ledger = ledger_lines(tmp_path)
    assert sum(x.startswith("fast ") for x in ledger) == 1  # never run twice
    assert sum(x.startswith("slow-started") for x in ledger) == 2  # killed, then re-run
    assert sum(x.startswith("slow ") for x in ledger) == 1
    thread = tools_agent(observer, tmp_path).thread(thread_id)
    contents = [m["content"] for m in await thread.messages() if m["role"] == "tool"]
    assert contents == ["fast done", "slow done"]
    await observer.close()


async def test_one_writer_per_thread_across_processes(
    durable_backend: str, tmp_path: Path, thread_id: str
) -> None:
    url = storage_url(durable_backend, tmp_path)
    holder = spawn("send_tools", url, thread_id, tmp_path)
    try:
        await wait_until(lambda: started(tmp_path), what="the other process to hold the thread")
        fail = Storage(url, on_busy="fail")
        with pytest.raises(ThreadBusyError, match="another process"):
            await tools_agent(fail, tmp_path).thread(thread_id).send("me too")
        await fail.close()

        wait = Storage(url, on_busy="wait", busy_timeout_secs=60)
        mine = asyncio.create_task(tools_agent(wait, tmp_path).thread(thread_id).send("me too"))
        await asyncio.sleep(0.2)
        assert not mine.done()  # still waiting for the holder
        (tmp_path / "release").touch()
        assert finish(holder)["text"] == "done"
        reply = await asyncio.wait_for(mine, timeout=60)
    finally:
        if holder.poll() is None:
            holder.kill()
    # no fork: the waiting run started from the holder's finished run
    users = [m["content"] for m in reply.messages if m["role"] == "user"]
    assert users == ["go", "me too"]
    assert [m["role"] for m in reply.messages].count("tool") == 4
    await wait.close()


async def test_lock_of_a_dead_holder_is_recovered(
    durable_backend: str, tmp_path: Path, thread_id: str
) -> None:
    url = storage_url(durable_backend, tmp_path)
    observer = Storage(url)
    holder = spawn("send_tools", url, thread_id, tmp_path)
    try:
        await wait_until(lambda: started(tmp_path), what="the other process to hold the thread")
        await wait_until(
            lambda: fast_result_saved(observer, thread_id), what="the fast result to be saved"
        )
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    (tmp_path / "release").touch()
    storage = Storage(url, on_busy="fail")
    # PostgreSQL frees a dead session's advisory locks once it sees the socket close.
    reply = await wait_until(
        lambda: _try_send(storage, tmp_path, thread_id), within=10, what="the lock to be free"
    )
    assert reply.text == "done"
    tools = [m for m in reply.messages if m["role"] == "tool"]
    # the killed run is closed: its finished call kept, the unfinished one marked
    assert [t["content"] for t in tools[:2]] == ["fast done", tools[1]["content"]]
    assert tools[1]["status"] == "skipped" and tools[1]["content"].startswith("Not run")
    await storage.close()
    await observer.close()


async def _try_send(storage: Storage, workdir: Path, thread_id: str) -> Any:
    try:
        return await tools_agent(storage, workdir).thread(thread_id).send("after the crash")
    except ThreadBusyError:
        return None
