"""A scripted server on 127.0.0.1 that speaks the Gemini API (`generativelanguage` v1beta),
for testing clients over real HTTP. Written from the published API reference:

- `POST /v1beta/models/{model}:generateContent` answers one `GenerateContentResponse`:
  `{"candidates": [{"content": {"role": "model", "parts": [...]}, "finishReason",
  "index"}], "usageMetadata": {"promptTokenCount", "candidatesTokenCount",
  "totalTokenCount", ...}, "modelVersion", "responseId"}`; a part is `{"text"}` (with
  `"thought": true` for a thought summary) or `{"functionCall": {"name", "args", "id"?}}`,
  optionally with a `thoughtSignature`.
- `:streamGenerateContent?alt=sse` answers the same as server-sent events, each `data:` a
  partial response; the last carries `finishReason` and the final usage. Without `alt=sse`
  it answers a JSON array of the partial responses.
- A blocked prompt is `{"promptFeedback": {"blockReason"}}` with no candidates; an error is
  `{"error": {"code", "message", "status", "details"?}}`.
- The key is read from the `x-goog-api-key` header (or `?key=`); a request without one gets
  403 PERMISSION_DENIED.

Each request takes the next scripted step: `text(...)`, `function_calls(...)`,
`blocked(...)`, `prompt_blocked(...)`, `error(status, ...)`, `malformed()`; any step can
answer late (`slow(step)`: until `server.release` is set, at most `delay` seconds) or, when
streamed, stop part-way (`dropped(step, after=n)`) or report an error part-way
(`stream_error(step, after=n)`). Before taking a step the server checks
the body as the real API does (roles, parts, function responses matching the calls, the
`Schema` subset of function declarations and response schemas, JSON mode with tools) and
answers 400 INVALID_ARGUMENT when it would be rejected, so a client bug fails its test.
Every request's path, query, body and headers are recorded in `requests`.
"""

from __future__ import annotations

import json
import re
import urllib.parse
import uuid
from dataclasses import dataclass, field
from typing import Any

from tests.servers.base import LoopbackHandler, LoopbackServer, sse

STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
_PATH = re.compile(
    r"^/v1beta/(models|tunedModels)/([^/:]+):(generateContent|streamGenerateContent)$"
)
# The fields of the API's `Schema` object (a subset of OpenAPI 3.0).
SCHEMA_KEYS = frozenset(
    {
        "type",
        "format",
        "title",
        "description",
        "nullable",
        "enum",
        "maxItems",
        "minItems",
        "properties",
        "required",
        "minProperties",
        "maxProperties",
        "minLength",
        "maxLength",
        "pattern",
        "example",
        "anyOf",
        "propertyOrdering",
        "default",
        "items",
        "minimum",
        "maximum",
    }
)
SCHEMA_TYPES = frozenset(
    {"TYPE_UNSPECIFIED", "STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT", "NULL"}
)
PART_KEYS = frozenset(
    {
        "text",
        "inlineData",
        "fileData",
        "functionCall",
        "functionResponse",
        "executableCode",
        "codeExecutionResult",
        "thought",
        "thoughtSignature",
    }
)


@dataclass
class Step:
    kind: str  # "answer" | "prompt_blocked" | "error" | "malformed"
    text: str = ""
    thought: str = ""  # a thought summary part, sent before the text
    # (name, args): args is sent as given, so a non-object shows how clients cope with it
    calls: list[tuple[str, Any]] = field(default_factory=list)
    call_ids: bool = False  # give each call an id, as the API may
    signature: str | None = None  # thoughtSignature of the first function call
    finish_reason: str = "STOP"
    block_reason: str = "SAFETY"
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    usage: dict[str, int] = field(
        default_factory=lambda: {"promptTokenCount": 11, "candidatesTokenCount": 7}
    )
    chunk: int = 8  # characters per streamed text part
    delay: float = 0  # slow: answer once `release` is set, after at most this long
    drop_after: int | None = None  # streamed: close the connection after this many events
    drop_cleanly: bool = False  # dropped: end the body properly (no finishReason sent)
    stream_error: dict[str, Any] | None = None  # streamed: this error event after `drop_after`


def text(t: str, **kw: Any) -> Step:
    """A text answer (finishReason STOP)."""
    return Step("answer", text=t, **kw)


def function_calls(*calls: tuple[str, Any], text: str = "", **kw: Any) -> Step:
    """One `functionCall` part per call, after an optional text part."""
    return Step("answer", text=text, calls=list(calls), **kw)


