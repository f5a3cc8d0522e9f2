"""The command line answers only what it showed (issue 15, item 4): `threads pending`
names the version its calls wait at; `threads approve|reject|decide --expect VERSION`
answers only if the thread still waits there, and without `--expect` the command
prints the calls it answers and applies to exactly those."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from criogen_graph import Storage
from tests.conftest import ROOT
from tests.reliability._pin_workers import refund_agent, refunds
from tests.reliability._report import report

AGENT_MODULE = """\
from pathlib import Path

from tests.reliability._pin_workers import refund_agent

agent = refund_agent("sqlite:///threads.db", Path(__file__).parent)
"""


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRIOGEN_")}
    env["PYTHONPATH"] = os.pathsep.join([str(cwd), str(ROOT)])
    return subprocess.run(
        [sys.executable, "-m", "criogen_graph", *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


async def test_the_cli_answers_only_what_it_showed(tmp_path: Path) -> None:
    (tmp_path / "pin_agent.py").write_text(AGENT_MODULE, encoding="utf-8")
    thread_id = f"cli-{uuid.uuid4().hex[:8]}"
    storage = ["--storage", "sqlite:///threads.db"]
    agent = ["--agent", "pin_agent:agent"]
    async with Storage(f"sqlite:///{tmp_path}/threads.db") as db:
        first = await refund_agent(db, tmp_path).thread(thread_id).send("refund please")
    assert first.needs_approval

    shown = cli(tmp_path, "threads", *storage, "pending", thread_id)
    assert shown.returncode == 0, shown.stderr
    assert f"-- version {first.version}:" in shown.stdout
    assert f"--expect {first.version}` answers exactly these" in shown.stdout

    # Another reviewer answers first; the run then asks for 5000.
    async with Storage(f"sqlite:///{tmp_path}/threads.db") as db:
        second = await refund_agent(db, tmp_path).thread(thread_id).approve(expected=first)
    assert [r.args for r in second.approvals] == [{"amount": 5000}]

    refused = [
        cli(tmp_path, "threads", "approve", thread_id, *agent, "--expect", str(first.version)),
        cli(tmp_path, "threads", "reject", thread_id, *agent, "--expect", first.checkpoint_id),
        cli(
            tmp_path,
            "threads",
            "decide",
            thread_id,
            *agent,
            "--json",
            '{"call_1": "approve"}',
            "--expect",
            str(first.version),
        ),
    ]
    for proc in refused:
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "moved on before this" in proc.stderr, proc.stderr
        assert f"version {second.version}" in proc.stderr
    assert refunds(tmp_path) == ["refund 50"]
    show = cli(tmp_path, "threads", *storage, "show", thread_id, "--json")
    assert '"amount": 5000' in show.stdout and f'"version": {second.version}' in show.stdout

    # Without --expect: the command prints what it answers, and answers that.
    answered = cli(tmp_path, "threads", "reject", thread_id, *agent, "--reason", "too much")
    assert answered.returncode == 0, answered.stderr
    assert f"answering version {second.version}:" in answered.stdout
    assert f"{second.approvals[0].call_id}  refund(" in answered.stdout
    assert "the run ended (final_answer)" in answered.stdout
    assert refunds(tmp_path) == ["refund 50"]
    report("stale_approval_cli", refused_stale=len(refused), refunds=1)
