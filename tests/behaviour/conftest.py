"""Three ways to run the same agents, behind one small async interface, so that every
behaviour test is written once and runs over all of them:

- `thread-memory`, `thread-postgres`: our API, `agent.thread(tid).send(...)`,
  `approve()` / `reject()` / `decide()`, `thread.messages()`, `storage.audit(tid)`, on
  `Storage("memory://")` and on PostgreSQL;
- `graph-memory`, `graph-postgres`: LangGraph itself running
  `agent.graph.builder.compile(checkpointer=..., store=...)` with its own savers
  (`InMemorySaver` + `InMemoryStore`, `AsyncPostgresSaver` + `AsyncPostgresStore` on a
  fresh schema), `ainvoke(input)` and `ainvoke(Command(resume=answer))`, `aget_state`,
  `criogen_graph.read_audit(store, tid)`;
- `server`: the real `langgraph dev` (no `--allow-blocking`) serving
  `tests/behaviour/langgraph.json`, driven by `langgraph_sdk`; one server per session.

A driver speaks the JSON forms LangGraph Studio uses: input `{"messages": [{"role":
"user", ...}], "state": {...}}`, and the resume values `"approve"`, `{"type": "reject",
"message": ...}` or `{call_id: decision}` (the thread driver turns them into `approve()`,
`reject(message)` and `decide({call_id: Decision})`).

What the agents do (model input, tool runs, hook calls) is read from the log their code
appends to (see `tests/behaviour/agents.py`): this process's for the in-process drivers,
the dev server's for the server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import CriogenError, Decision, Storage
from tests.behaviour.agents import AGENTS, LOG_ENV, build
from tests.conftest import PG_URL, ROOT, require_postgres
from tests.test_studio import DEV_ARGS, _free_port, _wait_until_up, require_studio

DRIVERS = ("thread-memory", "thread-postgres", "graph-memory", "graph-postgres", "server")
CONFIG = ROOT / "tests" / "behaviour" / "langgraph.json"


# -- what a call returns -------------------------------------------------------------------


@dataclass
class Outcome:
    """What one call (a message sent, an answer given) left on the thread."""

    #: The thread's state after the call: `messages`, `run`, `state`.
    values: dict[str, Any]
    #: The approval interrupt's value when the run stopped for one, else None.
    interrupt: dict[str, Any] | None = None
    #: What failed the run: the exception (in-process drivers) or the server's
    #: `__error__` dict; None when it did not fail.
    error: Any = None
    #: The typed answer: `reply.output` for the thread driver, else `values["run"]["output"]`.
    output: Any = None

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.values.get("messages") or [])

    @property
    def run(self) -> dict[str, Any]:
        return dict(self.values.get("run") or {})

    @property
    def text(self) -> str | None:
        """The final answer: the last message when it is the assistant's."""
        msgs = self.messages
        if not msgs or msgs[-1].get("role") != "assistant":
            return None
        content = msgs[-1].get("content")
        return content if isinstance(content, str) else None


def _interrupt_of(snapshot_interrupts: Any) -> dict[str, Any] | None:
    values = [getattr(i, "value", None) for i in snapshot_interrupts or ()]
    return values[0] if values else None


# -- the log the agents write -------------------------------------------------------------


@dataclass
class Log:
    """The JSON-lines log the test agents append to, read from where a test started."""

    path: Path
    start: int = 0

    def mark(self) -> None:
        self.start = self.path.stat().st_size if self.path.exists() else 0

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(self.start)
            return [json.loads(line) for line in f.read().decode("utf-8").splitlines() if line]


# -- the drivers ---------------------------------------------------------------------------


