"""Web workers starting together against a new PostgreSQL database must all come up.

Two processes opening a fresh database at the same moment used to deadlock forever: the
setup held an advisory lock while LangGraph's migrations ran `CREATE INDEX
CONCURRENTLY`, which waits for every other open transaction, among them the other
process's statement blocked on that very advisory lock. The same happened on the first
use of memory (the store's migrations). And a setup wait that cannot end must end in a
`StorageError`, not a hang."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from criogen_graph import Storage, StorageError
from tests.conftest import PG_URL, require_postgres
from tests.reliability._report import report
from tests.reliability.conftest import run_child

WORKERS = 6
#: Fresh databases (schemas) opened, each by every worker at once.
ROUNDS = 3
#: How long every worker together may take to come up (a hang fails the test, with the
#: workers' stacks).
BOUND_SECS = 90


@contextlib.contextmanager
def _fresh_schema() -> Iterator[str]:
    """A URL whose tables live in a new, empty schema (dropped after)."""
    schema = f"criogen_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in PG_URL else "?"
    try:
        yield f"{PG_URL}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


async def _start_together(url: str, stacks_dir: Path, forkserver: Any) -> list[dict[str, Any]]:
    """`WORKERS` processes, released together by a barrier, each opening `url` and then
    sending and using memory; what each reported (a hang fails the test, with every
    stuck worker's stacks)."""
    from tests.reliability import _storage_workers

    barrier = forkserver.Barrier(WORKERS)
    out = forkserver.Queue()
    stacks = [stacks_dir / f"stacks-{me}.txt" for me in range(WORKERS)]
    procs = [
        run_child(forkserver, _storage_workers.first_start, url, me, barrier, out, str(s))
        for me, s in enumerate(stacks)
    ]
    results: list[dict[str, Any]] = []
    try:

        async def collect() -> None:
            while len(results) < WORKERS:
                results.append(await asyncio.to_thread(out.get, True, BOUND_SECS))

        try:
            await asyncio.wait_for(collect(), BOUND_SECS)
        except (TimeoutError, Exception) as exc:
            stuck = [p for p in procs if p.is_alive()]
            for p in stuck:
                os.kill(p.pid, signal.SIGUSR2)  # each writes its tasks' stacks ...
            await asyncio.sleep(1)
            for p in stuck:
                os.kill(p.pid, signal.SIGUSR1)  # ... and its threads' (then it is killed)
            await asyncio.sleep(1)
            dumps = "\n".join(
                f"--- worker {me} ---\n{s.read_text() if s.exists() else ''}"
                for me, s in enumerate(stacks)
                if procs[me] in stuck
            )
            pytest.fail(
                f"{len(stuck)} of {WORKERS} workers did not come up within {BOUND_SECS}s "
                f"({type(exc).__name__}); got {results}; their stacks:\n{dumps}"
            )
        for p in procs:
            await asyncio.to_thread(p.join, 30)
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                await asyncio.to_thread(p.join, 10)
    return results


@pytest.mark.timeout(600)
async def test_workers_opening_a_fresh_database_together_all_come_up(
    tmp_path: Path, forkserver: Any
) -> None:
    require_postgres()
    came_up = 0
    for round_ in range(ROUNDS):
        with _fresh_schema() as url:
            stacks_dir = tmp_path / f"round-{round_}"
            stacks_dir.mkdir()
            results = await _start_together(url, stacks_dir, forkserver)
            errors = [r for r in results if "error" in r]
            assert not errors, errors
            assert sorted(r["me"] for r in results) == list(range(WORKERS))
            assert all(r["reply"] == f"ack hello {r['me']}" for r in results)
            came_up += len(results)
            storage = Storage(url)
            try:
                store = await storage.get_store()
                assert len(await store.asearch(("first-start",), limit=100)) == WORKERS
                assert len(await storage.threads()) == 2 * WORKERS
            finally:
                await storage.close()
    report(
        "postgres_concurrent_first_start",
        rounds=ROUNDS,
        workers_per_round=WORKERS,
        came_up=came_up,
        hung=0,
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("what", ["open", "store"])
async def test_a_setup_wait_past_its_bound_is_a_storage_error(
    pg_schema_url: str, what: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another session holds the setup lock and never lets go (a process stuck in its
    migrations): opening the storage, or its first use of memory, ends in
    `StorageError(code="setup_timeout")` within the bound, and works once it is free."""
    from criogen_graph.storage import postgres

    monkeypatch.setattr(postgres, "SETUP_WAIT_SECS", 1.0, raising=False)
    storage = Storage(pg_schema_url)
    if what == "store":
        await storage.open()
    blocker = await psycopg.AsyncConnection.connect(pg_schema_url, autocommit=True)
    try:
        # The schema's setup lock, as a process stuck in its setup would hold it.
        lock = getattr(postgres, "_SETUP_LOCK", "%s")
        key = getattr(postgres, "_SETUP_CLASS", 0x6372696F67656E)  # (the old, database-wide key)
        cur = await blocker.execute(f"SELECT pg_try_advisory_lock({lock})", (key,))
        assert await cur.fetchone() == (True,)
        setup = storage.open if what == "open" else storage.get_store
        with pytest.raises(StorageError) as info:
            await asyncio.wait_for(setup(), 30)
        assert info.value.code == "setup_timeout"
        assert "setting up" in str(info.value)
        await blocker.execute(f"SELECT pg_advisory_unlock({lock})", (key,))
        await asyncio.wait_for(setup(), 30)
        report(f"postgres_setup_wait_bounded_{what}", waits=1, setup_timeout=1, hung=0)
    finally:
        await blocker.close()
        await storage.close()
