"""A scripted server on 127.0.0.1 that speaks the Anthropic Messages API
(`POST /v1/messages`, JSON and server-sent events), for testing clients over real HTTP.

Written from the published API reference: a message is `{"id", "type": "message", "role":
"assistant", "model", "content": [text | tool_use blocks], "stop_reason", "stop_sequence",
"usage"}`; a stream is `message_start`, then per block `content_block_start`,
`content_block_delta` (`text_delta` / `input_json_delta`) and `content_block_stop`, then
`message_delta` (stop reason, cumulative output tokens) and `message_stop`, with `ping`s in
between; an error is `{"type": "error", "error": {"type", "message"}, "request_id"}`.

Each request takes the next scripted step: `text`, `tool_use`, `refusal`, `error` (and its
shorthands), or a fault: `slow`, `dropped`, `truncated`, `malformed`, `stream_error`. Every request's
body, headers and path are recorded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tests.servers.base import LoopbackHandler, RecordingServer, sse

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


@dataclass
class Step:
    kind: (
        str  # "message" | "error" | "slow" | "dropped" | "truncated" | "malformed" | "stream_error"
    )
    text: str = ""
    # (name, input): an input dict is sent as JSON; a str is sent as the raw input text
    calls: list[tuple[str, dict[str, Any] | str]] = field(default_factory=list)
    stop_reason: str | None = None
    status: int = 200
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=lambda: {"input_tokens": 11, "output_tokens": 7})
    chunk: int = 8  # characters per text delta
    delay_secs: float = 0.0  # slow: the longest the answer is held back
    then: Step | None = None  # slow: what is answered after the delay


def text(t: str, **kw: Any) -> Step:
    """A text answer (`stop_reason` `end_turn`)."""
    return Step("message", text=t, **kw)


def tool_use(*calls: tuple[str, dict[str, Any] | str], text: str = "", **kw: Any) -> Step:
    """One `tool_use` block per call, after an optional text block. An input given as a
    str is sent verbatim as the input's JSON text (streamed as `input_json_delta`s; in a
    JSON answer as a string `input`), so it can be made invalid on purpose."""
    return Step("message", text=text, calls=list(calls), **kw)


def refusal(t: str = "") -> Step:
    """A safety stop: `stop_reason` `refusal`."""
    return Step("message", text=t, stop_reason="refusal")


def error(
    status: int,
    message: str = "error",
    *,
    type: str | None = None,
    headers: dict[str, str] | None = None,
) -> Step:
    """An HTTP error with Anthropic's error body (the `type` follows the status)."""
    return Step(
        "error",
        status=status,
        body={
            "type": "error",
            "error": {"type": type or ERROR_TYPES.get(status, "api_error"), "message": message},
            "request_id": f"req_test_{status}",
        },
        headers=headers or {},
    )


def rate_limited(retry_after: float) -> Step:
    """429 `rate_limit_error` with a `retry-after` header."""
    return error(
        429,
        "Number of request tokens has exceeded your per-minute rate limit",
        headers={"retry-after": str(retry_after)},
    )


def overloaded() -> Step:
    """529 `overloaded_error`."""
    return error(529, "Overloaded")


def slow(then: Step, delay_secs: float = 10.0) -> Step:
    """Answer `then`, but only after `delay_secs` (cut short when the server stops)."""
    return Step("slow", then=then, delay_secs=delay_secs)


def dropped(t: str) -> Step:
    """Send part of an answer, then close the connection without finishing it: in a
    stream, the events of `t` but no block stop, `message_delta` or `message_stop`; in a
    JSON answer, half the body promised by `content-length`."""
    return Step("dropped", text=t)


def truncated(t: str) -> Step:
    """In a stream, the events of `t`, then a clean end of the body without the block
    stop, `message_delta` or `message_stop` (a proxy cutting the stream short)."""
    return Step("truncated", text=t)


def malformed(raw: str = '{"id": "msg_bad", "type": "message", "content": [') -> Step:
    """A 200 whose body (or, in a stream, whose event data) is not valid JSON."""
    return Step("malformed", text=raw)


def stream_error(error_type: str, message: str = "error", *, text: str = "") -> Step:
    """In a stream: `text` (if any), then an `error` event after the 200 (as the API does
    when it fails part-way). Asked without streaming, the error's usual HTTP status."""
    status = next((s for s, t in ERROR_TYPES.items() if t == error_type), 500)
    return Step(
        "stream_error",
        text=text,
        status=status,
        body={"type": "error", "error": {"type": error_type, "message": message}},
    )


