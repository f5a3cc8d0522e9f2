"""Collection and memory search as an index in the database: word forms match, every
write is searchable at once (from another connection too), hostile queries are text,
embedding dimensions are checked; on memory://, SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import Agent, CollectionTool, FakeModel, Memory, Storage, ValidationError
from criogen_graph.errors import StorageError
from tests.conftest import python_children, storage_url


def collection(url: str, **kw: object) -> CollectionTool:
    # A collection of its own per test: tests share the PostgreSQL store.
    return CollectionTool(storage=Storage(url), collection=f"c-{uuid.uuid4().hex}", **kw)  # type: ignore[arg-type]


async def test_word_forms_match(backend: str, tmp_path: Path) -> None:
    docs = collection(storage_url(backend, tmp_path))
    await docs.add("refunds", "Refunds are possible within 30 days of delivery.")
    await docs.add("shipping", "Orders are shipped within two business days.")
    await docs.add("privacy", "We never sell personal data.")
    assert [r["id"] for r in await docs.search("refund")] == ["refunds"]
    assert [r["id"] for r in await docs.search("shipping")] == ["shipping"]
    assert [r["id"] for r in await docs.search("how do I ship a refund?")] in (
        ["refunds", "shipping"],
        ["shipping", "refunds"],
    )
    assert await docs.search("invoice") == []
    await docs.storage.close()


async def test_writes_are_searchable_at_once_from_another_storage(
    backend: str, tmp_path: Path
) -> None:
    url = storage_url(backend, tmp_path)
    docs = collection(url)
    await docs.add("a", "The router resets after ten seconds.")
    assert [r["id"] for r in await docs.search("resetting")] == ["a"]
    await docs.update("a", "The modem blinks green when connected.")
    assert await docs.search("router") == []
    assert [r["id"] for r in await docs.search("blinking")] == ["a"]
    await docs.add("b", "A blinking red light means no connection.")
    assert {r["id"] for r in await docs.search("blink")} == {"a", "b"}
    assert await docs.remove("a")
    assert [r["id"] for r in await docs.search("blink")] == ["b"]
    if backend != "memory":
        # Another connection (another process would be the same) sees the index at once.
        other = CollectionTool(storage=Storage(url), collection=docs.collection)
        assert [r["id"] for r in await other.search("lights")] == ["b"]
        await other.add("c", "Lights off: unplug it.")
        assert {r["id"] for r in await docs.search("light")} == {"b", "c"}
        await other.storage.close()
    await docs.storage.close()


@pytest.mark.parametrize(
    "query",
    [
        '"refund',
        "refund*",
        "refund NEAR delivery",
        "text: refund",
        "refund & delivery | !x",
        "-refund OR (",
        "'refund'\\",
        "refund" + "\x00" + "é🙂",
        "NEAR(refund delivery, 2)",
    ],
)
async def test_operator_characters_are_text(backend: str, tmp_path: Path, query: str) -> None:
    docs = collection(storage_url(backend, tmp_path))
    await docs.add("refunds", "Refunds are possible within 30 days of delivery.")
    assert [r["id"] for r in await docs.search(query)] == ["refunds"]
    await docs.storage.close()


async def test_empty_huge_and_wordless_queries(backend: str, tmp_path: Path) -> None:
    docs = collection(storage_url(backend, tmp_path))
    await docs.add("refunds", "Refunds are possible within 30 days of delivery.")
    for empty in ("", "   \n"):
        with pytest.raises(ValidationError, match="non-empty"):
            await docs.search(empty)
    assert await docs.search('"*:&|!()') == []
    assert await docs.search("the and of") == []  # only the commonest words
    huge = "refund " + "x" * (1024 * 1024)
    assert [r["id"] for r in await docs.search(huge)] == ["refunds"]
    many = " ".join(f"w{i}" for i in range(100_000)) + " refund"
    assert await docs.search(many) == []  # only the first 64 distinct words count
    await docs.storage.close()


async def test_the_tool_answers_a_model_with_ranked_cited_results(
    backend: str, tmp_path: Path
) -> None:
    docs = collection(storage_url(backend, tmp_path), limit=2)
    for i in range(30):
        await docs.add(f"d{i:02}", f"Document {i} about gardening and tomatoes.")
    await docs.add("best", "Refund policy: refunds of refunded orders are refundable.")
    await docs.add("other", "A refund needs the receipt.")
    hits = await docs.search("refunds")
    assert [h["id"] for h in hits] == ["best", "other"]
    assert hits[0]["score"] >= hits[1]["score"] > 0
    await docs.storage.close()


async def test_documents_holding_more_of_the_words_come_first(backend: str, tmp_path: Path) -> None:
    # Every document four words long, each word once: bm25 and ts_rank agree.
    docs = collection(storage_url(backend, tmp_path))
    for key, text in [
        ("a1", "apple red round fruit"),
        ("a2", "apple green sour fruit"),
        ("b1", "apple and pear salad"),
        ("b2", "pear beside apple tart"),
        ("p1", "pear tree in garden"),
    ]:
        await docs.add(key, text)
    assert [r["id"] for r in await docs.search("apple pear", limit=2)] == ["b1", "b2"]
    three = [r["id"] for r in await docs.search("pears apples", limit=3)]
    assert three[:2] == ["b1", "b2"] and three[2] in ("a1", "a2", "p1")
    await docs.storage.close()


async def test_postgres_ranking_is_that_of_every_match(tmp_path: Path) -> None:
    # PostgreSQL first ranks only the documents holding two query words or more and keeps
    # them when they fill the limit; else it ranks every match. A query whose two words
    # are one word form ("apples apple") must not count as two: "pp" (one word, four
    # times) outranks the one-word "a" documents, and has to be found.
    docs = collection(storage_url("postgres", tmp_path))
    for key, text in [
        ("a1", "apple red round fruit"),
        ("a2", "apple green sour fruit"),
        ("a3", "apple tree in garden"),
        ("b1", "apple and pear salad"),
        ("b2", "pear beside apple tart"),
        ("pp", "pear pear pear pear"),
    ]:
        await docs.add(key, text)
    filler = " ".join(f"w{i}" for i in range(12))
    for query in ("apples apple pear", "pear apple", f"apple pear {filler}", "apple pear x_y"):
        assert [r["id"] for r in await docs.search(query, limit=3)] == ["b1", "b2", "pp"], query
        assert [r["id"] for r in await docs.search(query, limit=2)] == ["b1", "b2"], query
    assert [r["id"] for r in await docs.search("the pear", limit=2)] == ["pp", "b1"]
    await docs.storage.close()


async def test_postgres_index_made_before_gets_a_bounded_pending_list(pg_schema_url: str) -> None:
    import psycopg

    docs = CollectionTool(storage=Storage(pg_schema_url), collection="c")
    await docs.add("a", "Refunds within 30 days.")
    assert [r["id"] for r in await docs.search("refund")] == ["a"]  # made by the first search
    await docs.storage.close()
    schema = pg_schema_url.rsplit("%3D", 1)[1]
    options = (
        "SELECT reloptions FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relname = 'criogen_search_tsv' AND n.nspname = %s"
    )
    with psycopg.connect(pg_schema_url, autocommit=True) as conn:
        assert conn.execute(options, (schema,)).fetchone() == (["gin_pending_list_limit=1024"],)
        conn.execute("ALTER INDEX criogen_search_tsv RESET (gin_pending_list_limit)")
    docs = CollectionTool(storage=Storage(pg_schema_url), collection="c")
    assert [r["id"] for r in await docs.search("refund")] == ["a"]
    await docs.storage.close()
    with psycopg.connect(pg_schema_url, autocommit=True) as conn:
        assert conn.execute(options, (schema,)).fetchone() == (["gin_pending_list_limit=1024"],)


async def test_postgres_statistics_are_brought_up_to_date_after_a_bulk_load(
    pg_schema_url: str,
) -> None:
    # Without statistics for what was loaded since, the planner walks a large namespace
    # row by row; a process's first search analyzes the table when autovacuum has not.
    import psycopg
    from langgraph.store.base import PutOp

    from tests.conftest import wait_until

    docs = CollectionTool(storage=Storage(pg_schema_url), collection="c")
    await docs.add("a", "Refunds within 30 days.")
    assert [r["id"] for r in await docs.search("refund")] == ["a"]  # made and analyzed
    store = await docs.storage.get_store()
    await store.abatch(
        [
            PutOp(docs._ns, f"d{i}", {"text": f"Shipping note {i}", "metadata": {}})
            for i in range(300)
        ]
    )
    await docs.storage.close()  # its server processes end, reporting what they wrote
    schema = pg_schema_url.rsplit("%3D", 1)[1]
    stats = (
        "SELECT n_mod_since_analyze, last_analyze FROM pg_stat_user_tables "
        "WHERE schemaname = %s AND relname = 'criogen_search'"
    )
    with psycopg.connect(pg_schema_url, autocommit=True) as conn:

        def modified() -> Any:
            row = conn.execute(stats, (schema,)).fetchone()
            return row if row is not None and row[0] >= 300 else None

        _, analyzed = await wait_until(modified, what="the writes in the statistics")
    docs = CollectionTool(storage=Storage(pg_schema_url), collection="c", limit=50)
    assert len(await docs.search("shipping")) == 50
    await docs.storage.close()
    with psycopg.connect(pg_schema_url, autocommit=True) as conn:
        row = conn.execute(stats, (schema,)).fetchone()
    assert row is not None and row[0] < 300 and row[1] > analyzed


async def test_encrypted_storage_searches_without_plaintext_index(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/sealed.db"
    docs = CollectionTool(storage=Storage(url, encryption_key="k"), collection="secret")
    await docs.add("a", "Refunds need the vault combination.")
    assert [r["id"] for r in await docs.search("refund")] == ["a"]
    await docs.storage.close()
    with sqlite3.connect(f"{tmp_path}/sealed.db") as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            for row in db.execute(f'SELECT * FROM "{table}"'):
                assert "vault" not in repr(row), table


def embed3(texts: list[str]) -> list[list[float]]:
    return [[float("refund" in t.lower()), float("ship" in t.lower()), 1.0] for t in texts]


def embed4(texts: list[str]) -> list[list[float]]:
    return [[1.0, 0.0, 0.0, 0.0] for _ in texts]


async def test_embedding_search_and_dimension_errors(backend: str, tmp_path: Path) -> None:
    url = storage_url(backend, tmp_path)
    docs = collection(url, embed=embed3)
    await docs.add("refunds", "Refunds are possible.")
    await docs.add("shipping", "We ship fast.")
    assert (await docs.search("refund please"))[0]["id"] == "refunds"

    def ragged(texts: list[str]) -> list[list[float]]:
        return [[1.0, 2.0] for _ in texts]

    wrong = CollectionTool(storage=docs.storage, collection=docs.collection, embed=ragged)
    with pytest.raises(ValidationError, match=r"'.*ragged' returned vectors of dimension 2"):
        await wrong.add("x", "text")
    reopened = CollectionTool(storage=docs.storage, collection=docs.collection, embed=embed4)
    with pytest.raises(ValidationError, match=r"embed4.*dimension 4.*stored are of dimension 3"):
        await reopened.search("refund")
    with pytest.raises(ValidationError, match="dimension 3"):
        await reopened.update("refunds", "changed")
    assert (await docs.get("refunds"))["text"] == "Refunds are possible."  # type: ignore[index]
    assert sorted(await docs.ids()) == ["refunds", "shipping"]
    await docs.storage.close()


async def test_memory_search_matches_word_forms(backend: str, tmp_path: Path) -> None:
    url = storage_url(backend, tmp_path)
    agent: Agent[None] = Agent(
        FakeModel([]), memory=Memory.shared(f"m-{uuid.uuid4().hex}"), storage=Storage(url)
    )
    assert agent.memory is not None
    await agent.memory.remember("The user prefers refunds by bank transfer.")
    await agent.memory.remember("The user lives in Lisbon.")
    assert [f["text"] for f in await agent.memory.search("refund")] == [
        "The user prefers refunds by bank transfer."
    ]
    assert await agent.memory.search('"NEAR*:') == []
    await agent.storage.close()


# -- SQLite durability --------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "level"), [("", 1), ("?synchronous=normal", 1), ("?synchronous=FULL", 2)]
)
async def test_sqlite_synchronous_option(tmp_path: Path, option: str, level: int) -> None:
    from criogen_graph.storage.sqlite import SqliteBackend

    storage = Storage(f"sqlite:///{tmp_path}/d.db{option}")
    await storage.open()
    backend = storage._backend
    assert isinstance(backend, SqliteBackend)
    saver = backend.saver
    async with saver.conn.execute("PRAGMA synchronous") as cur:  # type: ignore[attr-defined]
        assert (await cur.fetchone()) == (level,)
    assert saver._fast.execute("PRAGMA synchronous").fetchone() == (level,)  # type: ignore[attr-defined]
    await storage.close()


@pytest.mark.parametrize(
    "option", ["synchronous=off", "synchronous=", "synchronous=full&synchronous=normal"]
)
def test_sqlite_synchronous_bad_values(tmp_path: Path, option: str) -> None:
    with pytest.raises(StorageError, match="synchronous") as err:
        Storage(f"sqlite:///{tmp_path}/d.db?{option}")
    assert err.value.code == "invalid_url"


_SEARCHER = """
import asyncio, sys
from criogen_graph import CollectionTool, Storage

