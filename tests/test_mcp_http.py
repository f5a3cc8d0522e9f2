"""MCP over streamable HTTP: sessions, against the SDK's own server run as a process
(tests/mcp_servers/session_server.py) on a loopback port and restarted by killing it.

A restarted server has forgotten the session: the client starts a new one (once, however
many calls notice) and sends again a call the server refused for the session, and never
a call whose outcome is unknown. A server that was down or restarted while the tools
were listed is tried again on the next run. `aclose()` ends the session with a DELETE.
The startup timeout bounds the handshake and the listing. Faults: an answer cut in the
middle of its event, an answer that is not JSON, a server that dies in the middle of a
call, a session id with characters the protocol does not allow, a server that refuses
every call, a server that never answers the DELETE.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from criogen_graph import Agent, FakeModel, FakeReply, FunctionModel, McpServer, McpServerError
from tests.conftest import wait_until

SERVER = Path(__file__).resolve().parent / "mcp_servers" / "session_server.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SessionServer:
    """session_server.py on a port of its own, restarted by killing the process and
    letting a warm spare (started with it, already past its imports) bind the port."""

    def __init__(self, tmp_path: Path, *options: str, restarts: int = 0) -> None:
        self.ledger = tmp_path / f"ledger-{uuid.uuid4().hex[:12]}"
        self.ledger.touch()
        self.options = options
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        # Spawned together: the imports of all of them run at once.
        self._spares = [self._spawn() for _ in range(restarts + 1)]
        self.proc: subprocess.Popen[str] | None = None

    def _spawn(self) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [
                sys.executable,
                str(SERVER),
                str(self.ledger),
                "--port",
                str(self.port),
                "--spare",
                *self.options,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def start(self) -> None:
        """Bind the next spare to the port; return once it accepts requests."""
        proc = self._spares.pop(0)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        ready = proc.stdout.readline()  # blocks until it listens (or dies: "")
        assert ready == f"READY {self.port}\n", f"the server did not start: {ready!r}"
        self.proc = proc

    def kill(self) -> None:
        """Kill the serving process (it forgets every session)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        self.kill()
        for proc in self._spares:
            proc.kill()
            proc.wait(timeout=10)
        self._spares = []

    def lines(self, prefix: str = "") -> list[str]:
        return [
            line
            for line in self.ledger.read_text(encoding="utf-8").splitlines()
            if line.startswith(prefix)
        ]

    def tagged(self, kind: str, tag: str = "-") -> list[list[str]]:
        """The ledger lines `<kind> ... <tag>` (their middle words)."""
        return [line.split()[1:-1] for line in self.lines(kind + " ") if line.endswith(" " + tag)]

    def sessions(self, tag: str = "-") -> list[str]:
        """The ids of the sessions started (by the client tagged `tag`), in order."""
        return [words[0] for words in self.tagged("init", tag)]

    def deletes(self, tag: str = "-") -> list[str]:
        """`<session id> <status>` of each DELETE (of the client tagged `tag`)."""
        return [" ".join(words) for words in self.tagged("delete", tag)]

    def calls(self, tool: str, tag: str = "-") -> int:
        """How many calls of `tool` (by the client tagged `tag`) arrived."""
        return sum(words == [tool] for words in self.tagged("call", tag))

    def client(self, *faults: str, **options: Any) -> tuple[McpServer, str]:
        """An McpServer for this server, asking for `faults`, with a tag of its own."""
        tag = uuid.uuid4().hex[:12]
        headers = {"x-test-tag": tag, "x-test-fault": ",".join(faults)}
        return McpServer.http(self.url, headers=headers, **options), tag


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionServer]:
    """One server for the tests that do not restart it (each tags its own lines)."""
    server = SessionServer(tmp_path_factory.mktemp("shared"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Any]:
    """Make session servers (`servers(*options, restarts=n)`); all are stopped after."""
    made: list[SessionServer] = []

    def make(*options: str, restarts: int = 0, start: bool = True) -> SessionServer:
        server = SessionServer(tmp_path, *options, restarts=restarts)
        made.append(server)
        if start:
            server.start()
        return server

    yield make
    for server in made:
        server.stop()


def tool_messages(result: Any) -> list[dict[str, Any]]:
    return [m for m in result.messages if m["role"] == "tool"]


def calls(*calls: tuple[str, dict[str, Any]]) -> FunctionModel:
    """A model that asks for `calls` at once, then says "done"."""

    def fn(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if messages[-1]["role"] == "user":
            return FakeReply.tool_calls(*calls)
        return "done"

    return FunctionModel(fn)


def by_prompt(**runs: list[tuple[str, dict[str, Any]]]) -> FunctionModel:
    """A model that asks for the calls named by the prompt at once, then says "done"."""

    def fn(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if messages[-1]["role"] == "user":
            return FakeReply.tool_calls(*runs[messages[-1]["content"]])
        return "done"

    return FunctionModel(fn)


def still_known(url: str, session: str) -> bool:
    """Whether the server still knows the session (it answers 404, or 400 when it
    predates the spec's fix, once it does not)."""
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    headers = {
        "mcp-session-id": session,
        "mcp-protocol-version": "2025-11-25",
        "accept": "application/json, text/event-stream",
    }
    status = httpx.post(url, json=ping, headers=headers, timeout=10).status_code
    assert status in (200, 400, 404), status
    return status == 200


# -- a restarted server: a new session, and the refused call sent again --------------------


@pytest.mark.parametrize("status", ["404", "400"])
async def test_after_a_restart_one_new_session_serves_every_waiting_call(
    servers: Any, status: str
) -> None:
    """The restarted server answers the old session id with 404 (the spec) or 400 (SDKs
    before the 2025-06 fix): the calls did not run, so they go to one new session."""
    http = servers("--unknown-session", status, restarts=1)
    labels = [f"after-{i}" for i in range(6)]
    model = by_prompt(
        before=[("count", {"label": "before"})],
        after=[("count", {"label": label}) for label in labels],
    )
    async with Agent(model, tools=[McpServer.http(http.url)]) as agent:
        result = await agent.run("before")
        assert tool_messages(result)[0]["content"] == "1"
        (first,) = http.sessions()

        http.restart()
        assert not still_known(http.url, first)
        result = await agent.run("after")  # the tools are listed: straight to the calls
    messages = tool_messages(result)
    assert [(m["status"], m["content"]) for m in messages] == [("ok", "1")] * 6
    # six calls noticed the restart; one new session served them all
    assert len(http.sessions()) == 2
    assert sorted(http.lines("count ")) == sorted(
        ["count before", *[f"count {label}" for label in labels]]
    )


async def test_a_call_the_new_session_refuses_too_is_sent_only_twice(
    shared: SessionServer,
) -> None:
    """A 400 to a call may mean the server forgot the session: it is sent once more, to
    a new session; refused there too, it is the model's error (no loop)."""
    server, tag = shared.client("refuse=tools/call")
    async with Agent(calls(("count", {"label": tag})), tools=[server]) as agent:
        result = await agent.run("go")
    (msg,) = tool_messages(result)
    assert msg["status"] == "error"
    assert (
        "refused the call to count (HTTP 400 Bad Request), for a new session too"
        in (msg["content"])
    )
    assert "Bad Request: tools/call refused" in msg["content"]
    assert len(shared.sessions(tag)) == 2
    assert shared.calls("count", tag) == 2
    assert shared.lines(f"count {tag}") == []


# -- calls whose outcome is unknown are never sent again -------------------------------------


async def test_a_call_cut_off_after_it_was_sent_is_not_sent_again(shared: SessionServer) -> None:
    server, tag = shared.client()
    model = by_prompt(cut=[("cut", {})], count=[("count", {"label": tag})])
    async with Agent(model, tools=[server]) as agent:
        result = await agent.run("cut")
        (msg,) = tool_messages(result)
        assert msg["status"] == "error"
        assert msg["content"].startswith("Error: McpServerError: ")
        assert "may or may not have taken effect, so it is not sent again" in msg["content"]
        result = await agent.run("count")
        assert tool_messages(result)[0]["content"] == "1"
    assert shared.calls("cut", tag) == 1
    assert len(shared.sessions(tag)) == 1  # the session was still good


async def test_an_answer_that_is_not_json_is_an_error_and_not_sent_again(
    shared: SessionServer,
) -> None:
    server, tag = shared.client()
    model = calls(("garbage", {}), ("count", {"label": tag}))
    async with Agent(model, tools=[server]) as agent:
        result = await agent.run("go")
    garbage, count = tool_messages(result)
    assert garbage["status"] == "error"
    assert (
        "the MCP server's answer to the call to garbage could not be read" in (garbage["content"])
    )
    assert "may or may not have taken effect" in garbage["content"]
    assert count["content"] == "1"
    assert shared.calls("garbage", tag) == 1
    assert len(shared.sessions(tag)) == 1


async def test_a_server_that_dies_during_a_call_is_not_sent_it_again(servers: Any) -> None:
    http = servers(restarts=1)
    server = McpServer.http(http.url)
    async with Agent(calls(("die", {})), tools=[server]) as agent:
        result = await agent.run("go")
        (msg,) = tool_messages(result)
        assert msg["status"] == "error"
        assert "may or may not have taken effect, so it is not sent again" in msg["content"]
        assert http.proc is not None
        http.proc.wait(timeout=10)
        http.start()
        result = await Agent(calls(("count", {"label": "x"})), tools=[server]).run("go")
        assert tool_messages(result)[0]["content"] == "1"
    assert http.lines("die") == ["die"]
    assert len(http.sessions()) == 2


async def test_calls_running_when_the_server_restarts_fail_and_new_calls_go_on(
    servers: Any,
) -> None:
    http = servers(restarts=1)
    server = McpServer.http(http.url)
    parked = calls(("park", {"label": "a"}), ("park", {"label": "b"}))
    async with Agent(parked, tools=[server]) as agent:
        running = asyncio.create_task(agent.run("go"))
        await wait_until(lambda: len(http.lines("park ")) == 2, what="both calls to run")
        http.restart()
        result = await Agent(calls(("count", {"label": "x"})), tools=[server]).run("go")
        assert tool_messages(result)[0]["content"] == "1"
        parked_result = await asyncio.wait_for(running, 20)
    for msg in tool_messages(parked_result):
        assert msg["status"] == "error"
        assert "may or may not have taken effect, so it is not sent again" in msg["content"]
    assert sorted(http.lines("park ")) == ["park a", "park b"]
    assert len(http.sessions()) == 2


async def test_a_call_to_a_server_that_is_down_says_so_and_the_next_run_reconnects(
    servers: Any,
) -> None:
    """The connection is refused: the call never left, so it is not "unknown" (it was
    sent once more, to a new session that could not start)."""
    http = servers(restarts=1)
    model = by_prompt(one=[("count", {"label": "one"})], two=[("count", {"label": "two"})])
    async with Agent(model, tools=[McpServer.http(http.url)]) as agent:
        await agent.run("one")
        http.kill()
        result = await agent.run("two")
        (msg,) = tool_messages(result)
        assert msg["status"] == "error"
        assert (
            "stopped and could not be connected to again: could not be reached" in (msg["content"])
        )
        assert "may or may not have taken effect" not in msg["content"]
        http.start()
        result = await agent.run("two")
    assert tool_messages(result)[0]["content"] == "1"
    assert http.lines("count ") == ["count one", "count two"]


# -- listing the tools -----------------------------------------------------------------------


async def test_a_server_restarted_before_the_tools_are_listed(servers: Any) -> None:
    http = servers(restarts=1)
    server = McpServer.http(http.url)
    async with server:  # a session, then the server restarts before the first run
        http.restart()
        result = await Agent(calls(("count", {"label": "x"})), tools=[server]).run("go")
    assert tool_messages(result)[0]["content"] == "1"
    assert len(http.sessions()) == 2


async def test_a_server_down_when_the_tools_are_listed_is_tried_on_the_next_run(
    servers: Any,
) -> None:
    http = servers(restarts=1, start=False)
    server = McpServer.http(http.url)
    agent = Agent(
        calls(("count", {"label": "x"})), tools=[server], on_tool_exception="return_to_model"
    )
    async with agent:
        with pytest.raises(McpServerError) as info:
            await agent.run("go")  # nothing listens yet
        assert info.value.code == "mcp_unavailable"
        assert "could not be reached" in str(info.value)
        http.start()
        async with server:
            http.kill()  # a session, then the server is gone
            with pytest.raises(McpServerError) as info:
                await agent.run("go")
            assert "could not be reached" in str(info.value)
            http.start()
            result = await agent.run("go")
    assert tool_messages(result)[0]["content"] == "1"
    assert len(http.sessions()) == 2


# -- the end of a session --------------------------------------------------------------------


async def test_aclose_ends_the_session_with_delete(shared: SessionServer) -> None:
    server, tag = shared.client()
    async with Agent(calls(("count", {"label": tag})), tools=[server]) as agent:
        await agent.run("go")
        (session,) = shared.sessions(tag)
        assert still_known(shared.url, session)
    # agent.aclose() closed the server: the server forgot the session
    assert shared.deletes(tag) == [f"{session} 200"]
    assert not still_known(shared.url, session)

    async with server:  # used again: a new session, ended again
        (_, second) = shared.sessions(tag)
    assert shared.deletes(tag) == [f"{session} 200", f"{second} 200"]
    await server.aclose()  # twice is fine
    assert len(shared.deletes(tag)) == 2


async def test_aclose_does_not_wait_long_for_a_server_that_never_answers_delete(
    shared: SessionServer,
) -> None:
    server, tag = shared.client("stall=DELETE", startup_timeout_secs=1)
    assert len(await server.load_tools()) > 1  # a session
    # ended within the grace period (the startup timeout here), not the read timeout
    await asyncio.wait_for(server.aclose(), 3)
    assert shared.deletes(tag) == []  # it never answered


# -- the startup timeout ---------------------------------------------------------------------


async def expect_startup_timeout(server: McpServer, secs: float, what: str) -> None:
    """The first run fails with `what` within 3x the startup timeout `secs`."""
    started = time.monotonic()
    try:
        with pytest.raises(McpServerError) as info:
            await asyncio.wait_for(Agent(FakeModel(["x"]), tools=[server]).run("go"), 3 * secs)
    finally:
        await server.aclose()
    assert time.monotonic() - started < 3 * secs
    assert info.value.code == "mcp_unavailable"
    assert what in str(info.value)


async def test_startup_timeout_when_nothing_answers_the_connection() -> None:
    # the kernel accepts the connection; nobody ever reads it
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        url = f"http://127.0.0.1:{s.getsockname()[1]}/mcp"
        server = McpServer.http(url, startup_timeout_secs=1)
        await expect_startup_timeout(server, 1, "did not start within 1 s")


@pytest.mark.parametrize(
    ("method", "what"),
    [
        ("initialize", "did not start within 1 s"),
        ("notifications/initialized", "did not list its tools within 1 s"),
        ("tools/list", "did not list its tools within 1 s"),
    ],
)
async def test_startup_timeout_when_the_handshake_or_listing_never_ends(
    shared: SessionServer, method: str, what: str
) -> None:
    server, _ = shared.client(f"stall={method}", startup_timeout_secs=1)
    await expect_startup_timeout(server, 1, what)


# -- odd session ids -------------------------------------------------------------------------


async def test_a_session_id_with_characters_the_protocol_does_not_allow(
    shared: SessionServer,
) -> None:
    server, tag = shared.client("odd-session-id", name="odd")
    with pytest.raises(McpServerError) as info:
        await asyncio.wait_for(Agent(FakeModel(["x"]), tools=[server]).run("go"), 20)
    assert info.value.code == "mcp_unavailable"
    assert str(info.value) == (
        f"MCP server 'odd' answered at {shared.url} with a session id that has characters "
        "the protocol does not allow (only visible ASCII)"
    )
    assert len(shared.sessions(tag)) == 1  # no second try: the next run tries again
