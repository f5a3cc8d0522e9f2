"""Anthropic Messages API over HTTP (`POST /v1/messages`): Anthropic itself and any server
that speaks the same wire format through `base_url`."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from typing import Any

from criogen_graph.adapters.models.base import ModelRequest, ModelResponse
from criogen_graph.adapters.models.http import (
    OUTPUT_INSTRUCTION,
    HttpModel,
    api_key_from,
    classify_status,
    parse_args,
)
from criogen_graph.errors import ModelError, ValidationError
from criogen_graph.results import empty_usage

ANTHROPIC_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
_PATH = "/v1/messages"
#: Tool statuses the model is told were failures (`is_error`).
_FAILED = frozenset({"error", "timeout", "rejected"})
#: The HTTP status each error `type` comes with, so an `error` event sent in the middle of
#: a stream (after the 200) is classified like the same error sent as a status.
_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "timeout_error": 408,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 529,
}
# Anthropic words one context overflow as "input length and `max_tokens` exceed context
# limit", which the shared hints miss.


def _as_text(content: Any) -> str:
    if content is None:
        return ""
    return content if isinstance(content, str) else json.dumps(content, default=str)


def to_anthropic_messages(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Transcript dicts as `(system, messages)` of the Messages API.

    System messages join into the top-level `system` string; tool results become
    `tool_result` blocks of a user message; consecutive messages of one role merge, so
    roles alternate as the API requires. Empty text is left out (the API rejects empty
    text blocks).
    """
    system: list[str] = []
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for m in messages:
        role = m.get("role")
        text = _as_text(m.get("content"))
        if role == "system":
            if text:
                system.append(text)
        elif role == "user":
            add("user", [{"type": "text", "text": text}] if text else [])
        elif role == "assistant":
            blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
            blocks.extend(
                {"type": "tool_use", "id": c["id"], "name": c["name"], "input": c.get("args") or {}}
                for c in m.get("tool_calls") or ()
            )
            add("assistant", blocks)
        elif role == "tool":
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": m.get("tool_call_id", ""),
            }
            if text:
                block["content"] = text
            if m.get("status", "ok") in _FAILED:
                block["is_error"] = True
            add("user", [block])
    return "\n\n".join(system), out


def _usage(raw: Mapping[str, Any]) -> dict[str, int]:
    usage = empty_usage()
    read = int(raw.get("cache_read_input_tokens") or 0)
    write = int(raw.get("cache_creation_input_tokens") or 0)
    # Anthropic's `input_tokens` leaves out cached tokens; report the whole prompt, as
    # OpenAI does, with the cached parts broken out.
    usage["input_tokens"] = int(raw.get("input_tokens") or 0) + read + write
    usage["output_tokens"] = int(raw.get("output_tokens") or 0)
    usage["cache_read_tokens"] = read
    usage["cache_write_tokens"] = write
    usage["reasoning_tokens"] = int(
        (raw.get("output_tokens_details") or {}).get("thinking_tokens") or 0
    )
    return usage


def _call(block: Mapping[str, Any], raw: Any) -> dict[str, Any]:
    """A transcript tool call from a `tool_use` block and its input (an object, or the
    JSON text a stream delivered)."""
    if isinstance(raw, dict | str) or raw is None:
        args, problem = parse_args(raw)
    else:
        args, problem = {}, f"the arguments must be a JSON object, got {json.dumps(raw)[:200]}"
    call: dict[str, Any] = {
        "id": block.get("id") or "toolu_" + uuid.uuid4().hex[:24],
        "name": block.get("name") or "",
        "args": args,
    }
    if problem is not None:
        call["args_error"] = problem
    return call


def _reply(
    texts: list[str], calls: list[dict[str, Any]], stop: Any, usage: Mapping[str, Any]
) -> ModelResponse:
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        message["tool_calls"] = calls
    return ModelResponse(message, _usage(usage), "content_filter" if stop == "refusal" else None)


