"""`Telemetry`: OpenTelemetry spans for runs, model calls and tool calls, exported over
OTLP/HTTP (extra `otel`). Spans follow the OpenTelemetry GenAI semantic conventions."""

from __future__ import annotations

import base64
import json
import os
import random
import time
from collections.abc import Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from criogen_graph._otlp import KIND_CLIENT, KIND_INTERNAL, STATUS_ERROR, Finished
from criogen_graph.errors import ValidationError
from criogen_graph.redact import CURRENT

if TYPE_CHECKING:
    from criogen_graph.redact import Redactor

__all__ = ["Telemetry"]

LANGFUSE_HOST = "https://cloud.langfuse.com"


class Telemetry:
    """Exports every run of an agent as OpenTelemetry spans over OTLP/HTTP.

    Build it with `Telemetry.otlp(url)` (any OTLP/HTTP collector; `url` is its base, e.g.
    `http://localhost:4318`, or the full `.../v1/traces`) or `Telemetry.langfuse()`, and
    pass it as `Agent(telemetry=...)`. Spans: `invoke_agent <agent>` per run segment
    (thread, run id, actor, action, outcome), `chat <model>` per model call (GenAI
    attributes: operation, provider, request/response model, token usage, finish
    reasons; retries and fallbacks as events), `execute_tool <tool>` per tool call (name,
    call id, status); approval requests and decisions are events of the run span, and an
    agent used as a tool nests its spans under the calling tool's span. Message content
    (prompts, answers, tool arguments and results) is exported only with `content=True`.
    The agent's `Redactor` applies to every exported string. Spans go out in batches from
    a background thread; `flush()` waits for them, `shutdown()` stops the exporter.
    """

    def __init__(
        self,
        endpoint: str,
        headers: Mapping[str, str] | None = None,
        *,
        content: bool = False,
        service_name: str = "criogen-graph",
        timeout_secs: float = 10,
    ) -> None:
        if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
            raise ValidationError(
                f"the OTLP endpoint must be an http(s) URL, got {endpoint!r}", code="invalid_value"
            )
        self.endpoint = endpoint
        self.headers = dict(headers or {})
        self.content = bool(content)
        self.service_name = service_name
        self.timeout_secs = timeout_secs
        self._export: _Export | None = None

    @classmethod
    def otlp(
        cls,
        url: str,
        headers: Mapping[str, str] | None = None,
        *,
        content: bool = False,
        service_name: str = "criogen-graph",
    ) -> Telemetry:
        """Export to an OTLP/HTTP collector at `url` (its base, or the full traces URL)."""
        endpoint = url.rstrip("/")
        if not endpoint.endswith("/v1/traces"):
            endpoint += "/v1/traces"
        return cls(endpoint, headers, content=content, service_name=service_name)

    @classmethod
    def langfuse(
        cls,
        public_key: str | None = None,
        secret_key: str | None = None,
        host: str | None = None,
        *,
        content: bool = False,
        service_name: str = "criogen-graph",
    ) -> Telemetry:
        """Export to Langfuse's OTLP endpoint with its basic auth. The keys default to
        `LANGFUSE_PUBLIC_KEY` and `LANGFUSE_SECRET_KEY`, the host to `LANGFUSE_HOST` (or
        Langfuse Cloud)."""
        public_key = public_key or os.environ.get("LANGFUSE_PUBLIC_KEY")
        secret_key = secret_key or os.environ.get("LANGFUSE_SECRET_KEY")
        missing = [
            name
            for name, value in (
                ("LANGFUSE_PUBLIC_KEY", public_key),
                ("LANGFUSE_SECRET_KEY", secret_key),
            )
            if not value
        ]
        if missing:
            raise ValidationError(
                f"Telemetry.langfuse needs {' and '.join(missing)} (or pass the keys)",
                code="invalid_value",
            )
        host = (host or os.environ.get("LANGFUSE_HOST") or LANGFUSE_HOST).rstrip("/")
        token = base64.b64encode(f"{public_key}:{secret_key}".encode()).decode()
        return cls(
            f"{host}/api/public/otel/v1/traces",
            {"authorization": f"Basic {token}"},
            content=content,
            service_name=service_name,
        )

    # -- the SDK, loaded on first use ----------------------------------------------------

    @property
    def exporter(self) -> _Export:
        """The batch processor and OTLP exporter (made on first use)."""
        if self._export is None:
            self._export = _Export(self)
        return self._export

    def flush(self, timeout_secs: float = 30) -> bool:
        """Export the spans ended so far; True when all went out in time."""
        if self._export is None:
            return True
        return bool(self._export.processor.force_flush(int(timeout_secs * 1000)))

    def shutdown(self) -> None:
        """Export what is left and stop the exporter."""
        if self._export is not None:
            self._export.processor.shutdown()  # type: ignore[no-untyped-call]
            self._export = None

    def __repr__(self) -> str:
        return f"Telemetry({self.endpoint!r}, content={self.content})"


#: The spans of the run in progress; an agent run as a tool of another without telemetry
#: of its own reports into its caller's.
SPANS: ContextVar[Spans | None] = ContextVar("criogen_spans", default=None)


