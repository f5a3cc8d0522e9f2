"""`sqlite:` URLs: LangGraph's async SQLite saver on one file (WAL), plus the audit trail
in the same file and `flock` locks beside it.

A saver operation is one function over a `sqlite3` connection (statements, audit rows and
the commit together). Uncontended, it takes tens of microseconds in WAL mode, less than a
hop to a worker thread, so it runs inline on a second connection that never waits
(`busy_timeout=0`); when another writer holds the file it goes to aiosqlite's worker
thread, which waits the usual 5 s. WAL with `synchronous=NORMAL` by default: a committed
write survives the process being killed; only an operating-system crash or power loss can
lose the last commits. `?synchronous=full` in the URL makes every commit wait for the
disk, so it survives those too (every connection of the file gets the setting). The
inline connection does not checkpoint the WAL itself; the worker thread does, in the
background.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import aiosqlite
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.checkpoint.sqlite.utils import load_pending_writes, pending_writes_sql

from criogen_graph.errors import StorageError
from criogen_graph.runtime.inputs import check_thread_id
from criogen_graph.runtime.segment import Segment, segment_for
from criogen_graph.storage._driver_internals import daemon_thread, run_on_sqlite_thread
from criogen_graph.storage.base import (
    ENCRYPTION_CLAIM,
    LEGACY_KEY_CHECK,
    UNENCRYPTED,
    Backend,
    MakeRecord,
    SaverMixin,
    TranscriptCache,
    adopt_claim,
    audit_query,
    cached_head,
    checkpoint_config,
    checkpoint_tuple,
    import_once,
    may_wait,
    not_offered,
    records_for_put,
    records_for_writes,
    redacted_errors,
    segment_metadata,
    writes_may_wait,
    writing,
)
from criogen_graph.storage.locks import FileLocks

_SCHEMA = """
CREATE TABLE IF NOT EXISTS criogen_audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    thread_id TEXT NOT NULL,
    ts_ns INTEGER NOT NULL,
    run_id TEXT,
    actor TEXT,
    action TEXT NOT NULL,
    type TEXT NOT NULL,
    details BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS criogen_audit_thread ON criogen_audit (thread_id, id);
