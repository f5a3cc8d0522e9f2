"""`criogen-graph serve` measured: the HTTP overhead of a two-turn run through
`runs.wait` against the same `thread.send` in process (SQLite and PostgreSQL), and
runs/s with p50 / p99 at 50 concurrent clients against `langgraph dev` serving the same
agent's `graph` (the reference server, in memory).

Not part of the test suite. Run from the repository root:

    .venv/bin/python bench/bench_serve.py                # 200 runs per side, 50 clients
    .venv/bin/python bench/bench_serve.py --runs 50 --no-dev

The agent: a scripted model that calls an `echo` tool, then answers (two model turns,
one tool call). Each HTTP run uses a fresh thread (created outside the timing).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from criogen_graph import Agent, FakeReply, FunctionModel, tool  # noqa: E402

PG_URL = os.environ.get("CRIOGEN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


@tool
async def echo(text: str) -> str:
    """Echo the text."""
    return text


def _script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    if messages[-1]["role"] == "user":
        return FakeReply.tool_call("echo", {"text": "hi"})
    return "done"


agent = Agent(FunctionModel(_script, name="script"), tools=[echo], name="bench")
graph = agent.graph


async def _stamp(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    # Time for the follower to connect first; then the answer is the moment it is written.
    await asyncio.sleep(0.3)
    return repr(time.time())


stamp = Agent(FunctionModel(_stamp, name="stamp"), name="stamp")


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_up(url: str, proc: subprocess.Popen[bytes], within: float = 60) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/ok", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"{url} did not come up")


@contextmanager
def _process(args: list[str], cwd: Path, port: int) -> Iterator[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LANGGRAPH_CLI_NO_ANALYTICS": "1"}
    env["LANGSMITH_TRACING"] = "false"
    proc = subprocess.Popen(
        args,
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_up(url, proc)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextmanager
def serve(storage: str) -> Iterator[str]:
    port = _free_port()
    args = [sys.executable, "-m", "criogen_graph", "serve", "--agent", "bench/bench_serve.py:agent"]
    args += ["--agent", "bench/bench_serve.py:stamp"]
    with _process([*args, "--storage", storage, "--port", str(port)], ROOT, port) as url:
        yield url


@contextmanager
def langgraph_dev(work: Path) -> Iterator[str]:
    project = work / "dev"
    project.mkdir()
    shutil.copy(Path(__file__), project / "bench_graph.py")
    (project / "langgraph.json").write_text(
        json.dumps({"dependencies": ["."], "graphs": {"bench": "./bench_graph.py:graph"}})
    )
    port = _free_port()
    args = [sys.executable, "-m", "langgraph_cli", "dev", "--no-browser", "--no-reload"]
    with _process([*args, "--host", "127.0.0.1", "--port", str(port)], project, port) as url:
        yield url


async def _http_run(http: httpx.AsyncClient) -> float:
    thread = (await http.post("/threads", json={})).json()["thread_id"]
    body = {"assistant_id": "bench", "input": {"messages": [{"role": "user", "content": "go"}]}}
    started = time.perf_counter()
    r = await http.post(f"/threads/{thread}/runs/wait", json=body)
    elapsed = (time.perf_counter() - started) * 1000
    assert r.status_code == 200 and r.json()["messages"][-1]["content"] == "done", r.text
    return elapsed


async def _in_process_run(local: Agent[Any]) -> Callable[[], Awaitable[float]]:

    async def run() -> float:
        thread = local.thread(uuid.uuid4().hex)
        started = time.perf_counter()
        reply = await thread.send("go")
        assert reply.text == "done"
        return (time.perf_counter() - started) * 1000

    return run


async def overhead(storage: str, runs: int) -> dict[str, float]:
    """p50 of `runs.wait` over HTTP and of `thread.send` in process, interleaved."""
    from criogen_graph import Storage

    async with Storage(storage) as opened:
        in_process = await _in_process_run(agent.with_storage(opened))
        with serve(storage) as url:
            async with httpx.AsyncClient(base_url=url, timeout=60) as http:
                for _ in range(10):
                    await _http_run(http)
                    await in_process()
                over, local = [], []
                for _ in range(runs):
                    over.append(await _http_run(http))
                    local.append(await in_process())
    return {
        "http_p50_ms": _pct(over, 50),
        "in_process_p50_ms": _pct(local, 50),
        "overhead_p50_ms": _pct(over, 50) - _pct(local, 50),
    }


async def concurrent(url: str, runs: int, clients: int) -> dict[str, float]:
    """runs/s and per-run p50 / p99 with `clients` clients at once."""
    latencies: list[float] = []
    queue = list(range(runs))

    async def client(http: httpx.AsyncClient) -> None:
        while queue:
            queue.pop()
            latencies.append(await _http_run(http))

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        for _ in range(5):
            await _http_run(http)
        started = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        wall = time.perf_counter() - started
    return {
        "runs_per_s": runs / wall,
        "p50_ms": _pct(latencies, 50),
        "p99_ms": _pct(latencies, 99),
    }


async def first_token(runs: int) -> dict[str, float]:
    """Seconds from the model writing its answer in server A's process to a client
    following the run through server B (PostgreSQL events + NOTIFY) reading it."""
    latencies: list[float] = []
    with serve(PG_URL) as a_url, serve(PG_URL) as b_url:
        async with (
            httpx.AsyncClient(base_url=a_url, timeout=60) as a,
            httpx.AsyncClient(base_url=b_url, timeout=60) as b,
        ):
            for _ in range(runs):
                thread = (await a.post("/threads", json={})).json()["thread_id"]
                body = {
                    "assistant_id": "stamp",
                    "input": {"messages": ["go"]},
                    "stream_mode": ["custom"],
                }
                run = (await a.post(f"/threads/{thread}/runs", json=body)).json()
                path = f"/threads/{thread}/runs/{run['run_id']}/stream"
                async with b.stream("GET", path) as events:
                    async for line in events.aiter_lines():
                        if line.startswith("data:") and '"type":"text"' in line:
                            seen = time.time()
                            data = json.loads(line[5:])
                            latencies.append((seen - float(data["text"])) * 1000)
                            break
    return {"p50_ms": _pct(latencies, 50), "p99_ms": _pct(latencies, 99)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--no-dev", action="store_true", help="skip langgraph dev")
    parser.add_argument("--no-pg", action="store_true", help="skip PostgreSQL")
    parser.add_argument("--only-first-token", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    if not args.no_pg:
        results["first_token_across_servers"] = await first_token(min(args.runs, 100))
        print("first token across servers", results["first_token_across_servers"], flush=True)
    if args.only_first_token:
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sqlite = f"sqlite:///{work / 'bench.db'}"
        results["overhead_sqlite"] = await overhead(sqlite, args.runs)
        print("overhead sqlite", results["overhead_sqlite"], flush=True)
        if not args.no_pg:
            results["overhead_postgres"] = await overhead(PG_URL, args.runs)
            print("overhead postgres", results["overhead_postgres"], flush=True)
        with serve(f"sqlite:///{work / 'concurrent.db'}") as url:
            results["serve_sqlite_concurrent"] = await concurrent(url, args.runs, args.clients)
        print("serve sqlite concurrent", results["serve_sqlite_concurrent"], flush=True)
        if not args.no_pg:
            with serve(PG_URL) as url:
                results["serve_pg_concurrent"] = await concurrent(url, args.runs, args.clients)
            print("serve postgres concurrent", results["serve_pg_concurrent"], flush=True)
        if not args.no_dev:
            with langgraph_dev(work) as url:
                results["langgraph_dev_concurrent"] = await concurrent(url, args.runs, args.clients)
            print("langgraph dev concurrent", results["langgraph_dev_concurrent"], flush=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
