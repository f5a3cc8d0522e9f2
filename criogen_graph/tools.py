"""Tools: `@tool` on a function, the functional `tool(name=..., input=..., run=...)`, and
the `Tool` base class every kind of tool shares."""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import re
import types
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypedDict, TypeVar, Unpack, overload

import pydantic

from criogen_graph.errors import ToolError, ValidationError

__all__ = ["Tool", "ToolContext", "ToolError", "ToolOptions", "ToolSource", "tool"]

_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_EMPTY_STATE: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool learns about the call it serves.

    Annotate a parameter with `ToolContext` to receive it; that parameter is not part of
    the tool's input schema. `thread_id` is `None` for `agent.run`. `state` is the run
    state (read-only). `idempotency_key` is the same for every attempt of this call.
    """

    run_id: str
    call_id: str
    tool: str
    thread_id: str | None = None
    state: Mapping[str, Any] = field(default_factory=lambda: _EMPTY_STATE)

    @property
    def idempotency_key(self) -> str:
        """The same for every attempt of this call: a `retry()`, or a background worker
        continuing the run of one that died while this call ran (which runs it again).
        Pass it to the service the tool calls so that a call made twice acts once. A hash
        of the thread id (the run id for `agent.run`) and the call id, unique in the
        storage since call ids are unique in their thread."""
        import hashlib

        scope = self.thread_id if self.thread_id is not None else f"run:{self.run_id}"
        return hashlib.sha256(f"{scope}\x00{self.call_id}".encode()).hexdigest()[:32]


class ToolArgumentsError(Exception):
    """Arguments the model wrote do not fit the tool's schema (goes back to the model)."""


def check_tool_name(name: object) -> str:
    """Validate a tool name (letters, digits, `_` and `-`, at most 64)."""
    if not isinstance(name, str):
        raise TypeError(f"a tool name must be a str, got {type(name).__name__}")
    if not _NAME_RE.match(name):
        raise ValidationError(
            f"tool name {name!r} is not valid: use 1-64 letters, digits, '_' or '-'",
            code="invalid_value",
        )
    return name