def blocked(reason: str = "SAFETY", *, text: str = "", **kw: Any) -> Step:
    """A candidate stopped by a filter (`finishReason` SAFETY, RECITATION, ...)."""
    return Step("answer", text=text, finish_reason=reason, **kw)


def prompt_blocked(reason: str = "SAFETY") -> Step:
    """The prompt itself blocked: `promptFeedback.blockReason`, no candidates."""
    return Step("prompt_blocked", block_reason=reason)


def error(
    status: int,
    message: str = "error",
    *,
    status_name: str | None = None,
    details: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
) -> Step:
    """An error response in the API's shape."""
    err: dict[str, Any] = {
        "code": status,
        "message": message,
        "status": status_name or STATUS_NAMES.get(status, "UNKNOWN"),
    }
    if details is not None:
        err["details"] = details
    return Step("error", status=status, body={"error": err}, headers=headers or {})


def retry_info(seconds: int) -> dict[str, Any]:
    """The `google.rpc.RetryInfo` detail Gemini puts in 429 bodies."""
    return {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{seconds}s"}


def malformed() -> Step:
    """A 200 whose body (or stream event) is cut-off JSON."""
    return Step("malformed")


def slow(step: Step, delay: float = 10) -> Step:
    """`step`, answered only once `server.release` is set (or after `delay` seconds)."""
    step.delay = delay
    return step


def dropped(step: Step, after: int = 1, *, cleanly: bool = False) -> Step:
    """`step` streamed, but the connection closes after `after` events: abruptly (a body
    cut short), or with `cleanly` as a finished body that never sent its finishReason."""
    step.drop_after = after
    step.drop_cleanly = cleanly
    return step


def stream_error(
    step: Step, after: int = 1, status: int = 503, message: str = "overloaded"
) -> Step:
    """`step` streamed, but after `after` events the stream reports an error (an event
    `{"error": {"code", "message", "status"}}`) and ends."""
    step.drop_after = after
    step.stream_error = {
        "error": {"code": status, "message": message, "status": STATUS_NAMES.get(status, "UNKNOWN")}
    }
    return step


@dataclass
class Request:
    path: str  # without the query string
    query: dict[str, list[str]]
    body: dict[str, Any]
    headers: dict[str, str]
    raw_path: str  # as sent, with the query string


class GeminiServer(LoopbackServer[Step]):
    """Start with `with GeminiServer() as srv:`; point a client at `srv.base_url`."""

    def __init__(self, *, require_key: bool = True) -> None:
        self.requests: list[Request] = []
        self.require_key = require_key
        server = self

        class Handler(LoopbackHandler):
            content_type = "application/json; charset=UTF-8"

            def do_POST(self) -> None:
                raw = self.read_body()
                split = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(split.query)
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = None
                with server._lock:
                    server.requests.append(
                        Request(
                            split.path,
                            query,
                            body if isinstance(body, dict) else {},
                            self.header_dict(),
                            self.path,
                        )
                    )
                match = _PATH.match(split.path)
                if match is None:
                    self._error(404, f"Path {split.path} was not found.", "NOT_FOUND")
                    return
                if server.require_key and not (
                    self.headers.get("x-goog-api-key") or query.get("key")
                ):
                    self._error(
                        403,
                        "Method doesn't allow unregistered callers (callers without "
                        "established identity). Please use API Key or other form of API "
                        "consumer identity to call this API.",
                        "PERMISSION_DENIED",
                    )
                    return
                if not isinstance(body, dict):
                    self._error(400, "Invalid JSON payload received.", "INVALID_ARGUMENT")
                    return
                problem = check_request(body)
                if problem is not None:
                    self._error(400, problem, "INVALID_ARGUMENT")
                    return
                step = server.next_step()
                if step is None:
                    self._error(500, "the test server's script is empty", "INTERNAL")
                    return
                if step.delay:
                    server.release.wait(step.delay)
                model = match.group(2)
                streamed = match.group(3) == "streamGenerateContent"
                if step.kind == "error":
                    self.send_json(step.status, step.body, step.headers)
                elif step.kind == "malformed":
                    if streamed and query.get("alt") == ["sse"]:
                        self._sse([b'data: {"candidates": [{"content": {"parts": [\r\n\r\n'], None)
                    else:
                        self.send_raw(200, b'{"candidates": [{"content": ')
                elif not streamed:
                    self.send_json(200, whole(events(step, model)))
                elif query.get("alt") == ["sse"]:
                    frames = [sse(json.dumps(e), newline="\r\n") for e in events(step, model)]
                    if step.drop_after is not None and step.stream_error is not None:
                        error_frame = sse(json.dumps(step.stream_error), newline="\r\n")
                        self._sse([*frames[: step.drop_after], error_frame], None)
                    elif step.drop_after is not None and step.drop_cleanly:
                        self._sse(frames[: step.drop_after], None)
                    else:
                        self._sse(frames, step.drop_after)
                else:
                    self.send_json(200, events(step, model))

            def _error(self, status: int, message: str, name: str) -> None:
                self.send_json(
                    status, {"error": {"code": status, "message": message, "status": name}}
                )

            def _sse(self, frames: list[bytes], drop_after: int | None) -> None:
                """Chunked event stream; with `drop_after`, the connection closes after
                that many frames without the terminating chunk (a body cut short)."""
                self.start_stream()
                for i, frame in enumerate(frames):
                    if drop_after is not None and i >= drop_after:
                        self.drop()
                        return
                    self.chunk(frame)
                self.end_stream()

        super().__init__(Handler)

    def bodies(self) -> list[dict[str, Any]]:
        return [r.body for r in self.requests]


# -- responses -----------------------------------------------------------------------------


def events(step: Step, model: str) -> list[dict[str, Any]]:
    """The partial responses of a step, as a stream sends them."""
    rid = uuid.uuid4().hex[:20]
    base = {"modelVersion": model, "responseId": rid}
    prompt = step.usage.get("promptTokenCount", 0)
    if step.kind == "prompt_blocked":
        return [
            {
                "promptFeedback": {
                    "blockReason": step.block_reason,
                    "safetyRatings": [
                        {"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH"}
                    ],
                },
                "usageMetadata": {"promptTokenCount": prompt, "totalTokenCount": prompt},
                **base,
            }
        ]
    parts: list[list[dict[str, Any]]] = []
    if step.thought:
        parts.append([{"text": step.thought, "thought": True}])
    parts += [
        [{"text": step.text[i : i + step.chunk]}] for i in range(0, len(step.text), step.chunk)
    ]
    if step.calls:
        call_parts: list[dict[str, Any]] = []
        for i, (name, args) in enumerate(step.calls):
            call: dict[str, Any] = {"name": name, "args": args}
            if step.call_ids:
                call["id"] = f"fc-{rid}-{i}"
            part: dict[str, Any] = {"functionCall": call}
            if i == 0 and step.signature:
                part["thoughtSignature"] = step.signature
            call_parts.append(part)
        parts.append(call_parts)
    if not parts:
        parts.append([])
    out = []
    for i, p in enumerate(parts):
        candidate: dict[str, Any] = {"index": 0}
        if p:
            candidate["content"] = {"role": "model", "parts": p}
        # Partial usage on the way, the final counts with the last event.
        usage = {
            "promptTokenCount": prompt,
            "candidatesTokenCount": i,
            "totalTokenCount": prompt + i,
        }
        if i == len(parts) - 1:
            candidate["finishReason"] = step.finish_reason
            if step.finish_reason != "STOP":
                candidate["safetyRatings"] = [
                    {
                        "category": "HARM_CATEGORY_DANGEROUS_CONTENT",
                        "probability": "HIGH",
                        "blocked": True,
                    }
                ]
            usage = dict(step.usage)
            usage["totalTokenCount"] = sum(
                step.usage.get(k, 0)
                for k in ("promptTokenCount", "candidatesTokenCount", "thoughtsTokenCount")
            )
        out.append({"candidates": [candidate], "usageMetadata": usage, **base})
    return out


def whole(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The one response a non-streamed call gets: the partial responses merged."""
    last = dict(parts[-1])
    if "candidates" not in last:
        return last
    merged: list[dict[str, Any]] = []
    for e in parts:
        merged += e["candidates"][0].get("content", {}).get("parts", [])
    candidate = dict(last["candidates"][0])
    if merged:
        candidate["content"] = {"role": "model", "parts": merged}
    last["candidates"] = [candidate]
    return last


# -- request checks --------------------------------------------------------------------


def check_request(body: dict[str, Any]) -> str | None:
    """Why the API would reject this request body, or None."""
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        return "* GenerateContentRequest.contents: contents is not specified"
    previous_calls: int | None = None
    for i, content in enumerate(contents):
        if not isinstance(content, dict) or content.get("role") not in ("user", "model"):
            return f"contents[{i}].role: must be 'user' or 'model'"
        if i and contents[i - 1].get("role") == content["role"]:
            return "Please ensure that multiturn requests alternate between user and model."
        parts = content.get("parts")
        if not isinstance(parts, list) or not parts:
            return (
                f"* GenerateContentRequest.contents[{i}].parts: contents.parts must not be empty."
            )
        for j, part in enumerate(parts):
            if not isinstance(part, dict) or not part or set(part) - PART_KEYS:
                return f"Invalid JSON payload received. Unknown name in contents[{i}].parts[{j}]: {part!r}"
            if "text" in part and not isinstance(part["text"], str):
                return f"contents[{i}].parts[{j}].text: must be a string"
            call = part.get("functionCall")
            if call is not None and (
                content["role"] != "model"
                or not call.get("name")
                or not isinstance(call.get("args", {}), dict)
            ):
                return f"contents[{i}].parts[{j}].functionCall is not valid"
            response = part.get("functionResponse")
            if response is not None and (
                content["role"] != "user"
                or not response.get("name")
                or not isinstance(response.get("response"), dict)
            ):
                return f"contents[{i}].parts[{j}].functionResponse is not valid"
        responses = sum(1 for p in parts if "functionResponse" in p)
        if previous_calls is not None and responses != previous_calls:
            return (
                "Please ensure that the number of function response parts is equal to the "
                "number of function call parts of the function call turn."
            )
        calls = sum(1 for p in parts if "functionCall" in p)
        previous_calls = calls if calls else None
        if responses and i and not any("functionCall" in p for p in contents[i - 1]["parts"]):
            return "Please ensure that function response turn comes immediately after a function call turn."
    system = body.get("systemInstruction")
    if system is not None and (
        not isinstance(system, dict)
        or not all(
            isinstance(p, dict) and isinstance(p.get("text"), str)
            for p in system.get("parts") or [None]
        )
    ):
        return "systemInstruction: parts must be text parts"
    declared = False
    for t, tool in enumerate(body.get("tools") or []):
        for d, decl in enumerate(tool.get("functionDeclarations") or []):
            declared = True
            where = f"tools[{t}].function_declarations[{d}]"
            if not isinstance(decl.get("name"), str) or not re.match(
                r"^[A-Za-z_][A-Za-z0-9_.:-]{0,63}$", decl["name"]
            ):
                return f"* GenerateContentRequest.{where}.name: Invalid function name."
            if "parameters" in decl and "parametersJsonSchema" in decl:
                return f"{where}: parameters and parametersJsonSchema are mutually exclusive"
            if "parameters" in decl:
                problem = check_schema(decl["parameters"], f"{where}.parameters")
                if problem:
                    return problem
    config = body.get("generationConfig") or {}
    if "responseSchema" in config:
        if "responseJsonSchema" in config:
            return "responseSchema and responseJsonSchema are mutually exclusive"
        if config.get("responseMimeType") not in ("application/json", "text/x.enum"):
            return "responseSchema needs a compatible responseMimeType"
        problem = check_schema(config["responseSchema"], "generation_config.response_schema")
        if problem:
            return problem
    if declared and config.get("responseMimeType") == "application/json":
        # What the Gemini 2.x models answer; the client must not combine the two.
        return "Function calling with a response mime type: 'application/json' is unsupported"
    return None


def check_schema(schema: Any, where: str) -> str | None:
    """Why a `Schema` (the OpenAPI subset) would be rejected, or None."""
    if not isinstance(schema, dict):
        return f"{where}: must be an object"
    unknown = sorted(set(schema) - SCHEMA_KEYS)
    if unknown:
        return f"Invalid JSON payload received. Unknown name \"{unknown[0]}\" at '{where}': Cannot find field."
    kind = schema.get("type")
    if kind is not None and str(kind).upper() not in SCHEMA_TYPES:
        return f"Invalid value at '{where}.type' (type.googleapis.com/google.ai.generativelanguage.v1beta.Type), {kind!r}"
    if kind is not None and str(kind).upper() == "OBJECT" and not schema.get("properties"):
        return f"* GenerateContentRequest.{where}.properties: should be non-empty for OBJECT type"
    if "enum" in schema and not all(isinstance(v, str) for v in schema["enum"]):
        return f"{where}.enum: values must be strings"
    for name, sub in (schema.get("properties") or {}).items():
        problem = check_schema(sub, f"{where}.properties[{name}].value")
        if problem:
            return problem
    if "items" in schema:
        problem = check_schema(schema["items"], f"{where}.items")
        if problem:
            return problem
    for i, sub in enumerate(schema.get("anyOf") or []):
        problem = check_schema(sub, f"{where}.any_of[{i}]")
        if problem:
            return problem
    return None
