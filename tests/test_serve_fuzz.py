"""`criogen-graph serve` fuzzed by schemathesis from its own OpenAPI document
(`GET /openapi.json`) against a real server process on SQLite and on PostgreSQL: whatever the bodies,
parameters and headers, no answer is a 5xx, and every refusal is `{"detail": ...}`
without a traceback (tests/schemathesis_hooks.py).

schemathesis runs from a virtualenv of its own (.venv-schemathesis, made once from
tests/schemathesis-requirements.txt with pip from the configured index): its
jsonschema-rs requirement (>= 0.60) and langgraph-api's (< 0.45, `langgraph dev`)
cannot share one environment."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import PG_URL, ROOT, require_postgres
from tests.test_serve import Server, serve

pytest.importorskip("starlette")

VENV = ROOT / ".venv-schemathesis"
REQUIREMENTS = ROOT / "tests" / "schemathesis-requirements.txt"
#: Test cases per operation and phase.
EXAMPLES = 25


def _missing(problem: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI must run the fuzz test: {problem}")
    pytest.skip(problem)


@pytest.fixture(scope="module")
def schemathesis_cli() -> Path:
    """The schemathesis command of its own virtualenv (made when missing or stale)."""
    cli = VENV / "bin" / "schemathesis"
    stamp = VENV / "requirements.txt"
    wanted = REQUIREMENTS.read_text()
    if not cli.exists() or not stamp.exists() or stamp.read_text() != wanted:
        made = subprocess.run(
            [sys.executable, "-m", "venv", "--clear", str(VENV)], capture_output=True, text=True
        )
        if made.returncode != 0:
            _missing(f"cannot make a virtualenv for schemathesis: {made.stderr}")
        done = subprocess.run(
            [str(VENV / "bin" / "pip"), "install", "-q", "-r", str(REQUIREMENTS)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            _missing(f"cannot install schemathesis: {done.stderr[-2000:]}")
        stamp.write_text(wanted)
    return cli


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("fuzz")
    if request.param == "postgres":
        require_postgres()
        storage = PG_URL
    else:
        storage = f"sqlite:///{workdir / 'threads.db'}"
    # No agent whose tool waits: a fuzzed run may well be a valid one.
    fast = ("examples.support_agent:agent", "tests.serve_agents:chunky")
    with serve(storage, workdir, agents=fast) as running:
        yield running


def test_no_input_makes_the_server_fail(
    schemathesis_cli: Path, server: Server, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
        "PYTHONPATH": str(ROOT / "tests"),
    }
    done = subprocess.run(
        [
            str(schemathesis_cli),
            "run",
            f"{server.url}/openapi.json",
            "--checks",
            "not_a_server_error,refusals_name_the_problem",
            "--phases",
            "examples,coverage,fuzzing,stateful",
            "--max-examples",
            str(EXAMPLES),
            "--workers",
            "1",
            "--seed",
            "33",
            "--request-timeout",
            "30",
            "--suppress-health-check",
            "all",
            "--no-color",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    log = server.log.read_text(errors="replace")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:] + log[-6000:]
    assert "No issues found" in done.stdout or "passed" in done.stdout, done.stdout[-3000:]
    assert "Traceback" not in log, log[-6000:]
