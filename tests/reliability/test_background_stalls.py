"""Background runs whose worker stalls, blocks or loses its connections, with real
`criogen-graph worker` subprocesses on the local PostgreSQL (heartbeat 0.2 s, taken for
dead after 1 s of silence).

A worker that is paused (SIGSTOP, a VM freeze) or whose tool blocks its event loop past
`--stalled-after` still holds the thread's lock: it is not taken for dead, and its run
ends `succeeded`, the tool having run once. A worker whose PostgreSQL sessions are ended
mid-tool keeps the finished tool's result and continues the run by itself once it
reconnects. A job whose worker died while someone sent to the thread interactively is
not applied twice by the worker that takes it over. In each: the record's final status
matches the thread and every finished tool ran exactly once."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

from criogen_graph import RunFailedError, Storage, ThreadBusyError, close_runs
from tests.conftest import PG_URL, fresh_schema
from tests.reliability import _background_agents as bg
from tests.reliability.test_background_workers import STALLED_AFTER, Workers

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    workdir = tmp_path_factory.mktemp("bg-stalls")
    with fresh_schema("criogen_bgs") as url:
        w = Workers(url, workdir)
        old = {k: os.environ.get(k) for k in ("CRIOGEN_BG_WORKDIR", "CRIOGEN_BG_BLOCK")}
        os.environ["CRIOGEN_BG_WORKDIR"] = str(workdir)
        os.environ["CRIOGEN_BG_BLOCK"] = str(float(STALLED_AFTER) * 4)
        try:
            w.start()
            w.start()
            _wait_registered(w, 2)
            yield w
        finally:
            w.stop_all()
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _wait_registered(workers: Workers, count: int) -> None:
    from tests.reliability.test_background_workers import _wait_registered as wait

    wait(workers, count)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def storage(workers: Workers) -> AsyncIterator[Storage]:
    s = Storage(workers.url)
    yield s
    await close_runs(s)
    await s.close()


async def _until(what: Any, workers: Workers, limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while True:
        done = what()
        if asyncio.iscoroutine(done):
            done = await done
        if done:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"timed out; worker logs:\n{workers.logs()}")
        await asyncio.sleep(0.02)


def _entries(workers: Workers, thread_id: str) -> list[list[str]]:
    return [e for e in bg.ledger(workers.workdir) if e[1] == thread_id]


def _proc(workers: Workers, pid: str) -> Any:
    return next(p for p in workers.procs if str(p.pid) == pid)


def _silent_for(workers: Workers, seconds: float) -> bool:
    """Some worker's last heartbeat is older than `seconds` (it is taken for dead by
    the others' sweeps, every heartbeat)."""
    import psycopg

    with psycopg.connect(workers.url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM procrastinate_workers"
            " WHERE last_heartbeat < now() - make_interval(secs => %s)",
            (seconds,),
        ).fetchone()
    return bool(row and row[0])


def _terminate_sessions(workers: Workers, index: int) -> int:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = %s AND pid <> pg_backend_pid()",
            (f"criogen-bgw-{index}",),
        ).fetchall()
    return len(rows)


async def _saved(thread: Any, call_id: str) -> bool:
    graph, cfg = await thread._graph()
    snap = await graph.aget_state(cfg)
    for task in snap.tasks:
        result = task.result if isinstance(task.result, dict) else {}
        for m in result.get("messages") or ():
            if isinstance(m, dict) and m.get("tool_call_id") == call_id:
                return True
    return False


async def _check_final(handle: Any, thread: Any, text: str) -> Any:
    reply = await asyncio.wait_for(handle.reply(), 60)
    assert reply.text == text
    info = await handle.status()
    assert info.status == "succeeded", info
    assert info.error is None
    history = await thread.history(limit=1)
    assert history[0]["status"] == "completed"
    return info


async def test_a_worker_paused_past_stalled_after_keeps_its_run(
    workers: Workers, storage: Storage
) -> None:
    thread = bg.make_agent(storage).thread(f"paused-{uuid.uuid4().hex[:6]}")
    handle = await thread.submit("kill")
    await _until(lambda: any(e[0] == "slow-started" for e in _entries(workers, thread.id)), workers)
    victim = _proc(workers, next(e[4] for e in _entries(workers, thread.id)))
    victim.send_signal(signal.SIGSTOP)
    try:
        # Silent three times as long as it takes to be taken for dead: the other
        # worker's sweep (every heartbeat) has seen it many times.
        await _until(lambda: _silent_for(workers, float(STALLED_AFTER) * 3), workers)
        # The operator sees how long the run's worker has been silent.
        seen = await handle.status()
        assert seen.status == "running"
        assert seen.heartbeat_age_ms is not None
        assert seen.heartbeat_age_ms >= float(STALLED_AFTER) * 3000
    finally:
        (workers.workdir / "release").touch()
        victim.send_signal(signal.SIGCONT)
    try:
        info = await _check_final(handle, thread, "done: slow done")
    finally:
        (workers.workdir / "release").unlink()
    assert info.attempts == 1
    assert Counter(e[0] for e in _entries(workers, thread.id)) == {
        "fast": 1,
        "slow-started": 1,
        "slow": 1,
    }
    assert "Job was not found" not in workers.logs()


async def test_a_tool_blocking_the_event_loop_is_not_taken_for_dead(
    workers: Workers, storage: Storage
) -> None:
    thread = bg.make_agent(storage).thread(f"blocking-{uuid.uuid4().hex[:6]}")
    handle = await thread.submit("block")
    info = await _check_final(handle, thread, "done: blocked")
    assert info.attempts == 1
    assert Counter(e[0] for e in _entries(workers, thread.id)) == {"block-started": 1, "block": 1}


