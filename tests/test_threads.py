"""Durable threads on every backend: send, history, messages, rewind, delete, retry,
failed and cancelled runs, versions, suspension, locks, audit, encryption."""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import (
    Agent,
    FakeModel,
    FakeReply,
    FunctionModel,
    Hook,
    HookAction,
    HookContext,
    Storage,
    StorageError,
    ThreadBusyError,
    ThreadSuspendedError,
    ToolCall,
    ToolExecutionError,
    ValidationError,
    tool,
)
from tests.conftest import storage_url, wait_until
from tests.procs.agents import approval_agent, ledger_lines, tools_agent


def echo_model() -> FunctionModel:
    """Answers with a summary of what it saw, so tests can check the context."""

    def fn(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        users = [m["content"] for m in messages if m["role"] == "user"]
        return f"seen {len(users)}: {' | '.join(users)}"

    return FunctionModel(fn)


async def test_send_keeps_the_conversation(storage: Storage, thread_id: str) -> None:
    agent = Agent(echo_model(), storage=storage)
    thread = agent.thread(thread_id)
    first = await thread.send("My name is Sam.")
    assert first.text == "seen 1: My name is Sam."
    second = await thread.send("What is my name?")
    assert second.text == "seen 2: My name is Sam. | What is my name?"
    assert [m["role"] for m in second.messages] == ["user", "assistant", "user", "assistant"]
    assert second.version > first.version > 0
    history = await thread.history()
    assert history[0]["id"] == second.checkpoint_id
    assert history[0]["version"] == second.version
    assert await thread.messages() == second.messages
    # another agent object on the same storage sees the same thread
    again = Agent(echo_model(), storage=storage).thread(thread_id)
    assert await again.messages() == second.messages


async def test_history_shape_and_limit(storage: Storage, thread_id: str) -> None:
    thread = Agent(echo_model(), storage=storage).thread(thread_id)
    reply = await thread.send("one")
    await thread.send("two")
    history = await thread.history(limit=50)
    assert set(history[0]) == {
        "id",
        "parent_id",
        "version",
        "source",
        "status",
        "run_id",
        "step",
        "created_at_ms",
    }
    assert [h["version"] for h in history] == sorted((h["version"] for h in history), reverse=True)
    assert [h["version"] for h in history] == list(range(history[0]["version"], 0, -1))
    assert history[0]["status"] == "completed" and history[-1]["parent_id"] is None
    assert all(h["parent_id"] == nxt["id"] for h, nxt in itertools.pairwise(history))
    assert {h["run_id"] for h in history} >= {reply.run_id}
    assert history[0]["created_at_ms"] >= history[-1]["created_at_ms"] > 1_700_000_000_000
    assert len(await thread.history(limit=2)) == 2
    with pytest.raises(ValidationError):
        await thread.history(limit=0)


async def test_failed_run_is_saved_and_retry_does_not_rerun_finished_calls(
    storage: Storage, thread_id: str
) -> None:
    runs = {"ok": 0, "flaky": 0}

    @tool
    async def ok() -> str:
        """Works."""
        runs["ok"] += 1
        return "ok result"

    @tool
    async def flaky() -> str:
        """Fails the first time."""
        runs["flaky"] += 1
        if runs["flaky"] == 1:
            raise RuntimeError("disk full")
        return "flaky result"

    def script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if messages[-1]["role"] == "user":
            return FakeReply.tool_calls(("ok", {}), ("flaky", {}))
        return "all done"

    agent = Agent(
        FunctionModel(script), tools=[ok, flaky], storage=storage, on_tool_exception="fail"
    )
    thread = agent.thread(thread_id, actor="ops")
    with pytest.raises(ToolExecutionError):
        await thread.send("go")
    head = (await thread.history(limit=1))[0]
    assert head["status"] == "failed"
    saved = await thread.messages()
    # the failed run's reply is kept, with the result of the call that finished
    assert [c["name"] for c in saved[1]["tool_calls"]] == ["ok", "flaky"]
    assert [m["content"] for m in saved[2:]] == ["ok result"]
    reply = await thread.retry()
    assert reply.text == "all done"
    assert runs == {"ok": 1, "flaky": 2}  # the finished call did not run again
    assert [m["content"] for m in reply.messages if m["role"] == "tool"] == [
        "ok result",
        "flaky result",
    ]
    actions = [a["action"] for a in await storage.audit(thread_id)]
    assert actions.count("run_failed") == 1 and "retry" in actions
    failed = next(a for a in await storage.audit(thread_id) if a["action"] == "run_failed")
    assert failed["details"]["error"] == "ToolExecutionError" and failed["actor"] == "ops"


async def test_send_after_a_failed_run_keeps_what_finished(
    storage: Storage, thread_id: str
) -> None:
    @tool
    async def ok() -> str:
        """Works."""
        return "ok result"

    @tool
    async def broken() -> str:
        """Always fails."""
        raise RuntimeError("nope")

    seen: list[list[dict[str, Any]]] = []

    def script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        seen.append(messages)
        if len(seen) == 1:
            return FakeReply.tool_calls(("ok", {}), ("broken", {}))
        return "moved on"

    thread = Agent(
        FunctionModel(script), tools=[ok, broken], storage=storage, on_tool_exception="fail"
    ).thread(thread_id)
    with pytest.raises(ToolExecutionError):
        await thread.send("first")
    reply = await thread.send("second")
    assert reply.text == "moved on"
    roles = [m["role"] for m in reply.messages]
    assert roles == ["user", "assistant", "tool", "tool", "user", "assistant"]
    ok_msg, broken_msg = reply.messages[2:4]
    assert ok_msg["content"] == "ok result" and ok_msg["status"] == "ok"
    assert broken_msg["status"] == "skipped" and broken_msg["content"].startswith("Not run")
    assert seen[-1][-1] == {"role": "user", "content": "second"}


async def test_cancelled_run_is_saved_and_retry_continues(
    storage: Storage, thread_id: str, tmp_path: Path
) -> None:
    agent = tools_agent(storage, tmp_path)
    thread = agent.thread(thread_id)
    task = asyncio.create_task(thread.send("go"))
    await wait_until(
        lambda: any(x.startswith("slow-started") for x in ledger_lines(tmp_path)),
        what="slow to start",
    )
    await wait_until(
        lambda: any(x.startswith("fast ") for x in ledger_lines(tmp_path)), what="fast to finish"
    )
    task.cancel()
    with pytest.raises(asyncio.CancelledError) as info:
        await task
    assert type(info.value) is asyncio.CancelledError and task.cancelled()
    head = (await thread.history(limit=1))[0]
    assert head["status"] == "cancelled"
    (tmp_path / "release").touch()
    reply = await thread.retry()
    assert reply.text == "done"
    ledger = ledger_lines(tmp_path)
    assert sum(x.startswith("fast ") for x in ledger) == 1
    assert sum(x.startswith("slow ") for x in ledger) == 1
    actions = [a["action"] for a in await storage.audit(thread_id)]
    assert "run_cancelled" in actions


async def test_retry_needs_something_to_retry(storage: Storage, thread_id: str) -> None:
    thread = Agent(echo_model(), storage=storage).thread(thread_id)
    with pytest.raises(ValidationError) as info:
        await thread.retry()
    assert info.value.code == "nothing_to_retry"
    reply = await thread.send("hi")
    with pytest.raises(ValidationError, match="nothing to retry"):
        await thread.retry()
    assert (await thread.history(limit=1))[0]["id"] == reply.checkpoint_id  # unchanged


async def test_rewind_continues_from_the_older_checkpoint(storage: Storage, thread_id: str) -> None:
    thread = Agent(echo_model(), storage=storage).thread(thread_id, actor="ada")
    first = await thread.send("one")
    second = await thread.send("two")
    head = await thread.rewind(first.checkpoint_id)
    assert head["parent_id"] == first.checkpoint_id
    assert head["version"] == second.version + 1  # versions keep growing
    assert await thread.messages() == first.messages
    ids = [h["id"] for h in await thread.history(limit=100)]
    assert first.checkpoint_id in ids and second.checkpoint_id not in ids
    third = await thread.send("three")
    assert third.text == "seen 2: one | three"
    assert third.version > head["version"]
    rewind = next(a for a in await storage.audit(thread_id) if a["action"] == "rewind")
    assert rewind["actor"] == "ada" and rewind["details"]["checkpoint_id"] == first.checkpoint_id


async def test_rewind_to_an_unknown_checkpoint(storage: Storage, thread_id: str) -> None:
    thread = Agent(echo_model(), storage=storage).thread(thread_id)
    reply = await thread.send("one")
    with pytest.raises(ValidationError) as info:
        await thread.rewind("1f000000-0000-6000-8000-000000000000")
    assert info.value.code == "unknown"
    assert (await thread.history(limit=1))[0]["id"] == reply.checkpoint_id


async def test_delete(storage: Storage, thread_id: str) -> None:
    agent = Agent(echo_model(), storage=storage)
    thread = agent.thread(thread_id)
    await thread.send("one")
    assert thread_id in await storage.threads()
    assert await thread.delete() is True
    assert await thread.messages() == []
    assert await thread.history() == []
    assert thread_id not in await storage.threads()
    assert await thread.delete() is False
    actions = [a["action"] for a in await storage.audit(thread_id)]
    assert actions[0] == "send" and actions.count("delete") == 2  # kept unless asked
    await thread.send("again")
    await thread.delete(audit=True)
    assert [a["action"] for a in await storage.audit(thread_id)] == ["delete"]


async def test_suspended_thread(storage: Storage, thread_id: str, tmp_path: Path) -> None:
    thread = approval_agent(storage, tmp_path).thread(thread_id, actor="ada")
    reply = await thread.send("refund A-1")
    assert reply.needs_approval and reply.stop_reason is None
    assert [a.tool for a in reply.approvals] == ["refund"]
    with pytest.raises(ThreadSuspendedError):
        await thread.send("hello?")
    with pytest.raises(ThreadSuspendedError):
        await thread.retry()
    assert (await thread.history(limit=1))[0]["status"] == "suspended"
    assert [p.call_id for p in await thread.pending_approvals()] == [reply.approvals[0].call_id]
    assert ledger_lines(tmp_path) == []  # nothing ran while waiting
    done = await thread.approve()
    assert done.text == "handled"
    assert sorted(ledger_lines(tmp_path)) == ["lookup A-1", "refund A-1"]
    assert await thread.pending_approvals() == []
    with pytest.raises(ValidationError) as info:
        await thread.approve()
    assert info.value.code == "not_suspended"


async def test_thread_ids_must_be_non_empty_strings() -> None:
    agent = Agent(echo_model())
    for bad in ("", "   "):
        with pytest.raises(ValidationError) as info:
            agent.thread(bad)
        assert info.value.code == "invalid_value"
    with pytest.raises(ValidationError) as info:
        agent.thread(42)  # type: ignore[arg-type]
    assert info.value.code == "invalid_type"


async def test_on_busy_fail_and_wait_in_one_process(
    backend: str, tmp_path: Path, thread_id: str
) -> None:
    url = storage_url(backend, tmp_path)
    for on_busy in ("fail", "wait"):
        workdir = tmp_path / on_busy
        workdir.mkdir()
        storage = Storage(url, on_busy=on_busy, busy_timeout_secs=30)
        agent = tools_agent(storage, workdir)
        tid = f"{thread_id}-{on_busy}"
        first = asyncio.create_task(agent.thread(tid).send("first"))
        await wait_until(
            lambda w=workdir: any(x.startswith("slow-started") for x in ledger_lines(w)),
            what="first run to hold the thread",
        )
        if on_busy == "fail":
            with pytest.raises(ThreadBusyError):
                await agent.thread(tid).send("second")
            (workdir / "release").touch()
            await first
        else:
            second = asyncio.create_task(agent.thread(tid).send("second"))
            await asyncio.sleep(0)
            assert not second.done()
            (workdir / "release").touch()
            await first
            reply = await second
            # no fork: the second run saw the first one
            assert [m["content"] for m in reply.messages if m["role"] == "user"] == [
                "first",
                "second",
            ]
        await storage.close()


async def test_audit_records_who_did_what(storage: Storage, thread_id: str, tmp_path: Path) -> None:
    class Redirect(Hook):
        name = "redirect"

        def before_tool(self, call: ToolCall) -> ToolCall:
            return (
                ToolCall(call.call_id, "lookup", {"order_id": "B-2"})
                if call.name == "lookup"
                else call
            )

    agent = approval_agent(storage, tmp_path, hooks=[Redirect()])
    thread = agent.thread(thread_id, actor="ada")
    reply = await thread.send("refund A-1")
    await agent.thread(thread_id, actor="boss").approve()
    records = await storage.audit(thread_id)
    actions = [(r["action"], r["actor"]) for r in records]
    assert actions[0] == ("send", "ada")
    assert ("approve", "boss") in actions
    tools = [r for r in records if r["action"] == "tool_call"]
    assert {t["details"]["tool"] for t in tools} == {"refund", "lookup"}
    lookup = next(t for t in tools if t["details"]["tool"] == "lookup")
    assert lookup["details"]["changed_by"] == ["redirect"] and lookup["details"]["status"] == "ok"
    approve = next(r for r in records if r["action"] == "approve")
    (decision,) = approve["details"]["decisions"]
    assert decision["call_id"] == reply.approvals[0].call_id and decision["args"] == {
        "order_id": "A-1"
    }
    assert len(decision["approved_args_sha256"]) == 64
    assert all(r["run_id"] == reply.run_id for r in records)
    assert all(r["thread_id"] == thread_id and r["ts_ms"] > 0 for r in records)
    # Oldest first by when each was made (two calls running at once may be saved in the
    # other order, so their row ids need not follow).
    assert [r["ts_ms"] for r in records] == sorted(r["ts_ms"] for r in records)


async def test_hook_state_is_saved_with_the_thread(storage: Storage, thread_id: str) -> None:
    class Turns(Hook):
        def on_start(self, ctx: HookContext) -> HookAction:
            return HookAction(state=(ctx.hook_state or 0) + 1)

    seen: list[Any] = []

    class Peek(Hook):
        def before_model(self, ctx: HookContext) -> None:
            seen.append(len(ctx.messages))

    agent = Agent(echo_model(), storage=storage, hooks=[Turns(), Peek()])
    await agent.thread(thread_id).send("a")
    await agent.thread(thread_id).send("b")
    agent2 = Agent(echo_model(), storage=storage, hooks=[Turns(), Peek()])
    await agent2.thread(thread_id).send("c")
    snap = await agent2.thread_graph(storage).aget_state({"configurable": {"thread_id": thread_id}})
    assert snap.values["run"]["hooks"]["Turns"] == 3
    assert seen == [1, 3, 5]


async def test_storage_shared_by_agents_and_closed(tmp_path: Path) -> None:
    async with Storage(f"sqlite:///{tmp_path}/shared.db") as storage:
        a = Agent(FakeModel(["from a"]), storage=storage)
        b = Agent(FakeModel(["from b"]), storage=storage)
        await a.thread("ta").send("hi")
        await b.thread("tb").send("hi")
        assert await storage.threads() == ["ta", "tb"]
    # reopened on use after close
    assert [m["content"] for m in await a.thread("ta").messages()] == ["hi", "from a"]
    await storage.close()


async def test_sqlite_url_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for url, path in (
        ("sqlite:///rel.db", tmp_path / "rel.db"),
        (f"sqlite:///{tmp_path}/abs.db", tmp_path / "abs.db"),
        ("sqlite://seed.db", tmp_path / "seed.db"),
        ("sqlite:///nested/dir/x.db", tmp_path / "nested/dir/x.db"),
    ):
        storage = Storage(url)
        await Agent(FakeModel(["ok"]), storage=storage).thread("t").send("hi")
        await storage.close()
        assert path.exists(), url


async def test_bad_storage_urls_and_unreachable_databases(tmp_path: Path) -> None:
    with pytest.raises(StorageError) as info:
        Storage("mongodb://localhost/x")
    assert info.value.code == "invalid_url"
    with pytest.raises(StorageError):
        Storage("sqlite:")
    with pytest.raises(StorageError):
        Storage("postgresql:nope")
    with pytest.raises(TypeError):
        Storage(42)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        Storage("memory://", on_busy="queue")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    storage = Storage(f"sqlite:///{blocker}/x.db")
    with pytest.raises(StorageError) as info:
        await Agent(FakeModel(["x"]), storage=storage).thread("t").send("hi")
    assert info.value.code == "unwritable" and str(blocker) in str(info.value)
    storage = Storage("postgresql://nobody:secret@127.0.0.1:1/db")
    with pytest.raises(StorageError) as info:
        await storage.open()
    assert info.value.code == "unreachable"
    assert "127.0.0.1:1" in str(info.value) and "secret" not in str(info.value)


async def test_encryption_at_rest(
    durable_backend: str, tmp_path: Path, thread_id: str, request: pytest.FixtureRequest
) -> None:
    # An encrypted storage is a whole database (or schema): never the shared test one.
    url = (
        request.getfixturevalue("pg_schema_url")
        if durable_backend == "postgres"
        else storage_url(durable_backend, tmp_path)
    )
    secret = "the launch code is 0451"
    storage = Storage(url, encryption_key="correct horse battery staple")
    thread = Agent(FakeModel(["noted"]), storage=storage).thread(thread_id)
    reply = await thread.send(secret)
    await storage.close()

    if durable_backend == "sqlite":
        raw = sqlite3.connect(f"{tmp_path}/threads.db")
        blobs = [r[0] for r in raw.execute("SELECT checkpoint FROM checkpoints")]
        blobs += [r[0] for r in raw.execute("SELECT value FROM writes")]
        blobs += [r[0] for r in raw.execute("SELECT details FROM criogen_audit")]
        raw.close()
        assert blobs and not any(secret.encode() in bytes(b) for b in blobs)

    wrong = Storage(url, encryption_key="wrong key")
    with pytest.raises(StorageError) as info:
        await Agent(FakeModel(["x"]), storage=wrong).thread(thread_id).send("more")
    assert info.value.code == "encryption"
    without = Storage(url)
    with pytest.raises(StorageError, match="encrypted"):
        await without.open()
    right = Storage(url, encryption_key="correct horse battery staple")
    again = Agent(FakeModel(["still here"]), storage=right).thread(thread_id)
    assert await again.messages() == reply.messages  # nothing was changed by the failures
    assert (await again.send("and?")).text == "still here"
    await right.close()


async def test_checkpoints_grow_linearly(tmp_path: Path) -> None:
    storage = Storage(f"sqlite:///{tmp_path}/size.db")
    thread = Agent(FunctionModel(lambda messages, tools: "ok"), storage=storage).thread("big")
    pad = "x" * 2000

    def stored_bytes() -> int:
        db = sqlite3.connect(f"{tmp_path}/size.db")
        n = db.execute("SELECT coalesce(sum(length(checkpoint)), 0) FROM checkpoints").fetchone()[0]
        n += db.execute("SELECT coalesce(sum(length(value)), 0) FROM writes").fetchone()[0]
        db.close()
        return int(n)

    for i in range(20):
        await thread.send(f"{i} {pad}")
    at20 = stored_bytes()
    for i in range(20, 40):
        await thread.send(f"{i} {pad}")
    at40 = stored_bytes()
    # a copy of the transcript per checkpoint would make this about 4
    assert at40 / at20 < 2.6
    assert at40 < 40 * 2 * 2600 * 2  # a couple of copies of each message at most
    await storage.close()


def test_one_agent_across_several_asyncio_runs(
    backend: str, tmp_path: Path, thread_id: str
) -> None:
    # Scripts often call asyncio.run more than once; connections follow the new loop.
    agent = Agent(FakeModel(["one", "two"]), storage=Storage(storage_url(backend, tmp_path)))
    assert asyncio.run(agent.thread(thread_id).send("a")).text == "one"
    assert asyncio.run(agent.thread(thread_id).send("b")).text == "two"
    assert len(asyncio.run(agent.thread(thread_id).messages())) == 4
    asyncio.run(agent.storage.close())


async def test_rewind_to_where_a_run_waited_for_approval_asks_again(
    storage: Storage, thread_id: str, tmp_path: Path
) -> None:
    thread = approval_agent(storage, tmp_path).thread(thread_id)
    waiting = await thread.send("refund A-1")
    assert waiting.needs_approval
    done = await thread.approve()
    assert done.text == "handled"
    assert sorted(ledger_lines(tmp_path)) == ["lookup A-1", "refund A-1"]

    head = await thread.rewind(waiting.checkpoint_id)
    assert head["status"] == "suspended"
    assert head["version"] == done.version + 1
    pending = await thread.pending_approvals()
    assert [(p.call_id, p.tool) for p in pending] == [
        (a.call_id, a.tool) for a in waiting.approvals
    ]
    # Answered anew, differently this time: the refund is rejected, the lookup runs.
    again = await thread.reject("not eligible")
    assert again.text == "handled"
    assert sorted(ledger_lines(tmp_path)) == ["lookup A-1", "lookup A-1", "refund A-1"]
    tool_results = [m for m in again.messages if m["role"] == "tool"]
    assert [m["status"] for m in tool_results] == ["rejected", "ok"]


async def test_rewind_into_the_middle_of_a_run_leaves_it_for_retry(
    storage: Storage, thread_id: str, tmp_path: Path
) -> None:
    (tmp_path / "release").touch()
    thread = tools_agent(storage, tmp_path).thread(thread_id)
    done = await thread.send("go")
    mid = next(
        h for h in await thread.history(limit=50) if h["status"] == "pending" and h["step"] == 1
    )
    head = await thread.rewind(mid["id"])
    assert head["status"] == "pending"
    with pytest.raises(ValidationError, match="no pending approvals"):
        await thread.approve()
    again = await thread.retry()
    assert again.text == "done"
    assert [m["role"] for m in again.messages] == [m["role"] for m in done.messages]
