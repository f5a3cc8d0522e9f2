"""`Stream` and its events: a thread call whose events arrive as they happen."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from criogen_graph._aio import uncancelled
from criogen_graph.errors import CancelledError
from criogen_graph.results import ApprovalRequest

if TYPE_CHECKING:
    from criogen_graph.results import Reply

__all__ = [
    "ApprovalNeededEvent",
    "MessageEvent",
    "OtherEvent",
    "ReasoningEvent",
    "Stream",
    "StreamEvent",
    "TextEvent",
    "ToolCallFinishedEvent",
    "ToolCallStartedEvent",
]

Output = TypeVar("Output")


@dataclass(frozen=True, slots=True)
class TextEvent:
    """A piece of the answer as the model writes it."""

    message_id: str
    text: str
    type: Literal["text"] = "text"


@dataclass(frozen=True, slots=True)
class ReasoningEvent:
    """A piece of the model's reasoning (thinking) text as the model writes it, for
    models that show it (Anthropic extended thinking, Gemini thought summaries, DeepSeek
    and other `reasoning_content` servers). Redacted like the answer; the whole text is
    the assistant message's `reasoning`. Not part of the answer."""

    message_id: str
    text: str
    type: Literal["reasoning"] = "reasoning"


@dataclass(frozen=True, slots=True)
class ToolCallStartedEvent:
    """A tool call starts, with its complete, validated arguments."""

    call_id: str
    tool: str
    args: dict[str, Any]
    type: Literal["tool_call_started"] = "tool_call_started"


@dataclass(frozen=True, slots=True)
class ToolCallFinishedEvent:
    """A tool call ended: `status` is `ok`, `error`, `skipped`, `rejected` or `timeout`."""

    call_id: str
    tool: str
    status: str
    type: Literal["tool_call_finished"] = "tool_call_finished"


@dataclass(frozen=True, slots=True)
class MessageEvent:
    """A finished message of the transcript (user, assistant or tool)."""

    message: dict[str, Any]
    type: Literal["message"] = "message"


@dataclass(frozen=True, slots=True)
class ApprovalNeededEvent:
    """The run stopped for approval of these calls."""

    requests: list[ApprovalRequest] = field(default_factory=list)
    type: Literal["approval_needed"] = "approval_needed"


@dataclass(frozen=True, slots=True)
class OtherEvent:
    """Any other engine event, by name (`step_started`, `step_finished`, `model_retry`,
    `model_fallback`), with the node and step; never any content."""

    event: str
    node: str | None = None
    step: int | None = None
    type: Literal["other"] = "other"


StreamEvent = (
    TextEvent
    | ReasoningEvent
    | ToolCallStartedEvent
    | ToolCallFinishedEvent
    | MessageEvent
    | ApprovalNeededEvent
    | OtherEvent
)


def to_event(payload: dict[str, Any]) -> StreamEvent | None:
    """A node's stream-writer payload as a public event."""
    kind = payload.get("type")
    if kind == "text":
        return TextEvent(payload["message_id"], payload["text"])
    if kind == "reasoning":
        return ReasoningEvent(payload["message_id"], payload["text"])
    if kind == "message":
        return MessageEvent(payload["message"])
    if kind == "tool_call_started":
        return ToolCallStartedEvent(payload["call_id"], payload["tool"], payload["args"])
    if kind == "tool_call_finished":
        return ToolCallFinishedEvent(payload["call_id"], payload["tool"], payload["status"])
    if kind == "other":
        return OtherEvent(payload["event"], payload.get("node"), payload.get("step"))
    return None


_END: Any = object()


class Stream(Generic[Output]):
    """A streamed thread call: `async for event in stream`, then `await stream.reply()`.

    The run starts when iteration (or `reply()`) starts; a run that fails raises its error
    from the loop (and from `reply()`). Leaving the loop early, calling
    `cancel()`, or cancelling the task that iterates cancels the run promptly (a running
    tool is cancelled); the thread is saved and `retry()` continues it, and `reply()` then
    raises `CancelledError`. Events are buffered, so a slow consumer never loses one.
    """

    def __init__(self, run: Callable[[Stream[Output]], Awaitable[Reply[Output]]]) -> None:
        self._run = run
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._task: asyncio.Task[Reply[Output]] | None = None
        #: Internal: the thread's values and interrupts when the graph stopped (set by
        #: the runtime; what a state read right after would give), for the HTTP server's
        #: answer without reading them back.
        self.final: tuple[dict[str, Any], Sequence[Any]] | None = None

    def emit(self, event: StreamEvent) -> None:
        """Queue an event (used by the runtime)."""
        self._queue.put_nowait(event)

    def _start(self) -> asyncio.Task[Reply[Output]]:
        if self._task is None:
            self._task = asyncio.ensure_future(self._drive())
        return self._task

    async def _drive(self) -> Reply[Output]:
        try:
            return await self._run(self)
        finally:
            self._queue.put_nowait(_END)

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        return _Events(self, self._start())

    def cancel(self) -> None:
        """Cancel the run (it is saved; `retry()` continues it)."""
        if self._task is None:
            self._start()
        assert self._task is not None
        self._task.cancel()

    async def reply(self) -> Reply[Output]:
        """Wait for the call; its saved `Reply`. Raises what `send` raises, and
        `CancelledError` if the stream was cancelled."""
        task = self._start()
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError as exc:
            if not task.done():
                # The task awaiting the reply was cancelled: so is the run, as with send.
                task.cancel()
                raise
            if isinstance(exc, CancelledError):
                raise
            raise CancelledError("the streamed run was cancelled") from exc

    async def __aenter__(self) -> Stream[Output]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task


class _Events:
    """One iteration over a stream's events. Leaving it early stops the run: `break`
    cancels the run at once (when the iterator is dropped), and `aclose()` or a
    cancellation of the iterating task also wait until the run has unwound (saved,
    its lock released), so the thread can be retried right away."""

    __slots__ = ("_done", "_stream", "_task")

    def __init__(self, stream: Stream[Any], task: asyncio.Task[Any]) -> None:
        self._stream = stream
        self._task = task
        self._done = False

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> StreamEvent:
        if self._done:
            raise StopAsyncIteration
        try:
            item = await self._stream._queue.get()
        except BaseException:
            # The iterating task was cancelled: so is the run.
            await self.aclose()
            raise
        if item is _END:
            self._done = True
            task = self._task
            if task.done() and not task.cancelled() and task.exception() is not None:
                # A failed run fails the loop too (reply() raises it again).
                raise task.exception()  # type: ignore[misc]
            raise StopAsyncIteration
        return item  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        """Stop the run (unless it ended) and wait until it has unwound."""
        task = self._task
        if not self._done and not task.done():
            task.cancel()
        self._done = True
        if not task.done():
            await uncancelled(asyncio.wait((task,)))

    def __del__(self) -> None:
        if not self._done and not self._task.done():
            # Left with `break` (or an exception in the loop's body).
            self._task.cancel()
