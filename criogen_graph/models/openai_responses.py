"""OpenAI's Responses API (`POST /v1/responses`) over HTTP.

Runs without server-side storage (`store: false`): the whole transcript goes out on every
request, and a reasoning model's reasoning items come back encrypted
(`include: ["reasoning.encrypted_content"]`) or with their text (`reasoning_text` parts:
DeepSeek, gpt-oss through OpenRouter), are kept on the assistant message under
`"reasoning_items"` (plain JSON, so every storage backend saves them) and are sent back,
in order, ahead of that turn's function calls. An item with neither cannot be resolved
without stored items, and is left out.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any, Final, Unpack

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
from criogen_graph.models.base import ModelRequest, ModelResponse, TextSink, wire_call_id
from criogen_graph.models.http import HttpOptions, tool_call
from criogen_graph.models.openai_common import (
    OpenAIConnection,
    OpenAIHttpModel,
    openai_endpoint,
)
from criogen_graph.redact import package_logger
from criogen_graph.results import empty_usage

_PATH = "/responses"
#: Model families that do not reason: OpenAI refuses `reasoning` and encrypted reasoning
#: content for them.
_NON_REASONING = ("gpt-4", "gpt-3.5", "chatgpt-", "gpt-5-chat")
#: The key of the assistant message that holds the reasoning items sent back next turn.
REASONING_ITEMS: Final = "reasoning_items"
_log = package_logger("criogen_graph.models")


def _reasons(model: str) -> bool:
    return not model.lower().startswith(_NON_REASONING)


def to_responses_input(
    messages: list[Message], *, store: bool = False
) -> tuple[str | None, list[dict[str, Any]]]:
    """Transcript dicts as `(instructions, input items)`: the leading system messages
    become `instructions`, later ones `system` items; an assistant turn becomes its
    reasoning items, its text and its `function_call`s; a tool result a
    `function_call_output`.

    Without stored items (`store` false) a reasoning item goes back only with what lets
    the server read it again (its encrypted content or its text): one with only its id
    would be refused ("Items are not persisted when `store` is set to false")."""
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
                item = _reasoning_input(r, store)
                if item is not None:
                    items.append(item)
            calls = m.get("tool_calls") or []
            text = _text(content)
            phase = m.get("phase")
            commentary = m.get("commentary")
            if isinstance(commentary, str) and commentary:
                items.append(_said(commentary, "commentary"))
            if text or not calls:
                items.append(_said(text, phase))
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


#: The `phase` values of an assistant message (OpenAI: send them back on every one).
_PHASES = ("commentary", "final_answer")


def _said(text: str, phase: object) -> dict[str, Any]:
    """An assistant message input item, with its phase when it had one."""
    item: dict[str, Any] = {"type": "message", "role": "assistant", "content": text}
    if phase in _PHASES:
        item["phase"] = phase
    return item


def _reasoning_input(saved: object, store: bool) -> dict[str, Any] | None:
    """The input item of a kept reasoning item, or None when it cannot go back."""
    if not isinstance(saved, Mapping) or not isinstance(saved.get("id"), str):
        return None
    item: dict[str, Any] = {
        "type": "reasoning",
        "id": saved["id"],
        "summary": [_summary_part(s) for s in _strings(saved.get("summary"))],
    }
    if isinstance(saved.get("encrypted_content"), str):
        item["encrypted_content"] = saved["encrypted_content"]
    texts = _strings(saved.get("content"))
    if texts:
        item["content"] = [{"type": "reasoning_text", "text": t} for t in texts]
    if not store and "encrypted_content" not in item and not texts:
        _log.debug(
            "reasoning item %s is not sent back: it has neither encrypted content nor "
            "text, and without stored items (store: false) the server cannot resolve "
            "its id",
            saved["id"],
        )
        return None
    return item


def _summary_part(text: str) -> dict[str, Any]:
    return {"type": "summary_text", "text": text}


def _strings(raw: object) -> list[str]:
    return [x for x in raw if isinstance(x, str)] if isinstance(raw, list) else []


def _text(content: Any) -> str:
    if content is None:
        return ""
    return content if isinstance(content, str) else json.dumps(content)


def _streamed_output(done: list[dict[str, Any]], final: list[Any]) -> list[Any]:
    """The output items of a stream: those of its final response, as the `openai` SDK
    reads them (a proxy may give an item another id there than in the events before
    it), each with the `encrypted_content` of its `output_item.done` event (OpenAI: the
    one to send back; the other events' may be incomplete). Items only one side lists
    come from that side."""
    out: list[Any] = []
    for index in range(max(len(done), len(final))):
        streamed = done[index] if index < len(done) else None
        listed = final[index] if index < len(final) else None
        if not isinstance(listed, Mapping) or streamed is None:
            out.append(streamed if streamed is not None else listed)
            continue
        item = dict(listed)
        if streamed.get("type") == item.get("type") and isinstance(
            streamed.get("encrypted_content"), str
        ):
            item["encrypted_content"] = streamed["encrypted_content"]
        out.append(item)
    return out


def _parts(item: Mapping[str, Any], key: str, kind: str | None = None) -> list[str]:
    """The texts of an item's `summary` or `content` parts (of type `kind` if given)."""
    return [
        p["text"]
        for p in item.get(key) or ()
        if isinstance(p, Mapping)
        and isinstance(p.get("text"), str)
        and (kind is None or p.get("type") == kind)
    ]


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


#: Output item types that carry a reply (text, a refusal, a call, reasoning); hosted tool
#: items travel beside them but never make an answer on their own.
_ANSWER_ITEMS = frozenset({"message", "function_call", "reasoning"})


def _item_kind(item: Any) -> Any:
    return item.get("type") if isinstance(item, Mapping) else None


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
        # `extra_body={"store": True}` keeps items on the server: ids alone then resolve.
        store = self._extra.get("store") is True
        instructions, items = to_responses_input(request.messages, store=store)
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

    def _finish(self, data: Any, streamed: list[dict[str, Any]] | None) -> ModelResponse:
        try:
            return self._read(data, streamed)
        except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
            raise self._unreadable(f"{type(exc).__name__}: {exc}: {str(data)[:200]}") from exc

    def _read(self, data: Any, streamed: list[dict[str, Any]] | None) -> ModelResponse:
        """The reply of a final response object (`streamed`: the items of its stream's
        `output_item.done` events, which take the place of its `output`)."""
        if not isinstance(data, Mapping):
            raise self._unreadable(f"not a JSON object: {json.dumps(data)[:200]}")
        status = data.get("status")
        if status == "failed" or (status is None and data.get("error")):
            raise self._failed(data.get("error"))
        output = data.get("output")
        if output is None:
            if not streamed:
                raise self._unreadable(f"the response has no 'output': {json.dumps(data)[:200]}")
            output = []
        if not isinstance(output, list):
            raise self._unreadable(f"'output' is not a list: {json.dumps(output)[:200]}")
        if streamed:
            output = _streamed_output(streamed, output)
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
        if status is None and not output and not streamed:
            # Neither a status nor an item: a body that only looks like a response.
            raise self._unreadable(f"no answer in the response: {json.dumps(data)[:200]}")
        message, refused = self._read_output(output)
        if refused:
            stop = "content_filter"
        if output and not any(_item_kind(i) in _ANSWER_ITEMS for i in output):
            # Items none of which can hold an answer: not an empty answer either.
            raise self._unreadable(f"no answer in the response: {json.dumps(output)[:200]}")
        return ModelResponse(message, _usage(data.get("usage")), stop)

    def _read_output(self, output: list[Any]) -> tuple[AssistantMessage, bool]:
        reader = _OutputReader(self)
        for item in output:
            if not isinstance(item, Mapping):
                raise self._unreadable(f"an output item is not an object: {item!r:.200}")
            reader.add(item)
        message = reader.message()
        if reader.problems and not (
            message["content"] or reader.refusal or reader.calls or reader.reasoning
        ):
            raise self._unreadable(reader.problems[0])
        if reader.refusal and not message["content"]:
            message["content"] = "".join(reader.refusal)
        if reader.calls:
            message["tool_calls"] = reader.calls
        if reader.reasoning:
            _keep_reasoning(message, reader.reasoning)
        return message, bool(reader.refusal)

    async def _stream(self, request: ModelRequest) -> ModelResponse:
        state = _ResponsesStream(request.on_text, request.on_reasoning)
        async for name, event in self._events(_PATH, self.body(request, stream=True)):
            if not isinstance(event, Mapping):
                raise self._unreadable(f"a stream event is not an object: {event!r:.200}")
            kind = event.get("type") or name
            if kind in ("response.completed", "response.incomplete", "response.failed"):
                return self._stream_end(kind, event, state)
            if kind == "error":
                inner = event.get("error")
                raise self._failed(
                    inner
                    if isinstance(inner, Mapping)
                    else {k: v for k, v in event.items() if k != "type"}
                )
            state.on_event(kind, event)
        # Every answer ends with response.completed (or incomplete / failed).
        raise self._error("connection", "the stream ended before the answer was finished")

    def _stream_end(
        self, kind: Any, event: Mapping[str, Any], state: _ResponsesStream
    ) -> ModelResponse:
        """The reply of a stream's last event, with the held-back commentary sent."""
        final = event.get("response")
        if kind == "response.failed" and not isinstance(final, Mapping):
            raise self._failed(None)
        response = self._finish(final, [state.done[i] for i in sorted(state.done)])
        if response.message.get("phase") != "final_answer":
            state.release()
        if state.text and not response.message["content"]:
            # A server that streams the text but lists no items for it.
            response.message["content"] = "".join(state.text)
        return response


class _ResponsesStream:
    """One streamed Responses answer before its last event: the streamed text, the
    finished items by index, and the commentary text held back from the sink."""

    def __init__(self, sink: TextSink | None, thinking: TextSink | None) -> None:
        self.sink = sink
        self.thinking = thinking
        self.last_part: tuple[Any, ...] | None = None
        self.text: list[str] = []
        self.done: dict[int, dict[str, Any]] = {}
        # A commentary preamble is the reply's text unless a final answer follows it in
        # the same reply: its pieces wait until that is known, so that the streamed text
        # is the saved text.
        self.phases: dict[object, object] = {}
        self.held: list[str] | None = None

    def release(self) -> None:
        if self.held and self.sink is not None:
            for piece in self.held:
                self.sink(piece)
        self.held = None

    def on_event(self, kind: Any, event: Mapping[str, Any]) -> None:
        if kind == "response.output_text.delta":
            self._text_delta(event)
        elif kind == "response.output_item.added":
            self._item_added(event)
        elif kind in (
            "response.reasoning_summary_text.delta",
            "response.reasoning_text.delta",
        ):
            self._reasoning_delta(kind, event)
        elif kind == "response.output_item.done":
            item = event.get("item")
            if isinstance(item, dict):
                index = event.get("output_index")
                self.done[index if isinstance(index, int) else len(self.done)] = item

    def _text_delta(self, event: Mapping[str, Any]) -> None:
        piece = event.get("delta")
        if not isinstance(piece, str) or not piece:
            return
        self.text.append(piece)
        if self.phases.get(event.get("output_index")) == "commentary":
            self.held = self.held if self.held is not None else []
            self.held.append(piece)
        elif self.sink is not None:
            self.sink(piece)

    def _item_added(self, event: Mapping[str, Any]) -> None:
        item = event.get("item")
        phase = item.get("phase") if isinstance(item, Mapping) else None
        self.phases[event.get("output_index")] = phase
        if phase == "final_answer":
            self.held = None  # kept as the reply's `commentary`, not its text
        elif phase != "commentary":
            self.release()

    def _reasoning_delta(self, kind: Any, event: Mapping[str, Any]) -> None:
        piece = event.get("delta")
        if not isinstance(piece, str) or not piece or self.thinking is None:
            return
        part = (
            kind,
            event.get("output_index"),
            event.get("summary_index", event.get("content_index")),
        )
        if self.last_part is not None and part != self.last_part:
            # The streamed pieces join to the message's `reasoning`.
            self.thinking("\n\n")
        self.last_part = part
        self.thinking(piece)


class _OutputReader:
    """The parts of a reply, read item by item from a response's `output`."""

    def __init__(self, model: OpenAIResponsesModel) -> None:
        self.model = model
        # The text of the message items by phase ("" for none): a final answer is the
        # reply's text, a commentary preamble beside it is kept apart.
        self.said: dict[str, list[str]] = {"": [], "commentary": [], "final_answer": []}
        self.refusal: list[str] = []
        self.calls: list[ToolCallData] = []
        self.reasoning: list[ReasoningItem] = []
        # What could not be read: the reply is unreadable when nothing else is there.
        self.problems: list[str] = []

    def add(self, item: Mapping[str, Any]) -> None:
        kind = item.get("type")
        if not isinstance(kind, str):
            self.problems.append(f"an output item without a type: {json.dumps(item)[:200]}")
        elif kind == "message":
            self._message(item)
        elif kind == "function_call":
            self._function_call(item)
        elif kind == "reasoning" and isinstance(item.get("id"), str):
            self._reasoning(item)
        # Other item types (hosted tools we never offer) carry nothing for us.

    def _message(self, item: Mapping[str, Any]) -> None:
        phase = item.get("phase")
        text = self.said[phase if phase in _PHASES else ""]
        parts = item.get("content")
        if not isinstance(parts, list):
            self.problems.append(f"a message whose content is not a list: {parts!r:.200}")
            return
        for part in parts:
            ptype = part.get("type") if isinstance(part, Mapping) else None
            if ptype == "output_text" and isinstance(part.get("text"), str):
                text.append(part["text"])
            elif ptype == "refusal" and isinstance(part.get("refusal"), str):
                self.refusal.append(part["refusal"])
            else:
                self.problems.append(f"a content part this adapter cannot read: {part!r:.200}")

    def _function_call(self, item: Mapping[str, Any]) -> None:
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise self.model._unreadable(f"a function_call without a name: {item!r:.200}")
        call_id = str(item.get("call_id") or item.get("id") or "call_" + uuid.uuid4().hex)
        self.calls.append(tool_call(call_id, name, item.get("arguments")))

    def _reasoning(self, item: Mapping[str, Any]) -> None:
        kept: ReasoningItem = {"id": item["id"], "summary": _parts(item, "summary")}
        if isinstance(item.get("encrypted_content"), str):
            kept["encrypted_content"] = item["encrypted_content"]
        thought = _parts(item, "content", "reasoning_text")
        if thought:
            kept["content"] = thought
        self.reasoning.append(kept)

    def message(self) -> AssistantMessage:
        """The message with the text of the phase that answers (refusal, calls and
        reasoning not yet in it)."""
        said = self.said
        message: AssistantMessage = {"role": "assistant", "content": ""}
        if said["final_answer"]:
            message["content"] = "".join(said["final_answer"] + said[""])
            message["phase"] = "final_answer"
            if said["commentary"]:
                message["commentary"] = "".join(said["commentary"])
        elif said["commentary"]:
            message["content"] = "".join(said["commentary"] + said[""])
            message["phase"] = "commentary"
        else:
            message["content"] = "".join(said[""])
        return message


def _keep_reasoning(message: AssistantMessage, reasoning: list[ReasoningItem]) -> None:
    message[REASONING_ITEMS] = reasoning
    # Each item's summary, or its reasoning text when it comes without one.
    reasoning_text = "\n\n".join(
        s for r in reasoning for s in (r["summary"] or r.get("content") or ())
    )
    if reasoning_text:
        message["reasoning"] = reasoning_text


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
