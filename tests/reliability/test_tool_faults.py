"""Tool faults under each `on_tool_exception` policy, on a durable thread.

One model reply calls seven tools at once, one per behaviour: an async tool that hangs
(stopped by `Limits.tool_timeout_secs`), one that hangs past its own `timeout_secs`, one
that raises, one that raises `ToolError`, one that is slow but within the timeout, a sync
tool that blocks its worker thread, and a `read_only` tool that fails twice and then
succeeds under `tool_retry`. For each policy the test checks what the model sees, each
tool message's status, that a hung tool is really cancelled (its `finally` runs), that
no finished call runs twice, and, for `"fail"`, that `ToolExecutionError` is raised, the
failed run is saved and `retry()` finishes it.

Timeouts are fractions of a second; no test sleeps to wait for state (the slow tool
sleeps inside itself, and the raising tool waits on an event until the quick tools are
done, so what has finished when it raises is always the same).
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import (
    Agent,
    FakeReply,
    FunctionModel,
    Limits,
    Retry,
    Storage,
    Tool,
    ToolContext,
    ToolError,
    ToolExecutionError,
    tool,
)
from tests.conftest import storage_url
from tests.reliability._report import report

AGENT_TIMEOUT = 0.4
OWN_TIMEOUT = 0.25

# call id -> tool name, in call order (the order of the model's reply)
CALLS = {
    "c-hang": "hang",
    "c-hang-own": "hang_own_timeout",
    "c-raise": "raises",
    "c-tool-error": "tool_error",
    "c-slow": "slow_ok",
    "c-sync": "sync_block",
    "c-flaky": "flaky_read",
}
QUICK = ("c-tool-error", "c-slow", "c-flaky")  # finish before the raising tool raises
HUNG = ("c-hang", "c-hang-own")


class Faults:
    """The seven tools of the matrix, and what they did."""

    def __init__(self) -> None:
        self.starts: Counter[str] = Counter()  # call id -> times its tool function began
        self.returned: Counter[str] = Counter()  # call id -> times it returned a value
        self.cancelled: list[str] = []  # hung calls whose `finally` ran after a cancel
        self.flaky_attempts: Counter[str] = Counter()
        self.disk_full = True
        self.never = asyncio.Event()
        self.quick_done = asyncio.Event()
        self._quick: set[str] = set()
        self.unblock = threading.Event()  # frees the blocked sync tool's worker threads

    def _quick_finished(self, call_id: str) -> None:
        self._quick.add(call_id)
        if self._quick >= set(QUICK):
            self.quick_done.set()

    async def _hang(self, ctx: ToolContext) -> str:
        self.starts[ctx.call_id] += 1
        try:
            await self.never.wait()
        finally:
            self.cancelled.append(ctx.call_id)
        return "unreachable"

    def tools(self) -> list[Tool]:
        faults = self

        @tool
        async def hang(ctx: ToolContext) -> str:
            """Never returns: bounded by the agent's tool timeout."""
            return await faults._hang(ctx)

        @tool(timeout_secs=OWN_TIMEOUT)
        async def hang_own_timeout(ctx: ToolContext) -> str:
            """Never returns: bounded by its own timeout."""
            return await faults._hang(ctx)

        @tool
        async def raises(ctx: ToolContext) -> str:
            """Raises while the disk is full."""
            faults.starts[ctx.call_id] += 1
            await faults.quick_done.wait()
            if faults.disk_full:
                raise ValueError("disk full")
            faults.returned[ctx.call_id] += 1
            return "written"

        @tool
        async def tool_error(ctx: ToolContext) -> str:
            """Refuses with a message for the model."""
            faults.starts[ctx.call_id] += 1
            faults._quick_finished(ctx.call_id)
            raise ToolError("No order B-7")

        @tool
        async def slow_ok(ctx: ToolContext) -> str:
            """Slow, but well within the timeout."""
            faults.starts[ctx.call_id] += 1
            await asyncio.sleep(0.05)
            faults.returned[ctx.call_id] += 1
            faults._quick_finished(ctx.call_id)
            return "slow but fine"

        @tool
        def sync_block(ctx: ToolContext) -> str:
            """Blocks its worker thread (a sync tool cannot be interrupted)."""
            faults.starts[ctx.call_id] += 1
            faults.unblock.wait()
            return "unblocked"

        @tool(read_only=True)
        async def flaky_read(ctx: ToolContext) -> str:
            """Fails twice, then works (retried: it is read-only)."""
            faults.flaky_attempts[ctx.call_id] += 1
            if faults.flaky_attempts[ctx.call_id] == 1:
                faults.starts[ctx.call_id] += 1
            if faults.flaky_attempts[ctx.call_id] < 3:
                raise ConnectionError("blip")
            faults.returned[ctx.call_id] += 1
            faults._quick_finished(ctx.call_id)
            return "read ok"

        return [hang, hang_own_timeout, raises, tool_error, slow_ok, sync_block, flaky_read]


