"""The one run-segment runner (issue 19, item 3): `agent.run` and every thread action go
through it, and a segment's outcome is named by one rule wherever it shows (the `on_end`
hooks, the run's span)."""

from __future__ import annotations

import ast
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import criogen_graph
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


@pytest.fixture
def rx() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver
        for telemetry in receiver.users:
            telemetry.shutdown()


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


PACKAGE = Path(criogen_graph.__file__).parent


def _is_module(package: str, name: str) -> bool:
    folder = PACKAGE.parent.joinpath(*package.split("."))
    return (folder / f"{name}.py").exists() or (folder / name / "__init__.py").exists()


def _private_imports() -> list[str]:
    found: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(
                "criogen_graph"
            ):
                continue
            module = node.module or ""
            found.extend(
                f"{path.relative_to(PACKAGE)}:{node.lineno} {module} {a.name}"
                for a in node.names
                if a.name.startswith("_")
                and not a.name.startswith("__")
                and not _is_module(module, a.name)
            )
    return found


def test_no_module_imports_another_modules_private_name() -> None:
    # Private modules (`criogen_graph._runner`) are the package's own; a `_name` inside
    # another module is not.
    assert _private_imports() == []


@pytest.mark.parametrize("module", ["thread.py", "_runner.py", "background.py"])
def test_the_runner_and_threads_reach_no_private_attribute(module: str) -> None:
    reaches = [
        f"{module}:{node.lineno} {ast.unparse(node)}"
        for node in ast.walk(ast.parse((PACKAGE / module).read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    ]
    assert reaches == []
