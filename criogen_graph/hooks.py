"""Hooks: your code around the agent loop, before and after model and tool calls."""

from __future__ import annotations

import asyncio
import inspect
import marshal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from criogen_graph._aio import cancel_pending
from criogen_graph.errors import CriogenError, ValidationError

__all__ = ["Hook", "HookAction", "HookContext", "ToolCall", "ToolResult"]

HOOK_METHODS = ("on_start", "before_model", "after_model", "before_tool", "after_tool", "on_end")
_CAMEL = {
    "onStart": "on_start",
    "beforeModel": "before_model",
    "afterModel": "after_model",
    "beforeTool": "before_tool",
    "afterTool": "after_tool",
    "onEnd": "on_end",
}


class Hook:
    """Code that runs around the agent loop. Subclass it (or pass any object) and define
    any of these methods, each sync or async:

    - `on_start(ctx)`: once per run segment (a run, or its continuation after approval
      or retry; one invocation of the graph, however LangGraph drives it), in its first
      node before anything else, `ctx.messages` ending with the new message; may return
      `HookAction(state=...)`.
    - `before_model(ctx)`: before each model call; may replace the transcript
      (`HookAction(messages=...)`, kept) or end the run (`HookAction(end=True, output=...)`).
    - `after_model(ctx)`: after each model reply (`ctx.messages` ends with it); may
      replace it (`HookAction(message=...)`) or end the run.
    - `before_tool(call)`: before each tool call; return a changed `ToolCall` to run that
      instead, a `ToolResult` to skip the tool, or `None`. Raising `ToolError` gives the
      model that error instead of running the tool.
    - `after_tool(call, result)`: after each tool call that produced a result; anything
      but `None` replaces the result the model sees.
    - `on_end(ctx, outcome)`: always, once per run segment that started, as it ends,
      with `"completed"`, `"suspended"` (an approval or a breakpoint) or `"failed"` (a
      raise, a limit, a cancellation); cannot change the outcome.

    `on_start`, `before_model` and `before_tool` run in list order, the others in
    reverse. A raise in `on_start`, `before_model` or `after_model` fails the run with a
    `CriogenError` of code `"hook_failed"` (the exception is its `__cause__`); a raise in
    `before_tool` or `after_tool` counts as the tool's (see `on_tool_exception`). `name`
    (default: the class name) is shown in errors and audit records and keys the hook's
    saved state, so it must be unique among an agent's hooks.
    """

    # Where a name set on the instance (`self.name = ...` in `__init__`) is kept; a class
    # attribute `name = "..."` in a subclass replaces the property instead.
    _criogen_hook_name: str | None = None

    @property
    def name(self) -> str:
        """The hook's name: set on the instance, else the class name."""
        return self._criogen_hook_name or type(self).__name__

    @name.setter
    def name(self, value: str) -> None:
        if not isinstance(value, str) or not value:
            raise ValidationError(
                f"{type(self).__name__}.name must be a non-empty str, got {value!r}",
                code="invalid_type" if not isinstance(value, str) else "invalid_value",
            )
        self._criogen_hook_name = value