class Model:
    """Calls the seven tools in one reply, then answers; records what it is shown."""

    def __init__(self) -> None:
        self.inputs: list[list[dict[str, Any]]] = []

    def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        self.inputs.append(messages)
        if messages[-1]["role"] == "user":
            return FakeReply.tool_calls(
                *({"id": call_id, "name": name, "args": {}} for call_id, name in CALLS.items())
            )
        return "done"

    def tool_results(self) -> dict[str, dict[str, Any]]:
        """The tool messages of the model's last input, by call id (in call order)."""
        last = self.inputs[-1]
        return {m["tool_call_id"]: m for m in last if m["role"] == "tool"}


@pytest.fixture
async def faults() -> AsyncIterator[Faults]:
    # Async, so its teardown runs before the event loop closes (which joins the default
    # executor's threads): the blocked sync tool's worker threads must end first.
    f = Faults()
    yield f
    f.unblock.set()


def make_agent(faults: Faults, model: Model, storage: Storage, policy: str) -> Agent[Any]:
    return Agent(
        FunctionModel(model),
        tools=faults.tools(),
        on_tool_exception=policy,
        limits=Limits(tool_timeout_secs=AGENT_TIMEOUT),
        tool_retry=Retry(max_attempts=3, initial_backoff_secs=0, jitter=False),
        storage=storage,
    )


EXPECTED_COMMON = {
    "c-hang": ("timeout", f"Error: the tool hang timed out after {AGENT_TIMEOUT:g} s."),
    "c-hang-own": (
        "timeout",
        f"Error: the tool hang_own_timeout timed out after {OWN_TIMEOUT:g} s.",
    ),
    "c-tool-error": ("error", "Error: No order B-7"),  # ToolError: always to the model
    "c-slow": ("ok", "slow but fine"),
    "c-sync": ("timeout", f"Error: the tool sync_block timed out after {AGENT_TIMEOUT:g} s."),
    "c-flaky": ("ok", "read ok"),
}
EXPECTED_RAISE = {
    "return_to_model": ("error", "Error: ValueError: disk full"),
    "return_generic": ("error", "Error: the tool raises failed."),
}