class Tool:
    """A tool the model may call: a name, a description and a JSON Schema for its input.

    Subclass it and implement `run(args, ctx)` for a tool of your own, or use `@tool` /
    `tool(...)`. `read_only` and `idempotent` tools may be retried (`tool_retry`);
    `return_direct` ends the run with the tool's result as the answer; `timeout_secs`
    overrides the agent's `Limits.tool_timeout_secs` for this tool.

    `blocking` is True for a tool whose function runs in a worker thread (a sync
    function): such a call cannot be interrupted. A cancelled run waits for it to return
    (or reach its timeout) and saves that outcome, so it never runs twice; a call past its
    timeout is answered "timed out" while its thread runs on, and its late result is
    discarded.
    """

    #: True when the tool's function runs in a worker thread (see the class docstring).
    blocking: bool = False

    def __init__(
        self,
        name: str,
        description: str,
        parameters: Mapping[str, Any] | None = None,
        *,
        read_only: bool = False,
        idempotent: bool = False,
        return_direct: bool = False,
        timeout_secs: float | None = None,
    ) -> None:
        self.name = check_tool_name(name)
        if not isinstance(description, str):
            raise TypeError(f"tool {name!r}: description must be a str")
        self.description = description
        self.parameters: dict[str, Any] = dict(parameters or {"type": "object", "properties": {}})
        if self.parameters.get("type") != "object":
            raise ValidationError(
                f"tool {name!r}: the input schema must be a JSON Schema of type 'object'",
                code="invalid_value",
            )
        self.read_only = bool(read_only)
        self.idempotent = bool(idempotent)
        self.return_direct = bool(return_direct)
        if timeout_secs is not None and (
            isinstance(timeout_secs, bool)
            or not isinstance(timeout_secs, int | float)
            or timeout_secs <= 0
        ):
            raise ValidationError(
                f"tool {name!r}: timeout_secs must be a positive number", code="invalid_value"
            )
        self.timeout_secs = timeout_secs
        self._validator: Any = None

    @property
    def retryable(self) -> bool:
        """True when `tool_retry` applies (the tool is `read_only` or `idempotent`)."""
        return self.read_only or self.idempotent

    def spec(self) -> dict[str, Any]:
        """The tool as the model sees it: `{"name", "description", "parameters"}`."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def validate(self, args: Mapping[str, Any]) -> Any:
        """Check the model's arguments against the schema; raises `ToolArgumentsError`."""
        validator = self._validator
        if validator is None:
            import jsonschema  # lazy: only JSON-Schema tools pay its import

            cls = jsonschema.validators.validator_for(self.parameters)
            validator = self._validator = cls(self.parameters)
        errors = sorted(validator.iter_errors(args), key=lambda e: list(e.path))
        if errors:
            raise ToolArgumentsError(
                "; ".join(
                    (f"{'.'.join(str(p) for p in e.path)}: " if e.path else "") + e.message
                    for e in errors[:5]
                )
            )
        return dict(args)

    async def run(self, args: Any, ctx: ToolContext) -> Any:
        """Run the tool with validated `args`; return anything JSON-friendly."""
        raise NotImplementedError(f"{type(self).__name__}.run is not implemented")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class ToolSource:
    """Tools known only at run time (an MCP server lists its tools over a connection).

    Put one in `Agent(tools=[...])`: `load_tools()` runs once, before the agent's first
    model call, and its tools join the agent's. `aclose()` releases connections
    (`agent.aclose()` calls it).
    """

    name: str = "tools"

    async def load_tools(self) -> list[Tool]:
        """Connect if needed and return the tools."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Release what `load_tools` opened."""


class _JsonSchemaTool(Tool):
    """The functional `tool(name=, description=, input=, run=)`: args arrive as a dict."""

    def __init__(self, fn: Callable[..., Any], *, wants_ctx: bool, **kw: Any) -> None:
        super().__init__(**kw)
        self._fn = fn
        self._async = inspect.iscoroutinefunction(fn)
        self.blocking = not self._async
        self._wants_ctx = wants_ctx

    async def run(self, args: Any, ctx: ToolContext) -> Any:
        call_args = (args, ctx) if self._wants_ctx else (args,)
        if self._async:
            return await self._fn(*call_args)
        return await asyncio.to_thread(self._fn, *call_args)


class FunctionTool(Tool):
    """A tool made by `@tool` from a typed Python function."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        read_only: bool = False,
        idempotent: bool = False,
        return_direct: bool = False,
        timeout_secs: float | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"@tool needs a function, got {fn!r}")
        tool_name = name or getattr(fn, "__name__", None) or ""
        summary, param_docs = _parse_docstring(inspect.getdoc(fn) or "")
        self._model, self._ctx_param, self._fields = _signature_model(fn, tool_name, param_docs)
        if not (description if description is not None else summary).strip():
            # The description is all the model knows about when to call the tool, so a
            # tool without one is a mistake to catch where it is written, not at run time.
            raise ValidationError(
                f"tool {tool_name!r} has no description: give the function a docstring "
                f"(its first paragraph tells the model what the tool does) or pass "
                f"@tool(description=...)",
                code="missing",
            )
        parameters = _clean_schema(self._model.model_json_schema())
        super().__init__(
            tool_name,
            description if description is not None else summary,
            parameters,
            read_only=read_only,
            idempotent=idempotent,
            return_direct=return_direct,
            timeout_secs=timeout_secs,
        )
        self.fn = fn
        self._async = inspect.iscoroutinefunction(fn)
        self.blocking = not self._async
        functools.update_wrapper(self, fn)

    def validate(self, args: Mapping[str, Any]) -> Any:
        try:
            validated = self._model.model_validate(args)
        except pydantic.ValidationError as exc:
            raise ToolArgumentsError(_pydantic_message(exc)) from None
        # Fields go to the function as they were validated (nested models stay models).
        return validated.__dict__

    async def run(self, args: Any, ctx: ToolContext) -> Any:
        kwargs = args if self._ctx_param is None else {**args, self._ctx_param: ctx}
        if self._async:
            return await self.fn(**kwargs)
        return await asyncio.to_thread(self.fn, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (handy in tests)."""
        return self.fn(*args, **kwargs)


