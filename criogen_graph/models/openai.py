"""OpenAI Chat Completions over HTTP: OpenAI itself, OpenRouter, Azure OpenAI and any
OpenAI-compatible server (vLLM, Ollama, llama.cpp server) through `base_url`."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Unpack

from criogen_graph.errors import ValidationError
from criogen_graph.messages import (
    AssistantMessage,
    Message,
    ModelStopReason,
    ToolCallData,
    Usage,
)
from criogen_graph.models.base import ModelRequest, ModelResponse, TextSink, wire_call_id
from criogen_graph.models.http import (
    HttpOptions,
    api_key_from,
    tokens,
    tool_call,
)
from criogen_graph.models.openai_common import (
    OpenAIConnection,
    OpenAIHttpModel,
    openai_endpoint,
)
from criogen_graph.results import empty_usage

if TYPE_CHECKING:
    from criogen_graph.models.openai_responses import OpenAIResponsesModel

OPENROUTER_URL = "https://openrouter.ai/api/v1"
AZURE_API_VERSION = "2024-10-21"
_FILTER_FINISH = ("content_filter",)
#: Where OpenAI-compatible servers put a reasoning model's thinking text: DeepSeek, vLLM
#: and most servers `reasoning_content`, OpenRouter and Ollama `reasoning`.
_REASONING_FIELDS = ("reasoning_content", "reasoning")


def to_openai_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Transcript dicts in Chat Completions form.

    An assistant turn of the current tool loop (after the last user message) that came
    with reasoning text in a `reasoning_content` / `reasoning` field gets it back in that
    field, as DeepSeek requires for thinking with tools; earlier turns go without it.
    """
    out: list[dict[str, Any]] = []
    wire: dict[object, object] = {}  # our call id -> the provider's, for renamed calls
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    for index, m in enumerate(messages):
        if m["role"] == "system" or m["role"] == "user":
            content = m.get("content")
            out.append({"role": m["role"], "content": content if content is not None else ""})
        elif m["role"] == "assistant":
            out.append(_assistant(m, index > last_user, wire))
        elif m["role"] == "tool":
            content = m.get("content")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": wire.get(m.get("tool_call_id"), m.get("tool_call_id", "")),
                    "content": content if isinstance(content, str) else json.dumps(content),
                }
            )
    return out


def _assistant(m: AssistantMessage, in_loop: bool, wire: dict[object, object]) -> dict[str, Any]:
    """An assistant turn in Chat Completions form, with its reasoning text when it is of
    the current tool loop (`in_loop`). Notes the provider's ids of renamed calls in
    `wire`, for the results that answer them."""
    msg: dict[str, Any] = {"role": "assistant", "content": m.get("content") or None}
    field = m.get("reasoning_field")
    reasoning = m.get("reasoning")
    if in_loop and reasoning and field is not None and field in _REASONING_FIELDS:
        msg[field] = reasoning
    calls = m.get("tool_calls")
    if calls:
        for c in calls:
            if c.get("provider_id") is not None:
                wire[c["id"]] = c["provider_id"]
        msg["tool_calls"] = [
            {
                "id": wire_call_id(c),
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c.get("args") or {})},
            }
            for c in calls
        ]
    elif msg["content"] is None:
        msg["content"] = ""
    return msg


def _chunks(content: Any) -> tuple[str, str]:
    """`(text, thinking)` of a message's or a delta's `content`: a string, nothing, or
    a list of typed chunks (Mistral's reasoning models: `thinking` chunks, whose own
    `thinking` is a list of text chunks, then `text` chunks). Chunks of other types
    (references, images) carry no text; anything else is a `ValueError`."""
    if content is None or isinstance(content, str):
        return content or "", ""
    if not isinstance(content, list):
        raise ValueError(f"'content' is neither text nor a list of chunks: {content!r:.200}")
    text: list[str] = []
    thought: list[str] = []
    for chunk in content:
        if not isinstance(chunk, Mapping):
            raise ValueError(f"a content chunk is not an object: {chunk!r:.200}")
        kind = chunk.get("type")
        if kind == "text":
            if not isinstance(chunk.get("text"), str):
                raise ValueError(f"a text chunk without text: {chunk!r:.200}")
            text.append(chunk["text"])
        elif kind == "thinking":
            inner, deeper = _chunks(chunk.get("thinking"))
            thought.append(inner + deeper)
    return "".join(text), "".join(thought)


