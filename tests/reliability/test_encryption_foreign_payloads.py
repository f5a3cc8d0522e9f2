"""Payloads sealed with another key inside a storage whose key check passes (what the
key-check race of older versions left behind, or bytes changed on disk): every read of
them (checkpoints, pending writes, the audit trail, the store) raises
`StorageError(code="encryption")` naming the fix, never the cipher's bare
`ValueError: MAC check failed`; and nothing is written over them."""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import Agent, FakeReply, FunctionModel, Storage, StorageError, tool
from tests.conftest import PG_URL, require_postgres
from tests.reliability._report import report


@tool
def refund(amount: int) -> str:
    """Refund an amount."""
    return f"refunded {amount}"


def _agent(storage: Storage) -> Agent[Any]:
    def script(messages: list[dict[str, Any]], tools: Any) -> Any:
        if not any(m["role"] == "assistant" for m in messages):
            return FakeReply.tool_calls(("refund", {"amount": 7}))
        return "done"

    return Agent(FunctionModel(script), tools=[refund], approve=["refund"], storage=storage)


async def _write(url: str, key: str) -> None:
    """A thread waiting for approval (a checkpoint, its pending writes, audit records)
    and a store item, all sealed with `key`."""
    async with Storage(url, encryption_key=key) as storage:
        reply = await _agent(storage).thread("t-foreign", actor="ada").send("refund please")
        assert reply.needs_approval
        store = await storage.get_store()
        await store.aput(("notes",), "n1", {"text": "sealed note"})


def _meta(backend: str, where: str) -> list[tuple[str, bytes]]:
    """The storage's `criogen_meta` rows (its encryption claim and key check)."""
    if backend == "sqlite":
        with contextlib.closing(sqlite3.connect(where)) as db:
            return [(k, bytes(v)) for k, v in db.execute("SELECT key, value FROM criogen_meta")]
    import psycopg

    with psycopg.connect(where, autocommit=True) as conn:
        rows = conn.execute("SELECT key, value FROM criogen_meta").fetchall()
    return [(k, bytes(v)) for k, v in rows]


def _set_meta(backend: str, where: str, rows: list[tuple[str, bytes]]) -> None:
    if backend == "sqlite":
        with contextlib.closing(sqlite3.connect(where)) as db, db:
            db.execute("DELETE FROM criogen_meta")
            db.executemany("INSERT INTO criogen_meta (key, value) VALUES (?, ?)", rows)
        return
    import psycopg

    with psycopg.connect(where) as conn:  # (one transaction)
        conn.execute("DELETE FROM criogen_meta")
        for k, v in rows:
            conn.execute("INSERT INTO criogen_meta (key, value) VALUES (%s, %s)", (k, v))


@pytest.fixture
def schemas() -> Iterator[list[str]]:
    """Two fresh PostgreSQL schemas (URLs), dropped after."""
    require_postgres()
    import psycopg

    names = [f"criogen_foreign_{uuid.uuid4().hex[:12]}" for _ in range(2)]
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        for name in names:
            conn.execute(f'CREATE SCHEMA "{name}"')
    sep = "&" if "?" in PG_URL else "?"
    try:
        yield [f"{PG_URL}{sep}options=-csearch_path%3D{name}" for name in names]
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            for name in names:
                conn.execute(f'DROP SCHEMA "{name}" CASCADE')


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_payloads_of_another_key_raise_storage_error(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "sqlite":
        written, other = str(tmp_path / "written.db"), str(tmp_path / "other.db")
        url, other_url = f"sqlite:///{written}", f"sqlite:///{other}"
    else:
        url, other_url = written, other = request.getfixturevalue("schemas")
    await _write(url, "key-A")
    async with Storage(other_url, encryption_key="key-B"):
        pass  # a storage whose key check is key-B's
    own = _meta(backend, written)
    _set_meta(backend, written, _meta(backend, other))

    refused = 0
    async with Storage(url, encryption_key="key-B") as storage:  # its check passes now
        thread = _agent(storage).thread("t-foreign", actor="bob")
        store = await storage.get_store()
        reads: dict[str, Callable[[], Awaitable[Any]]] = {
            "messages": thread.messages,
            "pending_approvals": thread.pending_approvals,
            "history": thread.history,
            "audit": lambda: storage.audit("t-foreign"),
            "store": lambda: store.aget(("notes",), "n1"),
            "send": lambda: thread.send("and again"),
            "approve": thread.approve,
        }
        for name, read in reads.items():
            with pytest.raises(StorageError) as err:
                await read()
            assert err.value.code == "encryption", (name, err.value)
            assert "Open the storage with the key it was written with" in str(err.value), name
            refused += 1

    # Nothing was written over them: with the key they were written with, all is there,
    # still waiting for the same approval.
    _set_meta(backend, written, own)
    async with Storage(url, encryption_key="key-A") as storage:
        thread = _agent(storage).thread("t-foreign", actor="ada")
        assert (await thread.messages())[0]["content"] == "refund please"
        assert [r.tool for r in await thread.pending_approvals()] == ["refund"]
        assert [a["action"] for a in await storage.audit("t-foreign")] == ["send"]
        item = await (await storage.get_store()).aget(("notes",), "n1")
        assert item is not None and item.value == {"text": "sealed note"}
        assert (await thread.approve()).text == "done"
    report(f"encryption_foreign_payloads_{backend}", reads=len(reads), refused=refused)
