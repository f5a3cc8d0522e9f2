"""What every storage backend shares: the run segment that writes through its saver, the
audit records that ride along with checkpoint writes, and the backend interface."""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple

from criogen_graph.audit import record, tool_call_details
from criogen_graph.redact import CURRENT
from criogen_graph.runtime.segment import Segment, SegmentSaver, segment_for
from criogen_graph.storage._driver_internals import store_batch_task

#: The tasks whose writes a saver may hold back until the checkpoint that closes their
#: step, to save both in one round trip: the graph's entry and the model node. Neither
#: has side effects, so a crash in between costs at most a repeated model call, exactly
#: as a crash just before the write would. Tool results (and interrupts) are always
#: saved the moment their task finishes, so a finished tool call is never run again.
DEFERRABLE_TASKS = frozenset({"~__pregel_pull, __start__", "~__pregel_pull, model"})

#: The channels that start a node of the agent graph's next step, besides the ones named
#: "branch:to:<node>": a checkpoint that updates one of them (or any channel that looks
#: like a trigger) may be followed by a node with side effects.
_PURE_NEXT = frozenset({"branch:to:model", "__start__"})


def _quiet_next(checkpoint: Any) -> bool:
    """Whether the step after `checkpoint` (of the agent graph) runs at most the model:
    every channel it updated is a state channel or starts the model or the entry.
    Anything else (tools sent as tasks, a join, a checkpoint of an older format without
    `updated_channels`) counts as possibly having side effects."""
    updated = checkpoint.get("updated_channels")
    if updated is None:
        return False
    return all(
        c in _PURE_NEXT or not (c.startswith("__") or ":" in c or c.startswith("branch"))
        for c in updated
    )


def _input_task(configurable: Any) -> str | None:
    """The task id under which LangGraph writes a new input to the head it starts from
    (a `DeltaChannel` reads it from there)."""
    from uuid import UUID, uuid5

    checkpoint_id = configurable.get("checkpoint_id")
    if not checkpoint_id:
        return None
    try:
        return str(uuid5(UUID(checkpoint_id), "__input__"))
    except ValueError:
        return None


def may_wait(checkpoint: Any, metadata: Any) -> bool:
    """Whether a top-level checkpoint of a run may wait for the run's next write: the
    checkpoint of a new input (the one applying it follows at once), or one whose next
    step is a model call or nothing (no side effects before the next write)."""
    return bool(metadata.get("source") == "input") or _quiet_next(checkpoint)


def writes_may_wait(configurable: Any, task_id: str, task_path: str) -> bool:
    """Whether a top-level task's writes may wait for the checkpoint that closes their
    step: the entry's, the model's (`DEFERRABLE_TASKS`) and a new input's."""
    return task_path in DEFERRABLE_TASKS or (not task_path and task_id == _input_task(configurable))


#: The longest a write may be held back before it is saved on its own. What waits is a
#: send's input (the user's message) while the first model call runs, and a run's last
#: checkpoint until its lock is given back: a model that answers within this time costs
#: no round trip of its own, and a real model call (hundreds of milliseconds) finds the
#: input saved long before it answers, so a process killed during it keeps the message.
HOLD_BACK_SECS = 0.05


#: LangGraph's write channel for the exception that failed a task.
ERROR_CHANNEL = "__error__"


def redacted_errors(writes: Sequence[tuple[str, Any]]) -> Sequence[tuple[str, Any]]:
    """A task's writes with the exception that failed it (if any) as the run's policy
    redacts it. LangGraph saves such an exception as its `repr`, message included (a
    tool's, a hook's, a provider's error text): the same text is saved, redacted."""
    redactor = CURRENT.get()
    if redactor is None or all(channel != ERROR_CHANNEL for channel, _ in writes):
        return writes
    return [
        (channel, redactor.redact(repr(value)))
        if channel == ERROR_CHANNEL and isinstance(value, BaseException)
        else (channel, value)
        for channel, value in writes
    ]


