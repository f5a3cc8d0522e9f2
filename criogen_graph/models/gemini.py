"""Google Gemini over HTTP: the Gemini API (`generativelanguage`, v1beta), i.e.
`POST /v1beta/models/{model}:generateContent` and `:streamGenerateContent?alt=sse`.

How the transcript maps to the wire:

- system messages become `systemInstruction`; user messages `user` contents; assistant
  messages `model` contents of `text` and `functionCall` parts; tool results one `user`
  content of `functionResponse` parts (`{"result": ...}`, or `{"error": ...}` when the
  call failed, timed out or was rejected). Consecutive contents of one role are merged, so
  roles alternate as the API requires.
- Tool input schemas go out as `parameters`, the API's subset of OpenAPI 3.0, converted
  from JSON Schema: `$ref`s inlined, `anyOf` with `null` turned into `nullable`, keys the
  subset lacks (`title`, `additionalProperties`, `$defs`, unsupported `format`s, ...)
  dropped. That field works with every Gemini model. A schema the subset cannot express
  (a free-form object such as `dict[str, str]`, a recursive model, an untyped value, a
  non-string enum) goes out unchanged as `parametersJsonSchema` (full JSON Schema, Gemini
  2.5 and later). A tool without parameters declares none (the API rejects an object
  without properties).
- Typed output uses `responseMimeType: "application/json"` with `responseSchema` (the same
  conversion; `responseJsonSchema` when needed). Gemini 2.x rejects that JSON mode when
  tools are offered, so with tools the schema goes into the system instruction instead; the
  agent checks the answer (and asks again) either way.
- Tool calls keep what Gemini wants back in later requests: `thought_signature` (the
  part's `thoughtSignature`; Gemini 3 rejects a function-call turn without it) and
  `gemini_id` (the call id, when the API gave one; otherwise the id is made here and never
  sent). A call turn without a signature (another model's calls, in a fallback) is sent
  with the placeholder signature Google documents for history Gemini did not write.
"""

from __future__ import annotations

import json
import re
import urllib.parse
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Unpack

from criogen_graph._retry_after import parse_retry_after, retry_after_from_headers
from criogen_graph.errors import ModelError
from criogen_graph.messages import AssistantMessage, Message, ToolCallData, ToolStatus, Usage
from criogen_graph.models.base import ModelRequest, ModelResponse, TextSink
from criogen_graph.models.http import (
    OUTPUT_INSTRUCTION,
    HttpModel,
    HttpOptions,
    Turns,
    base_url_and_key,
    classify_status,
    error_message,
    tokens,
    tool_call,
)
from criogen_graph.results import empty_usage

if TYPE_CHECKING:
    import httpx

GEMINI_URL = "https://generativelanguage.googleapis.com"
#: Finish reasons that mean the provider withheld (part of) the answer.
_FILTER_FINISH = frozenset(
    {
        "SAFETY",
        "PROHIBITED_CONTENT",
        "BLOCKLIST",
        "SPII",
        "RECITATION",
        "IMAGE_SAFETY",
        "IMAGE_PROHIBITED_CONTENT",
    }
)
_ERROR_STATUSES: frozenset[ToolStatus] = frozenset({"error", "timeout", "rejected"})
#: Sent for a user turn with no text: the API rejects a text part that is empty (and a
#: content without parts), so `agent.run("")` would otherwise fail every time.
EMPTY_TEXT = " "
# Documented by Google for function calls the model did not produce itself.
_FOREIGN_SIGNATURE = "skip_thought_signature_validator"
_VERSIONED = re.compile(r"/v\d+(?:alpha|beta)?\d*$")

# -- JSON Schema -> the API's Schema subset ----------------------------------------------

