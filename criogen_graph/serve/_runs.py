"""The runs of one server process: each is a `Thread` call (`stream`, `stream_decide`,
...) in a task of its own, whose events are kept in order with their ids so any number
of clients can follow it, join it late, or reconnect and get what they missed."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from criogen_graph.errors import CriogenError, ThreadSuspendedError
from criogen_graph.serve._events_pg import PgEvents
from criogen_graph.serve._protocol import (
    dumps,
    interrupts_json,
    lc_message,
    now_iso,
    sse,
    with_message_ids,
)
from criogen_graph.serve._records import Records
from criogen_graph.stream import (
    ApprovalNeededEvent,
    MessageEvent,
    Stream,
    StreamEvent,
    TextEvent,
)

__all__ = ["Run", "Runs", "is_terminal"]

_log = logging.getLogger("criogen_graph.serve")

#: Finished runs whose events stay in memory for late joiners.
_KEEP_FINISHED = 1000
#: Seconds between SSE heartbeats on an idle stream (proxies drop silent connections).
HEARTBEAT_SECS = 15.0
#: Events always sent, whatever stream modes were asked for.
_ALWAYS = frozenset({"metadata", "error"})
_TERMINAL = frozenset({"success", "error", "interrupted", "timeout"})

#: Reads a thread's state once its run ended: (values, interrupts).
ReadState = Callable[[], Awaitable[tuple[dict[str, Any], list[Any]]]]
#: Starts a run's Thread call; None when there is nothing left to run (a worker taking
#: over a run that had finished).
Call = Callable[[], "Stream[Any] | None"]


@dataclasses.dataclass(frozen=True, slots=True)
class _Partial:
    """A `messages/partial` event's data: the message with its first `upto` pieces."""

    chunk: dict[str, Any]
    pieces: list[str]
    upto: int

    def __call__(self) -> list[dict[str, Any]]:
        text = "".join(self.pieces[: self.upto])
        return [{**self.chunk, "type": "ai", "content": text}]


