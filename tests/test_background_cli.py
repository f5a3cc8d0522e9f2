"""`criogen-graph runs list|show|cancel` on a PostgreSQL queue."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import Storage, close_runs
from criogen_graph._cli import main
from tests.reliability import _background_agents as bg


@pytest.fixture
def cli_url(pg_schema_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("CRIOGEN_BG_WORKDIR", str(tmp_path))
    return pg_schema_url


def test_runs_command_lists_shows_and_cancels(
    cli_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def submit() -> tuple[str, str]:
        async with Storage(cli_url) as storage:
            agent = bg.make_agent(storage)
            first = await agent.thread("cli").submit("one")
            second = await agent.thread("cli").submit("two")
            await close_runs(storage)
            return first.id, second.id

    first, second = asyncio.run(submit())
    assert main(["runs", "list", "--storage", cli_url, "--json"]) == 0
    listed: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    assert {r["id"] for r in listed} == {first, second}
    assert all(r["status"] == "queued" for r in listed)
    assert main(["runs", "list", "--storage", cli_url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "RUN",
        "STATUS",
        "ACTION",
        "THREAD",
        "ATTEMPTS",
        "WORKER",
        "HEARTBEAT",
        "ERROR",
    ]
    assert {line.split()[0] for line in lines[1:]} == {first, second}
    assert all(line.split()[1:4] == ["queued", "send", "cli"] for line in lines[1:])
    assert main(["runs", "show", first, "--storage", cli_url]) == 0
    out = capsys.readouterr().out
    assert "status: queued" in out and "thread_id: cli" in out
    assert main(["runs", "cancel", first, "--storage", cli_url]) == 0
    assert main(["runs", "show", first, "--storage", cli_url, "--json"]) == 0
    capsys.readouterr()
    assert main(["runs", "list", "--storage", cli_url, "--status", "cancelled", "--json"]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)] == [first]
    # Cancelling again: it has ended, said plainly.
    assert main(["runs", "cancel", first, "--storage", cli_url]) == 1
    assert "cancelled" in capsys.readouterr().err
    assert main(["runs", "show", "no-such-run", "--storage", cli_url]) == 1
    assert "no background run" in capsys.readouterr().err
    assert main(["runs", "list", "--storage", "sqlite:///x.db"]) == 1
    assert "PostgreSQL" in capsys.readouterr().err


def _start_worker(url: str, tmp_path: Path, *extra: str, env: dict[str, str]) -> Any:
    import os
    import subprocess
    import sys

    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115
    command = [sys.executable, "-m", "criogen_graph", "worker", "--heartbeat", "0.2"]
    proc = subprocess.Popen(
        [*command, "--stalled-after", "1", *extra],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), **env},
        cwd=Path(__file__).resolve().parents[1],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    return proc


def _stop_worker(proc: Any, tmp_path: Path) -> str:
    import signal

    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    return (tmp_path / "worker.log").read_text()


@pytest.mark.parametrize("how", ["agent's storage", "--encryption-key-env"])
def test_the_cli_worker_seals_with_the_storage_key(cli_url: str, tmp_path: Path, how: str) -> None:
    """Started first on a fresh database, the worker claims it with the key (the
    application's keyed storage opens it afterwards) and runs its sealed jobs."""
    if how == "agent's storage":
        extra = ("--agent", "tests.reliability._background_agents:keyed_agent")
        env = {"CRIOGEN_BG_KEYED_URL": cli_url}
    else:
        extra = (
            "--agent",
            "tests.reliability._background_agents:agent",
            "--storage",
            cli_url,
            "--encryption-key-env",
            "MY_APP_KEY",
        )
        env = {"MY_APP_KEY": "bg-key"}
    proc = _start_worker(cli_url, tmp_path, *extra, env=env)

    async def submit() -> str:
        async with Storage(cli_url, encryption_key="bg-key") as storage:
            handle = await bg.make_agent(storage).thread("keyed").submit("hello")
            try:
                reply = await asyncio.wait_for(handle.reply(), 60)
            finally:
                await close_runs(storage)
            return reply.text

    try:
        assert asyncio.run(submit()) == "done: rested"
    finally:
        logs = _stop_worker(proc, tmp_path)
    assert "encrypted" in logs.splitlines()[0], logs
    assert "stopping (SIGTERM)" in logs and "stopped" in logs.splitlines()[-1], logs
