"""`postgres://` / `postgresql://` URLs: LangGraph's async Postgres saver on a
`psycopg_pool` pool, the audit trail in the same database, and session advisory locks held
on one connection per storage (PostgreSQL releases them if the process dies)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import select
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.types import _DeltaSnapshot

from criogen_graph._aio import uncancelled
from criogen_graph._urls import mask_url
from criogen_graph.errors import StorageError
from criogen_graph.runtime.inputs import check_thread_id
from criogen_graph.runtime.segment import Segment, segment_for
from criogen_graph.storage._driver_internals import pool_idle_connections, pool_tasks
from criogen_graph.storage.base import (
    ENCRYPTION_CLAIM,
    ERROR_CHANNEL,
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
    records_for_put,
    records_for_writes,
    redacted_errors,
    segment_metadata,
    writes_may_wait,
    writing,
)

_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS criogen_audit (
        id BIGSERIAL PRIMARY KEY,
        thread_id TEXT NOT NULL,
        ts_ns BIGINT NOT NULL,
        run_id TEXT,
        actor TEXT,
        action TEXT NOT NULL,
        type TEXT NOT NULL,
        details BYTEA NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS criogen_audit_thread ON criogen_audit (thread_id, id)",
    "CREATE TABLE IF NOT EXISTS criogen_meta (key TEXT PRIMARY KEY, value BYTEA NOT NULL)",
    # A thread's lock epoch: raised each time a process takes the thread's lock. A run
    # writes only while the epoch is the one it took the lock with (`criogen_fence`).
    # Unlogged: raising it costs no WAL flush; a server crash empties it, which fails the
    # fence of every run of before the crash (whose lock sessions died with it anyway).
    "CREATE UNLOGGED TABLE IF NOT EXISTS criogen_locks "
    "(thread_id TEXT PRIMARY KEY, epoch BIGINT NOT NULL)",
    # Fails the statement it is part of (rolling all of it back) unless the epoch is still
    # `e`. It first takes the thread's write lock `w` shared until that statement commits
    # (a process taking the thread's lock takes it exclusively, so it waits for a write in
    # flight and then sees it), then reads the epoch with a snapshot taken after that.
    """CREATE OR REPLACE FUNCTION criogen_fence(t TEXT, e BIGINT, w BIGINT) RETURNS BOOLEAN
    LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_advisory_xact_lock_shared(w);
        PERFORM 1 FROM criogen_locks WHERE thread_id = t AND epoch = e;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'criogen: the lock on thread % was taken over', t
                USING ERRCODE = 'CRG01';
        END IF;
        RETURN TRUE;
    END $$""",
]
#: The channel of an interrupt's pending write (a lost run's interrupt is not kept).
INTERRUPT_CHANNEL = "__interrupt__"
#: The SQLSTATE `criogen_fence` raises.
_FENCE_LOST = "CRG01"
#: Take a thread's lock: its session lock, then its write lock for this statement (a
#: write of the previous holder still in flight makes the thread busy: the session lock is
#: given back), and raise its epoch.
_TRY_LOCK = (
    "WITH l AS (SELECT pg_try_advisory_lock(%s) AS ok), "
    "w AS (SELECT pg_try_advisory_xact_lock(%s) AS ok FROM l WHERE l.ok), "
    "u AS (SELECT pg_advisory_unlock(%s) FROM w WHERE NOT w.ok), "
    "e AS (INSERT INTO criogen_locks (thread_id, epoch) SELECT %s, 1 FROM w WHERE w.ok "
    "ON CONFLICT (thread_id) DO UPDATE SET epoch = criogen_locks.epoch + 1 RETURNING epoch) "
    "SELECT coalesce((SELECT ok FROM w), false) AS ok, (SELECT epoch FROM e) AS epoch, "
    "(SELECT count(*) FROM u) AS given_back"
)
_INSERT_AUDIT = (
    "INSERT INTO criogen_audit (thread_id, ts_ns, run_id, actor, action, type, details) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s)"
)
#: The advisory lock that serializes the setup of a schema's tables across processes:
#: (a constant, the hash of the schema). One per schema, so a setup stuck in one schema
#: holds up no other.
_SETUP_LOCK = "%s, hashtext(coalesce(current_schema(), ''))"
_SETUP_CLASS = 0x63726967  # "crig"
#: The `criogen_meta` key of the schema version the tables were last set up to.
SCHEMA_KEY = "schema"


def schema_version(migrations: int) -> bytes:
    """The schema this version sets up: our statements and LangGraph's migration count
    (a new LangGraph migration or a changed statement of ours sets the tables up again)."""
    digest = hashlib.blake2b("\0".join(_SCHEMA).encode(), digest_size=8).hexdigest()
    return f"criogen:{digest};langgraph:{migrations}".encode()


#: How long opening a storage (or its first use of memory) may wait for the tables to be
#: set up, another process's setup included, before `StorageError("setup_timeout")`.
SETUP_WAIT_SECS = 120.0


def setup_timeout(what: str, why: str) -> StorageError:
    return StorageError(
        f"setting up the PostgreSQL {what} took longer than {SETUP_WAIT_SECS:g}s: {why}; "
        "try again, or look for a stuck process or session",
        code="setup_timeout",
    )


def unreachable(url: str, exc: BaseException) -> StorageError:
    """The error for a server that cannot be reached (or went away mid-call)."""
    text = str(exc).strip()
    reason = text.splitlines()[0] if text else type(exc).__name__
    return StorageError(f"cannot reach PostgreSQL at {mask_url(url)}: {reason}", code="unreachable")


#: SQLSTATEs (besides class 08, connection_exception) with which the server ends a session:
#: admin_shutdown (`pg_terminate_backend`), crash_shutdown, cannot_connect_now,
#: database_dropped, idle_session_timeout, idle_in_transaction_session_timeout.
_SESSION_ENDED = frozenset({"57P01", "57P02", "57P03", "57P04", "57P05", "25P03"})


def connection_lost(exc: BaseException, conn: Any = None) -> bool:
    """Whether `exc` means the connection is gone, as opposed to its statement failing.

    Decided by the connection's state and the SQLSTATE, never by the exception's class:
    psycopg raises some statement errors (SQLSTATE class 54 program_limit_exceeded, 57014
    query_canceled, 55P03 lock_not_available) as `OperationalError`, the class of a
    dropped connection, and closing a connection for one of those would release every
    lock its session holds. An error without a SQLSTATE comes from the client itself:
    lost unless `conn` (the connection it came from) is still fine."""
    import psycopg

    if conn is not None and (conn.closed or conn.broken):
        return True
    if not isinstance(exc, psycopg.Error):
        return False
    state = exc.sqlstate
    if state is None:
        return conn is None and isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
    return state.startswith("08") or state in _SESSION_ENDED


async def check_pooled(conn: Any) -> None:
    """A pool's `check` that costs no round trip while the connection looks fine: an idle
    connection the server ended (a restart, `pg_terminate_backend`) is closed locally or
    has the server's goodbye waiting on its socket; only then is it asked (psycopg_pool's
    `check_connection`, which raises for a dead one, so the pool hands out another)."""
    if conn.closed or conn.broken:
        import psycopg

        raise psycopg.OperationalError("the connection is closed")
    try:
        waiting = bool(select.select([conn.pgconn.socket], [], [], 0)[0])
    except (OSError, ValueError):  # pragma: no cover - a closed socket
        waiting = True
    if waiting:
        from psycopg_pool import AsyncConnectionPool

        await AsyncConnectionPool.check_connection(conn)


def statement_failed(exc: BaseException) -> StorageError:
    """The error for a statement PostgreSQL refused (the connection is fine)."""
    text = str(exc).strip()
    reason = text.splitlines()[0] if text else type(exc).__name__
    state = getattr(exc, "sqlstate", None) or "no SQLSTATE"
    return StorageError(
        f"PostgreSQL refused a statement ({state}): {reason}", code="database_error"
    )


@contextlib.contextmanager
def mapped(url: str) -> Iterator[None]:
    """PostgreSQL's errors as `StorageError`: a connection that failed (a server stopped,
    restarted or unreachable; a pool that cannot get a connection in time) with
    `code="unreachable"`, a statement that failed with `code="database_error"`."""
    import psycopg

    try:
        yield
    except psycopg.Error as exc:
        if connection_lost(exc):
            raise unreachable(url, exc) from exc
        raise statement_failed(exc) from exc


def lock_key(thread_id: str, kind: bytes = b"criogen-thread:") -> int:
    """A signed 64-bit advisory lock key for a thread (`kind`: which of its locks)."""
    digest = hashlib.blake2b(kind + thread_id.encode("utf-8"), digest_size=8)
    return int.from_bytes(digest.digest(), "big", signed=True)


def write_key(thread_id: str) -> int:
    """The key of a thread's write lock (see `criogen_fence`)."""
    return lock_key(thread_id, b"criogen-writes:")