def _usage(raw: Mapping[str, Any] | None) -> Usage:
    usage = empty_usage()
    usage["input_tokens"] = tokens(raw, "prompt_tokens")
    usage["output_tokens"] = tokens(raw, "completion_tokens")
    usage["cache_read_tokens"] = tokens(raw, "prompt_tokens_details", "cached_tokens")
    usage["reasoning_tokens"] = tokens(raw, "completion_tokens_details", "reasoning_tokens")
    return usage


def _calls(raw_calls: list[dict[str, Any]]) -> list[ToolCallData]:
    calls = []
    for c in raw_calls:
        fn = c.get("function") or {}
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(f"a tool call without a name: {json.dumps(c, default=str)[:200]}")
        call_id = c.get("id") or "call_" + uuid.uuid4().hex[:16]
        calls.append(tool_call(call_id, fn["name"], fn.get("arguments")))
    return calls


class OpenAIModel(OpenAIHttpModel):
    """A Chat Completions model. Build it with `openai(...)`, `openrouter(...)` or
    `azure(...)`, or `Agent("openai:<model>")`.

    Tools go out as functions (parallel calls allowed); typed output uses
    `response_format` with a JSON Schema; streaming reads the SSE stream with usage.
    """

    def __init__(
        self,
        model: str,
        *,
        path: str = "/chat/completions",
        params: Mapping[str, str] | None = None,
        send_model: bool = True,
        **connection: Unpack[OpenAIConnection],
    ) -> None:
        super().__init__(model, **connection)
        self._path = path
        self._params = dict(params or {})
        self._send_model = send_model

    def body(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        """The JSON body of a request."""
        body: dict[str, Any] = {"messages": to_openai_messages(request.messages)}
        if self._send_model:
            body["model"] = self.name
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t["name"],
                        "description": t["description"],
                        "parameters": t["parameters"],
                    },
                }
                for t in request.tools
            ]
        if request.output_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": request.output_schema, "strict": False},
            }
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        body.update(self._extra)
        return body

    async def _complete(self, request: ModelRequest) -> ModelResponse:
        data = await self._post(self._path, self.body(request, stream=False), self._params)
        try:
            return self._read(data)
        except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
            problem = f"{type(exc).__name__}: {exc}: {json.dumps(data)[:200]}"
            raise self._unreadable(problem) from exc

    def _read(self, data: Any) -> ModelResponse:
        if not isinstance(data, dict):
            raise self._unreadable(f"the response is not an object: {str(data)[:200]}")
        if data.get("error"):
            # OpenRouter (and some compatible servers) answer a failure with status 200.
            raise self._stream_error(data["error"])
        choices = data.get("choices") or []
        if not choices:
            raise self._unreadable(f"the response has no choices: {json.dumps(data)[:200]}")
        choice = choices[0]
        raw = choice.get("message")
        inner = raw.get("error") if isinstance(raw, Mapping) else None
        if choice.get("finish_reason") == "error" or inner:
            # OpenRouter: a provider's failure as the choice, with or without a message.
            raise self._stream_error(inner or choice.get("error") or {})
        if not isinstance(raw, Mapping):
            raise ValueError("the choice has no message")
        text, thought = _chunks(raw.get("content"))
        message: AssistantMessage = {"role": "assistant", "content": text}
        for field in _REASONING_FIELDS:
            if isinstance(raw.get(field), str) and raw[field]:
                message["reasoning"] = raw[field]
                message["reasoning_field"] = field
                break
        else:
            if thought:
                # Thinking chunks (Mistral) are not sent back: the typed Chat
                # Completions message has no place for them, and Mistral does not
                # require them.
                message["reasoning"] = thought
        calls = _calls(raw.get("tool_calls") or [])
        if calls:
            message["tool_calls"] = calls
        return ModelResponse(
            message,
            _usage(data.get("usage")),
            _stop(choice.get("finish_reason"), raw.get("refusal"), message),
        )

    async def _stream(self, request: ModelRequest) -> ModelResponse:
        state = _ChatStream(request.on_text, request.on_reasoning)
        async for name, chunk in self._events(
            self._path, self.body(request, stream=True), self._params
        ):
            if not isinstance(chunk, dict):
                raise self._unreadable(f"a stream event is not an object: {str(chunk)[:200]}")
            if name == "error" or chunk.get("error"):
                # Groq sends `event: error`, OpenRouter a chunk with an `error` object.
                raise self._stream_error(chunk.get("error") or chunk)
            try:
                state.add(chunk)
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                raise self._unreadable(
                    f"{type(exc).__name__}: {exc}: {json.dumps(chunk)[:200]}"
                ) from exc
        if state.finish is None:
            # Every answer ends with a finish_reason; a stream closed before it is cut.
            raise self._error("connection", "the stream ended before the answer was finished")
        if state.finish == "error":
            raise self._stream_error({"message": "the provider ended the answer with an error"})
        message = state.message()
        if state.problems and not state.said_anything():
            raise self._unreadable(state.problems[0])
        try:
            calls = _calls([state.partial[i] for i in sorted(state.partial)])
        except ValueError as exc:
            raise self._unreadable(str(exc)) from exc
        if calls:
            message["tool_calls"] = calls
        return ModelResponse(
            message, _usage(state.usage_raw), _stop(state.finish, "".join(state.refusal), message)
        )


