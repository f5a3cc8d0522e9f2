"""The `tools` node: one task per tool call (a `Send`), so each finished call is saved as
its own pending write and is never run again. Decisions, `before_tool` / `after_tool`
hooks, the middleware's `wrap_tool_call`, argument validation, timeouts, tool retries and
`on_tool_exception` live here.

Middleware and the result: what the chain returns is the call's value, whether or not the
tool ran (a middleware that answers without calling the handler, such as a cache, gives an
`ok` result, which counts as a tool call for `Limits.tool_calls`). A middleware that puts
in another `tool` (or the `name` of another of the agent's tools) runs that tool, and the
message's `tool` field names it. The handler raises `ToolArgumentsError` for arguments
that do not fit the schema (its message is what the model reads), `TimeoutError` for a
tool that ran out of time, and whatever the tool raised.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphBubbleUp
from pydantic_core import to_jsonable_python

from criogen_graph._aio import cancel_pending, to_the_end
from criogen_graph.errors import LimitExceededError, ToolError, ToolExecutionError
from criogen_graph.graph.events import Writer, step_of, stream_writer
from criogen_graph.graph.invocation import invocation_of
from criogen_graph.graph.spec import AgentSpec
from criogen_graph.graph.state import add_usage
from criogen_graph.hooks import ToolCall, ToolResult, call_hook, copy_value
from criogen_graph.messages import Usage
from criogen_graph.middleware import Middleware, ToolCallRequest, ToolHandler, checked_call
from criogen_graph.redact import package_logger
from criogen_graph.runtime.segment import hand_over
from criogen_graph.telemetry.callbacks import report_tool
from criogen_graph.telemetry.observe import run_redactor, run_spans
from criogen_graph.tools import Tool, ToolArgumentsError, ToolContext

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_NOTHING: Any = object()
_log = package_logger("criogen_graph")


class ToolOutput:
    """A tool result that carries more than its value: the token usage of a sub-agent."""

    __slots__ = ("usage", "value")

    def __init__(self, value: Any, usage: Usage | None = None) -> None:
        self.value = value
        self.usage = usage


class _Timeout(TimeoutError):
    """A tool that ran out of time (what a middleware sees: a `TimeoutError`)."""

    def __init__(self, seconds: float, tool: str) -> None:
        super().__init__(f"the tool {tool} timed out after {seconds:g} s")
        self.seconds = seconds
        self.tool = tool


def _json_default(value: Any) -> Any:
    """A value `json` cannot write, as one it can: a Pydantic model or dataclass as its
    fields, a set or tuple as a list, bytes as text, anything else as `str(value)`."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


class UnserializableResultError(Exception):
    """A tool result (or what a hook made of it) that cannot be written as JSON for the
    model: it contains itself, it is nested too deep, or converting a part of it raised.
    The call is finished all the same; `on_tool_exception` decides what follows."""


def to_content(value: Any) -> str:
    """A tool result as the text the model reads: a string as it is, anything else as
    JSON (see `_json_default`), NaN and infinities as `null` (as JavaScript writes them:
    a provider must only ever get valid JSON). Raises `UnserializableResultError`."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, default=_json_default, ensure_ascii=False, allow_nan=False)
    except Exception:
        pass  # not plain JSON: find out why (slowly), and write what can be written
    plain = _plain(value, set())
    try:
        return json.dumps(plain, ensure_ascii=False, allow_nan=False)
    except RecursionError:
        raise UnserializableResultError(
            "the result cannot be written as JSON: it is nested too deep"
        ) from None


def _plain(value: Any, path: set[int]) -> Any:
    """`value` as plain JSON data (what `json.dumps` with `_json_default` would write,
    NaN and infinities as None); `path` holds the containers being written, to tell a
    cycle. Raises `UnserializableResultError` naming the problem."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict | list | tuple):
        return _plain_container(value, path)
    try:
        converted = _json_default(value)
    except Exception as exc:
        raise UnserializableResultError(
            f"the result cannot be written as JSON: converting its {type(value).__name__} "
            f"raised {_exc_text(exc)}"
        ) from exc
    return _plain(converted, path)


