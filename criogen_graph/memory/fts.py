"""Keyword search over the documents and facts kept in a storage's LangGraph store, as an
index in the database: SQLite FTS5 (porter stemming) or PostgreSQL full-text search
(`english` configuration: stemming and English stop words), kept in sync by triggers on
the store's table, so every write (ours, LangGraph's, another process's) updates it in
its own transaction. memory://, encrypted storages (whose values the database cannot read)
and foreign stores use an in-process SQLite FTS5 index instead. Nothing is scored on the
event loop: the database does it, or a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

from criogen_graph.memory.search import STOP_WORDS
from criogen_graph.storage._driver_internals import run_on_sqlite_thread

#: Only the first this many characters of a query are read.
MAX_QUERY_CHARS = 10_000
#: Only the first this many distinct words of a query count.
MAX_TERMS = 64
#: The namespaces indexed (every key of `criogen.collections.*` and `criogen.memory.*`).
_INDEXED = "criogen.%"
_WORD = re.compile(r"\w+", re.UNICODE)


def terms(query: str) -> list[str]:
    """The distinct words of `query` searched for: lowercased, without the commonest
    English words, in order; never an FTS operator (`"`, `*`, `:`, `NEAR` as a word)."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(query[:MAX_QUERY_CHARS].lower()):
        if word not in STOP_WORDS and word not in seen:
            seen[word] = None
            if len(seen) == MAX_TERMS:
                break
    return list(seen)


def _fts5_match(words: Sequence[str]) -> str:
    # Each word a quoted FTS5 string (\w never holds '"'), so none is read as an operator;
    # the tokenizer still stems it.
    return " OR ".join(f'"{w}"' for w in words)


def _tsquery(words: Sequence[str]) -> str:
    # Each word a quoted tsquery lexeme (\w never holds "'" or '\\'); to_tsquery stems it.
    return " | ".join(f"'{w}'" for w in words)


def prefix(ns: tuple[str, ...]) -> str:
    """A namespace as the store's `prefix` column holds it."""
    return ".".join(ns)


# -- SQLite (and the in-process index) -----------------------------------------------------

_SQLITE_TABLES = """
CREATE TABLE IF NOT EXISTS criogen_search_keys (
    id INTEGER PRIMARY KEY,
    prefix TEXT NOT NULL,
    key TEXT NOT NULL,
    UNIQUE (prefix, key)
);
CREATE VIRTUAL TABLE IF NOT EXISTS criogen_search_fts
    USING fts5(text, tokenize = 'porter unicode61 remove_diacritics 2');
"""

_SQLITE_ROW_TEXT = "json_extract(CAST(new.value AS TEXT), '$.text')"
_SQLITE_HAS_TEXT = (
    "json_valid(CAST(new.value AS TEXT)) AND json_type(CAST(new.value AS TEXT), '$.text') = 'text'"
)
_SQLITE_KEY_ID = "(SELECT id FROM criogen_search_keys WHERE prefix = {r}.prefix AND key = {r}.key)"
# What an inserted or updated store row does to the index. The store writes with INSERT OR
# REPLACE, whose implicit delete fires no DELETE trigger (recursive_triggers is off), so it
# drops what the key indexed before.
_SQLITE_REINDEX = f"""
    INSERT OR IGNORE INTO criogen_search_keys (prefix, key) VALUES (new.prefix, new.key);
    DELETE FROM criogen_search_fts WHERE rowid = {_SQLITE_KEY_ID.format(r="new")};
    INSERT INTO criogen_search_fts (rowid, text)
        SELECT {_SQLITE_KEY_ID.format(r="new")}, {_SQLITE_ROW_TEXT} WHERE {_SQLITE_HAS_TEXT};"""
