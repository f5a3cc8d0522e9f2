"""Child process of test_storage_across_threads: one `Storage` used from many OS threads,
each sending with its own event loop, the way a sync web framework does it.

    python -m tests.reliability._threads_worker <url> <on_busy> <iterations> <app_name>

Half the threads do `asyncio.run(thread.send(...))` per request (a new event loop each
time); the other half keep one `asyncio.Runner` for all their requests. Thread ids are
both shared by every thread and private to one. Prints one JSON line with what was
accepted, refused and saved, and how many connections the storage had open at most and
after the last loop ended (PostgreSQL sessions of its `application_name`; file
descriptors on the SQLite file); a crash shows as the process's signal.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
import uuid
from collections import Counter
from typing import Any

from criogen_graph import Storage, ThreadBusyError
from tests.reliability._workers import echo_agent

THREADS = 8


def _pg_connections(url: str, app_name: str) -> int:
    import psycopg

    base = url.split("?", 1)[0]
    with psycopg.connect(base, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app_name,)
        ).fetchone()
    return int(row[0]) if row else 0


def _sqlite_files(path: str) -> int:
    """How many file descriptors of this process are open on the database (or its WAL)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += target.startswith(path)
    return count


def _connection_threads() -> int:
    """aiosqlite's worker threads alive (one per open SQLite connection)."""
    return sum(1 for t in threading.enumerate() if "_connection_worker_thread" in t.name)


def main(url: str, on_busy: str, iterations: int, app_name: str) -> dict[str, Any]:
    storage = Storage(url, on_busy=on_busy, busy_timeout_secs=120, max_connections=2)
    agent = echo_agent(storage)
    run = uuid.uuid4().hex[:8]
    shared = [f"shared-{run}-0", f"shared-{run}-1"]
    own = [f"own-{run}-{me}" for me in range(THREADS)]
    accepted: list[tuple[str, str]] = []
    busy = Counter[str]()
    errors: list[str] = []
    start = threading.Barrier(THREADS)
    guard = threading.Lock()

    def request(me: int, n: int) -> tuple[str, str]:
        # Even iterations on a shared thread, odd ones on the thread's own.
        tid = shared[(me + n) % 2] if n % 2 == 0 else own[me]
        return tid, f"w{me}-{n}"

    def worker(me: int) -> None:
        runner = asyncio.Runner() if me % 2 else None
        try:
            start.wait()
            for n in range(iterations):
                tid, text = request(me, n)
                coro = agent.thread(tid, actor=f"w{me}").send(text)
                try:
                    if runner is not None:
                        runner.run(coro)
                    else:
                        asyncio.run(coro)
                except ThreadBusyError:
                    with guard:
                        busy[tid] += 1
                    continue
                except BaseException as exc:
                    with guard:
                        errors.append(f"w{me}-{n} on {tid}: {type(exc).__name__}: {exc}")
                    continue
                with guard:
                    accepted.append((tid, text))
        finally:
            if runner is not None:
                runner.close()

    peak = 0
    sampling = True

    pg = storage.scheme == "postgres"
    sqlite_path = url.split(":///", 1)[1] if storage.scheme == "sqlite" else ""

    def connections() -> int:
        if pg:
            return _pg_connections(url, app_name)
        return _sqlite_files(sqlite_path) if sqlite_path else 0

    def sample() -> None:
        nonlocal peak
        while sampling:
            peak = max(peak, connections())
            time.sleep(0.02)

    if pg:
        _pg_connections(url, app_name)  # (psycopg imported here before the threads start)
    sampler = threading.Thread(target=sample, daemon=True) if pg or sqlite_path else None
    if sampler is not None:
        sampler.start()
    threads = [threading.Thread(target=worker, args=(me,)) for me in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sampling = False
    if sampler is not None:
        sampler.join()

    async def saved() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for tid in [*shared, *own]:
            messages = await agent.thread(tid).messages()
            audit = await storage.audit(tid)
            out[tid] = {
                "messages": [[m["role"], m["content"]] for m in messages],
                "sends": sorted(
                    a["details"].get("input", "") for a in audit if a["action"] == "send"
                ),
                "send_records": sum(1 for a in audit if a["action"] == "send"),
            }
        return out

    threads_saved = asyncio.run(saved())
    # Every loop has ended: nothing may be left open. (A PostgreSQL backend leaves
    # pg_stat_activity a moment after its client hung up; an aiosqlite thread ends a
    # moment after its connection closed.)
    deadline = time.monotonic() + 20
    while True:
        after, threads_after = connections(), _connection_threads()
        if after == threads_after == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    asyncio.run(storage.close())
    return {
        "threads": THREADS,
        "iterations": iterations,
        "accepted": accepted,
        "busy": dict(busy),
        "errors": errors,
        "saved": threads_saved,
        "connections_peak": peak,
        "connections_after": after,
        "connection_threads_after": threads_after,
    }


if __name__ == "__main__":
    url, on_busy, iterations, app_name = sys.argv[1:5]
    result = main(url, on_busy, int(iterations), app_name)
    print("RESULT " + json.dumps(result), flush=True)
