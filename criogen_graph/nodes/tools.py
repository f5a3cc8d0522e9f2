"""The `tools` node: one task per tool call (a `Send`), so each finished call is saved as
its own pending write and is never run again. Decisions, `before_tool` / `after_tool`
hooks, argument validation, timeouts, tool retries and `on_tool_exception` live here."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphBubbleUp
from pydantic_core import to_jsonable_python

from criogen_graph._aio import cancel_pending, to_the_end
from criogen_graph._callbacks import report_tool
from criogen_graph._observe import run_redactor, run_spans
from criogen_graph.adapters.storage.base import hand_over
from criogen_graph.errors import LimitExceededError, ToolError, ToolExecutionError
from criogen_graph.hooks import ToolCall, ToolResult, call_hook, copy_value
from criogen_graph.nodes.events import Writer, step_of, stream_writer
from criogen_graph.nodes.segment import segment_of
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
    try:
        converted = _json_default(value)
    except Exception as exc:
        raise UnserializableResultError(
            f"the result cannot be written as JSON: converting its {type(value).__name__} "
            f"raised {_exc_text(exc)}"
        ) from exc
    return _plain(converted, path)


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


class ToolsNode:
    def __init__(self, spec: AgentSpec) -> None:
        self.spec = spec

    async def __call__(self, payload: dict[str, Any], config: RunnableConfig) -> None:
        if not self.spec.loaded:
            await self.spec.ensure_tools()  # e.g. a retry after a restart, in Studio
        seg = segment_of(config)
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
                # The edit's args are redacted (`check_decisions`); the note and the
                # result are redacted as one text, as a pattern may span both.
                clean = False
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
        # A copy all the way down: the call's args are the transcript's, which hooks and
        # the tool must not change in place.
        tc = ToolCall(call_id, name, copy_value(args))
        value: Any = _NOTHING
        status = "ok"
        if hooks.before_tool:
            try:
                for hname, fn in hooks.before_tool:
                    # Its own copy: a change it makes counts only if it returns it.
                    res = await call_hook(fn, _copy_call(tc))
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
            except GraphBubbleUp:
                raise
            except asyncio.CancelledError as exc:
                if cancel_pending():
                    raise
                # Raised by the hook itself, the run not being cancelled: its failure.
                return self._failed(exc, tc, done, error_kind="hook")
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
        # From here on, a failure (the redactor, an after_tool hook, a result that cannot
        # be written as JSON) comes after the tool ran: the call is finished whatever
        # the policy says (`_failed` with `ran`), and is never run again. A value a
        # before_tool hook gave (`ToolResult`) ran no tool: its failure is the hook's.
        ran: RunnableConfig | None = config if tool is not None else None
        kind = {} if tool is not None else {"error_kind": "hook"}
        try:
            if redactor is not None:
                value = _redacted(redactor, value)  # ahead of the after_tool hooks
            if hooks.after_tool:
                try:
                    for hname, fn in hooks.after_tool:
                        # The tool ran: its result is finished even if the run is being
                        # cancelled (the cancellation waits for it, see `_hand_over`).
                        res = await to_the_end(call_hook(fn, _copy_call(tc), value))
                        if res is not None:
                            value = res
                            changed_by.append(hname)
                except ToolError as exc:
                    return done(f"Error: {exc.message}", "error")
            content = to_content(value)
        except GraphBubbleUp:
            raise
        except asyncio.CancelledError as exc:
            if cancel_pending():
                raise
            # Raised by a hook itself (`to_the_end` keeps a cancellation of the run from
            # reaching it): that hook's failure.
            return self._failed(exc, tc, done, ran=ran, **kind)
        except Exception as exc:
            return self._failed(exc, tc, done, ran=ran, **kind)
        extra: dict[str, Any] = {}
        if usage:
            extra["usage"] = usage
        if tool is not None and tool.return_direct and status == "ok":
            extra["return_direct"] = True
        # A text result no hook replaced was redacted above; once is enough. (Other
        # values are redacted as the JSON the model reads: objects may hide strings.)
        clean = not changed_by and isinstance(value, str)
        return done(content, status, clean=clean, **extra)

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
    except TimeoutError:
        if deadline.expired():
            raise _Timeout(limit_secs or 0) from None
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
        raise _Timeout(limit_secs or 0)
    return _outcome(call)


def _outcome(call: asyncio.Future[Any]) -> Any:
    """The result of a finished call, or the exception it raised."""
    if call.cancelled():
        raise RuntimeError("the tool raised asyncio.CancelledError; nothing cancelled the run")
    return call.result()


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
    task_ns = str(configurable.get("checkpoint_ns") or "")
    task_id = configurable.get(_TASK_ID)
    if task_id and "|" not in task_ns:  # a task of the thread's own graph, not a subgraph's
        checkpoint_id = (configurable.get(_CHECKPOINTS) or _EMPTY).get("")
        if checkpoint_id:
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
    if cancel_pending():
        raise asyncio.CancelledError()


def _task_path(path: Any) -> str:
    """A task's path as LangGraph's savers key it (`langgraph.pregel._algo.task_path_str`)."""
    if isinstance(path, tuple | list):
        return "~" + ", ".join(_task_path(p) for p in path)
    if isinstance(path, int):
        return f"{path:010d}"
    return str(path)
