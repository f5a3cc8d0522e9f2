"""One `Storage` used from eight OS threads, each request on its own event loop
(`asyncio.run(thread.send(...))`, as in Flask, Django or a thread pool), half of them a new
loop per request: no crash, no undocumented exception, every accepted send saved exactly
once with its audit record, one writer per thread id across all loops, and PostgreSQL
connections bounded (none left once every loop has ended)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, storage_url
from tests.reliability._report import report

ITERATIONS = 25


def _run_child(url: str, on_busy: str, app_name: str) -> dict[str, Any]:
    """The scenario in a subprocess, so a segfault fails the test with its signal."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.reliability._threads_worker",
            url,
            on_busy,
            str(ITERATIONS),
            app_name,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=500,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )
    if proc.returncode < 0:
        pytest.fail(
            f"the process died of {signal.Signals(-proc.returncode).name}:\n{proc.stderr[-4000:]}"
        )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return dict(json.loads(line[len("RESULT ") :]))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("on_busy", ["wait", "fail"])
@pytest.mark.parametrize("backend", ["sqlite", "memory", "postgres"])
def test_one_storage_from_eight_threads(backend: str, on_busy: str, tmp_path: Path) -> None:
    app_name = f"criogen_mt_{uuid.uuid4().hex[:10]}"
    url = storage_url(backend, tmp_path)
    if backend == "postgres":
        url = f"{url}{'&' if '?' in url else '?'}application_name={app_name}"
    out = _run_child(url, on_busy, app_name)

    assert out["errors"] == [], out["errors"][:5]
    accepted: dict[str, list[str]] = {}
    for tid, text in out["accepted"]:
        accepted.setdefault(tid, []).append(text)
    busy = sum(out["busy"].values())
    attempts = out["threads"] * out["iterations"]
    assert len(out["accepted"]) + busy == attempts
    if on_busy == "wait":
        assert busy == 0
    duplicates = 0
    for tid, saved in out["saved"].items():
        users = [content for role, content in saved["messages"] if role == "user"]
        duplicates += sum(n - 1 for n in Counter(users).values() if n > 1)
        # Every accepted send exactly once, none that was refused; answered right after it
        # (one writer at a time: no fork, no interleaving).
        assert sorted(users) == sorted(accepted.get(tid, [])), tid
        assert [role for role, _ in saved["messages"]] == ["user", "assistant"] * len(users)
        for (_, question), (_, answer) in zip(
            saved["messages"][::2], saved["messages"][1::2], strict=True
        ):
            assert answer == f"ack {question}"
        # Every send has its audit record.
        assert saved["sends"] == sorted(accepted.get(tid, [])), tid
    assert duplicates == 0
    # Connections bounded by the loops alive at once (on PostgreSQL one pool of
    # max_connections=2 and one lock connection each; on SQLite two connections of three
    # files each and a lock file), and none left once every loop has ended.
    if backend == "postgres":
        assert out["connections_peak"] <= out["threads"] * 3, out["connections_peak"]
    if backend == "sqlite":
        assert out["connections_peak"] <= out["threads"] * 7, out["connections_peak"]
    assert out["connections_after"] == 0, out["connections_after"]
    assert out["connection_threads_after"] == 0, out["connection_threads_after"]
    report(
        f"threads_share_storage_{backend}_{on_busy}",
        os_threads=out["threads"],
        sends=attempts,
        saved=len(out["accepted"]),
        busy_errors=busy,
        other_errors=len(out["errors"]),
        duplicates=duplicates,
        audit_sends=sum(s["send_records"] for s in out["saved"].values()),
        connections_peak=out["connections_peak"],
        connections_after=out["connections_after"],
    )


def _open_connections(backend: str, url: str, app_name: str, db: Path) -> int:
    from tests.reliability._threads_worker import _pg_connections, _sqlite_files

    if backend == "postgres":
        return _pg_connections(url, app_name)
    return _sqlite_files(str(db))


