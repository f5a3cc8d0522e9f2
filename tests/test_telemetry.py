"""Telemetry: spans for runs, model calls and tool calls, exported over real OTLP/HTTP to a
receiver on 127.0.0.1 that decodes the protobuf bodies."""

from __future__ import annotations

import asyncio
import base64
import uuid
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import (
    Agent,
    FakeModel,
    FakeReply,
    FunctionModel,
    ModelError,
    Retry,
    Telemetry,
    ValidationError,
    tool,
)
from tests.servers.otlp_receiver import OtlpReceiver, SpanRecord


def otlp(rx: OtlpReceiver, **kw: Any) -> Telemetry:
    telemetry = Telemetry.otlp(rx.url, **kw)
    rx.users.append(telemetry)
    return telemetry


@tool
def lookup(order_id: str) -> str:
    """Look up an order."""
    return f"order {order_id}: shipped"


@tool
def refund(order_id: str) -> str:
    """Refund an order."""
    return f"refunded {order_id}"


def exported(telemetry: Telemetry, rx: OtlpReceiver) -> list[SpanRecord]:
    assert telemetry.flush(10), "the spans were not exported in time"
    return list(rx.spans)


def one(spans: list[SpanRecord], name: str) -> SpanRecord:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, f"expected one {name!r} span, got {[s.name for s in spans]}"
    return found[0]


def event(span: SpanRecord, name: str) -> dict[str, Any]:
    found = [attrs for ev, attrs in span.events if ev == name]
    assert found, f"span {span.name!r} has no {name!r} event: {span.events}"
    return found[0]


async def test_a_thread_run_with_an_approval_exports_run_model_and_tool_spans(
    rx: OtlpReceiver, tmp_path: Path
) -> None:
    telemetry = otlp(rx, service_name="support-bot")
    model = FakeModel(
        [
            FakeReply.tool_call("lookup", {"order_id": "A-1"}, id="c1"),
            FakeReply.tool_call("refund", {"order_id": "A-1"}, id="c2"),
            FakeReply.text("Refunded.", usage={"input_tokens": 30, "output_tokens": 3}),
        ]
    )
    agent = Agent(
        model,
        tools=[lookup, refund],
        approve=["refund"],
        storage=f"sqlite:///{tmp_path}/t.db",
        telemetry=telemetry,
        name="support",
    )
    thread = agent.thread(f"t-{uuid.uuid4().hex}", actor="alice")
    first = await thread.send("refund A-1 please")
    assert first.needs_approval
    second = await thread.approve()
    assert second.text == "Refunded."
    spans = exported(telemetry, rx)
    await agent.storage.close()

    runs = [s for s in spans if s.name == "invoke_agent support"]
    assert len(runs) == 2
    sent, approved = sorted(runs, key=lambda s: s.attributes["criogen.action"] != "send")
    for run in runs:
        assert run.parent_id == ""  # a root span per run segment
        assert run.attributes["gen_ai.operation.name"] == "invoke_agent"
        assert run.attributes["gen_ai.agent.name"] == "support"
        assert run.attributes["gen_ai.conversation.id"] == thread.id
        assert run.attributes["criogen.actor"] == "alice"
    assert sent.attributes["criogen.run_id"] == first.run_id
    assert sent.attributes["criogen.outcome"] == "suspended"
    assert "criogen.stop_reason" not in sent.attributes  # none while it waits
    waiting = event(sent, "criogen.approval_requested")
    assert waiting["criogen.approval.tools"] == ["refund"]
    assert waiting["criogen.approval.call_ids"] == ["c2"]
    assert approved.attributes["criogen.action"] == "approve"
    assert approved.attributes["criogen.outcome"] == "completed"
    decided = event(approved, "criogen.approval_decided")
    assert decided["criogen.approval.call_ids"] == ["c2"]
    assert decided["criogen.approval.decisions"] == ["approve"]

    chats = [s for s in spans if s.name == "chat fake"]
    assert len(chats) == 3
    assert sum(c.parent_id == sent.span_id for c in chats) == 2
    assert sum(c.parent_id == approved.span_id for c in chats) == 1
    final = next(c for c in chats if c.parent_id == approved.span_id)
    assert final.kind == 3  # SPAN_KIND_CLIENT
    assert final.attributes["gen_ai.operation.name"] == "chat"
    assert final.attributes["gen_ai.provider.name"] == "fake"
    assert final.attributes["gen_ai.request.model"] == "fake"
    assert final.attributes["gen_ai.response.model"] == "fake"
    assert final.attributes["gen_ai.usage.input_tokens"] == 30
    assert final.attributes["gen_ai.usage.output_tokens"] == 3
    assert final.attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert any(c.attributes["gen_ai.response.finish_reasons"] == ["tool_calls"] for c in chats)

    looked = one(spans, "execute_tool lookup")
    assert looked.parent_id == sent.span_id
    assert looked.attributes["gen_ai.tool.name"] == "lookup"
    assert looked.attributes["gen_ai.tool.call.id"] == "c1"
    assert looked.attributes["criogen.tool.status"] == "ok"
    refunded = one(spans, "execute_tool refund")
    assert refunded.parent_id == approved.span_id
    assert refunded.attributes["criogen.tool.decision"] == "approve"
    assert all(s.trace_id == sent.trace_id for s in spans if s.parent_id == sent.span_id)

    # Content stays out unless asked for.
    for s in spans:
        assert not any(
            k in s.attributes for k in ("gen_ai.input.messages", "gen_ai.output.messages")
        )
        assert "gen_ai.tool.call.arguments" not in s.attributes
    assert rx.resources[0]["service.name"] == "support-bot"
    assert set(rx.paths) == {"/v1/traces"}