_SQLITE_TRIGGERS = f"""
CREATE TRIGGER IF NOT EXISTS criogen_search_insert AFTER INSERT ON store
WHEN new.prefix LIKE '{_INDEXED}' BEGIN{_SQLITE_REINDEX}
END;
CREATE TRIGGER IF NOT EXISTS criogen_search_update AFTER UPDATE OF value ON store
WHEN new.prefix LIKE '{_INDEXED}' BEGIN{_SQLITE_REINDEX}
END;
CREATE TRIGGER IF NOT EXISTS criogen_search_delete AFTER DELETE ON store
WHEN old.prefix LIKE '{_INDEXED}' BEGIN
    DELETE FROM criogen_search_fts WHERE rowid = {_SQLITE_KEY_ID.format(r="old")};
    DELETE FROM criogen_search_keys WHERE prefix = old.prefix AND key = old.key;
END;
"""

_SQLITE_BACKFILL = f"""
INSERT OR IGNORE INTO criogen_search_keys (prefix, key)
    SELECT prefix, key FROM store WHERE prefix LIKE '{_INDEXED}';
INSERT INTO criogen_search_fts (rowid, text)
    SELECT k.id, {_SQLITE_ROW_TEXT.replace("new.", "s.")}
    FROM store s JOIN criogen_search_keys k ON k.prefix = s.prefix AND k.key = s.key
    WHERE s.prefix LIKE '{_INDEXED}' AND {_SQLITE_HAS_TEXT.replace("new.", "s.")};
"""

_SQLITE_SEARCH = """
SELECT k.key, -bm25(criogen_search_fts) AS score
FROM criogen_search_fts JOIN criogen_search_keys k ON k.id = criogen_search_fts.rowid
WHERE criogen_search_fts MATCH ? AND k.prefix = ?
ORDER BY score DESC, k.key LIMIT ?
"""


def _sqlite_search(
    db: sqlite3.Connection, ns: str, words: Sequence[str], limit: int
) -> list[tuple[str, float]]:
    rows = db.execute(_SQLITE_SEARCH, (_fts5_match(words), ns, limit)).fetchall()
    return [(str(k), float(s)) for k, s in rows]


def _sqlite_search_values(
    db: sqlite3.Connection, ns: str, words: Sequence[str], limit: int
) -> list[tuple[str, float, Any]]:
    """The matches and their store values, read together on the store's connection
    (one statement each, no store batch that could join a writer's transaction)."""
    found = _sqlite_search(db, ns, words, limit)
    if not found:
        return []
    marks = ",".join("?" * len(found))
    values = dict(
        db.execute(
            f"SELECT key, value FROM store WHERE prefix = ? AND key IN ({marks})",
            (ns, *(k for k, _ in found)),
        ).fetchall()
    )
    return [(k, s, _json(values[k])) for k, s in found if k in values]


def _json(raw: Any) -> Any:
    try:
        return json.loads(raw)
    except (TypeError, ValueError):
        return None


async def _sqlite_setup(store: Any) -> None:
    """The FTS5 tables and triggers beside the store's table, created once per file (in
    one `BEGIN IMMEDIATE` transaction, so processes starting together create and fill
    them once; the trigger's existence says it is done)."""
    conn = store.conn
    async with store.lock:
        async with conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'trigger' AND name = 'criogen_search_delete'"
        ) as cur:
            if await cur.fetchone() is not None:
                return

        def create(db: sqlite3.Connection) -> None:
            db.execute("BEGIN IMMEDIATE")
            try:
                done = db.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'trigger' "
                    "AND name = 'criogen_search_delete'"
                ).fetchone()
                if done is None:
                    for script in (_SQLITE_TABLES, _SQLITE_BACKFILL, _SQLITE_TRIGGERS):
                        for statement in _statements(script):
                            db.execute(statement)
                db.execute("COMMIT")
            except BaseException:
                db.rollback()
                raise

        await run_on_sqlite_thread(conn, create)


def _statements(script: str) -> list[str]:
    """A script's statements (trigger bodies kept whole)."""
    out: list[str] = []
    buf = ""
    for line in script.strip().splitlines():
        buf += line + "\n"
        if sqlite3.complete_statement(buf):
            out.append(buf.strip())
            buf = ""
    return out


