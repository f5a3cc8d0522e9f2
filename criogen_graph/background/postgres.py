"""The PostgreSQL queue of background runs: procrastinate's job tables (its own schema
file, applied once) beside the storage's tables, in the storage's schema, and
`criogen_runs`, one record per run (status, attempts, worker, error, result)."""

from __future__ import annotations

import asyncio
import datetime
import logging
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from criogen_graph._aio import cancel_pending, to_the_end, uncancelled
from criogen_graph.background.jobs import (
    CANCELLED,
    FAILED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    BadPayload,
    RunInfo,
    UnknownAgent,
    error_fields,
    execute,
    read_payload,
    result_fields,
)
from criogen_graph.errors import StorageError, ThreadBusyError, ValidationError

if TYPE_CHECKING:
    from criogen_graph.agent import Agent
    from criogen_graph.background import Worker
    from criogen_graph.results import Reply
    from criogen_graph.storage import Storage

log = logging.getLogger("criogen_graph.background")

TASK = "criogen_graph.run"
QUEUE = "criogen"

_RUNS_DDL = """
CREATE TABLE IF NOT EXISTS criogen_runs (
    id text PRIMARY KEY,
    job_id bigint,
    thread_id text NOT NULL,
    agent text NOT NULL,
    action text NOT NULL,
    status text NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    worker text,
    error_code text,
    error_type text,
    error text,
    run_id text,
    checkpoint_id text,
    stop_reason text,
    needs_approval boolean,
    submitted_at timestamptz NOT NULL DEFAULT now(),
    first_started_at timestamptz,
    started_at timestamptz,
    finished_at timestamptz
);
CREATE INDEX IF NOT EXISTS criogen_runs_thread ON criogen_runs (thread_id, submitted_at);
CREATE INDEX IF NOT EXISTS criogen_runs_status ON criogen_runs (status, submitted_at);
"""

_COLUMNS = """id, job_id, thread_id, agent, action, status, attempts, worker, error_code,
    error_type, error, run_id, checkpoint_id, stop_reason, needs_approval,
    (extract(epoch FROM submitted_at) * 1000)::bigint AS submitted_at_ms,
    (extract(epoch FROM started_at) * 1000)::bigint AS started_at_ms,
    (extract(epoch FROM first_started_at) * 1000)::bigint AS first_started_at_ms,
    (extract(epoch FROM finished_at) * 1000)::bigint AS finished_at_ms,
    CASE WHEN status = 'running' THEN (SELECT (extract(epoch FROM now() - w.last_heartbeat)
        * 1000)::bigint FROM procrastinate_jobs j JOIN procrastinate_workers w
        ON w.id = j.worker_id WHERE j.id = criogen_runs.job_id) END AS heartbeat_age_ms"""


def _missing_extra() -> StorageError:
    return StorageError(
        "background runs on PostgreSQL need procrastinate: pip install -e '.[background]' "
        "in the criogen_graph checkout",
        code="missing_extra",
    )


def _info(row: Mapping[str, Any]) -> RunInfo:
    return RunInfo(**{k: row[k] for k in RunInfo.__dataclass_fields__})


def _pool(**kwargs: Any) -> Any:
    """procrastinate's pool, one round trip per statement where it paid three or four:

    - its connections in autocommit (each of procrastinate's statements, and each of
      ours on them, is a single statement, atomic by itself; outside autocommit psycopg
      sent a BEGIN before it and the pool a COMMIT after, a round trip each). Set by
      `configure`: procrastinate opens its LISTEN connection with the pool's arguments
      and `autocommit=True` of its own, so the pool's arguments cannot carry it;
    - a check of each connection it hands out that costs no round trip (procrastinate's,
      `check_connection`, costs one): a connection the server ended is still found and
      replaced (`check_pooled`)."""
    from psycopg_pool import AsyncConnectionPool

    from criogen_graph.storage.postgres import check_pooled

    async def configure(conn: Any) -> None:
        await conn.set_autocommit(True)

    kwargs["check"] = check_pooled
    kwargs["configure"] = configure
    return AsyncConnectionPool(**kwargs)