_TYPES = {
    "string": "STRING",
    "number": "NUMBER",
    "integer": "INTEGER",
    "boolean": "BOOLEAN",
    "array": "ARRAY",
    "object": "OBJECT",
}
_FORMATS = {
    "STRING": frozenset({"enum", "date-time"}),
    "NUMBER": frozenset({"float", "double"}),
    "INTEGER": frozenset({"int32", "int64"}),
}
_KEPT = (
    "description",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "minProperties",
    "maxProperties",
    "pattern",
    "minimum",
    "maximum",
    "default",
    "example",
)


class _Inexpressible(Exception):
    """The schema needs full JSON Schema."""


def to_gemini_schema(schema: Mapping[str, Any], *, ordered: bool = False) -> dict[str, Any] | None:
    """A JSON Schema in the API's `Schema` form (an OpenAPI 3.0 subset), or None when that
    subset cannot express it (send it as `parametersJsonSchema` / `responseJsonSchema`).

    `ordered` adds `propertyOrdering` (the declared order) to objects: for response schemas,
    whose keys the API otherwise writes in alphabetical order."""
    try:
        return _convert(schema, schema, (), ordered)
    except _Inexpressible:
        return None


def _resolve(ref: str, root: Mapping[str, Any]) -> Mapping[str, Any]:
    if not ref.startswith("#"):
        raise _Inexpressible(ref)
    node: Any = root
    for raw in ref[1:].split("/")[1:]:
        key = urllib.parse.unquote(raw).replace("~1", "/").replace("~0", "~")
        if not isinstance(node, Mapping) or key not in node:
            raise _Inexpressible(ref)
        node = node[key]
    if not isinstance(node, Mapping):
        raise _Inexpressible(ref)
    return node


def _convert(
    node: Any, root: Mapping[str, Any], seen: tuple[str, ...], ordered: bool
) -> dict[str, Any]:
    if not isinstance(node, Mapping):
        raise _Inexpressible(node)  # e.g. the `true` schema
    node = {k: v for k, v in node.items() if k not in ("$defs", "definitions")}
    ref = node.pop("$ref", None)
    if ref is not None:
        if ref in seen:
            raise _Inexpressible(ref)  # recursive
        # Keywords beside the reference (a field's description) win over the target's.
        return _convert({**_resolve(ref, root), **node}, root, (*seen, ref), ordered)
    all_of = node.pop("allOf", None)
    if all_of is not None:
        if not isinstance(all_of, list) or len(all_of) != 1 or not isinstance(all_of[0], Mapping):
            raise _Inexpressible(all_of)
        return _convert({**all_of[0], **node}, root, seen, ordered)
    kept = {k: node[k] for k in _KEPT if k in node}
    variants = node.pop("anyOf", None)
    if variants is None:
        variants = node.pop("oneOf", None)
    if variants is not None:
        return _convert_variants(variants, kept, root, seen, ordered)
    return _convert_typed(node, kept, root, seen, ordered)


def _convert_variants(
    variants: Any,
    kept: dict[str, Any],
    root: Mapping[str, Any],
    seen: tuple[str, ...],
    ordered: bool,
) -> dict[str, Any]:
    """An `anyOf` / `oneOf`: its one non-null variant (nullable if a null one is
    beside it), else an `anyOf` of the converted variants."""
    if not isinstance(variants, list):
        raise _Inexpressible(variants)
    real = [v for v in variants if not (isinstance(v, Mapping) and v.get("type") == "null")]
    if not real:
        raise _Inexpressible(variants)
    if len(real) == 1:
        out = {**_convert(real[0], root, seen, ordered), **kept}
    else:
        out = {**kept, "anyOf": [_convert(v, root, seen, ordered) for v in real]}
    if len(real) < len(variants):
        out["nullable"] = True
    return out


