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

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from criogen_graph.background.jobs import RunInfo, worker_name
from criogen_graph.background.runs import (
    RunFailedError,
    RunHandle,
    cancel_run,
    close_runs,
    get_run,
    list_runs,
)

# What `serve` calls, importable here as before (not public API).
from criogen_graph.background.runs import handle as handle
from criogen_graph.background.runs import submit as submit
from criogen_graph.background.runs import submit_as as submit_as
from criogen_graph.errors import ValidationError

if TYPE_CHECKING:
    from criogen_graph.agent import Agent
    from criogen_graph.storage import Storage

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
