"""OpenAI's Responses API (`POST /v1/responses`) over HTTP.

Runs without server-side storage (`store: false`): the whole transcript goes out on every
request, and a reasoning model's reasoning items come back encrypted
(`include: ["reasoning.encrypted_content"]`), are kept on the assistant message under
`"reasoning_items"` (plain JSON, so every storage backend saves them) and are sent back,
in order, ahead of that turn's function calls.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any, Final, Unpack

from criogen_graph.adapters.models.base import ModelRequest, ModelResponse, wire_call_id
from criogen_graph.adapters.models.http import HttpOptions, tool_call
from criogen_graph.adapters.models.openai import (
    OpenAIConnection,
    OpenAIHttpModel,
    openai_endpoint,
)
from criogen_graph.errors import ModelError
from criogen_graph.messages import (
    AssistantMessage,
    Message,
    ModelErrorKind,
    ModelStopReason,
    ReasoningItem,
    ToolCallData,
    Usage,
)
from criogen_graph.results import empty_usage

_PATH = "/responses"
#: Model families that do not reason: OpenAI refuses `reasoning` and encrypted reasoning
#: content for them.
_NON_REASONING = ("gpt-4", "gpt-3.5", "chatgpt-", "gpt-5-chat")
#: The key of the assistant message that holds the reasoning items sent back next turn.
REASONING_ITEMS: Final = "reasoning_items"


def _reasons(model: str) -> bool:
    return not model.lower().startswith(_NON_REASONING)


def to_responses_input(
    messages: list[Message],
) -> tuple[str | None, list[dict[str, Any]]]:
    """Transcript dicts as `(instructions, input items)`: the leading system messages
    become `instructions`, later ones `system` items; an assistant turn becomes its
    reasoning items, its text and its `function_call`s; a tool result a
    `function_call_output`."""
    instructions: list[str] = []
    items: list[dict[str, Any]] = []
    wire: dict[object, object] = {}  # our call id -> the provider's, for renamed calls
    for m in messages:
        content = m.get("content")
        if m["role"] == "system":
            text = _text(content)
            if not items:
                instructions.append(text)
            else:
                items.append({"type": "message", "role": "system", "content": text})
        elif m["role"] == "user":
            items.append({"type": "message", "role": "user", "content": _text(content)})
        elif m["role"] == "assistant":
            # Read as saved: a checkpoint holds what an older version wrote.
            saved: list[object] = list(m.get(REASONING_ITEMS) or ())
            for r in saved:
                if isinstance(r, Mapping) and isinstance(r.get("id"), str):
                    item: dict[str, Any] = {
                        "type": "reasoning",
                        "id": r["id"],
                        "summary": [
                            {"type": "summary_text", "text": s}
                            for s in r.get("summary") or ()
                            if isinstance(s, str)
                        ],
                    }
                    if isinstance(r.get("encrypted_content"), str):
                        item["encrypted_content"] = r["encrypted_content"]
                    items.append(item)
            calls = m.get("tool_calls") or []
            text = _text(content)
            if text or not calls:
                items.append({"type": "message", "role": "assistant", "content": text})
            for c in calls:
                if c.get("provider_id") is not None:
                    wire[c["id"]] = c["provider_id"]
                items.append(
                    {
                        "type": "function_call",
                        "call_id": str(wire_call_id(c)),
                        "name": str(c.get("name") or ""),
                        "arguments": json.dumps(c.get("args") or {}),
                    }
                )
        elif m["role"] == "tool":
            call_id = m.get("tool_call_id", "")
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": str(wire.get(call_id, call_id)),
                    "output": content if isinstance(content, str) else json.dumps(content),
                }
            )
    return ("\n\n".join(instructions) if instructions else None), items


def _text(content: Any) -> str:
    if content is None:
        return ""
    return content if isinstance(content, str) else json.dumps(content)


def strict_schema(schema: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """`(schema, strict)`: a copy OpenAI's strict mode takes (every object closed, every
    property required, no `default: null`, no `$ref` with sibling keywords: what the
    `openai` SDK does for pydantic models), or the schema unchanged and `False` when it
    cannot be made strict (an object that allows extra keys, a `$ref` it cannot follow)."""
    out = json.loads(json.dumps(schema))

    def resolve(ref: Any) -> Any:
        node: Any = out
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return None
        for key in ref[2:].split("/"):
            node = node.get(key) if isinstance(node, dict) else None
        return node

    def walk(node: Any) -> bool:
        if isinstance(node, list):
            return all([walk(n) for n in node])
        if not isinstance(node, dict):
            return True
        if "$ref" in node and len(node) > 1:
            target = resolve(node.pop("$ref"))
            if not isinstance(target, dict):
                return False
            # The node's own keywords (a description) win over the definition's.
            for key, value in json.loads(json.dumps(target)).items():
                node.setdefault(key, value)
        if "default" in node and node["default"] is None:
            del node["default"]
        props = node.get("properties")
        if node.get("type") == "object" or isinstance(props, dict):
            if node.get("additionalProperties", False) is not False:
                return False
            node["additionalProperties"] = False
            node["required"] = list(props) if isinstance(props, dict) else []
        ok = True
        for key in ("properties", "$defs", "definitions"):
            sub = node.get(key)
            if isinstance(sub, dict):
                ok = all([walk(v) for v in sub.values()]) and ok
        for key in ("items", "anyOf", "oneOf", "allOf", "prefixItems", "not"):
            if key in node:
                ok = walk(node[key]) and ok
        return ok

    return (out, True) if walk(out) else (schema, False)


def _usage(raw: Any) -> Usage:
    usage = empty_usage()
    if not isinstance(raw, Mapping):
        return usage
    inp = raw.get("input_tokens_details")
    out = raw.get("output_tokens_details")
    usage["input_tokens"] = int(raw.get("input_tokens") or 0)
    usage["output_tokens"] = int(raw.get("output_tokens") or 0)
    if isinstance(inp, Mapping):
        usage["cache_read_tokens"] = int(inp.get("cached_tokens") or 0)
    if isinstance(out, Mapping):
        usage["reasoning_tokens"] = int(out.get("reasoning_tokens") or 0)
    return usage


#: `response.failed` error codes whose kind their HTTP-style name would not give.
_FAILED_KINDS: dict[str, ModelErrorKind] = {
    "invalid_api_key": "auth",
    "context_length_exceeded": "context_overflow",
    "invalid_prompt": "content_filter",
}


class OpenAIResponsesModel(OpenAIHttpModel):
    """A model behind OpenAI's Responses API. Build it with `openai(model,
    api="responses")`, `openai_responses(...)` or `Agent("openai-responses:<model>")`.

    Every request sends the whole transcript with `store: false`. For a reasoning model
    (`reasoning=None` means any model name outside gpt-4*, gpt-3.5*, chatgpt-* and
    gpt-5-chat*) it asks for encrypted reasoning and a reasoning summary
    (`reasoning_summary`, `None` to ask for none): the assistant message keeps the items
    under `"reasoning_items"` and the summary text under `"reasoning"`, and the next
    request sends the items back. Typed output uses `text.format` with a strict JSON
    Schema (non-strict when the schema allows extra keys). A reply cut at
    `max_output_tokens` has `stop_reason="max_tokens"`; a content-filter stop or a refusal
    `"content_filter"`.
    """

    def __init__(
        self,
        model: str,
        *,
        reasoning: bool | None = None,
        reasoning_summary: str | None = "auto",
        **connection: Unpack[OpenAIConnection],
    ) -> None:
        super().__init__(model, **connection)
        self.reasoning = _reasons(model) if reasoning is None else reasoning
        self._summary = reasoning_summary

    def body(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        """The JSON body of a request."""
        instructions, items = to_responses_input(request.messages)
        body: dict[str, Any] = {"model": self.name, "input": items, "store": False}
        if instructions is not None:
            body["instructions"] = instructions
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "name": t["name"],
                    "description": t["description"],
                    "parameters": t["parameters"],
                    # Tool schemas come from Python signatures (defaults, open dicts):
                    # strict mode would refuse many of them.
                    "strict": False,
                }
                for t in request.tools
            ]
        if self.reasoning:
            body["include"] = ["reasoning.encrypted_content"]
            if self._summary is not None:
                body["reasoning"] = {"summary": self._summary}
        if request.output_schema is not None:
            schema, strict = strict_schema(request.output_schema)
            body["text"] = {
                "format": {
                    "type": "json_schema",
                    "name": "output",
                    "schema": schema,
                    "strict": strict,
                }
            }
        if stream:
            body["stream"] = True
        for key, value in self._extra.items():
            old = body.get(key)
            # `extra_body={"reasoning": {"effort": "high"}}` adds to the summary request.
            body[key] = (
                {**old, **value} if isinstance(old, dict) and isinstance(value, Mapping) else value
            )
        return body

    def _failed(self, error: Any) -> ModelError:
        """The `ModelError` of a `response.failed` error or an `error` stream event."""
        if not isinstance(error, Mapping):
            return self._stream_error({"message": "the response failed"})
        code = str(error.get("code") or "").lower()
        kind: ModelErrorKind | None = _FAILED_KINDS.get(code) or (
            "bad_request" if code.startswith("invalid") else None
        )
        if kind is None:
            # Named like an HTTP error (server_error, rate_limit_exceeded, ...) or unknown.
            return self._stream_error(error)
        message = str(error.get("message") or code)[:500]
        return self._error(kind, f"the response failed: {code}: {message}")

    async def _complete(self, request: ModelRequest) -> ModelResponse:
        data = await self._post(_PATH, self.body(request, stream=False))
        return self._finish(data, None)

    def _finish(
        self, data: Any, streamed: list[dict[str, Any]] | None, streamed_text: bool = False
    ) -> ModelResponse:
        try:
            return self._read(data, streamed, streamed_text)
        except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
            raise self._unreadable(f"{type(exc).__name__}: {exc}: {str(data)[:200]}") from exc

    def _read(
        self, data: Any, streamed: list[dict[str, Any]] | None, streamed_text: bool = False
    ) -> ModelResponse:
        """The reply of a final response object (`streamed`: the items of its stream's
        `output_item.done` events, which take the place of its `output`;
        `streamed_text`: its stream sent text deltas)."""
        if not isinstance(data, Mapping):
            raise self._unreadable(f"not a JSON object: {json.dumps(data)[:200]}")
        status = data.get("status")
        if status == "failed" or (status is None and data.get("error")):
            raise self._failed(data.get("error"))
        # A stream's `output_item.done` items are the ones to send back (OpenAI: the
        # `encrypted_content` of other events may be incomplete).
        output = streamed or data.get("output")
        if output is None:
            output = []
        if not isinstance(output, list):
            raise self._unreadable(f"'output' is not a list: {json.dumps(output)[:200]}")
        stop: ModelStopReason | None = None
        if status == "incomplete":
            details = data.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, Mapping) else None
            if reason == "max_output_tokens":
                stop = "max_tokens"
            elif reason == "content_filter":
                stop = "content_filter"
            else:
                raise self._error("transient", f"the response is incomplete ({reason})")
        elif status not in ("completed", None):
            raise self._unreadable(f"unknown status {status!r}")
        message, refused, read = self._read_output(output)
        if refused:
            stop = "content_filter"
        if not read and stop is None and not streamed_text and (status is None or output):
            # Neither a status nor anything we read, or items none of which we read: a
            # body that only looks like a response, not an empty answer.
            raise self._unreadable(f"no answer in the response: {json.dumps(data)[:200]}")
        return ModelResponse(message, _usage(data.get("usage")), stop)

    def _read_output(self, output: list[Any]) -> tuple[AssistantMessage, bool, bool]:
        """The message, whether the model refused, and whether any item was read."""
        text: list[str] = []
        refusal: list[str] = []
        calls: list[ToolCallData] = []
        reasoning: list[ReasoningItem] = []
        read = False
        for item in output:
            if not isinstance(item, Mapping):
                raise self._unreadable(f"an output item is not an object: {item!r:.200}")
            kind = item.get("type")
            if kind == "message":
                parts = item.get("content")
                if not isinstance(parts, list):
                    raise self._unreadable(f"a message item's content is not a list: {item!r:.200}")
                read = True  # a message, if an empty one
                for part in parts:
                    if not isinstance(part, Mapping):
                        continue
                    if part.get("type") == "output_text":
                        if not isinstance(part.get("text"), str):
                            raise self._unreadable(f"an output_text without text: {part!r:.200}")
                        text.append(part["text"])
                        read = True
                    elif part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
                        refusal.append(part["refusal"])
                        read = True
            elif kind == "function_call":
                if not isinstance(item.get("name"), str) or not item["name"]:
                    raise self._unreadable(f"a function_call without a name: {item!r:.200}")
                read = True
                call_id = str(item.get("call_id") or item.get("id") or "call_" + uuid.uuid4().hex)
                calls.append(tool_call(call_id, str(item.get("name") or ""), item.get("arguments")))
            elif kind == "reasoning" and isinstance(item.get("id"), str):
                summary = [
                    s["text"]
                    for s in item.get("summary") or ()
                    if isinstance(s, Mapping) and isinstance(s.get("text"), str)
                ]
                kept: ReasoningItem = {"id": item["id"], "summary": summary}
                if isinstance(item.get("encrypted_content"), str):
                    kept["encrypted_content"] = item["encrypted_content"]
                reasoning.append(kept)
                read = True
            # Other item types (hosted tools we never offer) carry nothing for us.
        message: AssistantMessage = {"role": "assistant", "content": "".join(text)}
        if refusal and not message["content"]:
            message["content"] = "".join(refusal)
        if calls:
            message["tool_calls"] = calls
        if reasoning:
            message[REASONING_ITEMS] = reasoning
            summary_text = "\n\n".join(s for r in reasoning for s in r["summary"])
            if summary_text:
                message["reasoning"] = summary_text
        return message, bool(refusal), read

    async def _stream(self, request: ModelRequest) -> ModelResponse:
        sink = request.on_text
        thinking = request.on_reasoning
        last_part: tuple[Any, Any] | None = None
        text: list[str] = []
        done: dict[int, dict[str, Any]] = {}
        async for name, event in self._events(_PATH, self.body(request, stream=True)):
            if not isinstance(event, Mapping):
                raise self._unreadable(f"a stream event is not an object: {event!r:.200}")
            kind = event.get("type") or name
            if kind == "response.output_text.delta":
                piece = event.get("delta")
                if isinstance(piece, str) and piece:
                    text.append(piece)
                    if sink is not None:
                        sink(piece)
            elif kind == "response.reasoning_summary_text.delta":
                piece = event.get("delta")
                if isinstance(piece, str) and piece and thinking is not None:
                    part = (event.get("item_id"), event.get("summary_index"))
                    if last_part is not None and part != last_part:
                        # The streamed pieces join to the message's `reasoning`.
                        thinking("\n\n")
                    last_part = part
                    thinking(piece)
            elif kind == "response.output_item.done":
                item = event.get("item")
                if isinstance(item, dict):
                    index = event.get("output_index")
                    done[index if isinstance(index, int) else len(done)] = item
            elif kind in ("response.completed", "response.incomplete", "response.failed"):
                final = event.get("response")
                if kind == "response.failed" and not isinstance(final, Mapping):
                    raise self._failed(None)
                response = self._finish(final, [done[i] for i in sorted(done)], bool(text))
                if text and not response.message["content"]:
                    # A server that streams the text but lists no items for it.
                    response.message["content"] = "".join(text)
                return response
            elif kind == "error":
                inner = event.get("error")
                raise self._failed(
                    inner
                    if isinstance(inner, Mapping)
                    else {k: v for k, v in event.items() if k != "type"}
                )
        # Every answer ends with response.completed (or incomplete / failed).
        raise self._error("connection", "the stream ended before the answer was finished")


def openai_responses(
    model: str,
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    organization: str | None = None,
    headers: Mapping[str, str] | None = None,
    reasoning: bool | None = None,
    reasoning_summary: str | None = "auto",
    **options: Unpack[HttpOptions],
) -> OpenAIResponsesModel:
    """A model behind OpenAI's Responses API (the key defaults to `OPENAI_API_KEY`, the
    URL to `OPENAI_BASE_URL` or OpenAI's; with another `base_url` a key is optional).

    `reasoning` turns encrypted reasoning on or off (default: on unless the model name is
    a non-reasoning family); `reasoning_summary` is what `reasoning.summary` asks for
    (`"auto"`, `"concise"`, `"detailed"` or `None`); `timeout_secs`,
    `connect_timeout_secs` and `extra_body` (fields added to every request, e.g.
    `{"reasoning": {"effort": "high"}, "max_output_tokens": 2000}`) as in `HttpOptions`.
    """
    url, key, extra = openai_endpoint(
        base_url, api_key, organization, headers, f"openai-responses:{model}"
    )
    return OpenAIResponsesModel(
        model,
        api_key=key,
        base_url=url,
        headers=extra,
        reasoning=reasoning,
        reasoning_summary=reasoning_summary,
        **options,
    )
