"""The queue's API: `submit` a run (the payload checked, then queued in the storage's
queue: PostgreSQL's, or the in-process one of memory:// and SQLite), a `RunHandle` on
it, and `list_runs`, `get_run`, `cancel_run`, `close_runs`. `Thread.submit*` call it."""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast

from criogen_graph.background.jobs import (
    CANCELLED,
    FAILED,
    FINAL,
    QUEUED,
    RUNNING,
    RunInfo,
    make_payload,
)
from criogen_graph.background.local import LocalQueue
from criogen_graph.errors import CriogenError, ValidationError
from criogen_graph.results import Reply

if TYPE_CHECKING:
    from criogen_graph.agent import Agent
    from criogen_graph.messages import ErrorCode
    from criogen_graph.storage import Storage
    from criogen_graph.thread import Thread

__all__ = [
    "RunFailedError",
    "RunHandle",
    "cancel_run",
    "close_runs",
    "get_run",
    "handle",
    "list_runs",
    "submit",
    "submit_as",
]

Output = TypeVar("Output")


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
    payload = await make_payload(thread, action, **fields)
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
    payload = await make_payload(thread, action, **fields)
    payload.update(extra, id=run_id)
    queue = await _queue_for(thread.agent.storage)
    info = await queue.submit(thread.agent, payload)
    return RunHandle(thread, info.id, queue)


def handle(thread: Thread[Output], run_id: str) -> RunHandle[Output]:
    """A handle on an earlier background run of the storage (`thread.run(id)`)."""
    if not isinstance(run_id, str) or not run_id:
        raise ValidationError("a run id is a non-empty str", code="invalid_type")
    return RunHandle(thread, run_id, _LazyQueue(thread.agent.storage))


_LOCAL: weakref.WeakKeyDictionary[Storage, LocalQueue] = weakref.WeakKeyDictionary()


async def _queue_for(storage: Storage) -> _Queue:
    if storage.scheme == "postgres":
        from criogen_graph.background.postgres import pg_queue

        return await pg_queue(storage)
    queue = _LOCAL.get(storage)
    if queue is None:
        queue = _LOCAL[storage] = LocalQueue()
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