class LocalIndex:
    """An in-process FTS5 index (SQLite in memory), used from worker threads: the same
    tokenizer and ranking as a SQLite file."""

    def __init__(self) -> None:
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._guard = threading.Lock()
        #: The namespaces loaded from the store (the rest is loaded on first use).
        self.loaded: set[str] = set()
        with self._guard:
            for statement in _statements(_SQLITE_TABLES):
                self._db.execute(statement)

    def put_many(self, ns: str, docs: Iterable[tuple[str, str | None]]) -> None:
        with self._guard, self._db:
            for key, text in docs:
                self._db.execute(
                    "INSERT OR IGNORE INTO criogen_search_keys (prefix, key) VALUES (?, ?)",
                    (ns, key),
                )
                (row_id,) = self._db.execute(
                    "SELECT id FROM criogen_search_keys WHERE prefix = ? AND key = ?", (ns, key)
                ).fetchone()
                self._db.execute("DELETE FROM criogen_search_fts WHERE rowid = ?", (row_id,))
                if text is None:
                    self._db.execute("DELETE FROM criogen_search_keys WHERE id = ?", (row_id,))
                else:
                    self._db.execute(
                        "INSERT INTO criogen_search_fts (rowid, text) VALUES (?, ?)",
                        (row_id, text),
                    )

    def search(self, ns: str, words: Sequence[str], limit: int) -> list[tuple[str, float]]:
        with self._guard:
            return _sqlite_search(self._db, ns, words, limit)

    def close(self) -> None:
        self._db.close()


#: The in-process index of each store that has one (memory://).
_LOCAL: weakref.WeakKeyDictionary[Any, LocalIndex] = weakref.WeakKeyDictionary()
_LOCAL_GUARD = threading.Lock()


# -- PostgreSQL ----------------------------------------------------------------------------

#: The text search configuration: English stemming and stop words, as FTS5's porter.
PG_CONFIG = "english"
_PG_LOCK = 0x637269_6F67656E  # pg_advisory_xact_lock key ("criogen"), for the setup


# Every query reads the whole of a GIN index's pending list (its fast-update buffer); at
# PostgreSQL's default 4 MB, after a bulk load, that was 415 pages and 10 of a 12 ms query
# on 100,000 documents. At 1 MB it is at most 128 pages, for a GIN part of inserts about
# 1.5x as slow (measured 5.7 s against 3.6 s for 22,000 rows' tsvectors).
_PG_PENDING_KB = 1024


#: A text this long (in characters) always fits a tsvector (PostgreSQL's limit is 1 MB;
#: the worst case, distinct one-letter words of 4-byte characters, takes 6 bytes per
#: character). A longer text whose tsvector would not fit is indexed by its longest
#: prefix, halving from the whole, whose tsvector does, and at least this much of it.
_PG_SAFE_CHARS = 100_000


def _pg_functions_sql(schema: str) -> list[str]:
    """The functions of the index: the tsvector of a text (never failing on a huge one:
    the store's write, which the trigger is part of, would fail with it), and the
    trigger's. `CREATE OR REPLACE`: running them again upgrades a database's copy."""
    table = f'"{schema}".criogen_search'
    return [
        f"""CREATE OR REPLACE FUNCTION "{schema}".criogen_search_vector(doc text)
        RETURNS tsvector LANGUAGE plpgsql IMMUTABLE AS $fn$
        DECLARE
            n integer := length(doc);
        BEGIN
            IF n <= {_PG_SAFE_CHARS} THEN
                RETURN to_tsvector('{PG_CONFIG}'::regconfig, doc);
            END IF;
            WHILE n > {_PG_SAFE_CHARS} LOOP
                BEGIN
                    RETURN to_tsvector('{PG_CONFIG}'::regconfig, left(doc, n));
                EXCEPTION WHEN program_limit_exceeded THEN
                    n := n / 2;
                END;
            END LOOP;
            RETURN to_tsvector('{PG_CONFIG}'::regconfig, left(doc, {_PG_SAFE_CHARS}));
        END
        $fn$""",
        f"""CREATE OR REPLACE FUNCTION "{schema}".criogen_search_sync() RETURNS trigger
        LANGUAGE plpgsql AS $fn$
        BEGIN
            IF TG_OP <> 'INSERT' THEN
                DELETE FROM {table} WHERE prefix = OLD.prefix AND key = OLD.key;
            END IF;
            IF TG_OP <> 'DELETE' AND NEW.prefix LIKE '{_INDEXED}'
                    AND jsonb_typeof(NEW.value -> 'text') = 'string' THEN
                INSERT INTO {table} (prefix, key, tsv)
                VALUES (NEW.prefix, NEW.key,
                        "{schema}".criogen_search_vector(NEW.value ->> 'text'))
                ON CONFLICT (prefix, key) DO UPDATE SET tsv = EXCLUDED.tsv;
            END IF;
            RETURN NULL;
        END
        $fn$""",
    ]