class writing:  # used like a function: `with writing(seg) as ok:`
    """Around a saver write of `seg`: `ok` is False when the segment is closed (the write
    must be dropped), else the write is tracked while in flight; a write that succeeds
    for `task_id` is no longer owed by `settle`. (A class: a saver write is hot.)"""

    __slots__ = ("_seg", "_task", "_task_id")

    def __init__(self, seg: Segment | None, task_id: str | None = None) -> None:
        self._seg = seg
        self._task_id = task_id
        self._task: asyncio.Future[Any] | None = None

    def __enter__(self) -> bool:
        seg = self._seg
        if seg is None:
            return True
        if seg.closed:
            logging.getLogger("criogen_graph").warning(
                "a write of run %s on thread %r arrived after the run ended; dropped",
                seg.run_id,
                seg.thread_id,
            )
            return False
        task = self._task = asyncio.current_task()
        if task is not None:
            seg.writing.add(task)
        return True

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        seg = self._seg
        if seg is None or self._task is None:
            return
        seg.writing.discard(self._task)
        if exc_type is None and self._task_id is not None:
            seg.handed.pop(self._task_id, None)


def records_for_writes(
    seg: Segment | None, writes: Sequence[tuple[str, Any]]
) -> list[dict[str, Any]]:
    """The audit records to save with a task's writes: the segment's pending action
    records (once) and one record per tool call answered in these writes."""
    if seg is None:
        return []
    out, seg.audit = seg.audit, []
    for channel, value in writes:
        if channel != "messages":
            continue
        items = value if isinstance(value, tuple | list) else (value,)
        for m in items:
            if isinstance(m, dict) and m.get("role") == "tool":
                out.append(
                    record(
                        "tool_call",
                        seg.thread_id,
                        run_id=seg.run_id,
                        actor=seg.actor,
                        **tool_call_details(m),
                    )
                )
    return out


def cached_head(config: Any) -> tuple[bool, Any]:
    """`(True, tuple)` when the running segment already read this thread's head (once)."""
    configurable = config.get("configurable") or {}
    if configurable.get("checkpoint_id") or configurable.get("checkpoint_ns"):
        return False, None
    seg = segment_for(str(configurable.get("thread_id")))
    if seg is None or not seg.head_cached:
        return False, None
    seg.head_cached = False
    head, seg.head = seg.head, None
    return True, head


def segment_metadata(thread_id: str, metadata: Any) -> Any:
    """`metadata` with what the running segment adds to its checkpoints."""
    seg = segment_for(thread_id)
    if seg is None or not seg.put_metadata:
        return metadata
    return {**metadata, **seg.put_metadata}


def records_for_put(
    seg: Segment | None, config: dict[str, Any], metadata: Any
) -> list[dict[str, Any]]:
    """The pending action records to save with a checkpoint; remembers the checkpoint."""
    if seg is None:
        return []
    seg.last_config = config
    seg.last_step = int(metadata.get("step", 0)) if metadata else None
    out, seg.audit = seg.audit, []
    return out