@dataclasses.dataclass
class Run:
    """One run: its record (the API's run object), its events, and its task."""

    record: dict[str, Any]
    modes: frozenset[str]
    events: list[tuple[int, str, str, Any]] = dataclasses.field(default_factory=list)
    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    done: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    values: dict[str, Any] | None = None
    error: BaseException | None = None
    #: Where its events also go for other server processes (PostgreSQL), if anywhere.
    publish: Callable[[str, int, str, str, Any], None] | None = None
    #: The id of the event before its first one here (a worker continuing a run another
    #: worker started numbers its events after those already saved).
    offset: int = 0
    #: The `Reply` its Thread call ended with.
    reply: Any = None
    #: Its record's first save, when it is made while the run runs (a `wait`, whose
    #: client learns the run's id only from the answer): awaited before the end's.
    saved: asyncio.Future[Any] | None = None
    #: Not saved before it ends (a `wait` on a storage of one process, which answers
    #: for it from memory until then): saved at its end, with this changed record of
    #: its thread if there is one.
    unsaved: bool = False
    thread_change: dict[str, Any] | None = None
    #: Its events go to the other server processes (PostgreSQL) when it ends, in one
    #: batch, rather than as they come (a `wait`, whose client waits for the end).
    publish_at_end: bool = False
    #: Its Thread call may be refused because the thread waits for approval (the
    #: request did not ask first): the refusal then leaves no run behind, as if the
    #: request had been refused before the run was made.
    refusable: bool = False

    @property
    def id(self) -> str:
        return str(self.record["run_id"])

    @property
    def thread_id(self) -> str:
        return str(self.record["thread_id"])

    def emit(self, mode: str, event: str, data: Any) -> None:
        seq = self.offset + len(self.events) + 1
        self.events.append((seq, mode, event, data))
        if self.publish is not None:
            self.publish(self.id, seq, mode, event, data() if isinstance(data, _Partial) else data)
        self.wake.set()
        self.wake = asyncio.Event()

    def cancel(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()

    async def follow(
        self, modes: frozenset[str], after: int = 0, heartbeat: float = HEARTBEAT_SECS
    ) -> AsyncIterator[bytes]:
        """The run's events after id `after` in `modes`, as SSE, until it ends (with a
        heartbeat comment after each `heartbeat` seconds it is quiet)."""
        wanted = modes | _ALWAYS
        seen = after
        while True:
            wake = self.wake
            while seen < len(self.events):
                event_id, mode, event, data = self.events[seen]
                seen += 1
                if mode in wanted:
                    yield sse(event, data() if isinstance(data, _Partial) else data, str(event_id))
            if self.done.is_set():
                return
            try:
                await asyncio.wait_for(wake.wait(), heartbeat)
            except TimeoutError:
                yield b": heartbeat\n\n"


class _Emitter:
    """Turns a `Thread` stream's events into the API's events, in every mode at once
    (a client picks its modes when it reads)."""

    def __init__(self, run: Run, values: dict[str, Any]) -> None:
        self.run = run
        self.values = dict(values)
        self.messages: list[Any] = list(self.values.get("messages") or [])
        # The pieces of each streamed message so far: a `messages/partial` event sends
        # the text up to its piece, joined when it is sent (a copy per event would keep
        # a long answer's text once per piece: quadratic memory).
        self.partial: dict[str, list[str]] = {}
        self.meta = {
            "run_id": run.id,
            "thread_id": run.thread_id,
            "assistant_id": run.record["assistant_id"],
            "langgraph_node": "model",
        }

    def __call__(self, event: StreamEvent) -> None:
        run = self.run
        if isinstance(event, ApprovalNeededEvent):
            return  # the interrupt goes out with the final values
        run.emit("custom", "custom", dataclasses.asdict(event))
        if isinstance(event, TextEvent):
            self._text(event)
        elif isinstance(event, MessageEvent):
            self._message(event.message)

    def _text(self, event: TextEvent) -> None:
        run = self.run
        chunk = {
            "type": "AIMessageChunk",
            "content": event.text,
            "id": event.message_id,
            "tool_calls": [],
            "tool_call_chunks": [],
            "additional_kwargs": {},
            "response_metadata": {},
        }
        run.emit("messages-tuple", "messages", [chunk, self.meta])
        pieces = self.partial.get(event.message_id)
        if pieces is None:
            run.emit("messages", "messages/metadata", {event.message_id: {"metadata": self.meta}})
            pieces = self.partial[event.message_id] = []
        pieces.append(event.text)
        run.emit("messages", "messages/partial", _Partial(chunk, pieces, len(pieces)))

    def _message(self, message: Mapping[str, Any]) -> None:
        run = self.run
        self.messages.append(dict(message))
        values = {**self.values, "messages": list(self.messages)}
        run.emit("values", "values", with_message_ids(values))
        role = message.get("role")
        if role == "user":
            return
        node = "tools" if role == "tool" else "model"
        run.emit("updates", "updates", {node: {"messages": [dict(message)]}})
        lc = lc_message(message)
        meta = {**self.meta, "langgraph_node": node}
        if lc["id"] in self.partial:
            # Clients add up a message's chunks by id: the text is there already, only
            # the tool calls are still to come.
            if lc.get("tool_calls"):
                run.emit("messages-tuple", "messages", [_calls_chunk(lc), meta])
        else:
            run.emit("messages-tuple", "messages", [lc, meta])
        run.emit("messages", "messages/complete", [lc])

    def finish(self, values: dict[str, Any], interrupts: Sequence[Any]) -> dict[str, Any]:
        final = dict(values)
        final.update(with_message_ids(values))
        if interrupts:
            final["__interrupt__"] = interrupts_json(interrupts)
            self.run.emit("updates", "updates", {"__interrupt__": final["__interrupt__"]})
        self.run.emit("values", "values", final)
        return final


def _calls_chunk(message: Mapping[str, Any]) -> dict[str, Any]:
    """The last chunk of a streamed assistant message: its tool calls, no text."""
    calls = message.get("tool_calls") or []
    return {
        "type": "AIMessageChunk",
        "content": "",
        "id": message.get("id"),
        "tool_calls": calls,
        "tool_call_chunks": [
            {
                "name": c.get("name"),
                "args": dumps(c.get("args") or {}),
                "id": c.get("id"),
                "index": i,
                "type": "tool_call_chunk",
            }
            for i, c in enumerate(calls)
        ],
        "additional_kwargs": {},
        "response_metadata": {},
    }


class Runs:
    """The runs of this process, one at a time per thread (in the order they came)."""

    def __init__(self, records: Records) -> None:
        self.records = records
        #: The PostgreSQL event channel, when the storage is PostgreSQL (see `PgEvents`).
        self.events: PgEvents | None = None
        self._runs: OrderedDict[str, Run] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}

    def get(self, run_id: str) -> Run | None:
        return self._runs.get(run_id)

    def of_thread(self, thread_id: str) -> list[Run]:
        """The runs of this process on the thread that it still keeps, oldest first."""
        return [r for r in list(self._runs.values()) if r.thread_id == thread_id]

    def busy(self, thread_id: str) -> bool:
        """A run of this process is queued or running on the thread."""
        return any(
            r.thread_id == thread_id and not r.done.is_set() for r in list(self._runs.values())
        )

    def start(
        self,
        record: dict[str, Any],
        modes: frozenset[str],
        call: Callable[[], Stream[Any]],
        before: dict[str, Any],
        read_state: ReadState,
        *,
        saved: asyncio.Future[Any] | None = None,
        unsaved: bool = False,
        thread_change: dict[str, Any] | None = None,
        refusable: bool = False,
        publish_at_end: bool = False,
    ) -> Run:
        """Queue `call` (a `Thread` stream call) as a run of its thread (`saved`,
        `unsaved`, `thread_change`, `refusable`, `publish_at_end`: see `Run`)."""
        run = self._new(record, modes, 0, 1, live=not publish_at_end)
        run.publish_at_end = publish_at_end and self.events is not None
        run.saved, run.refusable = saved, refusable
        run.unsaved, run.thread_change = unsaved, thread_change
        run.task = asyncio.ensure_future(self._execute(run, call, before, read_state))
        return run

    async def execute(
        self,
        record: dict[str, Any],
        modes: frozenset[str],
        call: Call,
        before: dict[str, Any],
        read_state: ReadState,
        *,
        after: int,
        attempt: int,
    ) -> Run:
        """Run `call` here and now (a background worker executing a run created over
        HTTP): its events are numbered after `after`; returns the ended run."""
        run = self._new(record, modes, after, attempt)
        await self._execute(run, call, before, read_state)
        return run

    def _new(
        self,
        record: dict[str, Any],
        modes: frozenset[str],
        after: int,
        attempt: int,
        *,
        live: bool = True,
    ) -> Run:
        run = Run(record, modes, offset=after)
        if self.events is not None and live:
            run.publish = self.events.publish
        self._runs[run.id] = run
        self._forget_old()
        run.emit("metadata", "metadata", {"run_id": run.id, "attempt": attempt})
        return run

    def _forget_old(self) -> None:
        finished = [k for k, r in self._runs.items() if r.done.is_set()]
        for key in finished[: max(0, len(finished) - _KEEP_FINISHED)]:
            del self._runs[key]

    async def _execute(
        self,
        run: Run,
        call: Call,
        before: dict[str, Any],
        read_state: ReadState,
    ) -> None:
        lock = self._locks.setdefault(run.thread_id, asyncio.Lock())
        try:
            async with lock:
                # Kept in memory: the record is saved when the run is created and ends.
                run.record.update(status="running", updated_at=now_iso())
                emitter = _Emitter(run, before)
                stream = call()
                if stream is not None:
                    async for event in stream:
                        emitter(event)
                    run.reply = await stream.reply()
                # The values the graph stopped with are those saved: no read back.
                final = stream.final if stream is not None else None
                values, interrupts = final if final is not None else await read_state()
                run.values = emitter.finish(values, interrupts)
            await self._ended(run, "success")
        except asyncio.CancelledError as exc:
            run.error = exc
            await self._ended(run, "interrupted")
            raise
        except CriogenError as exc:
            run.error = exc
            if run.refusable and isinstance(exc, ThreadSuspendedError):
                await self._refused(run)
                return
            run.emit("error", "error", {"error": type(exc).__name__, "message": str(exc)})
            await self._ended(run, "error")
        except Exception as exc:
            _log.exception("run %s on thread %r failed", run.id, run.thread_id)
            run.error = exc
            run.emit(
                "error",
                "error",
                {"error": type(exc).__name__, "message": "the run failed; see the server's log"},
            )
            await self._ended(run, "error")
        finally:
            run.done.set()
            run.wake.set()
            if not lock.locked() and self._locks.get(run.thread_id) is lock:
                del self._locks[run.thread_id]

    async def _ended(self, run: Run, status: str) -> None:
        """Save the run's end: its events first (a follower in another process stops
        when it reads an ended run, so every event must be there by then)."""
        await self._first_saved(run)
        if run.publish_at_end and self.events is not None:
            for seq, mode, event, data in run.events:
                value = data() if isinstance(data, _Partial) else data
                self.events.publish(run.id, seq, mode, event, value)
        with contextlib.suppress(Exception):
            if self.events is not None:
                await asyncio.shield(self.events.flushed())
        with contextlib.suppress(Exception):
            await asyncio.shield(self._set_status(run, status))
            if self.events is not None:
                await self.events.notify(run.id)

    async def _first_saved(self, run: Run) -> None:
        if run.saved is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(run.saved)

    async def _refused(self, run: Run) -> None:
        """The thread refused the run before it started: its record and events go."""
        if self._runs.get(run.id) is run:
            del self._runs[run.id]
        if run.unsaved:
            return
        await self._first_saved(run)
        with contextlib.suppress(Exception):
            if self.events is not None:
                await asyncio.shield(self.events.forget([run.id]))
        with contextlib.suppress(Exception):
            await asyncio.shield(self.records.delete_run(run.thread_id, run.id))

    async def _set_status(self, run: Run, status: str) -> None:
        run.record.update(status=status, updated_at=now_iso())
        if run.unsaved:
            await self.records.start_run(run.record, run.thread_change)
            run.unsaved = False
        else:
            await self.records.put_run(run.record)

    async def shutdown(self) -> None:
        """Cancel every run of this process and wait until each is saved."""
        tasks = [r.task for r in self._runs.values() if r.task is not None and not r.task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)


def is_terminal(status: Any) -> bool:
    """A run status after which nothing more happens."""
    return status in _TERMINAL