def _pg_setup_sql(schema: str) -> list[str]:
    table = f'"{schema}".criogen_search'
    return [
        f"""CREATE TABLE IF NOT EXISTS {table} (
            prefix text NOT NULL,
            key text NOT NULL,
            tsv tsvector NOT NULL,
            PRIMARY KEY (prefix, key))""",
        f"CREATE INDEX IF NOT EXISTS criogen_search_tsv ON {table} USING GIN (tsv) "
        f"WITH (gin_pending_list_limit = {_PG_PENDING_KB})",
        *_pg_functions_sql(schema),
        f"""CREATE TRIGGER criogen_search_sync
        AFTER INSERT OR DELETE OR UPDATE OF value ON "{schema}".store
        FOR EACH ROW EXECUTE FUNCTION "{schema}".criogen_search_sync()""",
        f"""INSERT INTO {table} (prefix, key, tsv)
        SELECT prefix, key, "{schema}".criogen_search_vector(value ->> 'text')
        FROM "{schema}".store
        WHERE prefix LIKE '{_INDEXED}' AND jsonb_typeof(value -> 'text') = 'string'
        ON CONFLICT (prefix, key) DO NOTHING""",
        # Statistics at once for what the backfill wrote: without them the planner takes
        # a namespace for small and intersects the GIN matches with a scan of all its keys
        # (35 ms for 100,000); autovacuum would gather them only later, or never when off.
        f"ANALYZE {table}",
    ]


_PG_DONE = (
    "SELECT 1 FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "JOIN pg_class i ON i.relname = 'criogen_search_tsv' AND i.relnamespace = n.oid "
    "WHERE t.tgname = 'criogen_search_sync' AND c.relname = 'store' AND n.nspname = %s "
    f"AND 'gin_pending_list_limit={_PG_PENDING_KB}' = ANY(i.reloptions) "
    "AND EXISTS (SELECT 1 FROM pg_proc p WHERE p.pronamespace = n.oid "
    "AND p.proname = 'criogen_search_vector')"
)
_PG_TRIGGER = (
    "SELECT 1 FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE t.tgname = 'criogen_search_sync' AND c.relname = 'store' AND n.nspname = %s"
)


