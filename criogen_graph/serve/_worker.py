"""Runs created over HTTP, executed by a background worker (`criogen-graph serve
--workers external`): the same run code as a server process (`Runs`), so the run's
events are saved in PostgreSQL, numbered after those already there, and every `serve`
process streams them to its clients. A worker taking over the run of a dead one
continues it from its last saved step (no finished tool runs again) and goes on
numbering its events where the dead one stopped."""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableConfig

from criogen_graph.agent import Agent
from criogen_graph.results import Reply
from criogen_graph.serve._events_pg import PgEvents
from criogen_graph.serve._protocol import now_iso
from criogen_graph.serve._records import Records
from criogen_graph.serve._runs import Call, Runs
from criogen_graph.thread import Thread

__all__ = ["execute_served"]


async def execute_served(agent: Agent[Any], payload: dict[str, Any], resumed: bool) -> Reply[Any]:
    """Execute the job of a run created over HTTP; its `Reply` (raises its error)."""
    storage = agent.storage
    run_id, thread_id = str(payload["id"]), str(payload["thread_id"])
    thread = agent.thread(thread_id, actor=payload.get("actor"))
    records = Records(storage)
    record = await records.run(thread_id, run_id)
    if record is None:
        # The server saves the record before it queues the job; kept going regardless.
        now = now_iso()
        record = {
            "run_id": run_id,
            "thread_id": thread_id,
            "assistant_id": agent.name,
            "created_at": now,
            "updated_at": now,
            "status": "pending",
            "metadata": {},
            "multitask_strategy": "enqueue",
            "kwargs": {},
        }
    modes = frozenset((record.get("kwargs") or {}).get("stream_mode") or ["values"])
    await storage.backend()
    store = await storage.get_store() if agent.spec.memory is not None else None
    graph = agent.thread_graph(storage, store)
    config: RunnableConfig = {"configurable": {"thread_id": thread_id}}

    async def read_state() -> tuple[dict[str, Any], list[Any]]:
        snap = await graph.aget_state(config)
        return dict(snap.values or {}), list(snap.interrupts or ())

    events = PgEvents(storage, lambda run_id: None)
    await events.open(listen=False)
    try:
        after, attempts = await events.progress(run_id)
        runs = Runs(records)
        runs.events = events
        call = await _call(thread, payload, resumed)
        before, _ = await read_state()
        # Saved, so every server process shows it running (and not lost) at once.
        record.update(status="running", updated_at=now_iso())
        await records.put_run(record)
        run = await runs.execute(
            record, modes, call, before, read_state, after=after, attempt=attempts + 1
        )
    finally:
        await events.close()
    if run.error is not None:
        raise run.error
    if isinstance(run.reply, Reply):
        return run.reply
    head = (await thread.history(limit=1))[0]
    return await thread.reply_at(head["id"], head["run_id"] or run_id)


async def _call(thread: Thread[Any], payload: dict[str, Any], resumed: bool) -> Call:
    """The Thread call the job asks for; for a job another worker started (and died),
    what is left of it: nothing, a retry of its unfinished run, or all of it."""
    action = payload["action"]
    if resumed:
        entries = await thread.history(limit=1)
        head = entries[0] if entries else None
        if head is not None and _applied(head, payload):
            if head["status"] in ("pending", "failed", "cancelled"):
                return thread.stream_retry
            return lambda: None
    expected = payload.get("expected")
    if action == "send":
        return lambda: thread.stream_as(
            payload["input"], state=payload.get("state"), run_id=payload["id"]
        )
    if action == "retry":
        return thread.stream_retry
    if action == "approve":
        return lambda: thread.stream_approve(expected=expected)
    if action == "reject":
        return lambda: thread.stream_reject(payload.get("message", "rejected"), expected=expected)
    decisions = payload.get("decisions") or {}
    return lambda: thread.stream_decide(decisions, expected=expected)


def _applied(head: dict[str, Any], payload: dict[str, Any]) -> bool:
    """The dead worker had applied the job (its run is in the thread's history)."""
    action = payload["action"]
    if action == "send":
        return bool(head["run_id"] == payload["id"])
    if action == "retry":
        return True
    pin = payload.get("expected")
    return isinstance(pin, str) and head["id"] != pin
