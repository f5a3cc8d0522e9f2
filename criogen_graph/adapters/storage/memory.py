"""`memory://`: LangGraph's `InMemorySaver`; threads end with the process."""

from __future__ import annotations

from collections.abc import Sequence
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

from criogen_graph.adapters.storage.base import (
    Backend,
    SaverMixin,
    TranscriptCache,
    cached_head,
    records_for_put,
    records_for_writes,
    segment_for,
    segment_metadata,
)


class _Saver(SaverMixin, InMemorySaver):
    def __init__(self, backend: MemoryBackend, serde: SerializerProtocol | None) -> None:
        super().__init__(serde=serde)
        self._backend = backend
        self.transcripts = TranscriptCache()

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
        self.put_writes(config, writes, task_id, task_path)
        tid = str(config["configurable"]["thread_id"])
        self._backend.append(records_for_writes(segment_for(tid), writes))


class MemoryBackend(Backend):
    def __init__(self, serde: SerializerProtocol | None) -> None:
        self.saver: _Saver = _Saver(self, serde)
        self.audit: list[dict[str, Any]] = []
        self._next_id = 1
        self._meta: dict[str, bytes] = {}

    def append(self, records: list[dict[str, Any]]) -> None:
        for r in records:
            self.audit.append({"id": self._next_id, **r})
            self._next_id += 1

    async def open(self) -> None:
        pass

    async def open_store(self) -> Any:
        if self.store is None:
            from langgraph.store.memory import InMemoryStore

            self.store = InMemoryStore()
        return self.store

    async def close(self) -> None:
        pass

    async def write_audit(self, records: list[dict[str, Any]]) -> None:
        self.append(records)

    async def read_audit(self, thread_id: str | None, limit: int | None) -> list[dict[str, Any]]:
        rows = [
            {k: v for k, v in r.items() if k != "ts_ns"}
            for r in sorted(self.audit, key=lambda r: (r["ts_ns"], r["id"]))
            if thread_id is None or r["thread_id"] == thread_id
        ]
        return rows[-limit:] if limit else rows

    async def delete_audit(self, thread_id: str) -> int:
        before = len(self.audit)
        self.audit = [r for r in self.audit if r["thread_id"] != thread_id]
        return before - len(self.audit)

    async def thread_ids(self) -> list[str]:
        # InMemorySaver's storage is a defaultdict: reads leave empty entries behind.
        return sorted(t for t, spaces in self.saver.storage.items() if any(spaces.values()))

    async def get_meta(self, key: str) -> bytes | None:
        return self._meta.get(key)

    async def set_meta(self, key: str, value: bytes) -> None:
        self._meta[key] = value
