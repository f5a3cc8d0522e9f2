"""Scripted models for tests: `FakeModel`, `FakeReply`, `FunctionModel`."""

from __future__ import annotations

import asyncio
import inspect
import json
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from criogen_graph.adapters.models.base import Model, ModelRequest, ModelResponse
from criogen_graph.errors import MODEL_ERROR_KINDS, ModelError
from criogen_graph.results import USAGE_KEYS

__all__ = ["FakeModel", "FakeReply", "FunctionModel"]


def _new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:16]


def estimate_tokens(text: str) -> int:
    """A rough token count (4 characters a token), enough for limits and telemetry."""
    return (len(text) + 3) // 4


class FakeReply:
    """One scripted model reply.

    Build it with `FakeReply.text(t)`, `FakeReply.tool_call(name, args)` (one call),
    `FakeReply.tool_calls((name, args), ...)` (several calls in one reply) or
    `FakeReply.error(kind)` (a `ModelError` of that kind, e.g. `"rate_limit"`). `usage`
    overrides the estimated token counts; `chunks` says how the text is streamed;
    `delay` (seconds) makes the call take that long (to test cancellation and timeouts).
    """

    __slots__ = ("calls", "chunks", "content", "delay", "err", "stop_reason", "usage")

    def __init__(
        self,
        content: str | None = None,
        tool_calls: Iterable[Mapping[str, Any] | tuple[str, Mapping[str, Any]]] = (),
        *,
        usage: Mapping[str, int] | None = None,
        error: ModelError | None = None,
        chunks: Sequence[str] | None = None,
        delay: float = 0,
        stop_reason: str | None = None,
    ) -> None:
        if content is not None and not isinstance(content, str):
            raise TypeError(f"FakeReply text must be a str, got {type(content).__name__}")
        self.content = content
        self.calls = [_coerce_call(c) for c in tool_calls]
        if usage is not None:
            unknown = set(usage) - set(USAGE_KEYS)
            if unknown:
                raise ValueError(f"unknown usage keys {sorted(unknown)}; use {list(USAGE_KEYS)}")
        self.usage = dict(usage) if usage is not None else None
        self.err = error
        if chunks is not None and content is not None and "".join(chunks) != content:
            raise ValueError("FakeReply chunks must join to its text")
        self.chunks = list(chunks) if chunks is not None else None
        self.delay = float(delay)
        self.stop_reason = stop_reason

    @classmethod
    def text(
        cls,
        text: str,
        *,
        usage: Mapping[str, int] | None = None,
        chunks: Sequence[str] | None = None,
        delay: float = 0,
    ) -> FakeReply:
        """A final answer."""
        return cls(text, usage=usage, chunks=chunks, delay=delay)

    @classmethod
    def tool_call(
        cls,
        name: str,
        args: Mapping[str, Any] | None = None,
        *,
        id: str | None = None,
        text: str | None = None,
        usage: Mapping[str, int] | None = None,
        delay: float = 0,
    ) -> FakeReply:
        """A reply that calls one tool (with optional text beside it)."""
        call: dict[str, Any] = {"name": name, "args": dict(args or {})}
        if id is not None:
            call["id"] = id
        return cls(text, [call], usage=usage, delay=delay)

    @classmethod
    def tool_calls(
        cls,
        *calls: tuple[str, Mapping[str, Any]] | Mapping[str, Any],
        text: str | None = None,
        usage: Mapping[str, int] | None = None,
        delay: float = 0,
    ) -> FakeReply:
        """A reply that calls several tools at once: `(name, args)` pairs or
        `{"name", "args", "id"?}` dicts."""
        if not calls:
            raise ValueError("FakeReply.tool_calls needs at least one call")
        return cls(text, calls, usage=usage, delay=delay)

    @classmethod
    def error(
        cls,
        kind: str,
        message: str | None = None,
        *,
        retry_after: float | None = None,
        status: int | None = None,
    ) -> FakeReply:
        """The model call fails with a `ModelError` of `kind`."""
        if kind not in MODEL_ERROR_KINDS:
            raise ValueError(f"unknown error kind {kind!r}; one of {sorted(MODEL_ERROR_KINDS)}")
        return cls(
            error=ModelError(
                message or f"fake {kind} error",
                kind=kind,
                status=status,
                retry_after=retry_after,
            )
        )

    def __repr__(self) -> str:
        if self.err is not None:
            return f"FakeReply.error({self.err.kind!r})"
        return f"FakeReply(text={self.content!r}, tool_calls={self.calls!r})"


