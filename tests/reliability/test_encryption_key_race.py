"""Four processes open a fresh storage at the same moment, with different keys or none:
exactly one key (or "no key") wins, every other opener gets
`StorageError(code="encryption")` and writes nothing, everything written is readable with
the winning key, and an encrypted storage holds nothing in the clear."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import Storage, StorageError
from tests.conftest import PG_URL, require_postgres
from tests.reliability._report import report

TRIALS = 32
#: The keys of the four processes, trial by trial (None: opened without a key).
PATTERNS: list[tuple[str | None, ...]] = [
    ("key-A", "key-B", "key-A", "key-B"),
    ("key-A", None, "key-B", None),
    (None, "key-A", None, "key-A"),
    ("key-A", "key-B", None, "key-A"),
]


def _schema_url(schema: str) -> str:
    sep = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{sep}options=-csearch_path%3D{schema}"


def _pg(sql: str) -> None:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(sql)


def _stored_bytes(backend: str, where: str) -> bytes:
    """Every byte the storage holds: the SQLite file and its WAL, or the PostgreSQL rows."""
    if backend == "sqlite":
        return b"".join(
            Path(where + suffix).read_bytes()
            for suffix in ("", "-wal")
            if Path(where + suffix).exists()
        )
    import psycopg

    chunks: list[bytes] = []
    with psycopg.connect(_schema_url(where), autocommit=True) as conn:
        for sql in (
            "SELECT blob FROM checkpoint_blobs",
            "SELECT blob FROM checkpoint_writes",
            "SELECT convert_to(checkpoint::text || metadata::text, 'UTF8') FROM checkpoints",
            "SELECT details FROM criogen_audit",
            "SELECT value FROM criogen_meta",
        ):
            chunks += [bytes(r[0]) for r in conn.execute(sql).fetchall() if r[0] is not None]
    return b"\n".join(chunks)


async def _readable(url: str, key: str | None, writers: list[dict[str, Any]]) -> bool:
    """Whether every thread written is there, whole, read with `key`."""
    async with Storage(url, encryption_key=key) as storage:
        from tests.reliability._workers import echo_agent

        agent = echo_agent(storage)
        for w in writers:
            secret = w["wrote"]
            messages = await agent.thread(w["thread_id"]).messages()
            if [m["content"] for m in messages] != [f"say {secret}", f"ack say {secret}"]:
                return False
            audit = await storage.audit(w["thread_id"])
            if [a["details"].get("input") for a in audit if a["action"] == "send"] != [
                f"say {secret}"
            ]:
                return False
    return True


async def _refused(url: str, key: str | None) -> str | None:
    """The error code opening with `key` gets (None: it opened)."""
    storage = Storage(url, encryption_key=key)
    try:
        await storage.open()
    except StorageError as exc:
        return exc.code
    await storage.close()
    return None


@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_concurrent_first_opens_with_mixed_keys(
    backend: str, tmp_path: Path, forkserver: Any
) -> None:
    from tests.reliability import _key_race

    if backend == "postgres":
        require_postgres()
    counts = {
        "trials": 0,
        "openers": 0,
        "one_winner": 0,
        "won_by_a_key": 0,
        "won_without_key": 0,
        "several_winners": 0,
        "refused_encryption": 0,
        "refused_other": 0,
        "errors": 0,
        "unreadable": 0,
        "in_the_clear": 0,
        "other_keys_refused": 0,
        "other_keys_let_in": 0,
    }
    failures: list[str] = []
    for trial in range(TRIALS):
        keys = PATTERNS[trial % len(PATTERNS)]
        if backend == "sqlite":
            where = str(tmp_path / f"trial-{trial}.db")
            url = f"sqlite:///{where}"
        else:
            where = f"criogen_keyrace_{uuid.uuid4().hex[:12]}"
            _pg(f'CREATE SCHEMA "{where}"')
            url = _schema_url(where)
        try:
            barrier, out = forkserver.Barrier(len(keys)), forkserver.Queue()
            secrets = [f"SECRET{uuid.uuid4().hex}" for _ in keys]
            procs = [
                forkserver.Process(
                    target=_key_race.open_and_write,
                    args=(url, key, f"t-{trial}-{n}", secret, barrier, out),
                )
                for n, (key, secret) in enumerate(zip(keys, secrets, strict=True))
            ]
            for p in procs:
                p.start()
            results = [await asyncio.to_thread(out.get, True, 180) for _ in procs]
            for p in procs:
                await asyncio.to_thread(p.join, 60)
            counts["trials"] += 1
            counts["openers"] += len(results)
            errors = [r for r in results if "error" in r]
            counts["errors"] += len(errors)
            failures += [f"trial {trial}: {r['error']}" for r in errors]
            writers = [r for r in results if "wrote" in r]
            refused = [r for r in results if "refused" in r]
            counts["refused_encryption"] += sum(r["refused"] == "encryption" for r in refused)
            counts["refused_other"] += sum(r["refused"] != "encryption" for r in refused)
            failures += [
                f"trial {trial}: refused with {r['refused']}: {r['message']}"
                for r in refused
                if r["refused"] != "encryption"
            ]
            winners = {r["key"] for r in writers}
            if len(winners) != 1:
                counts["several_winners"] += 1
                failures.append(f"trial {trial}: keys {keys} let in {sorted(map(str, winners))}")
                continue
            counts["one_winner"] += 1
            winner = winners.pop()
            counts["won_by_a_key" if winner is not None else "won_without_key"] += 1
            # Nobody with another key was let in.
            assert all(r["key"] != winner for r in refused)
            try:
                ok = await _readable(url, winner, writers)
            except Exception as exc:
                ok = False
                failures.append(f"trial {trial}: reading: {type(exc).__name__}: {exc}")
            counts["unreadable"] += not ok
            for other in {*keys, "key-C"} - {winner}:
                code = await _refused(url, other)
                if code == "encryption":
                    counts["other_keys_refused"] += 1
                else:
                    counts["other_keys_let_in"] += 1
                    failures.append(f"trial {trial}: key {other!r} after {winner!r}: {code}")
            if winner is not None:
                stored = _stored_bytes(backend, where)
                leaked = [s for s in secrets if s.encode() in stored]
                counts["in_the_clear"] += len(leaked)
                if leaked:
                    failures.append(f"trial {trial}: {len(leaked)} secrets in the clear")
        finally:
            if backend == "postgres":
                _pg(f'DROP SCHEMA "{where}" CASCADE')
    report(f"encryption_key_race_{backend}", **counts)
    assert not failures, failures[:10]
    assert counts["one_winner"] == TRIALS
    assert counts["errors"] == counts["refused_other"] == counts["unreadable"] == 0
    assert counts["in_the_clear"] == counts["other_keys_let_in"] == 0


def _forget_claim(backend: str, where: str) -> None:
    """Make the storage look written before claims existed: no claim row (an encrypted
    one keeps its key check, as those versions wrote it)."""
    if backend == "sqlite":
        import contextlib
        import sqlite3

        with contextlib.closing(sqlite3.connect(where)) as db, db:
            db.execute("DELETE FROM criogen_meta WHERE key = 'encryption'")
        return
    import psycopg

    with psycopg.connect(where, autocommit=True) as conn:
        conn.execute("DELETE FROM criogen_meta WHERE key = 'encryption'")


@pytest.mark.parametrize("written_with", [None, "key-A"])
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_storages_written_before_claims_open_as_they_were(
    backend: str, written_with: str | None, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from tests.reliability._workers import echo_agent

    if backend == "sqlite":
        where = str(tmp_path / "old.db")
        url = f"sqlite:///{where}"
    else:
        url = where = request.getfixturevalue("pg_schema_url")
    async with Storage(url, encryption_key=written_with) as storage:
        await echo_agent(storage).thread("t-old").send("from before")
    _forget_claim(backend, where)

    refused = 0
    for key in {None, "key-A", "key-B"} - {written_with}:
        # Another key (or none, or a key on an unencrypted storage that holds threads)
        # is refused, and records nothing: the storage stays what it was.
        assert await _refused(url, key) == "encryption", key
        refused += 1
    async with Storage(url, encryption_key=written_with) as storage:
        messages = await echo_agent(storage).thread("t-old").messages()
        assert [m["content"] for m in messages] == ["from before", "ack from before"]
        await echo_agent(storage).thread("t-old").send("and after")
    for key in {None, "key-A", "key-B"} - {written_with}:
        assert await _refused(url, key) == "encryption", key
    report(
        f"encryption_old_storage_{backend}_{'encrypted' if written_with else 'plain'}",
        other_keys_refused=refused,
        opened_as_before=1,
    )
