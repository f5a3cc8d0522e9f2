"""What every storage backend shares: the run segment that writes through its saver, the
audit records that ride along with checkpoint writes, and the backend interface."""

from __future__ import annotations

import contextvars
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver


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
    #: Writes a saver held back to save in one statement with the next checkpoint (see
    #: `DEFERRABLE_TASKS`); whatever is left when the segment ends is flushed then.
    deferred: list[tuple[str, str, list[tuple[Any, ...]]]] = field(default_factory=list)


#: The tasks whose writes a saver may hold back until the checkpoint that closes their
#: step, to save both in one round trip: the graph's entry and the model node. Neither
#: has side effects, so a crash in between costs at most a repeated model call, exactly
#: as a crash just before the write would. Tool results (and interrupts) are always
#: saved the moment their task finishes, so a finished tool call is never run again.
DEFERRABLE_TASKS = frozenset({"~__pregel_pull, __start__", "~__pregel_pull, model"})


SEGMENT: contextvars.ContextVar[Segment | None] = contextvars.ContextVar(
    "criogen_segment", default=None
)


def now_ns() -> int:
    return time.time_ns()


def record(
    action: str,
    thread_id: str,
    *,
    run_id: str | None,
    actor: str | None,
    **details: Any,
) -> dict[str, Any]:
    """One audit record. `ts_ns` orders records made in the same millisecond."""
    ns = now_ns()
    return {
        "ts_ms": ns // 1_000_000,
        "ts_ns": ns,
        "thread_id": thread_id,
        "run_id": run_id,
        "actor": actor,
        "action": action,
        "details": details,
    }


def segment_for(thread_id: str) -> Segment | None:
    seg = SEGMENT.get()
    return seg if seg is not None and seg.thread_id == thread_id else None


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
                details: dict[str, Any] = {
                    "call_id": m.get("tool_call_id"),
                    "tool": m.get("name"),
                    "status": m.get("status"),
                }
                if "tool" in m:
                    details["ran_as"] = m["tool"]
                for key in ("changed_by", "decision", "error_kind"):
                    if key in m:
                        details[key] = m[key]
                out.append(
                    record(
                        "tool_call", seg.thread_id, run_id=seg.run_id, actor=seg.actor, **details
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

    def remember(self, thread_id: str, checkpoint_id: str, values: Mapping[str, Any]) -> None:
        self._data[thread_id] = (checkpoint_id, dict(values))
        self._data.move_to_end(thread_id)
        while len(self._data) > self.size:
            self._data.popitem(last=False)

    def forget(self, thread_id: str) -> None:
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


class SaverMixin:
    """What our savers add to LangGraph's: the transcript cache in front of the
    `DeltaChannel` history, and audit rows serialized like checkpoint payloads (so an
    encryption key covers them too). Put it first among the bases."""

    transcripts: TranscriptCache
    serde: Any

    async def aget_delta_channel_history(self, *, config: Any, channels: Sequence[str]) -> Any:
        hit = self.transcripts.history(config, channels)
        if hit is not None:
            return hit
        return await super().aget_delta_channel_history(  # type: ignore[misc]
            config=config, channels=channels
        )

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


class Backend:
    """A storage backend: a LangGraph checkpointer plus locks and the audit trail."""

    saver: BaseCheckpointSaver[Any]
    #: The LangGraph store (memory facts, collections), once `open_store()` ran.
    store: Any = None
    #: Cross-process lock hooks (None: in-process locks are enough).
    try_lock: Callable[[str], Awaitable[bool]] | None = None
    unlock: Callable[[str], Awaitable[None]] | None = None

    async def open(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def open_store(self) -> Any:
        """Open (once) and return the backend's LangGraph store."""
        raise NotImplementedError

    async def write_audit(self, records: list[dict[str, Any]]) -> None:
        raise NotImplementedError

    async def flush_deferred(self, seg: Segment) -> None:
        """Save the writes the saver held back for `seg` (none unless it defers)."""
        seg.deferred = []

    async def read_audit(self, thread_id: str | None, limit: int | None) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def delete_audit(self, thread_id: str) -> int:
        raise NotImplementedError

    async def thread_ids(self) -> list[str]:
        raise NotImplementedError

    async def get_meta(self, key: str) -> bytes | None:
        raise NotImplementedError

    async def set_meta(self, key: str, value: bytes) -> None:
        raise NotImplementedError