def _pydantic_message(exc: pydantic.ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False)[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")))
    return "; ".join(parts)


def _is_context_hint(hint: Any) -> bool:
    if hint is ToolContext:
        return True
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return _is_context_hint(typing.get_args(hint)[0])
    if origin in (typing.Union, types.UnionType):
        return any(_is_context_hint(a) for a in typing.get_args(hint) if a is not type(None))
    return False


def _signature_model(
    fn: Callable[..., Any], tool_name: str, param_docs: dict[str, str]
) -> tuple[type[pydantic.BaseModel], str | None, tuple[str, ...]]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"@tool cannot read the signature of {fn!r}: {exc}") from exc
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise TypeError(
            f"tool {tool_name!r}: its type hints cannot be resolved ({exc}); "
            "define the types it names before decorating it"
        ) from exc
    ctx_param: str | None = None
    fields: dict[str, Any] = {}
    for pname, param in sig.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(
                f"tool {tool_name!r}: *{pname} / **{pname} cannot be described to a model; "
                "give every input a named, typed parameter"
            )
        if param.kind is param.POSITIONAL_ONLY:
            raise TypeError(f"tool {tool_name!r}: parameter {pname!r} must not be positional-only")
        hint = hints.get(pname, inspect.Parameter.empty)
        if hint is not inspect.Parameter.empty and _is_context_hint(hint):
            ctx_param = pname
            continue
        if hint is inspect.Parameter.empty:
            raise TypeError(
                f"tool {tool_name!r}: parameter {pname!r} has no type hint; annotate it so the "
                "model gets a schema for it"
            )
        default = ... if param.default is inspect.Parameter.empty else param.default
        desc = param_docs.get(pname)
        fields[pname] = (hint, pydantic.Field(default, description=desc) if desc else default)
    try:
        model = pydantic.create_model(
            f"{tool_name or 'tool'}_input",
            __config__=pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=False),
            **fields,
        )
        model.model_json_schema()
    except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError, TypeError) as exc:
        raise TypeError(
            f"tool {tool_name!r}: its type hints cannot make an input schema: {exc}"
        ) from exc
    return model, ctx_param, tuple(fields)


def _clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop pydantic's generated titles; models do not need them."""

    def strip(node: Any, in_properties: bool = False) -> Any:
        if isinstance(node, dict):
            return {
                k: strip(v, k in ("properties", "$defs", "definitions"))
                for k, v in node.items()
                if not (k == "title" and not in_properties and isinstance(v, str))
            }
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    out: dict[str, Any] = strip(schema)
    out.setdefault("properties", {})
    return out


