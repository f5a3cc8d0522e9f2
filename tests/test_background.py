"""Background runs with the in-process worker (memory:// and SQLite): the same API as on
PostgreSQL (tests/test_background_pg.py), no server needed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import (
    Agent,
    FakeModel,
    FakeReply,
    RunFailedError,
    Storage,
    ValidationError,
    get_run,
    list_runs,
    tool,
)


def _url(kind: str, tmp_path: Path) -> str:
    return "memory://" if kind == "memory" else f"sqlite:///{tmp_path}/bg.db"


@pytest.fixture(params=["memory", "sqlite"])
async def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    s = Storage(_url(request.param, tmp_path))
    yield s
    await s.close()


async def test_submit_returns_at_once_and_reply_is_the_send_reply(storage: Storage) -> None:
    gate = asyncio.Event()

    @tool
    async def lookup(order_id: str) -> str:
        """Look up an order."""
        await gate.wait()
        return f"{order_id} shipped"

    agent = Agent(
        FakeModel([FakeReply.tool_call("lookup", {"order_id": "A-1"}), "It shipped."]),
        tools=[lookup],
        storage=storage,
    )
    thread = agent.thread("t-1", actor="ada")
    handle = await thread.submit("Where is A-1?")
    # The tool waits on the gate: submit returned before the run could finish.
    assert (await handle.status()).status in ("queued", "running")
    gate.set()
    reply = await handle.reply()
    assert reply.text == "It shipped."
    assert reply.tool_calls == 1
    info = await handle.status()
    assert info.status == "succeeded"
    assert info.attempts == 1
    assert info.run_id == reply.run_id == handle.id
    assert info.checkpoint_id == reply.checkpoint_id
    assert [m["role"] for m in await thread.messages()] == [
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    # A handle got back from the id reads the same run.
    again = thread.run(handle.id)
    assert (await again.reply()).text == "It shipped."


async def test_two_submits_on_one_thread_run_in_order_never_together(storage: Storage) -> None:
    log: list[str] = []
    first_inside = asyncio.Event()
    release = asyncio.Event()

    @tool
    async def step(n: int) -> int:
        """A step."""
        log.append(f"start {n}")
        if n == 1:
            first_inside.set()
            await release.wait()
        log.append(f"end {n}")
        return n

    agent = Agent(
        FakeModel(
            [
                FakeReply.tool_call("step", {"n": 1}),
                "one",
                FakeReply.tool_call("step", {"n": 2}),
                "two",
            ]
        ),
        tools=[step],
        storage=storage,
    )
    thread = agent.thread("ordered")
    h1 = await thread.submit("first")
    h2 = await thread.submit("second")
    await first_inside.wait()
    assert (await h2.status()).status == "queued"
    release.set()
    assert (await h2.reply()).text == "two"
    assert (await h1.reply()).text == "one"
    assert log == ["start 1", "end 1", "start 2", "end 2"]
    texts = [m.get("content") for m in await thread.messages() if m["role"] == "user"]
    assert texts == ["first", "second"]


async def test_approval_submitted_in_the_background(storage: Storage) -> None:
    ran: list[str] = []

    @tool
    async def refund(order_id: str) -> str:
        """Refund."""
        ran.append(order_id)
        return "refunded"

    agent = Agent(
        FakeModel([FakeReply.tool_call("refund", {"order_id": "A-1"}), "Done."]),
        tools=[refund],
        approve=["refund"],
        storage=storage,
    )
    thread = agent.thread("appr")
    with pytest.raises(ValidationError) as exc:
        await thread.submit_approve()  # nothing waits yet: refused at once
    assert exc.value.code == "not_suspended"
    reply = await (await thread.submit("refund A-1")).reply()
    assert reply.needs_approval and ran == []
    done = await (await thread.submit_approve(expected=reply)).reply()
    assert done.text == "Done." and ran == ["A-1"]
    # The same pin again is stale: the run moved on; the error is on the handle.
    late = await thread.submit_approve(expected=reply)
    with pytest.raises(RunFailedError) as failed:
        await late.reply()
    assert failed.value.code == "stale"
    assert ran == ["A-1"]


async def test_reject_and_decide_in_the_background(storage: Storage) -> None:
    @tool
    async def refund(order_id: str) -> str:
        """Refund."""
        return "refunded"

    agent = Agent(
        FakeModel(
            [
                FakeReply.tool_call("refund", {"order_id": "A-1"}),
                "Not refunded.",
                FakeReply.tool_call("refund", {"order_id": "B-2"}, id="c2"),
                "Edited.",
            ]
        ),
        tools=[refund],
        approve=["refund"],
        storage=storage,
    )
    thread = agent.thread("rej")
    await (await thread.submit("a")).reply()
    assert (await (await thread.submit_reject("no")).reply()).text == "Not refunded."
    await (await thread.submit("b")).reply()
    decided = await (
        await thread.submit_decide({"c2": {"type": "respond", "message": "skip"}})
    ).reply()
    assert decided.text == "Edited."


async def test_failed_run_error_on_handle_then_submit_retry_continues(storage: Storage) -> None:
    calls: list[int] = []

    @tool
    async def work(n: int) -> int:
        """Work."""
        calls.append(n)
        return n

    agent = Agent(
        FakeModel([FakeReply.tool_call("work", {"n": 1}), FakeReply.error("bad_request"), "after"]),
        tools=[work],
        storage=storage,
    )
    thread = agent.thread("fail")
    handle = await thread.submit("go")
    with pytest.raises(RunFailedError) as exc:
        await handle.reply()
    assert exc.value.error_type == "ModelError"
    info = await handle.status()
    assert info.status == "failed" and info.error_type == "ModelError" and info.error
    reply = await (await thread.submit_retry()).reply()
    assert reply.text == "after"
    assert calls == [1]  # the finished tool call was not run again


async def test_cancel_a_queued_run_never_starts_it(storage: Storage) -> None:
    release = asyncio.Event()
    inside = asyncio.Event()
    seen: list[int] = []

    @tool
    async def hold(n: int) -> int:
        """Hold."""
        seen.append(n)
        inside.set()
        await release.wait()
        return n

    agent = Agent(
        FakeModel([FakeReply.tool_call("hold", {"n": 1}), "one", "two"]),
        tools=[hold],
        storage=storage,
    )
    thread = agent.thread("cancel")
    h1 = await thread.submit("first")
    h2 = await thread.submit("second")
    await inside.wait()
    assert await h2.cancel() is True
    assert (await h2.status()).status == "cancelled"
    with pytest.raises(RunFailedError) as exc:
        await h2.reply()
    assert exc.value.code == "cancelled"
    release.set()
    assert (await h1.reply()).text == "one"
    assert await h1.cancel() is False  # ended already
    assert seen == [1]
    users = [m["content"] for m in await thread.messages() if m["role"] == "user"]
    assert users == ["first"]


async def test_cancel_a_running_run_saves_it_and_retry_continues(storage: Storage) -> None:
    inside = asyncio.Event()

    @tool
    async def slow(n: int) -> int:
        """Slow."""
        inside.set()
        await asyncio.Event().wait()
        return n

    agent = Agent(FakeModel([FakeReply.tool_call("slow", {"n": 1})]), tools=[slow], storage=storage)
    thread = agent.thread("cancel-running")
    handle = await thread.submit("go")
    await inside.wait()
    assert await handle.cancel() is True
    assert (await handle.status()).status == "cancelled"
    history = await thread.history(limit=1)
    assert history[0]["status"] in ("cancelled", "pending")


async def test_queue_python_api_lists_and_filters(storage: Storage) -> None:
    agent = Agent(FakeModel(["a", "b", "c"]), storage=storage)
    handles = [await agent.thread(t).submit("hi") for t in ("x", "y", "x")]
    for h in handles:
        await h.reply()
    runs = await list_runs(storage)
    assert {r.id for r in runs} == {h.id for h in handles}
    assert all(r.status == "succeeded" for r in runs)
    only_x = await list_runs(storage, thread_id="x")
    assert len(only_x) == 2
    assert (await get_run(storage, handles[1].id)).thread_id == "y"  # type: ignore[union-attr]
    assert await get_run(storage, "nope") is None
    with pytest.raises(ValidationError):
        await list_runs(storage, status="bogus")


async def test_bad_input_is_refused_at_submit(storage: Storage) -> None:
    agent = Agent(FakeModel(["a"]), storage=storage)
    thread = agent.thread("bad")
    with pytest.raises(TypeError):
        await thread.submit(42)  # type: ignore[arg-type]
    with pytest.raises(ValidationError) as exc:
        await thread.submit("hi", state={"when": object()})
    assert exc.value.code == "invalid_type"
    assert await list_runs(storage) == []


async def test_cancelling_a_queued_run_keeps_the_next_one_behind_the_running_one(
    storage: Storage,
) -> None:
    release = asyncio.Event()
    inside = asyncio.Event()
    seen: list[int] = []

    @tool
    async def hold(n: int) -> int:
        """Hold."""
        seen.append(n)
        inside.set()
        await release.wait()
        return n

    agent = Agent(
        FakeModel([FakeReply.tool_call("hold", {"n": 1}), "one", "three"]),
        tools=[hold],
        storage=storage,
    )
    thread = agent.thread("cancel-middle")
    first = await thread.submit("first")
    second = await thread.submit("second")
    third = await thread.submit("third")
    await inside.wait()
    assert await second.cancel() is True
    # The third waits for the first (the default on_busy="fail" would fail it if it
    # started beside it).
    for _ in range(20):
        await asyncio.sleep(0)
    assert (await third.status()).status == "queued"
    release.set()
    assert (await first.reply()).text == "one"
    assert (await third.reply()).text == "three"
    assert seen == [1]
    users = [m["content"] for m in await thread.messages() if m["role"] == "user"]
    assert users == ["first", "third"]


async def test_a_run_handle_of_another_thread_is_no_such_run(storage: Storage) -> None:
    agent = Agent(FakeModel(["for alice"]), storage=storage)
    alice = await agent.thread("alice").submit("hello")
    assert (await alice.reply()).text == "for alice"
    bob = agent.thread("bob").run(alice.id)
    for call in (bob.status, bob.reply, bob.cancel):
        with pytest.raises(ValidationError) as exc:
            await call()
        assert exc.value.code == "unknown"
        assert alice.id in str(exc.value) and "'bob'" in str(exc.value)
    assert (await agent.thread("alice").run(alice.id).reply()).text == "for alice"


@pytest.mark.parametrize("pin", ["bare", "reply", "version", "list", "pending"])
async def test_a_pinned_answer_applied_before_a_takeover_is_not_applied_again(
    storage: Storage, pin: str
) -> None:
    """What a worker taking a run over does (`resumed`): the answer the dead worker
    applied is found applied, whatever form its pin took, and its reply is returned."""
    from criogen_graph.background import jobs

    ran: list[str] = []

    @tool
    async def refund(order_id: str) -> str:
        """Refund."""
        ran.append(order_id)
        return "refunded"

    agent = Agent(
        FakeModel([FakeReply.tool_call("refund", {"order_id": "A-1"}), "Done."]),
        tools=[refund],
        approve=["refund"],
        storage=storage,
    )
    thread = agent.thread(f"pinned-{pin}")
    asked = await thread.send("refund A-1")
    pending = await thread.pending_approvals()
    expected: Any = {
        "bare": None,
        "reply": asked,
        "version": asked.version,
        "list": list(asked.approvals),
        "pending": pending,
    }[pin]
    payload = await jobs.make_payload(thread, "approve", expected=expected)
    first = await jobs.execute(agent, payload, resumed=False)
    assert first.text == "Done." and ran == ["A-1"]
    again = await jobs.execute(agent, payload, resumed=True)
    assert again.text == "Done."
    assert ran == ["A-1"]


async def test_every_code_a_handle_raises_is_documented(storage: Storage) -> None:
    """The codes met here and in the PostgreSQL tests (`bad_payload`, `unknown_agent`,
    `lock_lost`) are each a row of the table in docs/concepts/scaling.md."""

    @tool
    async def refund(order_id: str) -> str:
        """Refund."""
        return "refunded"

    agent = Agent(
        FakeModel([FakeReply.tool_call("refund", {"order_id": "A-1"}), "Done."]),
        tools=[refund],
        approve=["refund"],
        storage=storage,
    )
    thread = agent.thread("codes")
    asked = await (await thread.submit("refund A-1")).reply()
    assert asked.needs_approval
    seen = set()
    for handle in (
        await thread.submit("again"),  # an approval is pending
        await thread.submit_approve(expected=asked.version + 5),
    ):
        with pytest.raises(RunFailedError) as exc:
            await handle.reply()
        seen.add(exc.value.code)
    await (await thread.submit_approve()).reply()
    with pytest.raises(RunFailedError) as exc:
        await (await thread.submit_retry()).reply()
    seen.add(exc.value.code)
    assert seen == {"thread_suspended", "stale", "nothing_to_retry"}
    table = (Path(__file__).parents[1] / "docs" / "concepts" / "scaling.md").read_text()
    rows = {line.split("`")[1] for line in table.splitlines() if line.startswith("| `")}
    expected = seen | {"cancelled", "run_failed", "bad_payload", "unknown_agent", "lock_lost"}
    expected |= {"superseded"}  # tests/reliability/test_background_stalls.py
    assert expected <= rows, expected - rows
    assert "lock_lost" in rows and "not_suspended" in rows
