"""Vector search over the documents and facts kept in a PostgreSQL storage, as an index in
the database: pgvector, when the server has it.

Design. Every item of a `criogen.*` namespace that has a `text` gets one row in the side
table `criogen_vectors (prefix, key, dim, embedding)`, kept in sync by a trigger on the
store's table from `value -> 'embedding'` (so a vector is written, changed and removed in
the same transaction as its item, by whoever writes the store), with `embedding` (and
`dim`) NULL when the item has no usable vector. pgvector's HNSW index needs one fixed
dimension, and the table holds every dimension in use (a collection or pool has one; two
may differ), so each dimension gets a partial expression index,
`USING hnsw ((embedding::vector(d)) vector_cosine_ops) WHERE dim = d`, created on first use
of that dimension (pgvector's documented way to index several dimensions in one column).
One table rather than one per dimension keeps the trigger static (no dynamic SQL, no table
to create inside a writer's transaction, no backfill race when a dimension appears: the
rows are there before their index is) and lets one statement read a collection's
dimension, size and whether any of its items lacks a vector (a partial index on the NULL
rows answers that in one probe).

Queries are filtered by namespace. A small collection (at most `EXACT_MAX` vectors) is
ranked exactly, by a scan of its own rows (primary key range); a larger one through the
HNSW index with pgvector 0.8's iterative scan (`hnsw.iterative_scan = relaxed_order`), which
goes on past `hnsw.ef_search` candidates until `limit` rows of the namespace are found, so
a big collection sharing the index with a bigger one still gets its `limit` results; should
the scan stop short (its `hnsw.max_scan_tuples`), the exact scan answers. Scores are cosine
similarities (1 - cosine distance), best first, only those > 0, as in the worker-thread
ranking of `search.rank_vectors` that stores without pgvector keep.

Setup, once per store and process: `CREATE EXTENSION IF NOT EXISTS vector` (in `public`
when that schema exists, so dropping a tenant's schema does not drop the type every other
schema's vectors use), then the table, its trigger and the backfill, under a
transaction-scoped advisory lock (processes starting together do it once). A server
without pgvector, or a role that may not create the extension, leaves the store on the
worker-thread ranking (logged once).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from criogen_graph.memory import fts as _fts

#: Collections of up to this many vectors are ranked exactly (a scan of their rows);
#: larger ones through the HNSW index. Measured at 384 dimensions on 2 cores: see
#: docs/benchmarks.md.
EXACT_MAX = 5_000
#: pgvector's HNSW index takes `vector` columns of up to this many dimensions; above it,
#: every query is an exact scan of the collection's rows.
HNSW_MAX_DIM = 2_000
#: Candidates the HNSW scan keeps (pgvector's default is 40): higher, better recall.
EF_SEARCH = 100
#: Memory for building an HNSW index over existing rows (pgvector builds it much faster
#: when the graph fits; PostgreSQL's default is 64 MB).
_BUILD_MEMORY = "256MB"
_LOCK = 0x637269_6F7665_63  # pg_advisory_xact_lock key ("criovec"), for the setup

_log = logging.getLogger("criogen_graph")


class Unranked(enum.Enum):
    """Why `search` did not rank: the caller ranks in a worker thread (`THREAD`), or the
    collection holds items without a vector, so keyword search answers (`KEYWORDS`)."""

    THREAD = "thread"
    KEYWORDS = "keywords"


@dataclass
class _Index:
    """What a store's database has: pgvector's schema (quoted), whether its HNSW scans
    can iterate (0.8 and later), and the dimensions whose HNSW index exists."""

    ext: str
    iterative: bool
    dims: set[int] = field(default_factory=set)


#: Per store: its setup, done (an `_Index`, or None without pgvector) or under way; a
#: failed or cancelled setup (False) is forgotten, so the next search tries again.
_READY: weakref.WeakKeyDictionary[Any, asyncio.Future[_Index | bool | None]] = (
    weakref.WeakKeyDictionary()
)


def _row(row: Any, *names: str) -> tuple[Any, ...]:
    return tuple(row[n] for n in names) if isinstance(row, dict) else tuple(row)


# -- setup ---------------------------------------------------------------------------------

_EXT = (
    "SELECT n.nspname, e.extversion FROM pg_extension e "
    "JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'vector'"
)
_DONE = (
    "SELECT 1 FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE t.tgname = 'criogen_vectors_sync' AND c.relname = 'store' AND n.nspname = %s"
)
_INDEXES = (
    "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = %s AND c.relname LIKE 'criogen\\_vectors\\_hnsw\\_%%'"
)

_STALE = (
    "SELECT 1 FROM pg_stat_user_tables WHERE schemaname = %s AND relname = 'criogen_vectors' "
    "AND n_mod_since_analyze > 50 + 0.1 * n_live_tup"
)


def _setup_sql(schema: str, ext: str) -> list[str]:
    table = f'"{schema}".criogen_vectors'
    return [
        f"""CREATE TABLE IF NOT EXISTS {table} (
            prefix text NOT NULL,
            key text NOT NULL,
            dim integer,
            embedding {ext}.vector,
            PRIMARY KEY (prefix, key))""",
        # "Does this namespace have an item without a vector?" in one probe.
        f"CREATE INDEX IF NOT EXISTS criogen_vectors_missing ON {table} (prefix) "
        "WHERE embedding IS NULL",
        # An item's vector, or NULL when it has none pgvector takes (not an array of
        # numbers, more than 16,000 of them, one out of float4's range): a write to the
        # store never fails for its embedding.
        f"""CREATE OR REPLACE FUNCTION "{schema}".criogen_vector_of(v jsonb)
        RETURNS {ext}.vector LANGUAGE plpgsql IMMUTABLE AS $fn$
        BEGIN
            IF jsonb_typeof(v) = 'array' AND jsonb_array_length(v) > 0 THEN
                RETURN v::text::{ext}.vector;
            END IF;
            RETURN NULL;
        EXCEPTION WHEN others THEN
            RETURN NULL;
        END
        $fn$""",
        f"""CREATE OR REPLACE FUNCTION "{schema}".criogen_vectors_sync() RETURNS trigger
        LANGUAGE plpgsql AS $fn$
        DECLARE
            v {ext}.vector;
        BEGIN
            IF TG_OP <> 'INSERT' THEN
                DELETE FROM {table} WHERE prefix = OLD.prefix AND key = OLD.key;
            END IF;
            IF TG_OP <> 'DELETE' AND NEW.prefix LIKE 'criogen.%'
                    AND jsonb_typeof(NEW.value -> 'text') = 'string' THEN
                v := "{schema}".criogen_vector_of(NEW.value -> 'embedding');
                INSERT INTO {table} (prefix, key, dim, embedding)
                VALUES (NEW.prefix, NEW.key, {ext}.vector_dims(v), v)
                ON CONFLICT (prefix, key)
                DO UPDATE SET dim = EXCLUDED.dim, embedding = EXCLUDED.embedding;
            END IF;
            RETURN NULL;
        END
        $fn$""",
        f"""CREATE TRIGGER criogen_vectors_sync
        AFTER INSERT OR DELETE OR UPDATE OF value ON "{schema}".store
        FOR EACH ROW EXECUTE FUNCTION "{schema}".criogen_vectors_sync()""",
        f"""INSERT INTO {table} (prefix, key, dim, embedding)
        SELECT prefix, key, {ext}.vector_dims(v), v FROM (
            SELECT prefix, key, "{schema}".criogen_vector_of(value -> 'embedding') AS v
            FROM "{schema}".store
            WHERE prefix LIKE 'criogen.%' AND jsonb_typeof(value -> 'text') = 'string') s
        ON CONFLICT (prefix, key) DO NOTHING""",
        f"ANALYZE {table}",
    ]


async def _extension(conn: Any) -> tuple[str, str] | None:
    """pgvector's schema and version in this database, created if the server has it and
    the role may; None otherwise."""
    import psycopg

    row = await (await conn.execute(_EXT)).fetchone()
    if row is None:
        cur = await conn.execute(
            "SELECT to_regnamespace('public') IS NOT NULL, "
            "EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'vector')"
        )
        public, available = _row(await cur.fetchone(), "?column?", "exists")
        if not available:
            _log.warning(
                "PostgreSQL has no pgvector extension: vector search ranks in a worker "
                "thread over at most max_documents items (install pgvector for an index)"
            )
            return None
        try:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK,))
                await conn.execute(
                    "CREATE EXTENSION IF NOT EXISTS vector" + (" SCHEMA public" if public else "")
                )
        except psycopg.Error as exc:
            _log.warning(
                "pgvector could not be enabled (%s): vector search ranks in a worker thread "
                "over at most max_documents items (a superuser can run CREATE EXTENSION "
                "vector in this database)",
                str(exc).strip().splitlines()[0],
            )
            return None
        row = await (await conn.execute(_EXT)).fetchone()
    schema, version = _row(row, "nspname", "extversion")
    return '"' + str(schema).replace('"', '""') + '"', str(version)


def _at_least(version: str, wanted: tuple[int, ...]) -> bool:
    try:
        return tuple(int(p) for p in version.split("-")[0].split(".")) >= wanted
    except ValueError:
        return False


async def _setup(store: Any) -> _Index | None:
    async with store.conn.connection() as conn:
        ext = await _extension(conn)
        if ext is None:
            return None
        cur = await conn.execute("SELECT current_schema()")
        (schema,) = _row(await cur.fetchone(), "current_schema")
        quoted = str(schema).replace('"', '""')
        if await (await conn.execute(_DONE, (schema,))).fetchone() is None:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK,))
                if await (await conn.execute(_DONE, (schema,))).fetchone() is None:
                    for statement in _setup_sql(quoted, ext[0]):
                        await conn.execute(statement)
        # (As for the keyword index: plans need fresh statistics after a bulk load, and
        # autovacuum may be off or not have run yet.)
        if await (await conn.execute(_STALE, (schema,))).fetchone() is not None:
            await conn.execute(f'ANALYZE "{quoted}".criogen_vectors')
        cur = await conn.execute(_INDEXES, (schema,))
        names = [str(_row(r, "relname")[0]).rsplit("_", 1)[1] for r in await cur.fetchall()]
    dims = {int(n) for n in names if n.isdigit()}
    return _Index(ext[0], _at_least(ext[1], (0, 8)), dims)


async def _ready(store: Any) -> _Index | None:
    """The store's pgvector index (set up on first use), or None: not a PostgreSQL store
    whose values the database can read, or no pgvector."""
    if _fts.store_kind(store) != "postgres":
        return None
    root = _fts.root_store(store)
    while True:
        ready = _READY.get(root)
        if ready is None:
            ready = asyncio.get_running_loop().create_future()
            _READY[root] = ready
            try:
                index = await _setup(root)
            except BaseException:
                if _READY.get(root) is ready:
                    del _READY[root]
                ready.set_result(False)
                raise
            ready.set_result(index)
            return index
        done = await asyncio.shield(ready)
        if not isinstance(done, bool):
            return done


async def prepare(store: Any, dim: int) -> None:
    """Before a vector of `dim` dimensions is written: the setup, and the HNSW index of
    that dimension, so that it grows with the rows instead of being built over them later
    (a build blocks writes to the vectors table while it runs)."""
    index = await _ready(store)
    if index is not None:
        await _dimension_index(_fts.root_store(store), index, dim)


async def _dimension_index(root: Any, index: _Index, dim: int) -> None:
    if dim in index.dims or not 0 < dim <= HNSW_MAX_DIM:
        return
    ext = index.ext
    async with root.conn.connection() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK,))
        await conn.execute(f"SET LOCAL maintenance_work_mem = '{_BUILD_MEMORY}'")
        await conn.execute(
            f"CREATE INDEX IF NOT EXISTS criogen_vectors_hnsw_{dim} ON criogen_vectors "
            f"USING hnsw ((embedding::{ext}.vector({dim})) {ext}.vector_cosine_ops) "
            f"WHERE dim = {dim}"
        )
    index.dims.add(dim)


# -- search --------------------------------------------------------------------------------

# The namespace's dimension, whether any of its items lacks a vector, and its number of
# vectors up to EXACT_MAX + 1 (enough to choose the plan).
_STATS = """
SELECT
    (SELECT dim FROM criogen_vectors WHERE prefix = %(ns)s AND dim IS NOT NULL LIMIT 1)
        AS dim,
    EXISTS (SELECT 1 FROM criogen_vectors WHERE prefix = %(ns)s AND embedding IS NULL)
        AS missing,
    (SELECT count(*) FROM (
        SELECT 1 FROM criogen_vectors WHERE prefix = %(ns)s LIMIT %(cap)s) c) AS n
