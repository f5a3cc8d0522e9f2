"""One writer per thread.

LangGraph has no per-thread lock: two runs on one thread both start from the same head and
silently fork it. Every storage serializes the runs of a thread in two layers:

- `LocalLocks`: in-process exclusion with FIFO hand-off, so waiters in one process wake
  as soon as the holder leaves (no polling), whichever event loop or OS thread each runs
  on;
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
import math
import os
import threading
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


class _Waiter:
    """A caller queued for a key: the future its event loop wakes it with, and whether
    the key was handed to it (decided under the locks' mutex, whichever thread wakes)."""

    __slots__ = ("fut", "granted")

    def __init__(self, fut: asyncio.Future[None]) -> None:
        self.fut = fut
        self.granted = False


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class LocalLocks:
    """In-process locks by thread id with FIFO hand-off, shared by every event loop and OS
    thread of the process (a sync web framework runs each request on a loop of its own):
    one holder per key in the whole process, and a waiter on any loop wakes as soon as
    the holder, on any loop, leaves."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._held: set[str] = set()
        self._waiters: dict[str, deque[_Waiter]] = {}

    def held(self, key: str) -> bool:
        return key in self._held

    async def acquire(self, key: str, wait_secs: float | None) -> bool:
        """Take `key`; with `wait_secs=None` only if free now. False when not taken.

        A waiter that times out or is cancelled leaves the queue; if the key was handed
        to it in that very moment, it passes the key on, so no waiter is stranded."""
        with self._mutex:
            if key not in self._held:
                self._held.add(key)
                return True
            if wait_secs is None or wait_secs <= 0:
                return False
            waiter = _Waiter(asyncio.get_running_loop().create_future())
            queue = self._waiters.setdefault(key, deque())
            queue.append(waiter)
        try:
            # (`asyncio.timeout`, not `wait_for`: on Python 3.11 `wait_for` can swallow a
            # cancellation that arrives as the future completes.)
            async with asyncio.timeout(None if math.isinf(wait_secs) else wait_secs):
                await waiter.fut
            return True
        except TimeoutError:
            self._leave(key, waiter)
            return False
        except BaseException:
            self._leave(key, waiter)
            raise

    def _leave(self, key: str, waiter: _Waiter) -> None:
        """A waiter gives up: out of the queue, and on with the key if it just got it."""
        with self._mutex:
            granted = waiter.granted
            waiter.fut.cancel()
            queue = self._waiters.get(key)
            if queue is not None:
                with contextlib.suppress(ValueError):
                    queue.remove(waiter)
                if not queue:
                    del self._waiters[key]
        if granted:
            self.release(key)

    def release(self, key: str) -> None:
        while True:
            with self._mutex:
                queue = self._waiters.get(key)
                waiter = None
                while queue:
                    candidate = queue.popleft()
                    if not candidate.fut.done():
                        # Ownership passes straight to the next waiter; a waiter that
                        # gives up after this passes it on in turn (see `_leave`).
                        candidate.granted = True
                        waiter = candidate
                        break
                if not queue:
                    self._waiters.pop(key, None)
                if waiter is None:
                    self._held.discard(key)
                    return
            loop = waiter.fut.get_loop()
            try:
                running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if loop is running:
                _wake(waiter.fut)
                return
            try:
                loop.call_soon_threadsafe(_wake, waiter.fut)
                return
            except RuntimeError:
                pass  # its event loop is closed: nobody is left to take it; the next one


#: Take a thread's cross-process lock (True) or find it held (False). All or nothing, even
#: when the caller is cancelled meanwhile: a lock it took then is given back before the
#: cancellation is raised.
TryLock = Callable[[str], Awaitable[bool]]
#: Give a thread's cross-process lock back, to the end even when the caller is cancelled
#: meanwhile (the cancellation is raised after).
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
                # (It runs to its end even if cancelled meanwhile: the thread is free for
                # everyone once this returns or raises, not some time later.)
                await unlock_remote(thread_id)
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
