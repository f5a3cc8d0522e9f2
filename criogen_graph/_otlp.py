"""OTLP/HTTP export of our spans: a protobuf encoder for the one shape of span we make, and
an exporter for the OpenTelemetry SDK's `BatchSpanProcessor`, which does the batching, the
background thread, flush and shutdown.

Why our own encoder: the SDK's (`encode_spans`) builds a protobuf object per span, per
attribute and per value, and hashes the resource (as JSON) per span: about 35 us per span,
which at four spans per two-turn run was the largest part of what telemetry cost a turn.
This one writes the wire format directly and keeps the encoded bytes of repeated short
attributes (`gen_ai.operation.name = chat`, model and tool names), a few us per span. The
output is the same message (`tests/test_telemetry.py` decodes it with `opentelemetry-proto`
and compares it with the SDK's encoding of the same spans)."""

from __future__ import annotations

import os
import random
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from criogen_graph.redact import package_logger

_log = package_logger("criogen_graph.telemetry")

#: OTLP `SpanKind` values (opentelemetry/proto/trace/v1/trace.proto).
KIND_INTERNAL = 1
KIND_CLIENT = 3
#: `Status.code`: UNSET, OK, ERROR.
STATUS_ERROR = 2
#: `SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK` and `SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK`.
_HAS_IS_REMOTE = 0x100
_IS_REMOTE = 0x200

#: Status codes worth another attempt (the OTLP/HTTP specification's retryable set).
_RETRYABLE = frozenset({408, 429, 502, 503, 504})
_MAX_ATTEMPTS = 6


class Finished:
    """A span as it is queued for export: what the encoder reads."""

    __slots__ = (
        "attributes",
        "context",
        "end",
        "events",
        "kind",
        "name",
        "parent",
        "start",
        "status",
    )

    # `context` is an OpenTelemetry `SpanContext` (the batch processor drops spans
    # whose context is not sampled); `parent` is the parent's, or None for a root.
    context: Any
    parent: Any
    name: str
    kind: int
    start: int
    end: int
    attributes: dict[str, Any]
    #: (name, time in ns, attributes)
    events: list[tuple[str, int, dict[str, Any]]]
    #: (code, message) or None (UNSET)
    status: tuple[int, str] | None