async def _pg_setup(store: Any) -> None:
    """The search table, its GIN index and the trigger on the store's table, in the
    store's schema: created and filled once, under a transaction-scoped advisory lock,
    so processes starting together do it once (the trigger's existence says it is done;
    an index from before `_PG_PENDING_KB` gets that option, a database from before
    `criogen_search_vector` the functions of today); then the table's statistics
    brought up to date if autovacuum has not (see `_PG_STALE`)."""
    async with store.conn.connection() as conn:
        cur = await conn.execute("SELECT current_schema()")
        row = await cur.fetchone()
        schema = str(row[0] if not isinstance(row, dict) else row["current_schema"])
        _STATS_CHECKED[store] = time.monotonic()
        cur = await conn.execute(_PG_DONE, (schema,))
        if await cur.fetchone() is not None:
            await _pg_statistics(conn, schema)
            return
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_PG_LOCK,))
            cur = await conn.execute(_PG_TRIGGER, (schema,))
            quoted = schema.replace('"', '""')
            if await cur.fetchone() is None:
                for statement in _pg_setup_sql(quoted):
                    await conn.execute(statement)
            else:
                # Set up by an earlier version: its index may lack the bounded pending
                # list, its trigger the tsvector that never fails on a huge text.
                await conn.execute(
                    f'ALTER INDEX "{quoted}".criogen_search_tsv '
                    f"SET (gin_pending_list_limit = {_PG_PENDING_KB})"
                )
                for statement in _pg_functions_sql(quoted):
                    await conn.execute(statement)
        await _pg_statistics(conn, schema)


# The search plans need the search table's statistics: with none, or from before a bulk
# load, the planner takes a large namespace for a small one and walks all its rows
# (measured at 100,000 documents: p50 207 ms, p99 562 ms; 4.6 / 44.5 ms once analyzed;
# 17 / 40 ms for a load right after the index was set up). Autovacuum gathers them within
# a minute of such a load, but only if it is on; so a process's first search, and then a
# search at most every `_PG_STATS_EVERY_SECS`, analyzes the table when autovacuum's own
# threshold is passed.
_PG_STALE = (
    "SELECT 1 FROM pg_stat_user_tables WHERE schemaname = %s AND relname = 'criogen_search' "
    "AND n_mod_since_analyze > 50 + 0.1 * n_live_tup"
)
_PG_STATS_EVERY_SECS = 5.0
#: Per store: when its search table's statistics were last checked (`time.monotonic()`).
_STATS_CHECKED: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


async def _pg_statistics(conn: Any, schema: str) -> None:
    cur = await conn.execute(_PG_STALE, (schema,))
    if await cur.fetchone() is not None:
        quoted = schema.replace('"', '""')
        await conn.execute(f'ANALYZE "{quoted}".criogen_search')


async def _pg_statistics_due(root: Any) -> None:
    """Check the statistics (see `_PG_STALE`) if this store has not for a while: one
    catalog read every few seconds, an ANALYZE after a load."""
    now = time.monotonic()
    last = _STATS_CHECKED.get(root)
    if last is not None and now - last < _PG_STATS_EVERY_SECS:
        return
    _STATS_CHECKED[root] = now
    async with root.conn.connection() as conn:
        cur = await conn.execute("SELECT current_schema() AS s")
        row = await cur.fetchone()
        await _pg_statistics(conn, str(row[0] if not isinstance(row, dict) else row["s"]))


#: Up to this many distinct query words, a search first ranks only the documents holding
#: two of them or more (see `_PG_SEARCH`); the pairs in that tsquery grow as n^2 / 2.
_PG_PAIR_TERMS = 12

