"""OTLP/HTTP export of our spans: a protobuf encoder for the one shape of span we make, and
an exporter for the OpenTelemetry SDK's `BatchSpanProcessor`, which does the batching, the
background thread, flush and shutdown.

Why our own encoder: the SDK's (`encode_spans`) builds a protobuf object per span, per
attribute and per value, and hashes the resource (as JSON) per span: about 35 us per span,
which at four spans per two-turn run was the largest part of what telemetry cost a turn.
This one writes the wire format directly and keeps the encoded bytes of repeated short
attributes (`gen_ai.operation.name = chat`, model and tool names), a few us per span. The
output is the same message (`tests/test_telemetry.py` decodes it with `opentelemetry-proto`
and compares it with the SDK's encoding of the same spans). It is used only by the tracer
provider that `Telemetry.otlp` makes, whose spans all have one resource and one scope."""

from __future__ import annotations

import os
import random
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from criogen_graph._retry_after import retry_after_from_headers
from criogen_graph._urls import mask_url
from criogen_graph.redact import package_logger

_log = package_logger("criogen_graph.telemetry")

#: `SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK` and `SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK`.
_HAS_IS_REMOTE = 0x100
_IS_REMOTE = 0x200

#: Status codes worth another attempt (the OTLP/HTTP specification's retryable set).
_RETRYABLE = frozenset({408, 429, 502, 503, 504})
_MAX_ATTEMPTS = 6


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
    """Encodes batches of the SDK's finished spans (of our tracer provider: one resource, one
    scope) as an `ExportTraceServiceRequest`. One per
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

    def span(self, span: Any) -> bytes:
        """One `Span` message from the SDK's `ReadableSpan`."""
        context = span.context
        parts = [
            b"\x0a\x10" + context.trace_id.to_bytes(16, "big"),
            b"\x12\x08" + context.span_id.to_bytes(8, "big"),
        ]
        state = context.trace_state
        if state:
            parts.append(_field(b"\x1a", state.to_header().encode()))
        parent = span.parent
        if parent is not None:
            parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
        parts.append(_field(b"\x2a", span.name.encode()))
        # OTLP's SpanKind counts from UNSPECIFIED = 0; the API's from INTERNAL = 0.
        parts.append(b"\x30" + _SMALL[span.kind.value + 1])
        parts.append(b"\x39" + span.start_time.to_bytes(8, "little"))
        parts.append(b"\x41" + span.end_time.to_bytes(8, "little"))
        parts.extend(self._attributes(b"\x4a", span.attributes))
        if span.dropped_attributes:
            parts.append(b"\x50" + _varint(span.dropped_attributes))
        for event in span.events:
            encoded = [
                b"\x09" + event.timestamp.to_bytes(8, "little"),
                _field(b"\x12", event.name.encode()),
            ]
            encoded.extend(self._attributes(b"\x1a", event.attributes))
            parts.append(_field(b"\x5a", b"".join(encoded)))
        if span.dropped_events:
            parts.append(b"\x60" + _varint(span.dropped_events))
        status = span.status
        code = status.status_code.value
        if code == 0 and not status.description:
            parts.append(b"\x7a\x00")
        else:
            message = status.description
            text = _field(b"\x12", message.encode()) if message else b""
            parts.append(_field(b"\x7a", text + (b"\x18" + _SMALL[code] if code else b"")))
        flags = _HAS_IS_REMOTE | (_IS_REMOTE if parent is not None and parent.is_remote else 0)
        parts.append(b"\x85\x01" + flags.to_bytes(4, "little"))
        return b"".join(parts)

    def request(self, spans: Sequence[Any]) -> bytes:
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
        self._shown = mask_url(endpoint)  # what logs show: no credentials
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
                        self._shown,
                        len(body),
                        problem,
                    )
                    return False
                retry_after = retry_after_from_headers(response.headers)
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
                    self._shown,
                    attempt + 1,
                    problem,
                )
                return False
            _log.warning("exporting spans to %s failed (%s); retrying", self._shown, problem)
        return False  # pragma: no cover - the loop returns

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # nothing is held here: the batch processor holds the queue

    def shutdown(self) -> None:
        self._stopping.set()
        self._client.close()


# -- a light tracer provider for `Telemetry.otlp` --------------------------------------


class _Event:
    __slots__ = ("attributes", "name", "timestamp")

    def __init__(self, name: str, attributes: dict[str, Any], timestamp: int) -> None:
        self.name = name
        self.attributes = attributes
        self.timestamp = timestamp


def _value(key: str, value: Any) -> Any:
    """An attribute value as OpenTelemetry allows it (what the SDK's spans keep)."""
    kind = type(value)
    if kind is str or kind is bool or kind is int or kind is float or value is None:
        return value
    if isinstance(value, list | tuple):
        # The API allows homogeneous arrays of primitives; anything else becomes text.
        return tuple(v if isinstance(v, str | bool | int | float) else str(v) for v in value)
    return str(value)


