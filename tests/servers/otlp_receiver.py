"""An OTLP/HTTP trace receiver on 127.0.0.1 for tests: decodes the protobuf bodies
(`opentelemetry-proto`) into plain span records, and records paths and headers."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class SpanRecord:
    name: str
    span_id: str
    parent_id: str
    trace_id: str
    kind: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    status_code: int = 0
    status_message: str = ""


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def _attrs(items: Any) -> dict[str, Any]:
    return {a.key: _value(a.value) for a in items}


class OtlpReceiver:
    """`with OtlpReceiver() as rx:` then export to `rx.url`; `rx.spans` has what arrived."""

    def __init__(self) -> None:
        self.spans: list[SpanRecord] = []
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []
        self.resources: list[dict[str, Any]] = []
        #: Exporters pointed here, for the test to shut down (`Telemetry` objects).
        self.users: list[Any] = []
        #: Answers to give before accepting again: (status, headers) per request, in order.
        self.refuse: list[tuple[int, dict[str, str]]] = []
        #: Every request's status as answered.
        self.answered: list[int] = []
        #: The raw bodies accepted.
        self.bodies: list[bytes] = []
        #: The client's (host, port) of every request, in order: which connection it used.
        self.peers: list[tuple[str, int]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with receiver._lock:
                    receiver.peers.append(self.client_address[:2])
                    refusal = receiver.refuse.pop(0) if receiver.refuse else None
                    receiver.answered.append(refusal[0] if refusal else 200)
                if refusal is not None:
                    self.send_response(refusal[0])
                    for name, value in refusal[1].items():
                        self.send_header(name, value)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                records = []
                for rs in request.resource_spans:
                    receiver.resources.append(_attrs(rs.resource.attributes))
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            records.append(
                                SpanRecord(
                                    name=s.name,
                                    span_id=s.span_id.hex(),
                                    parent_id=s.parent_span_id.hex(),
                                    trace_id=s.trace_id.hex(),
                                    kind=s.kind,
                                    attributes=_attrs(s.attributes),
                                    events=[(e.name, _attrs(e.attributes)) for e in s.events],
                                    status_code=s.status.code,
                                    status_message=s.status.message,
                                )
                            )
                with receiver._lock:
                    receiver.spans.extend(records)
                    receiver.bodies.append(body)
                    receiver.paths.append(self.path)
                    receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
                data = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def named(self, prefix: str) -> list[SpanRecord]:
        return [s for s in self.spans if s.name.startswith(prefix)]

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
