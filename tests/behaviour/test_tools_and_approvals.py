"""Tools and approvals, the same over our API, LangGraph's own savers and `langgraph dev`:
a tool call runs once and its result reaches the model; a gated call stops the run with
the approval interrupt and runs exactly as the reviewer decided; a new message sent
while an approval waits."""

from __future__ import annotations

from typing import Any

from criogen_graph import ThreadSuspendedError
from tests.behaviour.conftest import Driver, Outcome
from tests.behaviour.logs import model_inputs, tool_runs


def _tool_message(messages: list[dict[str, Any]], call_id: str) -> dict[str, Any]:
    (found,) = [m for m in messages if m["role"] == "tool" and m.get("tool_call_id") == call_id]
    return found


async def _pending_transfer(driver: Driver, tid: str) -> tuple[Outcome, dict[str, Any]]:
    """Sends a transfer request; returns the outcome and the one approval request."""
    out = await driver.send(tid, "Please send 5 to bob")
    assert out.error is None, out.error
    interrupt = out.interrupt
    assert interrupt is not None, "the gated call must stop the run with an interrupt"
    assert interrupt["type"] == "approval"
    assert interrupt["agent"] == "approval"
    (request,) = interrupt["requests"]
    assert set(request) == {"call_id", "tool", "args", "description", "allowed"}
    assert request["tool"] == "transfer"
    assert request["args"] == {"to": "bob", "amount": 5}
    assert request["description"] == "Send money"
    assert isinstance(request["call_id"], str) and request["call_id"]
    # The lookup ran before the model asked for the transfer; the transfer waits.
    assert tool_runs(driver.hook_log()) == [("lookup", {"key": "bob"})]
    assert out.run["stop_reason"] is None
    return out, request


async def test_a_tool_call_runs_once_and_its_result_reaches_the_model(driver: Driver) -> None:
    tid = await driver.new_thread("tools")
    out = await driver.send(tid, "Please look up colour")

    assert out.error is None and out.interrupt is None
    assert out.text == "Found: value of colour"
    assert out.run["stop_reason"] == "final_answer"
    log = driver.hook_log()
    assert tool_runs(log) == [("lookup", {"key": "colour"})]
    first, second = model_inputs(log, "tools")
    assert first[-1] == {"role": "user", "content": "Please look up colour"}
    (call,) = [m for m in second if m["role"] == "assistant"][-1]["tool_calls"]
    result = second[-1]
    assert (result["role"], result["tool_call_id"]) == ("tool", call["id"])
    assert (result["status"], result["content"]) == ("ok", "value of colour")

    saved = await driver.messages(tid)
    assert [m["role"] for m in saved] == ["user", "assistant", "tool", "assistant"]
    assert saved[0]["content"] == "Please look up colour"
    assert saved[-1]["content"] == "Found: value of colour"

    # The saved answer is part of the next turn.
    again = await driver.send(tid, "Now look up size")
    assert again.text == "Found: value of size"
    later = model_inputs(driver.hook_log(), "tools")[2]
    assert [
        m["content"] for m in later if m["role"] == "assistant" and not m.get("tool_calls")
    ] == ["Found: value of colour"]
    assert len(await driver.messages(tid)) == 8
    assert tool_runs(driver.hook_log()) == [
        ("lookup", {"key": "colour"}),
        ("lookup", {"key": "size"}),
    ]


async def test_an_edited_call_runs_once_with_the_edited_args(driver: Driver) -> None:
    tid = await driver.new_thread("approval")
    _, request = await _pending_transfer(driver, tid)

    out = await driver.answer(
        tid, {request["call_id"]: {"type": "edit", "args": {"to": "bob", "amount": 7}}}
    )

    assert out.error is None and out.interrupt is None
    assert tool_runs(driver.hook_log()) == [
        ("lookup", {"key": "bob"}),
        ("transfer", {"to": "bob", "amount": 7}),
    ]
    result = _tool_message(out.messages, request["call_id"])
    assert result["status"] == "ok"
    assert "sent 7 to bob" in result["content"]
    assert out.text is not None and out.text.startswith("Done:")
    assert "sent 7 to bob" in out.text
    assert out.run["stop_reason"] == "final_answer"


async def test_an_approved_call_runs_once_as_the_model_wrote_it(driver: Driver) -> None:
    tid = await driver.new_thread("approval")
    _, request = await _pending_transfer(driver, tid)

    out = await driver.answer(tid, "approve")

    assert out.error is None and out.interrupt is None
    assert tool_runs(driver.hook_log()) == [
        ("lookup", {"key": "bob"}),
        ("transfer", {"to": "bob", "amount": 5}),
    ]
    assert _tool_message(out.messages, request["call_id"])["content"] == "sent 5 to bob"
    assert out.text == "Done: sent 5 to bob."


async def test_a_rejected_call_never_runs_and_the_model_sees_the_rejection(
    driver: Driver,
) -> None:
    tid = await driver.new_thread("approval")
    _, request = await _pending_transfer(driver, tid)

    out = await driver.answer(tid, {"type": "reject", "message": "not today"})

    assert out.error is None and out.interrupt is None
    assert tool_runs(driver.hook_log()) == [("lookup", {"key": "bob"})]
    result = _tool_message(out.messages, request["call_id"])
    assert result["status"] == "rejected"
    assert "not today" in result["content"]
    # The model's last input ends with the rejection, and it answered from it.
    last_input = model_inputs(driver.hook_log(), "approval")[-1]
    assert last_input[-1]["tool_call_id"] == request["call_id"]
    assert last_input[-1]["status"] == "rejected"
    assert out.text is not None and out.text.startswith("Not sent:")
    assert "not today" in out.text
    assert out.run["stop_reason"] == "final_answer"


async def test_a_new_message_while_an_approval_waits(driver: Driver) -> None:
    """LangGraph drops the interrupt when a new input comes instead of an answer: the
    held call is answered "Not run" (status `skipped`) and the thread goes on with the
    new message. Our `Thread` API refuses the message instead (`ThreadSuspendedError`,
    README "Approvals") and keeps the approval answerable."""
    tid = await driver.new_thread("approval")
    before, request = await _pending_transfer(driver, tid)

    out = await driver.send(tid, "say hello there")

    if driver.kind == "thread":
        assert isinstance(out.error, ThreadSuspendedError)
        assert out.messages == before.messages
        assert out.interrupt == before.interrupt
        assert tool_runs(driver.hook_log()) == [("lookup", {"key": "bob"})]
        return
    assert out.error is None and out.interrupt is None
    assert out.text == "hello there"
    skipped = _tool_message(out.messages, request["call_id"])
    assert skipped["status"] == "skipped"
    assert skipped["content"].startswith("Not run")
    roles = [(m["role"], m.get("content")) for m in out.messages]
    assert roles.index(("user", "say hello there")) > out.messages.index(skipped)
    assert out.run["stop_reason"] == "final_answer"
    assert tool_runs(driver.hook_log()) == [("lookup", {"key": "bob"})]
    # The model got a transcript in which every call has its answer.
    last_input = model_inputs(driver.hook_log(), "approval")[-1]
    assert skipped in last_input
    assert await driver.messages(tid) == out.messages