class TranscriptCache:
    """The channel values at the latest checkpoint this process saved for a thread, so the
    next run does not rebuild its transcript from the database (a `DeltaChannel` replays
    its writes on every read). A checkpoint's values never change, and another process's
    writes make new checkpoint ids, so a hit is always right. Bounded (LRU by thread)."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._data: OrderedDict[str, tuple[str, dict[str, Any]]] = OrderedDict()
        # One cache serves the backends of every event loop (OS thread) of a storage.
        self._mutex = threading.Lock()

    def remember(self, thread_id: str, checkpoint_id: str, values: Mapping[str, Any]) -> None:
        with self._mutex:
            self._data[thread_id] = (checkpoint_id, dict(values))
            self._data.move_to_end(thread_id)
            while len(self._data) > self.size:
                self._data.popitem(last=False)

    def forget(self, thread_id: str) -> None:
        with self._mutex:
            self._data.pop(thread_id, None)

    def history(self, config: Any, channels: Sequence[str]) -> dict[str, Any] | None:
        """A `get_delta_channel_history` answer from the cache, or None."""
        configurable = config.get("configurable") or {}
        if configurable.get("checkpoint_ns"):
            return None
        entry = self._data.get(str(configurable.get("thread_id")))
        if entry is None or entry[0] != configurable.get("checkpoint_id"):
            return None
        values = entry[1]
        if not all(ch in values for ch in channels):
            return None
        return {ch: {"seed": values[ch], "writes": []} for ch in channels}


#: What to use instead of the `BaseCheckpointSaver` methods our savers do not offer.
NOT_OFFERED = {
    "copy_thread": "copying a thread's checkpoints is not offered by criogen_graph's savers "
    "(it would copy around the thread's lock and audit trail): start the new thread from "
    "the messages of the old one (`await thread.messages()`), or go back in the same "
    "thread with `await thread.rewind(checkpoint_id)`",
    "delete_for_runs": "deleting the checkpoints of single runs is not offered by "
    "criogen_graph's savers (a thread's checkpoints build on each other): delete the whole "
    "thread with `await agent.thread(thread_id).delete()` or "
    "`await checkpointer.adelete_thread(thread_id)`, or go back to a checkpoint before the "
    "run with `await thread.rewind(checkpoint_id)`",
    "prune": "pruning old checkpoints is offered only by criogen_graph's PostgreSQL saver: "
    "delete a whole thread with `await agent.thread(thread_id).delete()` or "
    "`await checkpointer.adelete_thread(thread_id)`",
}


def not_offered(method: str) -> NotImplementedError:
    """The error of a `BaseCheckpointSaver` method our savers do not offer, saying what to
    use instead (LangGraph's base raises a bare `NotImplementedError`)."""
    return NotImplementedError(NOT_OFFERED[method])


class SaverMixin(SegmentSaver):
    """What our savers add to LangGraph's: the transcript cache in front of the
    `DeltaChannel` history, and audit rows serialized like checkpoint payloads (so an
    encryption key covers them too). Put it first among the bases.

    `copy_thread` and `delete_for_runs` (sync and async) raise a `NotImplementedError`
    that says what to use instead; so does `prune` except on PostgreSQL."""

    transcripts: TranscriptCache
    serde: Any
    #: Writes audit records to the storage's table (set when the storage opens it), for
    #: runs LangGraph drives on this saver without our `Thread` (see `graph.compiled.AgentGraph`).
    audit_writer: Callable[[list[dict[str, Any]]], Awaitable[None]] | None = None

    async def aget_delta_channel_history(self, *, config: Any, channels: Sequence[str]) -> Any:
        hit = self.transcripts.history(config, channels)
        if hit is not None:
            return hit
        return await super().aget_delta_channel_history(  # type: ignore[misc]
            config=config, channels=channels
        )

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        raise not_offered("copy_thread")

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        raise not_offered("copy_thread")

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        raise not_offered("delete_for_runs")

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        raise not_offered("delete_for_runs")

    async def write_held(self, seg: Segment, parts: list[Any]) -> None:
        """Save writes held back for `seg` (`parts`, in the saver's own form) on their
        own; only savers that hold writes back implement it."""
        raise NotImplementedError

    def hold_back(self, seg: Segment, parts: Sequence[Any]) -> None:
        """Keep `parts` for the run's next write, and save them on their own if none
        comes within `HOLD_BACK_SECS`."""
        seg.deferred.extend(parts)
        if seg.behind is None and seg.flushing is None:
            seg.behind = asyncio.get_running_loop().call_later(
                HOLD_BACK_SECS, self._write_behind, seg
            )

    def _write_behind(self, seg: Segment) -> None:
        seg.behind = None
        if seg.closed or seg.flushing is not None or not seg.deferred:
            return
        parts, seg.deferred = seg.deferred, []
        task = asyncio.ensure_future(self._write_held(seg, parts))
        seg.flushing = task
        seg.writing.add(task)
        task.add_done_callback(seg.writing.discard)

    async def _write_held(self, seg: Segment, parts: list[Any]) -> None:
        try:
            await self.write_held(seg, parts)
        except BaseException:
            # Kept for the run's failure record (`Backend.settle`), which tries again.
            seg.deferred[:0] = parts
            raise

    async def behind(self, seg: Segment | None) -> None:
        """Before a write of `seg`: stop its timer, and let the held-back writes it
        started saving land first (their failure is the write's own)."""
        if seg is None:
            return
        if seg.behind is not None:
            seg.behind.cancel()
            seg.behind = None
        flushing = seg.flushing
        if flushing is not None and flushing is not asyncio.current_task():
            try:
                await asyncio.shield(flushing)
            finally:
                if flushing.done():
                    seg.flushing = None

    def audit_rows(self, records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        """Rows `(thread_id, ts_ns, run_id, actor, action, type, details)`."""
        rows = []
        for r in records:
            typ, blob = self.serde.dumps_typed(r["details"])
            rows.append(
                (r["thread_id"], r["ts_ns"], r["run_id"], r["actor"], r["action"], typ, blob)
            )
        return rows

    def audit_record(self, row: Sequence[Any]) -> dict[str, Any]:
        """A record from a row `(id, thread_id, ts_ns, run_id, actor, action, type, details)`."""
        rid, thread_id, ts_ns, run_id, actor, action, typ, blob = row
        return {
            "id": rid,
            "thread_id": thread_id,
            "ts_ms": int(ts_ns) // 1_000_000,
            "run_id": run_id,
            "actor": actor,
            "action": action,
            "details": self.serde.loads_typed((typ, bytes(blob))),
        }


def checkpoint_config(thread_id: Any, checkpoint_ns: str, checkpoint_id: Any) -> RunnableConfig:
    """The config naming one checkpoint of a thread."""
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
        }
    }