CREATE TABLE IF NOT EXISTS criogen_meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
"""

T = TypeVar("T")
MMAP_BYTES = 256 * 1024 * 1024

_INSERT_AUDIT = (
    "INSERT INTO criogen_audit (thread_id, ts_ns, run_id, actor, action, type, details) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)


#: A piece of a transaction: statements run on the connection, committed by the caller.
Write = Callable[[sqlite3.Connection], None]


def _transaction(parts: Sequence[Write]) -> Write:
    def run(db: sqlite3.Connection) -> None:
        for part in parts:
            part(db)
        db.commit()

    return run


class _Saver(SaverMixin, AsyncSqliteSaver):
    """`AsyncSqliteSaver` whose writes carry the audit trail, each one function call."""

    #: Inline commits between two background WAL checkpoints.
    CHECKPOINT_EVERY = 256

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        raise not_offered("prune")

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        raise not_offered("prune")

    def __init__(
        self,
        conn: aiosqlite.Connection,
        serde: SerializerProtocol | None,
        fast: sqlite3.Connection | None,
        synchronous: str = "NORMAL",
    ) -> None:
        super().__init__(conn, serde=serde)
        self._fast = fast
        self.synchronous = synchronous
        self._inline_commits = 0
        self._wal_task: asyncio.Task[None] | None = None
        self.transcripts = TranscriptCache()

    async def setup(self) -> None:
        if self.is_setup:
            return
        await super().setup()
        async with self.lock:
            async with self.conn.execute(f"PRAGMA synchronous={self.synchronous}"):
                pass
            # Memory-mapped reads share the operating system's page cache between the two
            # connections, so a commit on one does not leave the other re-reading the file.
            async with self.conn.execute(f"PRAGMA mmap_size={MMAP_BYTES}"):
                pass
            await self.conn.executescript(_SCHEMA)
            await self.conn.commit()

    async def _run(
        self, fn: Callable[[sqlite3.Connection], T], *, write: bool = True, inline: bool = True
    ) -> T:
        """Run `fn` on the inline connection when the file is free, else (or with
        `inline=False`) on aiosqlite's worker thread."""
        fast = self._fast if inline else None
        if fast is not None and not self.lock.locked():
            try:
                result = fn(fast)
            except sqlite3.OperationalError as exc:
                fast.rollback()
                # "no such table": the inline connection's cached schema predates a table
                # another connection created, and SQLite could not re-read it without
                # waiting (its busy timeout is 0); the worker thread's connection waits.
                text = str(exc)
                if "locked" not in text and "busy" not in text and "no such table" not in text:
                    raise
            else:
                if write:
                    self._inline_commits += 1
                    if self._inline_commits >= self.CHECKPOINT_EVERY:
                        self._inline_commits = 0
                        self._schedule_wal_checkpoint()
                return result
        async with self.lock:
            return await run_on_sqlite_thread(self.conn, fn)

    def _schedule_wal_checkpoint(self) -> None:
        if self._wal_task is not None and not self._wal_task.done():
            return

        def wal_checkpoint(db: sqlite3.Connection) -> None:
            db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

        async def checkpoint() -> None:
            async with self.lock:
                await run_on_sqlite_thread(self.conn, wal_checkpoint)

        self._wal_task = asyncio.ensure_future(checkpoint())

    def set_fast(self, fast: sqlite3.Connection | None) -> None:
        self._fast = fast

    def close_fast(self) -> None:
        if self._fast is not None:
            self._fast.close()
            self._fast = None

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        await self.setup()
        thread_id = str(config["configurable"]["thread_id"])
        checkpoint_ns = config["configurable"]["checkpoint_ns"]
        metadata = segment_metadata(thread_id, metadata)
        type_, blob = self.serde.dumps_typed(checkpoint)
        meta = json.dumps(get_checkpoint_metadata(config, metadata), ensure_ascii=False).encode(
            "utf-8", "ignore"
        )
        next_config = checkpoint_config(thread_id, checkpoint_ns, checkpoint["id"])
        audit = self.audit_rows(
            records_for_put(segment_for(thread_id), dict(next_config), metadata)
        )
        row = (
            thread_id,
            checkpoint_ns,
            checkpoint["id"],
            config["configurable"].get("checkpoint_id"),
            type_,
            blob,
            meta,
        )

        def write(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT OR REPLACE INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, "
                "parent_checkpoint_id, type, checkpoint, metadata) VALUES (?, ?, ?, ?, ?, ?, ?)",
                row,
            )
            if audit:
                db.executemany(_INSERT_AUDIT, audit)

        seg = segment_for(thread_id)
        if seg is not None and not checkpoint_ns and may_wait(checkpoint, metadata):
            # Committed with the run's next write (one commit, one fsync under
            # synchronous=full, instead of one per checkpoint and task).
            self.hold_back(seg, [write])
            return next_config
        await self._commit(seg, [write])
        return next_config

    async def _commit(self, seg: Segment | None, parts: list[Write]) -> None:
        """Run `parts` and what `seg` held back (first) in one transaction."""
        if seg is not None:
            await self.behind(seg)
            if seg.deferred:
                parts = [*seg.deferred, *parts]
                seg.deferred = []
        await self._run(_transaction(parts))

    async def write_held(self, seg: Segment, parts: list[Any]) -> None:
        await self._run(_transaction(parts))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self.setup()
        writes = redacted_errors(writes)
        query = (
            "INSERT OR REPLACE INTO writes (thread_id, checkpoint_ns, checkpoint_id, task_id, "
            "task_path, idx, channel, type, value) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
            if all(w[0] in WRITES_IDX_MAP for w in writes)
            else "INSERT OR IGNORE INTO writes (thread_id, checkpoint_ns, checkpoint_id, task_id, "
            "task_path, idx, channel, type, value) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        thread_id = str(config["configurable"]["thread_id"])
        ns = str(config["configurable"]["checkpoint_ns"])
        cid = str(config["configurable"]["checkpoint_id"])
        rows = [
            (
                thread_id,
                ns,
                cid,
                task_id,
                task_path,
                WRITES_IDX_MAP.get(channel, idx),
                channel,
                *self.serde.dumps_typed(value),
            )
            for idx, (channel, value) in enumerate(writes)
        ]
        seg = segment_for(thread_id)
        with writing(seg, task_id) as ok:
            if not ok:
                return
            audit = self.audit_rows(records_for_writes(seg, writes))

            def write(db: sqlite3.Connection) -> None:
                db.executemany(query, rows)
                if audit:
                    db.executemany(_INSERT_AUDIT, audit)

            if (
                seg is not None
                and not ns
                and writes_may_wait(config["configurable"], task_id, task_path)
            ):
                self.hold_back(seg, [write])
                return
            await self._commit(seg, [write])

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        hit, head = cached_head(config)
        if hit:
            return cast(CheckpointTuple | None, head)
        await self.setup()
        # (LangGraph reads a thread's head before it writes anything to it.)
        thread_id = check_thread_id(str(config["configurable"]["thread_id"]))
        checkpoint_ns = config["configurable"].get("checkpoint_ns", "")
        checkpoint_id = get_checkpoint_id(config)
        writes_sql = pending_writes_sql(self._has_task_path)

        def read(db: sqlite3.Connection) -> tuple[Any, list[Any]] | None:
            if checkpoint_id:
                cur = db.execute(
                    "SELECT thread_id, checkpoint_id, parent_checkpoint_id, type, checkpoint, "
                    "metadata FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? AND "
                    "checkpoint_id = ?",
                    (thread_id, checkpoint_ns, checkpoint_id),
                )
            else:
                cur = db.execute(
                    "SELECT thread_id, checkpoint_id, parent_checkpoint_id, type, checkpoint, "
                    "metadata FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? "
                    "ORDER BY checkpoint_id DESC LIMIT 1",
                    (thread_id, checkpoint_ns),
                )
            try:
                row = cur.fetchone()
            finally:
                # An unfinished SELECT would keep a statement open and block commits.
                cur.close()
            if row is None:
                return None
            pending = db.execute(writes_sql, (thread_id, checkpoint_ns, row[1])).fetchall()
            return row, pending

        found = await self._run(read, write=False)
        if found is None:
            return None
        (tid, cid, parent_id, type_, blob, metadata), pending = found
        return checkpoint_tuple(
            tid,
            checkpoint_ns,
            cid,
            parent_id,
            self.serde.loads_typed((type_, blob)),
            cast(CheckpointMetadata, json.loads(metadata) if metadata is not None else {}),
            load_pending_writes(pending, self.serde),
        )


#: The `synchronous=` URL option: how much a commit waits for the disk (WAL mode).
SYNCHRONOUS = ("normal", "full")


def sqlite_synchronous(url: str) -> str:
    """The `synchronous` option of a `sqlite:` URL (`?synchronous=normal`, the default,
    or `full`), upper-cased for the PRAGMA; `StorageError` for any other value."""
    from urllib.parse import parse_qs

    query = url.split("?", 1)[1] if "?" in url else ""
    values = parse_qs(query, keep_blank_values=True).get("synchronous", ["normal"])
    value = values[-1].strip().lower()
    if len(values) > 1 or value not in SYNCHRONOUS:
        raise StorageError(
            f"SQLite URL option synchronous={values[-1]!r} is not one of normal (the "
            "default: a commit survives the process being killed) or full (it also "
            "survives an operating-system crash or power loss)",
            code="invalid_url",
        )
    return value.upper()


def parse_sqlite_url(url: str) -> str:
    """The file path of a `sqlite:` URL: `sqlite:///relative.db`, `sqlite:////abs.db`,
    or `sqlite://x.db` as the seeds write it (its options are checked too)."""
    rest = url[len("sqlite:") :]
    if rest.startswith("///"):
        path = rest[3:]
    elif rest.startswith("//"):
        path = rest[2:]
    else:
        raise StorageError(
            f"malformed SQLite URL {url!r}: use sqlite:///relative.db or sqlite:////abs/path.db",
            code="invalid_url",
        )
    path = path.split("?", 1)[0]
    if not path:
        raise StorageError(
            f"SQLite URL {url!r} names no file: use sqlite:///relative.db or "
            "sqlite:////abs/path.db",
            code="invalid_url",
        )
    sqlite_synchronous(url)
    return path


#: How long opening a file waits for another process's write to finish.
OPEN_WAIT_SECS = 5.0
#: How long opening waits for other processes setting the same file up.
SETUP_WAIT_SECS = 120.0


@contextlib.asynccontextmanager
async def _setting_up(path: str) -> AsyncIterator[None]:
    """Set the file's tables up one connection at a time, across processes (an `flock`
    on `<db>.locks/setup.lock`, freed by the kernel if its holder dies). Connections
    creating a fresh file's schema together can deadlock in SQLite's locking, which
    then fails one at once with "database is locked" instead of letting it wait."""
    if path == ":memory:":
        yield
        return
    lock = Path(path + ".locks") / "setup.lock"

    def take() -> int | None:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        return fd

    deadline = time.monotonic() + SETUP_WAIT_SECS
    delay = 0.002
    while (fd := await asyncio.to_thread(take)) is None:
        if time.monotonic() > deadline:
            raise StorageError(
                f"setting up SQLite file {path!r} took longer than {SETUP_WAIT_SECS:g}s: "
                "another process is setting it up; try again, or look for a stuck process",
                code="setup_timeout",
            )
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 0.05)
    try:
        yield
    finally:
        os.close(fd)  # (closing the file releases its lock)