async def test_content_is_exported_only_when_opted_in(rx: OtlpReceiver) -> None:
    telemetry = otlp(rx, content=True)
    agent = Agent(
        FakeModel([FakeReply.tool_call("lookup", {"order_id": "B-7"}), FakeReply.text("Shipped.")]),
        tools=[lookup],
        instructions="Be brief.",
        telemetry=telemetry,
    )
    await agent.run("where is B-7?")
    spans = exported(telemetry, rx)
    chats = [s for s in spans if s.name.startswith("chat")]
    assert any("where is B-7?" in c.attributes["gen_ai.input.messages"] for c in chats)
    assert any("Shipped." in c.attributes["gen_ai.output.messages"] for c in chats)
    call = one(spans, "execute_tool lookup")
    assert '"order_id": "B-7"' in call.attributes["gen_ai.tool.call.arguments"]
    assert call.attributes["gen_ai.tool.call.result"] == "order B-7: shipped"


async def test_retries_and_fallbacks_are_events_of_the_model_call_span(rx: OtlpReceiver) -> None:
    telemetry = otlp(rx)
    primary = FakeModel(
        [FakeReply.error("rate_limit"), FakeReply.error("transient")], name="primary"
    )
    backup = FakeModel([FakeReply.text("from the backup")], name="backup")
    agent = Agent(
        primary,
        fallbacks=[backup],
        model_retry=Retry(max_attempts=2, initial_backoff_secs=0, jitter=False),
        telemetry=telemetry,
    )
    result = await agent.run("hi")
    assert result.text == "from the backup"
    spans = exported(telemetry, rx)
    chat = one(spans, "chat primary")
    retried = event(chat, "criogen.model_retry")
    assert retried["attempt"] == 1
    assert retried["error.type"] == "rate_limit"
    fell = event(chat, "criogen.model_fallback")
    assert fell == {"from": "fake:primary", "to": "fake:backup", "error.type": "transient"}
    assert chat.attributes["gen_ai.request.model"] == "primary"
    assert chat.attributes["gen_ai.response.model"] == "backup"
    run = one(spans, "invoke_agent agent")
    assert chat.parent_id == run.span_id
    assert run.attributes["criogen.outcome"] == "completed"


async def test_a_failed_run_marks_its_spans_as_errors(rx: OtlpReceiver, tmp_path: Path) -> None:
    telemetry = otlp(rx)
    agent = Agent(
        FakeModel([FakeReply.error("auth", "the key was refused")]),
        storage=f"sqlite:///{tmp_path}/t.db",
        telemetry=telemetry,
    )
    with pytest.raises(ModelError):
        await agent.thread("broken").send("hi")
    spans = exported(telemetry, rx)
    await agent.storage.close()
    run = one(spans, "invoke_agent agent")
    chat = one(spans, "chat fake")
    assert run.attributes["criogen.outcome"] == "failed"
    assert run.status_code == chat.status_code == 2  # STATUS_CODE_ERROR
    assert chat.attributes["error.type"] == "ModelError"
    assert "the key was refused" in chat.status_message