async def main():
    docs = CollectionTool(storage=Storage(sys.argv[1]), collection="shared")
    print(",".join(r["id"] for r in await docs.search("refund")))
    await docs.storage.close()

asyncio.run(main())
"""


@pytest.fixture
def fresh_url(durable_backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if durable_backend == "sqlite":
        return f"sqlite:///{tmp_path}/fresh.db"
    return str(request.getfixturevalue("pg_schema_url"))


async def test_processes_starting_together_build_the_index_once(fresh_url: str) -> None:

    from langgraph.store.base import PutOp

    # Documents written before any index exists (by an older version, say).
    storage = Storage(fresh_url)
    store = await storage.get_store()
    ns = ("criogen", "collections", "shared")
    await store.abatch(
        [PutOp(ns, f"r{i}", {"text": f"Refunds policy {i}", "metadata": {}}) for i in range(20)]
    )
    for out in await python_children(_SEARCHER, fresh_url, n=4):
        assert len(out.strip().split(",")) == 5  # the tool's default limit
    # Indexed once: every document exactly once, and later writes follow.
    docs = CollectionTool(storage=storage, collection="shared", limit=50)
    assert sorted(r["id"] for r in await docs.search("refunds")) == sorted(
        f"r{i}" for i in range(20)
    )
    await docs.remove("r3")
    assert len(await docs.search("refund")) == 19
    await storage.close()