_BLOBS = "checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)"
_BLOBS_CONFLICT = "ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING"
_CHECKPOINTS = (
    "checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, "
    "metadata)"
)
_CHECKPOINTS_CONFLICT = (
    "ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET "
    "checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata"
)
_WRITES = (
    "checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, "
    "channel, type, blob)"
)
_WRITES_UPSERT = (
    "ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET "
    "channel = EXCLUDED.channel, type = EXCLUDED.type, blob = EXCLUDED.blob"
)
_WRITES_IGNORE = "ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING"
_AUDIT = "criogen_audit (thread_id, ts_ns, run_id, actor, action, type, details)"

Insert = tuple[str, str, list[tuple[Any, ...]]]  # table (columns), conflict clause, rows


def _statement(
    main: Insert,
    *ctes: Insert,
    fence: tuple[str, int] | None = None,
    release: int | None = None,
) -> tuple[str, list[Any]]:
    """Several multi-row inserts as one SQL statement (the others as data-modifying CTEs
    of the `main` one): one round trip, committed atomically. With `fence` (a thread and
    the lock epoch of the run writing), every insert is a CTE and the statement fails
    as a whole unless the epoch still holds (`criogen_fence`). With `release` too (the
    thread's session lock key; the statement must run on the session holding it), the
    statement gives the lock back once every insert is done, so a failed insert leaves
    it held; a process taking the lock in between finds the thread's write lock still
    held by this statement's fence until it commits, so it sees the thread busy.

    Placeholders are PostgreSQL's own (`$1`...), for `execute_raw`."""
    params: list[Any] = []

    def slots(values: Sequence[Any]) -> str:
        start = len(params) + 1
        params.extend(values)
        return ", ".join(f"${i}" for i in range(start, len(params) + 1))

    def insert(part: Insert) -> str:
        table, conflict, rows = part
        values = ", ".join(f"({slots(r)})" for r in rows)
        returning = " RETURNING 1" if release is not None else ""
        return f"INSERT INTO {table} VALUES {values} {conflict}{returning}"

    if fence is not None:
        withs = [
            f"f AS (SELECT criogen_fence({slots((fence[0], fence[1], write_key(fence[0])))}) AS ok)"
        ]
        names = []
        for i, part in enumerate((main, *ctes)):
            if part[2]:
                withs.append(f"c{i} AS ({insert(part)})")
                names.append(f"c{i}")
        if release is None:
            return f"WITH {', '.join(withs)} SELECT ok FROM f", params
        # Reading every insert's rows before the projection makes the unlock run
        # only after all of them succeeded.
        joins = "".join(f", (SELECT count(*) FROM {n}) AS n{n}" for n in names)
        return (
            f"WITH {', '.join(withs)} SELECT ok, pg_advisory_unlock({slots((release,))}) "
            f"AS released FROM f{joins}",
            params,
        )
    withs = [f"c{i} AS ({insert(part)})" for i, part in enumerate(ctes) if part[2]]
    body = insert(main)
    return (f"WITH {', '.join(withs)} {body}" if withs else body), params


#: The statement texts of ours each connection has prepared (psycopg keeps the prepared
#: statements of a connection, up to `prepared_max`, 100 by default).
_PREPARED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
#: When a connection's set grows past this it starts afresh (psycopg may have let some go).
_PREPARED_MAX = 50


