"""The command line, run as a real command."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.servers.openai_server import OpenAIServer, text, tool_calls


def test_demo_survives_a_restart(tmp_path: Path) -> None:
    # The scripted model: never a real provider from a developer's environment.
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["CRIOGEN_DEMO_MODEL"] = "scripted"
    proc = subprocess.run(
        [sys.executable, "-m", "criogen_graph", "demo", "--db", str(tmp_path / "demo.db")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    first, _, second = out.partition("== process 2")
    assert "waiting for approval: refund" in first
    assert "found pending refund" in second  # read from the file by a new process
    assert "final answer: Done: order A-1 is refunded." in second
    assert "approve    by reviewer" in second
    pid1 = first.split("(pid ")[1].split(")")[0]
    pid2 = second.split("(pid ")[1].split(")")[0]
    assert pid1 != pid2


def test_no_command_prints_help() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "criogen_graph"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "demo" in proc.stdout


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path) -> None:
    """`criogen-graph ... | head -3`: the pipe's reader is gone before the command
    writes (here it never read at all); no `BrokenPipeError` on stderr."""
    asyncio.run(_done_thread(tmp_path / "criogen.db", "piped"))
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "criogen_graph", "threads", "list"],
            cwd=tmp_path,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    finally:
        os.close(write_end)
    assert proc.stderr == ""
    assert proc.returncode == 141


def test_demo_uses_a_real_provider_when_a_key_is_set(
    tmp_path: Path, openai_server: OpenAIServer
) -> None:
    openai_server.add(
        tool_calls(("get_order", {"order_id": "A-1"})),
        tool_calls(("refund", {"order_id": "A-1", "reason": "damaged"})),
        text("Refunded A-1 for you."),
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.endswith("_API_KEY") and k != "CRIOGEN_DEMO_MODEL"
    }
    env.update(OPENAI_API_KEY="sk-test", OPENAI_BASE_URL=openai_server.base_url)
    proc = subprocess.run(
        [sys.executable, "-m", "criogen_graph", "demo", "--db", str(tmp_path / "demo.db")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "openai:gpt-5-mini" in proc.stdout
    assert "final answer: Refunded A-1 for you." in proc.stdout
    assert [r["model"] for r in openai_server.requests] == ["gpt-5-mini"] * 3


# -- chat and threads ---------------------------------------------------------------------

TOOLS_MODULE = '''
import asyncio
import sys
from pathlib import Path

from criogen_graph import tool

LEDGER = Path(__file__).with_name("ledger.txt")


@tool
def write_ledger(entry: str) -> str:
    """Write an entry to the ledger."""
    with LEDGER.open("a", encoding="utf-8") as f:
        f.write(entry + "\\n")
    return f"written: {entry}"


@tool
async def slow_step() -> str:
    """Takes two minutes the first time, no time after."""
    marker = LEDGER.with_name("slow.marker")
    if not marker.exists():
        marker.write_text("started", encoding="utf-8")
        print("(slow step started)", flush=True)
        await asyncio.sleep(120)
    return "quick now"


tools = [write_ledger, slow_step]
'''

AGENT_MODULE = """
from criogen_graph import Agent, FakeModel

from cli_tools import write_ledger

# Its storage stays in memory: the command line gives it the one of --storage.
agent = Agent(
    FakeModel(["Done: the ledger is written."]),
    tools=[write_ledger],
    approve=["write_ledger"],
    name="ledger",
)
"""


def cli_env() -> dict[str, str]:
    """No provider key and no CRIOGEN_* default from the developer's environment."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.endswith("_API_KEY") and not k.startswith("CRIOGEN_")
    }


Run = subprocess.CompletedProcess[str]


def cli(cwd: Path, *args: str, input: str | None = None, timeout: float = 120) -> Run:
    return subprocess.run(
        [sys.executable, "-m", "criogen_graph", *args],
        cwd=cwd,
        input=input if input is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(),
    )


