"""Hooks and their outcomes, whoever runs the graph: `on_start` once per run segment
(a run, and its continuation after an approval answer) before the model is called,
`on_end` once per segment with `completed`, `suspended` or `failed`, and the state
`on_start` saves is what `before_model` and `on_end` see."""

from __future__ import annotations

from criogen_graph import ModelError, ToolExecutionError
from tests.behaviour.conftest import Driver, Outcome
from tests.behaviour.logs import check_hook_state, check_segment, events, segments, tool_runs


def _failed(driver: Driver, out: Outcome, exc_type: type[BaseException]) -> None:
    """The call failed, with the error our API raises (or LangGraph's, or the server's)."""
    assert out.error is not None, "the run must fail"
    if driver.kind != "server":
        assert isinstance(out.error, exc_type), out.error


async def test_hooks_bracket_a_run_and_its_continuation_after_approval(driver: Driver) -> None:
    tid = await driver.new_thread("approval")
    out = await driver.send(tid, "Please send 5 to bob")
    assert out.interrupt is not None
    (first,) = segments(driver.hook_log(), "approval")
    check_segment(first, "suspended")
    check_hook_state(first)
    # on_start sees the new user message at the end of the transcript, before any model
    # call; the lookup went through before_tool.
    last = first[0]["last"]
    assert (last["role"], last["content"]) == ("user", "Please send 5 to bob")
    kinds = events(first)
    assert kinds.index("on_start") < kinds.index("before_model") < kinds.index("model")
    assert [(r["tool"], r["args"]) for r in first if r["event"] == "before_tool"] == [
        ("lookup", {"key": "bob"})
    ]

    (request,) = out.interrupt["requests"]
    out = await driver.answer(tid, "approve")
    assert out.error is None and out.interrupt is None
    first_again, second = segments(driver.hook_log(), "approval")
    assert first_again == first
    check_segment(second, "completed")
    check_hook_state(second)
    assert second[0]["token"] != first[0]["token"]
    kinds = events(second)
    assert "before_model" not in kinds[: kinds.index("before_tool")]
    assert [
        (r["call_id"], r["tool"], r["args"]) for r in second if r["event"] == "before_tool"
    ] == [(request["call_id"], "transfer", {"to": "bob", "amount": 5})]
    assert kinds.index("before_tool") < kinds.index("tool") < kinds.index("model")


async def test_a_plain_run_is_one_completed_segment(driver: Driver) -> None:
    tid = await driver.new_thread("tools")
    await driver.send(tid, "Please look up colour")
    await driver.send(tid, "Now look up size")

    first, second = segments(driver.hook_log(), "tools")
    for segment, text in ((first, "Please look up colour"), (second, "Now look up size")):
        check_segment(segment, "completed")
        check_hook_state(segment)
        assert segment[0]["last"]["content"] == text
        assert events(segment).count("before_model") == 2
    # What on_start saved in the earlier run is still there when the next one starts.
    assert second[0]["previous"] == {"token": first[0]["token"]}


async def test_a_tool_that_fails_the_run_ends_its_segment_failed(driver: Driver) -> None:
    tid = await driver.new_thread("failing")
    out = await driver.send(tid, "explode")

    _failed(driver, out, ToolExecutionError)
    (segment,) = segments(driver.hook_log(), "failing")
    check_segment(segment, "failed")
    assert tool_runs(segment) == [("explode", {"reason": "asked to"})]
    assert events(segment).count("model") == 1


async def test_a_model_error_ends_its_segment_failed(driver: Driver) -> None:
    tid = await driver.new_thread("failing")
    out = await driver.send(tid, "break the model")

    _failed(driver, out, ModelError)
    (segment,) = segments(driver.hook_log(), "failing")
    check_segment(segment, "failed")
    assert events(segment).count("model") == 1
    assert segment[0]["last"]["content"] == "break the model"


async def test_on_end_of_a_failed_run_sees_what_its_on_start_saved(driver: Driver) -> None:
    for text in ("explode", "break the model"):
        tid = await driver.new_thread("failing")
        out = await driver.send(tid, text)
        assert out.error is not None
    tool_failed, model_failed = segments(driver.hook_log(), "failing")
    for segment in (tool_failed, model_failed):
        check_segment(segment, "failed")
        check_hook_state(segment)