async def test_sub_agent_spans_nest_under_the_calling_tool_span(rx: OtlpReceiver) -> None:
    telemetry = otlp(rx)
    clerk = Agent(
        FakeModel([FakeReply.tool_call("lookup", {"order_id": "C-3"}), FakeReply.text("done")]),
        tools=[lookup],
        name="clerk",
    )  # no telemetry of its own: it reports into its caller's

    def lead_script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if messages[-1]["role"] == "user":
            return FakeReply.tool_call("clerk", {"input": "check C-3"})
        return FakeReply.text(f"lead: {messages[-1]['content']}")

    lead = Agent(
        FunctionModel(lead_script),
        tools=[clerk.as_tool("clerk", "Checks orders.")],
        telemetry=telemetry,
        name="lead",
    )
    result = await lead.run("check C-3")
    assert result.text == "lead: done"
    spans = exported(telemetry, rx)
    lead_run = one(spans, "invoke_agent lead")
    clerk_call = one(spans, "execute_tool clerk")
    clerk_run = one(spans, "invoke_agent clerk")
    inner_tool = one(spans, "execute_tool lookup")
    assert clerk_call.parent_id == lead_run.span_id
    assert clerk_run.parent_id == clerk_call.span_id
    assert inner_tool.parent_id == clerk_run.span_id
    clerk_chats = [s for s in spans if s.name == "chat fake"]
    assert len(clerk_chats) == 2
    assert all(c.parent_id == clerk_run.span_id for c in clerk_chats)
    assert {s.trace_id for s in spans} == {lead_run.trace_id}


async def test_streamed_runs_export_the_same_spans(rx: OtlpReceiver, tmp_path: Path) -> None:
    telemetry = otlp(rx)
    agent = Agent(
        FakeModel(
            [FakeReply.tool_call("lookup", {"order_id": "D-4"}), FakeReply.text("D-4 shipped")]
        ),
        tools=[lookup],
        storage=f"sqlite:///{tmp_path}/t.db",
        telemetry=telemetry,
    )
    stream = agent.thread("streamed").stream("where is D-4?")
    texts = [e.text async for e in stream if e.type == "text"]
    reply = await stream.reply()
    assert "".join(texts) == reply.text == "D-4 shipped"
    spans = exported(telemetry, rx)
    await agent.storage.close()
    run = one(spans, "invoke_agent agent")
    assert run.attributes["criogen.outcome"] == "completed"
    assert one(spans, "execute_tool lookup").parent_id == run.span_id
    assert [s.parent_id for s in spans if s.name == "chat fake"] == [run.span_id] * 2