def cli_all(cwd: Path, *commands: Sequence[str], timeout: float = 120) -> list[Run]:
    """Independent commands, run at once (each as `cli` would, with no input)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "criogen_graph", *args],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
        )
        for args in commands
    ]
    results: list[Run] = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def workdir(tmp_path: Path) -> Path:
    (tmp_path / "cli_tools.py").write_text(TOOLS_MODULE, encoding="utf-8")
    (tmp_path / "cli_agent.py").write_text(AGENT_MODULE, encoding="utf-8")
    return tmp_path


def script(path: Path, replies: list[Any]) -> str:
    path.write_text(json.dumps(replies), encoding="utf-8")
    return str(path)


def ledger(cwd: Path) -> list[str]:
    file = cwd / "ledger.txt"
    return file.read_text(encoding="utf-8").splitlines() if file.exists() else []


def test_chat_streams_asks_for_approval_and_resumes_in_a_second_process(
    tmp_path: Path,
) -> None:
    cwd = workdir(tmp_path)
    first = script(
        cwd / "first.json",
        [
            {
                "text": "Sure, logging it.",
                "chunks": ["Sure, ", "logging it."],
                "tool_calls": [{"name": "write_ledger", "args": {"entry": "first"}}],
            },
            {"text": "Logged first.", "chunks": ["Logged ", "first."]},
        ],
    )
    chat = ["chat", "--tools", "cli_tools:tools", "--approve", "write_ledger"]
    thread = f"t-{uuid.uuid4().hex[:8]}"
    proc = cli(
        cwd,
        *chat,
        "--model",
        first,
        "--thread",
        thread,
        "--actor",
        "ada",
        input="please log it\na\n/history\n/quit\n",
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"thread {thread} (new) on sqlite:///criogen.db" in out
    assert "assistant> Sure, logging it." in out  # streamed as it was written
    assert 'approval needed (1 call):\n  write_ledger({"entry": "first"})' in out
    assert "[a]pprove / [r]eject / [e]dit args" in out
    assert "< write_ledger [ok] written: first" in out
    assert "assistant> Logged first." in out
    # /history prints the saved conversation
    assert "user: please log it" in out and "tool write_ledger [ok]: written: first" in out
    assert ledger(cwd) == ["first"]
    assert (cwd / "criogen.db").exists()  # the default storage, in the working directory

    # A second process continues the same thread: edit one call, reject the other.
    second = script(
        cwd / "second.json",
        [
            {
                "tool_calls": [
                    {"name": "write_ledger", "args": {"entry": "second"}},
                    {"name": "write_ledger", "args": {"entry": "third"}},
                ]
            },
            "Done.",
        ],
    )
    proc = cli(
        cwd,
        *chat,
        "--model",
        second,
        "--thread",
        thread,
        input='log two more\ne\n{"entry": "second (edited)"}\nr\nnot this one\n',
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"thread {thread} (4 messages)" in out
    assert "last answer: Logged first." in out
    assert "approval needed (2 calls):" in out
    assert (
        "< write_ledger [rejected] A reviewer rejected this call to write_ledger: not this one."
        in out
    )
    assert "assistant> Done." in out
    assert ledger(cwd) == ["first", "second (edited)"]

    # The threads commands read what the chats did.
    proc = cli(cwd, "threads", "audit", thread, "--json")
    assert proc.returncode == 0, proc.stderr
    records = json.loads(proc.stdout)
    assert [r["action"] for r in records if r["action"] != "tool_call"] == [
        "send",
        "decide",
        "send",
        "decide",
    ]
    assert records[1]["actor"] == "ada"


def test_chat_on_a_thread_waiting_for_approval_asks_for_it_first(tmp_path: Path) -> None:
    cwd = workdir(tmp_path)
    chat = ["chat", "--tools", "cli_tools:tools", "--approve", "write_ledger"]
    thread = f"t-{uuid.uuid4().hex[:8]}"
    asks = script(
        cwd / "asks.json",
        [{"tool_calls": [{"name": "write_ledger", "args": {"entry": "later"}}]}],
    )
    # The input ends at the approval prompt: the thread is left waiting.
    proc = cli(cwd, *chat, "--model", asks, "--thread", thread, input="log it later\n")
    assert proc.returncode == 0, proc.stderr
    assert "approval needed (1 call):" in proc.stdout
    assert "the thread still waits for approval" in proc.stdout
    assert ledger(cwd) == []

    answers = script(cwd / "answers.json", ["Logged it."])
    proc = cli(cwd, *chat, "--model", answers, "--thread", thread, input="a\n")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "this thread waits for approval:" in out
    assert out.index("this thread waits for approval:") < out.index("you> ")
    assert "assistant> Logged it." in out
    assert ledger(cwd) == ["later"]


def test_chat_with_the_fake_model_and_a_new_thread(tmp_path: Path) -> None:
    cwd = workdir(tmp_path)
    proc = cli(
        cwd,
        "chat",
        "--model",
        "fake",
        "--storage",
        "sqlite:///chats.db",
        input="/help\nhello there\n/retry\n/nope\n",
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    thread = out.split("thread ", 1)[1].split(" ", 1)[0]
    assert thread.startswith("chat-")
    assert f"Continue it later with --thread {thread}" in out
    assert "/retry" in out and "/history" in out  # /help
    assert "assistant> You said: hello there" in out
    assert "unknown command /nope" in out
    assert "has nothing to retry" in proc.stderr
    proc = cli(cwd, "threads", "--storage", "sqlite:///chats.db", "list")
    assert proc.returncode == 0, proc.stderr
    assert thread in proc.stdout


def test_chat_with_an_agents_tools_uses_its_model_when_no_model_is_given(
    tmp_path: Path,
) -> None:
    """`chat --tools examples.support_agent:agent` from a checkout's root, offline: the
    agent's own scripted model asks for the refund's approval at the prompt."""
    db = f"sqlite:///{tmp_path / 'support.db'}"
    chat = ["chat", "--tools", "examples.support_agent:agent", "--storage", db]
    proc = cli(
        ROOT,
        *chat,
        "--thread",
        "ticket-1",
        input="Order A-1 arrived damaged. Please refund it.\na\n/quit\n",
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "function:scripted" in out  # the agent's model, named in the greeting
    assert '> get_order({"order_id": "A-1"})' in out
    assert 'approval needed (1 call):\n  refund({"order_id": "A-1"' in out
    assert "< refund [ok] refunded A-1 (requested by the customer)" in out
    assert "assistant> Done: refunded A-1 (requested by the customer)." in out

    # --model still wins over the agent's own.
    answers = script(tmp_path / "answers.json", ["From the script."])
    proc = cli(ROOT, *chat, "--model", answers, input="Hello\n/quit\n")
    assert proc.returncode == 0, proc.stderr
    assert "assistant> From the script." in proc.stdout
    # A plain list of tools brings no model: one is still required.
    proc = cli(workdir(tmp_path), "chat", "--tools", "cli_tools:tools")
    assert proc.returncode == 2 and "chat needs --model" in proc.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process")
def test_chat_ctrl_c_cancels_the_run_and_retry_continues_it(tmp_path: Path) -> None:
    cwd = workdir(tmp_path)
    model = script(
        cwd / "slow.json",
        [
            {"tool_calls": [{"name": "write_ledger", "args": {"entry": "once"}}]},
            {"tool_calls": [{"name": "slow_step", "args": {}}]},  # cancelled while it runs
            "Finished after the retry.",
        ],
    )
    chat = ["chat", "--model", model, "--tools", "cli_tools:tools", "--thread", "slow"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "criogen_graph", *chat],
        cwd=cwd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    assert proc.stdin is not None and proc.stdout is not None
    chunks: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        while piece := proc.stdout.read(1):
            chunks.put(piece)
        chunks.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []

    def wait_for(marker: str) -> None:
        while marker not in "".join(seen):
            piece = chunks.get(timeout=60)
            assert piece is not None, f"the chat ended before {marker!r}: {''.join(seen)}"
            seen.append(piece)

    try:
        proc.stdin.write("log once\n")
        proc.stdin.flush()
        wait_for("(slow step started)")
        proc.send_signal(signal.SIGINT)
        wait_for("(cancelled: the run is saved; /retry continues it)")
        proc.stdin.write("/retry\n/quit\n")
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
        while (piece := chunks.get(timeout=60)) is not None:
            seen.append(piece)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = "".join(seen)
    assert "< write_ledger [ok] written: once" in out
    assert "assistant> Finished after the retry." in out, proc.stderr.read()
    assert "< slow_step [ok] quick now" in out
    assert ledger(cwd) == ["once"]  # the finished call did not run again
    proc2 = cli(cwd, "threads", "audit", "slow")
    assert "run_cancelled" in proc2.stdout and "retry" in proc2.stdout


async def _waiting_thread(db: Path, thread_id: str, *entries: str) -> list[str]:
    """A thread on `db` that waits for approval of one write_ledger call per entry."""
    from criogen_graph import Agent, FakeModel, FakeReply, Storage, tool

    @tool
    def write_ledger(entry: str) -> str:
        """Write an entry to the ledger (never runs here)."""
        raise AssertionError("the test process runs no tool")

    async with Storage(f"sqlite:///{db}") as storage:
        agent = Agent(
            FakeModel([FakeReply.tool_calls(*(("write_ledger", {"entry": e}) for e in entries))]),
            tools=[write_ledger],
            approve=["write_ledger"],
            storage=storage,
        )
        reply = await agent.thread(thread_id, actor="test").send("log " + " and ".join(entries))
        return [r.call_id for r in reply.approvals]


async def _done_thread(db: Path, thread_id: str) -> None:
    from criogen_graph import Agent, FakeModel, Storage

    async with Storage(f"sqlite:///{db}") as storage:
        await Agent(FakeModel(["Hi."]), storage=storage).thread(thread_id).send("Hello")


def test_threads_read_and_approve_a_thread_waiting_for_approval(tmp_path: Path) -> None:
    cwd = workdir(tmp_path)
    thread = f"wait-{uuid.uuid4().hex[:8]}"
    done = f"done-{uuid.uuid4().hex[:8]}"
    call_a, call_b = asyncio.run(_waiting_thread(cwd / "criogen.db", thread, "A", "B"))
    asyncio.run(_done_thread(cwd / "criogen.db", done))

    listed, listed_json, show, show_json, history, history_json, pending, pending_json = cli_all(
        cwd,
        ["threads", "list"],
        ["threads", "list", "--json"],
        ["threads", "show", thread],
        ["threads", "show", thread, "--json"],
        ["threads", "history", thread],
        ["threads", "history", thread, "--json", "--limit", "2"],
        ["threads", "pending", thread],
        ["threads", "--storage", "sqlite:///criogen.db", "pending", thread, "--json"],
    )
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert "waits for approval" in rows[thread]
    assert rows[done].split()[1] == "completed"  # the word of --json and threads history
    by_id = {r["id"]: r for r in json.loads(listed_json.stdout)}
    assert by_id[thread]["waiting_for_approval"] is True
    assert by_id[done]["waiting_for_approval"] is False

    assert show.returncode == 0, show.stderr
    assert "user: log A and B" in show.stdout
    assert f'calls write_ledger({{"entry": "A"}})  [{call_a}]' in show.stdout
    assert "waits for approval of 2 call(s)" in show.stdout
    shown = json.loads(show_json.stdout)
    assert shown["messages"][0] == {"role": "user", "content": "log A and B"}
    assert [r["call_id"] for r in shown["pending_approvals"]] == [call_a, call_b]

    assert history.returncode == 0, history.stderr
    assert "suspended" in history.stdout.splitlines()[1]  # the newest first
    entries = json.loads(history_json.stdout)
    assert len(entries) == 2 and entries[0]["status"] == "suspended"

    assert pending.returncode == 0, pending.stderr
    assert f'{call_a}  write_ledger({{"entry": "A"}})' in pending.stdout
    no_rule = {"description": None, "allowed": None}
    assert json.loads(pending_json.stdout) == [
        {"call_id": call_a, "tool": "write_ledger", "args": {"entry": "A"}, **no_rule},
        {"call_id": call_b, "tool": "write_ledger", "args": {"entry": "B"}, **no_rule},
    ]

    # Answering needs the agent whose tools continue the run; partial answers are refused.
    agent = ["--agent", "cli_agent:agent"]
    no_agent, partial, unknown_call = cli_all(
        cwd,
        ["threads", "approve", thread],
        ["threads", "approve", thread, *agent, "--call", call_a],
        ["threads", "approve", thread, *agent, "--call", "call_nope"],
    )
    assert no_agent.returncode == 2
    assert "needs the agent" in no_agent.stderr and "--agent module:attr" in no_agent.stderr
    assert partial.returncode == 1
    assert f"error: {call_b} (write_ledger) also wait(s) for a decision" in partial.stderr
    assert unknown_call.returncode == 1
    assert "error: no pending call call_nope" in unknown_call.stderr
    assert ledger(cwd) == []

    only_a = ["--call", call_a, "--reject-others", "--reason", "only A", "--actor", "grace"]
    proc = cli(cwd, "threads", "approve", thread, *agent, *only_a)
    assert proc.returncode == 0, proc.stderr
    assert "< write_ledger [ok] written: A" in proc.stdout
    assert "< write_ledger [rejected] A reviewer rejected this call" in proc.stdout
    assert "assistant> Done: the ledger is written." in proc.stdout
    assert "the run ended (final_answer)" in proc.stdout
    assert ledger(cwd) == ["A"]

    pending_json, audit, audit_json, audit_all, again = cli_all(
        cwd,
        ["threads", "pending", thread, "--json"],
        ["threads", "audit", thread],
        ["threads", "audit", thread, "--json"],
        ["threads", "audit", "--json"],
        ["threads", "reject", thread, *agent],
    )
    assert pending_json.stdout.strip() == "[]"
    assert audit.returncode == 0, audit.stderr
    assert "grace" in audit.stdout
    assert "write_ledger: approve, write_ledger: reject" in audit.stdout
    decide = next(r for r in json.loads(audit_json.stdout) if r["action"] == "decide")
    assert decide["actor"] == "grace"
    assert [d["decision"]["type"] for d in decide["details"]["decisions"]] == [
        "approve",
        "reject",
    ]
    assert {r["thread_id"] for r in json.loads(audit_all.stdout)} >= {thread, done}
    assert again.returncode == 1  # nothing waits any more
    assert again.stderr == f"error: thread '{thread}' waits for no approval\n"


def test_threads_reject_and_decide(tmp_path: Path) -> None:
    cwd = workdir(tmp_path)
    rejected = f"rej-{uuid.uuid4().hex[:8]}"
    decided = f"dec-{uuid.uuid4().hex[:8]}"
    asyncio.run(_waiting_thread(cwd / "criogen.db", rejected, "X"))
    (call,) = asyncio.run(_waiting_thread(cwd / "criogen.db", decided, "Y"))
    agent = ["--agent", "cli_agent:agent"]

    reject, bad_json, not_an_object, no_agent = cli_all(
        cwd,
        ["threads", "reject", rejected, *agent, "--reason", "not today"],
        ["threads", "decide", decided, *agent, "--json", "{bad"],
        ["threads", "decide", decided, *agent, "--json", "1"],
        ["threads", "decide", decided, "--json", '{"x": "approve"}'],
    )
    assert reject.returncode == 0, reject.stderr
    assert "[rejected] A reviewer rejected this call to write_ledger: not today." in reject.stdout
    assert bad_json.returncode == 2
    assert "argument --json: invalid JSON (Expecting property name" in bad_json.stderr
    assert not_an_object.returncode == 2 and "expected a JSON object" in not_an_object.stderr
    assert no_agent.returncode == 2 and "add --agent module:attr" in no_agent.stderr
    assert ledger(cwd) == []

    # Decisions that do not fit change nothing (these hold the thread: one at a time).
    proc = cli(cwd, "threads", "decide", decided, *agent, "--json", '{"call_x": "approve"}')
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: no pending call has id 'call_x'")
    bad_args = {call: {"type": "edit", "args": {"nope": 1}}}
    proc = cli(cwd, "threads", "decide", decided, *agent, "--json", json.dumps(bad_args))
    assert proc.returncode == 1 and "do not fit 'write_ledger'" in proc.stderr
    edit = {call: {"type": "edit", "args": {"entry": "Y (edited)"}}}
    proc = cli(cwd, "threads", "decide", decided, *agent, "--json", json.dumps(edit))
    assert proc.returncode == 0, proc.stderr
    assert "written: Y (edited)" in proc.stdout
    assert ledger(cwd) == ["Y (edited)"]


def test_threads_decide_takes_one_decision_or_a_list(tmp_path: Path) -> None:
    cwd = workdir(tmp_path)
    # One database per thread: the answers run at once, each writing its own file.
    threads = {name: f"{name}-{uuid.uuid4().hex[:8]}" for name in ("one", "obj", "list", "few")}
    calls = {
        name: asyncio.run(_waiting_thread(cwd / f"{name}.db", tid, f"{name}1", f"{name}2"))
        for name, tid in threads.items()
    }

    def decide(name: str, decisions: str) -> list[str]:
        return [
            "threads",
            "decide",
            threads[name],
            "--storage",
            f"sqlite:///{name}.db",
            "--agent",
            "cli_agent:agent",
            "--json",
            decisions,
        ]

    one, obj, listed, too_few = cli_all(
        cwd,
        decide("one", '"approve"'),
        decide("obj", '{"type": "reject", "message": "not today"}'),
        decide("list", '["reject", {"type": "edit", "args": {"entry": "list2 (edited)"}}]'),
        decide("few", '["approve"]'),
    )
    for proc in (one, obj, listed):
        assert proc.returncode == 0, proc.stderr
        assert "the run ended (final_answer)" in proc.stdout
    assert "written: one1" in one.stdout and "written: one2" in one.stdout
    assert obj.stdout.count("[rejected]") == 2 and "not today" in obj.stdout
    assert "written: list2 (edited)" in listed.stdout and "[rejected]" in listed.stdout
    assert sorted(ledger(cwd)) == ["list2 (edited)", "one1", "one2"]
    assert too_few.returncode == 1
    call_ids = ", ".join(calls["few"])
    assert too_few.stderr == (
        f"error: --json lists 1 decision(s) but 2 call(s) wait ({call_ids}): give one per "
        "call, in that order, or key them by call id\n"
    )
    # The list answers the calls in the order `threads pending` shows them.
    (audit,) = cli_all(
        cwd, ["threads", "--storage", "sqlite:///list.db", "audit", threads["list"], "--json"]
    )
    (record,) = [r for r in json.loads(audit.stdout) if r["action"] == "decide"]
    assert [d["call_id"] for d in record["details"]["decisions"]] == calls["list"]
    assert [d["decision"]["type"] for d in record["details"]["decisions"]] == ["reject", "edit"]
    pending = cli(
        cwd, "threads", "--storage", "sqlite:///few.db", "pending", threads["few"], "--json"
    )
    assert [r["call_id"] for r in json.loads(pending.stdout)] == calls["few"]  # still waits


def test_threads_decide_refuses_malformed_decisions(capsys: pytest.CaptureFixture[str]) -> None:
    from criogen_graph._cli import main

    base = ["threads", "decide", "t", "--agent", "a:b", "--json"]
    for decisions, message in (
        ("{bad", "argument --json: invalid JSON (Expecting property name"),
        ("'approve'", "argument --json: invalid JSON (Expecting value"),
        ('"maybe"', "the decision: a decision given as text must be 'approve' or 'reject'"),
        ('{"type": "respond"}', "the decision: a 'respond' decision needs a message"),
        ('{"call_a": "approve", "call_b": 3}', "call 'call_b': a decision must be"),
        ('["approve", 1]', "decision 1 of the list: a decision must be a Decision"),
        ("null", 'expected a JSON object {"call_id": decision, ...}, one decision'),
    ):
        with pytest.raises(SystemExit) as exc:
            main([*base, decisions])
        assert exc.value.code == 2, decisions
        assert message in capsys.readouterr().err, decisions


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import tomllib

    import criogen_graph
    from criogen_graph._cli import main

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert capsys.readouterr().out == f"criogen-graph {project['version']}\n"
    assert criogen_graph.__version__ == project["version"]
    proc = subprocess.run(
        [sys.executable, "-m", "criogen_graph", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (proc.returncode, proc.stdout) == (0, f"criogen-graph {project['version']}\n")


def test_cli_errors_and_exit_codes(tmp_path: Path) -> None:
    cwd = workdir(tmp_path)
    (cwd / "broken.json").write_text("[{", encoding="utf-8")
    # No database yet: reading commands do not create one.
    no_db, bad_model, broken, no_key, no_module, bad_rule, debug, bad_url = cli_all(
        cwd,
        ["threads", "list"],
        ["chat", "--model", "nope"],
        ["chat", "--model", "broken.json"],
        ["chat", "--model", "openai:gpt-5-mini"],
        ["chat", "--model", "fake", "--tools", "nomodule:tools"],
        ["chat", "--model", "fake", "--approve", "refund"],
        ["--debug", "chat", "--model", "fake", "--approve", "refund"],
        ["chat", "--model", "fake", "--storage", "nosuch://x"],
    )
    assert no_db.returncode == 1
    assert no_db.stderr.startswith("error: no database at criogen.db")
    assert not (cwd / "criogen.db").exists()
    assert bad_model.returncode == 2
    assert "argument --model: 'nope' is not a model: use provider:model" in bad_model.stderr
    assert broken.returncode == 2 and "bad FakeModel script broken.json" in broken.stderr
    assert no_key.returncode == 1  # a runtime error, naming the variable
    assert no_key.stderr == (
        "error: --model openai:gpt-5-mini needs OPENAI_API_KEY: set it in the environment "
        "or in a .env file in the current directory\n"
    )
    assert no_module.returncode == 1 and "cannot import 'nomodule'" in no_module.stderr
    assert bad_rule.returncode == 1
    assert bad_rule.stderr.startswith("error: approve names ['refund'], which are not among")
    assert "Traceback" not in bad_rule.stderr
    assert debug.returncode == 1 and "Traceback" in debug.stderr
    assert bad_url.returncode == 1 and bad_url.stderr.startswith("error: unknown storage URL")

    asyncio.run(_done_thread(cwd / "criogen.db", "known"))
    agent = ["--agent", "cli_agent:agent"]
    *unknown, approve_unknown, no_attr, not_agent = cli_all(
        cwd,
        *(["threads", action, "unknown-thread"] for action in ("show", "history", "pending")),
        ["threads", "audit", "unknown-thread"],
        ["threads", "approve", "unknown-thread", *agent],
        ["threads", "approve", "known", "--agent", "cli_agent:nothing"],
        ["threads", "approve", "known", "--agent", "cli_tools:tools"],
    )
    for proc in unknown:
        assert proc.returncode == 1, proc.args
        assert proc.stderr == (
            "error: no thread 'unknown-thread' in sqlite:///criogen.db "
            "(`criogen-graph threads list` shows them)\n"
        )
    assert approve_unknown.returncode == 1
    assert "no thread 'unknown-thread'" in approve_unknown.stderr
    assert no_attr.returncode == 1
    assert no_attr.stderr == (
        "error: --agent cli_agent:nothing: 'cli_agent' has no attribute 'nothing'\n"
    )
    assert not_agent.returncode == 1 and "expected an Agent, got list" in not_agent.stderr


def test_usage_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from criogen_graph.__main__ import main

    monkeypatch.chdir(tmp_path)
    for k in ("CRIOGEN_MODEL", "CRIOGEN_STORAGE"):
        monkeypatch.delenv(k, raising=False)
    for argv, message in (
        (["chat", "--model", "foo:bar"], "unknown model provider 'foo'"),
        (["chat", "--model", "missing.json"], "no FakeModel script file at missing.json"),
        (["chat"], "chat needs --model"),
        (["threads", "show", "t", "--agent", "no_colon"], "expected module:attribute"),
        (["threads", "history", "t", "--limit", "0"], "expected a positive integer"),
        (["threads", "decide", "t", "--agent", "a:b"], "the following arguments are required"),
        (["threads", "nope"], "invalid choice"),
        (["nope"], "invalid choice"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2, argv
        assert message in capsys.readouterr().err, argv
    assert main(["threads"]) == 2
    assert "ACTION" in capsys.readouterr().out


def test_every_command_has_help_with_examples(capsys: pytest.CaptureFixture[str]) -> None:
    from criogen_graph.__main__ import main

    actions = ("list", "show", "history", "pending", "approve", "reject", "decide", "retry")
    for argv in (
        [],
        ["demo"],
        ["chat"],
        ["threads"],
        *(["threads", action] for action in (*actions, "audit")),
    ):
        with pytest.raises(SystemExit) as exc:
            main([*argv, "--help"])
        assert exc.value.code == 0, argv
        assert "example" in capsys.readouterr().out, argv
