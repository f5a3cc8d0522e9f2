"""LangChain callbacks for model and tool calls: when a run's config carries callback
handlers (LangSmith tracing turned on from the environment, a handler passed in
`config["callbacks"]`, Langfuse's LangChain handler), each model call is reported as a
chat-model run (with its text as `on_llm_new_token` when streamed) and each tool call as a
tool run, nested under the graph's node runs, as LangChain's own chat models and tools
report themselves. Every text is redacted with the run's policy first.

What it costs: with no handlers, one context-variable lookup per call. A handler that
would not see a run is left out of it: one that sets `ignore_llm` and
`ignore_chat_model` (model calls) or `ignore_agent` (tool calls), and one that overrides
none of the methods the run's events call (a handler that only counts node runs, say):
LangChain would dispatch each event to it, a worker-thread hop for a sync handler, to
run a method that does nothing. When no handler is left, the call is awaited as is."""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler
from langchain_core.runnables.config import var_child_runnable_config

from criogen_graph.graph.events import STREAM_SINK, RedactedText
from criogen_graph.telemetry.observe import run_redactor

if TYPE_CHECKING:
    from criogen_graph.graph.spec import AgentSpec
    from criogen_graph.messages import Message
    from criogen_graph.models.base import Model, ModelRequest, ModelResponse


class ToolCallFailed(Exception):
    """What a tool run reports as its error: the tool's error text (redacted)."""


class RunFailed(Exception):
    """What a run reports as its error when the error's text had to be redacted and a
    copy of the error itself could not carry the redacted text: the error's type name and
    redacted text."""


def _reported(redactor: Any, exc: BaseException) -> BaseException:
    """`exc` as a handler may see it: with a redaction policy that changes its text, a
    copy of it (same type and attributes; no traceback, cause or context, which could
    carry the text) holding the redacted text."""
    if redactor is None or isinstance(exc, asyncio.CancelledError):
        return exc
    text = str(exc)
    clean = redactor.redact(text)
    if clean == text:
        return exc
    try:
        out = copy.copy(exc)
        out.args = (clean,)
        if isinstance(getattr(out, "message", None), str):
            out.message = clean  # type: ignore[attr-defined]
        if str(out) == clean:
            return out
    except Exception:
        pass  # an exception type that cannot be copied like this
    return RunFailed(f"{type(exc).__name__}: {clean}")


#: The events of a chat-model run, and of a tool run: a handler overriding none of them
#: has nothing to do with the run.
_CHAT_EVENTS = (
    "on_chat_model_start",
    "on_llm_start",
    "on_llm_new_token",
    "on_llm_end",
    "on_llm_error",
)
_TOOL_EVENTS = ("on_tool_start", "on_tool_end", "on_tool_error")
_listens_to: dict[tuple[type, tuple[str, ...]], bool] = {}


def _overrides(cls: type, events: tuple[str, ...]) -> bool:
    key = (cls, events)
    known = _listens_to.get(key)
    if known is None:
        known = any(
            getattr(cls, e, None)
            not in (getattr(BaseCallbackHandler, e), getattr(AsyncCallbackHandler, e))
            for e in events
        )
        _listens_to[key] = known
    return known


def _chat_listener(handler: Any) -> bool:
    return not (handler.ignore_llm and handler.ignore_chat_model) and _overrides(
        type(handler), _CHAT_EVENTS
    )


def _tool_listener(handler: Any) -> bool:
    return not handler.ignore_agent and _overrides(type(handler), _TOOL_EVENTS)


def _manager(listens: Callable[[Any], bool], own: bool = False) -> Any:
    """The callback manager of the node run in progress, with only its handlers that
    `listens` to the run (a copy of its own if `own`, to change), or None when there is
    none. From the config LangGraph sets in context for the node's code: the `config`
    argument a node receives carries its parent's manager, not the node run's."""
    config = var_child_runnable_config.get()
    callbacks = config.get("callbacks") if config else None
    if not callbacks:
        return None
    if isinstance(callbacks, list):
        from langchain_core.callbacks.manager import AsyncCallbackManager

        # Configured as LangChain would (this adds LangSmith's tracer when the
        # environment turns tracing on).
        callbacks = AsyncCallbackManager.configure(inheritable_callbacks=callbacks)
    handlers = callbacks.handlers
    listening = [h for h in handlers if listens(h)]
    if not listening:
        return None
    if len(listening) == len(handlers) and not own:
        return callbacks
    manager = callbacks.copy()
    manager.handlers = listening
    return manager