class AnthropicModel(HttpModel):
    """A model behind the Anthropic Messages API. Build it with `anthropic(...)` or
    `Agent("anthropic:<model>")`.

    Tools go out as `{name, description, input_schema}` (several calls per reply allowed);
    streaming reads the server-sent events. `max_tokens` (required by the API) bounds each
    reply. Typed output has no native mode here: the JSON Schema is put in the system
    prompt with an instruction to answer with JSON only, and the agent parses and checks
    the answer (asking again when it does not fit). A `refusal` stop reason ends the run
    with `stop_reason == "content_filter"`. Thinking blocks (`extra_body={"thinking":
    ...}`) are not kept in the transcript, so extended thinking cannot be combined with
    tools.
    """

    provider = "anthropic"

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None,
        base_url: str = ANTHROPIC_URL,
        max_tokens: int = 4096,
        headers: Mapping[str, str] | None = None,
        timeout_secs: float = 60,
        connect_timeout_secs: float = 10,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            raise TypeError(f"max_tokens must be an int, got {max_tokens!r}")
        if max_tokens < 1:
            raise ValidationError(f"max_tokens must be >= 1, got {max_tokens}")
        auth = {"x-api-key": api_key} if api_key else {}
        super().__init__(
            model,
            base_url=base_url,
            headers={**auth, "anthropic-version": API_VERSION, **dict(headers or {})},
            timeout_secs=timeout_secs,
            connect_timeout_secs=connect_timeout_secs,
        )
        self.max_tokens = max_tokens
        self._extra = dict(extra_body or {})

    def body(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        """The JSON body of a request."""
        system, messages = to_anthropic_messages(request.messages)
        if request.output_schema is not None:
            instruction = OUTPUT_INSTRUCTION.format(schema=json.dumps(request.output_schema))
            system = f"{system}\n\n{instruction}" if system else instruction
        body: dict[str, Any] = {
            "model": self.name,
            "max_tokens": self.max_tokens,
            "messages": messages,
        }
        if system:
            body["system"] = system
        if request.tools:
            tools = []
            for t in request.tools:
                spec: dict[str, Any] = {
                    "name": t["name"],
                    # The API only takes object schemas, and says so when `type` is missing.
                    "input_schema": {"type": "object", **t["parameters"]},
                }
                if t.get("description"):
                    spec["description"] = t["description"]
                tools.append(spec)
            body["tools"] = tools
        if stream:
            body["stream"] = True
        body.update(self._extra)
        return body

    async def generate(self, request: ModelRequest) -> ModelResponse:
        if request.on_text is not None:
            return await self._stream(request)
        data = await self._post(_PATH, self.body(request, stream=False))
        if isinstance(data, dict) and data.get("type") == "error":
            raise self._event_error(data.get("error"))
        content = data.get("content") if isinstance(data, dict) else None
        if not isinstance(content, list):
            raise self._error("transient", f"the response is not a message: {str(data)[:200]}")
        blocks = [b for b in content if isinstance(b, dict)]
        texts = [b.get("text") or "" for b in blocks if b.get("type") == "text"]
        calls = [_call(b, b.get("input")) for b in blocks if b.get("type") == "tool_use"]
        return _reply(texts, calls, data.get("stop_reason"), data.get("usage") or {})

    async def _stream(self, request: ModelRequest) -> ModelResponse:
        sink = request.on_text
        assert sink is not None
        texts: list[str] = []
        # tool_use blocks by index, with the JSON text of their input so far
        tools: dict[int, tuple[dict[str, Any], list[str]]] = {}
        usage: dict[str, Any] = {}
        stop: Any = None
        finished = False
        async for name, event in self._events(_PATH, self.body(request, stream=True)):
            if not isinstance(event, dict):
                continue
            kind = event.get("type") or name
            if kind == "content_block_delta":
                delta = event.get("delta") or {}
                if delta.get("type") == "text_delta" and delta.get("text"):
                    texts.append(delta["text"])
                    sink(delta["text"])
                elif delta.get("type") == "input_json_delta":
                    slot = tools.get(int(event.get("index", -1)))
                    if slot is not None:
                        slot[1].append(delta.get("partial_json") or "")
            elif kind == "content_block_start":
                block = event.get("content_block") or {}
                if block.get("type") == "tool_use":
                    tools[int(event.get("index", len(tools)))] = (block, [])
                elif block.get("type") == "text" and block.get("text"):
                    texts.append(block["text"])
                    sink(block["text"])
            elif kind == "message_start":
                usage.update((event.get("message") or {}).get("usage") or {})
            elif kind == "message_delta":
                stop = (event.get("delta") or {}).get("stop_reason") or stop
                # Its counts are cumulative; fields it leaves out keep message_start's.
                usage.update({k: v for k, v in (event.get("usage") or {}).items() if v is not None})
            elif kind == "message_stop":
                finished = True
            elif kind == "error":
                raise self._event_error(event.get("error"))
        if not finished:
            raise self._error("connection", "the stream ended before message_stop")
        calls = [
            _call(block, "".join(parts) if parts else block.get("input"))
            for _, (block, parts) in sorted(tools.items())
        ]
        return _reply(texts, calls, stop, usage)

    def _event_error(self, error: Any) -> ModelError:
        """The `ModelError` of an error object sent with status 200 (in a stream)."""
        error = error if isinstance(error, dict) else {}
        etype = str(error.get("type") or "api_error")
        message = str(error.get("message") or etype)
        # An unknown type is the server failing part-way: worth another try.
        kind = classify_status(_ERROR_STATUS.get(etype, 500), message)
        return self._error(kind, f"{etype}: {message}")


def anthropic(
    model: str,
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    max_tokens: int = 4096,
    timeout_secs: float = 60,
    connect_timeout_secs: float = 10,
    headers: Mapping[str, str] | None = None,
    extra_body: Mapping[str, Any] | None = None,
) -> AnthropicModel:
    """An Anthropic model (the key defaults to `ANTHROPIC_API_KEY`, the URL to
    `ANTHROPIC_BASE_URL` or Anthropic's; give the URL without `/v1`).

    With another `base_url` (a proxy or a compatible server) a key is optional.
    `max_tokens` bounds each reply; `headers` are added to every request (e.g.
    `{"anthropic-beta": ...}`); `extra_body` adds fields to every request (e.g.
    `{"stop_sequences": ["END"]}`).
    """
    base_url = base_url or os.environ.get("ANTHROPIC_BASE_URL") or None
    custom = base_url is not None and base_url.rstrip("/") != ANTHROPIC_URL
    key = api_key_from(api_key, "ANTHROPIC_API_KEY", required=not custom, what=f"anthropic:{model}")
    return AnthropicModel(
        model,
        api_key=key,
        base_url=base_url or ANTHROPIC_URL,
        max_tokens=max_tokens,
        headers=headers,
        timeout_secs=timeout_secs,
        connect_timeout_secs=connect_timeout_secs,
        extra_body=extra_body,
    )
