"""Hooks: your code around the agent loop, before and after model and tool calls."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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
      or retry), before anything else; may return `HookAction(state=...)`.
    - `before_model(ctx)`: before each model call; may replace the transcript
      (`HookAction(messages=...)`, kept) or end the run (`HookAction(end=True, output=...)`).
    - `after_model(ctx)`: after each model reply (`ctx.messages` ends with it); may
      replace it (`HookAction(message=...)`) or end the run.
    - `before_tool(call)`: before each tool call; return a changed `ToolCall` to run that
      instead, a `ToolResult` to skip the tool, or `None`. Raising `ToolError` gives the
      model that error instead of running the tool.
    - `after_tool(call, result)`: after each tool call that produced a result; anything
      but `None` replaces the result the model sees.
    - `on_end(ctx, outcome)`: always, once per run segment, with `"completed"`,
      `"suspended"` or `"failed"`; cannot change the outcome.

    `on_start`, `before_model` and `before_tool` run in list order, the others in
    reverse. A raise in `on_start`, `before_model` or `after_model` fails the run with a
    `CriogenError` of code `"hook_failed"` (the exception is its `__cause__`); a raise in
    `before_tool` or `after_tool` counts as the tool's (see `on_tool_exception`). `name`
    (default: the class name) is shown in errors and audit records and keys the hook's
    saved state, so it must be unique among an agent's hooks.
    """

    @property
    def name(self) -> str:
        return type(self).__name__


@dataclass(frozen=True, slots=True)
class HookContext:
    """What a hook sees: the run id, the transcript so far, the model calls made in this
    run, what this hook saved with `HookAction(state=...)`, and the run state (read-only)."""

    run_id: str
    messages: list[dict[str, Any]]
    model_calls: int
    hook_state: Any
    state: Mapping[str, Any]


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


async def call_hook(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a sync or async hook method."""
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result