class PgQueue:
    """One event loop's connection to the queue of one storage."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.app: Any = None

    async def open(self, max_size: int = 4) -> None:
        try:
            import procrastinate
        except ImportError:
            raise _missing_extra() from None
        await _setup(self.storage.url)
        connector = procrastinate.PsycopgConnector(
            conninfo=self.storage.url, min_size=1, max_size=max_size, pool_factory=_pool
        )
        app = procrastinate.App(connector=connector)
        await app.open_async()
        self.app = app

    async def close(self) -> None:
        if self.app is not None:
            await self.app.close_async()
            self.app = None

    async def _one(self, query: Any, **args: Any) -> dict[str, Any] | None:
        rows: list[dict[str, Any]] = await self.app.connector.execute_query_all_async(query, **args)
        return rows[0] if rows else None

    async def submit(self, agent: Agent[Any], payload: dict[str, Any]) -> RunInfo:
        payload = _seal(self.storage, payload)
        job_id = await self.app.configure_task(
            TASK, queue=QUEUE, lock=f"criogen:{payload['thread_id']}"
        ).defer_async(payload=payload)
        # The job first: a submitter that dies here leaves a job whose worker writes the
        # record (nothing is lost); a worker may also have started it already.
        row = await self._one(
            "INSERT INTO criogen_runs (id, job_id, thread_id, agent, action, status)"
            " VALUES (%(id)s, %(job_id)s, %(thread_id)s, %(agent)s, %(action)s, 'queued')"
            " ON CONFLICT (id) DO UPDATE SET job_id = EXCLUDED.job_id"
            f" RETURNING {_COLUMNS}",
            id=payload["id"],
            job_id=job_id,
            thread_id=payload["thread_id"],
            agent=payload["agent"],
            action=payload["action"],
        )
        assert row is not None
        return _info(row)

    async def info(self, run_id: str) -> RunInfo | None:
        row = await self._one(f"SELECT {_COLUMNS} FROM criogen_runs WHERE id = %(id)s", id=run_id)
        return _opened_error(self.storage, _info(row)) if row is not None else None

    async def list(self, *, status: str | None, thread_id: str | None, limit: int) -> list[RunInfo]:
        rows = await self.app.connector.execute_query_all_async(
            f"SELECT {_COLUMNS} FROM criogen_runs"
            " WHERE (%(status)s::text IS NULL OR status = %(status)s)"
            " AND (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s)"
            " ORDER BY submitted_at DESC, id LIMIT %(limit)s",
            status=status,
            thread_id=thread_id,
            limit=limit,
        )
        return [_opened_error(self.storage, _info(r)) for r in rows]

    async def cancel(self, run_id: str) -> bool:
        info = await self.info(run_id)
        if info is None or info.done or info.job_id is None:
            return False
        asked = await self.app.job_manager.cancel_job_by_id_async(info.job_id, abort=True)
        if not asked:
            return False
        # A queued job is cancelled at once (no worker will see it); a running one when
        # its worker gets the abort and saves the run.
        await self.app.connector.execute_query_async(
            "UPDATE criogen_runs SET status = 'cancelled', finished_at = now()"
            " WHERE id = %(id)s AND status = 'queued'"
            " AND EXISTS (SELECT 1 FROM procrastinate_jobs"
            "  WHERE id = %(job_id)s AND status = 'cancelled')",
            id=run_id,
            job_id=info.job_id,
        )
        return True

    async def fail_unstarted(self, run_id: str, *, idle_secs: float, message: str) -> bool:
        """Fail a queued run no worker has been alive to start for `idle_secs` (no
        heartbeat in that time): its job is cancelled while still queued, so it never
        starts, and its record says `no_worker`. False when a worker is alive or the run
        is no longer queued (a worker took it meanwhile)."""
        info = await self.info(run_id)
        if info is None or info.status != "queued" or info.job_id is None:
            return False
        row = await self._one(
            "SELECT EXISTS (SELECT 1 FROM procrastinate_workers WHERE last_heartbeat"
            " > now() - make_interval(secs => %(secs)s)) AS alive",
            secs=idle_secs,
        )
        if row is None or row["alive"]:
            return False
        # Only a job still waiting is cancelled (abort=False): one a worker took runs on.
        if not await self.app.job_manager.cancel_job_by_id_async(info.job_id, abort=False):
            return False
        await self.app.connector.execute_query_async(
            "UPDATE criogen_runs SET status = 'failed', error_code = 'no_worker',"
            " error_type = 'RunFailedError', error = %(error)s, finished_at = now()"
            " WHERE id = %(id)s AND status = 'queued'",
            id=run_id,
            error=message,
        )
        return True

    async def local_reply(self, run_id: str) -> Reply[Any] | None:
        return None

    async def wait(self, run_id: str) -> RunInfo:
        delay = 0.02
        while True:
            info = await self.info(run_id)
            if info is None:
                raise ValidationError(f"no background run {run_id!r}", code="unknown")
            if info.done:
                return info
            await asyncio.sleep(delay)  # polled: a reply needs no connection of its own
            delay = min(delay * 2, 0.25)


#: What a payload carries of the conversation: sealed like the checkpoints when the
#: storage is encrypted, so the job table holds no plaintext the threads do not.
_SECRET_FIELDS = ("input", "state", "message", "decisions", "expected")


def _seal(storage: Storage, payload: dict[str, Any]) -> dict[str, Any]:
    serde = storage.serializer
    if serde is None:
        return payload
    import base64

    secret = {k: payload[k] for k in _SECRET_FIELDS if k in payload}
    kind, data = serde.dumps_typed(secret)
    out = {k: v for k, v in payload.items() if k not in _SECRET_FIELDS}
    out["sealed"] = [kind, base64.b64encode(data).decode("ascii")]
    return out


def _unseal(storage: Storage, raw: Any) -> Any:
    if not isinstance(raw, Mapping) or "sealed" not in raw:
        return raw
    import base64

    serde = storage.serializer
    if serde is None:
        raise BadPayload(
            "the job's payload is encrypted and this worker's storage has no encryption_key: "
            "start the worker with the key of the storage that submitted it"
        )
    try:
        kind, data = raw["sealed"]
        secret = serde.loads_typed((kind, base64.b64decode(data)))
    except Exception as exc:
        raise BadPayload(
            f"the job's payload cannot be decrypted with this worker's encryption_key (is the "
            f"worker pointed at another storage, or given another key?): {exc}"
        ) from None
    if not isinstance(secret, Mapping):
        raise BadPayload("the job's sealed payload is not an object")
    out = {k: v for k, v in raw.items() if k != "sealed"}
    out.update(secret)
    return out


async def _setup(url: str) -> None:
    """procrastinate's schema and `criogen_runs`, once per schema; processes starting
    together take turns (a transaction-level advisory lock per schema)."""
    import psycopg
    from procrastinate.schema import SchemaManager

    async with await psycopg.AsyncConnection.connect(url) as conn:
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtext('criogen_background'),"
            " hashtext(coalesce(current_schema(), '')))"
        )
        cur = await conn.execute("SELECT to_regclass('procrastinate_jobs') IS NOT NULL")
        row = await cur.fetchone()
        if not (row and row[0]):
            await conn.execute(SchemaManager.get_schema())
        await conn.execute(_RUNS_DDL)
        await conn.commit()


_QUEUES: weakref.WeakKeyDictionary[
    Storage, dict[asyncio.AbstractEventLoop, tuple[asyncio.Lock, PgQueue]]
] = weakref.WeakKeyDictionary()


async def pg_queue(storage: Storage) -> PgQueue:
    loop = asyncio.get_running_loop()
    per_loop = _QUEUES.setdefault(storage, {})
    if loop not in per_loop:
        per_loop[loop] = (asyncio.Lock(), PgQueue(storage))
    lock, queue = per_loop[loop]
    async with lock:
        if queue.app is None:
            await queue.open()
    return queue


async def close_pg_queue(storage: Storage) -> None:
    per_loop = _QUEUES.get(storage) or {}
    entry = per_loop.pop(asyncio.get_running_loop(), None)
    if entry is not None:
        await entry[1].close()


# -- the worker ---------------------------------------------------------------------------


async def run_worker(worker: Worker, *, install_signal_handlers: bool = False) -> None:
    try:
        from procrastinate import RetryStrategy
    except ImportError:
        raise _missing_extra() from None

    await worker.storage.open()
    queue = PgQueue(worker.storage)
    await queue.open(max_size=worker.concurrency + 2)
    app = queue.app

    async def run(context: Any, **kwargs: Any) -> None:
        await _run_job(worker, queue, context, kwargs)

    app.task(
        name=TASK,
        pass_context=True,
        # A thread held by someone else (a direct send): try again, never fail.
        retry=RetryStrategy(wait=1, retry_exceptions={ThreadBusyError}),
    )(run)
    sweeper = asyncio.create_task(_sweep(worker, queue), name="criogen-stalled-sweeper")
    try:
        await app.run_worker_async(
            queues=[QUEUE],
            name=worker.name,
            concurrency=worker.concurrency,
            wait=True,
            install_signal_handlers=install_signal_handlers,
            update_heartbeat_interval=worker.heartbeat_secs,
            stalled_worker_timeout=worker.stalled_after_secs,
            abort_job_polling_interval=worker.heartbeat_secs,
            fetch_job_polling_interval=worker.heartbeat_secs,
            shutdown_graceful_timeout=None,
            # criogen_runs keeps each run's record; the job table keeps only what is live
            # or failed.
            delete_jobs="successful",
        )
    finally:
        sweeper.cancel()
        await asyncio.gather(sweeper, return_exceptions=True)
        await queue.close()


async def _sweep(worker: Worker, queue: PgQueue) -> None:
    """Put back in the queue the jobs of workers silent for `stalled_after_secs`
    (procrastinate finds them by heartbeat; requeuing is left to the application).

    A silent worker whose session still holds the thread's lock is not dead: it is
    paused (SIGSTOP, a VM freeze) or its event loop is blocked (a tool calling
    `time.sleep`); PostgreSQL ends a dead process's sessions, and its locks with them.
    Its job is left alone until the lock is free, so two workers never run one thread."""
    manager = queue.app.job_manager
    while True:
        await asyncio.sleep(worker.heartbeat_secs)
        try:
            stalled = await manager.get_stalled_jobs(
                queue=QUEUE, seconds_since_heartbeat=worker.stalled_after_secs
            )
            for job in stalled:
                run_id, thread_id = _job_names(job)
                if thread_id is not None and await _thread_locked(queue, thread_id):
                    continue
                try:
                    await manager.retry_job_by_id_async(
                        job.id, retry_at=datetime.datetime.now(datetime.UTC)
                    )
                    log.warning(
                        "run %s of thread %r: its worker stopped sending heartbeats and "
                        "holds no lock on the thread; queued again (job %s)",
                        run_id,
                        thread_id,
                        job.id,
                    )
                except Exception:  # another worker requeued it first
                    pass
                # A run cancelled while its worker was dead ends as cancelled, not retried.
                await queue.app.connector.execute_query_async(
                    "UPDATE criogen_runs SET status = 'cancelled', finished_at = now()"
                    " WHERE job_id = %(job_id)s AND status = 'running' AND EXISTS ("
                    " SELECT 1 FROM procrastinate_jobs WHERE id = %(job_id)s"
                    " AND status = 'failed' AND abort_requested)",
                    job_id=job.id,
                )
            # A job procrastinate failed before a worker started its run (its task or
            # arguments edited in the table) would leave the run queued for ever.
            await queue.app.connector.execute_query_async(
                "UPDATE criogen_runs r SET status = 'failed', error_code = 'bad_payload',"
                " error_type = 'BadPayload', finished_at = now(), error = 'the job failed"
                " before a worker could start its run (its task or arguments were changed in"
                " the job table, or the worker could not reach the database): submit it again'"
                " FROM procrastinate_jobs j WHERE r.job_id = j.id AND r.status = 'queued'"
                " AND j.status = 'failed' AND NOT j.abort_requested"
                " AND j.queue_name = %(queue)s",
                queue=QUEUE,
            )
        except Exception as exc:
            log.warning("could not look for stalled jobs: %s", exc)


def _job_names(job: Any) -> tuple[str | None, str | None]:
    """The run id and thread id a job carries (None when it does not say)."""
    lock = job.lock if isinstance(job.lock, str) else ""
    thread_id = lock[len("criogen:") :] if lock.startswith("criogen:") else None
    payload = (job.task_kwargs or {}).get("payload")
    rid = payload.get("id") if isinstance(payload, Mapping) else None
    return (rid if isinstance(rid, str) else None), thread_id


async def _thread_locked(queue: PgQueue, thread_id: str) -> bool:
    """Whether a session holds the thread's lock (its session-level advisory lock)."""
    from criogen_graph.storage.postgres import lock_key

    key = lock_key(thread_id) & 0xFFFFFFFFFFFFFFFF
    row = await queue._one(
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " AND classid = %(hi)s::bigint::oid AND objid = %(lo)s::bigint::oid"
        " AND objsubid = 1) AS held",
        hi=key >> 32,
        lo=key & 0xFFFFFFFF,
    )
    return bool(row and row["held"])


