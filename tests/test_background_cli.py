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
