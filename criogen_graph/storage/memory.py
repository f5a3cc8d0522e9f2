"""`memory://`: LangGraph's `InMemorySaver`; threads end with the process.

One backend serves every event loop and OS thread of the process (its data is the
storage), so each operation on it holds one re-entrant lock: LangGraph's in-memory saver
and store are plain dicts, which a reader iterating in one thread while a writer changes
them in another would break."""

from __future__ import annotations

import builtins
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.store.base import Op, Result
from langgraph.store.memory import InMemoryStore

from criogen_graph.runtime.segment import segment_for
from criogen_graph.storage.base import (
    ENCRYPTION_CLAIM,
    LEGACY_KEY_CHECK,
    UNENCRYPTED,
    Backend,
    MakeRecord,
    SaverMixin,
    TranscriptCache,
    adopt_claim,
    cached_head,
    not_offered,
    records_for_put,
    records_for_writes,
    redacted_errors,
    segment_metadata,
    writing,
)


class _Store(InMemoryStore):
    """`InMemoryStore` under the backend's lock (without an index it never awaits)."""

    def __init__(self, guard: threading.RLock) -> None:
        super().__init__()
        self._guard = guard

    def batch(self, ops: Iterable[Op]) -> builtins.list[Result]:
        with self._guard:
            return super().batch(ops)

    async def abatch(self, ops: Iterable[Op]) -> builtins.list[Result]:
        return self.batch(ops)


class _Saver(SaverMixin, InMemorySaver):
    def __init__(self, backend: MemoryBackend, serde: SerializerProtocol | None) -> None:
        super().__init__(serde=serde)
        self._backend = backend
        self.guard = backend.guard
        self.transcripts = TranscriptCache()

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        with self.guard:
            return super().get_tuple(config)

    def list(self, config: RunnableConfig | None, **kwargs: Any) -> Iterator[CheckpointTuple]:
        with self.guard:
            return iter(builtins.list(super().list(config, **kwargs)))

    def get_delta_channel_history(self, *, config: RunnableConfig, channels: Sequence[str]) -> Any:
        with self.guard:
            return super().get_delta_channel_history(config=config, channels=channels)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        with self.guard:
            return super().put(config, checkpoint, metadata, new_versions)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        with self.guard:
            super().put_writes(config, writes, task_id, task_path)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        raise not_offered("prune")

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        raise not_offered("prune")

    def delete_thread(self, thread_id: str) -> None:
        with self.guard:
            super().delete_thread(thread_id)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        hit, head = cached_head(config)
        return head if hit else self.get_tuple(config)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        tid = str(config["configurable"]["thread_id"])
        metadata = segment_metadata(tid, metadata)
        with self.guard:
            out = self.put(config, checkpoint, metadata, new_versions)
            self._backend.append(records_for_put(segment_for(tid), dict(out), metadata))
        return out

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        writes = redacted_errors(writes)
        tid = str(config["configurable"]["thread_id"])
        seg = segment_for(tid)
        with writing(seg, task_id) as ok:
            if ok:
                with self.guard:
                    self.put_writes(config, writes, task_id, task_path)
                    self._backend.append(records_for_writes(seg, writes))


class MemoryBackend(Backend):
    def __init__(self, serde: SerializerProtocol | None) -> None:
        self.guard = threading.RLock()
        self.saver: _Saver = _Saver(self, serde)
        self.audit: list[dict[str, Any]] = []
        self._next_id = 1
        self._meta: dict[str, bytes] = {}

    def append(self, records: list[dict[str, Any]]) -> None:
        with self.guard:
            for r in records:
                self.audit.append({"id": self._next_id, **r})
                self._next_id += 1

    async def open(self) -> None:
        pass

    async def open_store(self) -> Any:
        with self.guard:
            if self.store is None:
                self.store = _Store(self.guard)
            return self.store

    async def close(self) -> None:
        pass

    async def write_audit(self, records: list[dict[str, Any]]) -> None:
        self.append(records)

    async def read_audit(self, thread_id: str | None, limit: int | None) -> list[dict[str, Any]]:
        with self.guard:
            records = builtins.list(self.audit)
        rows = [
            {k: v for k, v in r.items() if k != "ts_ns"}
            for r in sorted(records, key=lambda r: (r["ts_ns"], r["id"]))
            if thread_id is None or r["thread_id"] == thread_id
        ]
        return rows[-limit:] if limit else rows

    async def delete_audit(self, thread_id: str) -> int:
        with self.guard:
            before = len(self.audit)
            self.audit = [r for r in self.audit if r["thread_id"] != thread_id]
            return before - len(self.audit)

    async def delete_thread(self, thread_id: str, make_record: MakeRecord, *, audit: bool) -> bool:
        # No await in between, and under the lock: nothing can see (or stop) it half done.
        with self.guard:
            config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
            existed = self.saver.get_tuple(config) is not None
            self.saver.delete_thread(thread_id)
            before = len(self.audit)
            if audit:
                self.audit = [r for r in self.audit if r["thread_id"] != thread_id]
            self.append([make_record(existed, before - len(self.audit))])
            self.saver.transcripts.forget(thread_id)
        return existed

    async def thread_ids(self) -> list[str]:
        # InMemorySaver's storage is a defaultdict: reads leave empty entries behind.
        with self.guard:
            return sorted(t for t, spaces in self.saver.storage.items() if any(spaces.values()))

    async def claim_encryption(self, claim: bytes) -> bytes | None:
        with self.guard:
            current = self._meta.get(ENCRYPTION_CLAIM)
            legacy = self._meta.get(LEGACY_KEY_CHECK)
            value, record = adopt_claim(current, legacy, claim, bool(self.audit))
            if record and value is not None:
                self._meta[ENCRYPTION_CLAIM] = value
                if value != UNENCRYPTED:
                    self._meta.setdefault(LEGACY_KEY_CHECK, value)
            return value