async def _run_job(worker: Worker, queue: PgQueue, context: Any, kwargs: dict[str, Any]) -> None:
    job_id = context.job.id
    raw = kwargs.get("payload")
    rid = raw.get("id") if isinstance(raw, Mapping) else None
    run_id = rid if isinstance(rid, str) and rid else f"job-{job_id}"
    # The record is claimed first: a payload naming the run id of another job (corrupt,
    # or made by hand) fails under a record of its own and leaves that one alone. Claimed
    # to the end, and a cancellation that came meanwhile is recorded as such.
    started = await to_the_end(_start(queue, run_id, job_id, raw, worker.name))
    taken: BadPayload | None = None
    if started is None:
        taken = BadPayload(f"the job's run id {run_id!r} belongs to another job")
        run_id = f"job-{job_id}"
        started = await to_the_end(_start(queue, run_id, job_id, raw, worker.name)) or 1
    if cancel_pending():
        await uncancelled(_finish(queue, run_id, CANCELLED, {}, attempt=started))
        raise asyncio.CancelledError
    agent: Agent[Any] | None = None
    try:
        if taken is not None:
            raise taken
        payload = read_payload(_unseal(worker.storage, raw))
        agent = worker.agents.get(payload["agent"])
        if agent is None:
            raise UnknownAgent(
                f"worker {worker.name} has no agent {payload['agent']!r} (it serves "
                f"{sorted(worker.agents)}): start the workers of this storage with "
                f"--agent for it"
            )
    except (BadPayload, UnknownAgent) as exc:
        fields = _sealed_error(worker.storage, error_fields(agent, exc))
        await _finish(queue, run_id, FAILED, fields, attempt=started)
        if isinstance(exc, BadPayload):
            # The record the submitter waits on, when the payload no longer names it.
            await _fail_job_records(queue, job_id, fields)
        raise
    try:
        reply = await _execute_on(worker, agent, payload, resumed=started > 1)
    except ThreadBusyError:
        await uncancelled(_finish(queue, run_id, QUEUED, {}, attempt=started, final=False))
        raise
    except asyncio.CancelledError:
        await uncancelled(_finish(queue, run_id, CANCELLED, {}, attempt=started))
        raise
    except Exception as exc:
        fields = _sealed_error(worker.storage, error_fields(agent, exc))
        await uncancelled(_finish(queue, run_id, FAILED, fields, attempt=started))
        raise
    await uncancelled(_finish(queue, run_id, SUCCEEDED, result_fields(reply), attempt=started))