def _coerce_call(call: Mapping[str, Any] | tuple[str, Mapping[str, Any]]) -> dict[str, Any]:
    if isinstance(call, tuple):
        if len(call) != 2 or not isinstance(call[0], str):
            raise TypeError(f"a tool call must be (name, args), got {call!r}")
        return {"name": call[0], "args": dict(call[1] or {})}
    if isinstance(call, Mapping) and isinstance(call.get("name"), str):
        out = {"name": call["name"], "args": dict(call.get("args") or {})}
        if call.get("id"):
            out["id"] = str(call["id"])
        return out
    raise TypeError(f"a tool call must be (name, args) or {{'name', 'args'}}, got {call!r}")


ReplyLike = str | FakeReply | Mapping[str, Any] | list[Any]


def _estimate_usage(request: ModelRequest, message: dict[str, Any]) -> dict[str, int]:
    chars = 0
    for m in request.messages:
        content = m.get("content")
        if isinstance(content, str):
            chars += len(content)
        for call in m.get("tool_calls") or ():
            chars += len(call["name"]) + len(str(call.get("args")))
    out_chars = len(message.get("content") or "")
    for call in message.get("tool_calls") or ():
        out_chars += len(call["name"]) + len(str(call.get("args")))
    return {
        "input_tokens": (chars + 3) // 4,
        "output_tokens": (out_chars + 3) // 4,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
        "reasoning_tokens": 0,
    }


async def _respond(reply: ReplyLike, request: ModelRequest, model: Model) -> ModelResponse:
    if isinstance(reply, str):
        reply = FakeReply(reply)
    elif isinstance(reply, Mapping | list):
        # A JSON value stands for a typed answer written as JSON text.
        reply = FakeReply(json.dumps(reply))
    elif not isinstance(reply, FakeReply):
        raise TypeError(
            f"{type(model).__name__} replies must be str, FakeReply or a JSON value, "
            f"got {type(reply).__name__}"
        )
    if reply.delay:
        await asyncio.sleep(reply.delay)
    if reply.err is not None:
        err = reply.err
        raise ModelError(
            err.message,
            kind=err.kind,
            provider=model.provider,
            model=model.name,
            status=err.status,
            retry_after=err.retry_after,
        )
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or ""}
    if reply.calls:
        message["tool_calls"] = [
            {"id": c.get("id") or _new_call_id(), "name": c["name"], "args": dict(c["args"])}
            for c in reply.calls
        ]
    sink = request.on_text
    if sink is not None and reply.content:
        for piece in reply.chunks or _default_chunks(reply.content):
            sink(piece)
    usage = _estimate_usage(request, message)
    if reply.usage:
        usage.update(reply.usage)
    return ModelResponse(message, usage, reply.stop_reason)


def _default_chunks(text: str, size: int = 16) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [text]


class FakeModel(Model):
    """A model that answers from a script: each call takes the next entry of `replies`
    (a `str` final answer, a `FakeReply`, or a JSON value for typed output).

    The script is shared by every run of the agents that use this model, so one
    `FakeModel` can script a whole conversation. A call after the last entry fails with a
    `ModelError` (kind `bad_request`) saying the script ran out. `calls` records each
    `ModelRequest` it received.
    """

    provider = "fake"

    def __init__(self, replies: Iterable[ReplyLike], *, name: str = "fake") -> None:
        if isinstance(replies, str | bytes | FakeReply):
            raise TypeError("FakeModel takes a list of replies, e.g. FakeModel(['Hello.'])")
        self._replies: list[ReplyLike] = list(replies)
        self._next = 0
        self.name = name
        self.calls: list[ModelRequest] = []

    @property
    def remaining(self) -> int:
        """Replies not used yet."""
        return len(self._replies) - self._next

    async def generate(self, request: ModelRequest) -> ModelResponse:
        self.calls.append(request)
        if self._next >= len(self._replies):
            raise ModelError(
                f"FakeModel {self.name!r} ran out of replies after {len(self._replies)} "
                "call(s); add a reply to its script for every model call the run makes",
                kind="bad_request",
                provider=self.provider,
                model=self.name,
            )
        reply = self._replies[self._next]
        self._next += 1
        return await _respond(reply, request, self)


ModelFn = Callable[[list[dict[str, Any]], list[dict[str, Any]]], ReplyLike | Awaitable[ReplyLike]]


class FunctionModel(Model):
    """A model whose replies come from `fn(messages, tools)` (sync or async).

    `messages` is the transcript as the model would see it (system message first), `tools`
    the offered tools as `{"name", "description", "parameters"}`. `fn` returns what a
    `FakeModel` entry may be, or raises `ModelError`.
    """

    provider = "function"

    def __init__(self, fn: ModelFn, *, name: str | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"FunctionModel needs a function, got {fn!r}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", None) or "function"
        self.calls = 0

    async def generate(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        reply = self.fn(list(request.messages), list(request.tools))
        if inspect.isawaitable(reply):
            reply = await reply
        return await _respond(reply, request, self)
