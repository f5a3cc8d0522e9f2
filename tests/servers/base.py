"""What the scripted loopback servers share: an HTTP server on 127.0.0.1 (an ephemeral
port, a daemon thread), a script of steps taken one per request, a `release` event that
cuts delayed answers short, and a request handler that writes JSON, raw bodies and chunked
server-sent events, or drops the connection part-way.

A provider's server subclasses `LoopbackServer` (or `RecordingServer`, which also records
each request's JSON body, headers and path) and passes its `LoopbackHandler` subclass,
which speaks the provider's wire format with these helpers.
"""

from __future__ import annotations

import json
import socket
import threading
from collections import deque
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, Generic, Self, TypeVar

StepT = TypeVar("StepT")


def sse(data: str, *, event: str | None = None, newline: str = "\n") -> bytes:
    """One server-sent event: an optional `event:` line, a `data:` line, a blank line."""
    head = f"event: {event}{newline}" if event is not None else ""
    return f"{head}data: {data}{newline}{newline}".encode()


class LoopbackHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 (keep-alive), silent, and quiet when the client goes away."""

    protocol_version = "HTTP/1.1"
    #: The type of JSON and raw bodies.
    content_type: ClassVar[str] = "application/json"
    #: Sent with every JSON or raw body, before the step's own headers.
    body_headers: ClassVar[Mapping[str, str]] = {}
    #: Sent with every event stream, between its content type and `transfer-encoding`.
    stream_headers: ClassVar[Mapping[str, str]] = {}

    def log_message(self, *args: Any) -> None:
        pass

    def handle(self) -> None:
        try:
            super().handle()
        except OSError:
            pass  # the client went away (a timeout, a dropped stream)

    def read_body(self) -> bytes:
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length)

    def header_dict(self) -> dict[str, str]:
        """The request's headers, names in lower case."""
        return {k.lower(): v for k, v in self.headers.items()}

    def send_raw(self, status: int, data: bytes, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("content-type", self.content_type)
        self.send_header("content-length", str(len(data)))
        for k, v in self.body_headers.items():
            self.send_header(k, v)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def send_json(
        self, status: int, payload: Any, headers: Mapping[str, str] | None = None
    ) -> None:
        self.send_raw(status, json.dumps(payload).encode(), headers)

    def start_stream(self) -> None:
        """A 200 event stream in chunked transfer encoding; then `chunk`s and `end_stream`."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        for k, v in self.stream_headers.items():
            self.send_header(k, v)
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

    def chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def end_stream(self) -> None:
        """The last, empty chunk: the body ends cleanly."""
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def drop(self) -> None:
        """Close the connection now, whatever the body still owes."""
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)
        self.close_connection = True


class LoopbackServer(Generic[StepT]):
    """Start with `with Server() as srv:`; `srv.add(*steps)` scripts the answers."""

    #: Appended to `http://127.0.0.1:{port}` to make `base_url`.
    base_path: ClassVar[str] = ""

    def __init__(self, handler: type[LoopbackHandler]) -> None:
        self.script: deque[StepT] = deque()
        #: Set when the server stops; a delayed answer waits for it (or its delay).
        self.release = threading.Event()
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}{self.base_path}"
        # A short poll interval: shutdown() waits up to one interval.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def next_step(self) -> StepT | None:
        with self._lock:
            return self.script.popleft() if self.script else None

    def add(self, *steps: StepT) -> Self:
        with self._lock:
            self.script.extend(steps)
        return self

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release.set()
        self._httpd.shutdown()
        self._httpd.server_close()


class RecordingServer(LoopbackServer[StepT]):
    """Also records each request's JSON body, headers and path (`requests`, `headers`,
    `paths`, index for index) and numbers the requests from 1."""

    def __init__(self, handler: type[LoopbackHandler]) -> None:
        super().__init__(handler)
        self.requests: list[dict[str, Any]] = []
        #: Each request's body as it arrived (to check it is strict JSON).
        self.raw: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        self._counter = 0

    def take(self, request: LoopbackHandler) -> tuple[Any, StepT | None, int]:
        """Read and record a request; its body, the next step (None when the script is
        empty) and the request's number."""
        raw = request.read_body() or b"{}"
        body = json.loads(raw)
        with self._lock:
            self.raw.append(raw)
            self.requests.append(body)
            self.paths.append(request.path)
            self.headers.append(request.header_dict())
            step = self.script.popleft() if self.script else None
            self._counter += 1
            return body, step, self._counter