class Driver(ABC):
    """One way of running the test agents. Thread ids come from `new_thread(agent)`."""

    kind: str  # "thread", "graph" or "server"
    backend: str  # "memory", "postgres" or "inmem" (the dev server's)

    def __init__(self, log: Log) -> None:
        self.log = log
        self.agent_of: dict[str, str] = {}

    @property
    def name(self) -> str:
        return self.kind if self.kind == "server" else f"{self.kind}-{self.backend}"

    async def new_thread(self, agent: str) -> str:
        """A new thread of the test agent `agent` (see `tests/behaviour/agents.py`)."""
        tid = await self._create()
        self.agent_of[tid] = agent
        return tid

    async def _create(self) -> str:
        return f"b-{uuid.uuid4().hex}"

    @abstractmethod
    async def send(self, tid: str, text: str, state: dict[str, Any] | None = None) -> Outcome:
        """A user message (with the run state, if given)."""

    @abstractmethod
    async def answer(self, tid: str, answer: Any) -> Outcome:
        """An answer to the pending approval, in its JSON resume form."""

    @abstractmethod
    async def values(self, tid: str) -> dict[str, Any]:
        """The thread's saved state (`messages`, `run`, `state`)."""

    async def messages(self, tid: str) -> list[dict[str, Any]]:
        """The saved transcript."""
        return list((await self.values(tid)).get("messages") or [])

    @abstractmethod
    async def audit(self, tid: str) -> list[dict[str, Any]]:
        """The thread's audit records, oldest first."""

    def hook_log(self) -> list[dict[str, Any]]:
        """What the agents' code logged since the test started: `model` (the messages
        the model got), `tool` (a tool ran), and the `Recorder` hook's calls."""
        return self.log.read()

    async def close(self) -> None:
        return None


def _input(text: str, state: dict[str, Any] | None) -> dict[str, Any]:
    payload: dict[str, Any] = {"messages": [{"role": "user", "content": text}]}
    if state is not None:
        payload["state"] = state
    return payload


class ThreadDriver(Driver):
    """Our API: `agent.thread(tid)` on a `Storage`."""

    kind = "thread"

    def __init__(self, log: Log, storage: Storage, backend: str) -> None:
        super().__init__(log)
        self.storage = storage
        self.backend = backend
        self._agents: dict[str, Any] = {}
        self._readers: dict[str, Any] = {}

    def agent(self, tid: str) -> Any:
        name = self.agent_of[tid]
        if name not in self._agents:
            self._agents[name] = build(name, self.storage)
        return self._agents[name]

    async def _call(self, tid: str, call: Any) -> Outcome:
        try:
            reply = await call
        except CriogenError as exc:
            return Outcome(await self.values(tid), interrupt=await self._interrupt(tid), error=exc)
        values = await self.values(tid)
        interrupt = await self._interrupt(tid)
        if reply.needs_approval:
            assert interrupt is not None, "the reply needs approval, the thread holds no interrupt"
            assert [r.to_dict() for r in reply.approvals] == interrupt["requests"]
        return Outcome(values, interrupt=interrupt, output=reply.output)

    async def send(self, tid: str, text: str, state: dict[str, Any] | None = None) -> Outcome:
        thread = self.agent(tid).thread(tid, actor="tester")
        return await self._call(tid, thread.send(text, state=state))

    async def answer(self, tid: str, answer: Any) -> Outcome:
        thread = self.agent(tid).thread(tid, actor="tester")
        if answer == "approve":
            return await self._call(tid, thread.approve())
        if isinstance(answer, dict) and answer.get("type") == "reject":
            return await self._call(tid, thread.reject(answer.get("message") or "rejected"))
        decisions = {cid: Decision.coerce(d) for cid, d in answer.items()}
        return await self._call(tid, thread.decide(decisions))

    async def _snapshot(self, tid: str) -> Any:
        name = self.agent_of[tid]
        await self.storage.open()
        reader = self._readers.get(name)
        if reader is None or reader[0] is not self.storage.checkpointer:
            graph = AGENTS[name].graph.builder.compile(checkpointer=self.storage.checkpointer)
            reader = self._readers[name] = (self.storage.checkpointer, graph)
        return await reader[1].aget_state({"configurable": {"thread_id": tid}})

    async def _interrupt(self, tid: str) -> dict[str, Any] | None:
        return _interrupt_of((await self._snapshot(tid)).interrupts)

    async def values(self, tid: str) -> dict[str, Any]:
        return dict((await self._snapshot(tid)).values)

    async def messages(self, tid: str) -> list[dict[str, Any]]:
        saved: list[dict[str, Any]] = await self.agent(tid).thread(tid).messages()
        return saved

    async def audit(self, tid: str) -> list[dict[str, Any]]:
        return await self.storage.audit(tid)

    async def close(self) -> None:
        await self.storage.close()


