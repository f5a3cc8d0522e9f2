"""`Telemetry`: OpenTelemetry spans for runs, model calls and tool calls, made through the
OpenTelemetry API (extra `otel`) with the application's tracer provider, or with one that
exports over OTLP/HTTP (`Telemetry.otlp`, `Telemetry.langfuse`). Spans follow the
OpenTelemetry GenAI semantic conventions. Users import `Telemetry` from `criogen_graph`
(or `criogen_graph.telemetry`); `Spans` and `SPANS` are what the runtime records with."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from criogen_graph._version import __version__
from criogen_graph.errors import ValidationError
from criogen_graph.redact import CURRENT, package_logger

if TYPE_CHECKING:
    from criogen_graph.redact import Redactor

__all__ = ["Telemetry"]

# The OTLP exporter's logger (`criogen_graph.telemetry`, a name the README documents),
# made here so it redacts from `import criogen_graph` on, not only once an exporter exists.
package_logger("criogen_graph.telemetry")

LANGFUSE_HOST = "https://cloud.langfuse.com"
_MISSING = "telemetry needs OpenTelemetry: pip install -e '.[otel]' in the criogen_graph checkout"


class Telemetry:
    """Reports every run of an agent as OpenTelemetry spans, through the OpenTelemetry API.

    `Telemetry()` uses the application's global tracer provider (whatever it set up with
    `trace.set_tracer_provider`: its processors, exporters and sampler, even when set
    after the agent was made); `Telemetry(provider)` uses that provider. The run's span is
    a child of the span current when `send`/`run`/`stream` is called (a web request, a
    job), and an unsampled trace records nothing. `Telemetry.otlp(url)` and
    `Telemetry.langfuse()` are conveniences that make a provider of their own exporting
    over OTLP/HTTP. Pass it as `Agent(telemetry=...)`.

    Spans: `invoke_agent <agent>` per run segment (conversation id = thread id, run id,
    actor, action, outcome, token usage), `chat <model>` per model call (operation,
    provider, request/response model, token usage, finish reasons; retries and fallbacks
    as events), `execute_tool <tool>` per tool call (name, call id, status); approval
    requests and decisions are events of the run span; errors set the span's status and
    `error.type`. Message content (prompts, answers, tool arguments and results) is
    recorded only with `content=True`, and the agent's `Redactor` applies to every
    recorded string. Needs the `otel` extra: `pip install -e '.[otel]'` in a checkout.
    """

    def __init__(self, tracer_provider: Any = None, *, content: bool = False) -> None:
        if isinstance(tracer_provider, str):
            raise TypeError(
                "Telemetry(...) takes a TracerProvider; to export to a URL use "
                f"Telemetry.otlp({tracer_provider!r})"
            )
        try:
            from opentelemetry import trace
        except ImportError as exc:
            raise ValidationError(_MISSING, code="missing_dependency") from exc

        self.tracer_provider = tracer_provider
        self.content = bool(content)
        #: The OTLP/HTTP endpoint of a provider made by `otlp`/`langfuse` (else None).
        self.endpoint: str | None = None
        self.headers: dict[str, str] = {}
        self._owned: Any = None
        # With no provider, a proxy tracer: it follows the global provider, set now or later.
        self.tracer: Any = (
            trace.get_tracer("criogen_graph", __version__)
            if tracer_provider is None
            else tracer_provider.get_tracer("criogen_graph", __version__)
        )

    @classmethod
    def otlp(
        cls,
        url: str,
        headers: Mapping[str, str] | None = None,
        *,
        content: bool = False,
        service_name: str = "criogen-graph",
        timeout_secs: float = 10,
    ) -> Telemetry:
        """Export to an OTLP/HTTP collector at `url` (its base, e.g.
        `http://localhost:4318`, or the full `.../v1/traces`), with a tracer provider of
        its own (a batch processor; the sampler from `OTEL_TRACES_SAMPLER`, parent-based
        by default). The run's span is still a child of the application's current span."""
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            from criogen_graph._urls import mask_url

            raise ValidationError(
                "the OTLP endpoint must be an http(s) URL, got "
                f"{mask_url(url) if isinstance(url, str) else url!r}",
                code="invalid_value",
            )
        endpoint = url.rstrip("/")
        if not endpoint.endswith("/v1/traces"):
            endpoint += "/v1/traces"
        provider = _otlp_provider(endpoint, dict(headers or {}), service_name, timeout_secs)
        telemetry = cls(provider, content=content)
        telemetry.endpoint = endpoint
        telemetry.headers = dict(headers or {})
        telemetry._owned = provider
        return telemetry

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
        return cls.otlp(
            f"{host}/api/public/otel/v1/traces",
            {"authorization": f"Basic {token}"},
            content=content,
            service_name=service_name,
        )

    def _provider(self) -> Any:
        if self.tracer_provider is not None:
            return self.tracer_provider
        from opentelemetry import trace

        return trace.get_tracer_provider()

    def flush(self, timeout_secs: float = 30) -> bool:
        """Export the spans ended so far (the provider's `force_flush`); True when all
        went out in time."""
        force_flush = getattr(self._provider(), "force_flush", None)
        if force_flush is None:  # the API's no-op provider: nothing to send
            return True
        return bool(force_flush(int(timeout_secs * 1000)))

    def shutdown(self) -> None:
        """Export what is left and stop the provider made by `otlp`/`langfuse` (an
        application's own provider is left to the application)."""
        if self._owned is not None:
            self._owned.shutdown()
            self._owned = None

    def __repr__(self) -> str:
        from criogen_graph._urls import mask_url  # here: `import criogen_graph` skips it

        where = (
            mask_url(self.endpoint)
            if self.endpoint
            else ("global provider" if self.tracer_provider is None else "provider")
        )
        return f"Telemetry({where!r}, content={self.content})"


def _otlp_provider(
    endpoint: str, headers: dict[str, str], service_name: str, timeout_secs: float
) -> Any:
    """A tracer provider of the OpenTelemetry API (`otlp.light_provider`: light spans,
    the SDK's sampler and batch processor) feeding our OTLP/HTTP exporter (`otlp`: its
    own protobuf encoder, httpx, retries). The SDK's spans and encoder, which validate,
    lock and build a protobuf object per attribute, cost more than the rest of a traced
    turn."""
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import _get_from_env_or_default
    except ImportError as exc:
        raise ValidationError(_MISSING, code="missing_dependency") from exc
    from criogen_graph.telemetry.otlp import Encoder, OtlpHttpExporter, light_provider

    # Resource.create adds the SDK's telemetry.sdk.* attributes and OTEL_RESOURCE_ATTRIBUTES.
    resource = Resource.create({"service.name": service_name})
    exporter = OtlpHttpExporter(
        endpoint,
        headers,
        timeout_secs,
        Encoder(resource.attributes, "criogen_graph", __version__, resource.schema_url),
    )
    processor = BatchSpanProcessor(
        exporter,  # type: ignore[arg-type]  # the SpanExporter protocol, not the class
        schedule_delay_millis=500,
        max_queue_size=16384,
    )
    # The sampler the SDK would use: OTEL_TRACES_SAMPLER, parent-based always-on by default.
    return light_provider(processor, _get_from_env_or_default())


#: The spans of the run in progress; an agent run as a tool of another without telemetry
#: of its own reports into its caller's.
SPANS: ContextVar[Spans | None] = ContextVar("criogen_spans", default=None)


class _Otel:
    """The OpenTelemetry API a span needs, imported once (the extra is optional)."""

    __slots__ = ("attach", "client", "detach", "error", "internal", "set_span")

    def __init__(self) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        self.attach = context.attach
        self.detach = context.detach
        self.set_span = trace.set_span_in_context
        self.client = SpanKind.CLIENT
        self.internal = SpanKind.INTERNAL
        self.error: Any = lambda message: Status(StatusCode.ERROR, message)


_OTEL: _Otel | None = None


class _Live:
    """An OpenTelemetry span in a `with`: current for the code it wraps (so spans of
    instrumented libraries called by tools nest under it), ended when that code ends."""

    __slots__ = ("_token", "recording", "span", "spans")

    def __init__(self, spans: Spans, span: Any) -> None:
        self.spans = spans
        self.span = span
        # An unsampled span records nothing: skip the cleaning and redaction too.
        self.recording: bool = span.is_recording()

    def __enter__(self) -> _Live:
        otel = _OTEL
        assert otel is not None
        self._token = otel.attach(otel.set_span(self.span))
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        otel = _OTEL
        assert otel is not None
        otel.detach(self._token)
        if exc is not None and self.recording:
            from langgraph.errors import GraphBubbleUp

            if not isinstance(exc, GraphBubbleUp):  # a stop for approval is not an error
                self.span.set_attribute("error.type", type(exc).__name__)
                self.span.set_status(otel.error(self.spans.text(str(exc))[:500]))
        self.span.end()


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
        """A span named `name`, to be entered with `with`, made by the telemetry's tracer.
        Its parent is whatever span is current: ours (a run, a tool call) or the
        application's own (a web request)."""
        global _OTEL
        otel = _OTEL
        if otel is None:
            otel = _OTEL = _Otel()
        span = self.telemetry.tracer.start_span(
            name,
            kind=otel.client if kind == "client" else otel.internal,
            attributes=self.clean(attributes),
        )
        return _Live(self, span)

    def event(self, span: _Live, name: str, attributes: Mapping[str, Any]) -> None:
        if span.recording:
            span.span.add_event(name, self.clean(attributes))

    def set(self, span: _Live, attributes: Mapping[str, Any]) -> None:
        if span.recording:
            span.span.set_attributes(self.clean(attributes))

    def fail(self, span: _Live, error_type: str, message: Any) -> None:
        """Mark `span` as failed (a tool call that returned an error, not raised one)."""
        if span.recording:
            otel = _OTEL
            assert otel is not None
            span.span.set_attribute("error.type", error_type)
            span.span.set_status(otel.error(self.text(message)[:500]))
