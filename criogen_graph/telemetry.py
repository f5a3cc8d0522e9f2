"""`Telemetry`: OpenTelemetry spans for runs, model calls and tool calls, exported over
OTLP/HTTP (extra `otel`). Spans follow the OpenTelemetry GenAI semantic conventions."""

from __future__ import annotations

import base64
import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

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
        self._provider: Any = None
        self._tracer: Any = None

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
    def tracer(self) -> Any:
        if self._tracer is None:
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
                from opentelemetry.sdk.resources import Resource
                from opentelemetry.sdk.trace import TracerProvider
                from opentelemetry.sdk.trace.export import BatchSpanProcessor
            except ImportError as exc:  # pragma: no cover - depends on the install
                raise ValidationError(
                    "telemetry needs OpenTelemetry: pip install 'criogen-graph[otel]'",
                    code="missing_dependency",
                ) from exc
            from criogen_graph import __version__

            # A provider of our own (not the global one): two agents can export to two
            # places, and an application's own OpenTelemetry setup is left alone.
            provider = TracerProvider(resource=Resource.create({"service.name": self.service_name}))
            exporter = OTLPSpanExporter(
                endpoint=self.endpoint, headers=self.headers, timeout=self.timeout_secs
            )
            provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
            self._provider = provider
            self._tracer = provider.get_tracer("criogen_graph", __version__)
        return self._tracer

    def flush(self, timeout_secs: float = 30) -> bool:
        """Export the spans ended so far; True when all went out in time."""
        if self._provider is None:
            return True
        return bool(self._provider.force_flush(int(timeout_secs * 1000)))

    def shutdown(self) -> None:
        """Export what is left and stop the exporter."""
        if self._provider is not None:
            self._provider.shutdown()
            self._provider = None
            self._tracer = None

    def __repr__(self) -> str:
        return f"Telemetry({self.endpoint!r}, content={self.content})"


#: The spans of the run in progress; an agent run as a tool of another without telemetry
#: of its own reports into its caller's.
SPANS: ContextVar[Spans | None] = ContextVar("criogen_spans", default=None)


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
            if redactor is not None:
                if isinstance(v, str):
                    v = redactor.redact(v)
                elif isinstance(v, list | tuple):
                    v = [redactor.redact(x) if isinstance(x, str) else x for x in v]
            out[k] = v
        return out

    def text(self, value: Any) -> str:
        """Content as an attribute value (JSON for anything but a string), redacted."""
        text = (
            value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
        )
        redactor = CURRENT.get() or self.redactor
        return redactor.redact(text) if redactor is not None else text

    @contextlib.contextmanager
    def span(
        self, name: str, attributes: Mapping[str, Any], *, kind: str = "internal"
    ) -> Iterator[Any]:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        span_kind = SpanKind.CLIENT if kind == "client" else SpanKind.INTERNAL
        with self.telemetry.tracer.start_as_current_span(
            name,
            kind=span_kind,
            attributes=self.clean(attributes),
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield span
            except BaseException as exc:
                from langgraph.errors import GraphBubbleUp

                if isinstance(exc, GraphBubbleUp):
                    raise  # a stop for approval, not an error
                span.set_attribute("error.type", type(exc).__name__)
                span.set_status(Status(StatusCode.ERROR, self.text(str(exc))[:500]))
                raise

    def event(self, span: Any, name: str, attributes: Mapping[str, Any]) -> None:
        span.add_event(name, self.clean(attributes))

    def set(self, span: Any, attributes: Mapping[str, Any]) -> None:
        span.set_attributes(self.clean(attributes))