class GraphDriver(Driver):
    """LangGraph running `agent.graph` itself, with LangGraph's own checkpointer and store."""

    kind = "graph"

    def __init__(self, log: Log, checkpointer: Any, store: Any, backend: str) -> None:
        super().__init__(log)
        self.checkpointer = checkpointer
        self.store = store
        self.backend = backend
        self._graphs: dict[str, Any] = {}

    def graph(self, tid: str) -> Any:
        name = self.agent_of[tid]
        if name not in self._graphs:
            builder = AGENTS[name].graph.builder
            self._graphs[name] = builder.compile(checkpointer=self.checkpointer, store=self.store)
        return self._graphs[name]

    @staticmethod
    def config(tid: str) -> Any:
        return {"configurable": {"thread_id": tid}}

    async def _call(self, tid: str, payload: Any) -> Outcome:
        error: BaseException | None = None
        try:
            await self.graph(tid).ainvoke(payload, self.config(tid))
        except Exception as exc:  # the run failed: LangGraph raises the node's error
            error = exc
        snap = await self.graph(tid).aget_state(self.config(tid))
        values = dict(snap.values)
        return Outcome(
            values,
            interrupt=_interrupt_of(snap.interrupts),
            error=error,
            output=(values.get("run") or {}).get("output"),
        )

    async def send(self, tid: str, text: str, state: dict[str, Any] | None = None) -> Outcome:
        return await self._call(tid, _input(text, state))

    async def answer(self, tid: str, answer: Any) -> Outcome:
        from langgraph.types import Command

        return await self._call(tid, Command(resume=answer))

    async def values(self, tid: str) -> dict[str, Any]:
        return dict((await self.graph(tid).aget_state(self.config(tid))).values)

    async def audit(self, tid: str) -> list[dict[str, Any]]:
        import criogen_graph

        read_audit: Any = criogen_graph.read_audit  # the public reader of audit records
        records: list[dict[str, Any]] = await read_audit(self.store, tid)
        return records


