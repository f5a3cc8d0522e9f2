"""PostgreSQL with an `encryption_key`: no stored byte holds the plaintext.

A run plants a secret everywhere a user's data goes: the user message and the run's
`state`, a tool call's arguments and result, a gated call's arguments and the reviewer's
edit of them (the audit trail records decisions), the final answer, a memory fact, a
collection document and its metadata. Then every table of the storage's schema (read
from the catalog, so a table added later is covered too: checkpoints, their blobs and
writes, the audit trail, the store's tables, ...) is read back row by row, as PostgreSQL
renders it, and searched for the secret: as text, as the hex PostgreSQL shows bytea in,
and base64-encoded at each alignment (the store seals values as base64).

The same run in a second schema without a key is the control: there the search must find
every piece of the secret (in the checkpoints, the audit trail and the store), or the
search proves nothing. Identifiers stay in clear by design (thread ids, actors, store
namespaces and keys, document ids): they are what lookups go by."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from criogen_graph import (
    Agent,
    CollectionTool,
    Decision,
    FakeReply,
    FunctionModel,
    Memory,
    Storage,
    tool,
)
from tests.conftest import PG_URL, require_postgres
from tests.reliability._report import report

KEY = "correct horse battery staple"


@pytest.fixture
def plain_schema_url() -> Iterator[str]:
    """A second fresh schema (like `pg_schema_url`), for the unencrypted control run."""
    require_postgres()
    import psycopg

    schema = f"criogen_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in PG_URL else "?"
    try:
        yield f"{PG_URL}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def needles(secret: str) -> list[str]:
    """How the secret can show in a row's text: itself, hex (bytea), and base64 at each
    of the three alignments (only the characters no neighbouring byte affects), the
    base64 also in hex."""
    raw = secret.encode()
    out = [secret, raw.hex()]
    for k in range(3):
        encoded = base64.b64encode(b"\0" * k + raw).decode()
        skip = 0 if k == 0 else 4  # the group shared with the bytes before
        groups = (len(raw) - (3 - k) % 3) // 3
        middle = encoded[skip : skip + 4 * groups]
        out += [middle, middle.encode().hex()]
    return out


def agent_for(storage: Storage, secret: str) -> Agent[Any]:
    @tool
    async def lookup(code: str) -> str:
        """Look a code up."""
        return f"found {code}"

    @tool
    async def transfer(note: str) -> str:
        """Move money (needs approval)."""
        return f"moved with note {note}"

    def script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        answered = sum(1 for m in messages if m["role"] == "assistant")
        if answered == 0:
            return FakeReply.tool_calls(
                ("lookup", {"code": f"{secret}-arg"}),
                ("transfer", {"note": f"{secret}-gated"}),
            )
        return f"all done, {secret}-answer"

    return Agent(
        FunctionModel(script),
        tools=[lookup, transfer],
        approve=["transfer"],
        memory=Memory.shared("plaintext-at-rest"),
        storage=storage,
    )


async def plant(url: str, secret: str, key: str | None) -> None:
    """Put the secret everywhere a run and its storage keep user data."""
    storage = Storage(url, encryption_key=key)
    try:
        agent = agent_for(storage, secret)
        thread = agent.thread("secret-thread", actor="ada")
        reply = await thread.send(f"{secret}-user", state={"note": f"{secret}-state"})
        assert reply.needs_approval
        (request,) = reply.approvals
        done = await thread.decide({request.call_id: Decision.edit({"note": f"{secret}-edit"})})
        assert done.text == f"all done, {secret}-answer"
        assert agent.memory is not None
        await agent.memory.remember(f"{secret}-fact")
        docs = CollectionTool("search_secrets", storage=storage, collection="secrets")
        await docs.add("doc-1", f"{secret}-doc", metadata={"about": f"{secret}-meta"})
        # The planted data reads back (so it was stored, not dropped).
        contents = " ".join(str(m.get("content")) for m in await thread.messages())
        assert f"{secret}-arg" in contents and f"{secret}-edit" in contents
        assert [f["text"] for f in await agent.memory.facts()] == [f"{secret}-fact"]
        assert (await docs.get("doc-1"))["metadata"] == {"about": f"{secret}-meta"}
    finally:
        await storage.close()


#: What `plant` puts where: each piece of the secret is `<secret>-<piece>`.
PIECES = ("user", "state", "arg", "gated", "edit", "answer", "fact", "doc", "meta")


def tables_holding(url: str, secret: str) -> tuple[list[str], dict[str, set[str]]]:
    """Every table of the URL's schema, and the pieces of the secret each one shows."""
    import psycopg
    from psycopg import sql

    marks = {piece: needles(f"{secret}-{piece}") for piece in PIECES}
    found: dict[str, set[str]] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT current_schema()").fetchone()
        assert row is not None
        schema = row[0]
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = %s AND table_type = 'BASE TABLE' ORDER BY table_name",
                (schema,),
            )
        ]
        for table in tables:
            query = sql.SQL("SELECT t::text FROM {}.{} AS t").format(
                sql.Identifier(schema), sql.Identifier(table)
            )
            for (row,) in conn.execute(query):
                for piece, forms in marks.items():
                    if any(form in row for form in forms):
                        found.setdefault(table, set()).add(piece)
    return tables, found


async def test_no_plaintext_in_any_postgres_table(
    pg_schema_url: str, plain_schema_url: str
) -> None:
    secret = f"launch-code-{uuid.uuid4().hex}"

    await plant(plain_schema_url, secret, None)
    plain_tables, plain_found = tables_holding(plain_schema_url, secret)
    # The control: unencrypted, the search finds every piece, in the checkpoints, the
    # audit trail and the store.
    assert set().union(*plain_found.values()) == set(PIECES), plain_found
    assert {"criogen_audit", "store"} <= set(plain_found), plain_found
    assert {"checkpoint_blobs", "checkpoint_writes"} & set(plain_found), plain_found

    await plant(pg_schema_url, secret, KEY)
    tables, found = tables_holding(pg_schema_url, secret)
    assert tables == plain_tables  # the same tables, each searched
    assert found == {}, f"plaintext at rest: {found} (of {tables})"

    # And the data is all there for the key's holder.
    storage = Storage(pg_schema_url, encryption_key=KEY)
    try:
        messages = await agent_for(storage, secret).thread("secret-thread").messages()
        assert messages[0]["content"] == f"{secret}-user"
    finally:
        await storage.close()
    report(
        "postgres_plaintext_at_rest",
        tables_searched=len(tables),
        pieces_planted=len(PIECES),
        tables_with_plaintext=len(found),
        control_tables_with_plaintext=len(plain_found),
    )