def _kind(node: Mapping[str, Any]) -> tuple[str, bool, Any]:
    """The node's JSON Schema type (guessed from its keywords when it has none),
    whether `type` allows null, and its enum (a `const` as a one-value enum)."""
    nullable = False
    kind = node.get("type")
    if isinstance(kind, list):
        nullable = "null" in kind
        rest = [k for k in kind if k != "null"]
        if len(rest) != 1:
            raise _Inexpressible(kind)
        kind = rest[0]
    enum = node.get("enum")
    if "const" in node:
        enum = [node["const"]]
    if kind is None:
        if enum is not None and all(isinstance(v, str) for v in enum):
            kind = "string"
        elif "properties" in node:
            kind = "object"
        elif "items" in node:
            kind = "array"
        else:
            raise _Inexpressible(node)  # any value at all
    if kind not in _TYPES:
        raise _Inexpressible(kind)
    return kind, nullable, enum


def _convert_typed(
    node: Mapping[str, Any],
    kept: dict[str, Any],
    root: Mapping[str, Any],
    seen: tuple[str, ...],
    ordered: bool,
) -> dict[str, Any]:
    kind, nullable, enum = _kind(node)
    out = {"type": _TYPES[kind], **kept}
    fmt = node.get("format")
    if fmt in _FORMATS.get(out["type"], ()):
        out["format"] = fmt
    if enum is not None:
        if not isinstance(enum, list):
            raise _Inexpressible(enum)
        if None in enum:
            nullable = True
        values = [v for v in enum if v is not None]
        # The API takes string enums only; other values would change type on the way.
        if not all(isinstance(v, str) for v in values):
            raise _Inexpressible(enum)
        out["enum"] = values
    if out["type"] == "OBJECT":
        out.update(_object_fields(node, root, seen, ordered))
    elif out["type"] == "ARRAY":
        items = node.get("items")
        if not isinstance(items, Mapping):
            raise _Inexpressible(node)  # tuples (prefixItems) or items of any kind
        out["items"] = _convert(items, root, seen, ordered)
    if nullable:
        out["nullable"] = True
    return out


def _object_fields(
    node: Mapping[str, Any], root: Mapping[str, Any], seen: tuple[str, ...], ordered: bool
) -> dict[str, Any]:
    """An object's `properties`, `required` and `propertyOrdering`."""
    props = node.get("properties")
    if not isinstance(props, Mapping) or not props:
        raise _Inexpressible(node)  # a free-form object (a map)
    out: dict[str, Any] = {
        "properties": {name: _convert(sub, root, seen, ordered) for name, sub in props.items()}
    }
    required = [r for r in node.get("required") or () if r in props]
    if required:
        out["required"] = required
    if ordered and len(props) > 1:
        out["propertyOrdering"] = list(props)
    return out


def _declaration(spec: Mapping[str, Any]) -> dict[str, Any]:
    decl: dict[str, Any] = {"name": spec["name"], "description": spec.get("description") or ""}
    params: Mapping[str, Any] = spec.get("parameters") or {}
    if (
        not params.get("properties")
        and not params.get("additionalProperties")
        and not any(k in params for k in ("$ref", "anyOf", "oneOf", "allOf"))
    ):
        return decl  # no parameters
    converted = to_gemini_schema(params)
    if converted is None:
        decl["parametersJsonSchema"] = dict(params)
    else:
        decl["parameters"] = converted
    return decl


# -- transcript -> contents --------------------------------------------------------------


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = [
            p if isinstance(p, str) else str(p.get("text") or "")
            for p in content
            if isinstance(p, str | Mapping)
        ]
        return "".join(pieces)
    return json.dumps(content)


