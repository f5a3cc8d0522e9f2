"""Background runs served by real `criogen-graph worker` subprocesses on the local
PostgreSQL: a worker SIGKILLed while a tool runs is replaced by another that continues
the run (the finished tool never runs again; the one that was running runs again, with
the same idempotency key), and the runs of one thread run in order, never together,
however many workers there are."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from criogen_graph import Storage, close_runs
from tests.conftest import PG_URL, require_postgres
from tests.reliability import _background_agents as bg

ROOT = Path(__file__).resolve().parents[2]
HEARTBEAT, STALLED_AFTER = "0.2", "1.0"


class Workers:
    def __init__(self, url: str, workdir: Path) -> None:
        self.url = url
        self.workdir = workdir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "CRIOGEN_BG_WORKDIR": str(self.workdir),
            "PYTHONPATH": str(ROOT),
            # Names the worker's sessions, for a test to end them (pg_terminate_backend).
            "PGAPPNAME": f"criogen-bgw-{len(self.procs)}",
        }
        log = open(self.workdir / f"worker-{len(self.procs)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "criogen_graph",
                "worker",
                "--agent",
                "tests.reliability._background_agents:agent",
                "--agent",
                "tests.reliability._background_agents:approver",
                "--storage",
                self.url,
                "--heartbeat",
                HEARTBEAT,
                "--stalled-after",
                STALLED_AFTER,
            ],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def logs(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.workdir.glob("worker-*.log")))

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# One schema and two worker processes for the module (starting them is most of the
# cost); each test has threads of its own. The SIGKILL test runs last: it leaves one.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    require_postgres()
    import psycopg

    workdir = tmp_path_factory.mktemp("bg-workers")
    schema = f"criogen_bgw_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in PG_URL else "?"
    w = Workers(f"{PG_URL}{sep}options=-csearch_path%3D{schema}", workdir)
    old = os.environ.get("CRIOGEN_BG_WORKDIR")
    os.environ["CRIOGEN_BG_WORKDIR"] = str(workdir)
    try:
        w.start()
        w.start()
        _wait_registered(w, 2)
        yield w
    finally:
        w.stop_all()
        if old is None:
            del os.environ["CRIOGEN_BG_WORKDIR"]
        else:
            os.environ["CRIOGEN_BG_WORKDIR"] = old
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def _wait_registered(workers: Workers, count: int) -> None:
    """Both workers are up (registered with their first heartbeat) before any test."""
    import psycopg

    deadline = time.monotonic() + 60
    with psycopg.connect(workers.url, autocommit=True) as conn:
        while True:
            ready = conn.execute("SELECT to_regclass('procrastinate_workers')").fetchone()
            row = (
                conn.execute("SELECT count(*) FROM procrastinate_workers").fetchone()
                if ready is not None and ready[0] is not None
                else None
            )
            if row is not None and row[0] >= count:
                return
            if time.monotonic() > deadline or any(p.poll() is not None for p in workers.procs):
                pytest.fail(f"the workers did not start:\n{workers.logs()}")
            time.sleep(0.05)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def storage(workers: Workers) -> AsyncIterator[Storage]:
    s = Storage(workers.url)
    yield s
    await close_runs(s)
    await s.close()


async def _until(what: Any, workers: Workers, limit: float = 60) -> None:
    """Wait for `what()` to be true (a bounded wait on an observable state)."""
    deadline = time.monotonic() + limit
    while not what():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out; worker logs:\n{workers.logs()}")
        await asyncio.sleep(0.02)


async def _saved(thread: Any, call_id: str) -> bool:
    """The result of tool call `call_id` is saved (a pending write of the thread)."""
    graph, cfg = await thread._graph()
    snap = await graph.aget_state(cfg)
    for task in snap.tasks:
        result = task.result if isinstance(task.result, dict) else {}
        for m in result.get("messages") or ():
            if isinstance(m, dict) and m.get("tool_call_id") == call_id:
                return True
    return False


async def _until_async(what: Any, workers: Workers, limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while not await what():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out; worker logs:\n{workers.logs()}")
        await asyncio.sleep(0.02)


async def test_runs_of_one_thread_run_in_order_across_workers(
    workers: Workers, storage: Storage
) -> None:
    agent = bg.make_agent(storage)
    handles = [await agent.thread("one-by-one").submit(f"seq {n}") for n in range(6)]
    others = [await agent.thread(f"side-{n}").submit(f"seq {100 + n}") for n in range(4)]
    replies = [await asyncio.wait_for(h.reply(), 60) for h in handles + others]
    assert [r.text for r in replies[:6]] == [f"done: {n}" for n in range(6)]
    entries = [e for e in bg.ledger(workers.workdir) if e[1] == "one-by-one"]
    assert [e[0] for e in entries] == [ev for n in range(6) for ev in (f"start-{n}", f"end-{n}")]
    users = [
        m["content"] for m in await agent.thread("one-by-one").messages() if m["role"] == "user"
    ]
    assert users == [f"seq {n}" for n in range(6)]
    infos = [await h.status() for h in handles + others]
    assert all(i.status == "succeeded" and i.attempts == 1 for i in infos)


async def test_an_approval_is_executed_by_whichever_worker_takes_it(
    workers: Workers, storage: Storage
) -> None:
    thread = bg.make_approver(storage).thread("approved-elsewhere")
    asked = await asyncio.wait_for((await thread.submit("nap please")).reply(), 60)
    assert asked.needs_approval
    assert not [e for e in bg.ledger(workers.workdir) if e[1] == thread.id]
    # The answer comes from this process (another machine, as far as the workers know).
    done = await asyncio.wait_for((await thread.submit_approve(expected=asked)).reply(), 60)
    assert done.text == "done: rested"
    naps = [e for e in bg.ledger(workers.workdir) if e[1] == thread.id]
    assert [e[0] for e in naps] == ["nap"]
    assert naps[0][4] in {str(p.pid) for p in workers.procs}


async def test_sigkilled_worker_run_is_finished_by_another_without_rerunning_finished_tools(
    workers: Workers, storage: Storage
) -> None:
    agent = bg.make_agent(storage)
    thread = agent.thread("killed-mid-tool")
    handle = await thread.submit("kill")

    def slow_started() -> list[list[str]]:
        return [e for e in bg.ledger(workers.workdir) if e[:2] == ["slow-started", thread.id]]

    await _until(lambda: bool(slow_started()), workers)
    # "Finished" means saved: `fast` may have returned a moment ago while its result is
    # still on its way to the database (then it would run again, like `slow`).
    fast_id = next(e[2] for e in bg.ledger(workers.workdir) if e[:2] == ["fast", thread.id])
    await _until_async(lambda: _saved(thread, fast_id), workers)
    victim = next(p for p in workers.procs if str(p.pid) == slow_started()[0][4])
    survivor = next(p for p in workers.procs if p is not victim)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    (workers.workdir / "release").touch()
    reply = await asyncio.wait_for(handle.reply(), 60)
    assert reply.text == "done: slow done"
    assert reply.run_id == handle.id
    entries = [e for e in bg.ledger(workers.workdir) if e[1] == thread.id]
    # The finished call never ran again; the interrupted one ran again, to its end once.
    assert Counter(e[0] for e in entries) == {"fast": 1, "slow-started": 2, "slow": 1}
    started = slow_started()
    assert [e[4] for e in started] == [str(victim.pid), str(survivor.pid)]
    assert started[0][3] == started[1][3]  # the same idempotency key both times
    info = await handle.status()
    assert info.status == "succeeded"
    assert info.attempts == 2
    assert info.worker is not None and info.worker.endswith(f":{survivor.pid}")
    messages = await thread.messages()
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    # The thread goes on normally afterwards.
    more = await thread.submit("hello again")
    assert (await asyncio.wait_for(more.reply(), 60)).text == "done: rested"
