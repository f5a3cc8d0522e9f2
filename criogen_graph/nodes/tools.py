"""The `tools` node: one task per tool call (a `Send`), so each finished call is saved as
its own pending write and is never run again. Decisions, `before_tool` / `after_tool`
hooks, argument validation, timeouts, tool retries and `on_tool_exception` live here."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphBubbleUp
from pydantic_core import to_jsonable_python

from criogen_graph._observe import run_redactor, run_spans
from criogen_graph.errors import LimitExceededError, ToolError, ToolExecutionError
from criogen_graph.hooks import ToolCall, ToolResult, call_hook
from criogen_graph.nodes.model import Writer, step_of, stream_writer
from criogen_graph.nodes.spec import AgentSpec
from criogen_graph.tools import Tool, ToolArgumentsError, ToolContext

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_NOTHING: Any = object()


class ToolOutput:
    """A tool result that carries more than its value: the token usage of a sub-agent."""

    __slots__ = ("usage", "value")

    def __init__(self, value: Any, usage: dict[str, int] | None = None) -> None:
        self.value = value
        self.usage = usage


class _Timeout(Exception):
    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.seconds = seconds


def _json_default(value: Any) -> Any:
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


def to_content(value: Any) -> str:
    """A tool result as the text the model reads (JSON for anything but a string)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, default=_json_default, ensure_ascii=False)