async def audit_statuses(storage: Storage, thread_id: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in await storage.audit(thread_id):
        if r["action"] == "tool_call":
            out.setdefault(r["details"]["call_id"], []).append(r["details"]["status"])
    return out


@pytest.mark.parametrize("policy", ["return_to_model", "return_generic"])
async def test_every_fault_goes_back_to_the_model(
    policy: str, durable_backend: str, tmp_path: Path, thread_id: str, faults: Faults
) -> None:
    model = Model()
    async with Storage(storage_url(durable_backend, tmp_path)) as storage:
        thread = make_agent(faults, model, storage, policy).thread(thread_id)
        reply = await thread.send("go")
        assert reply.stop_reason == "final_answer" and reply.text == "done"
        assert reply.tool_calls == len(CALLS)

        # What the model saw: every result of the reply, in call order.
        seen = model.tool_results()
        assert list(seen) == list(CALLS)
        expected = {**EXPECTED_COMMON, "c-raise": EXPECTED_RAISE[policy]}
        assert {c: (m["status"], m["content"]) for c, m in seen.items()} == expected
        if policy == "return_generic":
            assert seen["c-raise"]["artifact"] == {"error": "ValueError: disk full"}
            assert "disk full" not in seen["c-raise"]["content"]
        else:
            assert "artifact" not in seen["c-raise"]

        # Saved: the thread holds the same tool messages, one audit record per call.
        saved = {m["tool_call_id"]: m["status"] for m in await thread.messages() if "status" in m}
        assert saved == {c: s for c, (s, _) in expected.items()}
        audit = await audit_statuses(storage, thread_id)
        assert audit == {c: [s] for c, (s, _) in expected.items()}

    # Hung async tools were cancelled: their `finally` ran before send() returned.
    assert sorted(faults.cancelled) == sorted(HUNG)
    # Nothing ran twice; the flaky read took three attempts within one call.
    assert faults.starts == Counter(dict.fromkeys(CALLS, 1))
    assert faults.flaky_attempts == Counter({"c-flaky": 3})
    report(
        f"tool_faults_{policy}_{durable_backend}",
        calls=len(CALLS),
        timeouts=sum(s == "timeout" for s, _ in expected.values()),
        errors=sum(s == "error" for s, _ in expected.values()),
        ok=sum(s == "ok" for s, _ in expected.values()),
        hung_tools_cancelled=len(faults.cancelled),
        run_twice=sum(n > 1 for n in faults.starts.values()),
    )


async def test_fail_policy_saves_the_run_and_retry_finishes_it(
    durable_backend: str, tmp_path: Path, thread_id: str, faults: Faults
) -> None:
    model = Model()
    async with Storage(storage_url(durable_backend, tmp_path)) as storage:
        agent = make_agent(faults, model, storage, "fail")
        thread = agent.thread(thread_id, actor="ops")
        with pytest.raises(ToolExecutionError) as info:
            await thread.send("go")
        assert info.value.tool == "raises" and info.value.call_id == "c-raise"
        assert isinstance(info.value.__cause__, ValueError)
        assert "disk full" in str(info.value)

        # The failed run is saved: the user message and the reply with its calls; the
        # quick calls' results are kept (as pending writes) for the retry.
        saved = await thread.messages()
        assert [m["role"] for m in saved[:2]] == ["user", "assistant"]
        assert [c["id"] for c in saved[1]["tool_calls"]] == list(CALLS)
        actions = [r["action"] for r in await storage.audit(thread_id)]
        assert actions[0] == "send" and "run_failed" in actions
        failed = next(r for r in await storage.audit(thread_id) if r["action"] == "run_failed")
        assert failed["details"]["error"] == "ToolExecutionError"
        # What finished before the failure is exactly what was saved (one audit record
        # per call, written with its result): the quick calls at least. The calls in
        # flight (the hung ones, unless they timed out first) were cancelled; their
        # `finally` ran.
        finished = set(await audit_statuses(storage, thread_id))
        assert set(QUICK) <= finished and "c-raise" not in finished
        assert set(faults.cancelled) == set(HUNG) - finished
        assert faults.starts == Counter(dict.fromkeys(CALLS, 1))

        faults.disk_full = False  # the operator fixes the disk
        done = await thread.retry()

        assert done.stop_reason == "final_answer" and done.text == "done"
        seen = model.tool_results()
        assert list(seen) == list(CALLS)
        expected = {**EXPECTED_COMMON, "c-raise": ("ok", "written")}
        assert {c: (m["status"], m["content"]) for c, m in seen.items()} == expected
        assert [m["tool_call_id"] for m in await thread.messages() if m["role"] == "tool"] == (
            list(CALLS)
        )
        audit = await audit_statuses(storage, thread_id)
        assert audit == {c: [s] for c, (s, _) in expected.items()}
        assert "retry" in [r["action"] for r in await storage.audit(thread_id)]

    # Calls that finished before the failure did not run again; the others ran once more.
    assert {c for c in CALLS if faults.starts[c] > 1} == set(CALLS) - finished
    assert max(faults.starts.values()) <= 2
    assert faults.flaky_attempts == Counter({"c-flaky": 3})
    # Every hung call was cancelled exactly once per time it ran.
    assert Counter(faults.cancelled) == Counter({c: faults.starts[c] for c in HUNG})
    report(
        f"tool_faults_fail_{durable_backend}",
        calls=len(CALLS),
        finished_before_failure=len(finished),
        finished_calls_rerun=sum(faults.starts[c] > 1 for c in finished),
        unfinished_calls_rerun=len(set(CALLS) - finished),
        hung_tools_cancelled=len(faults.cancelled),
    )


async def test_a_run_failed_by_a_tool_is_failed_in_history(
    tmp_path: Path, thread_id: str, faults: Faults
) -> None:
    async with Storage(storage_url("sqlite", tmp_path)) as storage:
        thread = make_agent(faults, Model(), storage, "fail").thread(thread_id)
        with pytest.raises(ToolExecutionError):
            await thread.send("go")
        assert (await thread.history(limit=1))[0]["status"] == "failed"