def _attributes(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """`attributes` as OpenTelemetry allows them (see `_value`), the `None` ones left out."""
    clean = {}
    for key, value in (attributes or {}).items():
        value = _value(key, value)
        if value is not None:
            clean[key] = value
    return clean


def _make_light_classes() -> tuple[type, type, type]:
    """The provider, tracer and span classes, made on first use: they subclass the
    OpenTelemetry API's, which `import criogen_graph` should not load (nor the SDK, whose
    processor and sampler they run with)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import Tracer as SdkTracer
    from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
    from opentelemetry.trace.status import Status, StatusCode

    sampled_flags = TraceFlags(TraceFlags.SAMPLED)
    unsampled_flags = TraceFlags(TraceFlags.DEFAULT)
    unset = Status(StatusCode.UNSET)
    get_current_span = trace.get_current_span

    class LightSpan(trace.Span):
        """A recording span of `LightTracer`: plain attributes, queued as it is when it
        ends (what the batch processor and our encoder read of a `ReadableSpan`)."""

        __slots__ = (
            "_processor",
            "attributes",
            "context",
            "end_time",
            "events",
            "kind",
            "name",
            "parent",
            "start_time",
            "status",
        )

        dropped_attributes = 0
        dropped_events = 0
        dropped_links = 0

        def __init__(
            self,
            name: str,
            context: SpanContext,
            parent: SpanContext | None,
            kind: SpanKind,
            attributes: dict[str, Any],
            start_time: int,
            processor: Any,
        ) -> None:
            self.name = name
            self.context = context
            self.parent = parent
            self.kind = kind
            self.attributes = attributes
            self.events: list[_Event] = []
            self.status = unset
            self.start_time = start_time
            self.end_time: int | None = None
            self._processor = processor

        def get_span_context(self) -> SpanContext:
            return self.context

        def is_recording(self) -> bool:
            return self.end_time is None

        def set_attributes(self, attributes: Mapping[str, Any]) -> None:
            if self.end_time is None:
                self.attributes.update(_attributes(attributes))

        def set_attribute(self, key: str, value: Any) -> None:
            self.set_attributes({key: value})

        def add_event(
            self,
            name: str,
            attributes: Mapping[str, Any] | None = None,
            timestamp: int | None = None,
        ) -> None:
            if self.end_time is None:
                clean = _attributes(attributes)
                self.events.append(_Event(name, clean, timestamp or time.time_ns()))

        def add_link(self, context: Any, attributes: Any = None) -> None:
            pass  # links are not exported by this provider

        def update_name(self, name: str) -> None:
            if self.end_time is None:
                self.name = name

        def set_status(self, status: Any, description: str | None = None) -> None:
            if self.end_time is not None or self.status.status_code is StatusCode.OK:
                return
            if isinstance(status, Status):
                self.status = status
            else:
                self.status = Status(status, description)

        def record_exception(
            self,
            exception: BaseException,
            attributes: Any = None,
            timestamp: int | None = None,
            escaped: bool = False,
        ) -> None:
            # The type only: a message can hold what the redaction policy would remove.
            self.add_event(
                "exception",
                {"exception.type": type(exception).__name__, **(attributes or {})},
                timestamp,
            )

        def end(self, end_time: int | None = None) -> None:
            if self.end_time is None:
                self.end_time = end_time or time.time_ns()
                self._processor.on_end(self)

    class LightTracer(trace.Tracer):
        """Spans with the parent and sampling the API prescribes (the current span, the
        provider's sampler), recorded as `LightSpan`s."""

        def __init__(self, provider: Any) -> None:
            self._sampler = provider.sampler
            self._processor = provider.processor

        def start_span(
            self,
            name: str,
            context: Any = None,
            kind: SpanKind = SpanKind.INTERNAL,
            attributes: Any = None,
            links: Any = None,
            start_time: int | None = None,
            record_exception: bool = True,
            set_status_on_exception: bool = True,
        ) -> trace.Span:
            parent: SpanContext | None = get_current_span(context).get_span_context()
            if parent is not None and parent.is_valid:
                trace_id = parent.trace_id
            else:
                parent = None
                trace_id = random.getrandbits(128)
            result = self._sampler.should_sample(context, trace_id, name, kind, attributes, links)
            recorded = result.decision.is_recording()
            span_context = SpanContext(
                trace_id,
                random.getrandbits(64),
                False,
                sampled_flags if result.decision.is_sampled() else unsampled_flags,
                result.trace_state,
            )
            if not recorded:
                return NonRecordingSpan(span_context)
            return LightSpan(
                name,
                span_context,
                parent,
                kind,
                _attributes(result.attributes),
                start_time or time.time_ns(),
                self._processor,
            )

        # The SDK's: `start_span` (this class's), then `use_span`.
        start_as_current_span = SdkTracer.start_as_current_span

    class LightProvider(trace.TracerProvider):
        """A tracer provider of the OpenTelemetry API whose spans go to one span
        processor (the SDK's batch processor feeding our exporter). The SDK's own spans
        validate and lock every attribute on every call, which cost several times a
        whole agent turn's bookkeeping."""

        def __init__(self, processor: Any, sampler: Any) -> None:
            self.processor = processor
            self.sampler = sampler
            self._tracer = LightTracer(self)

        def get_tracer(
            self,
            instrumenting_module_name: str,
            instrumenting_library_version: str | None = None,
            schema_url: str | None = None,
            attributes: Any = None,
        ) -> trace.Tracer:
            return self._tracer

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return bool(self.processor.force_flush(timeout_millis))

        def shutdown(self) -> None:
            self.processor.shutdown()

    return LightProvider, LightTracer, LightSpan


_LIGHT: tuple[type, type, type] | None = None


def light_provider(processor: Any, sampler: Any) -> Any:
    """A `LightProvider` (see `_make_light_classes`) sending spans to `processor`."""
    global _LIGHT
    if _LIGHT is None:
        _LIGHT = _make_light_classes()
    return _LIGHT[0](processor, sampler)
