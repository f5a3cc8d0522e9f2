"""Any `langchain_core` chat model as a `Model`: messages and tool calls converted both
ways, usage mapped, failures classified into `ModelError` kinds."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from typing import Any

from criogen_graph._retry_after import retry_after_from_headers
from criogen_graph.errors import ModelError
from criogen_graph.messages import (
    AssistantMessage,
    Message,
    ModelErrorKind,
    ModelStopReason,
    ToolCallData,
)
from criogen_graph.models.base import Model, ModelRequest, ModelResponse, wire_call_id
from criogen_graph.models.http import OUTPUT_INSTRUCTION
from criogen_graph.results import empty_usage


def is_langchain_chat_model(obj: object) -> bool:
    import sys

    if "langchain_core.language_models" not in sys.modules:
        return False
    from langchain_core.language_models import BaseChatModel

    return isinstance(obj, BaseChatModel)


class LangChainModel(Model):
    """Wraps a `langchain_core` `BaseChatModel`.

    Tools are bound with `bind_tools`; typed output is asked for in the system message
    and parsed by the agent like any other answer (LangChain has no provider-neutral
    native structured-output call that keeps tool calling). The model streams
    (`astream`) only when someone listens to its text, else it is invoked (`ainvoke`).
    """

    def __init__(self, chat_model: Any) -> None:
        self.chat_model = chat_model
        params: dict[str, Any] = {}
        try:
            params = dict(chat_model._get_ls_params())
        except Exception:
            params = {}
        self.provider = str(
            params.get("ls_provider") or getattr(chat_model, "_llm_type", "langchain")
        )
        self.name = str(
            params.get("ls_model_name")
            or getattr(chat_model, "model_name", None)
            or getattr(chat_model, "model", None)
            or type(chat_model).__name__
        )
        self._bound: dict[tuple[str, ...], Any] = {}

    def _runnable(self, tools: list[dict[str, Any]]) -> Any:
        if not tools:
            return self.chat_model
        key = tuple(t["name"] for t in tools)
        bound = self._bound.get(key)
        if bound is None:
            specs = [
                {
                    "type": "function",
                    "function": {
                        "name": t["name"],
                        "description": t["description"],
                        "parameters": t["parameters"],
                    },
                }
                for t in tools
            ]
            try:
                bound = self.chat_model.bind_tools(specs)
            except NotImplementedError as exc:
                raise ModelError(
                    f"{type(self.chat_model).__name__} does not support tool calling "
                    "(bind_tools is not implemented); give the agent no tools or use "
                    "another model",
                    kind="bad_request",
                    provider=self.provider,
                    model=self.name,
                ) from exc
            self._bound[key] = bound
        return bound

    async def generate(self, request: ModelRequest) -> ModelResponse:
        messages = to_langchain_messages(request.messages, request.output_schema)
        runnable = self._runnable(request.tools)
        try:
            with _own_runs_off():
                return await self._generate(runnable, messages, request)
        except ModelError:
            raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise classify_exception(exc, self.provider, self.name) from exc

    async def _generate(
        self, runnable: Any, messages: list[Any], request: ModelRequest
    ) -> ModelResponse:
        """One call: invoked, or streamed when someone listens to its text (the node sets
        `on_text` only then). A streamed call reports usage only if the model is set to
        (`ChatOpenAI(stream_usage=True)` for a server that is not OpenAI's)."""
        if request.on_text is None:
            ai = await runnable.ainvoke(messages, _NO_CALLBACKS)
        else:
            ai = None
            async for chunk in runnable.astream(messages, _NO_CALLBACKS):
                text = chunk.text if isinstance(chunk.text, str) else chunk.text()
                if text:
                    request.on_text(text)
                ai = chunk if ai is None else ai + chunk
            if ai is None:
                raise ModelError(
                    "the model streamed nothing",
                    kind="transient",
                    provider=self.provider,
                    model=self.name,
                )
        return from_langchain_message(ai)


#: The chat model's own callback runs are off: the model node reports each call as one
#: chat-model run (redacted, nested under the node), and handlers would see it twice.
_NO_CALLBACKS: dict[str, Any] = {"callbacks": []}


@contextlib.contextmanager
def _own_runs_off() -> Iterator[None]:
    """No handler for the chat model's own run either: none LangChain adds from context
    (`register_configure_hook`: `get_openai_callback()`, `collect_runs()`,
    `tracing_v2_enabled()`), and no LangSmith tracer from the environment."""
    from langchain_core.tracers import context as lc_context
    from langsmith.run_helpers import tracing_context

    # LangChain's registry of those context variables has no public accessor; without
    # it (another version) only the LangSmith tracer is turned off.
    from criogen_graph.storage._driver_internals import configure_hook_vars

    hooks = configure_hook_vars()
    hooks.append(lc_context.tracing_v2_callback_var)
    tokens = [(var, var.set(None)) for var in hooks]
    try:
        with tracing_context(enabled=False):
            yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def to_langchain_messages(
    messages: list[Message], output_schema: dict[str, Any] | None = None
) -> list[Any]:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    out: list[Any] = []
    wire: dict[object, object] = {}  # our call id -> the provider's, for renamed calls
    for m in messages:
        content = m.get("content")
        if content is None:
            content = ""
        if m["role"] == "system":
            out.append(SystemMessage(content))
        elif m["role"] == "user":
            out.append(HumanMessage(content))
        elif m["role"] == "assistant":
            calls = []
            for c in m.get("tool_calls") or ():
                if c.get("provider_id") is not None:
                    wire[c["id"]] = c["provider_id"]
                calls.append(
                    {
                        "name": c["name"],
                        "args": c.get("args") or {},
                        "id": wire_call_id(c),
                        "type": "tool_call",
                    }
                )
            out.append(AIMessage(content, tool_calls=calls))
        elif m["role"] == "tool":
            status = "success" if m.get("status", "ok") in ("ok", "skipped") else "error"
            out.append(
                ToolMessage(
                    content,
                    tool_call_id=wire.get(m.get("tool_call_id"), m.get("tool_call_id", "")),
                    name=m.get("name"),
                    status=status,
                )
            )
    if output_schema is not None:
        instruction = OUTPUT_INSTRUCTION.format(schema=json.dumps(output_schema))
        if out and isinstance(out[0], SystemMessage):
            out[0] = SystemMessage(f"{out[0].content}\n\n{instruction}")
        else:
            out.insert(0, SystemMessage(instruction))
    return out


def from_langchain_message(ai: Any) -> ModelResponse:
    text = ai.text if isinstance(ai.text, str) else ai.text()
    message: AssistantMessage = {"role": "assistant", "content": text or ""}
    calls: list[ToolCallData] = []
    for c in getattr(ai, "tool_calls", None) or ():
        calls.append(
            {"id": c.get("id") or _fresh_id(), "name": c["name"], "args": c.get("args") or {}}
        )
    for c in getattr(ai, "invalid_tool_calls", None) or ():
        calls.append(
            {
                "id": c.get("id") or _fresh_id(),
                "name": c.get("name") or "",
                "args": {},
                "args_error": "the arguments are not valid JSON "
                f"({c.get('error') or 'unparsable'}): {c.get('args')!r}",
            }
        )
    if calls:
        message["tool_calls"] = calls
    usage = empty_usage()
    meta = getattr(ai, "usage_metadata", None) or {}
    if meta:
        usage["input_tokens"] = int(meta.get("input_tokens") or 0)
        usage["output_tokens"] = int(meta.get("output_tokens") or 0)
        details = meta.get("input_token_details") or {}
        usage["cache_read_tokens"] = int(details.get("cache_read") or 0)
        usage["cache_write_tokens"] = int(details.get("cache_creation") or 0)
        usage["reasoning_tokens"] = int(
            (meta.get("output_token_details") or {}).get("reasoning") or 0
        )
    rmeta = getattr(ai, "response_metadata", None) or {}
    finish = str(rmeta.get("finish_reason") or rmeta.get("stop_reason") or "").lower()
    stop: ModelStopReason | None = (
        "content_filter" if finish in ("content_filter", "refusal", "safety") else None
    )
    return ModelResponse(message, usage, stop)


def _fresh_id() -> str:
    import uuid

    return "call_" + uuid.uuid4().hex[:16]


def classify_exception(exc: BaseException, provider: str, model: str) -> ModelError:
    """Map an exception from a provider client to a `ModelError` kind."""
    status = getattr(exc, "status_code", None)
    response = getattr(exc, "response", None)
    if status is None and response is not None:
        status = getattr(response, "status_code", None)
    retry_after = retry_after_from_headers(getattr(response, "headers", None))
    text = str(exc)
    lowered = text.lower()
    name = type(exc).__name__.lower()
    kind: ModelErrorKind
    if isinstance(status, int):
        if status == 429:
            kind = "rate_limit"
        elif status == 408:
            kind = "timeout"
        elif status in (401, 403):
            kind = "auth"
        elif status == 404:
            kind = "not_found"
        elif status >= 500:
            kind = "transient"
        elif "context" in lowered and (
            "length" in lowered or "window" in lowered or "too long" in lowered
        ):
            kind = "context_overflow"
        elif "content" in lowered and ("filter" in lowered or "policy" in lowered):
            kind = "content_filter"
        else:
            kind = "bad_request"
    elif isinstance(exc, TimeoutError) or "timeout" in name:
        kind = "timeout"
    elif isinstance(exc, ConnectionError) or "connect" in name:
        kind = "connection"
    elif isinstance(exc, TypeError | ValueError | AttributeError | KeyError | NotImplementedError):
        kind = "bad_request"
    else:
        kind = "transient"
    return ModelError(
        f"{provider}:{model} failed: {type(exc).__name__}: {text}",
        kind=kind,
        provider=provider,
        model=model,
        status=status if isinstance(status, int) else None,
        retry_after=retry_after,
    )
