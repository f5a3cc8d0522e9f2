"""One writer per thread.

LangGraph has no per-thread lock: two runs on one thread both start from the same head and
silently fork it. Every storage serializes the runs of a thread in two layers:

- `LocalLocks`: in-process exclusion with FIFO hand-off, so waiters in one process wake
  as soon as the holder leaves (no polling);
- a cross-process lock per backend, which the operating system or the database releases
  when its holder dies: `FileLocks` (`flock` on one file per thread, for SQLite) and
  PostgreSQL session advisory locks (in the postgres adapter).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from criogen_graph.errors import StorageError, ThreadBusyError


def busy(thread_id: str, detail: str = "") -> ThreadBusyError:
    return ThreadBusyError(
        f"thread {thread_id!r} is busy: another run holds it{detail}. Wait for it to finish, "
        "or open the storage with on_busy='wait'"
    )


class LocalLocks:
    """In-process locks by thread id with FIFO hand-off (bound to no event loop)."""

    def __init__(self) -> None:
        self._held: set[str] = set()
        self._waiters: dict[str, deque[asyncio.Future[None]]] = {}

    def held(self, key: str) -> bool:
        return key in self._held

    async def acquire(self, key: str, wait_secs: float | None) -> bool:
        """Take `key`; with `wait_secs=None` only if free now. False when not taken."""
        if key not in self._held:
            self._held.add(key)
            return True
        if wait_secs is None or wait_secs <= 0:
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._waiters.setdefault(key, deque())
        queue.append(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), wait_secs)
            return True
        except TimeoutError:
            if fut.done() and not fut.cancelled():
                # Handed over just as the wait timed out: pass it on.
                self.release(key)
            else:
                fut.cancel()
            return False
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release(key)
            else:
                fut.cancel()
            raise
        finally:
            if not queue:
                self._waiters.pop(key, None)

    def release(self, key: str) -> None:
        queue = self._waiters.get(key)
        while queue:
            fut = queue.popleft()
            if not fut.done():
                # Ownership passes straight to the next waiter; a waiter cancelled after
                # this passes it on in turn (see `acquire`).
                fut.set_result(None)
                return
        self._waiters.pop(key, None)
        self._held.discard(key)


TryLock = Callable[[str], Awaitable[bool]]
Unlock = Callable[[str], Awaitable[None]]


@contextlib.asynccontextmanager
async def hold(
    thread_id: str,
    local: LocalLocks,
    try_remote: TryLock | None,
    unlock_remote: Unlock | None,
    *,
    wait: bool,
    wait_secs: float,
) -> AsyncIterator[None]:
    """Hold the thread for the duration of the block, released on every exit path."""
    deadline = time.monotonic() + wait_secs
    if not await local.acquire(thread_id, wait_secs if wait else None):
        raise busy(thread_id, " in this process")
    try:
        if try_remote is not None:
            delay = 0.005
            while not await try_remote(thread_id):
                left = deadline - time.monotonic()
                if not wait or left <= 0:
                    raise busy(thread_id, " in another process")
                # Another process holds it: poll with backoff (the OS or the database
                # frees it the moment that holder ends, even if it crashed).
                await asyncio.sleep(min(delay, left))
                delay = min(delay * 1.5, 0.1)
        try:
            yield
        finally:
            if unlock_remote is not None:
                await asyncio.shield(unlock_remote(thread_id))
    finally:
        local.release(thread_id)


class FileLocks:
    """Cross-process locks as `flock`ed files, one per thread, in a directory beside the
    SQLite file. The kernel releases a lock when its holder exits, however it exits."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fds: dict[str, int] = {}
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(
                f"cannot create the lock directory {directory}: {exc.strerror}",
                code="unwritable",
            ) from None

    def _path(self, thread_id: str) -> Path:
        digest = hashlib.sha256(thread_id.encode("utf-8")).hexdigest()[:40]
        return self.directory / f"{digest}.lock"

    async def try_lock(self, thread_id: str) -> bool:
        fd = os.open(self._path(thread_id), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise
        self._fds[thread_id] = fd
        return True

    async def unlock(self, thread_id: str) -> None:
        fd = self._fds.pop(thread_id, None)
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