class _Export:
    """The OpenTelemetry SDK's `BatchSpanProcessor` (batching, the background thread,
    flush, shutdown) feeding our OTLP/HTTP exporter (`_otlp`: its own protobuf encoder,
    httpx, retries).

    Spans are recorded as plain objects (`_Live`) and queued as they are when they end:
    the SDK's own live spans clean and lock every attribute on every call, and its
    encoder builds a protobuf object per attribute, which together cost more than a whole
    agent turn's bookkeeping."""

    def __init__(self, telemetry: Telemetry) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ValidationError(
                "telemetry needs OpenTelemetry: pip install 'criogen-graph[otel]'",
                code="missing_dependency",
            ) from exc
        from criogen_graph import __version__
        from criogen_graph._otlp import Encoder, OtlpHttpExporter

        # Resource.create adds the SDK's telemetry.sdk.* attributes and OTEL_RESOURCE_ATTRIBUTES.
        resource = Resource.create({"service.name": telemetry.service_name})
        self.exporter = OtlpHttpExporter(
            telemetry.endpoint,
            telemetry.headers,
            telemetry.timeout_secs,
            Encoder(resource.attributes, "criogen_graph", __version__, resource.schema_url),
        )
        self.processor = BatchSpanProcessor(
            self.exporter,  # type: ignore[arg-type]  # the SpanExporter protocol, not the class
            schedule_delay_millis=500,
            max_queue_size=16384,
        )


class _Otel:
    """The OpenTelemetry API functions a span needs, imported once (the extra is optional)."""

    __slots__ = (
        "SpanContext",
        "attach",
        "detach",
        "get_current_span",
        "sampled",
        "set_span",
        "wrap",
    )

    def __init__(self) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

        self.SpanContext = SpanContext
        self.get_current_span = trace.get_current_span
        self.set_span = trace.set_span_in_context
        self.wrap = NonRecordingSpan
        self.attach = context.attach
        self.detach = context.detach
        self.sampled = TraceFlags(TraceFlags.SAMPLED)


_OTEL: _Otel | None = None


class _Live(Finished):
    """A span being recorded: `with spans.span(...) as live:` makes it the current span
    for the code it wraps, and queues it for export when that code ends."""

    __slots__ = ("_processor", "_spans", "_token")

    _processor: Any
    _spans: Spans
    _token: Any

    def __enter__(self) -> _Live:
        otel = _OTEL
        assert otel is not None
        self._token = otel.attach(otel.set_span(otel.wrap(self.context)))
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        otel = _OTEL
        assert otel is not None
        otel.detach(self._token)
        if exc is not None:
            from langgraph.errors import GraphBubbleUp

            if not isinstance(exc, GraphBubbleUp):  # a stop for approval is not an error
                self.attributes["error.type"] = type(exc).__name__
                self.status = (STATUS_ERROR, self._spans.text(str(exc))[:500])
        self.end = time.time_ns()
        self._processor.on_end(self)


class Spans:
    """What the runtime calls to record spans: redaction and content rules in one place.
    Strings are redacted with the policy of the run in progress (`redact.CURRENT`), or
    the agent's own when the graph runs outside our API (LangGraph's server, Studio)."""

    __slots__ = ("content", "redactor", "telemetry")

    def __init__(self, telemetry: Telemetry, redactor: Redactor | None) -> None:
        self.telemetry = telemetry
        self.redactor = redactor
        self.content = telemetry.content

    def clean(self, attributes: Mapping[str, Any]) -> dict[str, Any]:
        redactor = CURRENT.get() or self.redactor
        out: dict[str, Any] = {}
        for k, v in attributes.items():
            if v is None:
                continue
            kind = type(v)
            if kind is str:
                if redactor is not None:
                    v = redactor.redact(v)
            elif kind is list or kind is tuple:
                # OTLP arrays hold one type; ours are lists of names and ids.
                v = tuple(redactor.redact(str(x)) if redactor is not None else str(x) for x in v)
            elif not isinstance(v, bool | int | float):
                v = redactor.redact(str(v)) if redactor is not None else str(v)
            out[k] = v
        return out

    def text(self, value: Any) -> str:
        """Content as an attribute value (JSON for anything but a string), redacted."""
        text = (
            value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
        )
        redactor = CURRENT.get() or self.redactor
        return redactor.redact(text) if redactor is not None else text

    def span(self, name: str, attributes: Mapping[str, Any], *, kind: str = "internal") -> _Live:
        """A span named `name`, to be entered with `with`. Its parent is whatever span is
        current: ours (a run, a tool call) or the application's own (a web request); it is
        made current for the code it wraps, so spans of instrumented libraries called by
        tools nest under it."""
        global _OTEL
        otel = _OTEL
        if otel is None:
            otel = _OTEL = _Otel()
        processor = self.telemetry.exporter.processor
        current = otel.get_current_span().get_span_context()
        if current.is_valid:
            parent, trace_id, flags = current, current.trace_id, current.trace_flags
        else:
            parent, trace_id, flags = None, random.getrandbits(128), otel.sampled
        live = _Live()
        live.context = otel.SpanContext(trace_id, random.getrandbits(64), False, flags)
        live.parent = parent
        live.name = name
        live.kind = KIND_CLIENT if kind == "client" else KIND_INTERNAL
        live.attributes = self.clean(attributes)
        live.events = []
        live.status = None
        live._spans = self
        live._processor = processor
        live.start = time.time_ns()
        return live

    def event(self, span: _Live, name: str, attributes: Mapping[str, Any]) -> None:
        span.events.append((name, time.time_ns(), self.clean(attributes)))

    def set(self, span: _Live, attributes: Mapping[str, Any]) -> None:
        span.attributes.update(self.clean(attributes))
