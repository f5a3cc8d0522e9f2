"""OpenTelemetry through its API: an application's own setup (the global tracer provider, a
console exporter, its sampler, a request span around the agent call) sees our spans."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry import context, trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags

from criogen_graph import (
    Agent,
    FakeModel,
    FakeReply,
    ModelError,
    Redactor,
    Telemetry,
    ValidationError,
    tool,
)

SECRET = "jane.doe@example.com"


class App:
    def __init__(self) -> None:
        self.memory = InMemorySpanExporter()
        self.console = io.StringIO()


@pytest.fixture(scope="module")
def global_app() -> App:
    """The application's setup, done once per process as an application does it."""
    app = App()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        trace.set_tracer_provider(TracerProvider())
        provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    provider.add_span_processor(SimpleSpanProcessor(app.memory))
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=app.console)))
    return app


@pytest.fixture
def app(global_app: App) -> App:
    global_app.memory.clear()
    global_app.console.seek(0)
    global_app.console.truncate()
    return global_app


@tool
def lookup(order_id: str) -> str:
    """Look up an order."""
    return f"order {order_id}: shipped to {SECRET}"


@tool
def broken(note: str) -> str:
    """Fails with the note in its message."""
    raise RuntimeError(f"could not send to {note}")


def recorded(**provider_options: Any) -> tuple[InMemorySpanExporter, TracerProvider]:
    """A tracer provider of the test's own and the exporter that keeps what it ends."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(**provider_options)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return memory, provider


def named(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


async def test_the_applications_global_provider_and_console_exporter_see_our_spans(
    app: App,
) -> None:
    agent = Agent(
        FakeModel(
            [
                FakeReply.tool_call("lookup", {"order_id": "A-1"}, id="c1"),
                FakeReply.text("Shipped.", usage={"input_tokens": 12, "output_tokens": 2}),
            ]
        ),
        tools=[lookup],
        telemetry=Telemetry(),  # the global provider
        name="support",
    )
    thread = agent.thread(f"t-{uuid.uuid4().hex}")
    tracer = trace.get_tracer("app")
    with tracer.start_as_current_span("POST /chat") as request:
        assert (await thread.send("where is A-1?")).text == "Shipped."
    spans = app.memory.get_finished_spans()
    request_context = request.get_span_context()

    run = named(spans, "invoke_agent support")
    assert run.parent is not None and run.parent.span_id == request_context.span_id
    assert run.context.trace_id == request_context.trace_id
    assert run.kind is SpanKind.INTERNAL
    assert run.attributes is not None
    assert run.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert run.attributes["gen_ai.agent.name"] == "support"
    assert run.attributes["gen_ai.conversation.id"] == thread.id
    assert run.instrumentation_scope is not None
    assert run.instrumentation_scope.name == "criogen_graph"

    chats = [s for s in spans if s.name == "chat fake"]
    assert len(chats) == 2
    for chat in chats:
        assert chat.parent is not None and chat.parent.span_id == run.context.span_id
        assert chat.kind is SpanKind.CLIENT
        assert chat.attributes is not None
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.provider.name"] == "fake"
        assert chat.attributes["gen_ai.request.model"] == "fake"
        assert chat.attributes["gen_ai.response.model"] == "fake"
    assert run.attributes["gen_ai.usage.input_tokens"] == sum(
        c.attributes["gen_ai.usage.input_tokens"]  # type: ignore[index, misc]
        for c in chats
    )
    finish = sorted(c.attributes["gen_ai.response.finish_reasons"] for c in chats)  # type: ignore[index]
    assert finish == [("stop",), ("tool_calls",)]

    call = named(spans, "execute_tool lookup")
    assert call.parent is not None and call.parent.span_id == run.context.span_id
    assert call.attributes is not None
    assert call.attributes["gen_ai.operation.name"] == "execute_tool"
    assert call.attributes["gen_ai.tool.name"] == "lookup"
    assert call.attributes["gen_ai.tool.call.id"] == "c1"

    # The console exporter printed them too, as JSON objects one after the other.
    printed = [
        json.loads(chunk)
        for chunk in app.console.getvalue().replace("}\n{", "}\n\x00{").split("\x00")
        if chunk.strip()
    ]
    assert {"invoke_agent support", "chat fake", "execute_tool lookup", "POST /chat"} <= {
        p["name"] for p in printed
    }


async def test_a_global_provider_set_after_the_agent_was_made_is_used(app: App) -> None:
    # The proxy tracer follows the global provider; here it is already set (the fixture),
    # but the Telemetry was made without looking it up.
    telemetry = Telemetry()
    agent = Agent(FakeModel([FakeReply.text("hi")]), telemetry=telemetry)
    await agent.run("hello")
    assert telemetry.flush(5)
    assert [s.name for s in app.memory.get_finished_spans()] == ["chat fake", "invoke_agent agent"]


async def test_an_unsampled_request_records_nothing(app: App) -> None:
    agent = Agent(FakeModel([FakeReply.text("hi")]), telemetry=Telemetry())
    unsampled = NonRecordingSpan(SpanContext(2**100 + 1, 2**60 + 1, True, TraceFlags(0)))
    token = context.attach(trace.set_span_in_context(unsampled))
    try:
        assert (await agent.run("hello")).text == "hi"
    finally:
        context.detach(token)
    assert app.memory.get_finished_spans() == ()


async def test_a_sampler_that_says_no_costs_the_run_nothing() -> None:
    memory, provider = recorded(sampler=ALWAYS_OFF)
    agent = Agent(
        FakeModel([FakeReply.tool_call("lookup", {"order_id": "A-1"}), FakeReply.text("ok")]),
        tools=[lookup],
        telemetry=Telemetry(provider),
    )
    assert (await agent.run("hello")).text == "ok"
    assert memory.get_finished_spans() == ()


class _Down(SpanExporter):
    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        raise ConnectionError("the collector is down")

    def shutdown(self) -> None:
        pass


async def test_an_exporter_that_fails_does_not_fail_the_run() -> None:
    down = _Down()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(down))
    agent = Agent(FakeModel([FakeReply.text("hi")]), telemetry=Telemetry(provider))
    assert (await agent.run("hello")).text == "hi"
    assert down.calls == 2  # it was called for both spans, and failed both times


async def test_a_failed_model_call_is_an_error_status_with_error_type() -> None:
    memory, provider = recorded()
    agent = Agent(
        FakeModel([FakeReply.error("bad_request", "refused: " + SECRET)]),
        telemetry=Telemetry(provider),
        redact=Redactor.pii(),
    )
    with pytest.raises(ModelError):
        await agent.run("hello")
    spans = memory.get_finished_spans()
    for name in ("chat fake", "invoke_agent agent"):
        span = named(spans, name)
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes is not None and span.attributes["error.type"] == "ModelError"
        assert span.status.description and SECRET not in span.status.description


async def test_every_recorded_text_is_redacted_with_content_on() -> None:
    memory, provider = recorded()

    agent = Agent(
        FakeModel(
            [
                FakeReply.tool_call("lookup", {"order_id": SECRET}, id="c1"),
                FakeReply.tool_call("broken", {"note": SECRET}, id="c2"),
                FakeReply.text(f"Written to {SECRET}."),
            ]
        ),
        tools=[lookup, broken],
        telemetry=Telemetry(provider, content=True),
        redact=Redactor.pii(),
    )
    await agent.thread(f"t-{uuid.uuid4().hex}", actor=SECRET).send(f"mail {SECRET} please")
    spans = memory.get_finished_spans()
    assert {s.name for s in spans} >= {"chat fake", "execute_tool lookup", "execute_tool broken"}
    failed = named(spans, "execute_tool broken")
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes is not None and failed.attributes["error.type"] == "tool_error"
    assert named(spans, "execute_tool lookup").status.status_code is StatusCode.UNSET
    seen: list[Any] = []
    for span in spans:
        seen.extend((span.attributes or {}).values())
        seen.append(span.status.description)
        for ev in span.events:
            seen.extend((ev.attributes or {}).values())
    texts = " ".join(str(v) for v in seen)
    assert "gen_ai.input.messages" in {k for s in spans for k in (s.attributes or {})}
    assert "mail" in texts  # the content is there ...
    assert SECRET not in texts  # ... redacted


def test_telemetry_refuses_a_url_and_names_the_way_to_export_to_one() -> None:
    with pytest.raises(TypeError, match=r"Telemetry\.otlp"):
        Telemetry("http://localhost:4318")


def test_a_missing_opentelemetry_names_the_extra_when_telemetry_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(ValidationError, match=r"(-e '\.|'criogen-graph)\[otel\]'"):
        Telemetry()
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace.export", None)
    monkeypatch.delitem(sys.modules, "opentelemetry")
    with pytest.raises(ValidationError, match=r"(-e '\.|'criogen-graph)\[otel\]'"):
        Telemetry.otlp("http://127.0.0.1:4318")


@pytest.mark.parametrize("content", [False, True])
async def test_no_span_carries_an_unredacted_text_ids_and_names_included(content: bool) -> None:
    memory, provider = recorded()

    agent = Agent(
        FakeModel(
            [
                FakeReply.error("transient", f"overloaded for {SECRET}"),
                FakeReply.tool_call("lookup", {"order_id": SECRET}, id="c1"),
                FakeReply.tool_call("broken", {"note": SECRET}, id="c2"),
                FakeReply.text(f"Written to {SECRET}."),
                FakeReply.error("bad_request", f"refused: {SECRET}"),
            ]
        ),
        tools=[lookup, broken],
        telemetry=Telemetry(provider, content=content),
        redact=Redactor.pii(),
    )
    # The thread id and the actor are the user's e-mail address here.
    thread = agent.thread(f"support-{SECRET}", actor=SECRET)
    assert (await thread.send(f"mail {SECRET} please")).text == "Written to [EMAIL]."
    with pytest.raises(ModelError):
        await thread.send(f"and again to {SECRET}")
    spans = memory.get_finished_spans()
    retried = [ev for s in spans for ev in s.events if ev.name == "criogen.model_retry"]
    assert len(retried) == 1
    runs = [s for s in spans if s.name == "invoke_agent agent"]
    assert len(runs) == 2 and runs[1].status.status_code is StatusCode.ERROR
    for run in runs:
        assert run.attributes is not None
        assert run.attributes["gen_ai.conversation.id"] == "[EMAIL]"
        assert run.attributes["criogen.actor"] == "[EMAIL]"
    seen: list[str] = []
    for span in spans:
        seen.append(span.name)
        seen.extend(f"{k}={v}" for k, v in (span.attributes or {}).items())
        seen.append(str(span.status.description))
        for ev in span.events:
            seen.append(ev.name)
            seen.extend(f"{k}={v}" for k, v in (ev.attributes or {}).items())
    texts = "\n".join(seen)
    assert ("mail [EMAIL] please" in texts) is content
    assert "refused" in texts
    assert SECRET not in texts
    assert "jane.doe" not in texts