class _ChatStream:
    """One streamed Chat Completions answer being put together, chunk by chunk."""

    def __init__(self, sink: TextSink | None, thinking: TextSink | None) -> None:
        self.sink = sink
        self.thinking = thinking
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.reasoning_field = ""
        self.refusal: list[str] = []
        self.partial: dict[int, dict[str, Any]] = {}
        self.finish: str | None = None
        # Choices that could not be read: the reply is unreadable if nothing else came.
        self.problems: list[str] = []
        self.usage_raw: dict[str, Any] | None = None

    def add(self, chunk: dict[str, Any]) -> None:
        if chunk.get("usage"):
            self.usage_raw = chunk["usage"]
        for choice in chunk.get("choices") or ():
            self._choice(choice)

    def _choice(self, choice: Any) -> None:
        delta = choice.get("delta")
        if not isinstance(delta, Mapping):
            self.problems.append(f"a choice without a delta: {json.dumps(choice)[:200]}")
            delta = {}
        piece, chunk_thought = _chunks(delta.get("content"))
        if chunk_thought:
            self._thought(chunk_thought)
        if piece:
            self.text.append(piece)
            if self.sink is not None:
                self.sink(piece)
        for field in _REASONING_FIELDS:
            thought = delta.get(field)
            if isinstance(thought, str) and thought:
                self.reasoning_field = self.reasoning_field or field
                self._thought(thought)
                break
        if delta.get("refusal"):
            self.refusal.append(delta["refusal"])
        for tc in delta.get("tool_calls") or ():
            self._tool_call(tc)
        if choice.get("finish_reason"):
            self.finish = choice["finish_reason"]

    def _thought(self, thought: str) -> None:
        self.reasoning.append(thought)
        if self.thinking is not None:
            self.thinking(thought)

    def _tool_call(self, tc: Any) -> None:
        slot = self.partial.setdefault(
            int(tc.get("index", 0)),
            {"id": None, "function": {"name": "", "arguments": ""}},
        )
        if tc.get("id"):
            slot["id"] = tc["id"]
        fn = tc.get("function") or {}
        if fn.get("name"):
            slot["function"]["name"] += fn["name"]
        if fn.get("arguments"):
            slot["function"]["arguments"] += fn["arguments"]

    def said_anything(self) -> bool:
        return bool(self.text or self.reasoning or self.partial or self.refusal)

    def message(self) -> AssistantMessage:
        message: AssistantMessage = {"role": "assistant", "content": "".join(self.text)}
        if self.reasoning:
            message["reasoning"] = "".join(self.reasoning)
            if self.reasoning_field:
                message["reasoning_field"] = self.reasoning_field
        return message


