"""LangChain callbacks for model and tool calls: when a run's config carries callback
handlers (LangSmith tracing turned on from the environment, a handler passed in
`config["callbacks"]`, Langfuse's LangChain handler), each model call is reported as a
chat-model run and each tool call as a tool run, nested under the graph's node runs, as
LangChain's own chat models and tools report themselves. Every text is redacted with the
run's policy first. With no handlers this costs one dictionary lookup per call."""

from __future__ import annotations

import json
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from langchain_core.runnables.config import var_child_runnable_config

from criogen_graph._observe import run_redactor

if TYPE_CHECKING:
    from criogen_graph.adapters.models.base import Model, ModelRequest, ModelResponse
    from criogen_graph.nodes.spec import AgentSpec


class ToolCallFailed(Exception):
    """What a tool run reports as its error: the tool's error text (redacted)."""


def _manager() -> Any:
    """The callback manager of the node run in progress when it has handlers, else None.
    From the config LangGraph sets in context for the node's code: the `config` argument
    a node receives carries its parent's manager, not the node run's."""
    config = var_child_runnable_config.get()
    callbacks = config.get("callbacks") if config else None
    if not callbacks:
        return None
    if isinstance(callbacks, list):
        from langchain_core.callbacks.manager import AsyncCallbackManager

        return AsyncCallbackManager.configure(inheritable_callbacks=callbacks)
    return callbacks if callbacks.handlers else None


def _clean(redactor: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if redactor is None:
        return messages
    from criogen_graph.redact import redact_messages

    out = redact_messages(redactor, messages)
    for m in out:
        if m.get("content") is not None and not isinstance(m["content"], str):
            m["content"] = redactor.redact_value(m["content"])
    return out


async def report_chat(
    spec: AgentSpec,
    request: ModelRequest,
    call: Awaitable[tuple[ModelResponse, Model]],
) -> tuple[ModelResponse, Model]:
    """Await `call` (the model call, with its retries and fallbacks), reported as a chat-
    model run to the node run's callback handlers, if any."""
    manager = _manager()
    if manager is None:
        return await call
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, LLMResult

    from criogen_graph.adapters.models.langchain import to_langchain_messages

    redactor = run_redactor(spec)
    primary = spec.models[0]
    manager = manager.copy()
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
    try:
        response, model = await call
    except BaseException as exc:
        await run.on_llm_error(exc)
        raise
    (message,) = _clean(redactor, [response.message])
    usage = response.usage
    inputs, outputs = usage.get("input_tokens", 0), usage.get("output_tokens", 0)
    finish = response.stop_reason or ("tool_calls" if message.get("tool_calls") else "stop")
    ai = to_langchain_messages([message])[0]
    assert isinstance(ai, AIMessage)
    ai.usage_metadata = {
        "input_tokens": inputs,
        "output_tokens": outputs,
        "total_tokens": inputs + outputs,
    }
    if usage.get("cache_read_tokens"):
        ai.usage_metadata["input_token_details"] = {"cache_read": usage["cache_read_tokens"]}
    ai.response_metadata = {
        "model_name": model.name,
        "model_provider": model.provider,
        "finish_reason": finish,
    }
    await run.on_llm_end(
        LLMResult(
            generations=[[ChatGeneration(message=ai, generation_info={"finish_reason": finish})]],
            llm_output={
                "model_name": model.name,
                "token_usage": {
                    "prompt_tokens": inputs,
                    "completion_tokens": outputs,
                    "total_tokens": inputs + outputs,
                },
            },
        )
    )
    return response, model


async def report_tool(
    spec: AgentSpec,
    payload: dict[str, Any],
    call: Awaitable[dict[str, Any]],
) -> dict[str, Any]:
    """Await `call` (one tool call, its result message), reported as a tool run to the
    node run's callback handlers, if any; a call whose result has status `error` is an
    error run."""
    manager = _manager()
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
            await run.on_tool_error(exc)
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
