"""Run events shared by every `serve` process on one PostgreSQL: each event of a run is
saved in a table of the storage's database (sealed with the storage's encryption key
when it has one) and announced with NOTIFY, so a client of any server process can follow
a run another process executes, in order and without gaps, and cancel it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from criogen_graph.serve._protocol import dumps
from criogen_graph.storage import Storage

__all__ = ["PgEvents"]

_log = logging.getLogger("criogen_graph.serve")

_TABLE = "criogen_serve_events"
_EVENTS_CHANNEL = "criogen_serve_events"
_CANCEL_CHANNEL = "criogen_serve_cancel"
#: Seconds a follower waits for a NOTIFY before it reads the table anyway (a missed
#: notification costs at most this much latency, never an event); doubled while the run
#: stays quiet, up to `_QUIET_POLL_SECS` (thousands of idle followers wake the server
#: a few thousand times a second, not ten thousand).
_POLL_SECS = 1.0
_QUIET_POLL_SECS = 4.0
_SETUP = f"""
CREATE TABLE IF NOT EXISTS {_TABLE} (
    run_id text NOT NULL,
    seq integer NOT NULL,
    mode text NOT NULL,
    event text NOT NULL,
    kind text NOT NULL,
    data bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, seq)
)
"""


class PgEvents:
    """The event table and the notifications of one PostgreSQL storage."""

    def __init__(self, storage: Storage, on_cancel: Callable[[str], None]) -> None:
        self.storage = storage
        self.on_cancel = on_cancel
        self._writer: Any = None
        self._reader: Any = None
        self._read_lock = asyncio.Lock()
        self._write_lock = asyncio.Lock()
        self._listener: Any = None
        self._listen_task: asyncio.Task[None] | None = None
        self._queue: asyncio.Queue[tuple[str, int, str, str, Any] | None] = asyncio.Queue()
        self._write_task: asyncio.Task[None] | None = None
        #: The followers of each run here, each woken by the run's notifications.
        self._waiters: dict[str, set[asyncio.Event]] = {}
        #: How many notifications each followed run has had: a poll's answer is shared
        #: by the followers of the run until the next one (see `_shared`).
        self._generation: dict[str, int] = {}
        self._polls: dict[tuple[Any, ...], tuple[float, int, asyncio.Future[Any]]] = {}

    async def open(self, *, listen: bool = True) -> None:
        """Connect (and create the table once). `listen=False`: only to write events
        (a background worker executing a run)."""
        import psycopg

        self._writer = await self._connection(None, writer=True)
        async with self._writer.transaction():
            # Concurrent first starts: one creates the table, the others wait for it.
            await self._writer.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (_TABLE,))
            await self._writer.execute(_SETUP)
        self._reader = await psycopg.AsyncConnection.connect(self.storage.url, autocommit=True)
        self._write_task = asyncio.ensure_future(self._write())
        if not listen:
            return
        self._listener = await psycopg.AsyncConnection.connect(self.storage.url, autocommit=True)
        await self._listener.execute(f"LISTEN {_EVENTS_CHANNEL}")
        await self._listener.execute(f"LISTEN {_CANCEL_CHANNEL}")
        self._listen_task = asyncio.ensure_future(self._listen())

    async def close(self) -> None:
        self._queue.put_nowait(None)
        if self._write_task is not None:
            with contextlib.suppress(BaseException):
                await self._write_task
        if self._listen_task is not None:
            self._listen_task.cancel()
            with contextlib.suppress(BaseException):
                await self._listen_task
        for conn in (self._listener, self._reader, self._writer):
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()

    # -- writing -------------------------------------------------------------------------

    def publish(self, run_id: str, seq: int, mode: str, event: str, data: Any) -> None:
        """Queue one event for the table (written in order by one task, so running the
        graph never waits for the database)."""
        self._queue.put_nowait((run_id, seq, mode, event, data))

    async def flushed(self) -> None:
        """Wait until every event queued so far is in the table."""
        done = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(("", 0, "", "", done))
        await asyncio.shield(done)

    def _seal(self, data: Any) -> tuple[str, bytes]:
        serde = self.storage.serializer
        if serde is None:
            return "json", dumps(data).encode("utf-8")
        kind, sealed = serde.dumps_typed(json.loads(dumps(data)))
        return kind, sealed

    async def _write(self) -> None:
        while True:
            item = await self._queue.get()
            if item is None:
                return
            batch = [item]
            while not self._queue.empty() and len(batch) < 500:
                more = self._queue.get_nowait()
                if more is None:
                    self._queue.put_nowait(None)
                    break
                batch.append(more)
            try:
                await self._write_batch(batch)
            except Exception:
                _log.exception("could not save %d run events", len(batch))

    async def _write_batch(self, batch: list[tuple[str, int, str, str, Any]]) -> None:
        rows = []
        markers = []
        for run_id, seq, mode, event, data in batch:
            if not run_id:
                markers.append(data)
                continue
            kind, sealed = self._seal(data)
            rows.append((run_id, seq, mode, event, kind, sealed))
        try:
            if rows:
                async with self._write_lock:
                    self._writer = await self._connection(self._writer, writer=True)
                    await self._insert(rows)
        finally:
            # Whoever waits for a flush is let go even if the write failed (logged).
            for marker in markers:
                if not marker.done():
                    marker.set_result(None)

    async def _insert(self, rows: list[tuple[str, int, str, str, str, bytes]]) -> None:
        if rows:
            async with self._writer.transaction(), self._writer.cursor() as cur:
                await cur.executemany(
                    f"INSERT INTO {_TABLE} (run_id, seq, mode, event, kind, data) "
                    "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    rows,
                )
                for run_id in dict.fromkeys(r[0] for r in rows):
                    await cur.execute("SELECT pg_notify(%s, %s)", (_EVENTS_CHANNEL, run_id))

    async def progress(self, run_id: str) -> tuple[int, int]:
        """The id of the last saved event of `run_id` (0 if none) and how many times it
        was started (its `metadata` events)."""
        async with self._read_lock:
            self._reader = await self._connection(self._reader)
            cur = await self._reader.execute(
                f"SELECT coalesce(max(seq), 0), count(*) FILTER (WHERE event = 'metadata') "
                f"FROM {_TABLE} WHERE run_id = %s",
                (run_id,),
            )
            row = await cur.fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    async def last_error(self, run_id: str) -> Any:
        """The data of the `error` event `run_id` ended with, or None."""
        async with self._read_lock:
            self._reader = await self._connection(self._reader)
            cur = await self._reader.execute(
                f"SELECT event, kind, data FROM {_TABLE} WHERE run_id = %s "
                "ORDER BY seq DESC LIMIT 1",
                (run_id,),
            )
            row = await cur.fetchone()
        if row is None or row[0] != "error":
            return None
        raw = bytes(row[2])
        serde = self.storage.serializer
        return (
            json.loads(raw)
            if row[1] == "json" or serde is None
            else serde.loads_typed((row[1], raw))
        )

    async def forget(self, run_ids: list[str]) -> None:
        """Delete the events of these runs (their thread was deleted)."""
        await self.flushed()
        await self._shielded(f"DELETE FROM {_TABLE} WHERE run_id = ANY(%s)", (run_ids,))

    async def fail(self, run_id: str, data: dict[str, Any]) -> None:
        """End the events of `run_id` with an `error` event (unless its last one is
        already an error): a run the workers never started has no events of its own,
        and its followers, in every server process, must learn why it ended."""
        await self.flushed()
        kind, sealed = self._seal(data)

        async def run() -> None:
            async with self._write_lock:
                self._writer = await self._connection(self._writer)
                async with self._writer.transaction():
                    cur = await self._writer.execute(
                        f"SELECT seq, event FROM {_TABLE} WHERE run_id = %s "
                        "ORDER BY seq DESC LIMIT 1",
                        (run_id,),
                    )
                    last = await cur.fetchone()
                    if last is not None and last[1] == "error":
                        return
                    # Two servers failing it at once: one row wins (same seq).
                    await self._writer.execute(
                        f"INSERT INTO {_TABLE} (run_id, seq, mode, event, kind, data) "
                        "VALUES (%s, %s, 'error', 'error', %s, %s) ON CONFLICT DO NOTHING",
                        (run_id, (last[0] if last else 0) + 1, kind, sealed),
                    )
                    await self._writer.execute(
                        "SELECT pg_notify(%s, %s)", (_EVENTS_CHANNEL, run_id)
                    )

        await asyncio.shield(asyncio.ensure_future(run()))

    async def notify(self, run_id: str) -> None:
        """Tell the followers of `run_id`, in every server process, to read it again
        (it has ended: its record says so, with no event after the last one)."""
        await self._shielded("SELECT pg_notify(%s, %s)", (_EVENTS_CHANNEL, run_id))

    async def cancel(self, run_id: str) -> None:
        """Ask whichever server process runs `run_id` to cancel it."""
        await self._shielded("SELECT pg_notify(%s, %s)", (_CANCEL_CHANNEL, run_id))

    async def _shielded(self, statement: str, params: tuple[Any, ...]) -> None:
        """A statement on the writer's connection that a request's cancellation cannot
        cut (psycopg closes a connection whose query is cancelled)."""

        async def run() -> None:
            async with self._write_lock:
                self._writer = await self._connection(self._writer, writer=True)
                await self._writer.execute(statement, params)

        await asyncio.shield(asyncio.ensure_future(run()))

    # -- reading -------------------------------------------------------------------------

    async def _listen(self) -> None:
        while True:
            try:
                async for note in self._listener.notifies():
                    if note.channel == _CANCEL_CHANNEL:
                        self.on_cancel(note.payload)
                    else:
                        waiters = self._waiters.get(note.payload)
                        if waiters:
                            self._generation[note.payload] += 1
                            for waiter in waiters:
                                waiter.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Followers still poll the table: a lost listener only adds latency.
                _log.warning("run event notifications stopped: %s", exc)
                return

    async def rows(self, run_id: str, after: int) -> list[tuple[int, str, str, Any]]:
        """The events of `run_id` after `after` (a client leaving while they are read
        does not cut the query: psycopg would close the shared connection)."""
        return await asyncio.shield(asyncio.ensure_future(self._rows(run_id, after)))

    async def _connection(self, conn: Any, *, writer: bool = False) -> Any:
        if conn is not None and not conn.closed:
            return conn
        import psycopg

        conn = await psycopg.AsyncConnection.connect(self.storage.url, autocommit=True)
        if writer:
            # Its commits are seen by every session at once, and made durable by the
            # next commit that waits for the disk: the run's next checkpoint, or its
            # record saved as ended (which `Runs` saves after the events are flushed),
            # so a run that ended never lost an event, and the run does not wait for
            # the disk twice. (The log is written in order: that commit covers these.)
            await conn.execute("SET synchronous_commit = off")
        return conn

    async def _rows(self, run_id: str, after: int) -> list[tuple[int, str, str, Any]]:
        async with self._read_lock:
            self._reader = await self._connection(self._reader)
            cur = await self._reader.execute(
                f"SELECT seq, mode, event, kind, data FROM {_TABLE} "
                "WHERE run_id = %s AND seq > %s ORDER BY seq",
                (run_id, after),
            )
            found = await cur.fetchall()
        serde = self.storage.serializer
        out = []
        for seq, mode, event, kind, data in found:
            raw = bytes(data)
            if kind == "json" or serde is None:
                value = json.loads(raw)
            else:
                value = serde.loads_typed((kind, raw))
            out.append((int(seq), str(mode), str(event), value))
        return out

    async def _shared(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        """`make()`, awaited, or the answer another follower of the run got for the same
        `key` less than a poll ago with no notification since: a thousand idle
        followers of one run cost the database a query a poll, not a thousand."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        generation = self._generation.get(key[0], 0)
        hit = self._polls.get(key)
        if hit is not None and hit[1] == generation and now - hit[0] < _POLL_SECS:
            return await asyncio.shield(hit[2])
        if len(self._polls) > 256:
            self._polls = {k: v for k, v in self._polls.items() if now - v[0] < _POLL_SECS}
        future = asyncio.ensure_future(make())
        self._polls[key] = (now, generation, future)
        try:
            return await asyncio.shield(future)
        except BaseException:
            if self._polls.get(key, (0, 0, None))[2] is future:
                del self._polls[key]
            raise

    async def follow(
        self, run_id: str, after: int, ended: Callable[[], Any], idle: float | None = None
    ) -> AsyncIterator[tuple[int, str, str, Any] | None]:
        """The events of `run_id` after `after`, in order, until the run has ended
        (`ended()`, awaited, says so) and every event of it was read; with `idle`, a
        None after each `idle` seconds without one (for a heartbeat)."""
        loop = asyncio.get_running_loop()
        quiet_since = loop.time()
        waiter = asyncio.Event()
        self._waiters.setdefault(run_id, set()).add(waiter)
        self._generation.setdefault(run_id, 0)
        poll = _POLL_SECS
        try:
            while True:
                waiter.clear()
                over = bool(await self._shared((run_id, "ended"), ended))
                rows = functools.partial(self.rows, run_id, after)
                for row in await self._shared((run_id, "rows", after), rows):
                    after = row[0]
                    quiet_since = loop.time()
                    poll = _POLL_SECS
                    yield row
                if over:
                    return
                wait = poll
                if idle is not None:
                    if loop.time() - quiet_since >= idle:
                        quiet_since = loop.time()
                        yield None
                    wait = min(wait, max(0.0, quiet_since + idle - loop.time()))
                generation = self._generation.get(run_id)
                # A timer rather than `wait_for` (a task per wait): it is the cost of
                # every idle follower.
                timer = loop.call_later(wait, waiter.set)
                try:
                    await waiter.wait()
                finally:
                    timer.cancel()
                if self._generation.get(run_id) != generation:
                    poll = _POLL_SECS  # a notification: the run is moving
                elif wait >= poll:
                    poll = min(poll * 2, _QUIET_POLL_SECS)
        finally:
            waiters = self._waiters.get(run_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[run_id]
                    self._generation.pop(run_id, None)