def to_gemini_contents(messages: list[Message]) -> tuple[list[str], list[dict[str, Any]]]:
    """The system texts and the `contents` of a transcript."""
    system: list[str] = []
    turns = Turns("parts")
    add = turns.add
    calls: dict[str, ToolCallData] = {}
    for m in messages:
        text = _text(m.get("content"))
        if m["role"] == "system":
            if text:
                system.append(text)
        elif m["role"] == "user":
            add("user", [{"text": text or EMPTY_TEXT}])
        elif m["role"] == "assistant":
            parts: list[dict[str, Any]] = [{"text": text}] if text else []
            for i, c in enumerate(m.get("tool_calls") or ()):
                calls[str(c.get("id"))] = c
                args = c.get("args")
                call: dict[str, Any] = {
                    "name": c.get("name") or "",
                    "args": args if isinstance(args, Mapping) else {},
                }
                if c.get("gemini_id"):
                    call["id"] = c["gemini_id"]
                part: dict[str, Any] = {"functionCall": call}
                signature = c.get("thought_signature")
                if signature:
                    part["thoughtSignature"] = signature
                elif i == 0:
                    # Gemini 3 wants a signature on the first call of each step.
                    part["thoughtSignature"] = _FOREIGN_SIGNATURE
                parts.append(part)
            add("model", parts)
        elif m["role"] == "tool":
            source: Mapping[str, Any] = calls.get(str(m.get("tool_call_id")), {})
            value = m.get("content")
            key = "error" if m.get("status") in _ERROR_STATUSES else "result"
            response: dict[str, Any] = {
                # Gemini pairs a response with the call by name: use the name it called.
                "name": source.get("name") or m.get("name") or "",
                "response": {key: value if value is not None else ""},
            }
            if source.get("gemini_id"):
                response["id"] = source["gemini_id"]
            add("user", [{"functionResponse": response}])
    # Gemini also rejects empty contents.
    return system, turns.user_first({"text": EMPTY_TEXT})


# -- reply -------------------------------------------------------------------------------


def _usage(raw: Mapping[str, Any] | None) -> Usage:
    usage = empty_usage()
    thoughts = tokens(raw, "thoughtsTokenCount")
    usage["input_tokens"] = tokens(raw, "promptTokenCount")
    # Thinking tokens are billed as output.
    usage["output_tokens"] = tokens(raw, "candidatesTokenCount") + thoughts
    usage["reasoning_tokens"] = thoughts
    usage["cache_read_tokens"] = tokens(raw, "cachedContentTokenCount")
    return usage


def _call(raw: Mapping[str, Any], signature: Any) -> ToolCallData:
    if not isinstance(raw.get("name"), str) or not raw["name"]:
        raise ValueError(f"a functionCall without a name: {json.dumps(raw, default=str)[:200]}")
    call_id = raw.get("id")
    call = tool_call(
        str(call_id) if call_id else "call_" + uuid.uuid4().hex[:24],
        str(raw.get("name") or ""),
        raw.get("args"),
    )
    if call_id:
        call["gemini_id"] = str(call_id)
    if isinstance(signature, str) and signature:
        call["thought_signature"] = signature
    return call


