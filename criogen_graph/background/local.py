"""The in-process queue of background runs (memory:// and SQLite): jobs run as tasks of
the submitting event loop, the jobs of one thread in order; it lives as long as the
process."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from criogen_graph.background.jobs import (
    CANCELLED,
    FAILED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    RunInfo,
    error_fields,
    execute,
    now_ms,
    result_fields,
    worker_name,
)
from criogen_graph.errors import ValidationError

if TYPE_CHECKING:
    from criogen_graph.agent import Agent
    from criogen_graph.results import Reply

__all__ = ["LocalQueue"]


@dataclass
class LocalRun:
    info: RunInfo
    done: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    reply: Reply[Any] | None = None
    #: Cancelled while queued: its task still waits for the run before it (the next run
    #: waits for this task), then ends without running.
    skipped: bool = False


class LocalQueue:
    """Runs jobs as tasks of the submitting event loop; the jobs of one thread in order."""

    def __init__(self) -> None:
        self.runs: dict[str, LocalRun] = {}
        self.tails: dict[str, asyncio.Task[None]] = {}

    async def submit(self, agent: Agent[Any], payload: dict[str, Any]) -> RunInfo:
        info = RunInfo(
            id=payload["id"],
            thread_id=payload["thread_id"],
            agent=payload["agent"],
            action=payload["action"],
            status=QUEUED,
            submitted_at_ms=now_ms(),
        )
        run = LocalRun(info)
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
        run: LocalRun,
        previous: asyncio.Task[None] | None,
    ) -> None:
        try:
            if previous is not None:
                # In order, never together; the one before may fail or be cancelled.
                await asyncio.wait([previous])
            if run.skipped:
                return
            now = now_ms()
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
                run.info, status=SUCCEEDED, finished_at_ms=now_ms(), **result_fields(reply)
            )
        except asyncio.CancelledError:
            run.info = replace(run.info, status=CANCELLED, finished_at_ms=now_ms())
            raise
        except Exception as exc:
            run.info = replace(
                run.info, status=FAILED, finished_at_ms=now_ms(), **error_fields(agent, exc)
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
            run.info = replace(run.info, status=CANCELLED, finished_at_ms=now_ms())
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