async def _settled(backend: str, url: str, app_name: str, db: Path) -> int:
    """The storage's open connections once closing ones are gone (a PostgreSQL backend
    leaves pg_stat_activity a moment after its client hung up)."""
    deadline = asyncio.get_running_loop().time() + 20
    while True:
        n = await asyncio.to_thread(_open_connections, backend, url, app_name, db)
        if n == 0 or asyncio.get_running_loop().time() > deadline:
            return n
        await asyncio.sleep(0.05)


def _url(backend: str, tmp_path: Path, app_name: str) -> str:
    url = storage_url(backend, tmp_path)
    if backend == "postgres":
        url = f"{url}{'&' if '?' in url else '?'}application_name={app_name}"
    return url


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_close_from_another_thread_leaves_a_running_loop_alone(
    backend: str, tmp_path: Path
) -> None:
    """`close()` awaited on one thread does not close the connections a run on another
    thread is using: that run finishes and is saved; its loop closes them as it ends."""
    from criogen_graph import Agent, FunctionModel, Storage

    app_name = f"criogen_close_{uuid.uuid4().hex[:10]}"
    url = _url(backend, tmp_path, app_name)
    db = tmp_path / "threads.db"
    storage = Storage(url)
    started, go_on = threading.Event(), threading.Event()

    async def script(messages: list[dict[str, Any]], tools: Any) -> str:
        started.set()
        await asyncio.to_thread(go_on.wait, 60)  # the run is in the middle of its turn
        return f"ack {messages[-1]['content']}"

    agent = Agent(FunctionModel(script), storage=storage)
    thread_id = f"close-{uuid.uuid4().hex}"
    outcome: list[str] = []

    def run() -> None:
        try:
            reply = asyncio.run(agent.thread(thread_id).send("hello"))
            outcome.append(reply.text)
        except BaseException as exc:
            outcome.append(f"{type(exc).__name__}: {exc}")

    worker = threading.Thread(target=run)
    worker.start()
    assert started.wait(60)
    asyncio.run(storage.close())  # from another thread and loop, mid-run
    assert _open_connections(backend, url, app_name, db) > 0  # the run's are still open
    go_on.set()
    worker.join(60)
    assert outcome == ["ack hello"]

    async def after() -> tuple[list[Any], int]:
        # Once the run's loop ended, its connections are gone; this loop's are its own.
        left = await _settled(backend, url, app_name, db)
        messages = await agent.thread(thread_id).messages()
        await storage.close()
        return messages, left

    messages, left = asyncio.run(after())
    assert [m["content"] for m in messages] == ["hello", "ack hello"]
    assert left == 0
    assert asyncio.run(_settled(backend, url, app_name, db)) == 0
    report(f"close_from_another_thread_{backend}", runs_finished=1, connections_left=left)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_loops_closed_without_shutdown_leak_nothing(backend: str, tmp_path: Path) -> None:
    """Event loops closed with `loop.close()` alone (no `shutdown_asyncgens`, so no
    await could close their connections): the next opening lets go of them, so
    connections stay bounded, and none is left after the last loop."""
    from criogen_graph import Storage
    from tests.reliability._workers import echo_agent

    app_name = f"criogen_abandon_{uuid.uuid4().hex[:10]}"
    url = _url(backend, tmp_path, app_name)
    db = tmp_path / "threads.db"
    storage = Storage(url, max_connections=2)
    agent = echo_agent(storage)
    thread_id = f"abandon-{uuid.uuid4().hex}"
    peak = 0
    loops = 15
    for n in range(loops):
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(agent.thread(thread_id).send(f"m{n}"))
        finally:
            loop.close()
        peak = max(peak, _open_connections(backend, url, app_name, db))
    messages = asyncio.run(agent.thread(thread_id).messages())
    assert [m["content"] for m in messages if m["role"] == "user"] == [
        f"m{n}" for n in range(loops)
    ]
    # At most the last closed loop's and a new one's at once.
    assert peak <= (6 if backend == "postgres" else 14), peak
    left = asyncio.run(_settled(backend, url, app_name, db))
    assert left == 0
    report(f"loops_closed_without_shutdown_{backend}", loops=loops, peak=peak, left=left)