def _plain_container(value: dict[Any, Any] | list[Any] | tuple[Any, ...], path: set[int]) -> Any:
    """A dict, list or tuple as plain JSON data (see `_plain`)."""
    if id(value) in path:
        raise UnserializableResultError(
            "the result cannot be written as JSON: it contains itself (a cycle)"
        )
    path.add(id(value))
    try:
        if isinstance(value, dict):
            return {_key(k): _plain(v, path) for k, v in value.items()}
        return [_plain(v, path) for v in value]
    except RecursionError:
        raise UnserializableResultError(
            "the result cannot be written as JSON: it is nested too deep"
        ) from None
    finally:
        path.discard(id(value))


def _invalid_text(name: str, exc: Exception) -> str:
    """What the model reads for arguments that do not fit a tool's schema."""
    return (
        f"invalid arguments for {name}: {exc}. Call it again with arguments that match its schema."
    )


def _copy_call(tc: ToolCall) -> ToolCall:
    """A hook's own copy of a call (see `HookContext`: hooks get copies)."""
    return ToolCall(tc.call_id, tc.name, copy_value(tc.args))


def _redacted(redactor: Any, value: Any) -> Any:
    """`redactor.redact_value(value)`; a value it cannot walk (a cycle, too deep) raises
    `UnserializableResultError` saying why, as writing it would."""
    try:
        return redactor.redact_value(value)
    except RecursionError:
        _plain(value, set())  # names a cycle
        raise UnserializableResultError(
            "the result cannot be written as JSON: it is nested too deep"
        ) from None


def _key(key: Any) -> str:
    """A dict key as JSON writes it (a key `json` refuses becomes its `str`)."""
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool):
        return json.dumps(key)
    if isinstance(key, int | float):
        return json.dumps(_plain(key, set()))
    try:
        return str(key)
    except Exception as exc:
        raise UnserializableResultError(
            f"the result cannot be written as JSON: a {type(key).__name__} key of it has "
            f"no text ({_exc_text(exc)})"
        ) from exc