def _clean(redactor: Any, messages: list[Message]) -> list[Message]:
    if redactor is None:
        return messages
    from criogen_graph.redact import redact_messages

    out = redact_messages(redactor, messages)
    for m in out:
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            m["content"] = redactor.redact_value(content)
    return out


class _Tokens:
    """The streamed text of one chat-model run, to its handlers as `on_llm_new_token`,
    in order: pieces arrive from the model's (synchronous) text sink and are sent from a
    task on the event loop, one after the other. With a redaction policy, pieces are
    redacted (and held back) as the run's stream is: only redacted text is sent."""

    __slots__ = ("_held", "_id", "_loop", "_pending", "_run", "_task", "_thread")

    def __init__(self, run: Any, redactor: Any, message_id: str) -> None:
        self._run = run
        self._id = message_id
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._pending: deque[str] = deque()
        self._task: asyncio.Task[None] | None = None
        self._held = RedactedText(redactor, self._send) if redactor is not None else None

    def __call__(self, piece: str) -> None:
        if threading.get_ident() != self._thread:
            self._loop.call_soon_threadsafe(self, piece)
        elif self._held is not None:
            self._held(piece)
        else:
            self._send(piece)

    def _send(self, text: str) -> None:
        if not text:
            return
        self._pending.append(text)
        if self._task is None:
            self._task = self._loop.create_task(self._drain())

    async def _drain(self) -> None:
        from langchain_core.messages import AIMessageChunk
        from langchain_core.outputs import ChatGenerationChunk

        try:
            while self._pending:
                text = self._pending.popleft()
                chunk = ChatGenerationChunk(message=AIMessageChunk(content=text, id=self._id))
                await self._run.on_llm_new_token(text, chunk=chunk)
        finally:
            self._task = None

    async def finish(self) -> None:
        """Send what is held back, and wait until every piece was reported."""
        if self._held is not None:
            self._held.finish()
        while self._task is not None:
            await self._task

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()


_TOKENS: ContextVar[_Tokens | None] = ContextVar("criogen_callback_tokens", default=None)


def _streaming(handler: Any) -> bool:
    """Whether `handler` asks for streamed output, as LangChain tells it (LangGraph's
    `messages` stream mode, `astream_events`): LangChain's chat models stream, and report
    tokens, when one does."""
    return hasattr(type(handler), "tap_output_aiter")


def wants_tokens() -> bool:
    """Whether a handler of the node run asks for streamed output (LangGraph's `messages`
    stream mode, `astream_events`): then the model streams even when no other sink reads
    its text, as LangChain's chat models do for such a handler."""
    manager = _manager(_chat_listener)
    return manager is not None and any(_streaming(h) for h in manager.handlers)


def token_sink(sink: Callable[[str], None] | None) -> Callable[[str], None] | None:
    """`sink` (a model request's `on_text`), also passing each piece of text to the
    chat-model run that `report_chat` has open, as `on_llm_new_token` (redacted with the
    run's policy, held back as the run's stream is), when the run is streamed: by our API
    (`thread.stream(...)`) or for a handler that asks for streamed output (LangGraph's
    `messages` stream mode), as LangChain's chat models report tokens only when streamed.
    `sink` itself, unchanged, otherwise, and when the node run has no handler that
    listens to model calls. The node calls it on the raw text sink (before redaction,
    before the per-attempt sinks of retries), in the node run's context."""
    if sink is None:
        return sink
    manager = _manager(_chat_listener)
    if manager is None:
        return sink
    config = var_child_runnable_config.get() or {}
    streamed = STREAM_SINK in (config.get("configurable") or ())
    if not streamed and not any(_streaming(h) for h in manager.handlers):
        return sink

    return _Tap(sink)


class _Tap:
    """A text sink that also passes each piece to the open chat-model run's tokens."""

    __slots__ = ("_sink",)

    def __init__(self, sink: Callable[[str], None]) -> None:
        self._sink = sink

    def __call__(self, piece: str) -> None:
        self._sink(piece)
        tokens = _TOKENS.get()
        if tokens is not None:
            tokens(piece)


