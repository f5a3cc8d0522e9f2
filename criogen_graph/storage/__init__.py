"""`Storage`: where threads (LangGraph checkpoints) and the audit trail are kept."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import sys
import threading
from collections.abc import AsyncIterator
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.serde.base import CipherProtocol, SerializerProtocol

from criogen_graph.errors import StorageError, ValidationError
from criogen_graph.runtime.inputs import check_thread_id
from criogen_graph.storage.base import (
    UNENCRYPTED,
    Backend,
    TranscriptCache,
)
from criogen_graph.storage.locks import LocalLocks, hold
from criogen_graph.storage.loops import LoopBackends

__all__ = ["Storage"]

ON_BUSY = ("fail", "wait")
_KEY_CHECK_PLAINTEXT = "criogen-graph encryption check"


def _safe(url: str) -> str:
    from criogen_graph._urls import mask_url

    return mask_url(url)


class _CheckedCipher(CipherProtocol):
    """The AES cipher of LangGraph's `EncryptedSerializer`, with a payload that fails to
    decrypt (written with another key, or changed on disk) reported as
    `StorageError(code="encryption")` instead of the bare `ValueError: MAC check failed`.
    (The cipher, not the serializer, is wrapped: LangGraph rebuilds the serializer around
    the same cipher for its msgpack allowlist.)"""

    def __init__(self, inner: CipherProtocol, url: str) -> None:
        self.inner = inner
        self.url = url

    def encrypt(self, plaintext: bytes) -> tuple[str, bytes]:
        return self.inner.encrypt(plaintext)

    def decrypt(self, ciphername: str, ciphertext: bytes) -> bytes:
        try:
            return self.inner.decrypt(ciphername, ciphertext)
        except (ValueError, AssertionError) as exc:
            raise StorageError(
                f"a payload stored in {_safe(self.url)} cannot be decrypted with this "
                f"encryption_key ({exc or 'unknown cipher ' + repr(ciphername)}): it was "
                "written with another key, or changed on disk. Open the storage with the "
                "key it was written with",
                code="encryption",
            ) from None


def _serializer(key: str | bytes | None, url: str) -> SerializerProtocol | None:
    if key is None:
        return None
    if isinstance(key, str):
        if not key:
            raise ValidationError("encryption_key must not be empty", code="invalid_value")
        raw = hashlib.sha256(key.encode("utf-8")).digest()
    elif isinstance(key, bytes):
        if len(key) not in (16, 24, 32):
            raise ValidationError(
                "an encryption_key given as bytes must be 16, 24 or 32 bytes (AES)",
                code="invalid_value",
            )
        raw = key
    else:
        raise TypeError(f"encryption_key must be a str or bytes, got {type(key).__name__}")
    try:
        from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

        sealed = EncryptedSerializer.from_pycryptodome_aes(key=raw)
        return EncryptedSerializer(_CheckedCipher(sealed.cipher, url), sealed.serde)
    except ImportError as exc:  # pragma: no cover - pycryptodome is a dependency
        raise StorageError(
            "encryption needs pycryptodome: pip install pycryptodome",
            code="missing_dependency",
        ) from exc


class Storage:
    """Where an agent keeps its threads (LangGraph checkpoints) and the audit trail.

    `url`: `"memory://"` (default; threads end with the process),
    `"sqlite:///relative.db"`, `"sqlite:////abs/path.db"` (also `"sqlite://x.db"`),
    `"postgres://..."` / `"postgresql://..."` (needs the `postgres` extra). Nothing is opened
    until first use; tables are created then. One storage can serve many agents and
    threads in a process; `close()` it (or use `async with`) when done.

    One storage may be used from several OS threads and event loops at once (a sync web
    framework running each request with `asyncio.run`): each event loop gets connections
    of its own (up to `max_connections` on PostgreSQL), never closed while that loop may
    use them, and closed when the loop ends, so a new loop per request does not pile
    them up. A thread id has one writer in the whole process, whichever loop runs it.

    `on_busy` decides what a call on a thread that another run holds does: `"fail"` raises
    `ThreadBusyError`, `"wait"` waits up to `busy_timeout_secs` and then runs. The lock
    holds across processes and is freed if its holder dies.

    With `encryption_key` (a passphrase, or 16/24/32 raw bytes), checkpoint payloads,
    audit details and store values are encrypted at rest (AES through LangGraph's
    `EncryptedSerializer`). The first opening of a storage ever decides whether it is
    encrypted, and with which key, atomically, even when processes open it at the same
    moment; every other key (or no key, or a key on an unencrypted storage) then fails
    with `StorageError(code="encryption")` and changes nothing.
    """

    def __init__(
        self,
        url: str = "memory://",
        *,
        on_busy: str = "fail",
        busy_timeout_secs: float = 30,
        encryption_key: str | bytes | None = None,
        max_connections: int = 10,
    ) -> None:
        if not isinstance(url, str):
            raise TypeError(f"storage URL must be a str, got {type(url).__name__}")
        if on_busy not in ON_BUSY:
            raise ValidationError(
                f"on_busy must be 'fail' or 'wait', got {on_busy!r}", code="invalid_value"
            )
        if isinstance(busy_timeout_secs, bool) or not isinstance(busy_timeout_secs, int | float):
            raise TypeError("busy_timeout_secs must be a number")
        if not busy_timeout_secs >= 0:  # also NaN; inf waits as long as it takes
            raise ValidationError(
                f"busy_timeout_secs must be a number >= 0, got {busy_timeout_secs!r}",
                code="invalid_value",
            )
        try:
            url.encode()
        except UnicodeEncodeError:
            raise StorageError(
                "the storage URL has characters that cannot be encoded (a lone surrogate); "
                "percent-encode them",
                code="invalid_url",
            ) from None
        if "\x00" in url:
            raise StorageError("the storage URL contains a NUL character", code="invalid_url")
        scheme = url.split(":", 1)[0].lower() if ":" in url else ""
        if scheme not in ("memory", "sqlite", "postgres", "postgresql"):
            raise StorageError(
                f"unknown storage URL {_safe(url)!r}: use memory://, sqlite:///file.db or "
                "postgresql://user@host/db",
                code="invalid_url",
            )
        if scheme in ("postgres", "postgresql") and not url.split(":", 1)[1].startswith("//"):
            raise StorageError(f"malformed PostgreSQL URL {_safe(url)!r}", code="invalid_url")
        self.url = url
        self.scheme = "postgres" if scheme == "postgresql" else scheme
        self.on_busy = on_busy
        self.busy_timeout_secs = float(busy_timeout_secs)
        self._serde = _serializer(encryption_key, url)
        self._encrypted = encryption_key is not None
        self._max_connections = max_connections
        #: memory:// keeps its data in its one backend, shared by every event loop.
        self._shared: Backend | None = self._make_backend() if self.scheme == "memory" else None
        #: The other backends: one per event loop, never closed under another's user.
        self._loops = LoopBackends(self._make_backend, self._prepare)
        #: One transcript cache for the backends of every loop.
        self._transcripts = TranscriptCache()
        if self.scheme == "sqlite":
            # Check the URL now; the file is opened on first use.
            from criogen_graph.storage.sqlite import parse_sqlite_url

            parse_sqlite_url(url)
        self._locks = LocalLocks()
        #: The calls of this process that take, hold or give back each thread: their
        #: task, and the future set once they let go.
        self._holders: dict[str, list[tuple[asyncio.Task[Any] | None, asyncio.Future[None]]]] = {}
        self._holders_guard = threading.Lock()
        self._shared_store: Any = None

    def _make_backend(self) -> Backend:
        if self.scheme == "memory":
            from criogen_graph.storage.memory import MemoryBackend

            return MemoryBackend(self._serde)
        if self.scheme == "sqlite":
            from criogen_graph.storage.sqlite import SqliteBackend

            return SqliteBackend(self.url, self._serde)
        from criogen_graph.storage.postgres import PostgresBackend

        return PostgresBackend(self.url, self._serde, max_connections=self._max_connections)

    # -- lifecycle -----------------------------------------------------------------------

    async def open(self) -> Storage:
        """Open the storage now (it also opens itself on first use)."""
        await self.backend()
        return self

    @property
    def _backend(self) -> Backend | None:
        """The open backend of the running event loop (see `LoopBackends`), or None."""
        return self._shared if self._shared is not None else self._loops.current()

    async def backend(self) -> Backend:
        """Internal: the backend of the running event loop, opened (and its encryption
        key checked) on first use. For the runtime's own modules (threads, the run-segment
        runner, background runs); not a stable interface for users."""
        if self._shared is not None:
            return self._shared
        return await self._loops.get()

    def keyed_like(self, url: str, *, on_busy: str = "wait") -> Storage:
        """Internal: a new storage for `url` sealing with this one's encryption key (none
        if this one has none), for a worker serving an agent's encrypted storage. For the
        runtime's own modules; not a stable interface for users."""
        other = Storage(url, on_busy=on_busy)
        other._serde = self._serde
        other._encrypted = self._encrypted
        return other

    @property
    def encrypted(self) -> bool:
        """Internal: whether the storage was given an `encryption_key`."""
        return self._encrypted

    @property
    def serializer(self) -> SerializerProtocol | None:
        """Internal: the serializer that seals payloads with the `encryption_key` (None
        without one), for the background-run queue, which stores its payloads itself."""
        return self._serde

    async def _prepare(self, backend: Backend) -> None:
        """A backend just opened: its key checked, the shared transcript cache in."""
        await self._check_key(backend)
        backend.saver.transcripts = self._transcripts  # type: ignore[attr-defined]
        backend.saver.audit_writer = backend.write_audit  # type: ignore[attr-defined]

    async def _check_key(self, backend: Backend) -> None:
        """The storage's encryption claim: recorded by the first opener ever, in the same
        transaction as the check that there is none yet (with a key: a key check sealed
        with it; without: `UNENCRYPTED`), and compared with by every later one."""
        serde = backend.saver.serde
        if self._encrypted:
            typ, blob = serde.dumps_typed(_KEY_CHECK_PLAINTEXT)
            mine = typ.encode() + b"\0" + blob
        else:
            mine = UNENCRYPTED
        stored = await backend.claim_encryption(mine)
        url = _safe(self.url)
        if stored is None:
            raise StorageError(
                f"{url} already holds unencrypted threads, so it cannot be opened with an "
                "encryption_key (they would stay in the clear beside encrypted ones): open "
                "it without one, or copy its threads into a new storage opened with the key",
                code="encryption",
            )
        if stored == UNENCRYPTED:
            if self._encrypted:
                raise StorageError(
                    f"{url} is not encrypted (it was first opened without an "
                    "encryption_key): open it without one, or use a new database or "
                    "schema for encrypted threads",
                    code="encryption",
                )
            return
        if not self._encrypted:
            raise StorageError(
                f"{url} is encrypted: open it with its encryption_key", code="encryption"
            )
        tag, _, blob = stored.partition(b"\0")
        try:
            ok = serde.loads_typed((tag.decode(), blob)) == _KEY_CHECK_PLAINTEXT
        except Exception:
            ok = False
        if not ok:
            raise StorageError(
                f"the encryption_key does not match the one {url} was written with",
                code="encryption",
            )

    async def close(self) -> None:
        """Close connections and release locks (threads stay saved unless memory://).

        It closes the connections of the event loop it is awaited in, and lets go of
        those of loops that have ended. Those of another loop still running (in another
        OS thread) are that loop's own: they close when it ends (`asyncio.run` closes
        them as its loop finishes) or when it awaits `close()` itself, never under a
        run of it. The storage opens again on its next use.

        Runs of this process that were cancelled (a stream left early, a timed-out
        request) are let finish saving first, for up to `busy_timeout_secs`."""
        unwinding = self._unwinding()
        if unwinding:
            await asyncio.wait(unwinding, timeout=self.busy_timeout_secs)
        background = sys.modules.get("criogen_graph.background")
        if background is not None:
            # The background-run queue's connections, if runs were submitted or listed
            # here (the module loads only then).
            await background.close_runs(self)
        if self._shared is None:
            await self._loops.close()

    async def __aenter__(self) -> Storage:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- what users read -----------------------------------------------------------------

    async def get_store(self) -> Any:
        """The LangGraph store that keeps memory facts and collections (opened on first
        use; values sealed with the `encryption_key` when there is one)."""
        backend = await self.backend()
        if self._shared is None:
            return await self._loops.store(backend, self._make_store)
        if self._shared_store is None:
            # (memory:// makes its store without awaiting: no other caller comes between)
            self._shared_store = await self._make_store(backend)
        return self._shared_store

    async def _make_store(self, backend: Backend) -> Any:
        store = await backend.open_store()
        if self._serde is not None:
            from criogen_graph.storage.sealed import SealedStore

            store = SealedStore(store, self._serde)
        return store

    @property
    def checkpointer(self) -> BaseCheckpointSaver[Any]:
        """The LangGraph checkpointer of the running event loop (after the storage is
        open in it: each event loop gets its own connections, see `close()`)."""
        backend = self._backend
        if backend is None:
            raise StorageError(
                "the storage is not open in this event loop yet: await storage.open()",
                code="closed",
            )
        return backend.saver

    async def audit(
        self, thread_id: str | None = None, *, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Audit records, oldest first (the newest `limit` if given): who did what, when.

        Each is `{"id", "ts_ms", "thread_id", "run_id", "actor", "action", "details"}`;
        actions are `send`, `approve`, `reject`, `decide`, `retry`, `rewind`, `delete`,
        `tool_call` (with the hooks that changed or skipped it), `run_failed`,
        `run_cancelled`.
        """
        if thread_id is not None:
            check_thread_id(thread_id)
        backend = await self.backend()
        return await backend.read_audit(thread_id, limit)

    async def threads(self) -> list[str]:
        """The ids of the threads kept here."""
        backend = await self.backend()
        return await backend.thread_ids()

    # -- for Thread and the run-segment runner ----------------------------------------

    @contextlib.asynccontextmanager
    async def hold(self, thread_id: str) -> AsyncIterator[None]:
        """Internal: hold thread `thread_id` for one call that writes it (across
        processes; the storage's `on_busy` decides what happens while another holds it).
        For the runtime's own modules; not a stable interface for users."""
        backend = await self.backend()
        # Every call on the thread is known here from before it takes the lock until
        # after it gave it back (remote lock included), so that a run of this process
        # that is being cancelled (a stream left with `break`, a timed-out request) is
        # seen as what it is: no concurrent writer, but one saving what it finished
        # and letting go. The next caller waits for that, whatever `on_busy` says.
        released: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (asyncio.current_task(), released)
        with self._holders_guard:  # loops of other OS threads share the registry
            self._holders.setdefault(thread_id, []).append(entry)
        try:
            unwinding = self._unwinding(thread_id)
            async with hold(
                thread_id,
                self._locks,
                backend.try_lock,
                backend.unlock,
                wait=self.on_busy == "wait" or bool(unwinding),
                wait_secs=self.busy_timeout_secs,
            ):
                yield
        finally:
            with self._holders_guard:
                entries = self._holders[thread_id]
                entries.remove(entry)
                if not entries:
                    del self._holders[thread_id]
            released.set_result(None)

    def remember_transcript(
        self, thread_id: str, checkpoint_id: str, messages: list[dict[str, Any]]
    ) -> None:
        """Internal: the transcript at a checkpoint this process just saved, so the next
        run on the thread does not rebuild it from the database (see `TranscriptCache`)."""
        self._transcripts.remember(thread_id, checkpoint_id, {"messages": messages})

    def _unwinding(self, thread_id: str | None = None) -> list[asyncio.Future[None]]:
        """The release of the calls of this process (on `thread_id`, or all) that were
        asked to cancel and still hold or take the thread, on this event loop."""
        me = asyncio.current_task()
        loop = asyncio.get_running_loop()
        with self._holders_guard:
            if thread_id is None:
                entries = [e for es in self._holders.values() for e in es]
            else:
                entries = list(self._holders.get(thread_id) or ())
        return [
            released
            for task, released in entries
            if task is not None
            and task is not me
            and (task.cancelling() > 0 or task.done())
            and not released.done()
            and released.get_loop() is loop
        ]

    def __repr__(self) -> str:
        return f"Storage({_safe(self.url)!r}, on_busy={self.on_busy!r})"
