"""Tool results that cannot be written as JSON (issue 15, item 12).

A tool (or an `after_tool` hook, or the redactor on its way) hands over a value the model
cannot be shown as JSON: a dict that contains itself, 50,000 levels of nesting, an object
whose `__str__` raises. The call ran, so it is finished: the failure goes through
`on_tool_exception` like a tool's own error, is saved, and `retry()` never runs the tool
again. NaN and infinities are written as `null` (as JavaScript's `JSON.stringify` does),
so what a provider receives is always valid JSON.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import (
    Agent,
    FakeModel,
    FakeReply,
    FunctionModel,
    Redactor,
    Storage,
    ToolCall,
    ToolContext,
    ToolExecutionError,
    ValidationError,
    openai,
    tool,
)
from tests.conftest import storage_url
from tests.reliability._report import report
from tests.servers import openai_server as oa


class BadStr:
    def __str__(self) -> str:
        raise RuntimeError("no text for you")

    __repr__ = __str__


def cyclic() -> Any:
    d: dict[str, Any] = {"order": "A-1"}
    d["self"] = d
    return d


def deep() -> Any:
    root: list[Any] = []
    cur = root
    for _ in range(50_000):
        nxt: list[Any] = []
        cur.append(nxt)
        cur = nxt
    return root


VALUES = {
    "cycle": (cyclic, "contains itself"),
    "deep": (deep, "nested too deep"),
    "bad_str": (lambda: {"thing": BadStr()}, "no text for you"),
    "nan": (lambda: {"price": math.nan, "range": [-math.inf, math.inf]}, None),
}
NAN_JSON = '{"price": null, "range": [null, null]}'


def strict_json(text: str | bytes) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("source", ["tool", "redacted", "after_tool"])
@pytest.mark.parametrize("policy", ["return_to_model", "return_generic", "fail"])
@pytest.mark.parametrize("kind", list(VALUES))
async def test_an_unserialisable_result_is_a_finished_call(
    kind: str, policy: str, source: str, backend: str, tmp_path: Path, thread_id: str
) -> None:
    make, reason = VALUES[kind]
    runs: Counter[str] = Counter()
    shown: list[list[dict[str, Any]]] = []

    @tool
    def report_tool(ctx: ToolContext) -> Any:
        """Produce a report."""
        runs[ctx.call_id] += 1
        return "plain text" if source == "after_tool" else make()

    class Replace:
        def after_tool(self, call: ToolCall, result: Any) -> Any:
            return make()

    def model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        shown.append(messages)
        if messages[-1]["role"] == "user":
            return FakeReply.tool_call("report_tool", {}, id="c1")
        return "done"

    async with Storage(storage_url(backend, tmp_path)) as storage:
        agent = Agent(
            FunctionModel(model),
            tools=[report_tool],
            on_tool_exception=policy,
            hooks=[Replace()] if source == "after_tool" else [],
            redact=Redactor(patterns={"SECRET": "[x]"}) if source == "redacted" else None,
            storage=storage,
        )
        thread = agent.thread(thread_id)
        failed = reason is not None and policy == "fail"
        if failed:
            with pytest.raises(ToolExecutionError) as info:
                await thread.send("go")
            assert info.value.call_id == "c1" and reason in str(info.value)
            reply = await thread.retry()
        else:
            reply = await thread.send("go")
            with pytest.raises(ValidationError) as nothing:
                await thread.retry()
            assert nothing.value.code == "nothing_to_retry"
        assert reply.text == "done"
        [result] = [m for m in await thread.messages() if m["role"] == "tool"]
        audit = [r for r in await storage.audit(thread_id) if r["action"] == "tool_call"]

    assert runs == Counter({"c1": 1})  # ran once, across send and retry
    assert [r["details"]["call_id"] for r in audit] == ["c1"]
    if reason is None:
        assert (result["status"], result["content"]) == ("ok", NAN_JSON)
        strict_json(result["content"])
    else:
        assert result["status"] == "error"
        if policy == "return_generic":
            assert result["content"] == "Error: the tool report_tool failed."
            assert reason in result["artifact"]["error"]
        else:
            assert result["content"].startswith("Error: ") and reason in result["content"]
    # The model was shown the saved result.
    assert shown[-1][-1] == result
    report(
        f"unserialisable_{kind}_{policy}_{source}_{backend}",
        tool_runs=sum(runs.values()),
        failed_sends=int(failed),
        status=result["status"],
    )


async def test_a_provider_only_ever_receives_valid_json(
    openai_server: oa.OpenAIServer, tmp_path: Path, thread_id: str
) -> None:
    """Over real HTTP, to an OpenAI-compatible server: a tool that returns NaN, one that
    returns a cycle, and a sub-agent whose typed output holds NaN."""
    sub = Agent(
        FakeModel(['{"score": NaN, "label": "x"}']),
        output={"type": "object", "properties": {"score": {"type": "number"}}},
    )

    @tool
    def prices() -> Any:
        """Prices."""
        return {"price": math.nan, "range": [-math.inf, math.inf]}

    @tool
    def loop() -> Any:
        """A cycle."""
        return cyclic()

    openai_server.add(
        oa.tool_calls(("prices", {}), ("loop", {}), ("scorer", {"input": "score it"})),
        oa.text("done"),
    )
    model = openai("m", base_url=openai_server.base_url, api_key="k")
    async with Storage(storage_url("sqlite", tmp_path)) as storage:
        agent = Agent(
            model, tools=[prices, loop, sub.as_tool("scorer", "Scores things.")], storage=storage
        )
        reply = await agent.thread(thread_id).send("go")
    assert reply.text == "done"
    bodies = [strict_json(raw) for raw in openai_server.raw]
    results = [m for m in bodies[1]["messages"] if m["role"] == "tool"]
    assert strict_json(results[0]["content"]) == {"price": None, "range": [None, None]}
    assert (
        results[1]["content"].startswith("Error: ") and "contains itself" in results[1]["content"]
    )
    assert strict_json(results[2]["content"]) == {"score": None, "label": "x"}
    report("unserialisable_provider_wire", requests=len(bodies), invalid_json_bodies=0)