def _fast_connection(path: str, synchronous: str = "NORMAL") -> sqlite3.Connection | None:
    """The inline connection (see the module docstring); None for `:memory:`."""
    if path == ":memory:":
        return None
    # Setting it up may wait for another process's write (reading the schema needs the
    # file); afterwards it never waits: a busy file sends the call to the worker thread.
    fast = sqlite3.connect(path, timeout=OPEN_WAIT_SECS, check_same_thread=False)
    try:
        fast.execute(f"PRAGMA synchronous={synchronous}")
        fast.execute("PRAGMA wal_autocheckpoint=0")
        fast.execute(f"PRAGMA mmap_size={MMAP_BYTES}").fetchall()
        fast.execute("PRAGMA busy_timeout=0")
    except BaseException:
        fast.close()
        raise
    return fast


def _open_error(path: str, exc: BaseException) -> StorageError:
    text = str(exc)
    if "not a database" in text:
        return StorageError(
            f"{path!r} is not a SQLite database (or it is encrypted by another tool): {text}",
            code="not_a_database",
        )
    if "locked" in text:
        return StorageError(
            f"SQLite file {path!r} is locked by another connection that holds a write "
            "transaction; try again when it is done",
            code="busy",
        )
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else text
    return StorageError(f"cannot write SQLite file {path!r}: {reason}", code="unwritable")


