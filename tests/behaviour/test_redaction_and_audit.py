"""What is kept: the stored input is redacted (and the model gets the redacted text), and
each run leaves audit records, readable with one call per way of running the graph."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.behaviour.conftest import Driver
from tests.behaviour.logs import model_inputs

EMAIL = "ada.lovelace@example.com"
CARD = "4111 1111 1111 1111"
SECRET_INPUT = f"Mail me at {EMAIL}, card {CARD}, thanks."
REDACTED_INPUT = "Mail me at [EMAIL], card [CARD], thanks."
RECORD_KEYS = {"ts_ms", "thread_id", "run_id", "actor", "action", "details"}


def _leaks(value: Any) -> list[str]:
    text = json.dumps(value, default=repr)
    return [raw for raw in (EMAIL, CARD, CARD.replace(" ", "")) if raw in text]


async def test_the_stored_input_and_the_model_input_are_redacted(driver: Driver) -> None:
    tid = await driver.new_thread("redacting")
    out = await driver.send(tid, SECRET_INPUT)

    assert out.error is None
    saved = await driver.messages(tid)
    assert (saved[0]["role"], saved[0]["content"]) == ("user", REDACTED_INPUT)
    assert _leaks(saved) == []
    assert _leaks(await driver.values(tid)) == []
    (seen,) = model_inputs(driver.hook_log(), "redacting")
    assert seen[-1]["content"] == REDACTED_INPUT
    assert out.text == f"You said: {REDACTED_INPUT}"
    # Hooks see only the redacted text too.
    assert _leaks(driver.hook_log()) == []


def _actions(records: list[dict[str, Any]]) -> list[str]:
    return [r["action"] for r in records]


async def _approval_thread(driver: Driver, answer: Any) -> tuple[str, str, list[dict[str, Any]]]:
    """A transfer asked, answered with `answer` (a function of the request); returns the
    thread, the gated call's id and the audit records."""
    tid = await driver.new_thread("approval")
    out = await driver.send(tid, "Please send 5 to bob")
    assert out.interrupt is not None
    (request,) = out.interrupt["requests"]
    done = await driver.answer(tid, answer(request))
    assert done.error is None and done.interrupt is None
    records = await driver.audit(tid)
    for r in records:
        assert set(r) >= RECORD_KEYS, r
        assert r["thread_id"] == tid
    return tid, request["call_id"], records


def _lookup_call_id(messages: list[dict[str, Any]]) -> str:
    (lookup,) = [m for m in messages if m["role"] == "tool" and m["name"] == "lookup"]
    call_id: str = lookup["tool_call_id"]
    return call_id


def _decision(records: list[dict[str, Any]], action: str, call_id: str) -> dict[str, Any]:
    """The one decision the `action` record holds: who decided what on which call, with
    the call's original args (README "Approvals": the original args and a SHA-256 of the
    approved ones go to the audit trail)."""
    (details,) = (r["details"] for r in records if r["action"] == action)
    (decision,) = details["decisions"]
    assert decision["call_id"] == call_id
    assert (decision["tool"], decision["args"]) == ("transfer", {"to": "bob", "amount": 5})
    assert "approved_args_sha256" in decision
    found: dict[str, Any] = decision
    return found


async def test_audit_of_a_send_a_tool_call_and_an_edit(driver: Driver) -> None:
    tid, call_id, records = await _approval_thread(
        driver,
        lambda request: {request["call_id"]: {"type": "edit", "args": {"to": "bob", "amount": 7}}},
    )

    assert _actions(records) == ["send", "tool_call", "decide", "tool_call"]
    lookup, transfer = (r["details"] for r in records if r["action"] == "tool_call")
    assert (lookup["tool"], lookup["call_id"]) == (
        "lookup",
        _lookup_call_id(await driver.messages(tid)),
    )
    assert (transfer["tool"], transfer["call_id"], transfer["status"]) == (
        "transfer",
        call_id,
        "ok",
    )
    decision = _decision(records, "decide", call_id)
    assert decision["decision"] == {"type": "edit", "args": {"to": "bob", "amount": 7}}
    assert re.fullmatch(r"[0-9a-f]{64}", decision["approved_args_sha256"])


async def test_audit_of_an_approval(driver: Driver) -> None:
    _, call_id, records = await _approval_thread(driver, lambda request: "approve")

    assert _actions(records) == ["send", "tool_call", "approve", "tool_call"]
    decision = _decision(records, "approve", call_id)
    assert re.fullmatch(r"[0-9a-f]{64}", decision["approved_args_sha256"])
    transfer = records[-1]["details"]
    assert (transfer["tool"], transfer["call_id"], transfer["status"]) == (
        "transfer",
        call_id,
        "ok",
    )


async def test_audit_of_a_rejection(driver: Driver) -> None:
    _, call_id, records = await _approval_thread(
        driver, lambda request: {"type": "reject", "message": "not today"}
    )

    assert _actions(records) == ["send", "tool_call", "reject", "tool_call"]
    decision = _decision(records, "reject", call_id)
    assert decision["decision"] == {"type": "reject", "message": "not today"}
    assert decision["approved_args_sha256"] is None  # nothing was approved
    transfer = records[-1]["details"]
    assert (transfer["tool"], transfer["call_id"], transfer["status"]) == (
        "transfer",
        call_id,
        "rejected",
    )


async def test_audit_of_a_failed_run(driver: Driver) -> None:
    tid = await driver.new_thread("failing")
    out = await driver.send(tid, "explode")
    assert out.error is not None

    records = await driver.audit(tid)
    assert _actions(records) == ["send", "run_failed"]
    assert records[-1]["details"]["error"] == "ToolExecutionError"
    assert "exploded: asked to" in records[-1]["details"]["message"]


async def test_audit_records_are_redacted(driver: Driver) -> None:
    tid = await driver.new_thread("redacting")
    await driver.send(tid, SECRET_INPUT)

    records = await driver.audit(tid)
    assert _actions(records) == ["send"]
    assert _leaks(records) == []