def _exc_text(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class ToolsNode:
    def __init__(self, spec: AgentSpec) -> None:
        self.spec = spec

    async def __call__(self, payload: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        if not self.spec.loaded:
            await self.spec.ensure_tools()  # e.g. a retry after a restart, in Studio
        spans = run_spans(self.spec)
        if spans is not None:
            return await self._traced(payload, config, spans)
        writer = stream_writer(config)
        if writer is None:
            return {"messages": (await self.run_call(payload, config, None),)}
        return await self._streamed(payload, config, writer)

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
        return {"messages": (msg,)}

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
                msg = (await self._streamed(payload, config, writer))["messages"][0]
            result = {"criogen.tool.status": msg["status"], "criogen.tool.ran_as": msg.get("tool")}
            decision = payload.get("decision")
            if decision is not None:
                result["criogen.tool.decision"] = decision["type"]
            if spans.content:
                result["gen_ai.tool.call.result"] = spans.text(msg["content"])
            spans.set(span, result)
        return {"messages": (msg,)}

    async def run_call(
        self, payload: dict[str, Any], config: RunnableConfig, writer: Writer | None
    ) -> dict[str, Any]:
        spec = self.spec
        call: dict[str, Any] = payload["call"]
        call_id: str = call["id"]
        called: str = call["name"]
        name = called
        args: dict[str, Any] = call.get("args") or {}
        note: str | None = None
        changed_by: list[str] = []

        redactor = run_redactor(spec)

        def message(
            content: str, status: str, *, clean: bool = False, **extra: Any
        ) -> dict[str, Any]:
            if redactor is not None:
                if not clean:
                    content = redactor.redact(content)
                if "artifact" in extra:
                    extra["artifact"] = redactor.redact_value(extra["artifact"])
            msg: dict[str, Any] = {
                "role": "tool",
                "tool_call_id": call_id,
                "name": called,
                "content": content,
                "status": status,
            }
            if extra:
                msg.update(extra)
            if changed_by:
                msg["changed_by"] = changed_by
            return msg

        decision = payload.get("decision")
        if decision is not None:
            kind = decision["type"]
            if kind == "reject":
                reason = decision.get("message")
                # Saying so plainly keeps models from re-issuing a rejected call.
                return message(
                    f"A reviewer rejected this call to {called}"
                    + (f": {reason.rstrip(' .')}" if reason and reason != "rejected" else "")
                    + ". Do not retry it; continue without it.",
                    "rejected",
                    decision=kind,
                )
            if kind == "respond":
                return message(decision["message"], "skipped", decision=kind)
            if kind == "edit":
                name = decision.get("name") or called
                args = decision.get("args") or {}
                note = (
                    f"[A reviewer edited this call before it ran: it ran as {name} with "
                    f"{to_content(args)}. Do not repeat the original call.]\n"
                )

        def done(content: str, status: str, *, clean: bool = False, **extra: Any) -> dict[str, Any]:
            if note is not None:
                clean = False  # a reviewer's edit is not redacted yet
                content = note + content
                extra["decision"] = "edit"
                if name != called:
                    extra["tool"] = name
            return message(content, status, clean=clean, **extra)

        ctx = ToolContext(
            run_id=payload.get("run_id", ""),
            call_id=call_id,
            tool=name,
            thread_id=(config.get("configurable") or {}).get("thread_id"),
            state=MappingProxyType(payload["state"]) if "state" in payload else _EMPTY,
        )
        hooks = spec.hooks
        tc = ToolCall(call_id, name, dict(args))
        value: Any = _NOTHING
        status = "ok"
        if hooks.before_tool:
            try:
                for hname, fn in hooks.before_tool:
                    res = await call_hook(fn, tc)
                    if res is None:
                        continue
                    if isinstance(res, ToolResult):
                        value = res.value
                        status = "skipped"
                        changed_by.append(hname)
                        break
                    if isinstance(res, ToolCall):
                        tc = res
                        changed_by.append(hname)
                        continue
                    raise TypeError(
                        f"before_tool of hook {hname!r} must return a ToolCall, a ToolResult "
                        f"or None, got {type(res).__name__}"
                    )
            except ToolError as exc:
                return done(f"Error: {exc.message}", "error", error_kind="hook")
            except (asyncio.CancelledError, GraphBubbleUp):
                raise
            except Exception as exc:
                return self._failed(exc, tc, done, error_kind="hook")
            if tc.name != name:
                ctx = dataclasses.replace(ctx, tool=tc.name)

        tool: Tool | None = None
        if value is _NOTHING:
            if "args_error" in call and tc.args == args and tc.name == called:
                return done(f"Error: {call['args_error']}", "error", error_kind="invalid_args")
            tool = spec.tools.get(tc.name)
            if tool is None:
                return done(
                    f"Error: there is no tool named {tc.name!r}. Available tools: "
                    f"{', '.join(spec.tools) or '(none)'}.",
                    "error",
                    error_kind="unknown_tool",
                )
            try:
                validated = tool.validate(tc.args)
            except ToolArgumentsError as exc:
                return done(
                    f"Error: invalid arguments for {tc.name}: {exc}. Call it again with "
                    "arguments that match its schema.",
                    "error",
                    error_kind="invalid_args",
                )
            if writer is not None:
                writer(
                    {
                        "type": "tool_call_started",
                        "call_id": call_id,
                        "tool": tc.name,
                        "args": to_jsonable_python(validated, fallback=str),
                    }
                )
            try:
                value = await self._execute(tool, validated, ctx)
            except ToolError as exc:
                return done(f"Error: {exc.message}", "error")
            except _Timeout as exc:
                return done(
                    f"Error: the tool {tc.name} timed out after {exc.seconds:g} s.", "timeout"
                )
            except (asyncio.CancelledError, GraphBubbleUp):
                raise
            except LimitExceededError as exc:
                if exc.limit == "agent_depth":
                    raise
                return self._failed(exc, tc, done)
            except Exception as exc:
                return self._failed(exc, tc, done)

        usage = None
        if isinstance(value, ToolOutput):
            usage = value.usage
            value = value.value
        if redactor is not None:
            value = redactor.redact_value(value)  # ahead of the after_tool hooks
        if hooks.after_tool:
            try:
                for hname, fn in hooks.after_tool:
                    res = await call_hook(fn, tc, value)
                    if res is not None:
                        value = res
                        changed_by.append(hname)
            except ToolError as exc:
                return done(f"Error: {exc.message}", "error")
            except (asyncio.CancelledError, GraphBubbleUp):
                raise
            except Exception as exc:
                return self._failed(exc, tc, done)
        extra: dict[str, Any] = {}
        if usage:
            extra["usage"] = usage
        if tool is not None and tool.return_direct and status == "ok":
            extra["return_direct"] = True
        # A text result no hook replaced was redacted above; once is enough. (Other
        # values are redacted as the JSON the model reads: objects may hide strings.)
        clean = not changed_by and isinstance(value, str)
        return done(to_content(value), status, clean=clean, **extra)

    async def _execute(self, tool: Tool, args: Any, ctx: ToolContext) -> Any:
        spec = self.spec
        timeout = tool.timeout_secs or spec.limits.tool_timeout_secs
        retry = spec.tool_retry
        attempts = retry.max_attempts if tool.retryable else 1
        attempt = 0
        while True:
            attempt += 1
            try:
                async with asyncio.timeout(timeout) as deadline:
                    return await tool.run(args, ctx)
            except (ToolError, GraphBubbleUp):
                # An agent used as a tool that stops for approval interrupts this call;
                # LangGraph resumes it (from its own checkpoints) when the parent resumes.
                raise
            except TimeoutError:
                if not deadline.expired():
                    if attempt >= attempts:
                        raise
                elif attempt >= attempts:
                    raise _Timeout(timeout) from None
            except Exception:
                if attempt >= attempts:
                    raise
            await asyncio.sleep(retry.backoff(attempt))

    def _failed(
        self,
        exc: BaseException,
        tc: ToolCall,
        done: Callable[..., dict[str, Any]],
        **extra: Any,
    ) -> dict[str, Any]:
        policy = self.spec.on_tool_exception
        if policy == "fail":
            raise ToolExecutionError(
                f"tool {tc.name!r} (call {tc.call_id}) raised {_exc_text(exc)}",
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
