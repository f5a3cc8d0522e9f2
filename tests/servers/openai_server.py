"""A scripted server on 127.0.0.1 that speaks the OpenAI Chat Completions wire format
(JSON and server-sent events), for testing clients over real HTTP.

Each request takes the next scripted step: `text(...)`, `tool_calls(...)`, `refusal()`,
`error(status, ...)` or `malformed()`; a step can also answer late (`delay`) or cut a
stream part-way (`drop_after`). Every request body, path and headers are recorded.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from tests.servers.base import LoopbackHandler, RecordingServer, sse


@dataclass
class Step:
    kind: str  # "text" | "tool_calls" | "error" | "malformed" | "reset"
    text: str = ""
    calls: list[tuple[str, Any]] = field(default_factory=list)  # args: dict, or raw JSON text
    status: int = 200
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    usage: dict[str, int] = field(
        default_factory=lambda: {"prompt_tokens": 11, "completion_tokens": 7}
    )
    finish_reason: str | None = None
    refusal: str | None = None
    #: Wait this long (or until the server's `release` is set) before answering.
    delay: float = 0
    #: Streamed: close the connection after this many text chunks.
    drop_after: int | None = None
    #: The ids of the calls (None: the call has no id), instead of `call_<n>_<i>`; some
    #: OpenAI-compatible servers repeat ids, or send none.
    ids: list[str | None] | None = None

    def call_id(self, n: int, i: int) -> dict[str, Any]:
        """The `id` field of call `i` of request `n` (empty when the step gives it none)."""
        if self.ids is None:
            return {"id": f"call_{n}_{i}"}
        given = self.ids[i]
        return {} if given is None else {"id": given}


def text(t: str, **kw: Any) -> Step:
    return Step("text", text=t, **kw)


def tool_calls(*calls: tuple[str, Any], text: str = "", **kw: Any) -> Step:
    return Step("tool_calls", text=text, calls=list(calls), **kw)


def refusal(message: str = "I can't help with that.") -> Step:
    return Step("text", refusal=message)


def malformed() -> Step:
    return Step("malformed")


def reset() -> Step:
    """Close the connection without answering."""
    return Step("reset")


def error(
    status: int, message: str = "error", *, headers: dict[str, str] | None = None, **kw: Any
) -> Step:
    return Step(
        "error",
        status=status,
        body={"error": {"message": message, "type": "server_error", "code": None}},
        headers=headers or {},
        **kw,
    )


def _args(args: Any) -> str:
    return args if isinstance(args, str) else json.dumps(args)


class OpenAIServer(RecordingServer[Step]):
    """Start with `with OpenAIServer() as srv:`; point a client at `srv.base_url`."""

    base_path = "/v1"

    def __init__(self) -> None:
        server = self

        class Handler(LoopbackHandler):
            def do_POST(self) -> None:
                body, step, n = server.take(self)
                if step is None:
                    self.send_json(500, {"error": {"message": "the test server's script is empty"}})
                    return
                if step.delay:
                    server.release.wait(step.delay)
                if step.kind == "error":
                    self.send_json(step.status, step.body or {}, step.headers)
                elif step.kind == "reset":
                    self.drop()
                elif step.kind == "malformed":
                    self.send_raw(200, b'{"id": "chatcmpl-x", "choices": [{"message": ')
                elif body.get("stream"):
                    self._stream(step, n, body)
                else:
                    self.send_json(200, server.completion(step, n, body))

            def _stream(self, step: Step, n: int, body: dict[str, Any]) -> None:
                self.start_stream()

                def send(data: str) -> None:
                    self.chunk(sse(data))

                def event(**fields: Any) -> None:
                    send(
                        json.dumps(
                            {
                                "id": f"chatcmpl-{n}",
                                "object": "chat.completion.chunk",
                                "created": int(time.time()),
                                "model": body.get("model", "m"),
                                **fields,
                            }
                        )
                    )

                def chunk(delta: dict[str, Any], finish: str | None = None) -> None:
                    event(choices=[{"index": 0, "delta": delta, "finish_reason": finish}])

                chunk({"role": "assistant", "content": ""})
                for k, i in enumerate(range(0, len(step.text), 8)):
                    if step.drop_after is not None and k >= step.drop_after:
                        # Cut the connection mid-stream, without the last chunk.
                        self.drop()
                        return
                    chunk({"content": step.text[i : i + 8]})
                if step.refusal:
                    chunk({"refusal": step.refusal})
                for idx, (name, args) in enumerate(step.calls):
                    start = {"index": idx, **step.call_id(n, idx), "type": "function"}
                    chunk({"tool_calls": [{**start, "function": {"name": name, "arguments": ""}}]})
                    raw = _args(args)
                    for j in range(0, len(raw), 10):
                        piece = {"index": idx, "function": {"arguments": raw[j : j + 10]}}
                        chunk({"tool_calls": [piece]})
                chunk({}, step.finish_reason or ("tool_calls" if step.calls else "stop"))
                if (body.get("stream_options") or {}).get("include_usage"):
                    event(choices=[], usage=server.usage(step))
                send("[DONE]")
                self.end_stream()

        super().__init__(Handler)

    @staticmethod
    def usage(step: Step) -> dict[str, Any]:
        u = step.usage
        return {
            "prompt_tokens": u.get("prompt_tokens", 0),
            "completion_tokens": u.get("completion_tokens", 0),
            "total_tokens": u.get("prompt_tokens", 0) + u.get("completion_tokens", 0),
            "prompt_tokens_details": {"cached_tokens": u.get("cached_tokens", 0)},
            "completion_tokens_details": {"reasoning_tokens": u.get("reasoning_tokens", 0)},
        }

    def completion(self, step: Step, n: int, body: dict[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": step.text or None}
        if step.refusal:
            message["refusal"] = step.refusal
        if step.calls:
            message["tool_calls"] = [
                {
                    **step.call_id(n, i),
                    "type": "function",
                    "function": {"name": name, "arguments": _args(args)},
                }
                for i, (name, args) in enumerate(step.calls)
            ]
        return {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "m"),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": step.finish_reason or ("tool_calls" if step.calls else "stop"),
                }
            ],
            "usage": self.usage(step),
        }