async def test_langfuse_gets_its_otlp_path_and_basic_auth(
    rx: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", "pk-lf-123")
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk-lf-456")
    monkeypatch.setenv("LANGFUSE_HOST", rx.url + "/")
    telemetry = Telemetry.langfuse()
    rx.users.append(telemetry)
    agent = Agent(FakeModel([FakeReply.text("hi")]), telemetry=telemetry)
    await agent.run("hello")
    assert exported(telemetry, rx)
    assert set(rx.paths) == {"/api/public/otel/v1/traces"}
    expected = base64.b64encode(b"pk-lf-123:sk-lf-456").decode()
    assert {h["authorization"] for h in rx.headers} == {f"Basic {expected}"}
    # Explicit arguments win over the environment.
    explicit = Telemetry.langfuse("pk-a", "sk-b", host="https://eu.example")
    assert explicit.endpoint == "https://eu.example/api/public/otel/v1/traces"
    assert explicit.headers["authorization"] == "Basic " + base64.b64encode(b"pk-a:sk-b").decode()


def test_langfuse_without_keys_says_which_are_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LANGFUSE_PUBLIC_KEY", raising=False)
    monkeypatch.delenv("LANGFUSE_SECRET_KEY", raising=False)
    with pytest.raises(ValidationError, match="LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY"):
        Telemetry.langfuse()
    with pytest.raises(ValidationError, match="LANGFUSE_SECRET_KEY"):
        Telemetry.langfuse(public_key="pk")


def test_bad_telemetry_arguments_are_refused() -> None:
    with pytest.raises(ValidationError, match="http"):
        Telemetry.otlp("localhost:4318")
    with pytest.raises(TypeError, match=r"Telemetry\.otlp"):
        Agent(FakeModel([]), telemetry="http://localhost:4318")  # type: ignore[arg-type]
    assert Telemetry.otlp("http://h:4318/").endpoint == "http://h:4318/v1/traces"


async def test_runs_nest_under_the_applications_current_span(rx: OtlpReceiver) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    app_tracer = TracerProvider().get_tracer("app")  # the application's own setup
    telemetry = otlp(rx)
    agent = Agent(FakeModel([FakeReply.text("hi")]), telemetry=telemetry)
    with app_tracer.start_as_current_span("POST /chat") as request:
        await agent.run("hello")
    run = one(exported(telemetry, rx), "invoke_agent agent")
    context = request.get_span_context()
    assert run.parent_id == f"{context.span_id:016x}"
    assert run.trace_id == f"{context.trace_id:032x}"


async def test_spans_made_inside_a_tool_nest_under_its_execute_tool_span(rx: OtlpReceiver) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    app_spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(app_spans))
    app_tracer = provider.get_tracer("app")

    @tool
    def fetch(url: str) -> str:
        """Fetch a page (an instrumented HTTP client would record a span here)."""
        with app_tracer.start_as_current_span("GET"):
            return "<html>"

    telemetry = otlp(rx)
    agent = Agent(
        FakeModel([FakeReply.tool_call("fetch", {"url": "http://x"}), FakeReply.text("ok")]),
        tools=[fetch],
        telemetry=telemetry,
    )
    await agent.run("go")
    call = one(exported(telemetry, rx), "execute_tool fetch")
    (inner,) = app_spans.get_finished_spans()
    assert inner.parent is not None
    assert f"{inner.parent.span_id:016x}" == call.span_id
    assert f"{inner.context.trace_id:032x}" == call.trace_id


