"""Background runs: `thread.submit(...)` queues a run and returns a `RunHandle` at once.

On PostgreSQL the queue is procrastinate's job tables, in the storage's own database and
schema, served by any number of `criogen-graph worker` processes (`Worker`) on any number
of machines. A worker that dies stops sending heartbeats; after `stalled_after_secs`
another worker puts its job back in the queue and continues the run from its last saved
step, as `thread.retry()` does (tool calls that finished are never run again). The jobs
of one thread run one at a time, in the order they were submitted.

On `memory://` and SQLite an in-process worker (tasks of the submitting event loop) runs
the same jobs with the same API, so tests and notebooks need no PostgreSQL; its queue
lives as long as the process.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast

from criogen_graph.errors import CriogenError, ValidationError
from criogen_graph.results import Decision, PendingApprovals, Reply

if TYPE_CHECKING:
    from criogen_graph.agent import Agent
    from criogen_graph.messages import ErrorCode
    from criogen_graph.storage import Storage
    from criogen_graph.thread import Thread

__all__ = [
    "RunFailedError",
    "RunHandle",
    "RunInfo",
    "Worker",
    "cancel_run",
    "close_runs",
    "get_run",
    "list_runs",
]

Output = TypeVar("Output")

#: Statuses of a background run; the last three are final.
QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = (
    "queued",
    "running",
    "succeeded",
    "failed",
    "cancelled",
)
FINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
_ACTIONS = frozenset({"send", "approve", "reject", "decide", "retry"})
_PAYLOAD_VERSION = 1


class RunFailedError(CriogenError):
    """A background run did not succeed: `code` says why. `cancelled`; `run_failed` (the
    run's own error, named by `error_type`); the code of a `CriogenError` the run
    raised, e.g. `stale` (a pinned answer to a request no longer pending),
    `not_suspended`, `thread_suspended` (a send while an approval is pending),
    `nothing_to_retry`, `lock_lost` and `unreachable` (PostgreSQL, after a dozen tries to
    continue); `bad_payload` (the job's payload cannot be read or decrypted);
    `unknown_agent` (no worker serves the run's agent); `superseded` (cut off by its
    worker's death, then overtaken by a later run on the thread: not applied again)."""

    code = "run_failed"

    def __init__(
        self, message: str, *, code: str = "run_failed", error_type: str | None = None
    ) -> None:
        # The code may come from a run record another process wrote: kept as given.
        super().__init__(message, code=cast("ErrorCode", code))
        self.error_type = error_type


@dataclass(frozen=True)
class RunInfo:
    """What the queue knows of one background run.

    `status`: queued, running, succeeded, failed or cancelled. `attempts` counts the
    workers that started it (more than one when a worker died and another took over);
    `worker` is the last one (`host:pid`). A failed run has `error_code`, `error_type`
    and `error`. A run that ended has `run_id` and `checkpoint_id` (read the `Reply`
    with `handle.reply()`); `needs_approval` says it stopped for an approval.
    `heartbeat_age_ms`: for a running run on PostgreSQL, how long ago its worker last
    sent a heartbeat (past the workers' `stalled_after_secs`, it is taken for dead once
    it no longer holds the thread's lock); None otherwise.
    """

    id: str
    thread_id: str
    agent: str
    action: str
    status: str
    attempts: int = 0
    worker: str | None = None
    error_code: str | None = None
    error_type: str | None = None
    error: str | None = None
    run_id: str | None = None
    checkpoint_id: str | None = None
    stop_reason: str | None = None
    needs_approval: bool | None = None
    job_id: int | None = None
    submitted_at_ms: int | None = None
    started_at_ms: int | None = None
    first_started_at_ms: int | None = None
    finished_at_ms: int | None = None
    heartbeat_age_ms: int | None = None

    @property
    def done(self) -> bool:
        """The run ended (succeeded, failed or cancelled)."""
        return self.status in FINAL

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class _Queue(Protocol):
    async def submit(self, agent: Agent[Any], payload: dict[str, Any]) -> RunInfo: ...
    async def info(self, run_id: str) -> RunInfo | None: ...
    async def cancel(self, run_id: str) -> bool: ...
    async def list(
        self, *, status: str | None, thread_id: str | None, limit: int
    ) -> list[RunInfo]: ...
    async def local_reply(self, run_id: str) -> Reply[Any] | None: ...
    async def wait(self, run_id: str) -> RunInfo: ...


class RunHandle(Generic[Output]):
    """A run queued by `thread.submit(...)` (or `submit_approve`, `submit_reject`,
    `submit_decide`, `submit_retry`): `id`, `await status()`, `await reply()`,
    `await cancel()`. Get one back later with `thread.run(id)`."""

    def __init__(self, thread: Thread[Output], run_id: str, queue: _Queue) -> None:
        self.id = run_id
        self.thread = thread
        self._queue = queue

    def __repr__(self) -> str:
        return f"<RunHandle {self.id} on thread {self.thread.id!r}>"

    def _unknown(self) -> ValidationError:
        return ValidationError(
            f"no background run {self.id!r} on thread {self.thread.id!r}", code="unknown"
        )

    async def status(self) -> RunInfo:
        """The run's record now. A run of another thread is no run of this one:
        `ValidationError(code="unknown")`, as for an id that names no run."""
        info = await self._queue.info(self.id)
        if info is None or info.thread_id != self.thread.id:
            raise self._unknown()
        return info

    async def reply(self) -> Reply[Output]:
        """Wait for the run to end and return its `Reply` (read from the thread, so a
        handle made in another process works too). A failed or cancelled run raises
        `RunFailedError`; its `code` says why: `cancelled`; `run_failed` (the run's own
        error, named by `error_type`); a `CriogenError`'s own code when the run raised
        one, e.g. `stale` (a pinned answer to a request no longer pending),
        `not_suspended`, `thread_suspended` (a send while an approval is pending),
        `nothing_to_retry`, `lock_lost` (the thread's lock could not be taken back),
        `unreachable`; `bad_payload` (the job's payload cannot be read or decrypted);
        `unknown_agent` (no worker serves its agent). Bound the wait with
        `asyncio.timeout()`."""
        await self.status()
        info = await self._queue.wait(self.id)
        if info.status == CANCELLED:
            raise RunFailedError(
                f"background run {self.id} on thread {self.thread.id!r} was cancelled",
                code="cancelled",
            )
        if info.status == FAILED:
            raise RunFailedError(
                f"background run {self.id} on thread {self.thread.id!r} failed "
                f"({info.error_type or info.error_code}): {info.error}",
                code=info.error_code or "run_failed",
                error_type=info.error_type,
            )
        local = await self._queue.local_reply(self.id)
        if local is not None:
            return local
        assert info.checkpoint_id is not None and info.run_id is not None
        return await self.thread.reply_at(info.checkpoint_id, info.run_id)

    async def cancel(self) -> bool:
        """Cancel the run: a queued one never starts; a running one is cancelled at its
        next `await` (saved as a cancelled run: `thread.retry()` continues it). False if
        it had already ended."""
        await self.status()
        return await self._queue.cancel(self.id)


# -- submitting -------------------------------------------------------------------------


async def submit(thread: Thread[Any], action: str, **fields: Any) -> RunHandle[Any]:
    """Queue `action` on `thread` (called by `Thread.submit*`)."""
    payload = await _payload(thread, action, **fields)
    queue = await _queue_for(thread.agent.storage)
    info = await queue.submit(thread.agent, payload)
    return RunHandle(thread, info.id, queue)


async def submit_as(
    thread: Thread[Any], action: str, *, run_id: str, extra: Mapping[str, Any], **fields: Any
) -> RunHandle[Any]:
    """Queue `action` on `thread` under the caller's `run_id`, with `extra` fields in the
    job's payload (plain JSON, not sealed: no conversation in it). A payload with a
    `serve` field is executed by `criogen_graph.serve` inside the worker, which saves the
    run's events for the HTTP clients (`criogen-graph serve --workers external`)."""
    payload = await _payload(thread, action, **fields)
    payload.update(extra, id=run_id)
    queue = await _queue_for(thread.agent.storage)
    info = await queue.submit(thread.agent, payload)
    return RunHandle(thread, info.id, queue)


def handle(thread: Thread[Output], run_id: str) -> RunHandle[Output]:
    """A handle on an earlier background run of the storage (`thread.run(id)`)."""
    if not isinstance(run_id, str) or not run_id:
        raise ValidationError("a run id is a non-empty str", code="invalid_type")
    return RunHandle(thread, run_id, _LazyQueue(thread.agent.storage))


async def _payload(thread: Thread[Any], action: str, **fields: Any) -> dict[str, Any]:
    from criogen_graph.redact import effective
    from criogen_graph.runtime.runner import check_state, user_message

    payload: dict[str, Any] = {
        "v": _PAYLOAD_VERSION,
        "id": uuid.uuid4().hex,
        "thread_id": thread.id,
        "agent": thread.agent.name,
        "actor": thread.actor,
        "action": action,
    }
    if action == "send":
        # The same checks as send(); the queue keeps the text as redacted as the thread.
        spec = thread.agent.spec
        user = user_message(fields["input"], effective(spec.redact))
        state = check_state(fields.get("state"))
        if spec.memory is not None:
            spec.memory.pool(state)
        payload["input"] = user["content"]
        payload["state"] = state
    elif action in ("approve", "reject", "decide"):
        # Answers are redacted as the thread redacts them when it applies them (the
        # graph redacts a resume's values), so the queue holds nothing the thread would not.
        redactor = effective(thread.agent.spec.redact)
        if action == "reject":
            if not isinstance(fields["message"], str):
                raise ValidationError("reject message must be a str", code="invalid_type")
            message = fields["message"]
            payload["message"] = redactor.redact(message) if redactor is not None else message
        if action == "decide":
            decisions = fields["decisions"]
            if not isinstance(decisions, Mapping):
                raise ValidationError(
                    "decide takes a dict {call_id: Decision}", code="invalid_type"
                )
            payload["decisions"] = {
                str(k): _redacted(redactor, v.to_dict() if isinstance(v, Decision) else v)
                for k, v in decisions.items()
            }
        payload["expected"], asked = await _pin(thread, fields.get("expected"))
        if asked is not None:
            payload["asked"] = asked
    try:
        json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValidationError(
            f"a background run's input must be plain JSON (it is stored in the queue): {exc}",
            code="invalid_type",
        ) from None
    return payload


def _redacted(redactor: Any, value: Any) -> Any:
    return redactor.redact_value(value) if redactor is not None else value


async def _pin(thread: Thread[Any], expected: Any) -> tuple[Any, str | None]:
    """`expected` as JSON, and the checkpoint that asked what it answers (None if the
    pin does not match what waits now: the run will fail `stale`). A bare answer pins
    what waits now (as a bare `approve()` does), so a queued answer never applies to a
    request asked after it was made. A worker taking the run over finds by the asking
    checkpoint whether the answer was applied, whatever the pin's form."""
    from criogen_graph.runtime.pins import Pin

    pending = await thread.pending_approvals()
    if expected is None:
        if not pending:
            raise ValidationError(
                f"thread {thread.id!r} has no pending approvals to answer", code="not_suspended"
            )
        return pending.checkpoint_id, pending.checkpoint_id
    if isinstance(expected, Reply | PendingApprovals):
        pinned: Any = expected.checkpoint_id
    elif isinstance(expected, bool):
        raise ValidationError("expected= cannot be a bool", code="invalid_type")
    elif isinstance(expected, str | int):
        pinned = expected
    elif isinstance(expected, Sequence):
        pinned = [r.to_dict() if hasattr(r, "to_dict") else r for r in expected]
    else:
        raise ValidationError(
            f"expected= takes a Reply, pending_approvals(), a checkpoint id or version, or "
            f"the requests; got {type(expected).__name__}",
            code="invalid_type",
        )
    pin = Pin.of(pinned)
    if pin is None or not pending or pending.checkpoint_id is None:
        return pinned, None
    try:
        pin.check(
            thread_id=thread.id,
            action="submit",
            head_id=pending.checkpoint_id,
            head_version=pending.version or 0,
            pending=[r.to_dict() for r in pending],
        )
    except ValidationError:
        return pinned, None
    return pinned, pending.checkpoint_id


# -- running a job (shared by the in-process and the PostgreSQL workers) ------------------


class BadPayload(Exception):
    """A job's payload this worker cannot read (the run fails with `bad_payload`)."""


def read_payload(raw: Any) -> dict[str, Any]:
    """A job's payload, checked (`BadPayload` naming what is wrong)."""
    if not isinstance(raw, Mapping):
        raise BadPayload(f"the job's payload is a {type(raw).__name__}, not an object")
    if raw.get("v") != _PAYLOAD_VERSION:
        raise BadPayload(
            f"the job's payload has version {raw.get('v')!r}; this worker reads version "
            f"{_PAYLOAD_VERSION} (upgrade the worker or the submitter)"
        )
    for key in ("id", "thread_id", "agent", "action"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise BadPayload(f"the job's payload has no {key!r}")
    if raw["action"] not in _ACTIONS:
        raise BadPayload(f"the job's payload has an unknown action {raw['action']!r}")
    if raw["action"] == "send" and not isinstance(raw.get("input"), str):
        raise BadPayload("the job's payload has no 'input' text")
    return dict(raw)


async def execute(agent: Agent[Any], payload: dict[str, Any], resumed: bool) -> Reply[Any]:
    """Run one job. `resumed`: a worker started it before (and died): whatever it had
    applied is not applied again; an unfinished run is continued as `retry()` does."""
    if payload.get("serve") is not None:
        # A run created over HTTP: executed by the server's run code, which saves its
        # events where every `serve` process reads them (imported only when needed).
        from criogen_graph.serve._worker import execute_served

        return await execute_served(agent, payload, resumed)
    thread = agent.thread(payload["thread_id"], actor=payload.get("actor"))
    action = payload["action"]
    if resumed:
        done = await _continue(thread, payload)
        if done is not None:
            return done
    if action == "send":
        # The job's id is the run's: a worker taking over finds by it whether the send
        # was already applied.
        return await thread.send_as(
            payload["input"], state=payload.get("state"), run_id=payload["id"]
        )
    if action == "retry":
        return await thread.retry()
    expected = payload.get("expected")
    if action == "approve":
        return await thread.approve(expected=expected)
    if action == "reject":
        return await thread.reject(payload.get("message", "rejected"), expected=expected)
    return await thread.decide(payload.get("decisions") or {}, expected=expected)


async def _continue(thread: Thread[Any], payload: dict[str, Any]) -> Reply[Any] | None:
    """The job's effect as far as an earlier attempt got: None if it applied nothing
    (apply it now), else the finished or continued run's `Reply`."""
    entries = await thread.history(limit=1)
    if not entries:
        return None
    head = entries[0]
    action = payload["action"]
    own: str | None = None
    if action == "send":
        # Searched in the whole history: runs saved since (an interactive send while the
        # job waited for a worker) must not hide that this one was applied.
        own = head["id"] if head["run_id"] == payload["id"] else await _own(thread, payload)
        applied = own is not None
    elif action == "retry":
        applied = True
    else:
        asked = payload.get("asked")
        if asked is None and isinstance(payload.get("expected"), str):
            asked = payload["expected"]  # a payload from before `asked`
        applied = isinstance(asked, str) and head["id"] != asked
    if not applied:
        return None
    if own is not None and own != head["id"]:
        # Later runs followed this one: its own last checkpoint is its answer, if it
        # finished; a run cut off and then overtaken is not continued (that would apply
        # it after runs the user made since).
        if await _status_of(thread, own) != "completed":
            raise Superseded(
                f"background run {payload['id']} was interrupted (its worker died) and a "
                f"later run on thread {thread.id!r} came before it was taken over: it is "
                "not continued nor applied again; what it finished is in the thread"
            )
        return await thread.reply_at(own, payload["id"])
    if head["status"] in ("pending", "failed", "cancelled"):
        try:
            return await thread.retry()
        except ValidationError as exc:
            if exc.code != "nothing_to_retry":
                raise
            # An earlier attempt finished the run while this one waited for the lock.
            head = (await thread.history(limit=1))[0]
    return await thread.reply_at(head["id"], head["run_id"] or payload["id"])


async def _status_of(thread: Thread[Any], checkpoint_id: str) -> str | None:
    """The history status of one checkpoint of the thread."""
    from criogen_graph.thread import history_entry

    cfg: Any = {
        "configurable": {
            "thread_id": thread.id,
            "checkpoint_ns": "",
            "checkpoint_id": checkpoint_id,
        }
    }
    tup = await thread.agent.storage.checkpointer.aget_tuple(cfg)
    return None if tup is None else str(history_entry(tup)["status"])


class Superseded(Exception):
    """A run cut off by its worker's death that later runs overtook (`superseded`)."""


async def _own(thread: Thread[Any], payload: dict[str, Any]) -> str | None:
    """The newest checkpoint of the thread saved by the run `payload["id"]`, or None."""
    storage = thread.agent.storage
    await storage.backend()
    cfg: Any = {"configurable": {"thread_id": thread.id, "checkpoint_ns": ""}}
    async for tup in storage.checkpointer.alist(cfg, filter={"run_id": payload["id"]}, limit=1):
        return str(tup.config["configurable"]["checkpoint_id"])
    return None


def error_fields(agent: Agent[Any] | None, exc: BaseException) -> dict[str, Any]:
    """The fields of a failed run's record for `exc` (its message redacted by the
    agent's policy)."""
    from criogen_graph.redact import effective

    message = str(exc)
    redactor = effective(agent.spec.redact) if agent is not None else None
    if redactor is not None:
        message = redactor.redact(message)
    if isinstance(exc, BadPayload):
        code = "bad_payload"
    elif isinstance(exc, UnknownAgent):
        code = "unknown_agent"
    elif isinstance(exc, Superseded):
        code = "superseded"
    else:
        given = getattr(exc, "code", None)
        code = given if isinstance(given, str) and given != "error" else "run_failed"
    return {
        "error_code": code,
        "error_type": type(exc).__name__,
        "error": message[:2000],
    }


class UnknownAgent(Exception):
    """A job for an agent the worker does not serve (the run fails with `unknown_agent`)."""


def result_fields(reply: Reply[Any]) -> dict[str, Any]:
    """The fields of a finished run's record for its `reply`."""
    return {
        "run_id": reply.run_id,
        "checkpoint_id": reply.checkpoint_id,
        "stop_reason": reply.stop_reason,
        "needs_approval": reply.needs_approval,
    }


def worker_name() -> str:
    """`host:pid`, naming a worker in run records."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _now_ms() -> int:
    return int(time.time() * 1000)


# -- the in-process worker (memory:// and SQLite) ---------------------------------------


@dataclass
class _LocalRun:
    info: RunInfo
    done: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    reply: Reply[Any] | None = None
    #: Cancelled while queued: its task still waits for the run before it (the next run
    #: waits for this task), then ends without running.
    skipped: bool = False


class _LocalQueue:
    """Runs jobs as tasks of the submitting event loop; the jobs of one thread in order."""

    def __init__(self) -> None:
        self.runs: dict[str, _LocalRun] = {}
        self.tails: dict[str, asyncio.Task[None]] = {}

    async def submit(self, agent: Agent[Any], payload: dict[str, Any]) -> RunInfo:
        info = RunInfo(
            id=payload["id"],
            thread_id=payload["thread_id"],
            agent=payload["agent"],
            action=payload["action"],
            status=QUEUED,
            submitted_at_ms=_now_ms(),
        )
        run = _LocalRun(info)
        self.runs[info.id] = run
        previous = self.tails.get(info.thread_id)
        run.task = asyncio.get_running_loop().create_task(
            self._run(agent, payload, run, previous), name=f"criogen-run-{info.id}"
        )
        self.tails[info.thread_id] = run.task
        run.task.add_done_callback(lambda t: self._forget(info.thread_id, t))
        return info

    def _forget(self, thread_id: str, task: asyncio.Task[None]) -> None:
        if self.tails.get(thread_id) is task:
            del self.tails[thread_id]

    async def _run(
        self,
        agent: Agent[Any],
        payload: dict[str, Any],
        run: _LocalRun,
        previous: asyncio.Task[None] | None,
    ) -> None:
        try:
            if previous is not None:
                # In order, never together; the one before may fail or be cancelled.
                await asyncio.wait([previous])
            if run.skipped:
                return
            now = _now_ms()
            run.info = replace(
                run.info,
                status=RUNNING,
                attempts=run.info.attempts + 1,
                worker=worker_name(),
                started_at_ms=now,
                first_started_at_ms=run.info.first_started_at_ms or now,
            )
            reply = await execute(agent, payload, resumed=False)
            run.reply = reply
            run.info = replace(
                run.info, status=SUCCEEDED, finished_at_ms=_now_ms(), **result_fields(reply)
            )
        except asyncio.CancelledError:
            run.info = replace(run.info, status=CANCELLED, finished_at_ms=_now_ms())
            raise
        except Exception as exc:
            run.info = replace(
                run.info, status=FAILED, finished_at_ms=_now_ms(), **error_fields(agent, exc)
            )
        finally:
            run.done.set()

    async def info(self, run_id: str) -> RunInfo | None:
        run = self.runs.get(run_id)
        return run.info if run is not None else None

    async def cancel(self, run_id: str) -> bool:
        run = self.runs.get(run_id)
        if run is None or run.info.done or run.task is None:
            return False
        if run.info.status == QUEUED:
            # Not the task: cancelled, it would end before the run it waits for, and
            # the next run of the thread would start beside that one.
            run.skipped = True
            run.info = replace(run.info, status=CANCELLED, finished_at_ms=_now_ms())
            run.done.set()
            return True
        run.task.cancel()
        await asyncio.wait([run.task])
        return run.info.status == CANCELLED

    async def list(self, *, status: str | None, thread_id: str | None, limit: int) -> list[RunInfo]:
        out = [
            r.info
            for r in reversed(self.runs.values())
            if (status is None or r.info.status == status)
            and (thread_id is None or r.info.thread_id == thread_id)
        ]
        return out[:limit]

    async def local_reply(self, run_id: str) -> Reply[Any] | None:
        run = self.runs.get(run_id)
        return run.reply if run is not None else None

    async def wait(self, run_id: str) -> RunInfo:
        run = self.runs.get(run_id)
        if run is None:
            raise ValidationError(f"no background run {run_id!r}", code="unknown")
        await run.done.wait()
        return run.info


_LOCAL: weakref.WeakKeyDictionary[Storage, _LocalQueue] = weakref.WeakKeyDictionary()


async def _queue_for(storage: Storage) -> _Queue:
    if storage.scheme == "postgres":
        from criogen_graph.background.postgres import pg_queue

        return await pg_queue(storage)
    queue = _LOCAL.get(storage)
    if queue is None:
        queue = _LOCAL[storage] = _LocalQueue()
    return queue


class _LazyQueue:
    """A queue found on first use (a handle made outside an event loop)."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    async def _q(self) -> _Queue:
        return await _queue_for(self.storage)

    async def submit(self, agent: Agent[Any], payload: dict[str, Any]) -> RunInfo:
        return await (await self._q()).submit(agent, payload)

    async def info(self, run_id: str) -> RunInfo | None:
        return await (await self._q()).info(run_id)

    async def cancel(self, run_id: str) -> bool:
        return await (await self._q()).cancel(run_id)

    async def list(self, *, status: str | None, thread_id: str | None, limit: int) -> list[RunInfo]:
        return await (await self._q()).list(status=status, thread_id=thread_id, limit=limit)

    async def local_reply(self, run_id: str) -> Reply[Any] | None:
        return await (await self._q()).local_reply(run_id)

    async def wait(self, run_id: str) -> RunInfo:
        return await (await self._q()).wait(run_id)


# -- the queue's Python API -------------------------------------------------------------


def _check_status(status: str | None) -> None:
    if status is not None and status not in (QUEUED, RUNNING, *FINAL):
        raise ValidationError(
            f"status must be one of queued, running, succeeded, failed, cancelled; got {status!r}",
            code="invalid_value",
        )


async def list_runs(
    storage: Storage,
    *,
    status: str | None = None,
    thread_id: str | None = None,
    limit: int = 50,
) -> list[RunInfo]:
    """Background runs of `storage`, newest first (filter by `status`, `thread_id`)."""
    _check_status(status)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValidationError("limit must be a positive int", code="invalid_value")
    return await (await _queue_for(storage)).list(status=status, thread_id=thread_id, limit=limit)


async def get_run(storage: Storage, run_id: str) -> RunInfo | None:
    """One background run's record, or None."""
    return await (await _queue_for(storage)).info(run_id)


async def cancel_run(storage: Storage, run_id: str) -> bool:
    """Cancel a background run (see `RunHandle.cancel`)."""
    return await (await _queue_for(storage)).cancel(run_id)


async def close_runs(storage: Storage) -> None:
    """Close the queue connections this event loop opened for `storage` (PostgreSQL)."""
    if storage.scheme == "postgres":
        from criogen_graph.background.postgres import close_pg_queue

        await close_pg_queue(storage)


# -- the PostgreSQL worker --------------------------------------------------------------


class Worker:
    """Runs the background runs queued in a PostgreSQL storage (`criogen-graph worker`).

    `agents`: the agents whose threads it serves, found by `agent.name` (a job for an
    agent it does not have fails with `unknown_agent`; the worker goes on). `storage`:
    the PostgreSQL storage (default: the first agent's; a URL is opened with
    `on_busy="wait"`, so a run waits for a thread another process holds).
    `concurrency`: runs at once. Every `heartbeat_secs` the worker marks itself alive;
    a worker silent for `stalled_after_secs` is taken for dead and its runs are queued
    again, to be continued by whichever worker takes them.
    """

    def __init__(
        self,
        agents: Agent[Any] | Sequence[Agent[Any]],
        *,
        storage: Storage | str | None = None,
        concurrency: int = 4,
        heartbeat_secs: float = 2.0,
        stalled_after_secs: float = 10.0,
    ) -> None:
        from criogen_graph.agent import Agent

        listed = [agents] if isinstance(agents, Agent) else list(agents)
        if not listed or not all(isinstance(a, Agent) for a in listed):
            raise ValidationError("Worker takes an Agent or a list of Agents", code="invalid_type")
        _check_timing(heartbeat_secs, stalled_after_secs)
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValidationError("concurrency must be an int >= 1", code="invalid_value")
        storage = _worker_storage(storage if storage is not None else listed[0].storage)
        self.storage = storage
        self.agents: dict[str, Agent[Any]] = {}
        for agent in listed:
            if agent.name in self.agents:
                raise ValidationError(
                    f"two agents named {agent.name!r}: give each a distinct name=",
                    code="invalid_value",
                )
            self.agents[agent.name] = agent.with_storage(storage)
        self.concurrency = concurrency
        self.heartbeat_secs = float(heartbeat_secs)
        self.stalled_after_secs = float(stalled_after_secs)
        self.name = worker_name()

    async def run(self, *, install_signal_handlers: bool = False) -> None:
        """Serve until cancelled. With `install_signal_handlers`, SIGINT / SIGTERM stop
        it gracefully: no new job is taken and the running ones finish first."""
        from criogen_graph.background.postgres import run_worker

        await run_worker(self, install_signal_handlers=install_signal_handlers)


def _check_timing(heartbeat_secs: object, stalled_after_secs: object) -> None:
    for name, value in (
        ("heartbeat_secs", heartbeat_secs),
        ("stalled_after_secs", stalled_after_secs),
    ):
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ValidationError(f"{name} must be a number > 0", code="invalid_value")
    assert isinstance(heartbeat_secs, int | float) and isinstance(stalled_after_secs, int | float)
    if stalled_after_secs <= heartbeat_secs:
        raise ValidationError(
            "stalled_after_secs must be longer than heartbeat_secs (a live worker must "
            "not be taken for dead)",
            code="invalid_value",
        )


def _worker_storage(storage: Storage | str) -> Storage:
    """The PostgreSQL storage a worker serves (a URL opened with `on_busy="wait"`)."""
    from criogen_graph.storage import Storage

    if isinstance(storage, str):
        storage = Storage(storage, on_busy="wait")
    if storage.scheme != "postgres":
        raise ValidationError(
            f"a Worker serves a PostgreSQL storage, not {storage.scheme}:// (memory and "
            "SQLite run background runs in the submitting process)",
            code="invalid_value",
        )
    return storage