#: How many times a run that lost its connection is continued before it fails.
_LOST_TRIES = 12


async def _execute_on(
    worker: Worker, agent: Agent[Any], payload: dict[str, Any], *, resumed: bool
) -> Reply[Any]:
    """Run the job; a run that lost its connection (its lock went with it) is continued
    by this worker once PostgreSQL answers again, as a dead worker's run is by another:
    what it saved (the results of the tools it finished, kept when the lock was lost)
    is not done again."""
    delay = min(0.1, worker.heartbeat_secs)
    for tries in range(_LOST_TRIES + 1):
        try:
            return await execute(agent, payload, resumed=resumed)
        except StorageError as exc:
            if exc.code not in ("lock_lost", "unreachable") or tries == _LOST_TRIES:
                raise
            log.warning(
                "run %s of thread %r lost its connection to PostgreSQL (%s); continuing it",
                payload["id"],
                payload["thread_id"],
                exc.code,
            )
        resumed = True
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)
    raise AssertionError("unreachable")


def _sealed_error(storage: Storage, fields: dict[str, Any]) -> dict[str, Any]:
    """A failed run's error text sealed like the checkpoints when the storage is
    encrypted (a tool's exception may quote what the conversation holds)."""
    serde = storage.serializer
    if serde is None or not fields.get("error"):
        return fields
    import base64

    kind, data = serde.dumps_typed(fields["error"])
    return {**fields, "error": _SEALED_ERROR + f"{kind}:" + base64.b64encode(data).decode()}


