"""A decision applies only to what its reviewer saw (issue 15, item 4).

Two reviewers approve `refund 50`. The first approval runs it, and the model then asks
for `refund 5000`. The second approval, queued behind the first (`on_busy="wait"`),
must not approve the new request: it fails with `ValidationError(code="stale")` and
changes nothing saved, whether it was pinned to what its reviewer saw (`expected=`) or
bare (pinned to what was pending when it was called). Also: answers pinned to a set
that is no longer pending (the run moved on; the same request asked again after a
rewind; the same call id asked again with other args), the same answer twice, an
answer arriving after the run moved on, in one process (two storages) and in two
processes, on every backend."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import Decision, Reply, Storage, ValidationError
from criogen_graph.thread import Thread
from tests.conftest import storage_url, wait_until
from tests.reliability._pin_workers import observe_reads, refund_agent, refunds
from tests.reliability._report import report


async def saved(thread: Thread[Any], storage: Storage) -> tuple[Any, ...]:
    """Everything a refused answer must leave as it was."""
    history = await thread.history(limit=1000)
    audit = await storage.audit(thread.id)
    return (
        [(h["id"], h["version"], h["status"]) for h in history],
        await thread.messages(),
        [r.to_dict() for r in await thread.pending_approvals()],
        len(audit),
    )


def stale(result: Any) -> bool:
    return isinstance(result, ValidationError) and result.code == "stale"


async def suspended(agent: Any, thread_id: str) -> Reply[Any]:
    reply: Reply[Any] = await agent.thread(thread_id, actor="customer").send("refund please")
    assert reply.needs_approval
    assert [(r.call_id, r.tool, r.args) for r in reply.approvals] == [
        ("call_1", "refund", {"amount": 50})
    ]
    return reply


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "bare"])
async def test_the_second_reviewer_never_approves_the_next_request(
    backend: str, pinned: bool, tmp_path: Path, thread_id: str
) -> None:
    """Two storages on one database (one shared storage for memory://), `on_busy="wait"`:
    both reviewers answer while a run holds the thread; one approval applies, the other
    is refused as stale, and `refund 5000` waits, unanswered."""
    url = storage_url(backend, tmp_path)
    storage_a = Storage(url, on_busy="wait", busy_timeout_secs=60)
    storage_b = storage_a if backend == "memory" else Storage(url, on_busy="wait")
    try:
        agent_a = refund_agent(storage_a, tmp_path)
        agent_b = refund_agent(storage_b, tmp_path)
        reply = await suspended(agent_a, thread_id)
        ada = agent_a.thread(thread_id, actor="ada")
        bob = agent_b.thread(thread_id, actor="bob")
        await storage_b.open()
        reads_a = observe_reads(storage_a)
        reads_b = reads_a if storage_b is storage_a else observe_reads(storage_b)
        # A run in progress holds the thread while both reviewers click "approve".
        async with storage_a.hold(thread_id):
            if pinned:
                tasks = [
                    asyncio.ensure_future(ada.approve(expected=reply)),
                    asyncio.ensure_future(bob.approve(expected=reply.approvals)),
                ]
            else:
                tasks = [asyncio.ensure_future(ada.approve())]
                await wait_until(lambda: reads_a[0] >= 1 or tasks[0].done(), what="ada's read")
                tasks.append(asyncio.ensure_future(bob.approve()))
                await wait_until(
                    lambda: reads_b[0] >= (2 if reads_b is reads_a else 1) or tasks[1].done(),
                    what="bob's read",
                )
            assert not any(t.done() for t in tasks)
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
        applied = [r for r in results if isinstance(r, Reply)]
        refused = [r for r in results if stale(r)]
        assert len(applied) == 1 and len(refused) == 1, results
        assert [(r.tool, r.args) for r in applied[0].approvals] == [("refund", {"amount": 5000})]
        assert "refund" in str(refused[0]) and "approve" in str(refused[0])
        assert refunds(tmp_path) == ["refund 50"]
        pending = await ada.pending_approvals()
        assert [(r.tool, r.args) for r in pending] == [("refund", {"amount": 5000})]
        approvals = [a for a in await storage_a.audit(thread_id) if a["action"] == "approve"]
        assert len(approvals) == 1
        # The new request is still answerable, by whoever saw it.
        done = await bob.reject("too much", expected=pending)
        assert done.text == "done" and refunds(tmp_path) == ["refund 50"]
    finally:
        await storage_a.close()
        if storage_b is not storage_a:
            await storage_b.close()
    report(
        f"stale_approval_two_reviewers[{backend}-{'pinned' if pinned else 'bare'}]",
        applied=len(applied),
        refused_stale=len(refused),
        refunds=len(refunds(tmp_path)),
    )


@pytest.mark.timeout(180)
@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "bare"])
async def test_two_processes_approve_at_once(
    durable_backend: str, pinned: bool, tmp_path: Path, forkserver: Any
) -> None:
    """The same race between two processes: each approves, pinned to the version its
    reviewer was shown (released at once), or bare while the parent holds the thread
    until both have read it. One applies; the other is refused; 5000 is never refunded."""
    from tests.reliability import _pin_workers

    url = storage_url(durable_backend, tmp_path)
    thread_id = f"pin-{durable_backend}-{uuid.uuid4().hex}"
    storage = Storage(url)
    try:
        reply = await suspended(refund_agent(storage, tmp_path), thread_id)
        go, out = forkserver.Event(), forkserver.Queue()
        pin = reply.version if pinned else None
        procs = [
            forkserver.Process(
                target=_pin_workers.review,
                args=(url, thread_id, str(tmp_path), who, pin, go, out),
            )
            for who in ("ada", "bob")
        ]
        results: list[dict[str, Any]] = []
        async with storage.hold(thread_id):
            for p in procs:
                p.start()
            if pinned:
                go.set()
            else:
                while len(results) < 2:
                    msg = await asyncio.to_thread(out.get, True, 60)
                    assert "read" in msg, msg
                    results.append(msg)
                results.clear()
        results = [await asyncio.to_thread(out.get, True, 120) for _ in procs]
        for p in procs:
            await asyncio.to_thread(p.join, 60)
        kinds = sorted(r["result"] for r in results)
        assert kinds == ["applied", "stale"], results
        applied = next(r for r in results if r["result"] == "applied")
        assert applied["pending"] == [("refund", {"amount": 5000})]
        assert refunds(tmp_path) == ["refund 50"]
        thread = refund_agent(storage, tmp_path).thread(thread_id)
        assert [(r.tool, r.args) for r in await thread.pending_approvals()] == [
            ("refund", {"amount": 5000})
        ]
        assert sum(a["action"] == "approve" for a in await storage.audit(thread_id)) == 1
    finally:
        await storage.close()
    report(
        f"stale_approval_two_processes[{durable_backend}-{'pinned' if pinned else 'bare'}]",
        applied=kinds.count("applied"),
        refused_stale=kinds.count("stale"),
        refunds=len(refunds(tmp_path)),
    )


SCENARIOS = ["moved-on", "asked-again", "same-id-other-args"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_an_answer_pinned_to_a_stale_set_changes_nothing(
    backend: str, scenario: str, tmp_path: Path, thread_id: str
) -> None:
    """The reviewer saw `refund 50` as call_1. Then the thread moved on:
    - moved-on: it was approved, ran, and the run asks for `refund 5000`;
    - asked-again: it was rewound to where it asked, so it asks again, the very same
      request under the same id (a new question: answer it anew);
    - same-id-other-args: it was rewound to before the model answered, and retried;
      the model now asks call_1 to refund 7.
    Every answer pinned to what the reviewer saw is refused with code "stale", and
    nothing saved changes: not the checkpoints, the transcript, the pending calls, nor
    the audit trail. A plain list of the requests pins them by id, tool and args (so
    it tells other args apart); only the thread's own lists tell a repeat apart."""
    async with Storage(storage_url(backend, tmp_path)) as storage:
        amounts = [50, 5000]
        agent = refund_agent(storage, tmp_path, amounts)
        first = await suspended(agent, thread_id)
        thread = agent.thread(thread_id, actor="ada")
        shown = await thread.pending_approvals()
        assert shown == first.approvals
        if scenario == "moved-on":
            await thread.approve(expected=shown)
            ran = ["refund 50"]
        elif scenario == "asked-again":
            await thread.rewind(first.checkpoint_id)
            ran = []
        else:
            before_model = next(h for h in await thread.history() if h["step"] == 0)
            await thread.rewind(before_model["id"])
            amounts[0] = 7
            await thread.retry()
            ran = []
        now = await thread.pending_approvals()
        assert now.version is not None and now.version > first.version
        if scenario == "asked-again":
            assert now == first.approvals  # the same request, asked again
        else:
            assert len(now) == 1 and now[0].args != first.approvals[0].args
        if scenario == "same-id-other-args":
            assert now[0].call_id == first.approvals[0].call_id == "call_1"
        before = await saved(thread, storage)

        pins: list[Any] = [first, first.approvals, shown, first.version, first.checkpoint_id]
        if scenario != "asked-again":  # other args: the requests themselves differ
            pins.append([r.to_dict() for r in first.approvals])
            pins.append(list(first.approvals))
        if scenario == "moved-on":  # the new request has a new id
            pins.append([r.call_id for r in first.approvals])
        call_id = now[0].call_id
        calls: list[Any] = []
        for pin in pins:
            calls += [
                lambda pin=pin: thread.approve(expected=pin),
                lambda pin=pin: thread.reject("no", expected=pin),
                lambda pin=pin: thread.decide({call_id: Decision.approve()}, expected=pin),
                lambda pin=pin: thread.stream_approve(expected=pin).reply(),
                lambda pin=pin: thread.stream_decide({call_id: "approve"}, expected=pin).reply(),
            ]
        refused = 0
        for call in calls:
            with pytest.raises(ValidationError) as info:
                await call()
            assert info.value.code == "stale", info.value
            assert f"version {now.version}" in str(info.value)
            refused += 1
        assert await saved(thread, storage) == before
        assert refunds(tmp_path) == ran

        # What the reviewer is shown now is answerable.
        done = await thread.approve(expected=now)
        assert done.needs_approval or done.text == "done"
        assert refunds(tmp_path) == [*ran, f"refund {now[0].args['amount']}"]
    report(f"stale_approval_pinned[{backend}-{scenario}]", stale_answers=refused, changed=0)


@pytest.mark.timeout(120)
async def test_the_same_answer_twice(backend: str, tmp_path: Path, thread_id: str) -> None:
    """A double click, one after the other and both at once (on_busy="wait"): the
    request is approved once; the second answer is refused as stale."""
    url = storage_url(backend, tmp_path)
    async with Storage(url, on_busy="wait") as storage:
        agent = refund_agent(storage, tmp_path)
        reply = await suspended(agent, thread_id)
        thread = agent.thread(thread_id, actor="ada")
        await thread.approve(expected=reply)
        with pytest.raises(ValidationError) as info:
            await thread.approve(expected=reply)
        assert info.value.code == "stale"
        assert refunds(tmp_path) == ["refund 50"]

        again = await thread.pending_approvals()
        both = await asyncio.wait_for(
            asyncio.gather(
                thread.approve(expected=again),
                thread.approve(expected=again),
                return_exceptions=True,
            ),
            60,
        )
        assert sum(isinstance(r, Reply) for r in both) == 1, both
        assert sum(stale(r) for r in both) == 1, both
        assert refunds(tmp_path) == ["refund 50", "refund 5000"]
        assert sum(a["action"] == "approve" for a in await storage.audit(thread_id)) == 2
    report(f"stale_approval_twice[{backend}]", applied=2, refused_stale=2)


@pytest.mark.timeout(120)
async def test_an_answer_after_the_run_moved_on(
    backend: str, tmp_path: Path, thread_id: str
) -> None:
    """Bob answers what he saw after Ada rejected it (the run then asked for 5000), and
    again after the run ended: refused as stale both times, nothing runs. A bare
    approve() with nothing pending still says so (`not_suspended`)."""
    async with Storage(storage_url(backend, tmp_path)) as storage:
        agent = refund_agent(storage, tmp_path)
        seen_by_bob = await suspended(agent, thread_id)
        ada = agent.thread(thread_id, actor="ada")
        bob = agent.thread(thread_id, actor="bob")
        asks = await ada.reject("no refunds today", expected=seen_by_bob)
        assert [(r.tool, r.args) for r in asks.approvals] == [("refund", {"amount": 5000})]
        before = await saved(bob, storage)
        with pytest.raises(ValidationError) as info:
            await bob.approve(expected=seen_by_bob)
        assert info.value.code == "stale"
        assert await saved(bob, storage) == before

        done = await ada.reject("no", expected=asks)
        assert done.stop_reason == "final_answer"
        before = await saved(bob, storage)
        for pin in (seen_by_bob, asks, asks.approvals, asks.version):
            with pytest.raises(ValidationError) as info:
                await bob.approve(expected=pin)
            assert info.value.code == "stale"
            assert "nothing waits for approval" in str(info.value)
        with pytest.raises(ValidationError) as info:
            await bob.approve()
        assert info.value.code == "not_suspended"
        assert await saved(bob, storage) == before
        assert refunds(tmp_path) == []
    report(f"stale_approval_late[{backend}]", late_answers=5, refunds=0)


async def test_what_expected_accepts(tmp_path: Path, thread_id: str) -> None:
    """`expected` takes a Reply, its approvals or pending_approvals() (as they are, or
    as dicts), call ids, a version or a checkpoint id; anything else is refused before
    anything is read or written."""
    async with Storage("memory://") as storage:
        agent = refund_agent(storage, tmp_path, (50, 60, 70, 80, 90, 100, 110), reuse_ids=False)
        reply = await suspended(agent, thread_id)
        thread = agent.thread(thread_id)
        pending = await thread.pending_approvals()
        assert pending == reply.approvals
        assert pending.version == reply.version and pending.checkpoint_id == reply.checkpoint_id
        for make_pin in (
            lambda r: r,
            lambda r: r.approvals,
            lambda r: [a.to_dict() for a in r.approvals],
            lambda r: [a.call_id for a in r.approvals],
            lambda r: r.version,
            lambda r: r.checkpoint_id,
        ):
            reply = await thread.approve(expected=make_pin(reply))
        assert refunds(tmp_path) == [f"refund {n}" for n in (50, 60, 70, 80, 90, 100)]

        before = await saved(thread, storage)
        for bad, code in (
            (True, "invalid_type"),
            (1.5, "invalid_type"),
            ({"call_id": reply.approvals[0].call_id}, "invalid_type"),
            ([None], "invalid_type"),
            (reply.approvals[0].call_id, "invalid_value"),  # a call id, not a checkpoint
        ):
            with pytest.raises(ValidationError) as info:
                await thread.approve(expected=bad)
            assert info.value.code == code, (bad, info.value)
        with pytest.raises(ValidationError):
            thread.stream_approve(expected=True)
        assert await saved(thread, storage) == before