class _Reply:
    """A reply put together from one response, or from the partial responses of a stream."""

    def __init__(self, sink: TextSink | None, thinking: TextSink | None = None) -> None:
        self.sink = sink
        self.thinking = thinking
        self.text: list[str] = []
        self.thoughts: list[str] = []
        self.calls: list[ToolCallData] = []
        self.finish: str | None = None
        self.blocked: str | None = None
        self.usage: Mapping[str, Any] | None = None
        self.answered = False
        #: Parts that could not be read: the reply is unreadable if nothing else is there.
        self.problems: list[str] = []

    def add(self, data: Mapping[str, Any]) -> None:
        if data.get("usageMetadata"):
            self.usage = data["usageMetadata"]
        block = (data.get("promptFeedback") or {}).get("blockReason")
        if block:
            self.blocked = str(block)
        candidates = data.get("candidates") or []
        if not candidates:
            return
        candidate = candidates[0]
        if not isinstance(candidate, Mapping):
            raise ValueError(f"a candidate is not an object: {candidate!r:.200}")
        self.answered = True
        parts = (candidate.get("content") or {}).get("parts") or []
        if not isinstance(parts, list):
            raise TypeError(f"content.parts must be a list, got {type(parts).__name__}")
        for part in parts:
            if not isinstance(part, Mapping) or (
                "text" in part and not isinstance(part["text"], str)
            ):
                self.problems.append(f"a part that is not text: {part!r:.200}")
                continue
            piece = part.get("text")
            if part.get("thought"):
                # A thought summary: reasoning, not part of the answer.
                if isinstance(piece, str) and piece:
                    self.thoughts.append(piece)
                    if self.thinking is not None:
                        self.thinking(piece)
                continue
            if isinstance(piece, str) and piece:
                self.text.append(piece)
                if self.sink is not None:
                    self.sink(piece)
            raw_call = part.get("functionCall")
            if isinstance(raw_call, Mapping):
                self.calls.append(_call(raw_call, part.get("thoughtSignature")))
        if candidate.get("finishReason"):
            self.finish = str(candidate["finishReason"])

    def response(self, model: GeminiModel, *, streamed: bool) -> ModelResponse:
        message: AssistantMessage = {"role": "assistant", "content": "".join(self.text)}
        if self.thoughts:
            message["reasoning"] = "".join(self.thoughts)
        if self.calls:
            message["tool_calls"] = self.calls
        usage = _usage(self.usage)
        if not self.answered:
            if self.blocked:
                return ModelResponse(message, usage, "content_filter")
            raise model._unreadable("the response has no candidates")
        if self.problems and not (self.text or self.calls or self.thoughts):
            raise model._unreadable(self.problems[0])
        if self.finish in _FILTER_FINISH:
            return ModelResponse(message, usage, "content_filter")
        if self.finish == "MALFORMED_FUNCTION_CALL" and not self.calls:
            # Nothing usable came back; another attempt usually writes a valid call.
            raise model._error("transient", "the model wrote a malformed function call")
        if streamed and self.finish is None:
            raise model._error("connection", "the stream ended before the answer was finished")
        if self.finish == "MAX_TOKENS":
            return ModelResponse(message, usage, "max_tokens")
        return ModelResponse(message, usage)


def _error_details(text: str) -> list[Mapping[str, Any]]:
    try:
        body = json.loads(text)
    except ValueError:
        return []
    if isinstance(body, list) and body:
        body = body[0]
    err = body.get("error") if isinstance(body, Mapping) else None
    details = err.get("details") if isinstance(err, Mapping) else None
    return [d for d in details if isinstance(d, Mapping)] if isinstance(details, list) else []


def _retry_delay(details: list[Mapping[str, Any]]) -> float | None:
    """`google.rpc.RetryInfo.retryDelay` (e.g. `"37s"`), which Gemini sends on 429s."""
    for d in details:
        delay = d.get("retryDelay")
        if str(d.get("@type", "")).endswith("RetryInfo") and isinstance(delay, str):
            # A protobuf Duration: seconds with an `s` (fractions allowed).
            return parse_retry_after(delay[:-1]) if delay.endswith("s") else None
    return None


