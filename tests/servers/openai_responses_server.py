"""A scripted server on 127.0.0.1 that speaks OpenAI's Responses API (`POST /v1/responses`,
a JSON response object, or server-sent events when the body asks to stream), for testing
clients over real HTTP.

Each request takes the next scripted step. A step is a final response object (built with
`text(...)`, `calls(...)`, `incomplete(...)`, `failed(...)`, or read from a recorded
fixture with `fixture(...)`): answered as JSON, or streamed as the events OpenAI sends for
it (`response.created`, per item `output_item.added`, its deltas, `output_item.done`, then
`response.completed` / `incomplete` / `failed`). `error(...)` answers an HTTP error,
`stream_error(...)` an `error` event part-way through a stream, `malformed(...)` a body
that is not what it should be; `drop_after` cuts a stream after that many events.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.servers.base import LoopbackHandler, RecordingServer, sse

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "openai_responses"


@dataclass
class Step:
    kind: str  # "response" | "raw" | "error" | "stream_error" | "malformed" | "reset"
    response: dict[str, Any] = field(default_factory=dict)
    #: For "raw": the body as recorded; streamed (SSE) or not.
    raw: bytes = b""
    raw_stream: bool = False
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0
    drop_after: int | None = None
    #: For "stream_error": the data of the `error` event.
    error: dict[str, Any] | None = None


def usage(
    input_tokens: int = 11, output_tokens: int = 7, cached: int = 0, reasoning: int = 0
) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": input_tokens + output_tokens,
    }


def message_item(text: str, *, refusal: str | None = None, n: int = 0) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if text:
        content.append({"type": "output_text", "annotations": [], "logprobs": [], "text": text})
    if refusal:
        content.append({"type": "refusal", "refusal": refusal})
    return {
        "id": f"msg_{n:04d}",
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": content,
    }


def reasoning_item(
    rid: str, summary: list[str] | None = None, encrypted: str | None = "gAAAAenc"
) -> dict[str, Any]:
    item: dict[str, Any] = {
        "id": rid,
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": s} for s in summary or []],
    }
    if encrypted is not None:
        item["encrypted_content"] = encrypted
    return item


def call_item(name: str, args: Any, call_id: str, n: int = 0) -> dict[str, Any]:
    return {
        "id": f"fc_{n:04d}",
        "type": "function_call",
        "status": "completed",
        "call_id": call_id,
        "name": name,
        "arguments": args if isinstance(args, str) else json.dumps(args),
    }


def response(
    output: list[dict[str, Any]],
    *,
    status: str = "completed",
    use: dict[str, Any] | None = None,
    incomplete_reason: str | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": "resp_test",
        "object": "response",
        "created_at": 1759064126,
        "status": status,
        "error": error,
        "incomplete_details": (
            {"reason": incomplete_reason} if incomplete_reason is not None else None
        ),
        "model": "gpt-test",
        "output": output,
        "store": False,
        "usage": use if use is not None else usage(),
    }


def text(t: str, *, reasoning: list[dict[str, Any]] | None = None, **kw: Any) -> Step:
    return Step("response", response([*(reasoning or []), message_item(t)], **kw))


def calls(
    *named: tuple[str, Any],
    text: str = "",
    reasoning: list[dict[str, Any]] | None = None,
    ids: list[str] | None = None,
    **kw: Any,
) -> Step:
    items: list[dict[str, Any]] = list(reasoning or [])
    if text:
        items.append(message_item(text))
    for i, (name, args) in enumerate(named):
        call_id = ids[i] if ids is not None else f"call_{i}_{name}"
        items.append(call_item(name, args, call_id, i))
    return Step("response", response(items, **kw))


def refusal(message: str = "I can't help with that.") -> Step:
    return Step("response", response([message_item("", refusal=message)]))


def incomplete(
    reason: str, t: str = "", *, reasoning: list[dict[str, Any]] | None = None, **kw: Any
) -> Step:
    items = [*(reasoning or []), *([message_item(t)] if t else [])]
    return Step("response", response(items, status="incomplete", incomplete_reason=reason, **kw))


def failed(code: str, message: str = "failed") -> Step:
    return Step("response", response([], status="failed", error={"code": code, "message": message}))


def error(
    status: int,
    message: str = "error",
    *,
    code: str | None = None,
    kind: str = "server_error",
    headers: dict[str, str] | None = None,
) -> Step:
    return Step(
        "error",
        status=status,
        body={"error": {"message": message, "type": kind, "param": None, "code": code}},
        headers=headers or {},
    )


def stream_error(code: str | None, message: str) -> Step:
    return Step("stream_error", error={"code": code, "message": message, "param": None})


def malformed(body: Any) -> Step:
    """A 200 answer with this body (bytes as they are, anything else as JSON)."""
    return Step("malformed", body=body)


def fixture(name: str) -> Step:
    data = (FIXTURES / name).read_bytes()
    return Step("raw", raw=data, raw_stream=name.endswith(".sse"))


def _chunks(s: str, size: int) -> list[str]:
    return [s[i : i + size] for i in range(0, len(s), size)]


def stream_events(final: dict[str, Any]) -> list[dict[str, Any]]:
    """The events OpenAI streams for a final response object."""
    seq = iter(range(10_000))
    events: list[dict[str, Any]] = []

    def add(kind: str, **fields: Any) -> None:
        events.append({"type": kind, "sequence_number": next(seq), **fields})

    start = {**final, "status": "in_progress", "output": [], "usage": None}
    add("response.created", response=start)
    add("response.in_progress", response=start)
    for index, item in enumerate(final.get("output") or []):
        kind = item.get("type")
        if kind == "message":
            add("response.output_item.added", output_index=index, item={**item, "content": []})
            for ci, part in enumerate(item.get("content") or []):
                if part.get("type") == "output_text":
                    for piece in _chunks(part["text"], 8):
                        add(
                            "response.output_text.delta",
                            item_id=item["id"],
                            output_index=index,
                            content_index=ci,
                            delta=piece,
                            logprobs=[],
                        )
                    add(
                        "response.output_text.done",
                        item_id=item["id"],
                        output_index=index,
                        content_index=ci,
                        text=part["text"],
                    )
                elif part.get("type") == "refusal":
                    add(
                        "response.refusal.delta",
                        item_id=item["id"],
                        output_index=index,
                        content_index=ci,
                        delta=part["refusal"],
                    )
        elif kind == "function_call":
            add(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            for piece in _chunks(item["arguments"], 10):
                add(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=index,
                    delta=piece,
                )
            add(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                arguments=item["arguments"],
            )
        elif kind == "reasoning":
            add("response.output_item.added", output_index=index, item={**item, "summary": []})
            for si, part in enumerate(item.get("summary") or []):
                add(
                    "response.reasoning_summary_part.added",
                    item_id=item["id"],
                    output_index=index,
                    summary_index=si,
                    part={"type": "summary_text", "text": ""},
                )
                for piece in _chunks(part["text"], 8):
                    add(
                        "response.reasoning_summary_text.delta",
                        item_id=item["id"],
                        output_index=index,
                        summary_index=si,
                        delta=piece,
                    )
        else:
            add("response.output_item.added", output_index=index, item=item)
        add("response.output_item.done", output_index=index, item=item)
    status = final.get("status")
    last = {"failed": "response.failed", "incomplete": "response.incomplete"}.get(
        str(status), "response.completed"
    )
    add(last, response=final)
    return events


class ResponsesServer(RecordingServer[Step]):
    """Start with `with ResponsesServer() as srv:`; point a client at `srv.base_url`."""

    base_path = "/v1"

    def __init__(self) -> None:
        server = self

        class Handler(LoopbackHandler):
            def do_POST(self) -> None:
                body, step, _ = server.take(self)
                if self.path != "/v1/responses":
                    self.send_json(404, {"error": {"message": f"no route {self.path}"}})
                    return
                if step is None:
                    self.send_json(500, {"error": {"message": "the test server's script is empty"}})
                    return
                if step.delay:
                    server.release.wait(step.delay)
                stream = bool(body.get("stream"))
                if step.kind == "error":
                    self.send_json(step.status, step.body, step.headers)
                elif step.kind == "reset":
                    self.drop()
                elif step.kind == "malformed":
                    data = step.body if isinstance(step.body, bytes) else json.dumps(step.body)
                    self.send_raw(200, data if isinstance(data, bytes) else data.encode())
                elif step.kind == "raw":
                    assert stream == step.raw_stream, "the fixture does not match the request"
                    if stream:
                        self.start_stream()
                        self.chunk(step.raw)
                        self.end_stream()
                    else:
                        self.send_raw(200, step.raw)
                elif step.kind == "stream_error":
                    self.start_stream()
                    event = {"type": "error", "sequence_number": 0, **(step.error or {})}
                    self.chunk(sse(json.dumps(event), event="error"))
                    self.end_stream()
                elif stream:
                    self.start_stream()
                    for k, event in enumerate(stream_events(step.response)):
                        if step.drop_after is not None and k >= step.drop_after:
                            self.drop()
                            return
                        self.chunk(sse(json.dumps(event), event=event["type"]))
                    self.end_stream()
                else:
                    self.send_json(200, step.response)

        super().__init__(Handler)