@pytest.mark.timeout(300)
def test_in_process_locks_across_threads_under_timeouts_and_cancellation() -> None:
    """The in-process thread lock shared by OS threads, each on its own event loop:
    waiters time out, are cancelled and are handed the lock at the same moments, and
    still there is never more than one holder, a waiter on another loop wakes when the
    lock is handed to it, and nothing is left held or queued."""
    import random

    from criogen_graph.storage.locks import LocalLocks

    locks = LocalLocks()
    inside = 0
    most = 0
    counts: Counter[str] = Counter()
    guard = threading.Lock()

    async def one(rng: random.Random) -> None:
        nonlocal inside, most
        task = asyncio.current_task()
        assert task is not None
        if rng.random() < 0.3:  # cancelled at a random moment of its wait or hold
            asyncio.get_running_loop().call_later(rng.uniform(0, 0.003), task.cancel)
        try:
            if not await locks.acquire("t", rng.choice([None, 0.0005, 0.002, 30.0])):
                with guard:
                    counts["refused_or_timed_out"] += 1
                return
            with guard:
                inside += 1
                most = max(most, inside)
                counts["held"] += 1
            try:
                await asyncio.sleep(rng.uniform(0, 0.001))
            finally:
                with guard:
                    inside -= 1
                locks.release("t")
        except asyncio.CancelledError:
            with guard:
                counts["cancelled"] += 1

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(150):
            try:
                # A holder keeps it a millisecond at most: a waiter still waiting after
                # 10 s was not woken when the lock was handed to it.
                asyncio.run(asyncio.wait_for(one(rng), 10))
            except TimeoutError:
                with guard:
                    counts["stranded"] += 1

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert most == 1
    assert counts["stranded"] == 0
    assert not locks._held and not locks._waiters
    assert counts["held"] > 0
    report("in_process_locks_across_threads", os_threads=8, attempts=8 * 150, **counts)


def _fresh_file_trial(url: str, label: str) -> tuple[list[str], list[str]]:
    """Eight OS threads send at once, each its first request, to a storage nobody has
    opened yet; returns the errors and the user messages saved."""
    from criogen_graph import Storage
    from tests.reliability._workers import echo_agent

    storage = Storage(url, on_busy="wait")
    agent = echo_agent(storage)
    start = threading.Barrier(8)
    errors: list[str] = []

    def first(me: int) -> None:
        start.wait()
        try:
            asyncio.run(agent.thread(f"t{me % 2}").send(f"w{me}"))
        except BaseException as exc:
            errors.append(f"{label}, w{me}: {type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=first, args=(me,)) for me in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)

    async def saved() -> list[str]:
        got = [m["content"] for t in ("t0", "t1") for m in await agent.thread(t).messages()]
        await storage.close()
        return got

    return errors, [c for c in asyncio.run(saved()) if not c.startswith("ack ")]


@pytest.mark.timeout(300)
def test_fresh_sqlite_file_first_used_by_eight_threads_at_once(tmp_path: Path) -> None:
    """Eight OS threads start on a SQLite file nobody has opened yet, each with its own
    event loop (the first requests of a sync web app): every first send is saved. An inline
    connection that cached the empty schema before another thread created the tables
    failed its first read with "no such table: checkpoints" (about one fresh file in 25,
    so the test starts many)."""
    trials = 80
    for trial in range(trials):
        errors, questions = _fresh_file_trial(
            f"sqlite:///{tmp_path}/fresh-{trial}.db", f"trial {trial}"
        )
        assert errors == [], errors[:3]
        assert sorted(questions) == [f"w{me}" for me in range(8)]
    report("fresh_sqlite_file_eight_threads", trials=trials, sends=trials * 8, errors=0)
