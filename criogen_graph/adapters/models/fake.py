"""Scripted models for tests: `FakeModel`, `FakeReply`, `FunctionModel`."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from criogen_graph.adapters.models.base import Model, ModelRequest, ModelResponse
from criogen_graph.errors import MODEL_ERROR_KINDS, ModelError
from criogen_graph.results import USAGE_KEYS

__all__ = ["FakeModel", "FakeReply", "FunctionModel", "RecordingModel"]


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

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, name: str | None = None) -> FakeModel:
        """Replay a recording made with `RecordingModel`: the same replies (text, tool
        calls with their ids, usage, stop reasons, errors, streamed chunks), in order. The
        model's name is the recorded one."""
        data = _load_recording(path)
        replies: list[ReplyLike] = [_reply_from_record(e) for e in data.get("replies") or ()]
        recorded = data.get("model") or {}
        return cls(replies, name=name or str(recorded.get("model") or "replay"))

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


RECORDING_VERSION = 1


def _reply_from_record(entry: Mapping[str, Any]) -> FakeReply:
    err = entry.get("error")
    if err is not None:
        reply = FakeReply.error(
            err.get("kind", "transient"),
            err.get("message"),
            retry_after=err.get("retry_after"),
            status=err.get("status"),
        )
        return reply
    return FakeReply(
        entry.get("content") or None,
        [
            {"id": c["id"], "name": c["name"], "args": c.get("args") or {}}
            for c in entry.get("tool_calls") or ()
        ],
        usage=entry.get("usage"),
        chunks=entry.get("chunks"),
        stop_reason=entry.get("stop_reason"),
    )


def _load_recording(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"no recording at {path}: record one with RecordingModel") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not a recording (invalid JSON: {exc.msg})") from None
    if not isinstance(data, dict) or data.get("version") != RECORDING_VERSION:
        raise ValueError(f"{path} is not a criogen_graph recording (version {RECORDING_VERSION})")
    return data


class RecordingModel(Model):
    """Record a real model's replies to a JSON file while it runs, to replay them later
    with `FakeModel.from_file(path)` (e.g. in CI, without a key or network).

    `model` is anything `Agent(model=...)` accepts. Each call appends its reply (or its
    error) to `path`, rewritten atomically, so a recording survives a crash mid-run.
    Recording starts afresh unless `append=True`.
    """

    def __init__(self, model: Any, path: str | os.PathLike[str], *, append: bool = False) -> None:
        from criogen_graph.adapters.models import resolve_model

        self.inner = resolve_model(model, option="RecordingModel model")
        self.provider = self.inner.provider
        self.name = self.inner.name
        self.path = Path(path)
        self.replies: list[dict[str, Any]] = []
        if append and self.path.exists():
            self.replies = list(_load_recording(self.path).get("replies") or ())

    async def generate(self, request: ModelRequest) -> ModelResponse:
        chunks: list[str] = []
        sink = request.on_text
        if sink is not None:

            def tee(piece: str) -> None:
                chunks.append(piece)
                sink(piece)

            request.on_text = tee
        try:
            response = await self.inner.generate(request)
        except ModelError as exc:
            self._save(
                {
                    "error": {
                        "kind": exc.kind,
                        "message": exc.message,
                        "status": exc.status,
                        "retry_after": exc.retry_after,
                    }
                }
            )
            raise
        finally:
            request.on_text = sink
        msg = response.message
        entry: dict[str, Any] = {"content": msg.get("content") or "", "usage": response.usage}
        if msg.get("tool_calls"):
            entry["tool_calls"] = [
                {"id": c["id"], "name": c["name"], "args": c.get("args") or {}}
                for c in msg["tool_calls"]
            ]
        if response.stop_reason:
            entry["stop_reason"] = response.stop_reason
        if chunks and "".join(chunks) == entry["content"]:
            entry["chunks"] = chunks
        self._save(entry)
        return response

    def _save(self, entry: dict[str, Any]) -> None:
        self.replies.append(entry)
        data = {"version": RECORDING_VERSION, "model": self.inner.identity, "replies": self.replies}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, self.path)

    async def aclose(self) -> None:
        await self.inner.aclose()