class ServerDriver(Driver):
    """The real `langgraph dev`, through the official `langgraph_sdk` client."""

    kind = "server"
    backend = "inmem"

    def __init__(self, log: Log, client: Any) -> None:
        super().__init__(log)
        self.client = client

    async def _create(self) -> str:
        thread_id: str = (await self.client.threads.create())["thread_id"]
        return thread_id

    async def _call(self, tid: str, **kwargs: Any) -> Outcome:
        out = await self.client.runs.wait(tid, self.agent_of[tid], raise_error=False, **kwargs)
        error = out.get("__error__") if isinstance(out, dict) else None
        state = await self.client.threads.get_state(tid)
        values = dict(state["values"] or {})
        interrupts = [i["value"] for i in state.get("interrupts") or ()]
        return Outcome(
            values,
            interrupt=interrupts[0] if interrupts else None,
            error=error,
            output=(values.get("run") or {}).get("output"),
        )

    async def send(self, tid: str, text: str, state: dict[str, Any] | None = None) -> Outcome:
        return await self._call(tid, input=_input(text, state))

    async def answer(self, tid: str, answer: Any) -> Outcome:
        return await self._call(tid, command={"resume": answer})

    async def values(self, tid: str) -> dict[str, Any]:
        return dict((await self.client.threads.get_state(tid))["values"] or {})

    async def audit(self, tid: str) -> list[dict[str, Any]]:
        found = await self.client.store.search_items(["criogen_audit", tid], limit=1000)
        records = [item["value"] for item in found["items"]]
        # Oldest first (`ts_ns`, where a record has it, orders those of one millisecond).
        return sorted(records, key=lambda r: (r["ts_ms"], r.get("ts_ns", 0)))


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def local_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The log of agents run in this process (the variable set for the whole session)."""
    path = tmp_path_factory.mktemp("behaviour") / "local-log.jsonl"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(LOG_ENV, str(path))
        yield path


@dataclass
class BehaviourServer:
    url: str
    log: Path
    dev_log: Path


@pytest.fixture(scope="session")
def behaviour_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BehaviourServer]:
    """`langgraph dev` serving `tests/behaviour/langgraph.json` on a free loopback port,
    from a temporary directory (it writes `.langgraph_api/` into its working directory),
    with the agents' log variable set; stopped by its process group."""
    require_studio()
    workdir = tmp_path_factory.mktemp("behaviour-server")
    log = workdir / "server-log.jsonl"
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "CRIOGEN_EXAMPLE_MODEL"}
    env.update(
        LANGGRAPH_CLI_NO_ANALYTICS="1",
        LANGSMITH_TRACING="false",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
    )
    env[LOG_ENV] = str(log)
    dev_log = workdir / "dev.log"
    with dev_log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "langgraph_cli",
                *DEV_ARGS,
                "--port",
                str(port),
                "--config",
                str(CONFIG),
            ],
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(proc, url, dev_log, within=60)
        yield BehaviourServer(url, log, dev_log)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


@pytest.fixture(scope="session")
def graph_pg_url() -> Iterator[str]:
    """A fresh schema with LangGraph's own checkpoint and store tables (set up once per
    session, dropped after): what a user of `AsyncPostgresSaver` / `AsyncPostgresStore`
    runs `setup()` for."""
    require_postgres()
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.store.postgres import PostgresStore

    schema = f"criogen_behaviour_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in PG_URL else "?"
    url = f"{PG_URL}{sep}options=-csearch_path%3D{schema}"
    try:
        # The sync savers' setup: this may run inside the event loop of an async fixture.
        with PostgresSaver.from_conn_string(url) as saver:
            saver.setup()
        with PostgresStore.from_conn_string(url) as store:
            store.setup()
        yield url
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture(params=DRIVERS)
async def driver(request: pytest.FixtureRequest, local_log: Path) -> AsyncIterator[Driver]:
    """Each behaviour test runs once per way of running the agents."""
    kind = str(request.param)
    made: Driver
    if kind == "server":
        from langgraph_sdk import get_client

        server: BehaviourServer = request.getfixturevalue("behaviour_server")
        client = get_client(url=server.url)
        made = ServerDriver(Log(server.log), client)
        made.log.mark()
        try:
            yield made
        finally:
            await client.aclose()
        return
    log = Log(local_log)
    log.mark()
    if kind == "thread-memory":
        made = ThreadDriver(log, Storage("memory://"), "memory")
    elif kind == "thread-postgres":
        require_postgres()
        made = ThreadDriver(log, Storage(PG_URL), "postgres")
    elif kind == "graph-memory":
        from langgraph.checkpoint.memory import InMemorySaver
        from langgraph.store.memory import InMemoryStore

        made = GraphDriver(log, InMemorySaver(), InMemoryStore(), "memory")
    else:
        url: str = request.getfixturevalue("graph_pg_url")
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from langgraph.store.postgres.aio import AsyncPostgresStore

        async with (
            AsyncPostgresSaver.from_conn_string(url) as saver,
            AsyncPostgresStore.from_conn_string(url) as store,
        ):
            yield GraphDriver(log, saver, store, "postgres")
        return
    try:
        yield made
    finally:
        await made.close()