# ts_rank (weights D, no length normalization) scores a document by the query lexemes it
# holds: each adds between 0.1 / 1.645 (one occurrence) and just under 0.1 (many), over the
# number of query lexemes. So any document holding two of them outranks every document that
# holds one: when `limit` documents hold two or more, they are the exact answer, found
# without reading the rows that match one frequent word only (34,000 of 100,000 for a
# common word, 300 ms of heap reads, where the pairs match a few dozen). Fewer than that:
# the plain OR query, as before. The lexemes come from the server (stemmed, English stop
# words dropped, duplicates merged) so a pair is never one lexeme twice. `%(pairs)s` is
# false, and the plain OR query runs alone, for a query with too many words (n^2 / 2
# pairs) or a word the parser may split (not letters and digits only: an underscore, say;
# its tsquery has phrase nodes). The test of the count stays outside the LIMITed subquery,
# so a skipped plain query starts nothing (inside, it gated the scan in each parallel
# worker: workers launched for nothing).
_PG_SEARCH = f"""
WITH lexemes AS (
    SELECT DISTINCT l FROM unnest(tsvector_to_array(
        to_tsvector('{PG_CONFIG}'::regconfig, %(text)s))) l
    WHERE %(pairs)s
), pairs AS (
    SELECT string_agg(
        format('(%%s & %%s)', quote_literal(a.l), quote_literal(b.l)), ' | ')::tsquery AS q
    FROM lexemes a JOIN lexemes b ON a.l < b.l
), two AS (
    SELECT prefix, key, ts_rank(tsv, to_tsquery('{PG_CONFIG}'::regconfig, %(query)s)) AS score
    FROM criogen_search
    WHERE prefix = %(ns)s AND tsv @@ (SELECT q FROM pairs)
    ORDER BY score DESC, key LIMIT %(limit)s
), best AS (
    SELECT * FROM two WHERE (SELECT count(*) FROM two) >= %(limit)s
    UNION ALL
    SELECT * FROM (
        SELECT prefix, key, ts_rank(tsv, q) AS score
        FROM criogen_search, to_tsquery('{PG_CONFIG}'::regconfig, %(query)s) q
        WHERE prefix = %(ns)s AND tsv @@ q
        ORDER BY score DESC, key LIMIT %(limit)s
    ) every WHERE (SELECT count(*) FROM two) < %(limit)s
)
SELECT b.key, b.score, s.value
FROM best b JOIN store s ON s.prefix = b.prefix AND s.key = b.key
ORDER BY b.score DESC, b.key
"""


def _pg_params(words: Sequence[str], ns: str, limit: int) -> dict[str, Any]:
    return {
        "text": " ".join(words),
        "pairs": 2 <= len(words) <= _PG_PAIR_TERMS and all(w.isalnum() for w in words),
        "query": _tsquery(words),
        "ns": ns,
        "limit": limit,
    }


async def _pg_search(
    store: Any, ns: str, words: Sequence[str], limit: int
) -> list[tuple[str, float, Any]]:
    async with store.conn.connection() as conn:
        cur = await conn.execute(_PG_SEARCH, _pg_params(words, ns, limit))
        rows = await cur.fetchall()
    out = []
    for row in rows:
        key, score, value = (
            (row["key"], row["score"], row["value"]) if isinstance(row, dict) else row
        )
        out.append((str(key), float(score), value))
    return out


# -- choosing ------------------------------------------------------------------------------


def store_kind(store: Any) -> str:
    """`sqlite`, `postgres` (an index in the database), `local` (memory://: one
    in-process index per store) or `scan` (encrypted or foreign stores: the namespace
    indexed in a worker thread per search)."""
    if hasattr(store, "inner"):  # SealedStore: the database holds only ciphertext
        return "local" if store_kind(store.inner) == "local" else "scan"
    module = type(store).__module__
    names = {c.__name__ for c in type(store).__mro__}
    if "AsyncSqliteStore" in names and hasattr(store, "conn") and hasattr(store, "lock"):
        return "sqlite"
    if "AsyncPostgresStore" in names:
        try:
            from psycopg_pool import AsyncConnectionPool
        except ImportError:  # pragma: no cover - the postgres extra brings it
            return "scan"
        return "postgres" if isinstance(store.conn, AsyncConnectionPool) else "scan"
    if module.startswith("criogen_graph.storage.memory"):
        return "local"
    return "scan"


def root_store(store: Any) -> Any:
    """The database's store under an encrypted one (itself otherwise)."""
    return getattr(store, "inner", store)


#: Per store: the setup of its index, done (True) or under way; a failed or cancelled
#: setup is forgotten (False), so the next search tries again.
_READY: weakref.WeakKeyDictionary[Any, asyncio.Future[bool]] = weakref.WeakKeyDictionary()


