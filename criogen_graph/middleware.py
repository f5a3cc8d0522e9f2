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
      -> a.wrap_tool_call -> b.wrap_tool_call -> (argument check) -> the tool (with its
         timeout and retries)
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
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from criogen_graph.adapters.models.base import Model, ModelRequest, ModelResponse
from criogen_graph.tools import Tool, ToolContext

__all__ = [
    "Middleware",
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
    """

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