def _store_class() -> type[Any]:
    from langgraph.store.sqlite.aio import AsyncSqliteStore

    class Store(AsyncSqliteStore):
        """`AsyncSqliteStore` whose transactions take the write lock first (`BEGIN
        IMMEDIATE`, waiting the busy timeout): its batches read before they write, and a
        deferred transaction that read before another connection (the saver's) committed
        fails at once with "database is locked" when it then writes."""

        #: `BaseSqliteStore` keeps TTLs, but `AsyncSqliteStore`'s bases put `BaseStore`'s
        #: `False` first, so LangGraph's own class says it does not.
        supports_ttl = True

        @contextlib.asynccontextmanager
        async def _cursor(self, *, transaction: bool = True) -> AsyncIterator[aiosqlite.Cursor]:
            if not self.is_setup:
                await self.setup()
            async with self.lock:
                if transaction:
                    await self.conn.execute("BEGIN IMMEDIATE")
                async with self.conn.cursor() as cur:
                    try:
                        yield cur
                    except BaseException:
                        if transaction:
                            await self.conn.execute("ROLLBACK")
                        raise
                    if transaction:
                        await self.conn.execute("COMMIT")

    return Store


class SqliteBackend(Backend):
    """Opening does its file work (directories, the inline connection, the key check) in
    worker threads, so a storage first used inside a graph node (a `CollectionTool` in
    `langgraph dev`, whose `blockbuster` forbids blocking calls on the event loop)
    opens cleanly."""

    def __init__(self, url: str, serde: SerializerProtocol | None) -> None:
        self.path = parse_sqlite_url(url)
        self.synchronous = sqlite_synchronous(url)
        self._serde = serde
        self._conn: aiosqlite.Connection | None = None
        self._store_conn: aiosqlite.Connection | None = None
        self._files: FileLocks | None = None
        self.in_memory = self.path == ":memory:"

    async def open(self) -> None:
        if not self.in_memory:
            file = Path(self.path)
            try:
                await asyncio.to_thread(file.parent.mkdir, parents=True, exist_ok=True)
            except OSError as exc:
                reason = exc.strerror or exc
                raise StorageError(
                    f"cannot create the directory for SQLite file {self.path!r}: {reason}",
                    code="unwritable",
                ) from None
        try:
            conn = aiosqlite.connect(self.path)
            # A storage nobody closed must not keep the interpreter alive at exit: SQLite
            # rolls back whatever was uncommitted when the file is next opened.
            daemon_thread(conn)
            await conn
        except (sqlite3.Error, OSError) as exc:
            raise StorageError(
                f"cannot open SQLite file {self.path!r}: {exc}", code="unwritable"
            ) from None
        self._conn = conn
        fast: sqlite3.Connection | None = None
        try:
            saver = _Saver(conn, self._serde, None, self.synchronous)
            async with _setting_up(self.path):
                await saver.setup()
            # Opened once the tables exist, so the schema it caches has them.
            fast = await asyncio.to_thread(_fast_connection, self.path, self.synchronous)
            saver.set_fast(fast)
            # Fails now, not mid-run, on a file that cannot be written.
            await conn.execute("BEGIN IMMEDIATE")
            await conn.rollback()
            if not self.in_memory:
                self._files = await asyncio.to_thread(FileLocks, Path(self.path + ".locks"))
        except (sqlite3.Error, OSError, StorageError) as exc:
            # Leave nothing open behind a failed open: no thread, no file handle.
            if fast is not None:
                fast.close()
            self._conn = None
            await conn.close()
            if isinstance(exc, StorageError):
                raise
            raise _open_error(self.path, exc) from None
        self.saver = saver
        if self._files is not None:
            self.try_lock = self._files.try_lock
            self.unlock = self._files.unlock

    async def open_store(self) -> Any:
        if self.store is None:
            import_once("langgraph.store.sqlite.aio")
            _Store = _store_class()

            # Its own connection (in autocommit mode: the store issues its own BEGIN), so
            # the store's statements never interleave with the saver's.
            conn = aiosqlite.connect(self.path, isolation_level=None)
            daemon_thread(conn)
            await conn
            async with conn.execute(f"PRAGMA synchronous={self.synchronous}"):
                pass
            store = _Store(conn)
            try:
                async with _setting_up(self.path):
                    await store.setup()
            except BaseException:
                await conn.close()
                raise
            self._store_conn = conn
            self.store = store
        return self.store

    async def close(self) -> None:
        if self.store is not None:
            self.drop_store()
            if self._store_conn is not None:
                await self._store_conn.close()
                self._store_conn = None
        if self._files is not None:
            self._files.close()
        saver = getattr(self, "saver", None)
        if isinstance(saver, _Saver):
            if saver._wal_task is not None:
                await asyncio.gather(saver._wal_task, return_exceptions=True)
            saver.close_fast()
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.close()

    async def flush_deferred(self, seg: Segment) -> None:
        """Commit what the run held back, with its records not yet saved (the end of a
        run that went well: its completion), in one transaction."""
        saver = cast(_Saver, self.saver)
        await saver.behind(seg)
        parts: list[Write] = seg.deferred
        seg.deferred = []
        if not seg.closed and seg.audit:
            rows = saver.audit_rows(seg.audit)
            seg.audit = []

            def audit(db: sqlite3.Connection) -> None:
                db.executemany(_INSERT_AUDIT, rows)

            parts = [*parts, audit]
        if parts:
            await saver._run(_transaction(parts))

    async def write_audit(self, records: list[dict[str, Any]]) -> None:
        saver = cast(_Saver, self.saver)
        rows = saver.audit_rows(records)

        def write(db: sqlite3.Connection) -> None:
            db.executemany(_INSERT_AUDIT, rows)
            db.commit()

        await saver._run(write)

    async def read_audit(self, thread_id: str | None, limit: int | None) -> list[dict[str, Any]]:
        saver = cast(_Saver, self.saver)
        sql, params = audit_query(thread_id, limit, "?")

        def read(db: sqlite3.Connection) -> list[Any]:
            return db.execute(sql, params).fetchall()

        rows = await saver._run(read, write=False)
        return [saver.audit_record(r) for r in reversed(rows)]

    async def delete_audit(self, thread_id: str) -> int:
        saver = cast(_Saver, self.saver)

        def delete(db: sqlite3.Connection) -> int:
            n = db.execute("DELETE FROM criogen_audit WHERE thread_id = ?", (thread_id,)).rowcount
            db.commit()
            return int(n)

        return int(await saver._run(delete))

    async def delete_thread(self, thread_id: str, make_record: MakeRecord, *, audit: bool) -> bool:
        """One transaction (one function on one connection, committed once)."""
        saver = cast(_Saver, self.saver)

        def delete(db: sqlite3.Connection) -> bool:
            existed = (
                db.execute(
                    "SELECT 1 FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = '' LIMIT 1",
                    (thread_id,),
                ).fetchone()
                is not None
            )
            db.execute("DELETE FROM checkpoints WHERE thread_id = ?", (thread_id,))
            db.execute("DELETE FROM writes WHERE thread_id = ?", (thread_id,))
            removed = 0
            if audit:
                cur = db.execute("DELETE FROM criogen_audit WHERE thread_id = ?", (thread_id,))
                removed = int(cur.rowcount)
            db.executemany(_INSERT_AUDIT, saver.audit_rows([make_record(existed, removed)]))
            db.commit()
            return existed

        existed = bool(await saver._run(delete))
        saver.transcripts.forget(thread_id)
        return existed

    async def thread_ids(self) -> list[str]:
        saver = cast(_Saver, self.saver)

        def read(db: sqlite3.Connection) -> list[str]:
            rows = db.execute(
                "SELECT DISTINCT thread_id FROM checkpoints WHERE checkpoint_ns = '' "
                "ORDER BY thread_id"
            ).fetchall()
            return [r[0] for r in rows]

        return list(await saver._run(read, write=False))

    async def claim_encryption(self, claim: bytes) -> bytes | None:
        saver = cast(_Saver, self.saver)

        def read(db: sqlite3.Connection, key: str) -> bytes | None:
            row = db.execute("SELECT value FROM criogen_meta WHERE key = ?", (key,)).fetchone()
            return bytes(row[0]) if row else None

        def has_data(db: sqlite3.Connection) -> bool:
            tables = ["checkpoints", "writes", "criogen_audit"]
            if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'store'").fetchone():
                tables.append("store")
            query = " OR ".join(f"EXISTS (SELECT 1 FROM {t})" for t in tables)
            return bool(db.execute(f"SELECT {query}").fetchone()[0])

        def run(db: sqlite3.Connection) -> bytes | None:
            found = read(db, ENCRYPTION_CLAIM)
            if found is not None:  # (a claim, once recorded, never changes)
                return found
            # The write lock first: the claim read next is the one this transaction
            # either keeps or records its own over, with no opener in between.
            db.execute("BEGIN IMMEDIATE")
            try:
                current, legacy = read(db, ENCRYPTION_CLAIM), read(db, LEGACY_KEY_CHECK)
                data = current is None and legacy is None and has_data(db)
                value, record = adopt_claim(current, legacy, claim, data)
                if record and value is not None:
                    db.execute(
                        "INSERT INTO criogen_meta (key, value) VALUES (?, ?)",
                        (ENCRYPTION_CLAIM, value),
                    )
                    if value != UNENCRYPTED:
                        db.execute(
                            "INSERT OR IGNORE INTO criogen_meta (key, value) VALUES (?, ?)",
                            (LEGACY_KEY_CHECK, value),
                        )
                db.commit()
            except BaseException:
                db.rollback()
                raise
            return value

        # When the storage opens: on the worker thread (which waits for a busy file),
        # like every open-time step.
        found: bytes | None = await saver._run(run, inline=False)
        return found

    def abandon(self) -> None:
        # Its event loop is gone: the worker threads close their connections and stop
        # (queued behind whatever they still had to do); the rest is closed here.
        for conn in (self._store_conn, self._conn):
            if conn is not None:
                conn.stop()
        self._store_conn = self._conn = None
        self.store = None
        if self._files is not None:
            self._files.close()
        saver = getattr(self, "saver", None)
        if isinstance(saver, _Saver):
            saver.close_fast()
