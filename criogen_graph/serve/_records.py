"""What the server keeps beside the threads: who created each thread (its owner), its
metadata, and the record of each run, in the storage's LangGraph store (so they are
encrypted at rest like the rest and shared by every process on the storage)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from typing import Any

from criogen_graph.serve._protocol import now_iso
from criogen_graph.storage import Storage

__all__ = ["Records"]

_THREADS = ("criogen_serve", "threads")
_RUNS = ("criogen_serve", "runs")
#: The most thread records one search reads before filtering by metadata.
_SEARCH_WINDOW = 10_000


def _runs_of(thread_id: str) -> tuple[str, ...]:
    # A namespace label may not hold every character a thread id may (a period, for
    # one): the runs of a thread are kept under a digest of its id.
    return (*_RUNS, hashlib.sha256(thread_id.encode("utf-8")).hexdigest())


class Records:
    """Thread and run records of one storage."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    async def _store(self) -> Any:
        return await self.storage.get_store()

    async def thread(self, thread_id: str) -> dict[str, Any] | None:
        item = await (await self._store()).aget(_THREADS, thread_id)
        return dict(item.value) if item is not None else None

    async def put_thread(self, record: Mapping[str, Any]) -> None:
        await (await self._store()).aput(_THREADS, record["thread_id"], dict(record))

    async def touch_thread(self, thread_id: str, **changes: Any) -> None:
        record = await self.thread(thread_id)
        if record is not None:
            record.update(changes, updated_at=now_iso())
            await self.put_thread(record)

    async def delete_thread(self, thread_id: str) -> None:
        store = await self._store()
        await store.adelete(_THREADS, thread_id)
        for item in await store.asearch(_runs_of(thread_id), limit=_SEARCH_WINDOW):
            await store.adelete(item.namespace, item.key)

    async def threads(self, owner: str | None) -> list[dict[str, Any]]:
        """The thread records `owner` may see (all, without auth), newest first."""
        store = await self._store()
        filt = {"owner": owner} if owner is not None else None
        items = await store.asearch(_THREADS, filter=filt, limit=_SEARCH_WINDOW)
        records = [dict(i.value) for i in items]
        records.sort(key=lambda r: str(r.get("created_at")), reverse=True)
        return records

    async def run(self, thread_id: str, run_id: str) -> dict[str, Any] | None:
        item = await (await self._store()).aget(_runs_of(thread_id), run_id)
        return dict(item.value) if item is not None else None

    async def put_run(self, record: Mapping[str, Any]) -> None:
        await (await self._store()).aput(
            _runs_of(str(record["thread_id"])), record["run_id"], dict(record)
        )

    async def delete_run(self, thread_id: str, run_id: str) -> None:
        await (await self._store()).adelete(_runs_of(thread_id), run_id)

    async def start_run(
        self, record: Mapping[str, Any], thread: Mapping[str, Any] | None = None
    ) -> None:
        """Save a new run's record and, if given, its thread's changed record, together
        (LangGraph's stores write the operations they are given in one tick in one
        batch, with those of other requests: one transaction on SQLite)."""
        store = await self._store()
        saves = [
            store.aput(_runs_of(str(record["thread_id"])), str(record["run_id"]), dict(record))
        ]
        if thread is not None:
            saves.append(store.aput(_THREADS, str(thread["thread_id"]), dict(thread)))
        await asyncio.gather(*saves)

    async def runs(self, thread_id: str) -> list[dict[str, Any]]:
        items = await (await self._store()).asearch(_runs_of(thread_id), limit=_SEARCH_WINDOW)
        records = [dict(i.value) for i in items]
        records.sort(key=lambda r: str(r.get("created_at")), reverse=True)
        return records
