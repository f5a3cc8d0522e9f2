"""PostgreSQL stopped and started again in the middle of a run, on a server of the test's
own (initdb in a temp dir, a free port, the machine's PostgreSQL binaries), so the shared
server is left alone: the run fails with a clear StorageError, nothing saved is lost, and
retry() completes once the server is back."""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import Agent, FakeReply, FunctionModel, Storage, StorageError, tool
from tests.conftest import wait_until
from tests.reliability._report import report


def _bindir() -> str | None:
    found = shutil.which("pg_config")
    if found:
        out = subprocess.run([found, "--bindir"], capture_output=True, text=True)
        if out.returncode == 0 and Path(out.stdout.strip(), "initdb").exists():
            return out.stdout.strip()
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    return next((d for d in dirs if Path(d, "initdb").exists()), None)


class PrivatePostgres:
    """A PostgreSQL server of our own: `start()`, `stop()`, `url`."""

    def __init__(self, bindir: str) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="criogen-pg-"))
        self.data = self.root / "data"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres?connect_timeout=2"
        # PostgreSQL refuses to run as root: run it as the postgres user then.
        self.prefix: list[str] = []
        if os.geteuid() == 0:
            self.prefix = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.root, "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    def _run(self, tool: str, *args: str) -> None:
        cmd = [*self.prefix, str(Path(self.bindir, tool)), *args]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"{tool} failed: {out.stdout}\n{out.stderr}")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.root / "log"),
            "-w",
            "start",
        )

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def remove(self) -> None:
        try:
            self.stop()
        except RuntimeError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def private_pg() -> Iterator[PrivatePostgres]:
    bindir = _bindir()
    if bindir is None:
        reason = "no PostgreSQL server binaries (initdb, pg_ctl) on this machine"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must run the PostgreSQL restart test: {reason}")
        pytest.skip(reason)
    pg = PrivatePostgres(bindir)
    try:
        pg.start()
        yield pg
    finally:
        pg.remove()


def agent_for(
    storage: Storage, started: asyncio.Event, release: asyncio.Event, ran: list[str]
) -> Agent[Any]:
    @tool
    async def slow(order_id: str) -> str:
        """Waits until released."""
        ran.append(order_id)
        started.set()
        await release.wait()
        return f"{order_id} done"

    @tool
    async def fast(order_id: str) -> str:
        """Finishes at once."""
        ran.append(f"fast {order_id}")
        return f"{order_id} checked"

    def script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if messages[-1]["role"] == "user":
            return FakeReply.tool_calls(
                ("fast", {"order_id": "A-1"}), ("slow", {"order_id": "A-1"})
            )
        return "all done"

    return Agent(FunctionModel(script), tools=[fast, slow], storage=storage)


async def fast_result_saved(storage: Storage, thread_id: str) -> bool:
    """Whether the fast call's result is among the thread's saved pending writes."""
    head = await storage.checkpointer.aget_tuple(
        {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    )
    return head is not None and "A-1 checked" in repr(head.pending_writes)


@pytest.mark.timeout(300)
async def test_postgres_stopped_mid_run_then_retry_completes(private_pg: PrivatePostgres) -> None:
    started, release = asyncio.Event(), asyncio.Event()
    ran: list[str] = []
    storage = Storage(private_pg.url)
    agent = agent_for(storage, started, release, ran)
    thread = agent.thread("mid-run")
    run = asyncio.create_task(thread.send("check and do A-1"))
    await asyncio.wait_for(started.wait(), 30)
    # The fast call's result is saved by a write of its own, which may still be in
    # flight when the slow call starts: stop the server once it is in (a stop before it
    # would lose it, and the retry would run the fast call again, rightly).
    await wait_until(lambda: fast_result_saved(storage, "mid-run"), what="the fast result saved")

    await asyncio.to_thread(private_pg.stop)
    release.set()
    with pytest.raises(StorageError) as info:
        await asyncio.wait_for(run, 60)
    message = str(info.value)

    await asyncio.to_thread(private_pg.start)
    # The input, the model's reply and the fast call's result were saved before the stop.
    saved = await thread.messages()
    assert [m["role"] for m in saved] == ["user", "assistant", "tool"]
    assert saved[-1]["content"] == "A-1 checked"
    reply = await thread.retry()
    assert reply.text == "all done"
    assert [m["role"] for m in reply.messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert ran.count("fast A-1") == 1  # its saved result was not run again
    # The slow call finished while the server was down: its result was kept and saved
    # once the lock was taken again, so it did not run again.
    assert ran.count("A-1") == 1
    await storage.close()
    report(
        "postgres_restart_mid_run",
        runs=1,
        completed=1,
        error=type(info.value).__name__,
        code=str(info.value.code),
    )
    assert "PostgreSQL" in message or "database" in message.lower(), message


@pytest.mark.timeout(300)
async def test_postgres_down_before_a_send_then_up(private_pg: PrivatePostgres) -> None:
    started, release = asyncio.Event(), asyncio.Event()
    release.set()
    storage = Storage(private_pg.url)
    agent = agent_for(storage, started, release, [])
    thread = agent.thread("down-before")
    first = await thread.send("first")
    await asyncio.to_thread(private_pg.stop)
    with pytest.raises(StorageError):
        await thread.send("second")
    await asyncio.to_thread(private_pg.start)
    second = await thread.send("second")
    users = [m["content"] for m in second.messages if m["role"] == "user"]
    assert users == ["first", "second"]
    assert second.version > first.version
    await storage.close()