# -- the wire format ------------------------------------------------------------------


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [bytes((i,)) for i in range(0x80)]


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag byte(s), the length, the payload."""
    n = len(payload)
    return tag + (_SMALL[n] if n < 0x80 else _varint(n)) + payload


def _any_value(value: Any) -> bytes:
    """An `AnyValue` message."""
    if value is True or value is False:
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _field(b"\x0a", value.encode())
    if isinstance(value, int):
        # int64: a negative number is its 64-bit two's complement, ten bytes long.
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if isinstance(value, float):
        return b"\x21" + struct.pack("<d", value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if isinstance(value, Sequence):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _any_value(v)) for v in value))
    if isinstance(value, Mapping):
        return _field(
            b"\x32", b"".join(_field(b"\x0a", _key_value(str(k), v)) for k, v in value.items())
        )
    return _field(b"\x0a", str(value).encode())


def _key_value(key: str, value: Any) -> bytes:
    """A `KeyValue` message."""
    return _field(b"\x0a", key.encode()) + _field(b"\x12", _any_value(value))


class Encoder:
    """Encodes batches of `Finished` spans as an `ExportTraceServiceRequest`. One per
    exporter (it is used by the export thread only), holding the encoded resource and
    scope and a bounded cache of encoded short attributes."""

    __slots__ = ("_cache", "_scope_head")

    def __init__(
        self,
        resource: Mapping[str, Any],
        scope_name: str,
        scope_version: str,
        resource_schema_url: str = "",
    ) -> None:
        resource_msg = b"".join(_field(b"\x0a", _key_value(k, v)) for k, v in resource.items())
        scope_msg = _field(b"\x0a", scope_name.encode()) + _field(b"\x12", scope_version.encode())
        # ResourceSpans = resource (1), scope_spans (2), schema_url (3); the spans go in the
        # ScopeSpans, which is written last, so everything before it is fixed.
        self._scope_head = (_field(b"\x0a", resource_msg), _field(b"\x0a", scope_msg))
        if resource_schema_url:
            self._scope_head = (
                self._scope_head[0] + _field(b"\x1a", resource_schema_url.encode()),
                self._scope_head[1],
            )
        self._cache: dict[Any, bytes] = {}

    def _attributes(self, tag: bytes, attributes: Mapping[str, Any]) -> list[bytes]:
        cache = self._cache
        out = []
        for key, value in attributes.items():
            # Only strings and tuples of strings are cached: `1 == True == 1.0` as keys.
            kind = type(value)
            if (kind is str and len(value) <= 256) or kind is tuple:
                ck = (key, value)
                encoded = cache.get(ck)
                if encoded is None:
                    encoded = _field(tag, _key_value(key, value))
                    if len(cache) >= 4096:
                        cache.clear()
                    cache[ck] = encoded
                out.append(encoded)
            else:
                out.append(_field(tag, _key_value(key, value)))
        return out

    def span(self, span: Finished) -> bytes:
        """One `Span` message."""
        context = span.context
        parts = [
            b"\x0a\x10" + context.trace_id.to_bytes(16, "big"),
            b"\x12\x08" + context.span_id.to_bytes(8, "big"),
        ]
        parent = span.parent
        if parent is not None:
            parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
        parts.append(_field(b"\x2a", span.name.encode()))
        parts.append(b"\x30" + _SMALL[span.kind])
        parts.append(b"\x39" + span.start.to_bytes(8, "little"))
        parts.append(b"\x41" + span.end.to_bytes(8, "little"))
        parts.extend(self._attributes(b"\x4a", span.attributes))
        for name, at, attributes in span.events:
            event = [b"\x09" + at.to_bytes(8, "little"), _field(b"\x12", name.encode())]
            event.extend(self._attributes(b"\x1a", attributes))
            parts.append(_field(b"\x5a", b"".join(event)))
        status = span.status
        if status is None:
            parts.append(b"\x7a\x00")
        else:
            code, message = status
            text = _field(b"\x12", message.encode()) if message else b""
            parts.append(_field(b"\x7a", text + b"\x18" + _SMALL[code]))
        flags = _HAS_IS_REMOTE | (_IS_REMOTE if parent is not None and parent.is_remote else 0)
        parts.append(b"\x85\x01" + flags.to_bytes(4, "little"))
        return b"".join(parts)

    def request(self, spans: Sequence[Finished]) -> bytes:
        """An `ExportTraceServiceRequest` holding `spans` (one resource, one scope)."""
        resource, scope = self._scope_head
        scope_spans = scope + b"".join(_field(b"\x12", self.span(s)) for s in spans)
        return _field(b"\x0a", resource + _field(b"\x12", scope_spans))


class OtlpHttpExporter:
    """A `SpanExporter` for the SDK's batch processor: encodes with `Encoder` and posts to
    an OTLP/HTTP endpoint with httpx, retrying what the OTLP specification calls
    retryable (408, 429, 502, 503, 504, connection errors) with exponential backoff and
    jitter, honouring `Retry-After`, within `timeout_secs` per batch."""

    def __init__(
        self,
        endpoint: str,
        headers: Mapping[str, str],
        timeout_secs: float,
        encoder: Encoder,
    ) -> None:
        self.endpoint = endpoint
        self.timeout_secs = timeout_secs
        self.encoder = encoder
        self.headers = {**headers, "content-type": "application/x-protobuf"}
        import httpx  # here: `import criogen_graph` should not pay for it

        self._httpx = httpx
        self._transport_error = httpx.TransportError
        self._client = httpx.Client(timeout=timeout_secs, headers=self.headers)
        self._pid = os.getpid()
        self._stopping = threading.Event()

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        if self._stopping.is_set():
            return SpanExportResult.FAILURE
        try:
            body = self.encoder.request(spans)
        except Exception:
            _log.exception("could not encode %d spans; they are dropped", len(spans))
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS if self._post(body) else SpanExportResult.FAILURE

    def _post(self, body: bytes) -> bool:
        deadline = time.monotonic() + self.timeout_secs
        if os.getpid() != self._pid:
            # A forked worker: the parent's pooled connections are not ours to use (the
            # batch processor starts its thread again after a fork; this is its client).
            self._client = self._httpx.Client(timeout=self.timeout_secs, headers=self.headers)
            self._pid = os.getpid()
        for attempt in range(_MAX_ATTEMPTS):
            retry_after: float | None = None
            try:
                response = self._client.post(self.endpoint, content=body)
            except self._transport_error as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if response.is_success:
                    return True
                problem = f"HTTP {response.status_code}"
                if response.status_code not in _RETRYABLE:
                    _log.error(
                        "the OTLP endpoint %s refused %d bytes of spans (%s); they are dropped",
                        self.endpoint,
                        len(body),
                        problem,
                    )
                    return False
                retry_after = _retry_after(response.headers.get("retry-after"))
            delay = (
                retry_after if retry_after is not None else 2**attempt * random.uniform(0.8, 1.2)
            )
            if (
                attempt + 1 == _MAX_ATTEMPTS
                or time.monotonic() + delay > deadline
                or self._stopping.wait(delay)
            ):
                _log.error(
                    "could not export spans to %s after %d attempts (%s); they are dropped",
                    self.endpoint,
                    attempt + 1,
                    problem,
                )
                return False
            _log.warning("exporting spans to %s failed (%s); retrying", self.endpoint, problem)
        return False  # pragma: no cover - the loop returns

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # nothing is held here: the batch processor holds the queue

    def shutdown(self) -> None:
        self._stopping.set()
        self._client.close()


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            return max(parsedate_to_datetime(value).timestamp() - time.time(), 0.0)
        except (TypeError, ValueError):
            return None
