"""SIGKILL at random points of `thread.delete()`: the deletion and its `delete` audit
record are one transaction, so afterwards the thread is either intact with no delete
record, or gone (checkpoints, pending writes, blobs, lock epoch; with `audit=True` its
older audit records too) with exactly one delete record. Never deleted and unrecorded,
never half deleted."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import Storage
from tests.conftest import storage_url, wait_until
from tests.reliability._report import report
from tests.reliability._storage_workers import echo_agent
from tests.reliability.conftest import run_child

TRIALS = 40
#: Turns saved on each thread before it is deleted (each a few checkpoints and writes).
TURNS = 30
#: The least share of trials whose kill must land while `delete()` was running.
MIN_MID_DELETE_SHARE = 0.3


def _url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """The backend's URL; on PostgreSQL a fresh schema of this test's own, which no other
    process's setup or locks can hold up."""
    if backend == "postgres":
        return str(request.getfixturevalue("pg_schema_url"))
    return storage_url(backend, tmp_path)


async def _make_thread(url: str, thread_id: str) -> int:
    storage = Storage(url)
    try:
        thread = echo_agent(storage).thread(thread_id, actor="maker")
        for n in range(TURNS):
            await thread.send(f"m{n}")
        return len(await storage.audit(thread_id))
    finally:
        await storage.close()


def _rows(url: str, backend: str, thread_id: str) -> dict[str, int]:
    """What the database still holds of the thread, table by table."""
    if backend == "sqlite":
        import sqlite3

        path = url[len("sqlite:///") :]
        with sqlite3.connect(path) as db:
            tables = {"checkpoints": "checkpoints", "writes": "writes"}
            return {
                name: db.execute(
                    f"SELECT count(*) FROM {table} WHERE thread_id = ?", (thread_id,)
                ).fetchone()[0]
                for name, table in tables.items()
            }
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        out = {}
        for table in ("checkpoints", "checkpoint_writes", "checkpoint_blobs", "criogen_locks"):
            row = conn.execute(
                f"SELECT count(*) FROM {table} WHERE thread_id = %s", (thread_id,)
            ).fetchone()
            assert row is not None
            out[table] = row[0]
        return out


def _child_url(url: str, backend: str, name: str) -> str:
    """`url` with the child's sessions named `name` (PostgreSQL), to see when they end."""
    if backend != "postgres":
        return url
    return f"{url}{'&' if '?' in url else '?'}application_name={name}"


def _sessions(url: str, name: str) -> int:
    """How many sessions named `name` the server still runs. A killed client's session
    goes on with what it had sent (even a COMMIT) until the server notices it is gone:
    what the database holds is final only after that."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
        ).fetchone()
    assert row is not None
    return int(row[0])


async def _audit(url: str, thread_id: str) -> list[dict[str, Any]]:
    storage = Storage(url)
    try:
        return await storage.audit(thread_id)
    finally:
        await storage.close()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("audit", [False, True], ids=["keep_audit", "audit_too"])
async def test_sigkill_during_delete_leaves_the_thread_whole_or_gone_and_recorded(
    durable_backend: str,
    audit: bool,
    tmp_path: Path,
    forkserver: Any,
    request: pytest.FixtureRequest,
) -> None:
    from tests.reliability import _storage_workers

    url = _url(durable_backend, tmp_path, request)
    rng = random.Random(f"{durable_backend}-{audit}-{uuid.uuid4().hex}")

    # How long an unkilled delete takes here, to spread the kill points over it.
    spans = []
    for _ in range(5):
        thread_id = f"delete-probe-{uuid.uuid4().hex}"
        await _make_thread(url, thread_id)
        began, took = forkserver.Event(), forkserver.RawValue("d", -1.0)
        started = forkserver.RawValue("d", -1.0)
        proc = run_child(
            forkserver, _storage_workers.delete, url, thread_id, audit, began, took, started
        )
        await asyncio.to_thread(proc.join, 60)
        assert proc.exitcode == 0 and took.value >= 0
        spans.append(took.value)
        assert not any((await asyncio.to_thread(_rows, url, durable_backend, thread_id)).values())
    span = statistics.median(spans)  # (not the mean: one probe slowed by a busy machine)

    counts: Counter[str] = Counter()
    problems: list[str] = []
    # The kill window adapts: a busy machine wakes the parent late, so kills aimed at the
    # end of the delete land after it; each kill that came too late narrows the window,
    # each mid-delete kill widens it again (up to the whole delete and a little after).
    window = span * 1.2
    for trial in range(TRIALS):
        thread_id = f"delete-kill-{trial}-{uuid.uuid4().hex}"
        records_before = await _make_thread(url, thread_id)
        rows_before = await asyncio.to_thread(_rows, url, durable_backend, thread_id)
        began, took = forkserver.Event(), forkserver.RawValue("d", -1.0)
        started = forkserver.RawValue("d", -1.0)
        name = f"criogen-delete-{uuid.uuid4().hex[:12]}"
        child_url = _child_url(url, durable_backend, name)
        proc = run_child(
            forkserver, _storage_workers.delete, child_url, thread_id, audit, began, took, started
        )
        assert await asyncio.to_thread(began.wait, 60), "the child never started"
        await wait_until(lambda s=started: s.value > 0, what="the child to call delete()")
        # The kill point, chosen at random over the delete, counted from when the child
        # called it (the parent learns of it a little late; a monotonic clock is shared).
        aim = started.value + rng.uniform(0, window)
        await asyncio.sleep(max(0.0, aim - time.monotonic()))
        proc.kill()
        await asyncio.to_thread(proc.join, 30)
        finished = took.value >= 0
        if durable_backend == "postgres":

            async def gone(name: str = name) -> bool:
                return await asyncio.to_thread(_sessions, url, name) == 0

            await wait_until(gone, within=30, what="the killed child's sessions to end")
        counts["deletes_finished_before_kill" if finished else "kills_mid_delete"] += 1
        window = window * 0.75 if finished else min(window * 1.25, span * 1.2)

        rows = await asyncio.to_thread(_rows, url, durable_backend, thread_id)
        records = await _audit(url, thread_id)
        deletes = [r for r in records if r["action"] == "delete"]
        intact = rows == rows_before and not deletes and len(records) == records_before
        gone = (
            not any(rows.values())
            and len(deletes) == 1
            and deletes[0]["details"]["existed"] is True
            and len(records) == (1 if audit else records_before + 1)
        )
        if intact:
            counts["found_intact"] += 1
        elif gone:
            counts["found_deleted_and_recorded"] += 1
        else:
            counts["found_broken"] += 1
            problems.append(
                f"trial {trial} ({'finished' if finished else 'killed mid-delete'}): rows "
                f"{rows} (before {rows_before}), {len(deletes)} delete records, "
                f"{len(records)} records (before {records_before})"
            )
        assert not (finished and not gone), f"trial {trial}: a finished delete left {rows}"

    report(
        f"sigkill_delete_{durable_backend}_{'audit_too' if audit else 'keep_audit'}",
        trials=TRIALS,
        kill_window_ms=round(span * 1000, 1),
        **{k: counts[k] for k in sorted(counts)},
    )
    assert not problems, "\n".join(problems)
    assert counts["kills_mid_delete"] >= TRIALS * MIN_MID_DELETE_SHARE, counts