async def ensure_index(store: Any) -> None:
    """Create the store's search index if it has none (once per store object; concurrent
    first searches wait for the one setting it up). Under an encrypted store too: its
    triggers index nothing (sealed values have no text), and every database has the same
    tables whether encrypted or not."""
    root = root_store(store)
    kind = store_kind(root)
    if kind not in ("sqlite", "postgres"):
        return
    while True:
        ready = _READY.get(root)
        if ready is None:
            ready = asyncio.get_running_loop().create_future()
            _READY[root] = ready
            try:
                await (_sqlite_setup(root) if kind == "sqlite" else _pg_setup(root))
            except BaseException:
                if _READY.get(root) is ready:
                    del _READY[root]
                ready.set_result(False)
                raise
            ready.set_result(True)
            return
        if await asyncio.shield(ready):
            return


def _local(store: Any) -> LocalIndex:
    root = root_store(store)
    with _LOCAL_GUARD:
        index = _LOCAL.get(root)
        if index is None:
            index = _LOCAL[root] = LocalIndex()
            weakref.finalize(root, index.close)
        return index


def _text(value: Any) -> str | None:
    text = value.get("text") if isinstance(value, dict) else None
    return text if isinstance(text, str) else None


async def _load(store: Any, ns: tuple[str, ...], max_items: int) -> dict[str, Any]:
    items = await store.asearch(ns, limit=max_items)
    return {i.key: i.value for i in items if tuple(i.namespace) == ns}


async def noted(store: Any, ns: tuple[str, ...], key: str, text: str | None) -> None:
    """A write of ours to `store` (`text` None: a delete), for an in-process index; the
    databases' indexes follow by themselves."""
    if store_kind(store) != "local":
        return
    # Applied even before the namespace is loaded: a load that read the store before
    # this write is then put over it, and a key it brings back that is gone is dropped
    # when the results are read from the store.
    await asyncio.to_thread(_local(store).put_many, prefix(ns), [(key, text)])


async def search(
    store: Any,
    ns: tuple[str, ...],
    query: str,
    limit: int,
    *,
    max_items: int,
    keep_local: bool = True,
) -> list[tuple[str, float, dict[str, Any]]]:
    """The `limit` items of namespace `ns` that best match `query`: their keys, scores
    (higher is better) and values, best first; `max_items` bounds what an in-process
    index loads from a store. With `keep_local=False` a memory:// store is indexed per
    search (for callers whose writes do not go through `noted`)."""
    words = terms(query)
    if not words or limit <= 0:
        return []
    kind = store_kind(store)
    if kind == "local" and not keep_local:
        kind = "scan"
    key = prefix(ns)
    found: list[tuple[str, float, Any]]
    if kind == "sqlite":
        await ensure_index(store)
        root = root_store(store)
        conn = root.conn
        async with root.lock:
            found = await run_on_sqlite_thread(conn, _sqlite_search_values, key, words, limit)
    elif kind == "postgres":
        await ensure_index(store)
        await _pg_statistics_due(root_store(store))
        found = await _pg_search(root_store(store), key, words, limit)
    elif kind == "local":
        index = _local(store)
        if key not in index.loaded:
            # (Loaded twice by concurrent first searches at worst: putting is idempotent.)
            docs = await _load(store, ns, max_items)
            await asyncio.to_thread(index.put_many, key, [(k, _text(v)) for k, v in docs.items()])
            index.loaded.add(key)
        hits = await asyncio.to_thread(index.search, key, words, limit)
        from langgraph.store.base import GetOp, Item

        items = await store.abatch([GetOp(ns, k) for k, _ in hits])
        found = [
            (k, s, i.value) for (k, s), i in zip(hits, items, strict=True) if isinstance(i, Item)
        ]
    else:
        await ensure_index(store)
        docs = await _load(store, ns, max_items)

        def scan() -> list[tuple[str, float]]:
            once = LocalIndex()
            try:
                once.put_many(key, [(k, _text(v)) for k, v in docs.items()])
                return once.search(key, words, limit)
            finally:
                once.close()

        found = [(k, s, docs[k]) for k, s in await asyncio.to_thread(scan)]
    return [(k, s, v) for k, s, v in found if _text(v) is not None]
