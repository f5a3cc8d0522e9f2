"""`Storage`: where threads (LangGraph checkpoints) and the audit trail are kept."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.serde.base import SerializerProtocol

from criogen_graph.adapters.storage.base import Backend
from criogen_graph.adapters.storage.locks import LocalLocks, hold
from criogen_graph.errors import StorageError, ValidationError

__all__ = ["Storage"]

ON_BUSY = ("fail", "wait")
_KEY_CHECK = "encryption_check"
_KEY_CHECK_PLAINTEXT = "criogen-graph encryption check"


def _safe(url: str) -> str:
    from criogen_graph.adapters.storage.postgres import safe_url

    return safe_url(url)


def _serializer(key: str | bytes | None) -> SerializerProtocol | None:
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

        return EncryptedSerializer.from_pycryptodome_aes(key=raw)
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

    `on_busy` decides what a call on a thread that another run holds does: `"fail"` raises
    `ThreadBusyError`, `"wait"` waits up to `busy_timeout_secs` and then runs. The lock
    holds across processes and is freed if its holder dies.

    With `encryption_key` (a passphrase, or 16/24/32 raw bytes), checkpoint payloads and
    audit details are encrypted at rest (AES through LangGraph's `EncryptedSerializer`). A
    storage opened with a different key, or without one, fails with `StorageError` and
    changes nothing.
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
        self._serde = _serializer(encryption_key)
        self._encrypted = encryption_key is not None
        self._max_connections = max_connections
        self._backend: Backend | None = self._make_backend() if self.scheme == "memory" else None
        if self.scheme == "sqlite":
            # Check the URL now; the file is opened on first use.
            from criogen_graph.adapters.storage.sqlite import parse_sqlite_url

            parse_sqlite_url(url)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opening: asyncio.Lock | None = None
        self._locks = LocalLocks()
        self._store: Any = None
        self._store_backend: Backend | None = None

    def _make_backend(self) -> Backend:
        if self.scheme == "memory":
            from criogen_graph.adapters.storage.memory import MemoryBackend

            return MemoryBackend(self._serde)
        if self.scheme == "sqlite":
            from criogen_graph.adapters.storage.sqlite import SqliteBackend

            return SqliteBackend(self.url, self._serde)
        from criogen_graph.adapters.storage.postgres import PostgresBackend

        return PostgresBackend(self.url, self._serde, max_connections=self._max_connections)

    # -- lifecycle -----------------------------------------------------------------------

    async def open(self) -> Storage:
        """Open the storage now (it also opens itself on first use)."""
        await self._ensure_open()
        return self

    async def _ensure_open(self) -> Backend:
        loop = asyncio.get_running_loop()
        backend = self._backend
        if backend is not None and (self.scheme == "memory" or self._loop is loop):
            return backend
        if self._opening is None or self._loop is not loop:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._backend is not None and self._loop is loop:
                return self._backend
            if self._backend is not None and self.scheme != "memory":
                # Connections belong to the event loop that opened them; a new loop (a
                # second asyncio.run, say) gets its own.
                with contextlib.suppress(Exception):
                    await self._backend.close()
                self._backend = None
            backend = self._backend or self._make_backend()
            await backend.open()
            try:
                await self._check_key(backend)
            except BaseException:
                await backend.close()
                raise
            self._backend = backend
            self._loop = loop
            return backend

    async def _check_key(self, backend: Backend) -> None:
        stored = await backend.get_meta(_KEY_CHECK)
        serde = backend.saver.serde
        if stored is None:
            if self._encrypted:
                typ, blob = serde.dumps_typed(_KEY_CHECK_PLAINTEXT)
                await backend.set_meta(_KEY_CHECK, typ.encode() + b"\0" + blob)
            return
        if not self._encrypted:
            raise StorageError(
                f"{_safe(self.url)} is encrypted: open it with its encryption_key",
                code="encryption",
            )
        tag, _, blob = stored.partition(b"\0")
        try:
            ok = serde.loads_typed((tag.decode(), blob)) == _KEY_CHECK_PLAINTEXT
        except Exception:
            ok = False
        if not ok:
            raise StorageError(
                f"the encryption_key does not match the one {_safe(self.url)} was written with",
                code="encryption",
            )

    async def close(self) -> None:
        """Close connections and release locks (threads stay saved unless memory://)."""
        backend = self._backend
        if backend is not None and self.scheme != "memory":
            same_loop = self._loop is asyncio.get_running_loop()
            self._backend = None
            self._loop = None
            if same_loop:
                await backend.close()
            else:
                # Connections of an event loop that has finished cannot be closed cleanly
                # from another one; their sockets go with them.
                with contextlib.suppress(Exception):
                    await backend.close()

    async def __aenter__(self) -> Storage:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- what users read -----------------------------------------------------------------

    async def get_store(self) -> Any:
        """The LangGraph store that keeps memory facts and collections (opened on first
        use; values sealed with the `encryption_key` when there is one)."""
        backend = await self._ensure_open()
        if self._store is not None and self._store_backend is backend:
            return self._store
        # Concurrent first runs must not each create (and migrate) the store.
        lock = self._opening or asyncio.Lock()  # (memory:// opens without awaiting)
        async with lock:
            if self._store is None or self._store_backend is not backend:
                store = await backend.open_store()
                if self._serde is not None:
                    from criogen_graph.adapters.storage.sealed import SealedStore

                    store = SealedStore(store, self._serde)
                self._store = store
                self._store_backend = backend
        return self._store

    @property
    def checkpointer(self) -> BaseCheckpointSaver[Any]:
        """The LangGraph checkpointer (after the storage is open)."""
        if self._backend is None:
            raise StorageError("the storage is not open yet: await storage.open()", code="closed")
        return self._backend.saver

    async def audit(
        self, thread_id: str | None = None, *, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Audit records, oldest first (the newest `limit` if given): who did what, when.

        Each is `{"id", "ts_ms", "thread_id", "run_id", "actor", "action", "details"}`;
        actions are `send`, `approve`, `reject`, `decide`, `retry`, `rewind`, `delete`,
        `tool_call` (with the hooks that changed or skipped it), `run_failed`,
        `run_cancelled`.
        """
        backend = await self._ensure_open()
        return await backend.read_audit(thread_id, limit)

    async def threads(self) -> list[str]:
        """The ids of the threads kept here."""
        backend = await self._ensure_open()
        return await backend.thread_ids()

    # -- for Thread ----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _hold(self, thread_id: str) -> AsyncIterator[None]:
        backend = await self._ensure_open()
        async with hold(
            thread_id,
            self._locks,
            backend.try_lock,
            backend.unlock,
            wait=self.on_busy == "wait",
            wait_secs=self.busy_timeout_secs,
        ):
            yield

    def __repr__(self) -> str:
        return f"Storage({_safe(self.url)!r}, on_busy={self.on_busy!r})"