#: The prefix of an error text sealed by `_sealed_error`.
_SEALED_ERROR = "criogen-sealed:"


def _opened_error(storage: Storage, info: RunInfo) -> RunInfo:
    """`info` with its sealed error text opened (kept sealed without the key)."""
    text = info.error
    serde = storage.serializer
    if text is None or not text.startswith(_SEALED_ERROR) or serde is None:
        return info
    import base64
    import dataclasses

    try:
        kind, data = text[len(_SEALED_ERROR) :].split(":", 1)
        opened = serde.loads_typed((kind, base64.b64decode(data)))
    except Exception:
        return info
    return dataclasses.replace(info, error=str(opened))


async def _fail_job_records(queue: PgQueue, job_id: int, fields: dict[str, Any]) -> None:
    await queue.app.connector.execute_query_async(
        "UPDATE criogen_runs SET status = 'failed', error_code = %(error_code)s,"
        " error_type = %(error_type)s, error = %(error)s, finished_at = now()"
        " WHERE job_id = %(job_id)s AND status IN ('queued', 'running')",
        job_id=job_id,
        error_code=fields.get("error_code"),
        error_type=fields.get("error_type"),
        error=fields.get("error"),
    )


async def _start(queue: PgQueue, run_id: str, job_id: int, raw: Any, worker: str) -> int | None:
    """Mark the run started by this worker; its attempts so far, or None if `run_id` is
    the record of another job."""

    def text(key: str) -> str:
        value = raw.get(key) if isinstance(raw, Mapping) else None
        return value if isinstance(value, str) and value else "?"

    row = await queue._one(
        "INSERT INTO criogen_runs (id, job_id, thread_id, agent, action, status, attempts,"
        " worker, started_at, first_started_at)"
        " VALUES (%(id)s, %(job_id)s, %(thread_id)s, %(agent)s, %(action)s, %(running)s, 1,"
        " %(worker)s, now(), now())"
        " ON CONFLICT (id) DO UPDATE SET status = %(running)s,"
        " attempts = criogen_runs.attempts + 1, worker = EXCLUDED.worker,"
        " started_at = now(), job_id = EXCLUDED.job_id,"
        " first_started_at = coalesce(criogen_runs.first_started_at, now())"
        " WHERE criogen_runs.job_id IS NULL OR criogen_runs.job_id = EXCLUDED.job_id"
        " RETURNING attempts",
        id=run_id,
        job_id=job_id,
        thread_id=text("thread_id"),
        agent=text("agent"),
        action=text("action"),
        running=RUNNING,
        worker=worker,
    )
    return int(row["attempts"]) if row is not None else None


async def _finish(
    queue: PgQueue,
    run_id: str,
    status: str,
    fields: dict[str, Any],
    *,
    attempt: int,
    final: bool = True,
) -> None:
    """Record the outcome of attempt `attempt` of the run: only while no later attempt
    started it (a worker taken for dead and resumed never overwrites the outcome of
    the worker that took its run over)."""
    values = {
        "error_code": None,
        "error_type": None,
        "error": None,
        "run_id": None,
        "checkpoint_id": None,
        "stop_reason": None,
        "needs_approval": None,
        **fields,
    }
    await queue.app.connector.execute_query_async(
        "UPDATE criogen_runs SET status = %(status)s, error_code = %(error_code)s,"
        " error_type = %(error_type)s, error = %(error)s, run_id = %(run_id)s,"
        " checkpoint_id = %(checkpoint_id)s, stop_reason = %(stop_reason)s,"
        " needs_approval = %(needs_approval)s,"
        " finished_at = CASE WHEN %(final)s THEN now() END"
        " WHERE id = %(id)s AND attempts = %(attempt)s",
        id=run_id,
        attempt=attempt,
        status=status,
        final=final,
        **values,
    )