class GeminiModel(HttpModel):
    """A Gemini model through the Gemini API. Build it with `gemini(...)` or
    `Agent("gemini:<model>")`.

    Tools go out as function declarations (parallel calls allowed); typed output uses
    the API's JSON mode with a response schema; streaming reads `alt=sse` events. The key
    travels in the `x-goog-api-key` header, never in the URL.
    """

    provider = "gemini"

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None,
        base_url: str = GEMINI_URL,
        headers: Mapping[str, str] | None = None,
        **options: Unpack[HttpOptions],
    ) -> None:
        auth = {"x-goog-api-key": api_key} if api_key else {}
        super().__init__(model, base_url=base_url, auth=auth, headers=headers, **options)
        # A base URL that already names an API version (a proxy's ".../v1beta") keeps it.
        version = "" if _VERSIONED.search(self.base_url) else "/v1beta"
        resource = model if "/" in model else f"models/{model}"
        self._path = f"{version}/{urllib.parse.quote(resource, safe='/')}"

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body of a request (the same for streamed and plain calls)."""
        system, contents = to_gemini_contents(request.messages)
        body: dict[str, Any] = {"contents": contents}
        config: dict[str, Any] = {}
        if request.tools:
            body["tools"] = [{"functionDeclarations": [_declaration(t) for t in request.tools]}]
        if request.output_schema is not None:
            if request.tools:
                system.append(OUTPUT_INSTRUCTION.format(schema=json.dumps(request.output_schema)))
            else:
                config["responseMimeType"] = "application/json"
                schema = to_gemini_schema(request.output_schema, ordered=True)
                if schema is None:
                    config["responseJsonSchema"] = request.output_schema
                else:
                    config["responseSchema"] = schema
        if system:
            body["systemInstruction"] = {"parts": [{"text": t} for t in system]}
        if config:
            body["generationConfig"] = config
        for key, value in self._extra.items():
            # `extra_body={"generationConfig": {...}}` adds to the config, not replace it.
            if isinstance(value, Mapping) and isinstance(body.get(key), dict):
                body[key] = {**body[key], **value}
            else:
                body[key] = value
        return body

    async def _complete(self, request: ModelRequest) -> ModelResponse:
        data = await self._post(f"{self._path}:generateContent", self.body(request))
        if not isinstance(data, Mapping):
            raise self._unreadable(f"the response is not an object: {str(data)[:200]}")
        reply = _Reply(None)
        self._add(reply, data)
        return reply.response(self, streamed=False)

    async def _stream(self, request: ModelRequest) -> ModelResponse:
        reply = _Reply(request.on_text, request.on_reasoning)
        async for _, chunk in self._events(
            f"{self._path}:streamGenerateContent", self.body(request), {"alt": "sse"}
        ):
            if not isinstance(chunk, Mapping):
                raise self._unreadable(f"a stream event is not an object: {str(chunk)[:200]}")
            self._add(reply, chunk)
        return reply.response(self, streamed=True)

    def _add(self, reply: _Reply, data: Mapping[str, Any]) -> None:
        if data.get("error"):
            # A failure reported with status 200 (inside an open stream), in the error
            # body's shape.
            raise self._stream_error(data["error"])
        try:
            reply.add(data)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            problem = f"{type(exc).__name__}: {exc}: {json.dumps(data, default=str)[:200]}"
            raise self._unreadable(problem) from exc

    def _status_error(self, response: httpx.Response, text: str) -> ModelError:
        details = _error_details(text)
        kind = classify_status(response.status_code, text)
        if kind == "bad_request" and any(
            str(d.get("reason", "")).startswith("API_KEY_") for d in details
        ):
            kind = "auth"  # Gemini answers a bad key with 400 INVALID_ARGUMENT
        retry_after = retry_after_from_headers(response.headers)
        if retry_after is None:
            retry_after = _retry_delay(details)
        return self._error(
            kind,
            f"HTTP {response.status_code}: {error_message(text)}",
            status=response.status_code,
            retry_after=retry_after,
        )


def gemini(
    model: str,
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    headers: Mapping[str, str] | None = None,
    **options: Unpack[HttpOptions],
) -> GeminiModel:
    """A Gemini model (e.g. `gemini("gemini-2.5-flash")`); the key defaults to
    `GEMINI_API_KEY`, the URL to `GEMINI_BASE_URL` or Google's.

    With a custom `base_url` (a proxy or gateway) a key is optional. `timeout_secs`,
    `connect_timeout_secs` and `extra_body` as in `HttpOptions`; `extra_body` adds fields
    to every request, e.g. `{"generationConfig": {"temperature": 0}}` or
    `{"safetySettings": [...]}`.
    """
    url, key = base_url_and_key(
        base_url,
        api_key,
        default_url=GEMINI_URL,
        url_env="GEMINI_BASE_URL",
        key_env="GEMINI_API_KEY",
        what=f"gemini:{model}",
    )
    return GeminiModel(model, api_key=key, base_url=url, headers=headers, **options)