"""

# The results with their items (without their vectors: not needed, and the largest part).
_WITH_VALUES = """
SELECT b.key, 1 - b.distance AS score, s.value - 'embedding' AS value
FROM best b JOIN store s ON s.prefix = %(ns)s AND s.key = b.key
ORDER BY b.distance, b.key
"""


def _exact_sql(ext: str, dim: int) -> str:
    # MATERIALIZED: the distances of the namespace's own rows (its primary key range),
    # never an index scan over every namespace's vectors.
    return (
        f"""
WITH hits AS MATERIALIZED (
    SELECT key, embedding::{ext}.vector({dim})
        OPERATOR({ext}.<=>) %(q)s::{ext}.vector({dim}) AS distance
    FROM criogen_vectors WHERE prefix = %(ns)s AND dim = {dim}
), best AS (
    SELECT key, distance FROM hits ORDER BY distance, key LIMIT %(limit)s
)"""
        + _WITH_VALUES
    )


def _hnsw_sql(ext: str, dim: int) -> str:
    # `prefix || ''`: not the primary key's range (the planner would take a large
    # namespace's range and sort it), but a filter on the HNSW scan; relaxed_order
    # returns nearly sorted rows, sorted again outside.
    return (
        f"""
WITH best AS MATERIALIZED (
    SELECT key, embedding::{ext}.vector({dim})
        OPERATOR({ext}.<=>) %(q)s::{ext}.vector({dim}) AS distance
    FROM criogen_vectors WHERE dim = {dim} AND prefix || '' = %(ns)s
    ORDER BY embedding::{ext}.vector({dim}) OPERATOR({ext}.<=>) %(q)s::{ext}.vector({dim})
    LIMIT %(limit)s
)"""
        + _WITH_VALUES
    )


def _vector_text(vec: Sequence[float]) -> str:
    return "[" + ",".join(repr(float(x)) for x in vec) + "]"


async def _query(conn: Any, sql: str, params: dict[str, Any], settings: Sequence[str]) -> Any:
    if not settings:
        return await (await conn.execute(sql, params)).fetchall()
    # One round trip: the transaction, its settings and the query pipelined.
    async with conn.pipeline(), conn.transaction():
        for setting in settings:
            await conn.execute(setting)
        cur = await conn.execute(sql, params)
    return await cur.fetchall()


def _scored(rows: Any) -> list[tuple[str, float, dict[str, Any]]]:
    out = []
    for row in rows:
        key, score, value = _row(row, "key", "score", "value")
        # (NaN, for a zero vector, is not > 0.)
        if float(score) > 0 and isinstance(value, dict):
            out.append((str(key), float(score), value))
    return out


async def search(
    store: Any,
    ns: tuple[str, ...],
    embed_query: Callable[[int], Awaitable[Sequence[float]]],
    limit: int,
) -> list[tuple[str, float, dict[str, Any]]] | Unranked:
    """The `limit` items of namespace `ns` whose vectors are most similar to the query's
    (cosine similarity > 0, best first: key, score, value without its embedding), ranked
    in the database; `embed_query(dim)` gives the query's vector, checked against the
    namespace's dimension `dim`. `Unranked.THREAD` when the store has no such index,
    `Unranked.KEYWORDS` when the namespace has no vectors or an item without one."""
    index = await _ready(store)
    if index is None:
        return Unranked.THREAD
    root = _fts.root_store(store)
    key = _fts.prefix(ns)
    async with root.conn.connection() as conn:
        cur = await conn.execute(_STATS, {"ns": key, "cap": EXACT_MAX + 1})
        dim, missing, count = _row(await cur.fetchone(), "dim", "missing", "n")
    if dim is None or missing:
        return Unranked.KEYWORDS
    dim = int(dim)
    params = {"q": _vector_text(await embed_query(dim)), "ns": key, "limit": limit}
    if count > EXACT_MAX and dim <= HNSW_MAX_DIM:
        await _dimension_index(root, index, dim)
        settings = [f"SET LOCAL hnsw.ef_search = {max(EF_SEARCH, limit)}"]
        if index.iterative:
            settings.append("SET LOCAL hnsw.iterative_scan = relaxed_order")
        async with root.conn.connection() as conn:
            rows = await _query(conn, _hnsw_sql(index.ext, dim), params, settings)
        if len(rows) >= limit:
            return _scored(rows)
    async with root.conn.connection() as conn:
        rows = await _query(conn, _exact_sql(index.ext, dim), params, ())
    return _scored(rows)