async def report_chat(
    spec: AgentSpec,
    request: ModelRequest,
    call: Awaitable[tuple[ModelResponse, Model]],
    model: Model | None = None,
) -> tuple[ModelResponse, Model]:
    """Await `call` (the model call, with its retries and fallbacks), reported as a chat-
    model run of `model` (the first of the agent's models if not given) to the node
    run's callback handlers, if any listens. Text `token_sink` passes on while `call`
    runs is reported as the run's new tokens."""
    manager = _manager(_chat_listener, own=True)
    if manager is None:
        return await call
    from langchain_core.outputs import ChatGeneration, LLMResult

    from criogen_graph.models.langchain import to_langchain_messages

    redactor = run_redactor(spec)
    primary = model if model is not None else spec.models[0]
    # What LangSmith reads for the model and provider of a chat-model run.
    manager.add_metadata(
        {"ls_provider": primary.provider, "ls_model_name": primary.name, "ls_model_type": "chat"},
        inherit=False,
    )
    messages = to_langchain_messages(_clean(redactor, request.messages))
    params: dict[str, Any] = {
        "model": primary.name,
        "model_name": primary.name,
        "_type": primary.provider,
    }
    if request.tools:
        params["tools"] = [
            {
                "type": "function",
                "function": {"name": t.get("name"), "description": t.get("description", "")},
            }
            for t in request.tools
        ]
    (run,) = await manager.on_chat_model_start(
        {"name": type(primary).__name__, "id": ["criogen_graph", type(primary).__name__]},
        [messages],
        invocation_params=params,
        name=f"{primary.provider}:{primary.name}",
        batch_size=1,
    )
    # The id LangChain's chat models give a run's message and its chunks (LangGraph's
    # `messages` stream mode tells the streamed pieces and the final message apart by it).
    message_id = f"lc_run--{run.run_id}"
    # Only a call whose text `token_sink` passes on has tokens to report.
    tokens = _Tokens(run, redactor, message_id) if isinstance(request.on_text, _Tap) else None
    reset = _TOKENS.set(tokens)
    try:
        response, answered = await call
    except BaseException as exc:
        _TOKENS.reset(reset)
        if tokens is not None:
            if isinstance(exc, asyncio.CancelledError):
                tokens.cancel()
            else:
                await tokens.finish()
        await run.on_llm_error(_reported(redactor, exc))
        raise
    _TOKENS.reset(reset)
    if tokens is not None:
        await tokens.finish()
    (message,) = _clean(redactor, [response.message])
    usage = response.usage
    inputs, outputs = usage.get("input_tokens", 0), usage.get("output_tokens", 0)
    finish = response.stop_reason or ("tool_calls" if message.get("tool_calls") else "stop")
    ai = to_langchain_messages([message])[0]
    ai.id = message_id
    ai.usage_metadata = {
        "input_tokens": inputs,
        "output_tokens": outputs,
        "total_tokens": inputs + outputs,
    }
    if usage.get("cache_read_tokens"):
        ai.usage_metadata["input_token_details"] = {"cache_read": usage["cache_read_tokens"]}
    ai.response_metadata = {
        "model_name": answered.name,
        "model_provider": answered.provider,
        "finish_reason": finish,
    }
    await run.on_llm_end(
        LLMResult(
            generations=[[ChatGeneration(message=ai, generation_info={"finish_reason": finish})]],
            llm_output={
                "model_name": answered.name,
                "token_usage": {
                    "prompt_tokens": inputs,
                    "completion_tokens": outputs,
                    "total_tokens": inputs + outputs,
                },
            },
        )
    )
    return response, answered


async def report_tool(
    spec: AgentSpec,
    payload: dict[str, Any],
    call: Awaitable[dict[str, Any]],
) -> dict[str, Any]:
    """Await `call` (one tool call, its result message), reported as a tool run to the
    node run's callback handlers, if any listens; a call whose result has status
    `error` is an error run."""
    manager = _manager(_tool_listener)
    if manager is None:
        return await call
    from langchain_core.messages import ToolMessage

    redactor = run_redactor(spec)
    tool_call = payload["call"]
    name = tool_call["name"]
    args = tool_call.get("args") or {}
    if redactor is not None:
        args = redactor.redact_value(args)
    tool = spec.tools.get(name)
    run = await manager.on_tool_start(
        {"name": name, "description": getattr(tool, "description", "") or ""},
        json.dumps(args, default=str, ensure_ascii=False),
        inputs=args,
        name=name,
        tool_call_id=tool_call["id"],
    )
    try:
        msg = await call
    except BaseException as exc:
        from langgraph.errors import GraphBubbleUp

        if isinstance(exc, GraphBubbleUp):  # a stop for approval: the run did not fail
            await run.on_tool_end(None)
        else:
            await run.on_tool_error(_reported(redactor, exc))
        raise
    content = msg.get("content")
    if redactor is not None and content is not None:
        content = redactor.redact_value(content)
    if msg.get("status") == "error":
        await run.on_tool_error(ToolCallFailed(str(content)))
    else:
        await run.on_tool_end(
            ToolMessage(
                content if content is not None else "",
                tool_call_id=tool_call["id"],
                name=name,
                status="success",
            )
        )
    return msg
