"""Background runs on PostgreSQL with a worker in the test's event loop (the worker
subprocess tests, SIGKILL and ordering, are in tests/reliability/test_background_*.py):
the queue API, the command line, and bad input (a clear error on the handle and in the
run's record; the worker goes on serving)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from criogen_graph import (
    Agent,
    FakeModel,
    RunFailedError,
    Storage,
    Worker,
    close_runs,
    get_run,
    list_runs,
)
from tests.conftest import PG_URL, require_postgres
from tests.reliability import _background_agents as bg

# One schema, one queue and one worker for the module (their setup is most of the cost);
# each test has threads of its own and its own ledger.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def module_url() -> Iterator[str]:
    require_postgres()
    import psycopg

    schema = f"criogen_bg_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in PG_URL else "?"
    try:
        yield f"{PG_URL}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("bg")
    old = os.environ.get("CRIOGEN_BG_WORKDIR")
    os.environ["CRIOGEN_BG_WORKDIR"] = str(path)
    try:
        yield path
    finally:
        if old is None:
            del os.environ["CRIOGEN_BG_WORKDIR"]
        else:
            os.environ["CRIOGEN_BG_WORKDIR"] = old


@pytest.fixture
def workdir(module_dir: Path) -> Path:
    (module_dir / "ledger").unlink(missing_ok=True)
    return module_dir


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def storage(module_url: str) -> AsyncIterator[Storage]:
    s = Storage(module_url, on_busy="wait")
    yield s
    await close_runs(s)
    await s.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def worker(storage: Storage, module_dir: Path) -> AsyncIterator[Worker]:
    w = Worker(
        [bg.make_agent(storage), bg.make_approver(storage)],
        storage=storage,
        heartbeat_secs=0.2,
        stalled_after_secs=1.0,
    )
    task = asyncio.create_task(w.run())
    yield w
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_submit_is_run_by_the_worker(storage: Storage, worker: Worker, workdir: Path) -> None:
    thread = bg.make_agent(storage).thread("pg-1", actor="ada")
    handle = await thread.submit("hello")
    reply = await handle.reply()
    assert reply.text == "done: rested"
    assert reply.run_id == handle.id
    info = await handle.status()
    assert info.status == "succeeded"
    assert info.attempts == 1
    assert info.worker == worker.name
    assert info.job_id is not None and info.first_started_at_ms is not None
    assert [line[0] for line in bg.ledger(workdir)] == ["nap"]
    # The reply read back from the thread is the one the run saved.
    assert (await thread.messages())[-1]["content"] == "done: rested"
    assert reply.checkpoint_id == (await thread.history(limit=1))[0]["id"]


async def test_runs_of_one_thread_in_order_others_alongside(
    storage: Storage, worker: Worker, workdir: Path
) -> None:
    agent = bg.make_agent(storage)
    handles = [await agent.thread("ordered").submit(f"seq {n}") for n in range(4)]
    handles += [await agent.thread(f"other-{n}").submit(f"seq {10 + n}") for n in range(3)]
    for h in handles:
        await h.reply()
    events = [line[0] for line in bg.ledger(workdir) if line[1] == "ordered"]
    assert events == [e for n in range(4) for e in (f"start-{n}", f"end-{n}")]
    users = [m["content"] for m in await agent.thread("ordered").messages() if m["role"] == "user"]
    assert users == [f"seq {n}" for n in range(4)]


async def test_approval_from_another_handle_is_run_by_the_worker(
    storage: Storage, worker: Worker, workdir: Path
) -> None:
    thread = bg.make_approver(storage).thread("appr")
    asked = await (await thread.submit("nap please")).reply()
    assert asked.needs_approval
    assert bg.ledger(workdir) == []
    done = await (await thread.submit_approve(expected=asked)).reply()
    assert done.text == "done: rested"
    assert [line[0] for line in bg.ledger(workdir)] == ["nap"]


async def test_unknown_agent_fails_the_run_and_the_worker_goes_on(
    storage: Storage, worker: Worker, workdir: Path
) -> None:
    stranger = Agent(FakeModel(["hi"]), storage=storage, name="stranger")
    handle = await stranger.thread("s-1").submit("hello")
    with pytest.raises(RunFailedError) as exc:
        await handle.reply()
    assert exc.value.code == "unknown_agent"
    assert "stranger" in str(exc.value) and "bg-approver" in str(exc.value)
    info = await handle.status()
    assert (info.status, info.error_code) == ("failed", "unknown_agent")
    # Nothing was written to the thread; the worker serves the next run.
    assert await stranger.thread("s-1").history() == []
    ok = await bg.make_agent(storage).thread("s-2").submit("hello")
    assert (await ok.reply()).text == "done: rested"


async def test_unreadable_payload_fails_the_job_and_the_worker_goes_on(
    storage: Storage, worker: Worker, workdir: Path
) -> None:
    from criogen_graph.background.postgres import QUEUE, TASK, pg_queue

    queue = await pg_queue(storage)
    await queue.app.configure_task(TASK, queue=QUEUE).defer_async(
        payload={"v": 99, "id": "from-the-future-1", "thread_id": "t"}
    )
    await queue.app.configure_task(TASK, queue=QUEUE).defer_async(payload="not an object")
    # A payload naming another job's run id leaves that run's record alone.
    earlier = await bg.make_agent(storage).thread("keep-me").submit("hello")
    assert (await earlier.reply()).text == "done: rested"
    await queue.app.configure_task(TASK, queue=QUEUE).defer_async(
        payload={"v": 1, "id": earlier.id, "thread_id": "keep-me", "agent": "bg-agent"}
    )
    ok = await bg.make_agent(storage).thread("after-bad").submit("hello")
    assert (await ok.reply()).text == "done: rested"
    future = await get_run(storage, "from-the-future-1")
    while future is None or not future.done:
        await asyncio.sleep(0.05)
        future = await get_run(storage, "from-the-future-1")
    assert (future.status, future.error_code) == ("failed", "bad_payload")
    assert "version 99" in (future.error or "")

    def unreadable(runs: list[Any]) -> list[Any]:
        return [r for r in runs if r.error_code == "bad_payload"]

    failed = unreadable(await list_runs(storage, status="failed"))
    while len(failed) < 3:
        await asyncio.sleep(0.05)
        failed = unreadable(await list_runs(storage, status="failed"))
    assert any("belongs to another job" in (f.error or "") for f in failed)
    assert (await earlier.status()).status == "succeeded"
    assert (await earlier.status()).attempts == 1


async def test_cancel_a_running_run(storage: Storage, worker: Worker, workdir: Path) -> None:
    thread = bg.make_agent(storage).thread("cancel-me")
    handle = await thread.submit("kill")
    # The ledger is a file the tool appends to: polled, as another process would.
    while not any(line[0] == "slow-started" for line in bg.ledger(workdir)):  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    queued = await thread.submit("after")
    assert await handle.cancel() is True
    with pytest.raises(RunFailedError) as exc:
        await handle.reply()
    assert exc.value.code == "cancelled"
    # The next run of the thread starts after it, closing the cancelled run.
    assert (await queued.reply()).text == "done: rested"
    events = [line[0] for line in bg.ledger(workdir)]
    assert events.count("fast") == 1 and "slow" not in events


async def test_worker_refuses_a_storage_that_is_not_postgresql(tmp_path: Path) -> None:
    from criogen_graph import ValidationError

    with pytest.raises(ValidationError, match="PostgreSQL"):
        Worker(bg.make_agent(f"sqlite:///{tmp_path}/x.db"))
    with pytest.raises(ValidationError, match="stalled_after_secs"):
        Worker(bg.make_agent("postgresql://x@127.0.0.1/y"), heartbeat_secs=5, stalled_after_secs=1)


async def test_encrypted_storage_queues_no_plaintext_and_a_wrong_key_worker_refuses(
    pg_schema_url: str, workdir: Path
) -> None:
    import psycopg

    from criogen_graph import StorageError

    secret = "the vault code is 4711-ÜNICODE"
    async with Storage(pg_schema_url, encryption_key="right key") as storage:
        handle = await bg.make_agent(storage).thread("sealed").submit(secret, state={"pin": "9"})
        async with await psycopg.AsyncConnection.connect(pg_schema_url) as conn:
            cur = await conn.execute("SELECT args::text FROM procrastinate_jobs")
            rows = [r[0] for r in await cur.fetchall()]
        assert len(rows) == 1
        assert "4711" not in rows[0] and "vault" not in rows[0] and '"pin"' not in rows[0]
        # A worker given another key (or none) refuses to start, naming the mismatch.
        for wrong in (
            Storage(pg_schema_url, encryption_key="wrong key"),
            Storage(pg_schema_url),
        ):
            with pytest.raises(StorageError) as exc:
                await Worker(bg.make_agent(wrong), storage=wrong).run()
            assert exc.value.code == "encryption"
            await wrong.close()
        assert (await handle.status()).status == "queued"  # nothing lost
        right = Storage(pg_schema_url, encryption_key="right key", on_busy="wait")
        task = asyncio.create_task(
            Worker(bg.make_agent(right), heartbeat_secs=0.2, stalled_after_secs=1.0).run()
        )
        try:
            reply = await handle.reply()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await right.close()
        assert reply.text == "done: rested"
        assert (await bg.make_agent(storage).thread("sealed").messages())[0]["content"] == secret
        await close_runs(storage)


async def test_a_payload_edited_in_the_job_table_fails_its_run_with_bad_payload(
    storage: Storage, worker: Worker, workdir: Path
) -> None:
    import psycopg

    thread = bg.make_agent(storage).thread("edited-payload")
    first = await thread.submit("kill")
    edited = await thread.submit("hello")  # queued behind the first (one thread)
    renamed = await thread.submit("hello again")
    info, other = await edited.status(), await renamed.status()
    assert info.status == "queued" and info.job_id is not None and other.job_id is not None
    async with await psycopg.AsyncConnection.connect(storage.url, autocommit=True) as conn:
        await conn.execute(
            "UPDATE procrastinate_jobs SET args = '{}'::jsonb WHERE id = %s", (info.job_id,)
        )
        # procrastinate itself fails this one (no such task): the sweep fails its run.
        await conn.execute(
            "UPDATE procrastinate_jobs SET task_name = 'no.such.task' WHERE id = %s",
            (other.job_id,),
        )
    (workdir / "release").touch()
    try:
        assert (await asyncio.wait_for(first.reply(), 30)).text == "done: slow done"
        for handle in (edited, renamed):
            with pytest.raises(RunFailedError) as exc:
                await asyncio.wait_for(handle.reply(), 30)
            assert exc.value.code == "bad_payload"
    finally:
        (workdir / "release").unlink()
    users = [m["content"] for m in await thread.messages() if m["role"] == "user"]
    assert users == ["kill"]


async def test_a_run_handle_of_another_thread_is_no_such_run_on_postgres(
    storage: Storage, worker: Worker, workdir: Path
) -> None:
    from criogen_graph import ValidationError

    agent = bg.make_agent(storage)
    alice = await agent.thread("alice-run").submit("hello")
    assert (await alice.reply()).text == "done: rested"
    bob = agent.thread("bob-run").run(alice.id)
    for call in (bob.status, bob.reply, bob.cancel):
        with pytest.raises(ValidationError) as exc:
            await call()
        assert exc.value.code == "unknown"


async def test_queued_answers_are_redacted_in_the_job_table(pg_schema_url: str) -> None:
    """No worker runs: the answers sit in the queue, then are cancelled for good."""
    import psycopg

    from criogen_graph import FakeReply, Redactor, tool

    @tool
    async def refund(order_id: str) -> str:
        """Refund."""
        return "refunded"

    card, email = "4111 1111 1111 1111", "ada.lovelace@example.com"
    async with Storage(pg_schema_url) as storage:
        agent = Agent(
            FakeModel([FakeReply.tool_call("refund", {"order_id": "A-1"}, id="c1")]),
            tools=[refund],
            approve=["refund"],
            storage=storage,
            redact=Redactor.pii(),
        )
        thread = agent.thread("answers")
        asked = await thread.send("refund A-1")
        assert asked.needs_approval
        handles = [
            await thread.submit_reject(f"no: write to {email}, card {card}"),
            await thread.submit_decide({"c1": {"type": "edit", "args": {"order_id": email}}}),
            await thread.submit_decide({"c1": {"type": "respond", "message": f"card {card}"}}),
        ]

        async def stored() -> str:
            async with await psycopg.AsyncConnection.connect(pg_schema_url) as conn:
                cur = await conn.execute("SELECT args::text FROM procrastinate_jobs")
                return " ".join(r[0] for r in await cur.fetchall())

        text = await stored()
        assert "[EMAIL]" in text and "[CARD]" in text
        for handle in handles:
            assert await handle.cancel() is True
        text = await stored()
        assert email not in text and card not in text and "4111" not in text
        await close_runs(storage)


async def test_a_failed_run_error_is_sealed_under_encryption(pg_schema_url: str) -> None:
    import psycopg

    from criogen_graph import FunctionModel

    def script(messages: list[dict[str, Any]], tools: Any) -> Any:
        raise RuntimeError("the vault code is 4711-ÜNICODE")

    async with Storage(pg_schema_url, encryption_key="k1", on_busy="wait") as storage:
        agent = Agent(FunctionModel(script), storage=storage, name="sealed-errors")
        task = asyncio.create_task(Worker(agent, heartbeat_secs=0.2, stalled_after_secs=1.0).run())
        try:
            handle = await agent.thread("sealed-error").submit("open it")
            with pytest.raises(RunFailedError) as exc:
                await asyncio.wait_for(handle.reply(), 30)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert "4711" in str(exc.value)  # opened for whoever holds the key
        info = await handle.status()
        assert info.error is not None and "4711-ÜNICODE" in info.error
        async with await psycopg.AsyncConnection.connect(pg_schema_url) as conn:
            cur = await conn.execute("SELECT coalesce(error, '') FROM criogen_runs")
            rows = [r[0] for r in await cur.fetchall()]
        assert rows and all("4711" not in r and "vault" not in r for r in rows)
        await close_runs(storage)


@pytest.mark.parametrize("write", ["start", "finish"])
async def test_a_cancel_around_each_status_write_leaves_the_record_matching_the_thread(
    storage: Storage, worker: Worker, workdir: Path, monkeypatch: pytest.MonkeyPatch, write: str
) -> None:
    """The job's task is cancelled k = 0..5 loop iterations after its `write` status write
    began (an abort arriving then): the record ends final, `succeeded` exactly when the
    thread holds the run's answer, and the tool ran at most once."""
    from criogen_graph.background import postgres as pg

    start, finish, run_job = pg._start, pg._finish, pg._run_job
    targets: dict[str, int] = {}
    jobs: dict[str, asyncio.Task[Any]] = {}

    def cancel_later(run_id: str) -> None:
        k = targets.pop(run_id, None)
        if k is None:
            return
        task, loop = jobs[run_id], asyncio.get_running_loop()

        def later(n: int) -> None:
            if n == 0:
                task.cancel()
            else:
                loop.call_soon(later, n - 1)

        loop.call_soon(later, k)

    async def running(worker: Any, queue: Any, context: Any, kwargs: dict[str, Any]) -> Any:
        task = asyncio.current_task()  # the job's own (status writes run in tasks of theirs)
        assert task is not None
        jobs[kwargs["payload"]["id"]] = task
        return await run_job(worker, queue, context, kwargs)

    async def starting(queue: Any, run_id: str, *args: Any, **kwargs: Any) -> Any:
        if write == "start":
            cancel_later(run_id)
        return await start(queue, run_id, *args, **kwargs)

    async def finishing(queue: Any, run_id: str, *args: Any, **kwargs: Any) -> Any:
        if write == "finish":
            cancel_later(run_id)
        return await finish(queue, run_id, *args, **kwargs)

    monkeypatch.setattr(pg, "_run_job", running)
    monkeypatch.setattr(pg, "_start", starting)
    monkeypatch.setattr(pg, "_finish", finishing)
    agent = bg.make_agent(storage)
    for k in range(6):
        thread = agent.thread(f"cancel-{write}-{k}")
        handle = await thread.submit("nap")
        targets[handle.id] = k
        deadline = asyncio.get_running_loop().time() + 30
        info = await handle.status()
        while not info.done:
            assert asyncio.get_running_loop().time() < deadline, (k, info)
            await asyncio.sleep(0.02)
            info = await handle.status()
        head = (await thread.history(limit=1)) or [{"status": None, "run_id": None}]
        answered = head[0]["status"] == "completed" and head[0]["run_id"] == handle.id
        assert (info.status == "succeeded") == answered, (k, info, head)
        assert info.status in ("succeeded", "cancelled"), (k, info)
        naps = [e for e in bg.ledger(workdir) if e[0] == "nap" and e[1] == thread.id]
        assert len(naps) <= 1, (k, naps)
