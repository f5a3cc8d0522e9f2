"""A thread's history, read from its checkpoints: one entry per checkpoint
(`history_entry`), with the status a person reads (suspended, pending, cancelled,
failed, completed). Read by `Thread.history()` and by a worker taking a run over."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from langgraph.checkpoint.base import CheckpointTuple

from criogen_graph.runtime.runner import ERROR, INTERRUPT, checkpoint_version

__all__ = ["history_entry"]


def _ms(ts: str | None) -> int | None:
    if not ts:
        return None
    return int(datetime.fromisoformat(ts).timestamp() * 1000)


def _error_type(error: Any) -> str:
    """The type name of a saved task error (savers keep its repr: `Name("message")`),
    not its message, which may well mention a cancellation."""
    if isinstance(error, BaseException):
        return type(error).__name__
    return str(error).lstrip("'\"").split("(", 1)[0]


def history_entry(tup: CheckpointTuple) -> dict[str, Any]:
    """One entry of `Thread.history()` for checkpoint `tup`: `{id, parent_id, version,
    source, status, run_id, step, created_at_ms}`."""
    meta = tup.metadata or {}
    parent = tup.parent_config
    return {
        "id": tup.config["configurable"]["checkpoint_id"],
        "parent_id": parent["configurable"]["checkpoint_id"] if parent else None,
        "version": checkpoint_version(meta),
        "source": meta.get("source"),
        "status": _status(tup),
        "run_id": meta.get("run_id"),
        "step": meta.get("step"),
        "created_at_ms": _ms(tup.checkpoint.get("ts")),
    }


def _status(tup: CheckpointTuple) -> str:
    """A checkpoint's status in the history: suspended, pending, cancelled, failed or
    completed."""
    writes = tup.pending_writes or ()
    errors = [w[2] for w in writes if w[1] == ERROR]
    if any(w[1] == INTERRUPT for w in writes):
        return "suspended"
    if errors:
        # A failing call cancels the other calls of its step: the failure is the story.
        return "cancelled" if all("Cancelled" in _error_type(e) for e in errors) else "failed"
    if (tup.metadata or {}).get("source") == "input":
        return "pending"  # the values before an input: its run has not saved a step
    run = tup.checkpoint["channel_values"].get("run") or {}
    return "completed" if run.get("stop_reason") is not None else "pending"
