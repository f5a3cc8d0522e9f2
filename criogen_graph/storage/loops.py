"""One backend per event loop.

Connections belong to the event loop that opened them: an aiosqlite connection answers on
the loop that called it, a `psycopg_pool` pool runs tasks on its loop, and our SQLite
saver's inline connection must not be closed while another thread uses it. A storage
used from several OS threads (a sync web framework running each request with
`asyncio.run`) therefore opens one backend per loop, and no loop ever closes another
loop's backend while it may be in use. A backend is closed

- when its loop ends: `asyncio.run` (and `asyncio.Runner`, asgiref's `async_to_sync`,
  anything that calls `loop.shutdown_asyncgens()`) closes it after cancelling the loop's
  tasks, so no user is left, and a new loop per request does not pile up connections;
- when `close()` is awaited on its loop;
- when a loop was closed without that (no await possible any more): the next opening on
  another loop lets go of its connections (`Backend.abandon`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from criogen_graph.storage.base import Backend


class _Slot:
    """What one event loop uses: its backend, the store on it, the guard of its opening,
    and the watch that closes it when the loop ends."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.opening = asyncio.Lock()
        self.backend: Backend | None = None
        self.store: Any = None
        self.watch: AsyncGenerator[None, None] | None = None


class LoopBackends:
    """The backends of one storage, one per event loop (see the module docstring).
    `make()` creates a backend, `prepare(backend)` runs once it is open (a failure closes
    it and is raised to the opener)."""

    def __init__(
        self, make: Callable[[], Backend], prepare: Callable[[Backend], Awaitable[None]]
    ) -> None:
        self._make = make
        self._prepare = prepare
        self._mutex = threading.Lock()
        self._slots: dict[asyncio.AbstractEventLoop, _Slot] = {}

    def current(self) -> Backend | None:
        """The open backend of the running loop (with no loop running: the one opened
        last whose loop is still open), or None."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            with self._mutex:
                slots = list(self._slots.values())
            live = [s.backend for s in slots if s.backend is not None and not s.loop.is_closed()]
            return live[-1] if live else None
        slot = self._slots.get(loop)
        return slot.backend if slot is not None else None

    def open_count(self) -> int:
        """How many backends are open (one per event loop using the storage)."""
        with self._mutex:
            return sum(1 for s in self._slots.values() if s.backend is not None)

    def _slot(self, loop: asyncio.AbstractEventLoop) -> _Slot:
        with self._mutex:
            slot = self._slots.get(loop)
            if slot is None:
                slot = self._slots[loop] = _Slot(loop)
            gone = [s for lp, s in self._slots.items() if lp.is_closed()]
            for s in gone:
                del self._slots[s.loop]
        for s in gone:
            self._abandon(s)
        return slot

    async def get(self) -> Backend:
        """The running loop's backend, opened (and prepared) on first use."""
        loop = asyncio.get_running_loop()
        slot = self._slots.get(loop)
        if slot is not None and slot.backend is not None:
            return slot.backend
        slot = self._slot(loop)
        async with slot.opening:
            if slot.backend is not None:
                return slot.backend
            backend = self._make()
            await backend.open()
            try:
                await self._prepare(backend)
                if slot.watch is None:
                    watch = self._until_loop_ends(slot)
                    await anext(watch)
                    slot.watch = watch
            except BaseException:
                await backend.close()
                raise
            slot.backend = backend
            return backend

    async def store(self, backend: Backend, make: Callable[[Backend], Awaitable[Any]]) -> Any:
        """The store on the running loop's `backend`, made by `make(backend)` once."""
        slot = self._slots.get(asyncio.get_running_loop())
        if slot is None or slot.backend is not backend:
            return await make(backend)  # (closed meanwhile: a store for this call)
        if slot.store is None:
            # Concurrent first runs must not each create (and migrate) the store.
            async with slot.opening:
                if slot.store is None:
                    slot.store = await make(backend)
        return slot.store

    async def close(self) -> None:
        """Close the running loop's backend, and let go of those of closed loops. The
        backends of other loops still running are theirs: each closes when its loop ends
        (or awaits `close()` itself)."""
        loop = asyncio.get_running_loop()
        with self._mutex:
            slot = self._slots.pop(loop, None)
            gone = [s for lp, s in self._slots.items() if lp.is_closed()]
            for s in gone:
                del self._slots[s.loop]
        for s in gone:
            self._abandon(s)
        if slot is None:
            return
        async with slot.opening:
            backend, slot.backend, slot.store = slot.backend, None, None
            watch, slot.watch = slot.watch, None
            try:
                if backend is not None:
                    await backend.close()
            finally:
                if watch is not None:
                    await watch.aclose()

    async def _until_loop_ends(self, slot: _Slot) -> AsyncGenerator[None, None]:
        """Suspended while the loop runs; `loop.shutdown_asyncgens()` (called as the loop
        ends, after its tasks were cancelled) resumes it to close the slot's backend."""
        try:
            yield
        finally:
            backend, slot.backend, slot.store = slot.backend, None, None
            with self._mutex:
                if self._slots.get(slot.loop) is slot:
                    del self._slots[slot.loop]
            if backend is not None and not slot.loop.is_closed():
                try:
                    await backend.close()
                except Exception:  # the loop is ending: nobody to raise it to
                    logging.getLogger("criogen_graph").warning(
                        "closing a storage backend as its event loop ended failed",
                        exc_info=True,
                    )

    @staticmethod
    def _abandon(slot: _Slot) -> None:
        backend, slot.backend, slot.store = slot.backend, None, None
        if backend is not None:
            with contextlib.suppress(Exception):
                backend.abandon()
        watch, slot.watch = slot.watch, None
        if watch is not None:
            # Finish the watch here (it awaits nothing now that the slot is empty), so
            # it is not handed to its closed loop when collected.
            with contextlib.suppress(StopIteration, RuntimeError):
                watch.aclose().send(None)
