"""Middleware: code that wraps each model call and each tool call of an agent.

A `Middleware` sees the call, may change it, calls the next handler zero or more times,
and may change or replace what comes back. `Agent(..., middleware=[a, b])` composes them
with the first outermost: `a` wraps `b`, which wraps the agent's own layers.

Where they run, for one model step:

    before_model hooks
      -> a.wrap_model_call -> b.wrap_model_call -> telemetry (a `chat` span)
         -> fallback (next model) -> retry (same model) -> model.generate
    after_model hooks

and for one tool call:

    before_tool hooks
      -> a.wrap_tool_call -> b.wrap_tool_call -> (argument check)
         -> the tool (with its timeout and retries)
    after_tool hooks

The model's retries and fallbacks are middleware too (the agent adds them from
`model_retry`, `fallbacks` and `fallback_on`), so a middleware of yours sees one call per
model step whatever they do inside, and the graph keeps one `model` step per call.

Write one as a subclass:

    class Cache(Middleware):
        def __init__(self) -> None:
            self.seen: dict[str, ModelResponse] = {}

        async def wrap_model_call(self, call, handler):
            key = repr(call.request.messages)
            if key not in self.seen:
                self.seen[key] = await handler(call)
            return self.seen[key]

or from one function with `@model_middleware` / `@tool_middleware`.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, cast, get_args

from criogen_graph.errors import CriogenError
from criogen_graph.messages import AssistantMessage, ModelStopReason
from criogen_graph.models.base import Model, ModelRequest, ModelResponse
from criogen_graph.tools import Tool, ToolContext

__all__ = [
    "Middleware",
    "MiddlewareError",
    "ModelCall",
    "ModelHandler",
    "ToolCallRequest",
    "ToolHandler",
    "model_middleware",
    "tool_middleware",
]


@dataclass(slots=True)
class ModelCall:
    """One model call, as a middleware sees it.

    `request` is what the model is asked (transcript with the system message first,
    offered tools, output schema, stream sinks); `model` the model that will answer
    (a fallback layer changes it). `run_id`, `thread_id` (None for `Agent.run`), `state`
    (the run's state, read-only) and `model_calls` (calls made before this one in the run)
    say where the call belongs. Use `replace(...)` to hand the next handler a changed call.
    """

    request: ModelRequest
    model: Model
    run_id: str
    thread_id: str | None
    state: Mapping[str, Any]
    model_calls: int

    def replace(self, **changes: Any) -> ModelCall:
        """A copy with the given fields changed (e.g. `request=`, `model=`)."""
        return dataclasses.replace(self, **changes)


@dataclass(slots=True)
class ToolCallRequest:
    """One tool call, as a middleware sees it: `name` and `args` after the `before_tool`
    hooks (arguments not yet checked against the schema), the `tool` that will run, and
    its `context` (run, call id, thread, state). Use `replace(...)` to change them for the
    next handler; a changed `tool` runs instead (or, with only `name` changed, the agent's
    tool of that name), and the result message's `tool` field names the one that ran."""

    name: str
    args: dict[str, Any]
    tool: Tool
    context: ToolContext

    def replace(self, **changes: Any) -> ToolCallRequest:
        """A copy with the given fields changed (e.g. `args=`)."""
        return dataclasses.replace(self, **changes)


#: The next layer of a model call: call it with the (possibly changed) `ModelCall`.
ModelHandler = Callable[[ModelCall], Awaitable[ModelResponse]]
#: The next layer of a tool call: call it with the (possibly changed) request; it returns
#: what the tool returned.
ToolHandler = Callable[[ToolCallRequest], Awaitable[Any]]


class Middleware:
    """Wraps model calls and tool calls. Override `wrap_model_call`, `wrap_tool_call` or
    both; the defaults pass the call on unchanged.

    `wrap_model_call` returns the `ModelResponse` of the step: call `handler(call)` for
    the next layer's (once, several times, or not at all to answer from elsewhere), raise
    a `ModelError` to fail the step like a provider would. `wrap_tool_call` returns the
    tool's result value: raise `ToolError` to answer the model with an error, any other
    exception counts as the tool's own failure (`on_tool_exception`).

    A middleware must not keep per-run state on itself unless it is safe to share: one
    agent serves many runs at once.

    `passes_text`: while a model middleware may re-ask the model or rewrite its reply
    (the default, False), a streamed run sends the reply's text (and reasoning) to stream
    clients only once the middleware has returned it, as one event: clients never see
    a rejected or unrewritten answer. Set it to True on a middleware that returns the
    text it got unchanged (timing, logging, a cache) to stream text as it arrives.
    """

    #: True: this middleware never changes the text of the model's reply (see above).
    passes_text: bool = False

    @property
    def name(self) -> str:
        """The middleware's name, in errors and spans (the class name by default)."""
        return type(self).__name__

    async def wrap_model_call(self, call: ModelCall, handler: ModelHandler) -> ModelResponse:
        """Wrap one model call; by default `return await handler(call)`."""
        return await handler(call)

    async def wrap_tool_call(self, call: ToolCallRequest, handler: ToolHandler) -> Any:
        """Wrap one tool call; by default `return await handler(call)`."""
        return await handler(call)


_Fn = TypeVar("_Fn", bound=Callable[..., Awaitable[Any]])


class _FunctionMiddleware(Middleware, Generic[_Fn]):
    """Middleware made by a decorator from one function, named after it."""

    __slots__ = ("_fn",)

    def __init__(self, fn: _Fn) -> None:
        self._fn = fn

    @property
    def name(self) -> str:
        return getattr(self._fn, "__name__", "middleware")


class _FunctionModelMiddleware(
    _FunctionMiddleware[Callable[[ModelCall, ModelHandler], Awaitable[ModelResponse]]]
):
    __slots__ = ()

    async def wrap_model_call(self, call: ModelCall, handler: ModelHandler) -> ModelResponse:
        return await self._fn(call, handler)


class _FunctionToolMiddleware(
    _FunctionMiddleware[Callable[[ToolCallRequest, ToolHandler], Awaitable[Any]]]
):
    __slots__ = ()

    async def wrap_tool_call(self, call: ToolCallRequest, handler: ToolHandler) -> Any:
        return await self._fn(call, handler)


def model_middleware(
    fn: Callable[[ModelCall, ModelHandler], Awaitable[ModelResponse]], /
) -> Middleware:
    """Make a `Middleware` from `async def fn(call, handler) -> ModelResponse`."""
    if not callable(fn):
        raise TypeError(f"model_middleware takes an async function, got {fn!r}")
    return _FunctionModelMiddleware(fn)


def tool_middleware(fn: Callable[[ToolCallRequest, ToolHandler], Awaitable[Any]], /) -> Middleware:
    """Make a `Middleware` from `async def fn(call, handler) -> result`."""
    if not callable(fn):
        raise TypeError(f"tool_middleware takes an async function, got {fn!r}")
    return _FunctionToolMiddleware(fn)


def check_middleware(items: object) -> tuple[Middleware, ...]:
    """The agent's `middleware=` option as a tuple; `TypeError` naming a bad entry."""
    if isinstance(items, str | bytes | Middleware) or not hasattr(items, "__iter__"):
        raise TypeError("middleware must be a list of Middleware objects")
    out: list[Middleware] = []
    for item in items:
        if not isinstance(item, Middleware):
            raise TypeError(
                f"middleware entries must be Middleware objects (a subclass, or made with "
                f"@model_middleware / @tool_middleware), got {item!r}"
            )
        out.append(item)
    return tuple(out)


class MiddlewareError(CriogenError):
    """A middleware returned what its method may not return (code `middleware_failed`):
    `wrap_model_call` something other than a `ModelResponse` holding an assistant message,
    or either method an un-awaited coroutine. `middleware` names it, `method` the method.

    Nothing it returned is saved. From `wrap_model_call` it fails the run (the thread
    stays as it was: `retry()` goes on); from `wrap_tool_call` it is the tool's failure
    (`on_tool_exception`), as any other exception of a tool middleware is.
    """

    code = "middleware_failed"

    def __init__(self, message: str, *, middleware: str, method: str) -> None:
        super().__init__(message)
        self.middleware = middleware
        self.method = method


Method = Literal["wrap_model_call", "wrap_tool_call"]
_STOP_REASONS = frozenset(get_args(ModelStopReason))


async def checked_call(middleware: Middleware, method: Method, *args: Any) -> Any:
    """Call `middleware.<method>(*args)` and return what it returns, checked (see
    `checked_return`): the one place where what a middleware gives back is looked at."""
    returned = getattr(middleware, method)(*args)
    if not inspect.isawaitable(returned):
        _discard(returned)
        raise _error(
            middleware,
            method,
            f"returned {_shown(returned)} instead of a coroutine: {method} must be an `async def`",
        )
    return checked_return(middleware, method, await returned)


def checked_return(middleware: Middleware, method: Method, value: Any) -> Any:
    """What `middleware.<method>` returned, if it is what the method may return (a
    `ModelResponse` is given back as a copy with its message in the transcript's shape);
    else `MiddlewareError` naming the middleware, what it returned and what was
    expected."""
    if inspect.isawaitable(value):
        _discard(value)
        if method == "wrap_model_call":
            arg, expected = "call", "a ModelResponse"
        else:
            arg, expected = "request", "the tool's result"
        raise _error(
            middleware,
            method,
            f"returned a {type(value).__name__} it did not await (a handler's?) instead of "
            f"{expected}: write `return await handler({arg})`",
        )
    if method == "wrap_tool_call":
        return value
    if not isinstance(value, ModelResponse):
        raise _error(
            middleware,
            method,
            f"returned {_shown(value)}; it must return a ModelResponse (the handler's, "
            "`return await handler(call)`, or one of its own)",
        )
    problem, message = _reply_problem(value.message)
    if problem is None and not isinstance(value.usage, Mapping):
        problem = f"its usage must be a dict of token counts, got {_shown(value.usage)}"
    if problem is None and value.stop_reason not in _STOP_REASONS and value.stop_reason is not None:
        problem = (
            f"its stop_reason must be None or one of {sorted(_STOP_REASONS)}, got "
            f"{value.stop_reason!r}"
        )
    if problem is not None:
        raise _error(middleware, method, f"returned a ModelResponse whose {problem}")
    return ModelResponse(cast(AssistantMessage, message), value.usage, value.stop_reason)


def _reply_problem(message: Any) -> tuple[str | None, dict[str, Any]]:
    """What is wrong with a middleware's reply message (None: nothing), and the message
    as the transcript keeps it (text blocks become the text)."""
    shape = '{"role": "assistant", "content": "..."}'
    if not isinstance(message, Mapping):
        return f"message is {_shown(message)}, not an assistant message dict {shape}", {}
    out = dict(message)
    role = out.get("role")
    if role != "assistant":
        said = "has no 'role'" if "role" not in out else f"has role {role!r}"
        return f"message {said}; it must be an assistant message {shape}", out
    return _content_problem(out) or _calls_problem(out), out


def _content_problem(out: dict[str, Any]) -> str | None:
    """What is wrong with the reply's content; text blocks become the text, in `out`."""
    content = out.get("content")
    if content is None:
        out["content"] = ""
    elif isinstance(content, list) and all(
        isinstance(b, Mapping) and b.get("type") == "text" and isinstance(b.get("text"), str)
        for b in content
    ):
        out["content"] = "".join(b["text"] for b in content)
    elif not isinstance(content, str):
        return (
            f"message content is {_shown(content)}; it must be text (or a list of text "
            'blocks {"type": "text", "text": ...})'
        )
    return None


def _calls_problem(out: dict[str, Any]) -> str | None:
    """What is wrong with the reply's tool calls; in `out`, each call's args a dict of
    its own, and an empty list dropped."""
    calls = out.get("tool_calls")
    if calls is None:
        return None
    if not isinstance(calls, list | tuple):
        return (
            f"message tool_calls is {_shown(calls)}; it must be a list of "
            '{"id", "name", "args"} dicts'
        )
    fixed = []
    for c in calls:
        if (
            not isinstance(c, Mapping)
            or not isinstance(c.get("name"), str)
            or not c.get("name")
            or not isinstance(c.get("args") or {}, Mapping)
        ):
            return (
                f"message has the tool call {_shown(c)}; each needs a 'name' (text) and "
                "'args' (a dict)"
            )
        fixed.append({**c, "args": dict(c.get("args") or {})})
    if fixed:
        out["tool_calls"] = fixed
    else:
        out.pop("tool_calls")
    return None


def _error(middleware: Middleware, method: Method, what: str) -> MiddlewareError:
    name = middleware.name
    return MiddlewareError(f"middleware {name!r}: {method} {what}", middleware=name, method=method)


def _shown(value: Any) -> str:
    if value is None:
        return "None"
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"a {type(value).__name__} ({text})"


def _discard(value: Any) -> None:
    """Close an un-awaited coroutine, so it neither runs nor warns that it never ran."""
    close = getattr(value, "close", None)
    if inspect.iscoroutine(value) and callable(close):
        close()
