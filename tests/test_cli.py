"""The command line, run as a real command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
