"""Around each run segment: the redactor in context (for the library's log records) and
the run's span. Nothing at all when the agent has neither telemetry nor a redactor."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from langgraph.errors import GraphBubbleUp

from criogen_graph.redact import CURRENT, effective
from criogen_graph.results import outcome
from criogen_graph.telemetry import SPANS

if TYPE_CHECKING:
    from criogen_graph.graph.spec import AgentSpec


class RunSpan:
    """The open span of a run segment (or nothing): `done(result)` records the outcome.
    (The segment itself is `runtime.segment.Segment`.)"""

    __slots__ = ("span", "spans")

    def __init__(self, spans: Any, span: Any) -> None:
        self.spans = spans
        self.span = span

    def done(self, result: Any) -> None:
        if self.span is None:
            return
        self.spans.set(
            self.span,
            {
                "criogen.outcome": outcome(result.stop_reason, waiting=result.needs_approval),
                "criogen.stop_reason": result.stop_reason,
                "criogen.run_id": result.run_id,
                "gen_ai.usage.input_tokens": result.usage.get("input_tokens", 0),
                "gen_ai.usage.output_tokens": result.usage.get("output_tokens", 0),
                "criogen.model_calls": result.model_calls,
                "criogen.tool_calls": result.tool_calls,
            },
        )
        if result.needs_approval:
            self.spans.event(
                self.span,
                "criogen.approval_requested",
                {
                    "criogen.approval.tools": [a.tool for a in result.approvals],
                    "criogen.approval.call_ids": [a.call_id for a in result.approvals],
                },
            )

    def decided(self, decisions: list[dict[str, Any]]) -> None:
        if self.span is None:
            return
        self.spans.event(
            self.span,
            "criogen.approval_decided",
            {
                "criogen.approval.call_ids": [d["call_id"] for d in decisions],
                "criogen.approval.decisions": [d["decision"]["type"] for d in decisions],
            },
        )


_NOTHING = RunSpan(None, None)


@contextlib.contextmanager
def observe(
    spec: AgentSpec,
    *,
    action: str,
    run_id: str,
    thread_id: str | None = None,
    actor: str | None = None,
) -> Iterator[RunSpan]:
    outer_spans = SPANS.get()
    outer_redactor = CURRENT.get()
    if spec.spans is None and spec.redact is None and outer_spans is None:
        yield _NOTHING  # the fast path: nothing to observe (or the caller's policy holds)
        return
    spans = spec.spans or outer_spans
    redactor = effective(spec.redact)
    token = CURRENT.set(redactor) if redactor is not outer_redactor else None
    spans_token = SPANS.set(spans) if spans is not outer_spans else None
    try:
        if spans is None:
            yield _NOTHING
            return
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": spec.name,
            "gen_ai.conversation.id": thread_id,
            "criogen.action": action,
            "criogen.run_id": run_id,
            "criogen.actor": actor,
        }
        with spans.span(f"invoke_agent {spec.name}", attributes) as span:
            segment = RunSpan(spans, span)
            try:
                yield segment
            except GraphBubbleUp:
                spans.set(span, {"criogen.outcome": outcome(None, waiting=True)})
                raise
            except BaseException:
                spans.set(span, {"criogen.outcome": outcome(None, error=True)})
                raise
    finally:
        if spans_token is not None:
            SPANS.reset(spans_token)
        if token is not None:
            CURRENT.reset(token)


def run_redactor(spec: AgentSpec) -> Any:
    """The redaction policy in force for a node of `spec`'s graph."""
    return CURRENT.get() or spec.redact


def run_spans(spec: AgentSpec) -> Any:
    """The spans a node of `spec`'s graph reports into (None: no telemetry)."""
    return spec.spans or SPANS.get()