async def execute_raw(conn: Any, sql: str, params: Sequence[Any]) -> Any:
    """Run `sql` (with `$n` placeholders) on `conn` and return its cursor.

    Our writes are statements whose text changes with their number of rows. Through a raw
    cursor psycopg does not parse them on the client (it caches that only for short ones
    with few parameters). They are prepared, so the server plans each text once per
    connection (planning our insert statements every time cost about 1.5 ms of server
    time per send), and the first time a connection meets a text the preparation goes
    in one pipeline with the execution: without it psycopg would wait for the
    preparation, a round trip of its own."""
    import psycopg

    cur = psycopg.AsyncRawCursor(conn)
    seen = _PREPARED.get(conn)
    if seen is None:
        seen = _PREPARED[conn] = set()
    if sql in seen:
        await cur.execute(sql, params, prepare=True, binary=True)
        return cur
    async with conn.pipeline():
        await cur.execute(sql, params, prepare=True, binary=True)
    if len(seen) >= _PREPARED_MAX:
        seen.clear()
    seen.add(sql)
    return cur


def _delete_statement(thread_id: str, *, audit: bool, epoch: int | None) -> tuple[str, list[Any]]:
    """One statement deleting a thread's checkpoints, blobs, writes and lock epoch (and
    with `audit` its audit records), answering `existed` (it had a checkpoint) and
    `audit_deleted`. With `epoch` (the lock the caller holds) it fails as a whole unless
    that lock still holds (`criogen_fence`)."""
    withs: list[str] = []
    params: list[Any] = []
    if epoch is not None:
        withs.append("f AS (SELECT criogen_fence(%s, %s, %s) AS ok)")
        params += [thread_id, epoch, write_key(thread_id)]
    withs.append("c AS (DELETE FROM checkpoints WHERE thread_id = %s RETURNING checkpoint_ns)")
    params.append(thread_id)
    for i, table in enumerate(("checkpoint_blobs", "checkpoint_writes", "criogen_locks")):
        withs.append(f"d{i} AS (DELETE FROM {table} WHERE thread_id = %s)")
        params.append(thread_id)
    if audit:
        withs.append("a AS (DELETE FROM criogen_audit WHERE thread_id = %s RETURNING 1)")
        params.append(thread_id)
    sql = (
        f"WITH {', '.join(withs)} SELECT "
        "(SELECT count(*) FROM c WHERE checkpoint_ns = '') > 0 AS existed, "
        f"{'(SELECT count(*) FROM a)' if audit else '0'} AS audit_deleted"
        f"{' FROM f' if epoch is not None else ''}"
    )
    return sql, params


def lock_lost(thread_id: str) -> StorageError:
    """The error of a run whose lock on the thread is gone."""
    return StorageError(
        f"the lock on thread {thread_id!r} was lost: PostgreSQL ended the session that held "
        "it, so another process may be running the thread; this run stopped before writing "
        "anything more, and retry() continues it from what was saved",
        code="lock_lost",
    )


