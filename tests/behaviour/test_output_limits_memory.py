"""Typed output, the model-call limit and per-user memory, whoever runs the graph."""

from __future__ import annotations

import uuid
from typing import Any

from criogen_graph import LimitExceededError
from tests.behaviour.agents import Ticket
from tests.behaviour.conftest import Driver
from tests.behaviour.logs import check_segment, model_inputs, segments, tool_runs


async def test_typed_output(driver: Driver) -> None:
    tid = await driver.new_thread("typed")
    out = await driver.send(tid, "Printer on fire")

    assert out.error is None
    expected: dict[str, Any] = {"title": "Printer on fire", "priority": 2}
    if driver.kind == "thread":
        assert isinstance(out.output, Ticket)
        assert out.output == Ticket(**expected)
    assert out.run["stop_reason"] == "output"
    assert out.run["output"] == expected
    assert (await driver.values(tid))["run"]["output"] == expected


async def test_the_model_call_limit_ends_the_run(driver: Driver) -> None:
    tid = await driver.new_thread("limited")
    out = await driver.send(tid, "Go on forever")

    if driver.kind == "thread":
        assert isinstance(out.error, LimitExceededError)
        assert out.error.limit == "model_calls"
    else:
        assert out.error is None  # the run ends, recorded in the state
    assert out.run["stop_reason"] == "limit"
    assert out.run["error"]["limit"] == "model_calls"
    log = driver.hook_log()
    assert len(model_inputs(log, "limited")) == 2
    assert len(tool_runs(log)) == 2
    (segment,) = segments(log, "limited")
    check_segment(segment, "failed")


async def test_memory_is_kept_per_user(driver: Driver) -> None:
    suffix = uuid.uuid4().hex[:8]
    ada, bob = {"user_id": f"ada-{suffix}"}, {"user_id": f"bob-{suffix}"}

    told = await driver.new_thread("memory")
    out = await driver.send(told, "Remember that my locker code is 4417.", state=ada)
    assert out.error is None
    assert out.text == "Noted."
    (remembered,) = [m for m in out.messages if m["role"] == "tool"]
    assert (remembered["name"], remembered["status"]) == ("remember", "ok")
    mark = len(driver.hook_log())

    asked = await driver.new_thread("memory")
    out = await driver.send(asked, "What do you know about me?", state=ada)
    assert out.text == "I recall: The user says: my locker code is 4417."
    (seen,) = model_inputs(driver.hook_log()[mark:], "memory")
    assert any("4417" in str(m.get("content")) for m in seen if m["role"] == "system")
    mark = len(driver.hook_log())

    other = await driver.new_thread("memory")
    out = await driver.send(other, "What do you know about me?", state=bob)
    assert out.text == "I know nothing about you."
    (seen,) = model_inputs(driver.hook_log()[mark:], "memory")
    assert not any("4417" in str(m.get("content")) for m in seen)
    assert out.values["state"] == bob