def checkpoint_tuple(
    thread_id: Any,
    checkpoint_ns: str,
    checkpoint_id: Any,
    parent_id: Any,
    checkpoint: Any,
    metadata: Any,
    pending_writes: Any,
) -> CheckpointTuple:
    """The `CheckpointTuple` of a checkpoint read from a table, with its parent's config
    (none for a thread's first checkpoint)."""
    return CheckpointTuple(
        checkpoint_config(thread_id, checkpoint_ns, checkpoint_id),
        checkpoint,
        metadata,
        checkpoint_config(thread_id, checkpoint_ns, parent_id) if parent_id else None,
        pending_writes,
    )


def audit_query(
    thread_id: str | None, limit: int | None, param: str
) -> tuple[str, tuple[Any, ...]]:
    """The SQL reading audit records, newest first (`param` is the driver's placeholder).
    Records are stamped when they are made; writes of concurrent tasks may land in
    another order, so the stamp orders them."""
    sql = "SELECT id, thread_id, ts_ns, run_id, actor, action, type, details FROM criogen_audit"
    params: tuple[Any, ...] = ()
    if thread_id is not None:
        sql += f" WHERE thread_id = {param}"
        params = (thread_id,)
    sql += " ORDER BY ts_ns DESC, id DESC"
    if limit:
        sql += f" LIMIT {int(limit)}"
    return sql, params


_IMPORTING = threading.Lock()


def import_once(*modules: str) -> None:
    """Import `modules` (a backend's drivers, on first use) one OS thread at a time.
    Storages opened at once on several threads would otherwise import them concurrently,
    and Python's import machinery then hands one of them a half-initialised module
    (`ImportError: cannot import name ...`) when the package imports itself in a cycle,
    as psycopg does. Once imported, this is a dictionary lookup per module."""
    if all(m in sys.modules for m in modules):
        return
    with _IMPORTING:
        for m in modules:
            importlib.import_module(m)


#: The meta key of a storage's encryption claim (see `Backend.claim_encryption`).
ENCRYPTION_CLAIM = "encryption"
#: Where storages kept the key check before claims existed (encrypted ones only).
LEGACY_KEY_CHECK = "encryption_check"
#: The claim of a storage first opened without a key.
UNENCRYPTED = b"unencrypted"


