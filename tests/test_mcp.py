"""MCP servers as tools, through real agents and real MCP servers (tests/mcp_servers):
listing, calls and results, validation, approvals, hooks, timeouts, exception policies,
one session per loop, closing, reconnecting after a crash, servers that cannot start,
streamable HTTP with a header, and durable threads that never re-run a finished call."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import (
    Agent,
    FakeModel,
    FakeReply,
    FunctionModel,
    Hook,
    Limits,
    McpServer,
    McpServerError,
    McpTool,
    ToolCall,
    ToolExecutionError,
    ValidationError,
)
from tests.conftest import ROOT, wait_until

SERVERS = Path(__file__).resolve().parent / "mcp_servers"
TOKEN = "t0ken-for-tests"
ALL_TOOLS = {
    "add",
    "echo",
    "stats",
    "fail",
    "crash",
    "slow",
    "pid",
    "count",
    "wait_for",
    "picture",
}


def stdio_server(state: Path, **kw: Any) -> McpServer:
    """The test server of tests/mcp_servers/stdio_server.py, noting what it does in `state`."""
    return McpServer.stdio(
        sys.executable,
        [str(SERVERS / "stdio_server.py")],
        env={"MCP_TEST_DIR": str(state)},
        **kw,
    )


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def tool_messages(result: Any) -> list[dict[str, Any]]:
    return [m for m in result.messages if m["role"] == "tool"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def then(*replies: Any, seen: list[list[dict[str, Any]]] | None = None) -> FunctionModel:
    """A model that plays `replies` in order (and records the transcripts it gets in
    `seen`)."""
    script = list(replies)

    def fn(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if seen is not None:
            seen.append(messages)
        return script.pop(0)

    return FunctionModel(fn)


# -- the package and the listing ---------------------------------------------------------


def test_import_criogen_graph_does_not_load_mcp() -> None:
    code = (
        "import sys, criogen_graph\n"
        "criogen_graph.McpServer, criogen_graph.McpTool, criogen_graph.McpServerError\n"
        "print('mcp' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


def test_missing_mcp_package_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mcp", None)
    # From a checkout (`-e .`) or, once published, by name.
    with pytest.raises(ImportError, match=r"pip install (-e '\.|'criogen-graph)\[mcp\]'"):
        McpServer.stdio("some-server")


def test_bad_options_fail_at_construction() -> None:
    with pytest.raises(ValidationError, match="http:// or https://"):
        McpServer.http("ftp://example.com/mcp")
    with pytest.raises(TypeError, match="args"):
        McpServer.stdio("python", "server.py")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="startup_timeout_secs"):
        McpServer.stdio("python", startup_timeout_secs=0)
    with pytest.raises(TypeError, match="include"):
        McpServer.stdio("python", include="add")


async def test_all_tools_are_offered_with_their_schemas_and_descriptions(tmp_path: Path) -> None:
    offered: list[list[dict[str, Any]]] = []

    def fn(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        offered.append(tools)
        return "ok"

    server = stdio_server(tmp_path)
    async with Agent(FunctionModel(fn), tools=[server]) as agent:
        assert agent.tools == []  # nothing is started before a run needs it
        assert lines(tmp_path / "starts") == []
        await agent.run("what can you do?")
        specs = {t["name"]: t for t in offered[0]}
        assert set(specs) == ALL_TOOLS
        assert {t.name for t in agent.tools} == ALL_TOOLS
        add = specs["add"]
        assert add["description"] == "Add two integers."
        assert add["parameters"]["required"] == ["a", "b"]
        assert add["parameters"]["properties"]["a"]["type"] == "integer"
        assert specs["fail"]["parameters"]["properties"]["reason"]["default"] == "it went wrong"


async def test_include_exclude_and_prefix(tmp_path: Path) -> None:
    server = stdio_server(
        tmp_path, include=["add", "echo", "crash"], exclude=["crash"], prefix="calc."
    )
    model = then(FakeReply.tool_call("calc_add", {"a": 20, "b": 22}), "42")
    async with Agent(model, tools=[server]) as agent:
        result = await agent.run("add")
        # "." is not allowed in a tool name: rewritten; the server still gets "add"
        assert {t.name for t in agent.tools} == {"calc_add", "calc_echo"}
        assert tool_messages(result)[0]["content"] == "42"

        missing = stdio_server(tmp_path, include=["add", "multiply"])
        with pytest.raises(ValidationError) as info:
            await Agent(FakeModel(["x"]), tools=[missing]).run("go")
        assert info.value.code == "unknown"
        assert "'multiply'" in str(info.value) and "echo" in str(info.value)
        await missing.aclose()


async def test_one_mcp_tool_alone(tmp_path: Path) -> None:
    server = stdio_server(tmp_path)
    echo = server.tool("echo")
    assert isinstance(echo, McpTool)
    offered: list[list[str]] = []

    def fn(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        offered.append([t["name"] for t in tools])
        if messages[-1]["role"] == "user":
            return FakeReply.tool_call("echo", {"text": "just me"})
        return "done"

    async with Agent(FunctionModel(fn), tools=[echo]) as agent:
        result = await agent.run("echo")
    assert offered == [["echo"], ["echo"]]
    assert tool_messages(result)[0]["content"] == "just me"

    with pytest.raises(ValidationError) as info:
        await Agent(FakeModel(["x"]), tools=[server.tool("nope")]).run("go")
    assert info.value.code == "unknown"
    assert "has no tool named 'nope'" in str(info.value) and "echo" in str(info.value)
    await server.aclose()


# -- calls and results ---------------------------------------------------------------------


async def test_calls_results_errors_and_invalid_arguments(tmp_path: Path) -> None:
    seen: list[list[dict[str, Any]]] = []
    model = then(
        FakeReply.tool_calls(
            ("add", {"a": 2, "b": 3}),
            ("stats", {"numbers": [1, 2, 6]}),
            ("picture", {}),
            ("fail", {"reason": "no such order"}),
            ("count", {"label": 5}),
            ("count", {}),
        ),
        "all seen",
        seen=seen,
    )
    async with Agent(model, tools=[stdio_server(tmp_path)]) as agent:
        result = await agent.run("go")
    add, stats, picture, fail, bad_type, missing = tool_messages(result)
    assert (add["status"], add["content"]) == ("ok", "5")
    # structured content, when the tool has some, is what the model gets
    assert json.loads(stats["content"]) == {"count": 3, "total": 9.0, "mean": 3.0}
    # other content is described in a few words
    assert picture["content"] == "a red dot\n[image image/png, 16 bytes]"
    # an error result reaches the model as an error, and the run goes on
    assert fail["status"] == "error" and fail["content"].startswith("Error: ")
    assert "fail says: no such order" in fail["content"]
    assert result.text == "all seen"
    assert seen[1][-6:] == result.messages[-7:-1]  # the model saw every result
    # invalid arguments are checked against the server's schema and never sent
    for msg in (bad_type, missing):
        assert msg["status"] == "error" and msg["error_kind"] == "invalid_args"
    assert "5 is not of type 'string'" in bad_type["content"]
    assert "'label' is a required property" in missing["content"]
    assert lines(tmp_path / "counts") == []
    assert result.tool_calls == 4


# -- approvals, hooks, timeouts, exception policies ------------------------------------------


async def test_approval_suspends_and_approve_runs_the_call_once(tmp_path: Path) -> None:
    def fn(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if messages[-1]["role"] == "user":
            return FakeReply.tool_call("count", {"label": "approved"})
        return f"count says {messages[-1]['content']}"

    async with Agent(FunctionModel(fn), tools=[stdio_server(tmp_path)], approve=["count"]) as agent:
        thread = agent.thread("mcp-approval")
        reply = await thread.send("count once")
        assert reply.needs_approval
        assert [(a.tool, a.args) for a in reply.approvals] == [("count", {"label": "approved"})]
        assert lines(tmp_path / "counts") == []  # nothing ran before the approval
        reply = await thread.approve()
        assert reply.text == "count says 1"
        assert lines(tmp_path / "counts") == ["approved"]


async def test_approving_an_unknown_mcp_tool_fails_at_the_first_run(tmp_path: Path) -> None:
    agent = Agent(FakeModel(["x"]), tools=[stdio_server(tmp_path)], approve=["refund"])
    async with agent:
        with pytest.raises(ValidationError, match="approve names \\['refund'\\]"):
            await agent.run("go")


async def test_hooks_rewrite_an_mcp_call_and_replace_its_result(tmp_path: Path) -> None:
    seen_results: list[tuple[str, Any]] = []

    class Rewrite(Hook):
        def before_tool(self, call: ToolCall) -> ToolCall | None:
            if call.name == "echo":
                return ToolCall(call.call_id, "echo", {"text": call.args["text"].upper()})
            return None

        def after_tool(self, call: ToolCall, result: Any) -> Any:
            seen_results.append((call.name, result))
            return "forty-two" if call.name == "add" else None

    model = then(
        FakeReply.tool_calls(("echo", {"text": "quiet"}), ("add", {"a": 40, "b": 2})), "ok"
    )
    async with Agent(model, tools=[stdio_server(tmp_path)], hooks=[Rewrite()]) as agent:
        result = await agent.run("go")
    echo, add = tool_messages(result)
    assert echo["content"] == "QUIET"  # the server got the rewritten arguments
    assert echo["changed_by"] == ["Rewrite"]
    assert add["content"] == "forty-two" and add["changed_by"] == ["Rewrite"]
    assert sorted(seen_results) == [("add", "42"), ("echo", "QUIET")]


async def test_timeouts_apply_per_call_and_the_session_survives(tmp_path: Path) -> None:
    model = then(
        FakeReply.tool_call("pid", {}),
        FakeReply.tool_call("slow", {"seconds": 30}),
        FakeReply.tool_call("pid", {}),
        "done",
    )
    agent = Agent(model, tools=[stdio_server(tmp_path)], limits=Limits(tool_timeout_secs=0.5))
    async with agent:
        result = await agent.run("go")
    before, slow, after = tool_messages(result)
    assert slow["status"] == "timeout" and "timed out after 0.5 s" in slow["content"]
    assert before["content"] == after["content"]  # same process, same session
    assert len(lines(tmp_path / "starts")) == 1

    # the server's own timeout_secs wins over the agent's limit
    model = then(FakeReply.tool_call("slow", {"seconds": 30}), "done")
    quick = stdio_server(tmp_path, timeout_secs=0.2)
    async with Agent(model, tools=[quick], limits=Limits(tool_timeout_secs=30)) as agent:
        result = await agent.run("go")
    assert "timed out after 0.2 s" in tool_messages(result)[0]["content"]


async def test_exception_policies_when_the_server_dies_mid_call(tmp_path: Path) -> None:
    server = stdio_server(tmp_path)

    def agent(policy: str) -> Agent[Any]:
        return Agent(
            FakeModel([FakeReply.tool_call("crash", {}, id="c1"), "noted"]),
            tools=[server],
            on_tool_exception=policy,
        )

    try:
        result = await agent("return_to_model").run("go")
        (msg,) = tool_messages(result)
        assert msg["status"] == "error" and msg["content"].startswith("Error: McpServerError: ")
        assert "stopped or dropped the connection while 'crash' ran" in msg["content"]
        assert "not sent again" in msg["content"]
        assert result.text == "noted"

        result = await agent("return_generic").run("go")
        (msg,) = tool_messages(result)
        assert msg["content"] == "Error: the tool crash failed."
        assert msg["artifact"]["error"].startswith("McpServerError: ")

        with pytest.raises(ToolExecutionError) as info:
            await agent("fail").run("go")
        cause = info.value.__cause__
        assert isinstance(cause, McpServerError) and cause.code == "mcp_connection_lost"
        assert info.value.tool == "crash" and info.value.call_id == "c1"
        # every crash was sent once; each run started a new process
        assert len(lines(tmp_path / "starts")) == 3
    finally:
        await server.aclose()


# -- sessions: reuse, closing, reconnecting ---------------------------------------------------


async def test_one_session_serves_every_call_and_aclose_stops_it(tmp_path: Path) -> None:
    model = then(
        FakeReply.tool_calls(*[("pid", {}) for _ in range(5)]),
        FakeReply.tool_call("pid", {}),
        "one",
        FakeReply.tool_call("pid", {}),
        "two",
    )
    agent = Agent(model, tools=[stdio_server(tmp_path)])
    first = await agent.run("go")
    second = await agent.run("again")
    pids = {m["content"] for m in tool_messages(first) + tool_messages(second)}
    assert len(pids) == 1  # concurrent calls and later runs share one process
    (pid,) = (int(p) for p in pids)
    assert lines(tmp_path / "starts") == [str(pid)]

    await agent.aclose()
    await wait_until(lambda: not alive(pid), what="the server process to end")
    await agent.aclose()  # closing twice is fine


async def test_async_with_starts_the_server_and_stops_it(tmp_path: Path) -> None:
    async with stdio_server(tmp_path) as server:
        (pid,) = lines(tmp_path / "starts")  # started by `async with`, before any run
        model = then(FakeReply.tool_call("pid", {}), "ok")
        result = await Agent(model, tools=[server]).run("go")
        assert tool_messages(result)[0]["content"] == pid
    await wait_until(lambda: not alive(int(pid)), what="the server process to end")


async def test_after_a_crash_the_next_call_reconnects(tmp_path: Path) -> None:
    model = then(
        FakeReply.tool_call("pid", {}),
        FakeReply.tool_call("crash", {}),
        FakeReply.tool_call("pid", {}),
        FakeReply.tool_call("echo", {"text": "still here"}),
        "done",
    )
    async with Agent(model, tools=[stdio_server(tmp_path)]) as agent:
        result = await agent.run("go")
    before, crash, after, echo = tool_messages(result)
    assert crash["status"] == "error" and "'crash' ran" in crash["content"]
    assert after["status"] == "ok" and after["content"] != before["content"]
    assert echo["content"] == "still here"
    # the crashing call was not sent again to the new process
    assert lines(tmp_path / "starts") == [before["content"], after["content"]]
    assert not alive(int(before["content"]))


async def test_a_server_killed_while_idle_is_started_again_for_the_next_call(
    tmp_path: Path,
) -> None:
    model = then(FakeReply.tool_call("pid", {}), "one", FakeReply.tool_call("pid", {}), "two")
    async with Agent(model, tools=[stdio_server(tmp_path)]) as agent:
        first = await agent.run("go")
        pid = int(tool_messages(first)[0]["content"])
        os.kill(pid, signal.SIGKILL)
        await wait_until(lambda: not alive(pid), what="the server process to end")
        second = await agent.run("again")
    (msg,) = tool_messages(second)
    assert msg["status"] == "ok" and msg["content"] != str(pid)
    assert lines(tmp_path / "starts") == [str(pid), msg["content"]]


async def test_a_server_that_cannot_start_again_fails_clearly(tmp_path: Path) -> None:
    model = then(
        FakeReply.tool_call("crash", {}),
        FakeReply.tool_call("echo", {"text": "hello?"}),
        "gave up",
    )

    class RefuseRestart(Hook):
        def before_tool(self, call: ToolCall) -> None:
            if call.name == "echo":  # after the crash: the server will not start again
                (tmp_path / "refuse-start").touch()

    async with Agent(model, tools=[stdio_server(tmp_path)], hooks=[RefuseRestart()]) as agent:
        result = await agent.run("go")
    _, echo = tool_messages(result)
    assert (echo["status"], echo["content"]) == (
        "error",
        "Error: McpServerError: MCP server 'python stdio_server.py' stopped and could not be "
        "started again: stopped before it was ready; the end of its stderr:\n"
        "  refusing to start: refuse-start is there",
    )
    assert result.text == "gave up"


# -- servers that cannot start ---------------------------------------------------------------


async def test_a_command_that_does_not_exist(tmp_path: Path) -> None:
    server = McpServer.stdio("no-such-mcp-server-cmd", ["--verbose", "serve"])
    agent = Agent(FakeModel(["x"]), tools=[server])  # nothing is started yet
    with pytest.raises(McpServerError) as info:
        await agent.run("go")
    assert info.value.code == "mcp_unavailable"
    assert info.value.server == "no-such-mcp-server-cmd serve"
    assert str(info.value).startswith(
        "MCP server 'no-such-mcp-server-cmd serve' could not start: the command "
        "'no-such-mcp-server-cmd' was not found"
    )
    # the next run tries again (and fails the same way)
    with pytest.raises(McpServerError, match="was not found"):
        await agent.run("go")


async def test_a_server_that_exits_at_once_quotes_its_stderr() -> None:
    code = "import sys; sys.stderr.write('config.toml: no such file\\n'); sys.exit(3)"
    server = McpServer.stdio(sys.executable, ["-c", code], name="configured")
    with pytest.raises(McpServerError) as info:
        await Agent(FakeModel(["x"]), tools=[server]).run("go")
    assert info.value.code == "mcp_unavailable"
    assert str(info.value) == (
        "MCP server 'configured' stopped before it was ready; the end of its stderr:\n"
        "  config.toml: no such file"
    )


async def test_a_server_that_never_answers_times_out() -> None:
    # reads its stdin to the end and never answers: stops as soon as stdin closes
    server = McpServer.stdio(
        sys.executable, ["-c", "import sys; sys.stdin.read()"], startup_timeout_secs=0.3
    )
    with pytest.raises(McpServerError) as info:
        async with server:
            pass
    assert info.value.code == "mcp_unavailable"
    assert "'python' did not start within 0.3 s (it wrote nothing on stderr)" in str(info.value)


# -- streamable HTTP -----------------------------------------------------------------------


def start_http(*options: str) -> tuple[subprocess.Popen[str], int]:
    """Start tests/mcp_servers/http_server.py; return it and its port once it listens."""
    proc = subprocess.Popen(
        [sys.executable, str(SERVERS / "http_server.py"), TOKEN, *options],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    ready = proc.stdout.readline()  # blocks until it listens (or dies: "")
    if not ready.startswith("READY "):
        stop(proc)
        raise AssertionError(f"the HTTP server did not start: {ready!r}")
    return proc, int(ready.split()[1])


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()


@pytest.fixture(scope="module")
def http_server() -> Iterator[tuple[str, int]]:
    """The HTTP test server on a free port: its MCP URL and its pid."""
    proc, port = start_http()
    try:
        yield f"http://127.0.0.1:{port}/mcp", proc.pid
    finally:
        stop(proc)


async def test_http_server_with_an_auth_header(http_server: tuple[str, int]) -> None:
    url, pid = http_server
    server = McpServer.http(url, headers={"Authorization": f"Bearer {TOKEN}"})
    model = then(FakeReply.tool_calls(("add", {"a": 1, "b": 2}), ("pid", {})), "ok")
    async with Agent(model, tools=[server]) as agent:
        result = await agent.run("go")
    assert [m["content"] for m in tool_messages(result)] == ["3", str(pid)]

    wrong = McpServer.http(url, headers={"Authorization": "Bearer nope"}, name="tools")
    with pytest.raises(McpServerError) as info:
        await Agent(FakeModel(["x"]), tools=[wrong]).run("go")
    assert info.value.code == "mcp_unavailable"
    assert str(info.value) == f"MCP server 'tools' answered HTTP 401 Unauthorized at {url}"


async def test_http_server_that_restarted_gets_a_new_session() -> None:
    # A server of the 2025 protocol keeps sessions, and forgets them when it restarts:
    # it answers 404 to the old session, so the call did not run and goes to a new one.
    proc, port = start_http("--legacy")
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        server = McpServer.http(url, headers={"Authorization": f"Bearer {TOKEN}"})
        model = then(FakeReply.tool_call("pid", {}), "one", FakeReply.tool_call("pid", {}), "two")
        async with Agent(model, tools=[server]) as agent:
            first = await agent.run("go")
            assert tool_messages(first)[0]["content"] == str(proc.pid)
            stop(proc)
            proc, _ = start_http("--legacy", "--port", str(port))
            second = await agent.run("again")
        (msg,) = tool_messages(second)
        assert (msg["status"], msg["content"]) == ("ok", str(proc.pid))
    finally:
        stop(proc)


async def test_http_server_that_cannot_be_reached() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: nothing listens there
    server = McpServer.http(f"http://user:secret@127.0.0.1:{port}/mcp?key=secret")
    with pytest.raises(McpServerError) as info:
        await Agent(FakeModel(["x"]), tools=[server]).run("go")
    message = str(info.value)
    assert message.startswith(
        f"MCP server '127.0.0.1:{port}/mcp' could not be reached at "
        f"http://user:***@127.0.0.1:{port}/mcp?key=***: ConnectError"
    )
    assert "secret" not in message


# -- durable threads -------------------------------------------------------------------------


async def test_interrupted_thread_retried_after_a_restart_runs_finished_calls_once(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/threads.db"

    def script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if messages[-1]["role"] == "user":
            return FakeReply.tool_calls(("count", {"label": "once"}), ("wait_for", {"name": "go"}))
        return "done: " + ", ".join(m["content"] for m in messages if m["role"] == "tool")

    agent = Agent(FunctionModel(script), tools=[stdio_server(tmp_path)], storage=url)
    config: Any = {"configurable": {"thread_id": "mcp-durable", "checkpoint_ns": ""}}

    async def count_saved() -> bool:
        """The result of `count` is saved (a pending write of the tools step)."""
        saved = await agent.storage.checkpointer.aget_tuple(config)
        writes = (saved.pending_writes or []) if saved is not None else []
        return any(
            isinstance(m, dict) and m.get("role") == "tool" and m.get("name") == "count"
            for _, channel, value in writes
            if channel == "messages" and isinstance(value, list | tuple)
            for m in value
        )

    await agent.storage.open()
    task = asyncio.create_task(agent.thread("mcp-durable").send("go"))
    # the server has counted (cheap to watch), then the agent has saved the result
    await wait_until(lambda: lines(tmp_path / "counts") == ["once"], what="count to run")
    await wait_until(count_saved, what="the result of count to be saved")
    await wait_until(lambda: "waiting go" in lines(tmp_path / "ledger"), what="wait_for to start")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await agent.aclose()
    await agent.storage.close()

    # a new process would build a new agent and server on the same storage
    (tmp_path / "go").touch()
    agent = Agent(FunctionModel(script), tools=[stdio_server(tmp_path)], storage=url)
    async with agent:
        reply = await agent.thread("mcp-durable").retry()
    await agent.storage.close()
    assert reply.text == "done: 1, released go"
    assert lines(tmp_path / "counts") == ["once"]  # the finished call did not run again
    assert lines(tmp_path / "ledger") == ["waiting go", "waiting go", "released go"]