def _exc_text(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception as inner:  # an exception whose own message raises
        text = f"(its message could not be read: {type(inner).__name__})"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _Call:
    """One tool call on its way through the node: what its result message is made of,
    and what happened to it so far."""

    __slots__ = (
        "args",
        "call",
        "call_id",
        "called",
        "changed_by",
        "finished",
        "name",
        "note",
        "outcome",
        "redactor",
        "started",
        "swapped",
        "usage",
        "writer",
    )

    def __init__(self, call: dict[str, Any], redactor: Any, writer: Writer | None) -> None:
        self.call = call
        self.call_id: str = call["id"]
        #: The tool the model called, and the one to run (a reviewer's edit changes it).
        self.called: str = call["name"]
        self.name = self.called
        self.args: dict[str, Any] = call.get("args") or {}
        self.note: str | None = None
        self.changed_by: list[str] = []
        self.redactor = redactor
        self.writer = writer
        #: `tool_call_started` was written.
        self.started = False
        #: A tool function returned (or answered with `ToolError`): the call must not run
        #: again, whatever comes after.
        self.finished = False
        #: What the tool function returned last (a 1-tuple), or the `ToolError` it
        #: answered with: the call's outcome if its middleware cannot finish.
        self.outcome: tuple[Any] | ToolError | None = None
        #: The tool a middleware ran instead of the call's own (the last one that ran).
        self.swapped: Tool | None = None
        #: The token usage of the sub-agents that ran as this call's tool.
        self.usage: Usage | None = None

    def tool_outcome(self) -> Any:
        """What the tool function returned (or raise the `ToolError` it answered with)."""
        outcome = self.outcome
        if isinstance(outcome, ToolError):
            raise outcome
        assert outcome is not None, "the tool has not returned"
        return outcome[0]

    def message(
        self, content: str, status: str, *, clean: bool = False, **extra: Any
    ) -> dict[str, Any]:
        """The call's result message (redacted unless `clean`)."""
        redactor = self.redactor
        if redactor is not None:
            if not clean:
                content = redactor.redact(content)
            if "artifact" in extra:
                extra["artifact"] = redactor.redact_value(extra["artifact"])
        msg: dict[str, Any] = {
            "role": "tool",
            "tool_call_id": self.call_id,
            "name": self.called,
            "content": content,
            "status": status,
        }
        if extra:
            msg.update(extra)
        if self.changed_by:
            msg["changed_by"] = self.changed_by
        return msg

    def done(
        self, content: str, status: str, *, clean: bool = False, **extra: Any
    ) -> dict[str, Any]:
        """The message of a call that went on to run: a reviewer's edit noted ahead of the
        result, and the tool that ran when it is not the one called."""
        if self.note is not None:
            # The edit's args are redacted (`check_decisions`); the note and the
            # result are redacted as one text, as a pattern may span both.
            clean = False
            content = self.note + content
            extra["decision"] = "edit"
            if self.name != self.called:
                extra["tool"] = self.name
        if self.swapped is not None and self.swapped.name != self.called:
            extra["tool"] = self.swapped.name
        return self.message(content, status, clean=clean, **extra)

    def result(self, content: str, value: Any, tool: Tool | None) -> dict[str, Any]:
        """The message of a call with a value, `content` its JSON; `tool` the call's tool
        (None: a `before_tool` hook gave the value)."""
        # A text result no hook replaced was redacted above; once is enough. (Other
        # values are redacted as the JSON the model reads: objects may hide strings.)
        clean = not self.changed_by and isinstance(value, str)
        extra: dict[str, Any] = {"usage": self.usage} if self.usage else {}
        if tool is None:
            return self.done(content, "skipped", clean=clean, **extra)
        if (self.swapped or tool).return_direct:
            extra["return_direct"] = True
        return self.done(content, "ok", clean=clean, **extra)

    def add_usage(self, usage: Usage | None) -> None:
        """Count the token usage of a sub-agent that ran as the tool."""
        if usage:
            self.usage = usage if self.usage is None else add_usage(self.usage, usage)

    def decide(self, decision: dict[str, Any]) -> dict[str, Any] | None:
        """Apply a reviewer's decision: the message of a call that does not run (reject,
        respond), or None after taking in an edit."""
        kind = decision["type"]
        if kind == "reject":
            reason = decision.get("message")
            # Saying so plainly keeps models from re-issuing a rejected call.
            return self.message(
                f"A reviewer rejected this call to {self.called}"
                + (f": {reason.rstrip(' .')}" if reason and reason != "rejected" else "")
                + ". Do not retry it; continue without it.",
                "rejected",
                decision=kind,
            )
        if kind == "respond":
            return self.message(decision["message"], "skipped", decision=kind)
        if kind == "edit":
            self.name = decision.get("name") or self.called
            self.args = decision.get("args") or {}
            self.note = (
                f"[A reviewer edited this call before it ran: it ran as {self.name} with "
                f"{to_content(self.args)}. Do not repeat the original call.]\n"
            )
        return None


class _InvalidArguments(ToolArgumentsError):
    """Arguments that do not fit the tool's schema; the text is what the model reads."""


class _UnknownTool(ToolError):
    """A middleware named a tool the agent does not have."""


def _layer(middleware: Middleware, handler: ToolHandler) -> ToolHandler:
    """`handler` wrapped in one middleware."""

    async def call(request: ToolCallRequest) -> Any:
        return await checked_call(middleware, "wrap_tool_call", request, handler)

    return call


async def _guarded(run: _Call, chain: Awaitable[Any], grace: float) -> Any:
    """Await the middleware chain of a call in a task of its own.

    A cancellation of the run reaches the chain only while no tool function of the call
    has finished (it stops the tool at its `await`, as without middleware). Once one has,
    the chain runs to its end and the cancellation waits (as it waits for `after_tool`
    hooks): what the chain returns is saved, and the tool never runs again. It waits
    `grace` seconds at most (the tool's timeout): a middleware still awaiting then is
    cancelled and left, and the tool's own outcome is the call's, so a cancelled run
    always ends.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(chain)
    forwarded = False
    deadline: float | None = None
    while True:
        try:
            if deadline is None:
                return await asyncio.shield(task)
            await asyncio.wait((task,), timeout=max(0.0, deadline - loop.time()))
            if task.done():
                break
            task.cancel()
            task.add_done_callback(_retrieve)
            _log.warning(
                "tool call %s: a middleware still awaited %g s after the tool returned, "
                "while the run was being cancelled; the tool's own result is kept",
                run.call_id,
                grace,
            )
            return run.tool_outcome()
        except asyncio.CancelledError:
            if task.done():
                break
            if not run.finished and not forwarded:
                forwarded = True
                task.cancel()
            elif run.finished and deadline is None:
                deadline = loop.time() + grace
    if task.cancelled() and not forwarded and not cancel_pending():
        raise RuntimeError("a middleware raised asyncio.CancelledError; nothing cancelled the run")
    return task.result()


class ToolsNode:
    def __init__(self, spec: AgentSpec) -> None:
        self.spec = spec
        # Only the middleware that wrap tool calls: with none, no chain is built.
        self.wrappers = tuple(
            m for m in spec.middleware if type(m).wrap_tool_call is not Middleware.wrap_tool_call
        )

    async def __call__(self, payload: dict[str, Any], config: RunnableConfig) -> None:
        if not self.spec.loaded:
            await self.spec.ensure_tools()  # e.g. a retry after a restart, in Studio
        seg = invocation_of(config)
        if seg is not None and not seg.started:
            # A retry that starts with the calls left to run: the model node that follows
            # writes what `on_start` saved (a call's task writes only its result).
            states = await seg.start_from(config)
            if states is not None:
                seg.unsaved_states = states
        spans = run_spans(self.spec)
        if spans is not None:
            msg = await report_tool(self.spec, payload, self._traced(payload, config, spans))
        else:
            writer = stream_writer(config)
            if writer is None:
                msg = await report_tool(self.spec, payload, self.run_call(payload, config, None))
            else:
                msg = await report_tool(self.spec, payload, self._streamed(payload, config, writer))
        if seg is not None and seg.note_records:
            seg.records.append(msg)
        return _hand_over(config, msg)

    async def _streamed(
        self, payload: dict[str, Any], config: RunnableConfig, writer: Writer
    ) -> dict[str, Any]:
        step = step_of(config)
        writer({"type": "other", "event": "step_started", "node": "tools", "step": step})
        msg = await self.run_call(payload, config, writer)
        writer(
            {
                "type": "tool_call_finished",
                "call_id": msg["tool_call_id"],
                "tool": msg.get("tool", msg["name"]),
                "status": msg["status"],
            }
        )
        writer({"type": "message", "message": msg})
        writer({"type": "other", "event": "step_finished", "node": "tools", "step": step})
        return msg

    async def _traced(
        self, payload: dict[str, Any], config: RunnableConfig, spans: Any
    ) -> dict[str, Any]:
        call = payload["call"]
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call["name"],
            "gen_ai.tool.call.id": call["id"],
            "gen_ai.tool.type": "function",
        }
        if spans.content:
            attributes["gen_ai.tool.call.arguments"] = spans.text(call.get("args") or {})
        with spans.span(f"execute_tool {call['name']}", attributes) as span:
            writer = stream_writer(config)
            if writer is None:
                msg = await self.run_call(payload, config, None)
            else:
                msg = await self._streamed(payload, config, writer)
            result = {"criogen.tool.status": msg["status"], "criogen.tool.ran_as": msg.get("tool")}
            decision = payload.get("decision")
            if decision is not None:
                result["criogen.tool.decision"] = decision["type"]
            if spans.content:
                result["gen_ai.tool.call.result"] = spans.text(msg["content"])
            spans.set(span, result)
            if msg["status"] == "error":
                spans.fail(span, msg.get("error_kind") or "tool_error", msg["content"])
        return msg

    async def run_call(
        self, payload: dict[str, Any], config: RunnableConfig, writer: Writer | None
    ) -> dict[str, Any]:
        """Run one call: its decision, `before_tool` hooks, middleware and tool, then
        `after_tool` hooks; its result message."""
        run = _Call(payload["call"], run_redactor(self.spec), writer)
        decision = payload.get("decision")
        if decision is not None:
            answered = run.decide(decision)
            if answered is not None:
                return answered
        ctx = ToolContext(
            run_id=payload.get("run_id", ""),
            call_id=run.call_id,
            tool=run.name,
            thread_id=(config.get("configurable") or {}).get("thread_id"),
            state=MappingProxyType(payload["state"]) if "state" in payload else _EMPTY,
        )
        # A copy all the way down: the call's args are the transcript's, which hooks and
        # the tool must not change in place.
        tc = ToolCall(run.call_id, run.name, copy_value(run.args))
        if self.spec.hooks.before_tool:
            before = await self._before(run, tc)
            if isinstance(before, dict):
                return before
            tc, answer = before
            if answer is not None:
                return await self._finish(run, tc, answer.value, None, config)
            if tc.name != run.name:
                ctx = dataclasses.replace(ctx, tool=tc.name)
        tool = self._tool_for(run, tc)
        if isinstance(tool, dict):
            return tool
        try:
            if self.wrappers:
                value = await self._through_middleware(run, tool, tc, ctx)
            else:
                value = await self._invoke(run, tool, tc.args, ctx)
        except (asyncio.CancelledError, GraphBubbleUp):
            raise
        except Exception as exc:
            return self._tool_failed(exc, run, tc, config)
        return await self._finish(run, tc, value, tool, config)

    async def _before(
        self, run: _Call, tc: ToolCall
    ) -> tuple[ToolCall, ToolResult | None] | dict[str, Any]:
        """The call after the `before_tool` hooks, with the result a hook gave instead of
        running the tool (if any); or the message of a hook's failure."""
        answer: ToolResult | None = None
        try:
            for hname, fn in self.spec.hooks.before_tool:
                # Its own copy: a change it makes counts only if it returns it.
                res = await call_hook(fn, _copy_call(tc))
                if res is None:
                    continue
                if isinstance(res, ToolResult):
                    answer = res
                    run.changed_by.append(hname)
                    break
                if isinstance(res, ToolCall):
                    tc = res
                    run.changed_by.append(hname)
                    continue
                raise TypeError(
                    f"before_tool of hook {hname!r} must return a ToolCall, a ToolResult "
                    f"or None, got {type(res).__name__}"
                )
        except ToolError as exc:
            return run.done(f"Error: {exc.message}", "error", error_kind="hook")
        except GraphBubbleUp:
            raise
        except asyncio.CancelledError as exc:
            if cancel_pending():
                raise
            # Raised by the hook itself, the run not being cancelled: its failure.
            return self._failed(exc, tc, run.done, error_kind="hook")
        except Exception as exc:
            return self._failed(exc, tc, run.done, error_kind="hook")
        return tc, answer

    def _tool_for(self, run: _Call, tc: ToolCall) -> Tool | dict[str, Any]:
        """The tool `tc` names, or the message saying why it cannot run (arguments the
        model wrote that are not JSON, no such tool)."""
        call = run.call
        if "args_error" in call and tc.args == run.args and tc.name == run.called:
            return run.done(f"Error: {call['args_error']}", "error", error_kind="invalid_args")
        tool = self.spec.tools.get(tc.name)
        if tool is None:
            return run.done(f"Error: {self._unknown(tc.name)}", "error", error_kind="unknown_tool")
        return tool

    def _unknown(self, name: str) -> str:
        return (
            f"there is no tool named {name!r}. Available tools: "
            f"{', '.join(self.spec.tools) or '(none)'}."
        )

    async def _invoke(self, run: _Call, tool: Tool, args: Any, ctx: ToolContext) -> Any:
        """The innermost layer of a call: check `args` against `tool`'s schema, run it
        (timeout, retries) and return its value."""
        try:
            validated = tool.validate(args)
        except ToolArgumentsError as exc:
            raise _InvalidArguments(_invalid_text(tool.name, exc)) from None
        if run.writer is not None and not run.started:
            run.started = True
            run.writer(
                {
                    "type": "tool_call_started",
                    "call_id": run.call_id,
                    "tool": tool.name,
                    "args": to_jsonable_python(validated, fallback=str),
                }
            )
        try:
            value = await self._execute(tool, validated, ctx)
        except ToolError as exc:
            run.finished = True  # the tool's answer
            run.outcome = exc
            raise
        run.finished = True
        if isinstance(value, ToolOutput):
            run.add_usage(value.usage)
            value = value.value
        run.outcome = (value,)
        return value

    async def _through_middleware(
        self, run: _Call, tool: Tool, tc: ToolCall, ctx: ToolContext
    ) -> Any:
        """Run the call through the agent's middleware (the first outermost) around
        `_invoke`; what the chain returns is the call's value."""
        origin = ToolCallRequest(tc.name, tc.args, tool, ctx)

        async def innermost(request: ToolCallRequest) -> Any:
            ran = self._chosen(request, origin)
            run.swapped = ran if ran is not origin.tool else None
            context = request.context
            if context.tool != ran.name:
                context = dataclasses.replace(context, tool=ran.name)
            return await self._invoke(run, ran, request.args, context)

        handler: ToolHandler = innermost
        for middleware in reversed(self.wrappers):
            handler = _layer(middleware, handler)
        grace = tool.timeout_secs or self.spec.limits.tool_timeout_secs
        return await _guarded(run, handler(origin), grace)

    def _chosen(self, request: ToolCallRequest, origin: ToolCallRequest) -> Tool:
        """The tool a request runs: a `tool` a middleware put in, else the agent's tool of
        the `name` it put in (`_UnknownTool` if there is none), else the call's own."""
        if request.tool is not origin.tool or request.name == origin.name:
            return request.tool
        tool = self.spec.tools.get(request.name)
        if tool is None:
            raise _UnknownTool(self._unknown(request.name))
        return tool

    def _tool_failed(
        self, exc: Exception, run: _Call, tc: ToolCall, config: RunnableConfig
    ) -> dict[str, Any]:
        """The message of a call whose tool (or argument check, or middleware) raised."""
        if isinstance(exc, ToolArgumentsError):
            text = str(exc) if isinstance(exc, _InvalidArguments) else _invalid_text(tc.name, exc)
            return run.done(f"Error: {text}", "error", error_kind="invalid_args")
        if isinstance(exc, _UnknownTool):
            return run.done(f"Error: {exc.message}", "error", error_kind="unknown_tool")
        if isinstance(exc, ToolError):
            return run.done(f"Error: {exc.message}", "error")
        if isinstance(exc, _Timeout):
            return run.done(
                f"Error: the tool {exc.tool} timed out after {exc.seconds:g} s.", "timeout"
            )
        if isinstance(exc, LimitExceededError) and exc.limit == "agent_depth":
            raise exc
        # A middleware that raised after a tool function returned: the call is finished.
        return self._failed(exc, tc, run.done, ran=config if run.finished else None)

    async def _finish(
        self,
        run: _Call,
        tc: ToolCall,
        value: Any,
        tool: Tool | None,
        config: RunnableConfig,
    ) -> dict[str, Any]:
        """The message of a call that has its value: redacted, through the `after_tool`
        hooks, as JSON. `tool` is None for a value a `before_tool` hook gave."""
        if isinstance(value, ToolOutput):  # as a sub-agent returns it
            run.add_usage(value.usage)
            value = value.value
        # From here on, a failure (the redactor, an after_tool hook, a result that cannot
        # be written as JSON) comes after the tool ran: the call is finished whatever
        # the policy says (`_failed` with `ran`), and is never run again. A value a
        # before_tool hook gave (`ToolResult`) ran no tool: its failure is the hook's.
        ran = config if run.finished else None
        kind = {} if tool is not None else {"error_kind": "hook"}
        try:
            if run.redactor is not None:
                value = _redacted(run.redactor, value)  # ahead of the after_tool hooks
            if self.spec.hooks.after_tool:
                try:
                    value = await self._after(run, tc, value)
                except ToolError as exc:
                    return run.done(f"Error: {exc.message}", "error")
            content = to_content(value)
        except GraphBubbleUp:
            raise
        except asyncio.CancelledError as exc:
            if cancel_pending():
                raise
            # Raised by a hook itself (`to_the_end` keeps a cancellation of the run from
            # reaching it): that hook's failure.
            return self._failed(exc, tc, run.done, ran=ran, **kind)
        except Exception as exc:
            return self._failed(exc, tc, run.done, ran=ran, **kind)
        return run.result(content, value, tool)

    async def _after(self, run: _Call, tc: ToolCall, value: Any) -> Any:
        """`value` through the `after_tool` hooks."""
        for hname, fn in self.spec.hooks.after_tool:
            # The tool ran: its result is finished even if the run is being cancelled
            # (the cancellation waits for it, see `_hand_over`).
            res = await to_the_end(call_hook(fn, _copy_call(tc), value))
            if res is not None:
                value = res
                run.changed_by.append(hname)
        return value

    async def _execute(self, tool: Tool, args: Any, ctx: ToolContext) -> Any:
        spec = self.spec
        timeout = tool.timeout_secs or spec.limits.tool_timeout_secs
        retry = spec.tool_retry
        attempts = retry.max_attempts if tool.retryable else 1
        attempt = 0
        while True:
            attempt += 1
            try:
                return await _attempt(tool, args, ctx, timeout)
            except (ToolError, GraphBubbleUp, asyncio.CancelledError):
                # An agent used as a tool that stops for approval interrupts this call;
                # LangGraph resumes it (from its own checkpoints) when the parent resumes.
                raise
            except Exception:  # a timeout (`_Timeout`) too
                if attempt >= attempts:
                    raise
                if cancel_pending():
                    # The run is being cancelled: the call did not finish, a retry of
                    # the run runs it (it is read-only or idempotent, or it would not
                    # be retried here).
                    raise asyncio.CancelledError() from None
            await asyncio.sleep(retry.backoff(attempt))

    def _failed(
        self,
        exc: BaseException,
        tc: ToolCall,
        done: Callable[..., dict[str, Any]],
        *,
        ran: RunnableConfig | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """The call's message under `on_tool_exception`, or `ToolExecutionError` for
        `"fail"`. `ran` (the task's config) says the tool function had returned: the
        call is finished, so with `"fail"` its error message is put among the task's
        writes first, saved with the failure, and `retry()` goes on from it instead of
        running the tool again."""
        policy = self.spec.on_tool_exception
        if policy == "fail":
            if ran is None:
                raise ToolExecutionError(
                    f"tool {tc.name!r} (call {tc.call_id}) raised {_exc_text(exc)}",
                    tool=tc.name,
                    call_id=tc.call_id,
                ) from exc
            _hand_over(ran, done(f"Error: {_exc_text(exc)}", "error", **extra))
            raise ToolExecutionError(
                f"tool {tc.name!r} (call {tc.call_id}) ran, then failed: {_exc_text(exc)}; "
                "the call is finished (saved with this error) and retry() does not run it "
                "again",
                tool=tc.name,
                call_id=tc.call_id,
            ) from exc
        if policy == "return_generic":
            return done(
                f"Error: the tool {tc.name} failed.",
                "error",
                artifact={"error": _exc_text(exc)},
                **extra,
            )
        return done(f"Error: {_exc_text(exc)}", "error", **extra)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Done callback of an abandoned call: its late outcome is discarded."""
    if not task.cancelled():
        task.exception()


async def _attempt(tool: Tool, args: Any, ctx: ToolContext, limit_secs: float | None) -> Any:
    """One run of `tool`, bounded by `limit_secs` (`_Timeout` when it runs out).

    A cancellation of the run (a request timeout, a client that went away) reaches an
    async tool at its `await` and stops it: it did not finish. One that arrives after it
    returned stays pending (`cancel_pending()`) until the result is handed over. A
    blocking tool cannot be stopped: see `_attempt_blocking`.
    """
    if tool.blocking:
        return await _attempt_blocking(tool, args, ctx, limit_secs)
    try:
        async with asyncio.timeout(limit_secs) as deadline:
            return await tool.run(args, ctx)
    except GeneratorExit:
        if asyncio.current_task() is None:
            raise  # this coroutine is being closed, not run: let it close
        raise _generator_exit(tool) from None
    except TimeoutError:
        if deadline.expired():
            raise _Timeout(limit_secs or 0, tool.name) from None
        raise  # the tool's own
    except asyncio.CancelledError:
        if cancel_pending():
            raise
        # Nothing cancelled the run: the tool raised CancelledError on its own, which is
        # a failure of the tool like any other.
        raise RuntimeError(
            "the tool raised asyncio.CancelledError; nothing cancelled the run"
        ) from None


async def _attempt_blocking(
    tool: Tool, args: Any, ctx: ToolContext, limit_secs: float | None
) -> Any:
    """One run of a blocking tool (a sync function in a worker thread, which nothing can
    stop), in a task of its own: past `limit_secs` the model is told it timed out while
    its thread runs on (its late result is discarded); a cancellation of the run waits
    for it to return or reach its timeout, and that outcome is kept, so it never runs
    twice."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    call = asyncio.ensure_future(tool.run(args, ctx))
    try:
        done, _ = await asyncio.wait((call,), timeout=limit_secs)
    except asyncio.CancelledError:
        left = None if limit_secs is None else max(0.0, started + limit_secs - loop.time())
        done, _ = await to_the_end(asyncio.wait((call,), timeout=left))
    if not done:
        call.cancel()
        call.add_done_callback(_retrieve)
        raise _Timeout(limit_secs or 0, tool.name)
    return _outcome(call, tool)


def _outcome(call: asyncio.Future[Any], tool: Tool) -> Any:
    """The result of a finished call, or the exception it raised."""
    if call.cancelled():
        raise RuntimeError("the tool raised asyncio.CancelledError; nothing cancelled the run")
    if isinstance(call.exception(), GeneratorExit):
        raise _generator_exit(tool) from None
    return call.result()


def _generator_exit(tool: Tool) -> RuntimeError:
    """A tool that raised `GeneratorExit` (a generator's close signal, which would stop
    the coroutines of the run around it): a failure of the tool like any other."""
    return RuntimeError(f"the tool {tool.name} raised GeneratorExit")


#: What LangGraph hands a task to add its writes to (what its `ChannelWrite` calls), the
#: id of the task, the checkpoint each graph level writes to, and the channel of the
#: graph's `tools -> model` edge.
_TASK_WRITES = "__pregel_send"
_TASK_ID = "__pregel_task_id"
_CHECKPOINTS = "checkpoint_map"
_TO_MODEL = "branch:to:model"


def _hand_over(config: RunnableConfig, msg: dict[str, Any]) -> None:
    """Put the call's result among the task's writes now, note it in the running segment
    (our storage saves it if LangGraph does not), then re-raise a cancellation that
    arrived while the call finished.

    A node's return value reaches the task's writes only after a few more awaits inside
    LangGraph, and a step of one task runs inline, where a cancellation drops its writes
    unsaved: a call that ran would be run again by a retry. With the writes in the task
    and noted, the result is saved whichever way the task ends.
    """
    configurable = config.get("configurable") or _EMPTY
    send = configurable.get(_TASK_WRITES)
    if send is None:  # pragma: no cover - every LangGraph task has one
        raise RuntimeError("the tools node runs outside a LangGraph task")
    writes: list[tuple[str, Any]] = [("messages", (msg,)), (_TO_MODEL, None)]
    send(writes)
    _note_writes(config, configurable, writes)
    if cancel_pending():
        raise asyncio.CancelledError()


def _note_writes(
    config: RunnableConfig, configurable: Mapping[str, Any], writes: list[tuple[str, Any]]
) -> None:
    """Note a task's writes in the running segment, for our storage to save them if
    LangGraph does not (a task of the thread's own graph only, not a subgraph's)."""
    task_id = configurable.get(_TASK_ID)
    if not task_id or "|" in str(configurable.get("checkpoint_ns") or ""):
        return
    checkpoint_id = (configurable.get(_CHECKPOINTS) or _EMPTY).get("")
    if not checkpoint_id:
        return
    thread_id = str(configurable.get("thread_id"))
    put = {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": "",
            "checkpoint_id": checkpoint_id,
        }
    }
    path = (config.get("metadata") or _EMPTY).get("langgraph_path")
    hand_over(thread_id, str(task_id), put, writes, _task_path(path) if path else "")


def _task_path(path: Any) -> str:
    """A task's path as LangGraph's savers key it (`langgraph.pregel._algo.task_path_str`)."""
    if isinstance(path, tuple | list):
        return "~" + ", ".join(_task_path(p) for p in path)
    if isinstance(path, int):
        return f"{path:010d}"
    return str(path)
