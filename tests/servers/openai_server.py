"""A scripted server on 127.0.0.1 that speaks the OpenAI Chat Completions wire format
(JSON and server-sent events), for testing clients over real HTTP.

Each request takes the next scripted step: `text(...)`, `tool_calls(...)`, `refusal()`,
`error(status, ...)` or `malformed()`; a step can also answer late (`delay`) or cut a
stream part-way (`drop_after`). Every request body, path and headers are recorded.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Step:
    kind: str  # "text" | "tool_calls" | "error" | "malformed"
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


def text(t: str, **kw: Any) -> Step:
    return Step("text", text=t, **kw)


def tool_calls(*calls: tuple[str, Any], text: str = "", **kw: Any) -> Step:
    return Step("tool_calls", text=text, calls=list(calls), **kw)


def refusal(message: str = "I can't help with that.") -> Step:
    return Step("text", refusal=message)


def malformed() -> Step:
    return Step("malformed")


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


class OpenAIServer:
    """Start with `with OpenAIServer() as srv:`; point a client at `srv.base_url`."""

    def __init__(self) -> None:
        self.script: deque[Step] = deque()
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        self.release = threading.Event()
        self._lock = threading.Lock()
        self._counter = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with server._lock:
                    server.requests.append(body)
                    server.paths.append(self.path)
                    server.headers.append({k.lower(): v for k, v in self.headers.items()})
                    step = server.script.popleft() if server.script else None
                    server._counter += 1
                    n = server._counter
                if step is None:
                    self._send(500, {"error": {"message": "the test server's script is empty"}})
                    return
                if step.delay:
                    server.release.wait(step.delay)
                if step.kind == "error":
                    self._send(step.status, step.body or {}, step.headers)
                elif step.kind == "malformed":
                    self._raw(200, b'{"id": "chatcmpl-x", "choices": [{"message": ')
                elif body.get("stream"):
                    self._stream(step, n, body)
                else:
                    self._send(200, server.completion(step, n, body))

            def _raw(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _send(
                self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
            ) -> None:
                self._raw(status, json.dumps(payload).encode(), headers)

            def _stream(self, step: Step, n: int, body: dict[str, Any]) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()

                def send(data: str) -> None:
                    raw = f"data: {data}\n\n".encode()
                    self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
                    self.wfile.flush()

                def chunk(delta: dict[str, Any], finish: str | None = None) -> None:
                    send(
                        json.dumps(
                            {
                                "id": f"chatcmpl-{n}",
                                "object": "chat.completion.chunk",
                                "created": int(time.time()),
                                "model": body.get("model", "m"),
                                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                            }
                        )
                    )

                chunk({"role": "assistant", "content": ""})
                for k, i in enumerate(range(0, len(step.text), 8)):
                    if step.drop_after is not None and k >= step.drop_after:
                        # Cut the connection mid-stream, without the last chunk.
                        self.connection.shutdown(2)
                        return
                    chunk({"content": step.text[i : i + 8]})
                if step.refusal:
                    chunk({"refusal": step.refusal})
                for idx, (name, args) in enumerate(step.calls):
                    start = {"index": idx, "id": f"call_{n}_{idx}", "type": "function"}
                    chunk({"tool_calls": [{**start, "function": {"name": name, "arguments": ""}}]})
                    raw = _args(args)
                    for j in range(0, len(raw), 10):
                        piece = {"index": idx, "function": {"arguments": raw[j : j + 10]}}
                        chunk({"tool_calls": [piece]})
                chunk({}, step.finish_reason or ("tool_calls" if step.calls else "stop"))
                if (body.get("stream_options") or {}).get("include_usage"):
                    send(
                        json.dumps(
                            {
                                "id": f"chatcmpl-{n}",
                                "object": "chat.completion.chunk",
                                "created": int(time.time()),
                                "model": body.get("model", "m"),
                                "choices": [],
                                "usage": server.usage(step),
                            }
                        )
                    )
                send("[DONE]")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

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
                    "id": f"call_{n}_{i}",
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

    def add(self, *steps: Step) -> OpenAIServer:
        with self._lock:
            self.script.extend(steps)
        return self

    def __enter__(self) -> OpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release.set()
        self._httpd.shutdown()
        self._httpd.server_close()