_SECTION_RE = re.compile(
    r"^(Args|Arguments|Parameters|Params|Returns|Return|Raises|Yields|Examples?|Notes?)\s*:?\s*$"
)


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The description (text before the first section) and per-parameter docs from a
    Google-style `Args:` section or Sphinx `:param x:` lines."""
    lines = doc.splitlines()
    summary: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    for raw in lines:
        line = raw.rstrip()
        stripped = line.strip()
        m = _SECTION_RE.match(stripped)
        if m and (not line.startswith(" ")):
            section = m.group(1).lower()
            current = None
            continue
        sphinx = re.match(r"^:param\s+(?:\S+\s+)?(\w+)\s*:\s*(.*)$", stripped)
        if sphinx:
            params[sphinx.group(1)] = sphinx.group(2).strip()
            section = "sphinx"
            continue
        if section is None:
            summary.append(line)
        elif section in ("args", "arguments", "parameters", "params"):
            pm = re.match(r"^(\w+)\s*(\([^)]*\))?\s*:\s*(.*)$", stripped)
            if pm and (len(line) - len(line.lstrip())) <= 4:
                current = pm.group(1)
                params[current] = pm.group(3).strip()
            elif current and stripped:
                params[current] = (params[current] + " " + stripped).strip()
    return "\n".join(summary).strip(), params


F = TypeVar("F", bound=Callable[..., Any])


class ToolOptions(TypedDict, total=False):
    """The options `tool(...)` takes in both of its forms (see `tool`)."""

    read_only: bool
    idempotent: bool
    return_direct: bool
    timeout_secs: float | None


@overload
def tool(fn: Callable[..., Any], /) -> FunctionTool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    **options: Unpack[ToolOptions],
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


@overload
def tool(
    *,
    name: str,
    description: str,
    input: Mapping[str, Any] | None = None,
    run: Callable[..., Any | Awaitable[Any]],
    **options: Unpack[ToolOptions],
) -> Tool: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    input: Mapping[str, Any] | None = None,
    run: Callable[..., Any] | None = None,
    read_only: bool = False,
    idempotent: bool = False,
    return_direct: bool = False,
    timeout_secs: float | None = None,
) -> Any:
    """Make a tool.

    As a decorator, `@tool` or `@tool(name=..., description=..., read_only=...,
    idempotent=..., return_direct=..., timeout_secs=...)` on a sync or async function:
    the input schema comes from the type hints (through Pydantic), the description from
    the docstring (its `Args:` section describes the parameters). A parameter annotated
    `ToolContext` receives the call's context and is not part of the schema. Sync
    functions run in a worker thread so they never block the event loop; Python cannot
    stop a thread, so a sync call past its timeout is answered to the model as timed out
    (the run goes on) while the function keeps running in its worker thread until it
    returns by itself, and what it returns then is discarded, never saved or shown.

    The result is what the model reads: a string as it is, anything else as JSON
    (Pydantic models and dataclasses as their fields, sets and tuples as lists, other
    objects as `str()`; NaN and infinities as `null`). A result that cannot be written so
    (it contains itself, is nested too deep, or converting a part of it raises) is an
    error of the call under `on_tool_exception`; the call still counts as finished and is
    never run again.

    As a function, `tool(name=..., description=..., input=json_schema, run=fn)`: `fn(args)`
    or `fn(args, ctx)` gets the arguments as a dict, checked against `input` first.
    """
    options: dict[str, Any] = {
        "read_only": read_only,
        "idempotent": idempotent,
        "return_direct": return_direct,
        "timeout_secs": timeout_secs,
    }
    if run is not None:
        if fn is not None:
            raise TypeError("tool(): give either a function to decorate or run=, not both")
        if name is None or description is None:
            raise TypeError("tool(run=...) needs name= and description=")
        if not callable(run):
            raise TypeError(f"tool(run=...) must be callable, got {run!r}")
        if input is not None and not isinstance(input, Mapping):
            raise TypeError("tool(input=...) must be a JSON Schema dict")
        try:
            positional = [
                p
                for p in inspect.signature(run).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            ]
        except (TypeError, ValueError):
            positional = []
        return _JsonSchemaTool(
            run,
            wants_ctx=len(positional) >= 2,
            name=name,
            description=description,
            parameters=json.loads(json.dumps(input)) if input is not None else None,
            **options,
        )
    if input is not None:
        raise TypeError("tool(input=...) is only for the functional form with run=")
    if fn is not None:
        return FunctionTool(fn, name=name, description=description, **options)

    def decorate(f: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(f, name=name, description=description, **options)

    return decorate
