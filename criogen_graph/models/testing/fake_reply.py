"""What scripted models answer with: `FakeReply` (one scripted reply) and `respond`,
which turns a reply into the `ModelResponse` a real model would give. Shared by
`FakeModel`, `FunctionModel` and the replay of recordings."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from criogen_graph.errors import MODEL_ERROR_KINDS, ModelError
from criogen_graph.messages import AssistantMessage, ModelStopReason, ToolCallData, Usage
from criogen_graph.models.base import Model, ModelRequest, ModelResponse
from criogen_graph.results import USAGE_KEYS

__all__ = ["FakeReply", "ReplyLike", "respond"]


def _new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:16]


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


#: What a scripted model may answer with: a final answer, a `FakeReply`, or a JSON value
#: (a typed answer).
ReplyLike = str | FakeReply | Mapping[str, Any] | list[Any]


def _estimate_usage(request: ModelRequest, message: AssistantMessage) -> Usage:
    chars = 0
    for m in request.messages:
        content = m.get("content")
        if isinstance(content, str):
            chars += len(content)
        if m["role"] == "assistant":
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


async def respond(reply: ReplyLike, request: ModelRequest, model: Model) -> ModelResponse:
    """The `ModelResponse` (or `ModelError`) a scripted `reply` stands for, as `model`
    gives it: text streamed to `request.on_text`, usage estimated unless scripted."""
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
    message: AssistantMessage = {"role": "assistant", "content": reply.content or ""}
    if reply.calls:
        message["tool_calls"] = [
            ToolCallData(id=c.get("id") or _new_call_id(), name=c["name"], args=dict(c["args"]))
            for c in reply.calls
        ]
    sink = request.on_text
    if sink is not None and reply.content:
        for piece in reply.chunks or _default_chunks(reply.content):
            sink(piece)
    usage = _estimate_usage(request, message)
    if reply.usage:
        usage = cast(Usage, {**usage, **reply.usage})  # keys checked by FakeReply
    # Not checked: a script may stand for a model that reports a stop reason of its own,
    # which the model node must survive.
    return ModelResponse(message, usage, cast("ModelStopReason | None", reply.stop_reason))


def _default_chunks(text: str, size: int = 16) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [text]