class AnthropicServer(RecordingServer[Step]):
    """Start with `with AnthropicServer() as srv:`; point a client at `srv.base_url` (no
    `/v1`, like `ANTHROPIC_BASE_URL`)."""

    def __init__(self) -> None:
        server = self

        class Handler(LoopbackHandler):
            body_headers: ClassVar[Mapping[str, str]] = {"request-id": "req_test"}
            stream_headers: ClassVar[Mapping[str, str]] = {"cache-control": "no-cache"}

            def do_POST(self) -> None:
                # A client that gives up (a timeout test): LoopbackHandler.handle ignores it.
                body, step, n = server.take(self)
                if self.path != "/v1/messages":
                    self.send_json(404, error(404, f"no route {self.path}").body or {})
                    return
                if step is None:
                    self.send_json(500, error(500, "the test server's script is empty").body or {})
                    return
                self._answer(step, n, body)

            def _answer(self, step: Step, n: int, body: dict[str, Any]) -> None:
                if step.kind == "slow":
                    server.release.wait(step.delay_secs)
                    assert step.then is not None
                    step = step.then
                streamed = bool(body.get("stream"))
                if step.kind == "error" or (step.kind == "stream_error" and not streamed):
                    self.send_json(step.status, step.body or {}, step.headers)
                elif step.kind == "malformed" and not streamed:
                    self.send_raw(200, step.text.encode())
                elif step.kind == "dropped" and not streamed:
                    data = json.dumps(server.message(step, n, body)).encode()
                    # Promises the whole body (without `request-id`), sends half of it.
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data[: len(data) // 2])
                    self.drop()
                elif streamed:
                    self._stream(step, n, body)
                else:
                    self.send_json(200, server.message(step, n, body))

            def _stream(self, step: Step, n: int, body: dict[str, Any]) -> None:
                self.start_stream()

                def send(event: dict[str, Any]) -> None:
                    self.chunk(sse(json.dumps(event), event=event["type"]))

                usage = step.usage
                start = server.message(step, n, body)
                start.update(content=[], stop_reason=None, stop_sequence=None)
                start["usage"] = {**server.usage(step), "output_tokens": 1}
                send({"type": "message_start", "message": start})
                if step.kind == "malformed":
                    self.chunk(sse(step.text, event="content_block_start"))
                    self.end_stream()
                    return
                index = 0
                if step.text or not step.calls:
                    send(
                        {
                            "type": "content_block_start",
                            "index": 0,
                            "content_block": {"type": "text", "text": ""},
                        }
                    )
                    send({"type": "ping"})
                    for i in range(0, len(step.text), step.chunk):
                        send(
                            {
                                "type": "content_block_delta",
                                "index": 0,
                                "delta": {
                                    "type": "text_delta",
                                    "text": step.text[i : i + step.chunk],
                                },
                            }
                        )
                    if step.kind == "dropped":
                        self.drop()
                        return
                    if step.kind == "truncated":
                        self.end_stream()
                        return
                    if step.kind == "stream_error":
                        send(step.body or {})
                        self.end_stream()
                        return
                    send({"type": "content_block_stop", "index": 0})
                    index = 1
                for i, (name, args) in enumerate(step.calls):
                    send(
                        {
                            "type": "content_block_start",
                            "index": index,
                            "content_block": {
                                "type": "tool_use",
                                "id": f"toolu_{n}_{i}",
                                "name": name,
                                "input": {},
                            },
                        }
                    )
                    raw = args if isinstance(args, str) else json.dumps(args)
                    for j in range(0, len(raw), 10):
                        send(
                            {
                                "type": "content_block_delta",
                                "index": index,
                                "delta": {
                                    "type": "input_json_delta",
                                    "partial_json": raw[j : j + 10],
                                },
                            }
                        )
                    send({"type": "content_block_stop", "index": index})
                    index += 1
                send(
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": server.stop_reason(step), "stop_sequence": None},
                        "usage": {"output_tokens": usage.get("output_tokens", 0)},
                    }
                )
                send({"type": "message_stop"})
                self.end_stream()

        super().__init__(Handler)

    @staticmethod
    def usage(step: Step) -> dict[str, Any]:
        u = step.usage
        return {
            "input_tokens": u.get("input_tokens", 0),
            "output_tokens": u.get("output_tokens", 0),
            "cache_creation_input_tokens": u.get("cache_creation_input_tokens", 0),
            "cache_read_input_tokens": u.get("cache_read_input_tokens", 0),
            "service_tier": "standard",
        }

    @staticmethod
    def stop_reason(step: Step) -> str:
        return step.stop_reason or ("tool_use" if step.calls else "end_turn")

    def message(self, step: Step, n: int, body: dict[str, Any]) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if step.text:
            content.append({"type": "text", "text": step.text})
        for i, (name, args) in enumerate(step.calls):
            content.append(
                {"type": "tool_use", "id": f"toolu_{n}_{i}", "name": name, "input": args}
            )
        return {
            "id": f"msg_test_{n}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "claude-test"),
            "content": content,
            "stop_reason": self.stop_reason(step),
            "stop_sequence": None,
            "usage": self.usage(step),
        }