def test_our_encoding_is_the_message_the_sdk_encoder_would_send() -> None:
    """The exporter writes the OTLP protobuf itself (the SDK's encoder was the largest cost
    of a traced turn); decoded, it must be exactly what the SDK's `encode_spans` makes of
    the same spans: every value type, events, error status, remote and local parents."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

    from criogen_graph.telemetry.otlp import Encoder

    resource = Resource.create({"service.name": "svc", "deployment.environment": "test"})
    sampled = TraceFlags(TraceFlags.SAMPLED)
    root = SpanContext(2**127 + 5, 2**63 + 7, False, sampled)
    remote = SpanContext(99, 1234, True, sampled)
    attributes: list[dict[str, Any]] = [
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.usage.input_tokens": 161,
            "big": 2**62,
            "negative": -3,
            "zero": 0,
            "ratio": 0.25,
            "yes": True,
            "no": False,
            "reasons": ("stop", "tool_calls"),
            "empty": "",
            "unicode": "café ✓ 日本",
            "long": "x" * 5000,
        },
        {"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 7},  # cached values
        {},
    ]
    sdk: list[ReadableSpan] = []
    for i, (attrs, parent) in enumerate(zip(attributes, [None, root, remote], strict=True)):
        context = SpanContext(root.trace_id, 1000 + i, False, sampled)
        events = [("gen_ai.retry", 1_700_000_000_000_000_001 + i, {"attempt": 2, "why": "429"})]
        sdk.append(
            ReadableSpan(
                f"span {i}",
                context=context,
                parent=parent,
                resource=resource,
                attributes=attrs,
                events=[Event(n, a, t) for n, t, a in events],
                kind=[SpanKind.INTERNAL, SpanKind.CLIENT, SpanKind.CONSUMER][i],
                status=Status(StatusCode.ERROR, "boom: ✗") if i == 1 else Status(StatusCode.UNSET),
                start_time=1_700_000_000_000_000_000 + i,
                end_time=1_700_000_000_500_000_000 + i,
                instrumentation_scope=InstrumentationScope("criogen_graph", "1.2.3"),
            )
        )
    encoder = Encoder(resource.attributes, "criogen_graph", "1.2.3", resource.schema_url)
    for _ in range(2):  # the second time from the cache
        mine = ExportTraceServiceRequest.FromString(encoder.request(sdk))
        assert mine == encode_spans(sdk)
    assert len(mine.resource_spans[0].scope_spans[0].spans) == 3


async def test_the_export_retries_what_otlp_calls_retryable(rx: OtlpReceiver) -> None:
    rx.refuse = [(503, {"retry-after": "0"}), (429, {"retry-after": "0"})]
    telemetry = otlp(rx)
    await Agent(FakeModel([FakeReply.text("hi")]), telemetry=telemetry).run("hello")
    assert one(exported(telemetry, rx), "invoke_agent agent")
    assert rx.answered == [503, 429, 200]


async def test_a_refused_batch_is_dropped_and_logged_and_export_goes_on(
    rx: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    rx.refuse = [(400, {})]
    telemetry = otlp(rx)
    agent = Agent(FakeModel([FakeReply.text("one"), FakeReply.text("two")]), telemetry=telemetry)
    with caplog.at_level("ERROR", logger="criogen_graph.telemetry"):
        await agent.run("first")
        assert telemetry.flush(10)
    assert rx.answered == [400], "a 400 is not retried"
    assert rx.spans == []
    assert any(
        "refused" in r.getMessage() and rx.url in r.getMessage() and "HTTP 400" in r.getMessage()
        for r in caplog.records
    ), caplog.text
    await agent.run("second")
    assert [s.name for s in exported(telemetry, rx)] == ["chat fake", "invoke_agent agent"]


async def test_an_unreachable_collector_costs_the_run_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    telemetry = Telemetry.otlp(f"http://127.0.0.1:{port}", timeout_secs=0.5)
    try:
        agent = Agent(FakeModel([FakeReply.text("hi")]), telemetry=telemetry)
        with caplog.at_level("ERROR", logger="criogen_graph.telemetry"):
            assert (await agent.run("hello")).text == "hi"
            assert telemetry.flush(10)
        assert any("could not export" in r.getMessage() for r in caplog.records), caplog.text
    finally:
        telemetry.shutdown()


def _run_in_forked_child(telemetry: Telemetry, out: Any) -> None:
    import asyncio as aio

    agent = Agent(FakeModel([FakeReply.text("from the child")]), telemetry=telemetry)
    aio.run(agent.run("hello from the child"))
    out.put(telemetry.flush(10))


async def test_a_forked_worker_exports_its_spans_on_a_connection_of_its_own(
    rx: OtlpReceiver,
) -> None:
    """Pre-fork servers (gunicorn, multiprocessing) fork after the agent is made: the
    child's spans leave on its own HTTP connection, not on the parent's pooled one."""
    import multiprocessing

    telemetry = otlp(rx)
    agent = Agent(
        FakeModel([FakeReply.text("from the parent"), FakeReply.text("again")]),
        telemetry=telemetry,
    )
    await agent.run("hello from the parent")
    assert telemetry.flush(10)  # the parent now has a pooled connection to the receiver
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_run_in_forked_child, args=(telemetry, out))
    child.start()
    assert await asyncio.to_thread(out.get, True, 30) is True
    await asyncio.to_thread(child.join, 30)
    assert child.exitcode == 0
    await agent.run("hello again from the parent")
    assert telemetry.flush(10)
    runs = [s for s in rx.spans if s.name == "invoke_agent agent"]
    assert len(runs) == 3
    assert len({s.trace_id for s in runs}) == 3
    parent, forked, _ = rx.peers
    assert forked != parent, "the child posted on the parent's connection"


async def test_an_unsampled_request_and_a_sampler_saying_no_export_nothing(
    rx: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry import context, trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    telemetry = otlp(rx)
    agent = Agent(
        FakeModel([FakeReply.tool_call("lookup", {"order_id": "A-1"}), FakeReply.text("ok")]),
        tools=[lookup],
        telemetry=telemetry,
    )
    unsampled = NonRecordingSpan(SpanContext(2**100 + 3, 2**60 + 3, True, TraceFlags(0)))
    token = context.attach(trace.set_span_in_context(unsampled))
    try:
        assert (await agent.run("hello")).text == "ok"
    finally:
        context.detach(token)
    assert exported(telemetry, rx) == []

    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    quiet = otlp(rx)
    agent = Agent(FakeModel([FakeReply.text("hi")]), telemetry=quiet)
    assert (await agent.run("hello")).text == "hi"
    assert exported(quiet, rx) == []
    # With no parent and the default sampler, everything is exported.
    await Agent(FakeModel([FakeReply.text("hi")]), telemetry=telemetry).run("hello")
    assert [s.name for s in exported(telemetry, rx)] == ["chat fake", "invoke_agent agent"]
