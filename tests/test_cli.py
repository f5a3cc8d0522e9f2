"""The command line, run as a real command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def test_demo_survives_a_restart(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "criogen_graph", "demo", "--db", str(tmp_path / "demo.db")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
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