class HookContext:
    """What a hook sees: the run id, the transcript so far, the model calls made in this
    run, what this hook saved with `HookAction(state=...)`, and the run state (read-only).

    `messages`, `hook_state` and `state` are the hook's own copies: changing them in
    place changes nothing in the run or the saved thread (return a `HookAction` to). The
    copy of the transcript is made when `messages` is first read, so a hook that does not
    read it costs nothing on a long thread. The context itself is read-only.
    """

    __slots__ = ("_copy", "_source", "hook_state", "model_calls", "run_id", "state")

    run_id: str
    model_calls: int
    hook_state: Any
    state: Mapping[str, Any]
    _copy: list[dict[str, Any]] | None
    _source: Sequence[Mapping[str, Any]] | None

    def __init__(
        self,
        run_id: str,
        messages: Sequence[Mapping[str, Any]],
        model_calls: int,
        hook_state: Any,
        state: Mapping[str, Any],
    ) -> None:
        setattr_ = object.__setattr__
        setattr_(self, "run_id", run_id)
        setattr_(self, "model_calls", model_calls)
        setattr_(self, "hook_state", copy_value(hook_state))
        setattr_(self, "state", MappingProxyType(copy_value(dict(state))))
        setattr_(self, "_copy", None)
        setattr_(self, "_source", messages)

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The transcript so far (this hook's own copy)."""
        copied: list[dict[str, Any]] | None = self._copy
        if copied is None:
            copied = copy_messages(self._source or ())
            object.__setattr__(self, "_copy", copied)
            object.__setattr__(self, "_source", None)
        return copied

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"HookContext is read-only: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"HookContext is read-only: cannot delete {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HookContext):
            return NotImplemented
        return _fields(self) == _fields(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"HookContext(run_id={self.run_id!r}, messages=[{len(self.messages)} messages], "
            f"model_calls={self.model_calls!r}, hook_state={self.hook_state!r}, "
            f"state={dict(self.state)!r})"
        )


def _fields(ctx: HookContext) -> tuple[Any, ...]:
    return (ctx.run_id, ctx.messages, ctx.model_calls, ctx.hook_state, dict(ctx.state))


def copied_messages(ctx: HookContext) -> list[dict[str, Any]]:
    """The copy of the transcript the hook read (empty if it read none): what it may
    hand back unchanged in a `HookAction`."""
    return ctx._copy or []


_UNSET: Any = object()


class HookAction:
    """What a hook wants.

    `state`: a value to keep for this hook (later calls see it as `ctx.hook_state`; it is
    saved with the thread). `messages` (`before_model` only): the transcript to send
    instead, and to keep. `message` (`after_model` only): the assistant message to use
    instead of the model's reply. `end=True` ends the run now (`stop_reason ==
    "hook_end"`) with `output` as its result.
    """

    __slots__ = ("end", "message", "messages", "output", "state")

    def __init__(
        self,
        *,
        state: Any = _UNSET,
        messages: Sequence[Mapping[str, Any]] | None = None,
        message: Mapping[str, Any] | None = None,
        end: bool = False,
        output: Any = None,
    ) -> None:
        self.state = state
        self.messages = messages
        self.message = message
        self.end = bool(end)
        self.output = output

    @property
    def saves_state(self) -> bool:
        """True when the action carries a `state` to save."""
        return self.state is not _UNSET

    def __repr__(self) -> str:
        parts = [
            f"{k}={getattr(self, k)!r}"
            for k in ("messages", "message", "output")
            if getattr(self, k) is not None
        ]
        if self.saves_state:
            parts.insert(0, f"state={self.state!r}")
        if self.end:
            parts.append("end=True")
        return f"HookAction({', '.join(parts)})"


@dataclass(slots=True)
class ToolCall:
    """A tool call going through `before_tool`: change `name` or `args` and return it."""

    call_id: str
    name: str
    args: dict[str, Any] = field(default_factory=dict)


class ToolResult:
    """Returned by `before_tool`: the model sees `value` as the call's result and the tool
    is skipped (e.g. a cached answer)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"ToolResult({self.value!r})"


class HookFailedError(CriogenError):
    """A hook raised in `on_start`, `before_model` or `after_model` (code `hook_failed`)."""

    code = "hook_failed"

    def __init__(self, message: str, *, hook: str, method: str) -> None:
        super().__init__(message)
        self.hook = hook
        self.method = method


HookFn = tuple[str, Callable[..., Any]]


@dataclass(frozen=True, slots=True)
class CompiledHooks:
    """The hooks of an agent, bound per method in the order they run."""

    on_start: tuple[HookFn, ...] = ()
    before_model: tuple[HookFn, ...] = ()
    after_model: tuple[HookFn, ...] = ()
    before_tool: tuple[HookFn, ...] = ()
    after_tool: tuple[HookFn, ...] = ()
    on_end: tuple[HookFn, ...] = ()

    @property
    def any(self) -> bool:
        return bool(
            self.on_start
            or self.before_model
            or self.after_model
            or self.before_tool
            or self.after_tool
            or self.on_end
        )


def hook_name(hook: object) -> str:
    name = getattr(hook, "name", None)
    if isinstance(name, str) and name:
        return name
    return type(hook).__name__


def compile_hooks(hooks: Sequence[object]) -> CompiledHooks:
    """Check the hooks and bind their methods; raises `TypeError` / `ValidationError`."""
    if isinstance(hooks, str | bytes) or not isinstance(hooks, Sequence | tuple | list):
        raise TypeError(f"hooks must be a list of hooks, got {type(hooks).__name__}")
    per: dict[str, list[HookFn]] = {m: [] for m in HOOK_METHODS}
    seen: set[str] = set()
    for hook in hooks:
        name = hook_name(hook)
        methods = {m: getattr(hook, m, None) for m in HOOK_METHODS}
        found = {m: fn for m, fn in methods.items() if fn is not None}
        if not found:
            camel = [c for c in _CAMEL if getattr(hook, c, None) is not None]
            hint = (
                f" (found {camel}: Python hooks use snake_case, e.g. {_CAMEL[camel[0]]!r})"
                if camel
                else ""
            )
            raise TypeError(
                f"hook {hook!r} has none of the hook methods {list(HOOK_METHODS)}{hint}"
            )
        for m, fn in found.items():
            if not callable(fn):
                raise TypeError(f"hook {name!r}: {m} must be callable, got {fn!r}")
        if name in seen:
            raise ValidationError(
                f"two hooks are named {name!r}; give each a unique `name` (it keys the hook's "
                "saved state)",
                code="invalid_value",
            )
        seen.add(name)
        for m, fn in found.items():
            per[m].append((name, fn))
    return CompiledHooks(
        on_start=tuple(per["on_start"]),
        before_model=tuple(per["before_model"]),
        after_model=tuple(reversed(per["after_model"])),
        before_tool=tuple(per["before_tool"]),
        after_tool=tuple(reversed(per["after_tool"])),
        on_end=tuple(reversed(per["on_end"])),
    )


def copy_value(value: Any) -> Any:
    """A copy of a JSON-like value (dicts, lists, tuples and sets copied all the way
    down, anything else shared), for a hook to change as it likes."""
    kind = type(value)
    if kind is dict:
        return {k: copy_value(v) for k, v in value.items()}
    if kind is list:
        return [copy_value(v) for v in value]
    if kind is tuple:
        return tuple(copy_value(v) for v in value)
    if kind is set:
        return {copy_value(v) for v in value}
    return value


_NESTED = (dict, list, tuple, set)


def copy_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The transcript as a hook gets it: a list of copied messages. Hooks are handed
    copies because the transcript they would otherwise share is the run's own (and this
    process's cached copy of the saved thread): an in-place change would reach neither
    storage nor the model reliably, only fork the cache from what is saved."""
    try:
        # A transcript is plain data (dicts, lists, strings, numbers): `marshal` copies it
        # in C, a few times faster than walking it, which counts on long threads.
        copied: list[dict[str, Any]] = marshal.loads(marshal.dumps(messages))  # type: ignore[arg-type]
    except (ValueError, TypeError):
        pass  # something marshal does not write (an object, a dict subclass): walk it
    else:
        if type(copied) is list:
            return copied
    out = []
    for m in messages:
        c = dict(m)
        for k, v in c.items():
            if type(v) in _NESTED:
                c[k] = copy_value(v)
        out.append(c)
    return out


async def call_hook(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a sync or async hook method."""
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


async def call_run_hook(name: str, method: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Call a hook method of the run (`on_start`, `before_model`, `after_model`): its raise,
    or an `asyncio.CancelledError` of its own while the run is not being cancelled, fails
    the run with `HookFailedError`."""
    try:
        return await call_hook(fn, *args)
    except asyncio.CancelledError as exc:
        if cancel_pending():
            raise
        raise HookFailedError(
            f"hook {name!r} raised asyncio.CancelledError in {method} (the run was not cancelled)",
            hook=name,
            method=method,
        ) from exc
    except Exception as exc:
        raise HookFailedError(
            f"hook {name!r} raised in {method}: {type(exc).__name__}: {exc}",
            hook=name,
            method=method,
        ) from exc