def adopt_claim(
    current: bytes | None, legacy: bytes | None, claim: bytes, has_data: bool
) -> tuple[bytes | None, bool]:
    """What `claim_encryption` decides from the stored claim and key check (read in its
    transaction): `(the claim that holds, or None; whether to record it)`. A storage
    from before claims existed keeps what it was: encrypted if it has a key check, else
    unencrypted once it holds data (`has_data`, needed only when neither is stored),
    which an encrypted claim may not change (None: its threads would stay in the clear,
    mixed with encrypted ones)."""
    if current is not None:
        return current, False
    if legacy is not None:
        return legacy, True
    if claim != UNENCRYPTED and has_data:
        return None, False
    return claim, True


#: Makes the `delete` audit record from what the deletion found: `(existed,
#: audit_records_deleted) -> record`.
MakeRecord = Callable[[bool, int], dict[str, Any]]


class Backend:
    """A storage backend: a LangGraph checkpointer plus locks and the audit trail."""

    saver: BaseCheckpointSaver[Any]
    #: The LangGraph store (memory facts, collections), once `open_store()` ran.
    store: Any = None
    #: Cross-process lock hooks (None: in-process locks are enough). Both are exact under
    #: cancellation: `try_lock` takes the lock or leaves it (a lock taken as the caller
    #: was cancelled is given back before the cancellation is raised), and `unlock` runs
    #: to its end.
    try_lock: Callable[[str], Awaitable[bool]] | None = None
    unlock: Callable[[str], Awaitable[None]] | None = None

    async def open(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def open_store(self) -> Any:
        """Open (once) and return the backend's LangGraph store."""
        raise NotImplementedError

    def drop_store(self) -> None:
        """Let go of the store, stopping its background batching task: LangGraph's
        database stores do not stop it themselves when their connection closes."""
        task = store_batch_task(self.store)
        if task is not None:
            task.cancel()
        self.store = None

    async def write_audit(self, records: list[dict[str, Any]]) -> None:
        raise NotImplementedError

    async def flush_deferred(self, seg: Segment) -> None:
        """Save the writes the saver held back for `seg` (none unless it defers)."""
        seg.deferred = []

    async def settle(self, seg: Segment) -> None:
        """After a run of `seg` stopped (cancelled or failed) and before its lock is
        released: wait for its writes still in flight, save the tool results handed
        over that LangGraph did not save, and close the segment (a later write of it is
        dropped), so a finished call is saved before anyone can run the thread again."""
        me = asyncio.current_task()
        while True:
            # Writes LangGraph scheduled as the run unwound start within an iteration.
            await asyncio.sleep(0)
            pending = [t for t in seg.writing if t is not me and not t.done()]
            if not pending:
                break
            await asyncio.wait(pending)
        for task_id, (config, writes, task_path) in list(seg.handed.items()):
            await self.saver.aput_writes(config, writes, task_id, task_path)
            seg.handed.pop(task_id, None)
        seg.closed = True

    async def read_audit(self, thread_id: str | None, limit: int | None) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def delete_audit(self, thread_id: str) -> int:
        raise NotImplementedError

    async def delete_thread(self, thread_id: str, make_record: MakeRecord, *, audit: bool) -> bool:
        """Delete the thread (its checkpoints, pending writes and whatever else the
        backend keeps of it; with `audit`, its audit records too) and save the audit
        record `make_record(existed, audit_records_deleted)`, all in one transaction: a
        crash at any point leaves the thread whole and unrecorded, or gone and recorded
        once. Returns whether the thread had a checkpoint."""
        raise NotImplementedError

    async def thread_ids(self) -> list[str]:
        raise NotImplementedError

    async def claim_encryption(self, claim: bytes) -> bytes | None:
        """The storage's encryption claim (`UNENCRYPTED`, or a key check sealed with the
        key), recorded as `claim` if it has none yet, in one transaction: of openers
        racing on a fresh storage, exactly one claim is recorded and every opener gets
        that one back (see `adopt_claim` for storages written before claims existed:
        None when `claim` is encrypted and the storage already holds unencrypted data).
        An encrypted claim is also kept as the key check, which older versions read."""
        raise NotImplementedError

    def abandon(self) -> None:
        """Let go of the connections of an event loop that closed without closing this
        backend (no await possible any more): close what can be closed from here."""
