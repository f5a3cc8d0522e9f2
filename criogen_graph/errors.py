"""The errors a run, a thread or a storage can raise; all subclasses of `CriogenError`."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, get_args

from criogen_graph.messages import ErrorCode, LimitName, ModelAttempt, ModelErrorKind

if TYPE_CHECKING:
    from criogen_graph.results import RunResult

__all__ = [
    "CancelledError",
    "CriogenError",
    "LimitExceededError",
    "ModelError",
    "StorageError",
    "ThreadBusyError",
    "ThreadSuspendedError",
    "ToolError",
    "ToolExecutionError",
    "ValidationError",
]

#: Model error kinds that are retried (with `model_retry`) and move on to `fallbacks`.
TRANSIENT_KINDS: frozenset[ModelErrorKind] = frozenset(
    {"rate_limit", "transient", "timeout", "connection"}
)
#: Every `ModelError.kind` (the values of `messages.ModelErrorKind`).
MODEL_ERROR_KINDS: frozenset[ModelErrorKind] = frozenset(get_args(ModelErrorKind))
#: LangGraph's server (`langgraph dev`, LangGraph Platform), whose JSON encoder may read
#: `CriogenError._asdict`.
_SERVER_PACKAGE = "langgraph_api"


class CriogenError(Exception):
    """Base class of every error the library raises on purpose.

    `code` is a short machine-readable name (e.g. `"hook_failed"`, `"invalid_value"`; every
    one is listed by `messages.ErrorCode`).
    """

    code: ErrorCode = "error"

    def __init__(self, message: str, *, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return self.message

    @property
    def _asdict(self) -> Callable[[], dict[str, str]]:
        """What LangGraph's server shows its clients when this error fails a run.

        The server's JSON encoder (`langgraph_api.serde.default`) hides the message of an
        exception whose type is not on its allowlist (`{"error": <class name>, "message":
        "An internal error occurred"}`), unless the object has `model_dump`, `dict` or
        `_asdict`, whose dict it sends as is. LangGraph's checkpoint serializer reads the
        same three names first (it would save a dict instead of the error's repr), so only
        code of the server's own package finds this one: to anyone else the attribute does
        not exist. Should the server move its encoder out of that package, clients get its
        default again (class name only); tests/test_server_errors.py would say so.
        """
        # The caller's frame is the only difference between the server's encoder and the
        # checkpoint serializer: both probe with hasattr() on the same object.
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller != _SERVER_PACKAGE and not caller.startswith(f"{_SERVER_PACKAGE}."):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute '_asdict'")
        return self._server_fields

    def _server_fields(self) -> dict[str, str]:
        return {"error": type(self).__name__, "code": self.code, "message": str(self)}


class ValidationError(CriogenError):
    """Input that does not fit: a bad option, bad arguments, a bad decision.

    `code` says what kind: `"invalid_value"`, `"invalid_type"`, `"missing"`, `"unknown"`.
    Nothing is saved when it is raised.
    """

    code: ErrorCode = "invalid_value"


class ModelError(CriogenError):
    """The model failed after its retries and fallbacks.

    `kind` is one of `rate_limit`, `transient`, `timeout`, `connection` (the transient
    kinds, retried), `context_overflow`, `content_filter`, `auth`, `bad_request`,
    `not_found`. `provider` and `model` name the model that failed; `status` is the HTTP
    status when there was one; `retry_after` the server's `Retry-After` in seconds;
    `attempts` lists every failure that led here (`{"provider", "model", "kind",
    "message"}`), primary first.
    """

    code: ErrorCode = "model_error"

    def __init__(
        self,
        message: str,
        *,
        kind: ModelErrorKind = "transient",
        provider: str | None = None,
        model: str | None = None,
        status: int | None = None,
        retry_after: float | None = None,
        attempts: list[ModelAttempt] | None = None,
    ) -> None:
        if kind not in MODEL_ERROR_KINDS:
            raise ValueError(
                f"unknown ModelError kind {kind!r}; one of {sorted(MODEL_ERROR_KINDS)}"
            )
        super().__init__(message)
        self.kind: ModelErrorKind = kind
        self.provider = provider
        self.model = model
        self.status = status
        self.retry_after = retry_after
        self.attempts = list(attempts or [])

    @property
    def transient(self) -> bool:
        """True for the kinds that are retried."""
        return self.kind in TRANSIENT_KINDS


class LimitExceededError(CriogenError):
    """A limit of `Limits` was reached.

    `limit` names it (`"model_calls"`, `"tool_calls"`, `"tokens"`), `value` is its bound,
    and `result` is the run as far as it got (`stop_reason == "limit"`; on a thread it is
    saved, so nothing the run did is lost).
    """

    code: ErrorCode = "limit_exceeded"

    def __init__(
        self,
        message: str,
        *,
        limit: LimitName,
        value: int,
        result: RunResult[Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.limit = limit
        self.value = value
        self.result = result


class ToolError(CriogenError):
    """Raise it in a tool (or a `before_tool` hook) to give the model an error message.

    The run goes on: the model sees the message as the call's result. Any other exception
    follows the agent's `on_tool_exception` policy.
    """

    code: ErrorCode = "tool_error"


class ToolExecutionError(CriogenError):
    """A tool raised and `on_tool_exception="fail"`; the exception is `__cause__`."""

    code: ErrorCode = "tool_failed"

    def __init__(self, message: str, *, tool: str, call_id: str) -> None:
        super().__init__(message)
        self.tool = tool
        self.call_id = call_id


class CancelledError(CriogenError, asyncio.CancelledError):
    """A run was cancelled by someone other than the awaiter: `await stream.reply()`
    after `Stream.cancel()` (or after the task iterating the stream was cancelled).

    A task cancelled from outside (`task.cancel()`, `asyncio.timeout`, `wait_for`, a
    `TaskGroup`) gets its own plain `asyncio.CancelledError` back, once the run is saved,
    so asyncio's constructs behave as documented. This class is also an
    `asyncio.CancelledError`. On a thread the run is saved and `retry()` continues it.
    """

    code: ErrorCode = "cancelled"


class ThreadSuspendedError(CriogenError):
    """The thread waits for approval: answer with `approve`, `reject` or `decide` first."""

    code: ErrorCode = "thread_suspended"


class ThreadBusyError(CriogenError):
    """Another run holds the thread (see the storage's `on_busy`)."""

    code: ErrorCode = "thread_busy"


class StorageError(CriogenError):
    """The storage cannot be opened, read or written (bad URL, unreachable database, ...).
    `code` says which: `unreachable`, `lock_lost` (PostgreSQL ended the session holding the
    thread's lock mid-run; nothing more was written, `retry()` continues),
    `database_error` (PostgreSQL refused a statement; the message names its SQLSTATE; the
    connection and every other run are unaffected), `setup_timeout` (creating or
    migrating the tables, another process's setup included, took longer than its bound),
    ..."""

    code: ErrorCode = "storage_error"
