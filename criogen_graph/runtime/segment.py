"""The run segment as the savers see it: what one segment (a send, an approval answer, a
retry, ...) of a run on one thread writes through our storage, handed to the savers in
a context variable (`SEGMENT`) that `runtime.runner` sets around the graph's
invocation. The savers (`storage/base.py`) attach the segment's audit records to its
first write, hold writes back, and `Backend.settle` saves what a cancelled run left
(`hand_over`)."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SEGMENT", "Segment", "SegmentSaver", "hand_over", "segment_for"]


@dataclass(slots=True)
class Segment:
    """A run segment (send, approve, retry, ...) writing to one thread.

    The saver attaches `audit` (the action's records) to the segment's first write, in the
    same transaction, and records every tool call as its result is saved, so the audit
    trail never disagrees with the checkpoints, whatever crashes. `last_config` is the
    last checkpoint the segment saved.
    """

    thread_id: str
    run_id: str
    actor: str | None
    audit: list[dict[str, Any]] = field(default_factory=list)
    last_config: dict[str, Any] | None = None
    last_step: int | None = None
    #: The head as the segment read it before the run; LangGraph's own first read of
    #: the head in the same segment gets it instead of asking the database again.
    head: Any = None
    head_cached: bool = False
    #: Metadata to add to each checkpoint the segment saves (a rewind's copy, which
    #: LangGraph saves without the caller's config metadata).
    put_metadata: dict[str, Any] | None = None
    #: Writes a saver held back to save with the run's next write (see `may_wait`), in
    #: the saver's own form; whatever is left when the segment ends is flushed then.
    deferred: list[Any] = field(default_factory=list)
    #: Tool results handed over to LangGraph whose write is not saved yet, by task id:
    #: `(config, writes, task_path)` as the saver takes them (see `hand_over`).
    handed: dict[str, tuple[Any, list[tuple[str, Any]], str]] = field(default_factory=dict)
    #: Saver calls of the segment in flight (LangGraph runs them in tasks of their own).
    writing: set[asyncio.Future[Any]] = field(default_factory=set)
    #: Set once the segment settled (see `Backend.settle`): it writes nothing more.
    closed: bool = False
    #: A saver that holds writes back: the timer that saves them if no write of the run
    #: comes first (see `HOLD_BACK_SECS`), and that save while it is in flight.
    behind: asyncio.TimerHandle | None = None
    flushing: asyncio.Future[None] | None = None

    def holds_writes(self) -> bool:
        """Whether writes of the segment are held back or being saved behind it, so the
        backend's `flush_deferred` still has to run before the lock goes."""
        return bool(self.deferred) or self.behind is not None or self.flushing is not None


SEGMENT: contextvars.ContextVar[Segment | None] = contextvars.ContextVar(
    "criogen_segment", default=None
)


def segment_for(thread_id: str) -> Segment | None:
    seg = SEGMENT.get()
    return seg if seg is not None and seg.thread_id == thread_id else None


def hand_over(
    thread_id: str, task_id: str, config: Any, writes: list[tuple[str, Any]], task_path: str
) -> None:
    """Note a tool result handed over to LangGraph (the `writes` of task `task_id`, to be
    saved with `config`), so that `Backend.settle` saves it if the run is cancelled
    before LangGraph does: LangGraph does not always save a cancelled task's writes (a
    step of one task runs inline, and a cancellation there drops them)."""
    seg = segment_for(thread_id)
    if seg is not None and not seg.closed:
        seg.handed[task_id] = (config, writes, task_path)


class SegmentSaver:
    """A saver of our storage: it writes each segment's audit records with its
    checkpoints. For runs LangGraph drives on it without our `Thread` (see
    `graph.compiled.AgentGraph`), `audit_writer` writes them to the storage's table
    (set when the storage opens it)."""

    audit_writer: Callable[[list[dict[str, Any]]], Awaitable[None]] | None = None