def _saver_class() -> type[Any]:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    class _Saver(SaverMixin, AsyncPostgresSaver):
        """`AsyncPostgresSaver` whose writes are one statement each (rows, blobs and audit
        rows together: one round trip, atomic) on their own pooled connection, with no
        saver-wide lock and no thread hop. A run's checkpoints that nothing with side
        effects follows wait for its next write, and its last write goes with the
        release of its lock (`PostgresBackend.flush_deferred`): a send whose model calls
        one tool makes four round trips (lock and head, the tool call, its result, the
        answer and the release)."""

        url: str = ""
        #: `await fence(thread_id)` before a write of a run: the epoch of the lock the run
        #: holds on the thread (None: not locked here), or `StorageError("lock_lost")`
        #: when its session is seen to be gone (`PostgresBackend._check_lock`).
        fence: Any = None
        #: Heads read with the lock that guards them (`PostgresBackend._take`), by
        #: thread: `(the task holding the lock, the head's row or None)`, served to that
        #: task until the thread is written or let go, each time as a tuple of its own
        #: (LangGraph changes the checkpoint it is handed).
        prefetched: dict[str, tuple[Any, Any]]
        #: Task results of runs whose lock was lost, by thread (`keep_lost`).
        lost: dict[str, list[tuple[Any, ...]]]

        async def _write(self, parts: Sequence[Insert], thread_id: str | None) -> None:
            """Save `parts` in one statement; a run's writes only while its lock holds."""
            if thread_id is not None:
                self.prefetched.pop(thread_id, None)
            try:
                epoch = await self.fence(thread_id) if thread_id is not None else None
            except StorageError as exc:
                if exc.code == "lock_lost" and thread_id is not None:
                    self.keep_lost(str(thread_id), parts)
                raise
            if thread_id is None or epoch is None:
                sql, params = _statement(*parts)
                await self._execute(sql, params)
                return
            import psycopg

            sql, params = _statement(*parts, fence=(thread_id, epoch))
            try:
                await self._execute(sql, params)
            except psycopg.Error as exc:
                if exc.sqlstate == _FENCE_LOST:
                    self.keep_lost(str(thread_id), parts)
                    raise lock_lost(str(thread_id)) from None
                raise

        def keep_lost(self, thread_id: str, parts: Sequence[Insert]) -> None:
            """Keep the task results among `parts`, refused because the run's lock was
            lost: a finished tool's result is saved when this process takes the
            thread's lock again and the thread still stands where the run left it
            (`PostgresBackend.restore_lost`), so a continuation does not run it again."""
            rows = [
                r
                for table, _, rs in parts
                if table == _WRITES
                for r in rs
                if not r[1] and r[6] not in (ERROR_CHANNEL, INTERRUPT_CHANNEL)
            ]
            if rows:
                self.lost.setdefault(thread_id, []).extend(rows)

        async def write_held(self, seg: Segment, parts: list[Any]) -> None:
            await self._write(parts, seg.thread_id)

        async def _retrying(self, fn: Any, *, retry: Any = None) -> Any:
            """`await fn(connection)` on a pooled connection; one that broke (it idled out
            behind a proxy, or the server restarted) is retried once on a fresh one, after
            dropping every pooled connection the server closed. Statements here are
            idempotent (upserts, reads), unless `retry()` says otherwise when one broke. A
            second failure is `StorageError("unreachable")`. A statement that failed on a
            sound connection is no broken connection: `StorageError("database_error")`
            at once (the fence's own error is raised as it is, for `_write`)."""
            import psycopg

            pool: Any = self.conn
            for attempt in (1, 2):
                try:
                    async with pool.connection() as conn:
                        try:
                            return await fn(conn)
                        except psycopg.Error as exc:
                            if exc.sqlstate == _FENCE_LOST:
                                raise
                            if not connection_lost(exc, conn):
                                raise statement_failed(exc) from exc
                            raise
                except psycopg.Error as exc:
                    if exc.sqlstate == _FENCE_LOST:
                        raise
                    if attempt == 2 or (retry is not None and not retry()):
                        raise unreachable(self.url, exc) from exc
                    with contextlib.suppress(Exception):
                        await pool.check()
            raise AssertionError("unreachable")

        async def _execute(self, sql: str, params: list[Any]) -> None:
            async def run(conn: Any) -> None:
                await execute_raw(conn, sql, params)

            await self._retrying(run)

        async def alist(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            with mapped(self.url):
                async for item in super().alist(*args, **kwargs):
                    yield item

        async def adelete_thread(self, thread_id: str) -> None:
            """Delete the thread's checkpoints, writes, blobs and lock epoch (so a stale
            run of it can write nothing more) in one statement: all or nothing."""
            thread_id = check_thread_id(str(thread_id))
            self.prefetched.pop(thread_id, None)
            self.transcripts.forget(thread_id)
            sql, params = _delete_statement(thread_id, audit=False, epoch=None)

            async def run(conn: Any) -> None:
                # `%s` placeholders: psycopg's own cursor, not `execute_raw`'s `$n` one.
                await conn.execute(sql, params)

            await self._retrying(run)

        async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
            """LangGraph's prune, with the caches of those threads dropped first;
            `"delete"` deletes each thread as `adelete_thread` does (its lock epoch
            too, so a stale run of it can write nothing more)."""
            if isinstance(thread_ids, str):
                raise TypeError("thread_ids must be a sequence of thread IDs, not a str")
            ids = [check_thread_id(str(t)) for t in thread_ids]
            for thread_id in ids:
                self.prefetched.pop(thread_id, None)
                self.transcripts.forget(thread_id)
            if strategy == "delete":
                for thread_id in ids:
                    await self.adelete_thread(thread_id)
                return
            with mapped(self.url):
                await super().aprune(ids, strategy=strategy)

        async def aget_delta_channel_history(self, *, config: Any, channels: Any) -> Any:
            with mapped(self.url):
                return await super().aget_delta_channel_history(config=config, channels=channels)

        async def aput(
            self,
            config: RunnableConfig,
            checkpoint: Checkpoint,
            metadata: CheckpointMetadata,
            new_versions: ChannelVersions,
        ) -> RunnableConfig:
            from langgraph.checkpoint.base import get_serializable_checkpoint_metadata
            from psycopg.types.json import Jsonb

            configurable = config["configurable"]
            thread_id = configurable["thread_id"]
            checkpoint_ns = configurable["checkpoint_ns"]
            metadata = segment_metadata(str(thread_id), metadata)
            parent_id = configurable.get("checkpoint_id")
            copy = checkpoint.copy()
            copy["channel_values"] = copy["channel_values"].copy()
            next_config = checkpoint_config(thread_id, checkpoint_ns, checkpoint["id"])
            blob_values = {}
            for k, v in checkpoint["channel_values"].items():
                if isinstance(v, _DeltaSnapshot):
                    blob_values[k] = copy["channel_values"].pop(k)
                    copy["channel_values"][k] = True
                elif v is None or isinstance(v, str | int | float | bool):
                    pass
                else:
                    blob_values[k] = copy["channel_values"].pop(k)
            blob_versions = {k: v for k, v in new_versions.items() if k in blob_values}
            blobs = self._dump_blobs(thread_id, checkpoint_ns, blob_values, blob_versions)
            seg = segment_for(str(thread_id))
            audit = self.audit_rows(records_for_put(seg, dict(next_config), metadata))
            meta = Jsonb(get_serializable_checkpoint_metadata(config, metadata))
            row = (thread_id, checkpoint_ns, checkpoint["id"], parent_id, Jsonb(copy), meta)
            parts: list[Insert] = [
                (_CHECKPOINTS, _CHECKPOINTS_CONFLICT, [row]),
                (_BLOBS, _BLOBS_CONFLICT, blobs),
                (_AUDIT, "", audit),
            ]
            if seg is not None and not checkpoint_ns:
                if may_wait(checkpoint, metadata):
                    # The checkpoint of a new input is followed at once by the one that
                    # applies it; a checkpoint whose next step is a model call (or none)
                    # is followed by nothing with side effects: each goes in with the
                    # next write the run must make (the one before a tool runs, a tool's
                    # result), or with the run's last write, which also lets the lock go.
                    self.hold_back(seg, parts)
                    return next_config
                # The writes of this step's task go in with the checkpoint that closes it.
                await self.behind(seg)
                parts.extend(seg.deferred)
                seg.deferred = []
            await self._write(parts, seg.thread_id if seg is not None else None)
            return next_config

        async def aput_writes(
            self,
            config: RunnableConfig,
            writes: Sequence[tuple[str, Any]],
            task_id: str,
            task_path: str = "",
        ) -> None:
            if not writes:
                return
            writes = redacted_errors(writes)
            conflict = (
                _WRITES_UPSERT if all(w[0] in WRITES_IDX_MAP for w in writes) else _WRITES_IGNORE
            )
            configurable = config["configurable"]
            rows = self._dump_writes(
                configurable["thread_id"],
                configurable["checkpoint_ns"],
                configurable["checkpoint_id"],
                task_id,
                task_path,
                writes,
            )
            seg = segment_for(str(configurable["thread_id"]))
            with writing(seg, task_id) as ok:
                if not ok:
                    return
                audit = self.audit_rows(records_for_writes(seg, writes))
                parts: list[Insert] = [(_WRITES, conflict, list(rows)), (_AUDIT, "", audit)]
                top = not configurable["checkpoint_ns"]
                if seg is not None and top and writes_may_wait(configurable, task_id, task_path):
                    self.hold_back(seg, parts)
                    return
                await self.behind(seg)
                await self._write(parts, seg.thread_id if seg is not None else None)

        async def flush_deferred(self, seg: Segment) -> None:
            """Save the writes held back for `seg` whose checkpoint never came (the run
            stopped in between)."""
            await self.behind(seg)
            parts = [p for p in seg.deferred if p[2]]
            seg.deferred = []
            if parts:
                await self._write(parts, seg.thread_id)

        async def aget_tuple(self, config: RunnableConfig) -> Any:
            hit, head = cached_head(config)
            if hit:
                return head
            from langgraph.checkpoint.base import get_checkpoint_id

            configurable = config["configurable"]
            # (LangGraph reads a thread's head before it writes anything to it.)
            thread_id = check_thread_id(str(configurable["thread_id"]))
            checkpoint_id = get_checkpoint_id(config)
            checkpoint_ns = configurable.get("checkpoint_ns", "")
            if not checkpoint_id and not checkpoint_ns:
                held = self.prefetched.get(thread_id)
                if held is not None and held[0] is asyncio.current_task():
                    return None if held[1] is None else self.head_tuple(copy.deepcopy(held[1]))
            if checkpoint_id:
                args: tuple[Any, ...] = (thread_id, checkpoint_ns, checkpoint_id)
                where = "WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s"
            else:
                args = (thread_id, checkpoint_ns)
                where = (
                    "WHERE thread_id = %s AND checkpoint_ns = %s "
                    "ORDER BY checkpoint_id DESC LIMIT 1"
                )
            from psycopg.rows import dict_row

            async def read(conn: Any) -> Any:
                async with conn.cursor(binary=True, row_factory=dict_row) as cur:
                    await cur.execute(self.SELECT_SQL + where, args, binary=True)
                    return await cur.fetchone()

            value = await self._retrying(read)
            if value is None:
                return None
            if value["checkpoint"]["v"] < 4 and value["parent_checkpoint_id"]:
                # Old-format checkpoints: the parent class knows how to migrate them.
                return await super().aget_tuple(config)
            return self.head_tuple(value)

        def head_sql(self) -> str:
            """The statement reading a thread's head (params: thread id, namespace)."""
            return (
                self.SELECT_SQL + "WHERE thread_id = %s AND checkpoint_ns = %s "
                "ORDER BY checkpoint_id DESC LIMIT 1"
            )

        def head_tuple(self, value: Any) -> Any:
            """The `CheckpointTuple` of a row read with `SELECT_SQL` (a current-format
            checkpoint: `value["checkpoint"]["v"] >= 4`, or one without a parent)."""
            checkpoint: Any = {
                **value["checkpoint"],
                "channel_values": {
                    **(value["checkpoint"].get("channel_values") or {}),
                    **self._load_blobs(value["channel_values"]),
                },
            }
            return checkpoint_tuple(
                value["thread_id"],
                value["checkpoint_ns"],
                value["checkpoint_id"],
                value["parent_checkpoint_id"],
                checkpoint,
                value["metadata"],
                self._load_writes(value["pending_writes"]),
            )

    return _Saver


class PostgresBackend(Backend):
    def __init__(
        self,
        url: str,
        serde: SerializerProtocol | None,
        *,
        max_connections: int = 10,
        connect_timeout_secs: float = 10,
    ) -> None:
        if url.startswith("postgres://"):
            url = "postgresql://" + url[len("postgres://") :]
        self.url = url
        # libpq's `connect_timeout` in the URL also bounds the wait for a pooled
        # connection, so a server that is down fails a call in that time.
        from urllib.parse import parse_qs, urlsplit

        given = parse_qs(urlsplit(url).query).get("connect_timeout")
        if given:
            try:
                connect_timeout_secs = max(1.0, float(given[-1]))
            except ValueError:
                pass  # libpq reports it when connecting
        self._serde = serde
        self._max = max_connections
        self._connect_timeout = connect_timeout_secs
        self._pool: Any = None
        self._lock_conn: Any = None
        self._lock_guard = asyncio.Lock()
        #: The encryption claim, when opening read one (see `_read_meta`).
        self._claim: bytes | None = None
        #: The connection each lock this process holds was taken on (the lock lives and
        #: dies with that session) and the lock's epoch (see `criogen_fence`).
        self._held: dict[str, tuple[Any, int]] = {}

    def _unreachable(self, exc: BaseException) -> StorageError:
        return unreachable(self.url, exc)

    async def _connect(self) -> Any:
        import psycopg
        from psycopg.rows import dict_row

        try:
            return await psycopg.AsyncConnection.connect(
                self.url,
                autocommit=True,
                prepare_threshold=0,
                row_factory=dict_row,
                connect_timeout=max(1, int(self._connect_timeout)),
            )
        except psycopg.Error as exc:
            raise self._unreachable(exc) from None

    async def open(self) -> None:
        try:
            import_once("psycopg", "psycopg_pool", "langgraph.checkpoint.postgres.aio")
            from psycopg.rows import dict_row
            from psycopg_pool import AsyncConnectionPool
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise StorageError(
                "PostgreSQL storage needs psycopg: pip install -e '.[postgres]' in the "
                "criogen_graph checkout",
                code="missing_dependency",
            ) from exc
        # One dedicated connection holds this process's advisory locks; it also proves the
        # server is reachable, with its own error message. It reads whether the tables
        # are set up (one round trip) while the pool opens its first connection.
        pool = AsyncConnectionPool(
            self.url,
            min_size=1,
            max_size=self._max,
            open=False,
            timeout=self._connect_timeout,
            max_idle=300,
            max_lifetime=1800,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        )
        opening = asyncio.ensure_future(pool.open(wait=True, timeout=self._connect_timeout))
        try:
            self._lock_conn = await self._connect()
            current = await self._read_meta(self._lock_conn)
            await opening
        except BaseException as exc:
            opening.cancel()
            with contextlib.suppress(BaseException):
                await opening
            await pool.close()
            if self._lock_conn is not None:
                await self._lock_conn.close()
                self._lock_conn = None
            if isinstance(exc, StorageError) or not isinstance(exc, Exception):
                raise
            raise self._unreachable(exc) from None
        self._pool = pool
        saver = _saver_class()(pool, serde=self._serde)
        saver.transcripts = TranscriptCache()
        saver.url = self.url
        saver.prefetched = {}
        saver.lost = {}
        version = schema_version(len(saver.MIGRATIONS))

        async def migrate() -> None:
            await saver.setup()
            async with pool.connection() as conn:
                for stmt in _SCHEMA:
                    await conn.execute(stmt)
                await conn.execute(
                    "INSERT INTO criogen_meta (key, value) VALUES (%s, %s) "
                    "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                    (SCHEMA_KEY, version),
                )

        if not current:
            try:
                await self._set_up("tables", migrate)
            except BaseException:
                await self.close()
                raise
        saver.fence = self._check_lock
        self.saver = saver
        self.try_lock = self._try_lock
        self.unlock = self._unlock

    async def open_store(self) -> Any:
        if self.store is None:
            import_once("langgraph.store.postgres.aio")
            from langgraph.store.postgres.aio import AsyncPostgresStore

            store = AsyncPostgresStore(self._pool)
            await self._set_up("memory and collections tables", store.setup)
            self.store = store
        return self.store

    async def _read_meta(self, conn: Any) -> bool:
        """Whether this database's tables are the ones this version sets up (then opening
        checks nothing more, and takes no setup lock), read with the encryption claim
        (kept for `claim_encryption`) in one statement."""
        import psycopg

        saver_class = _saver_class()
        try:
            cur = await conn.execute(
                "SELECT key, value FROM criogen_meta WHERE key = ANY(%s)",
                ([SCHEMA_KEY, ENCRYPTION_CLAIM],),
                prepare=False,  # (preparing first would cost a round trip of its own)
            )
            rows = {r["key"]: bytes(r["value"]) for r in await cur.fetchall()}
        except psycopg.errors.UndefinedTable:
            return False  # a new database (autocommit: the session is fine)
        except psycopg.Error as exc:
            if connection_lost(exc, conn):
                raise self._unreachable(exc) from None
            raise statement_failed(exc) from exc
        self._claim = rows.get(ENCRYPTION_CLAIM)
        return rows.get(SCHEMA_KEY) == schema_version(len(saver_class.MIGRATIONS))

    async def _set_up(self, what: str, migrate: Callable[[], Awaitable[None]]) -> None:
        """Run `migrate` (creating or migrating tables) while no other process does, within
        `SETUP_WAIT_SECS`, else `StorageError(code="setup_timeout")`.

        The setup lock is polled, not waited for in a statement: a statement blocked on
        it is an open transaction, which LangGraph's `CREATE INDEX CONCURRENTLY` (run by
        the holder) waits for, so two processes starting together on a new database
        would wait for each other forever."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETUP_WAIT_SECS
        delay = 0.005
        while True:
            async with self._lock_guard:
                conn = await self._lock_connection()
                with mapped(self.url):
                    cur = await conn.execute(
                        f"SELECT pg_try_advisory_lock({_SETUP_LOCK}) AS ok", (_SETUP_CLASS,)
                    )
                    row = await cur.fetchone()
            if row and row["ok"]:
                break
            left = deadline - loop.time()
            if left <= 0:
                raise setup_timeout(what, "another process is setting up this database")
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 1.5, 0.2)
        try:
            with mapped(self.url):
                async with asyncio.timeout_at(deadline):
                    await migrate()
        except TimeoutError:
            raise setup_timeout(
                what,
                "the migrations did not finish (CREATE INDEX CONCURRENTLY waits for every "
                "open transaction: is a session idle in a transaction?)",
            ) from None
        finally:
            await uncancelled(self._unlock_setup(conn))

    async def _unlock_setup(self, conn: Any) -> None:
        async with self._lock_guard:
            if conn is self._lock_conn and not (conn.closed or conn.broken):
                with contextlib.suppress(Exception):  # a lost session took the lock with it
                    await conn.execute(f"SELECT pg_advisory_unlock({_SETUP_LOCK})", (_SETUP_CLASS,))

    async def _lock_connection(self) -> Any:
        conn = self._lock_conn
        if conn is None or conn.closed or conn.broken:
            # The old connection took its locks with it; a fresh one holds new ones.
            conn = self._lock_conn = await self._connect()
        return conn

    async def _try_lock(self, thread_id: str) -> bool:
        """Take the thread's lock (see `_TRY_LOCK`): all or nothing, even if the caller is
        cancelled while the statement is in flight (cancelling it half way would leave
        the session holding a lock nobody counts: the thread busy for every other
        process until this one closes its storage)."""
        check_thread_id(thread_id)
        take = asyncio.ensure_future(self._take(thread_id, asyncio.current_task()))
        cancelled = False
        while not take.done():
            try:
                await asyncio.wait((take,))
            except asyncio.CancelledError:
                cancelled = True
        if cancelled:
            # (Also when the statement had just finished: its answer is not lost.)
            if not take.cancelled() and take.exception() is None and take.result():
                await uncancelled(self._give_back(thread_id))
            raise asyncio.CancelledError
        taken = bool(take.result())
        if taken and thread_id in cast(Any, self.saver).lost:
            try:
                await self.restore_lost(thread_id)
            except BaseException:
                await uncancelled(self._give_back(thread_id))
                raise
        return taken

    async def restore_lost(self, thread_id: str) -> None:
        """Save the task results a run of this process finished after its lock was lost
        (`keep_lost`), now that the lock is held again: those of the checkpoint the
        thread still stands on (nobody moved it on meanwhile). The continuation then
        finds them saved and does not run those tools again."""
        saver = cast(Any, self.saver)
        rows = saver.lost.pop(thread_id, [])
        found = saver.prefetched.get(thread_id)
        value = found[1] if found is not None else None
        if value is None:
            graph_head = await saver.aget_tuple(
                {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
            )
            head = graph_head.config["configurable"]["checkpoint_id"] if graph_head else None
        else:
            head = value["checkpoint"]["id"]
        keep = [r for r in rows if r[2] == head]
        if keep:
            await saver._write([(_WRITES, _WRITES_IGNORE, keep)], thread_id)

    async def _take(self, thread_id: str, holder: Any) -> bool:
        """Take the lock and read the thread's head in one round trip (a pipeline: the
        head is read by a statement after the one taking the lock, so with a snapshot
        that sees every write of the previous holder), for `holder` (the task that will
        hold the lock) to read instead of asking the database again."""
        import psycopg

        key = lock_key(thread_id)
        saver = cast(Any, self.saver)
        async with self._lock_guard:
            for attempt in (1, 2):
                conn = await self._lock_connection()
                try:
                    async with conn.pipeline():
                        cur = await conn.execute(
                            _TRY_LOCK, (key, write_key(thread_id), key, thread_id)
                        )
                        head = conn.cursor(binary=True)
                        await head.execute(saver.head_sql(), (thread_id, ""), binary=True)
                    # (Fetched after the pipeline ends: a fetch inside it would sync once
                    # more, a second round trip.)
                    row = await cur.fetchone()
                    value = await head.fetchone()
                except psycopg.Error as exc:
                    if not connection_lost(exc, conn):
                        # The statement failed, not the session: it keeps every other
                        # lock. A session lock the statement took stays taken even
                        # though the statement rolled back: give it back.
                        with contextlib.suppress(psycopg.Error):
                            await conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
                        raise statement_failed(exc) from exc
                    # The server ended the session (a restart, an idle timeout): its
                    # locks went with it, and a new one takes this lock.
                    with contextlib.suppress(Exception):
                        await conn.close()
                    if attempt == 2:
                        raise self._unreachable(exc) from exc
                    continue
                if row and row["ok"]:
                    self._held[thread_id] = (conn, row["epoch"])
                    if value is None or (
                        value["checkpoint"]["v"] >= 4 or not value["parent_checkpoint_id"]
                    ):
                        saver.prefetched[thread_id] = (holder, value)
                    return True
                return False
            raise AssertionError("unreachable")

    async def _check_lock(self, thread_id: str) -> int | None:
        """The epoch of this process's lock on the thread, for the write about to be made
        (None: not locked here, as on LangGraph's server). Raises
        `StorageError(code="lock_lost")` at once if the session holding the lock is seen
        to be gone (closed, broken, or a message the server left on its socket when it
        ended it); otherwise the write's own fence finds out (`criogen_fence`)."""
        held = self._held.get(thread_id)
        if held is None:
            return None
        conn, epoch = held
        if not (conn.closed or conn.broken):
            try:
                readable = select.select([conn.pgconn.socket], [], [], 0)[0]
            except (OSError, ValueError):  # pragma: no cover - a closed socket
                readable = [True]
            if not readable or self._lock_guard.locked():
                # (Locked: the session's runs share it, and what waits on the socket is
                # likely the answer to another run's statement in flight; the fence
                # decides, without a round trip more.)
                return int(epoch)
            if await uncancelled(self._alive(conn)):
                return int(epoch)  # only a notice: the session is alive
        raise lock_lost(thread_id)

    async def _alive(self, conn: Any) -> bool:
        """Whether the lock session `conn` still answers (run to its end: a statement of
        the lock session cut off half way may cost the session, and every lock in it)."""
        import psycopg

        try:
            async with self._lock_guard:
                await conn.execute("SELECT 1")
        except psycopg.Error as exc:
            return not connection_lost(exc, conn)
        return True

    async def _unlock(self, thread_id: str) -> None:
        """Give the thread's lock back, to the end even if the caller is cancelled
        meanwhile (then the cancellation is raised after)."""
        await uncancelled(self._give_back(thread_id))

    async def _give_back(self, thread_id: str) -> None:
        cast(Any, self.saver).prefetched.pop(thread_id, None)
        async with self._lock_guard:
            held = self._held.pop(thread_id, None)
            conn = self._lock_conn
            if conn is None or conn.closed or conn.broken or held is None or held[0] is not conn:
                return  # gone with its connection
            with contextlib.suppress(Exception):  # a lost connection took the lock with it
                await conn.execute("SELECT pg_advisory_unlock(%s)", (lock_key(thread_id),))

    async def close(self) -> None:
        self.drop_store()
        if self._pool is not None:
            pool, self._pool = self._pool, None
            idle = pool_idle_connections(pool)
            try:
                await pool.close()
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise
                # The pool's own tasks were cancelled before (an event loop that ends
                # cancels every task, then closes the backends): the pool gave up
                # waiting for them without closing its idle connections.
                for conn in idle:
                    with contextlib.suppress(Exception):
                        await conn.close()
        if self._lock_conn is not None:
            conn, self._lock_conn = self._lock_conn, None
            await conn.close()

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Any]:
        with mapped(self.url):
            async with self._pool.connection() as conn:
                yield conn

    async def flush_deferred(self, seg: Segment) -> None:
        """At the end of a run that went well (its segment not settled) and holds its
        lock here, the writes held back go in one statement with the release of the
        lock, on the session holding it: the run's last round trip. Otherwise (a run
        that stopped: its failure is recorded under the lock, after) they are saved
        as any write."""
        saver = cast(Any, self.saver)
        await saver.behind(seg)
        held = self._held.get(seg.thread_id)
        if seg.closed or held is None:
            await saver.flush_deferred(seg)
            return
        parts = [p for p in seg.deferred if p[2]]
        if seg.audit:
            parts.append((_AUDIT, "", saver.audit_rows(seg.audit)))
        seg.deferred = []
        seg.audit = []
        if parts:
            await self._write_and_release(seg.thread_id, parts)

    async def _write_and_release(self, thread_id: str, parts: list[Insert]) -> None:
        """Save `parts` (fenced) and give the thread's lock back, in one statement on
        the lock's session. If it fails, nothing was saved and the lock is still held."""
        saver = cast(Any, self.saver)
        saver.prefetched.pop(thread_id, None)
        try:
            epoch = await self._check_lock(thread_id)
            if epoch is None:  # pragma: no cover - flush_deferred checked it is held here
                await saver._write(parts, thread_id)
                return
            await self._release_with(thread_id, epoch, parts)
        except StorageError as exc:
            if exc.code == "lock_lost":
                saver.keep_lost(thread_id, parts)
            raise

    async def _release_with(self, thread_id: str, epoch: int, parts: list[Insert]) -> None:
        import psycopg

        sql, params = _statement(*parts, fence=(thread_id, epoch), release=lock_key(thread_id))
        async with self._lock_guard:
            held = self._held.get(thread_id)
            conn = self._lock_conn
            if held is None or conn is None or held[0] is not conn or conn.closed or conn.broken:
                raise lock_lost(thread_id)
            try:
                await execute_raw(conn, sql, params)
            except psycopg.Error as exc:
                if exc.sqlstate == _FENCE_LOST:
                    raise lock_lost(thread_id) from None
                if connection_lost(exc, conn):
                    with contextlib.suppress(Exception):
                        await conn.close()
                    raise lock_lost(thread_id) from None
                raise statement_failed(exc) from exc
            # Given back: the unlock that follows has nothing left to do.
            self._held.pop(thread_id, None)

    async def write_audit(self, records: list[dict[str, Any]]) -> None:
        rows = cast(Any, self.saver).audit_rows(records)
        async with self._connection() as conn, conn.cursor() as cur:
            await cur.executemany(_INSERT_AUDIT, rows)

    async def read_audit(self, thread_id: str | None, limit: int | None) -> list[dict[str, Any]]:
        sql, params = audit_query(thread_id, limit, "%s")
        async with self._connection() as conn, conn.cursor() as cur:
            await cur.execute(sql, params)
            rows = await cur.fetchall()
        keys = ("id", "thread_id", "ts_ns", "run_id", "actor", "action", "type", "details")
        saver = cast(Any, self.saver)
        return [saver.audit_record([r[k] for k in keys]) for r in reversed(rows)]

    async def delete_audit(self, thread_id: str) -> int:
        async with self._connection() as conn:
            cur = await conn.execute("DELETE FROM criogen_audit WHERE thread_id = %s", (thread_id,))
            return int(cur.rowcount)

    async def delete_thread(self, thread_id: str, make_record: MakeRecord, *, audit: bool) -> bool:
        """One transaction: the thread's rows go (fenced by the lock the caller holds, so
        a caller whose lock was taken over deletes nothing) and the record is saved."""
        import psycopg

        saver = cast(Any, self.saver)
        saver.prefetched.pop(thread_id, None)
        epoch = await self._check_lock(thread_id)
        sql, params = _delete_statement(thread_id, audit=audit, epoch=epoch)
        committing = False

        async def run(conn: Any) -> bool:
            nonlocal committing
            async with conn.transaction():
                try:
                    cur = await conn.execute(sql, params)
                except psycopg.Error as exc:
                    if exc.sqlstate == _FENCE_LOST:
                        raise lock_lost(thread_id) from None
                    raise
                row = await cur.fetchone()
                existed = bool(row["existed"])
                rows = saver.audit_rows([make_record(existed, int(row["audit_deleted"]))])
                await conn.execute(_INSERT_AUDIT, rows[0])
                # A connection lost from here on may have committed: not tried again
                # (that would record a second deletion).
                committing = True
            return existed

        existed: bool = await saver._retrying(run, retry=lambda: not committing)
        saver.transcripts.forget(thread_id)
        return existed

    async def thread_ids(self) -> list[str]:
        async with self._connection() as conn:
            cur = await conn.execute(
                "SELECT DISTINCT thread_id FROM checkpoints WHERE checkpoint_ns = '' "
                "ORDER BY thread_id"
            )
            return [r["thread_id"] for r in await cur.fetchall()]

    async def claim_encryption(self, claim: bytes) -> bytes | None:
        async def read(conn: Any, key: str) -> bytes | None:
            cur = await conn.execute("SELECT value FROM criogen_meta WHERE key = %s", (key,))
            row = await cur.fetchone()
            return bytes(row["value"]) if row else None

        async def has_data(conn: Any) -> bool:
            tables = ["checkpoints", "checkpoint_writes", "criogen_audit"]
            cur = await conn.execute("SELECT to_regclass('store') IS NOT NULL AS found")
            if (await cur.fetchone())["found"]:
                tables.append("store")
            query = " OR ".join(f"EXISTS (SELECT 1 FROM {t})" for t in tables)
            cur = await conn.execute(f"SELECT {query} AS found")
            return bool((await cur.fetchone())["found"])

        if self._claim is not None:  # read on opening (a claim, once recorded, never changes)
            return self._claim
        async with self._connection() as conn:
            found = await read(conn, ENCRYPTION_CLAIM)
            if found is not None:
                return found
            async with conn.transaction():
                legacy = await read(conn, LEGACY_KEY_CHECK)
                data = legacy is None and await has_data(conn)
                value, record = adopt_claim(None, legacy, claim, data)
                if not record or value is None:
                    return value
                cur = await conn.execute(
                    "INSERT INTO criogen_meta (key, value) VALUES (%s, %s) "
                    "ON CONFLICT (key) DO NOTHING RETURNING value",
                    (ENCRYPTION_CLAIM, value),
                )
                if await cur.fetchone() is None:
                    # Another opener's claim came first (this insert waited for it to
                    # commit); a new statement sees it.
                    return await read(conn, ENCRYPTION_CLAIM)
                if value != UNENCRYPTED:
                    await conn.execute(
                        "INSERT INTO criogen_meta (key, value) VALUES (%s, %s) "
                        "ON CONFLICT (key) DO NOTHING",
                        (LEGACY_KEY_CHECK, value),
                    )
                return value

    def abandon(self) -> None:
        # Its event loop is closed: the pool's tasks can never run again. Their coroutines
        # are closed here (left to the garbage collector, each would raise "Event loop
        # is closed" from a finalizer), and the sockets too.
        pool = self._pool
        conns = [self._lock_conn, *pool_idle_connections(pool)]
        tasks = pool_tasks(pool)
        self._lock_conn = self._pool = None
        self.store = None
        for task in tasks:
            if task is not None and not task.done():
                with contextlib.suppress(BaseException):
                    task.get_coro().close()
        for conn in conns:
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.pgconn.finish()
