"""The one run-segment runner (issue 19, item 3): `agent.run` and every thread action go
through it, and a segment's outcome is named by one rule wherever it shows (the `on_end`
hooks, the run's span)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import (
    Agent,
    FakeModel,
    FakeReply,
    Hook,
    HookContext,
    LimitExceededError,
    ModelError,
    Telemetry,
    tool,
)
from criogen_graph.results import outcome
from tests.servers.otlp_receiver import OtlpReceiver


@tool
def refund(order_id: str) -> str:
    """Refund an order."""
    return f"refunded {order_id}"


class Watch(Hook):
    def __init__(self) -> None:
        self.outcomes: list[str] = []

    def on_end(self, ctx: HookContext, outcome: str) -> None:
        self.outcomes.append(outcome)


#: Per scenario: the model's replies, the agent's options, what the call raises, and the
#: outcome every observer must name.
SCENARIOS: dict[str, tuple[list[Any], dict[str, Any], type[Exception] | None, str]] = {
    "completed": ([FakeReply.text("hi")], {}, None, "completed"),
    "suspended": (
        [FakeReply.tool_call("refund", {"order_id": "1"})],
        {"approve": ["refund"]},
        None,
        "suspended",
    ),
    "limit": (
        [FakeReply.tool_call("refund", {"order_id": "1"})] * 2,
        {"limits": {"model_calls": 1}},
        LimitExceededError,
        "failed",
    ),
    "error": ([FakeReply.error("auth", "refused")], {}, ModelError, "failed"),
}


@pytest.mark.parametrize("path", ["run", "send", "stream"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_every_path_names_the_same_outcome(
    rx: OtlpReceiver, tmp_path: Path, path: str, scenario: str
) -> None:
    replies, options, raises, expected = SCENARIOS[scenario]
    telemetry = Telemetry.otlp(rx.url)
    rx.users.append(telemetry)
    watch = Watch()
    agent = Agent(
        FakeModel(replies),
        tools=[refund],
        hooks=[watch],
        telemetry=telemetry,
        storage=f"sqlite:///{tmp_path}/t.db",
        **options,
    )
    thread = agent.thread(f"t-{uuid.uuid4().hex}")

    async def call() -> Any:
        if path == "run":
            return await agent.run("go")
        if path == "send":
            return await thread.send("go")
        stream = thread.stream("go")
        async for _ in stream:
            pass
        return await stream.reply()

    try:
        if raises is None:
            result = await call()
            assert result.needs_approval == (expected == "suspended")
        else:
            with pytest.raises(raises):
                await call()
        assert watch.outcomes == [expected]
        assert telemetry.flush(10), "the spans were not exported in time"
        (span,) = [s for s in rx.spans if s.name == "invoke_agent agent"]
        assert span.attributes["criogen.outcome"] == expected
    finally:
        await agent.storage.close()


def test_the_outcome_rule() -> None:
    assert outcome("final_answer") == "completed"
    assert outcome("output") == "completed"
    assert outcome("limit") == "failed"
    assert outcome(None) == "suspended"  # it stopped before the end: it waits
    assert outcome(None, waiting=True) == "suspended"
    assert outcome("final_answer", error=True) == "failed"
    assert outcome(None, waiting=True, error=True) == "failed"
