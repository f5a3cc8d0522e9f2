"""Odd text in documents and memory facts: NUL characters, lone surrogates, NaN or
infinite embeddings and over-size text get a `ValidationError` that names what is wrong,
on every backend, instead of a raw driver error; and a huge document written by
LangGraph's own store (not through our API) never fails on our PostgreSQL search index."""

from __future__ import annotations

import math
import uuid
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import CollectionTool, Memory, Storage, ValidationError
from criogen_graph.memory import MAX_FACT_CHARS
from criogen_graph.memory.documents import MAX_DOCUMENT_CHARS
from tests.conftest import storage_url


def collection(url: str, **kw: Any) -> CollectionTool:
    return CollectionTool(storage=Storage(url), collection=f"c-{uuid.uuid4().hex}", **kw)


BAD_TEXT = {
    "NUL": ("before\x00after", "NUL"),
    "lone surrogate": ("half \ud83d of an emoji", "surrogate"),
}


@pytest.mark.parametrize("case", list(BAD_TEXT))
async def test_documents_with_odd_text_are_refused_naming_it(
    backend: str, case: str, tmp_path: Path
) -> None:
    text, named = BAD_TEXT[case]
    docs = collection(storage_url(backend, tmp_path))
    try:
        with pytest.raises(ValidationError, match=named) as info:
            await docs.add("a", text)
        assert "text" in str(info.value)
        with pytest.raises(ValidationError, match=rf"metadata.*{named}|{named}.*metadata"):
            await docs.add("b", "fine", metadata={"note": text})
        with pytest.raises(ValidationError, match=named):
            await docs.add("c", "fine", metadata={text: 1})
        with pytest.raises(ValidationError, match=rf"id.*{named}|{named}.*id"):
            await docs.add(text, "fine")
        await docs.add("d", "fine words")
        with pytest.raises(ValidationError, match=named):
            await docs.update("d", text)
        # Nothing half-written: the collection holds only the good document, searchable.
        assert await docs.ids() == ["d"]
        assert [r["id"] for r in await docs.search("words")] == ["d"]
    finally:
        await docs.storage.close()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
async def test_embeddings_must_be_finite(backend: str, bad: float, tmp_path: Path) -> None:
    def embed(texts: list[str]) -> list[list[float]]:
        return [[1.0, bad, 0.5] for _ in texts]

    url = storage_url(backend, tmp_path)
    docs = collection(url, embed=embed)
    memory = Memory.shared(f"m-{uuid.uuid4().hex}", embed=embed)
    storage = Storage(url)
    try:
        with pytest.raises(ValidationError, match=r"finite.*embed|embed.*finite") as info:
            await docs.add("a", "some text")
        assert "nan" in str(info.value).lower() or "inf" in str(info.value).lower()
        assert await docs.ids() == []
        store = await storage.get_store()
        with pytest.raises(ValidationError, match="finite"):
            await memory.remember(store, memory.pool({}), "a fact")
        assert await memory.facts(store, memory.pool({})) == []
    finally:
        await docs.storage.close()
        await storage.close()


async def test_oversize_documents_and_facts_are_refused(backend: str, tmp_path: Path) -> None:
    url = storage_url(backend, tmp_path)
    docs = collection(url)
    memory = Memory.shared(f"m-{uuid.uuid4().hex}")
    storage = Storage(url)
    try:
        with pytest.raises(ValidationError, match=f"{MAX_DOCUMENT_CHARS:,}") as info:
            await docs.add("big", "word " * (MAX_DOCUMENT_CHARS // 5 + 1))
        assert "split" in str(info.value)
        store = await storage.get_store()
        pool = memory.pool({})
        with pytest.raises(ValidationError, match=f"{MAX_FACT_CHARS:,}"):
            await memory.remember(store, pool, "x" * (MAX_FACT_CHARS + 1))
        for text, named in BAD_TEXT.values():
            with pytest.raises(ValidationError, match=named):
                await memory.remember(store, pool, f"fact {text}")
        assert await memory.facts(store, pool) == []
        assert await docs.ids() == []
    finally:
        await docs.storage.close()
        await storage.close()


def distinct_words(chars: int) -> str:
    """Text of distinct short words (the worst case for a tsvector's size), `chars` long."""
    words: list[str] = []
    size = 0
    i = 0
    while size < chars:
        w = f"w{i:x}z"
        words.append(w)
        size += len(w) + 1
        i += 1
    return " ".join(words)


async def test_a_document_of_many_distinct_words_is_kept_and_searchable(
    backend: str, tmp_path: Path
) -> None:
    """Close to the size limit, a text whose index entry would pass PostgreSQL's 1 MB
    tsvector limit is still added; its first words are found."""
    docs = collection(storage_url(backend, tmp_path))
    try:
        text = "zebra " + distinct_words(MAX_DOCUMENT_CHARS - 100)
        await docs.add("big", text)
        assert [r["id"] for r in await docs.search("zebra")] == ["big"]
    finally:
        await docs.storage.close()


async def test_langgraphs_own_store_write_of_a_huge_document_never_fails_on_postgres(
    pg_schema_url: str,
) -> None:
    """A write our API does not make (LangGraph's own store, another application) of a
    document of 3 MB of distinct words goes in; its start is indexed. A database whose
    index was set up by an earlier version (its trigger function without the cap) gets
    the new function when a storage opens it."""
    import psycopg

    docs = CollectionTool(storage=Storage(pg_schema_url), collection="c")
    await docs.add("small", "hello there")
    assert [r["id"] for r in await docs.search("hello")] == ["small"]  # sets the index up
    await docs.storage.close()
    # The trigger function as earlier versions made it: to_tsvector of the whole text.
    with psycopg.connect(pg_schema_url, autocommit=True) as conn:
        schema = conn.execute("SELECT current_schema()").fetchone()[0]  # type: ignore[index]
        conn.execute(OLD_FUNCTION.replace("{schema}", schema))
        conn.execute("DROP FUNCTION criogen_search_vector(text)")
    docs = CollectionTool(storage=Storage(pg_schema_url), collection="c")
    try:
        assert [r["id"] for r in await docs.search("hello")] == ["small"]  # opens the index
        store = await docs.storage.get_store()
        huge = "aardvark " + distinct_words(3_000_000)
        await store.aput(("criogen", "collections", "c"), "huge", {"text": huge}, index=False)
        assert [r["id"] for r in await docs.search("aardvark")] == ["huge"]
        with psycopg.connect(pg_schema_url, autocommit=True) as conn:
            (count,) = conn.execute("SELECT count(*) FROM criogen_search").fetchone()  # type: ignore[misc]
        assert count == 2
    finally:
        await docs.storage.close()


OLD_FUNCTION = """CREATE OR REPLACE FUNCTION "{schema}".criogen_search_sync() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        DELETE FROM "{schema}".criogen_search WHERE prefix = OLD.prefix AND key = OLD.key;
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.prefix LIKE 'criogen.%'
            AND jsonb_typeof(NEW.value -> 'text') = 'string' THEN
        INSERT INTO "{schema}".criogen_search (prefix, key, tsv)
        VALUES (NEW.prefix, NEW.key, to_tsvector('english'::regconfig, NEW.value ->> 'text'))
        ON CONFLICT (prefix, key) DO UPDATE SET tsv = EXCLUDED.tsv;
    END IF;
    RETURN NULL;
END
$fn$"""