def _stop(finish: Any, refusal: Any, message: AssistantMessage) -> ModelStopReason | None:
    """The stop reason of a reply (None: a normal answer); a refusal with no text is the
    text of the reply."""
    if refusal or finish in _FILTER_FINISH:
        if refusal and not message["content"]:
            message["content"] = str(refusal)
        return "content_filter"
    if finish == "length":
        return "max_tokens"
    return None


def openai(
    model: str,
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    organization: str | None = None,
    headers: Mapping[str, str] | None = None,
    api: str = "chat",
    **options: Unpack[HttpOptions],
) -> OpenAIModel | OpenAIResponsesModel:
    """An OpenAI Chat Completions model (the key defaults to `OPENAI_API_KEY`, the URL to
    `OPENAI_BASE_URL` or OpenAI's); `api="responses"` the same model behind the Responses
    API (`openai_responses(...)`, which has its reasoning options).

    With `base_url`, any OpenAI-compatible server: vLLM, Ollama
    (`base_url="http://localhost:11434/v1"`), llama.cpp server; a key is then optional.
    `timeout_secs`, `connect_timeout_secs` and `extra_body` (fields added to every
    request, e.g. `{"temperature": 0}`) as in `HttpOptions`.
    """
    if api not in ("chat", "responses"):
        raise ValidationError(
            f"api must be 'chat' or 'responses', got {api!r}", code="invalid_value"
        )
    if api == "responses":
        from criogen_graph.models.openai_responses import openai_responses

        return openai_responses(
            model,
            api_key=api_key,
            base_url=base_url,
            organization=organization,
            headers=headers,
            **options,
        )
    url, key, extra = openai_endpoint(base_url, api_key, organization, headers, f"openai:{model}")
    return OpenAIModel(
        model, api_key=key, base_url=url, provider="openai", headers=extra, **options
    )


def openrouter(
    model: str,
    *,
    api_key: str | None = None,
    base_url: str = OPENROUTER_URL,
    app_url: str | None = None,
    app_name: str | None = None,
    headers: Mapping[str, str] | None = None,
    **options: Unpack[HttpOptions],
) -> OpenAIModel:
    """A model on OpenRouter (the key defaults to `OPENROUTER_API_KEY`); `app_url` and
    `app_name` set OpenRouter's attribution headers; `options` as in `HttpOptions`."""
    key = api_key_from(api_key, "OPENROUTER_API_KEY", required=True, what=f"openrouter:{model}")
    extra = dict(headers or {})
    if app_url:
        extra["http-referer"] = app_url
    if app_name:
        extra["x-title"] = app_name
    return OpenAIModel(
        model, api_key=key, base_url=base_url, provider="openrouter", headers=extra, **options
    )


def azure(
    deployment: str,
    *,
    endpoint: str | None = None,
    api_key: str | None = None,
    api_version: str = AZURE_API_VERSION,
    headers: Mapping[str, str] | None = None,
    **options: Unpack[HttpOptions],
) -> OpenAIModel:
    """An Azure OpenAI deployment. `endpoint` (e.g. `https://NAME.openai.azure.com`)
    defaults to `AZURE_OPENAI_ENDPOINT`, the key to `AZURE_OPENAI_API_KEY`; `options` as
    in `HttpOptions`."""
    key = api_key_from(api_key, "AZURE_OPENAI_API_KEY", required=True, what=f"azure:{deployment}")
    endpoint = endpoint or os.environ.get("AZURE_OPENAI_ENDPOINT")
    if not endpoint:
        raise ValidationError(
            f"azure:{deployment} needs an endpoint: set AZURE_OPENAI_ENDPOINT or pass endpoint=",
            code="invalid_value",
        )
    return OpenAIModel(
        deployment,
        api_key=key,
        base_url=f"{endpoint.rstrip('/')}/openai/deployments/{deployment}",
        provider="azure",
        headers=headers,
        params={"api-version": api_version},
        key_header="api-key",
        send_model=False,
        **options,
    )
