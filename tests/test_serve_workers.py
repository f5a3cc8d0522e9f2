"""N servers + M workers on one PostgreSQL: `criogen-graph serve --workers external`
queues every run for the `criogen-graph worker` processes, and a client of any server
follows the run's events as the worker writes them. Two real `serve` processes, two real
workers, `langgraph_sdk` as the client: a run streamed from server A is executed by a
worker; its approval is answered with a Command through server B; a worker SIGKILLed in
the middle of a tool is replaced by the other, and the client's stream (and a
`join_stream` from the other server, resumed with `Last-Event-ID`) ends with the answer,
numbered without a gap, while the tool that had finished never runs again."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from criogen_graph import Storage, ValidationError
from tests.conftest import ROOT, fresh_schema
from tests.reliability import _background_agents as bg

pytest.importorskip("langgraph_sdk")
pytest.importorskip("starlette")
pytest.importorskip("procrastinate")

from tests.test_serve import Server, _client, serve

AGENTS = (
    "tests.reliability._background_agents:agent",
    "tests.reliability._background_agents:approver",
)
HEARTBEAT, STALLED_AFTER = "0.2", "1.0"
#: Seconds between the servers' SSE heartbeats (15 by default).
SSE_HEARTBEAT = "0.3"
INPUT = "messages"
#: Every mode the server sends: the ids of the events then count 1, 2, 3, ... with no gap.
ALL_MODES = ["values", "updates", "custom", "messages-tuple", "messages"]

pytestmark = pytest.mark.asyncio(loop_scope="module")


class Cluster:
    """Two `serve --workers external` processes and the workers of one schema."""

    def __init__(
        self,
        url: str,
        workdir: Path,
        agents: tuple[str, ...] = AGENTS,
        timing: tuple[str, str] = (HEARTBEAT, STALLED_AFTER),
    ) -> None:
        self.url = url
        self.workdir = workdir
        self.agents = agents
        #: The workers' --heartbeat and --stalled-after.
        self.timing = timing
        self.servers: list[Server] = []
        self.workers: list[subprocess.Popen[bytes]] = []

    def start_worker(self) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("CRIOGEN_EXAMPLE_MODEL", None)  # the scripted models, as `serve` has them
        log = open(self.workdir / f"worker-{len(self.workers)}.log", "wb")  # noqa: SIM115
        args = [a for spec in self.agents for a in ("--agent", spec)]
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "criogen_graph",
                "worker",
                *args,
                "--storage",
                self.url,
                "--heartbeat",
                self.timing[0],
                "--stalled-after",
                self.timing[1],
            ],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.workers.append(proc)
        return proc

    def logs(self) -> str:
        files = sorted(self.workdir.glob("worker-*.log")) + sorted(self.workdir.glob("serve-*"))
        return "\n".join(f"== {p.name}\n{p.read_text()}" for p in files)

    def stop_workers(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.workers:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_registered(cluster: Cluster, count: int) -> None:
    import psycopg

    deadline = time.monotonic() + 60
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        while True:
            ready = conn.execute("SELECT to_regclass('procrastinate_workers')").fetchone()
            row = (
                conn.execute("SELECT count(*) FROM procrastinate_workers").fetchone()
                if ready is not None and ready[0] is not None
                else None
            )
            if row is not None and row[0] >= count:
                return
            if time.monotonic() > deadline or any(p.poll() is not None for p in cluster.workers):
                pytest.fail(f"the workers did not start:\n{cluster.logs()}")
            time.sleep(0.05)


@contextmanager
def running_cluster(
    workdir: Path,
    *options: str,
    agents: tuple[str, ...] = AGENTS,
    workers: int = 2,
    servers: int = 2,
    served: tuple[str, ...] = (),
    timing: tuple[str, str] = (HEARTBEAT, STALLED_AFTER),
) -> Iterator[Cluster]:
    """`servers` processes of `criogen-graph serve --workers external *options` and
    `workers` worker processes of `agents`, on a PostgreSQL schema of their own (the
    servers also serve the agents of `served`, which no worker has)."""
    old = os.environ.get("CRIOGEN_BG_WORKDIR")
    os.environ["CRIOGEN_BG_WORKDIR"] = str(workdir)
    try:
        with fresh_schema("criogen_sw") as url, ExitStack() as stack:
            c = Cluster(url, workdir, agents, timing)
            for _ in range(workers):
                c.start_worker()
            if workers:
                _wait_registered(c, workers)
            for _ in range(servers):
                c.servers.append(
                    stack.enter_context(
                        serve(
                            c.url,
                            workdir,
                            "--workers",
                            "external",
                            *options,
                            agents=agents + served,
                        )
                    )
                )
            try:
                yield c
            finally:
                c.stop_workers()
    finally:
        if old is None:
            del os.environ["CRIOGEN_BG_WORKDIR"]
        else:
            os.environ["CRIOGEN_BG_WORKDIR"] = old


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("serve-workers")
    with running_cluster(workdir, "--heartbeat", SSE_HEARTBEAT) as c:
        yield c


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def clients(cluster: Cluster) -> AsyncIterator[tuple[Any, Any]]:
    a, b = (_client(s.url) for s in cluster.servers)
    try:
        yield a, b
    finally:
        await a.aclose()
        await b.aclose()


def _ledger(cluster: Cluster, thread_id: str) -> list[list[str]]:
    return [e for e in bg.ledger(cluster.workdir) if e[1] == thread_id]


def _final_values(parts: list[Any]) -> dict[str, Any]:
    values = [p.data for p in parts if p.event == "values"]
    assert values, [p.event for p in parts]
    last: dict[str, Any] = values[-1]
    return last


def _ids(parts: list[Any]) -> list[int]:
    return [int(p.id) for p in parts if p.id is not None]


async def _collect(stream: Any) -> list[Any]:
    return [p async for p in stream]


async def test_a_run_streamed_from_one_server_is_executed_by_a_worker_and_answered_via_the_other(
    cluster: Cluster, clients: tuple[Any, Any]
) -> None:
    a, b = clients
    thread_id = (await a.threads.create())["thread_id"]
    parts = await asyncio.wait_for(
        _collect(
            a.runs.stream(
                thread_id,
                "bg-approver",
                input={INPUT: [{"role": "user", "content": "nap please"}]},
                stream_mode=ALL_MODES,
            )
        ),
        60,
    )
    assert parts[0].event == "metadata"
    # Every event the worker wrote reached the client in order, none missing.
    ids = _ids(parts)
    assert ids == list(range(1, len(ids) + 1)), ids
    final = _final_values(parts)
    (request,) = final["__interrupt__"][0]["value"]["requests"]
    assert request["tool"] == "nap"
    assert not _ledger(cluster, thread_id)  # asked, not run
    assert (await b.threads.get(thread_id))["status"] == "interrupted"

    resumed = await asyncio.wait_for(
        _collect(
            b.runs.stream(
                thread_id,
                "bg-approver",
                command={"resume": {request["call_id"]: "approve"}},
                stream_mode=["values"],
            )
        ),
        60,
    )
    done = _final_values(resumed)
    assert "__interrupt__" not in done
    assert done["messages"][-1]["content"] == "done: rested"
    naps = _ledger(cluster, thread_id)
    assert [e[0] for e in naps] == ["nap"]
    # Run by a worker process, not by either server.
    assert naps[0][4] in {str(p.pid) for p in cluster.workers}
    runs = await a.runs.list(thread_id)
    assert [r["status"] for r in runs] == ["success", "success"]
    assert (await a.threads.get(thread_id))["status"] == "idle"


async def test_a_run_outlives_the_server_that_took_it(
    cluster: Cluster, clients: tuple[Any, Any]
) -> None:
    """The server that created the run dies at once: a worker still runs it, and the
    other server reports it ended (never pending forever)."""
    a, _ = clients
    workdir = cluster.workdir / "doomed"
    workdir.mkdir()
    with serve(cluster.url, workdir, "--workers", "external", agents=AGENTS) as doomed:
        c = _client(doomed.url)
        try:
            thread_id = (await c.threads.create())["thread_id"]
            run = await c.runs.create(
                thread_id, "bg-agent", input={INPUT: [{"role": "user", "content": "nap"}]}
            )
        finally:
            await c.aclose()
        os.kill(doomed.pid, signal.SIGKILL)
    out = await asyncio.wait_for(a.runs.join(thread_id, run["run_id"]), 60)
    assert out["messages"][-1]["content"] == "done: rested"
    assert (await a.runs.get(thread_id, run["run_id"]))["status"] == "success"


async def _saved(storage: Storage, thread_id: str, call_id: str) -> bool:
    """The result of tool call `call_id` is saved (a pending write of the thread)."""
    thread = bg.make_agent(storage).thread(thread_id)
    graph, cfg = await thread._graph()
    snap = await graph.aget_state(cfg)
    for task in snap.tasks:
        result = task.result if isinstance(task.result, dict) else {}
        for m in result.get("messages") or ():
            if isinstance(m, dict) and m.get("tool_call_id") == call_id:
                return True
    return False


async def _until(what: Any, cluster: Cluster, limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while not await what():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out; logs:\n{cluster.logs()}")
        await asyncio.sleep(0.02)


async def test_a_client_of_another_server_gets_heartbeats_while_a_workers_tool_runs(
    cluster: Cluster, clients: tuple[Any, Any]
) -> None:
    """A tool may run for minutes on a worker without an event: the stream of a client
    on another server process carries heartbeat comments meanwhile (proxies drop a
    silent connection), and ends when the run does."""
    a, b = clients
    thread_id = (await a.threads.create())["thread_id"]
    run = await a.runs.create(
        thread_id,
        "bg-agent",
        input={INPUT: [{"role": "user", "content": "kill"}]},
        stream_mode=["custom"],
    )
    lines: list[str] = []

    async def read() -> None:
        async with (
            httpx.AsyncClient(base_url=cluster.servers[1].url, timeout=60) as http,
            http.stream("GET", f"/threads/{thread_id}/runs/{run['run_id']}/stream") as response,
        ):
            assert response.status_code == 200
            async for line in response.aiter_lines():
                lines.append(line)

    reader = asyncio.ensure_future(read())

    async def slow_started() -> bool:
        return any(e[0] == "slow-started" for e in _ledger(cluster, thread_id))

    try:
        await _until(slow_started, cluster)
        since = len(lines)

        async def two_heartbeats() -> bool:
            return lines[since:].count(": heartbeat") >= 2

        await _until(two_heartbeats, cluster)
        # They came while the tool ran: it is still waiting for its release.
        assert "slow" not in [e[0] for e in _ledger(cluster, thread_id)]
        assert not reader.done()
    finally:
        await asyncio.wait_for(b.runs.cancel(thread_id, run["run_id"], wait=True), 60)
    await asyncio.wait_for(reader, 60)  # the stream ends with the run
    assert any(line.startswith("event: custom") for line in lines)  # the run's events too


async def test_a_run_no_worker_starts_ends_its_stream_with_an_error_saying_why(
    tmp_path: Path,
) -> None:
    """No worker alive for the start timeout: the client's stream ends with an `error`
    event naming why (not a hang, not a silent end), the run's status is `error`, and
    its job never runs, even once a worker comes. A run for an agent the workers do not
    serve ends the same way, with its own reason."""
    with running_cluster(
        tmp_path,
        "--start-timeout",
        "1",
        workers=0,
        servers=1,
        served=("tests.serve_agents:chunky",),
    ) as lonely:
        c = _client(lonely.servers[0].url)
        try:
            thread_id = (await c.threads.create())["thread_id"]
            parts = await asyncio.wait_for(
                _collect(
                    c.runs.stream(
                        thread_id,
                        "bg-agent",
                        input={INPUT: [{"role": "user", "content": "nap"}]},
                        stream_mode=["values"],
                    )
                ),
                60,
            )
            assert parts, "the stream ended without a word"
            assert parts[-1].event == "error", [p.event for p in parts]
            assert parts[-1].data["code"] == "no_worker"
            assert "no `criogen-graph worker` has been alive" in parts[-1].data["message"]
            (run,) = await c.runs.list(thread_id)
            assert run["status"] == "error"
            # Joined again later (from any server): the same end.
            again = await asyncio.wait_for(
                _collect(c.runs.join_stream(thread_id, run["run_id"])), 60
            )
            assert [p.event for p in again] == ["error"]
            assert (await c.threads.get(thread_id))["status"] != "busy"
            # `wait` answers with the reason too (the client raises it), as for a run
            # that failed while running.
            with pytest.raises(Exception, match="RunFailedError: no worker started the run"):
                await asyncio.wait_for(
                    c.runs.wait(
                        thread_id, "bg-agent", input={INPUT: [{"role": "user", "content": "nap"}]}
                    ),
                    60,
                )

            lonely.start_worker()
            _wait_registered(lonely, 1)
            other = (await c.threads.create())["thread_id"]
            unserved = await asyncio.wait_for(
                _collect(
                    c.runs.stream(
                        other,
                        "chunky",
                        input={INPUT: [{"role": "user", "content": "hi"}]},
                        stream_mode=["values"],
                    )
                ),
                60,
            )
            assert unserved[-1].event == "error", [p.event for p in unserved]
            assert unserved[-1].data["code"] == "unknown_agent"
            assert (await c.runs.list(other))[0]["status"] == "error"

            # A worker now runs what is sent now, and the failed run never ran.
            done = await asyncio.wait_for(
                c.runs.wait(
                    thread_id, "bg-agent", input={INPUT: [{"role": "user", "content": "nap"}]}
                ),
                60,
            )
            assert done["messages"][-1]["content"] == "done: rested"
            assert [e[0] for e in _ledger(lonely, thread_id)] == ["nap"]
        finally:
            await c.aclose()


async def test_a_run_a_worker_executes_is_cancelled_through_the_other_server(
    cluster: Cluster, clients: tuple[Any, Any]
) -> None:
    a, b = clients
    thread_id = (await a.threads.create())["thread_id"]
    run = await a.runs.create(
        thread_id, "bg-agent", input={INPUT: [{"role": "user", "content": "kill"}]}
    )

    async def slow_started() -> bool:
        return any(e[0] == "slow-started" for e in _ledger(cluster, thread_id))

    await _until(slow_started, cluster)
    assert (await b.threads.get(thread_id))["status"] == "busy"
    # Every server sees the run a worker executes: "reject" refuses a second one.
    with pytest.raises(httpx.HTTPStatusError) as refused:
        await b.runs.create(
            thread_id,
            "bg-agent",
            input={INPUT: [{"role": "user", "content": "nap"}]},
            multitask_strategy="reject",
        )
    assert refused.value.response.status_code == 409
    await asyncio.wait_for(b.runs.cancel(thread_id, run["run_id"], wait=True), 60)
    assert (await a.runs.get(thread_id, run["run_id"]))["status"] == "interrupted"
    assert "slow" not in [e[0] for e in _ledger(cluster, thread_id)]
    assert (await a.threads.get(thread_id))["status"] != "busy"


# Last: it leaves one worker and releases the shared `slow` tool for good.
async def test_a_sigkilled_workers_run_is_finished_by_another_and_the_stream_ends_with_the_answer(
    cluster: Cluster, clients: tuple[Any, Any]
) -> None:
    a, b = clients
    thread_id = (await a.threads.create())["thread_id"]
    stream = a.runs.stream(
        thread_id,
        "bg-agent",
        input={INPUT: [{"role": "user", "content": "kill"}]},
        stream_mode=ALL_MODES,
    )
    parts: list[Any] = []

    async def read() -> None:
        async for part in stream:
            parts.append(part)

    reader = asyncio.ensure_future(read())

    async def slow_started() -> bool:
        return any(e[0] == "slow-started" for e in _ledger(cluster, thread_id))

    storage = Storage(cluster.url)
    try:
        await _until(slow_started, cluster)
        fast_id = next(e[2] for e in _ledger(cluster, thread_id) if e[0] == "fast")
        await _until(lambda: _saved(storage, thread_id, fast_id), cluster)
    finally:
        await storage.close()
    victim_pid = next(e[4] for e in _ledger(cluster, thread_id) if e[0] == "slow-started")
    victim = next(p for p in cluster.workers if str(p.pid) == victim_pid)
    survivor = next(p for p in cluster.workers if p is not victim)
    run_id = next(p.data["run_id"] for p in parts if p.event == "metadata")
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    (cluster.workdir / "release").touch()

    await asyncio.wait_for(reader, 60)
    final = _final_values(parts)
    assert final["messages"][-1]["content"] == "done: slow done", cluster.logs()
    ids = _ids(parts)
    assert ids == list(range(1, len(ids) + 1)), ids
    # The survivor announced itself as the run's second attempt.
    attempts = [p.data.get("attempt") for p in parts if p.event == "metadata"]
    assert attempts == [1, 2]
    entries = _ledger(cluster, thread_id)
    # The finished call never ran again; the interrupted one ran again, to its end once.
    assert Counter(e[0] for e in entries) == {"fast": 1, "slow-started": 2, "slow": 1}
    assert [e[4] for e in entries if e[0] == "slow-started"] == [victim_pid, str(survivor.pid)]

    # A client of the other server reconnecting after the events it had (Last-Event-ID)
    # gets the rest, ending with the answer.
    cut = ids[len(ids) // 2]
    rest = await asyncio.wait_for(
        _collect(b.runs.join_stream(thread_id, run_id, last_event_id=str(cut))), 60
    )
    assert _ids(rest) == list(range(cut + 1, ids[-1] + 1))
    assert _final_values(rest)["messages"][-1]["content"] == "done: slow done"
    assert (await b.runs.get(thread_id, run_id))["status"] == "success"


async def test_external_workers_need_postgresql(tmp_path: Path) -> None:
    from criogen_graph.serve import create_app

    agent = bg.make_agent(f"sqlite:///{tmp_path / 'x.db'}")
    with pytest.raises(ValidationError, match="needs a PostgreSQL storage"):
        create_app(agent, workers="external")
    with pytest.raises(ValidationError, match="'inline' or 'external'"):
        create_app(agent, workers="elsewhere")
    with pytest.raises(ValidationError, match="heartbeat must be a positive number of seconds"):
        create_app(agent, heartbeat=0)
    with pytest.raises(ValidationError, match="start_timeout must be a positive number"):
        create_app(agent, start_timeout="30")  # type: ignore[arg-type]