async def test_sessions_ended_mid_tool_keep_the_result_and_the_run_continues(
    workers: Workers, storage: Storage
) -> None:
    thread = bg.make_agent(storage).thread(f"terminated-{uuid.uuid4().hex[:6]}")
    handle = await thread.submit("kill")
    await _until(lambda: any(e[0] == "slow-started" for e in _entries(workers, thread.id)), workers)
    entries = _entries(workers, thread.id)
    fast_id = next(e[2] for e in entries if e[0] == "fast")
    await _until(lambda: _saved(thread, fast_id), workers)
    victim = _proc(workers, entries[0][4])
    assert _terminate_sessions(workers, workers.procs.index(victim)) > 0
    (workers.workdir / "release").touch()
    try:
        await _check_final(handle, thread, "done: slow done")
    finally:
        (workers.workdir / "release").unlink()
    # The tool that finished after the sessions ended ran once: its result was kept.
    assert Counter(e[0] for e in _entries(workers, thread.id)) == {
        "fast": 1,
        "slow-started": 1,
        "slow": 1,
    }
    messages = await thread.messages()
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    # The pools dropped the sessions the server ended: the continuation was handed none.
    assert "(unreachable)" not in workers.logs()
    # The thread goes on normally afterwards.
    more = await thread.submit("hello again")
    assert (await asyncio.wait_for(more.reply(), 60)).text == "done: rested"


async def test_a_job_taken_over_after_an_interactive_send_is_not_applied_twice(
    workers: Workers, storage: Storage
) -> None:
    agent = bg.make_agent(storage)
    thread = agent.thread(f"interleaved-{uuid.uuid4().hex[:6]}")
    handle = await thread.submit("kill")
    await _until(lambda: any(e[0] == "slow-started" for e in _entries(workers, thread.id)), workers)
    entries = _entries(workers, thread.id)
    fast_id = next(e[2] for e in entries if e[0] == "fast")
    await _until(lambda: _saved(thread, fast_id), workers)
    victim = _proc(workers, entries[0][4])
    survivor = next(p for p in workers.procs if p is not victim and p.poll() is None)
    # The survivor sleeps through the takeover window: the interactive send comes first.
    survivor.send_signal(signal.SIGSTOP)
    try:
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        # PostgreSQL frees the dead worker's lock once it sees its socket closed.
        deadline = time.monotonic() + 30
        while True:
            try:
                interactive = await asyncio.wait_for(thread.send("hello"), 60)
                break
            except ThreadBusyError:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
        assert interactive.text == "done: rested"
        (workers.workdir / "release").touch()
    finally:
        survivor.send_signal(signal.SIGCONT)
    try:
        with pytest.raises(RunFailedError) as exc:
            await asyncio.wait_for(handle.reply(), 60)
    finally:
        (workers.workdir / "release").unlink()
    # Cut off, then overtaken: not continued after the user's later send, and said so
    # (the record matches the thread: the run's answer was never saved).
    assert exc.value.code == "superseded"
    info = await handle.status()
    assert info.status == "failed", info
    users = [m["content"] for m in await thread.messages() if m["role"] == "user"]
    assert users.count("kill") == 1 and users.count("hello") == 1, users
    counts = Counter(e[0] for e in _entries(workers, thread.id))
    assert counts["fast"] == 1, counts
    assert counts["nap"] == 1, counts
    # The survivor names the run and its thread, as users know them.
    assert f"run {handle.id} of thread {thread.id!r}" in workers.logs()
    # No worker of this module finished a job taken from it (procrastinate's
    # "Job was not found or not in doing status").
    assert "Job was not found" not in workers.logs()
    workers.start()


async def test_a_paused_worker_whose_sessions_ended_never_overwrites_the_takeover(
    workers: Workers, storage: Storage
) -> None:
    """Paused with its sessions ended: the lock is free, so the other worker takes the run
    over and finishes it; the paused one, resumed, finds it finished and records nothing
    over the survivor's outcome."""
    live = [p for p in workers.procs if p.poll() is None]
    if len(live) < 2:
        workers.start()
        _wait_registered(workers, 2)
    thread = bg.make_agent(storage).thread(f"overtaken-{uuid.uuid4().hex[:6]}")
    handle = await thread.submit("kill")
    await _until(lambda: any(e[0] == "slow-started" for e in _entries(workers, thread.id)), workers)
    entries = _entries(workers, thread.id)
    fast_id = next(e[2] for e in entries if e[0] == "fast")
    await _until(lambda: _saved(thread, fast_id), workers)
    victim = _proc(workers, entries[0][4])
    victim.send_signal(signal.SIGSTOP)
    try:
        assert _terminate_sessions(workers, workers.procs.index(victim)) > 0

        def taken_over() -> bool:
            started = [e for e in _entries(workers, thread.id) if e[0] == "slow-started"]
            return len(started) == 2

        await _until(taken_over, workers)
        (workers.workdir / "release").touch()
        reply = await asyncio.wait_for(handle.reply(), 60)
        assert reply.text == "done: slow done"
    finally:
        victim.send_signal(signal.SIGCONT)
    try:
        # A graceful stop waits for the resumed worker's job to end.
        victim.send_signal(signal.SIGTERM)
        await asyncio.to_thread(victim.wait, 60)
    finally:
        (workers.workdir / "release").unlink()
    info = await handle.status()
    assert info.status == "succeeded", info
    assert info.attempts == 2
    assert info.worker is not None and not info.worker.endswith(f":{victim.pid}")
    counts = Counter(e[0] for e in _entries(workers, thread.id))
    assert counts["fast"] == 1, counts
    started = [e for e in _entries(workers, thread.id) if e[0] == "slow-started"]
    assert len(started) == 2 and started[0][3] == started[1][3]  # the same idempotency key
    messages = await thread.messages()
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
