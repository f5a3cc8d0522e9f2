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
import contextlib
import json
import os
import re
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
from criogen_graph.models.base import Model, ModelRequest, ModelResponse  # noqa: E402

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


class _Ticker(Model):
    """Writes its answer a piece at a time: the time it writes each piece, `ticks`
    times `every` seconds apart from `start` + `phase`, and ends at `start` + `end` (the
    user message, as JSON)."""

    provider = "bench"
    name = "ticker"

    async def generate(self, request: ModelRequest) -> ModelResponse:
        plan = json.loads(str(request.messages[-1]["content"]))
        loop = asyncio.get_running_loop()
        begin = loop.time() + plan["start"] + plan["phase"] - time.time()
        pieces = []
        for i in range(plan["ticks"]):
            await asyncio.sleep(max(0.0, begin + i * plan["every"] - loop.time()))
            piece = f"{time.time()!r};"
            if request.on_text is not None:
                request.on_text(piece)
            pieces.append(piece)
        # The runs end together after every piece of every stream was written: their
        # ends (saving a thousand runs at once) are not in the pieces' latency.
        await asyncio.sleep(max(0.0, begin - plan["phase"] + plan["end"] - loop.time()))
        return ModelResponse({"role": "assistant", "content": "".join(pieces)})


ticker = Agent(_Ticker(), name="ticker")


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_up(
    url: str, proc: subprocess.Popen[bytes], within: float = 60, health: str = "/ok"
) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}{health}", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"{url} did not come up")


@contextmanager
def _process(
    args: list[str],
    cwd: Path,
    port: int,
    root: Path = ROOT,
    env_extra: dict[str, str] | None = None,
    health: str = "/ok",
) -> Iterator[tuple[str, int]]:
    env = {**os.environ, "PYTHONPATH": str(root), "LANGGRAPH_CLI_NO_ANALYTICS": "1"}
    env["LANGSMITH_TRACING"] = "false"
    env.update(env_extra or {})
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
        _wait_up(url, proc, health=health)
        yield url, proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextmanager
def serve(storage: str, root: Path = ROOT) -> Iterator[str]:
    """`criogen-graph serve` of this checkout's code (or of the checkout at `root`)."""
    with serve_pid(storage, root) as (url, _):
        yield url


@contextmanager
def serve_pid(storage: str, root: Path = ROOT) -> Iterator[tuple[str, int]]:
    port = _free_port()
    args = [sys.executable, "-m", "criogen_graph", "serve"]
    # The agents always come from this file: only the server's code is compared. The
    # server starts in `root` (`python -m` imports the package from its directory).
    for name in ("agent", "stamp", "ticker"):
        args += ["--agent", f"{Path(__file__).resolve()}:{name}"]
    with _process([*args, "--storage", storage, "--port", str(port)], root, port, root) as up:
        yield up


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
    with _process([*args, "--host", "127.0.0.1", "--port", str(port)], project, port) as (url, _):
        yield url


@contextmanager
def aegra(work: Path, python: str, database: str) -> Iterator[str]:
    """aegra-api (installed in its own environment, whose `python` is given) serving
    this file's `graph` as `bench`, on PostgreSQL `database` (its own tables there)."""
    project = work / "aegra"
    project.mkdir()
    shutil.copy(Path(__file__), project / "bench_graph.py")
    (project / "aegra.json").write_text(json.dumps({"graphs": {"bench": "./bench_graph.py:graph"}}))
    port = _free_port()
    args = [python, "-m", "uvicorn", "aegra_api.main:app", "--host", "127.0.0.1"]
    env = {
        "AEGRA_CONFIG": "aegra.json",
        "DATABASE_URL": database,
        "AUTH_TYPE": "noop",
        "LOG_LEVEL": "WARNING",
    }
    with _process(
        [*args, "--port", str(port), "--log-level", "warning"],
        project,
        port,
        env_extra=env,
        health="/health",
    ) as (url, _):
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


async def overhead(storage: str, runs: int, baseline: Path | None = None) -> dict[str, float]:
    """p50 of `runs.wait` over HTTP and of `thread.send` in process, interleaved; with
    `baseline` (another checkout of the project), also over HTTP to a server running
    that checkout's code, interleaved with the others (before / after side by side)."""
    from criogen_graph import Storage

    async with Storage(storage) as opened:
        in_process = await _in_process_run(agent.with_storage(opened))
        with contextlib.ExitStack() as servers:
            url = servers.enter_context(serve(storage))
            base_url = servers.enter_context(serve(storage, baseline)) if baseline else None
            async with contextlib.AsyncExitStack() as clients:
                http = await clients.enter_async_context(
                    httpx.AsyncClient(base_url=url, timeout=60)
                )
                base = None
                if base_url is not None:
                    base = await clients.enter_async_context(
                        httpx.AsyncClient(base_url=base_url, timeout=60)
                    )
                over: list[float] = []
                local: list[float] = []
                before: list[float] = []
                for i in range(runs + 10):
                    warm = i < 10
                    for measure, out in (
                        (lambda: _http_run(http), over),
                        (in_process, local),
                        *([(lambda: _http_run(base), before)] if base is not None else []),
                    ):
                        elapsed = await measure()
                        if not warm:
                            out.append(elapsed)
    result = {
        "http_p50_ms": _pct(over, 50),
        "in_process_p50_ms": _pct(local, 50),
        "overhead_p50_ms": _pct(over, 50) - _pct(local, 50),
    }
    if before:
        result["baseline_http_p50_ms"] = _pct(before, 50)
        result["baseline_overhead_p50_ms"] = _pct(before, 50) - _pct(local, 50)
    return result


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


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


_STAMP = re.compile(rb'"text":\s*"([0-9.]+);"')


async def _open_stream(port: int, thread: str, plan: dict[str, Any]) -> tuple[Any, Any]:
    """A `runs.stream` request on a bare socket (HTTP/1.0: the body is the events as
    they come, until the run ends): one client process holds a thousand of them with
    little work of its own per event, so the latency measured is mostly the server's."""
    body = json.dumps(
        {
            "assistant_id": "ticker",
            "input": {"messages": [{"role": "user", "content": json.dumps(plan)}]},
            "stream_mode": ["custom"],
        }
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    head = (
        f"POST /threads/{thread}/runs/stream HTTP/1.0\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()
    return reader, writer


async def open_streams(storage: str, count: int, ticks: int, every: float) -> dict[str, Any]:
    """`count` streams open at once on one `serve` process: its memory (RSS) before and
    with them open, and the latency of their events (from the model writing a piece to
    the client reading it): each stream gets `ticks` pieces, `every` seconds apart, the
    streams' pieces spread evenly over each interval."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * count + 256)), hard))
    latencies: list[float] = []
    with serve_pid(storage) as (url, pid):
        port = int(url.rsplit(":", 1)[1])
        limits = httpx.Limits(max_connections=20)
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
            threads = [
                (await http.post("/threads", json={})).json()["thread_id"] for _ in range(count)
            ]
        await asyncio.sleep(1)
        idle_mb = _rss_mb(pid)
        # Every stream is open before the first piece is written.
        start = time.time() + 15 + count * 0.05
        plans = [
            {
                "start": start,
                "phase": every * i / count,
                "ticks": ticks,
                "every": every,
                "end": (ticks + 1) * every,
            }
            for i in range(count)
        ]
        opened_at = time.perf_counter()
        conns = await asyncio.gather(
            *(_open_stream(port, t, p) for t, p in zip(threads, plans, strict=True))
        )
        open_secs = time.perf_counter() - opened_at
        peak = [0.0]

        async def read(reader: Any, writer: Any) -> int:
            got = 0
            buffer = b""
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                seen = time.time()
                buffer += chunk
                end = 0
                for match in _STAMP.finditer(buffer):
                    latencies.append((seen - float(match.group(1))) * 1000)
                    got += 1
                    end = match.end()
                buffer = buffer[end:] if end else buffer[-4096:]
            writer.close()
            return got

        async def sample() -> None:
            while True:
                peak[0] = max(peak[0], _rss_mb(pid))
                await asyncio.sleep(0.2)

        await asyncio.sleep(max(0.0, start - time.time() - 1))
        open_mb = _rss_mb(pid)
        sampler = asyncio.ensure_future(sample())
        got = await asyncio.gather(*(read(r, w) for r, w in conns))
        ended_at = time.time()
        sampler.cancel()
    return {
        "streams": count,
        "events": len(latencies),
        "events_expected": count * ticks,
        "streams_complete": sum(1 for g in got if g == ticks),
        "open_secs": open_secs,
        "rss_idle_mb": idle_mb,
        "rss_open_mb": open_mb,
        "rss_peak_mb": peak[0],
        "kb_per_open_stream": (open_mb - idle_mb) * 1024 / count,
        "latency_p50_ms": _pct(latencies, 50),
        "latency_p99_ms": _pct(latencies, 99),
        "latency_max_ms": max(latencies),
        # The thousand runs asked to end at once: how long until every stream had closed.
        "all_closed_secs_after_the_runs_end": ended_at - (start + (ticks + 1) * every),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--no-dev", action="store_true", help="skip langgraph dev")
    parser.add_argument("--no-pg", action="store_true", help="skip PostgreSQL")
    parser.add_argument(
        "--only",
        action="append",
        choices=["first-token", "overhead", "concurrent", "streams"],
        help="run only these measures (repeat the option for several)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout of the project: the overhead is measured against a server "
        "running its code too, interleaved (before / after)",
    )
    parser.add_argument("--streams", type=int, default=1000, help="open streams at once")
    parser.add_argument("--ticks", type=int, default=5, help="events per open stream")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between them")
    parser.add_argument(
        "--aegra-python",
        help="the python of an environment with aegra-api installed (its dependencies "
        "differ from ours: install it apart, e.g. `python -m venv .venv-aegra && "
        ".venv-aegra/bin/pip install aegra-api greenlet`, plus this package's own "
        "dependencies): measured with the concurrent clients too",
    )
    parser.add_argument(
        "--aegra-db",
        default=PG_URL,
        help="PostgreSQL database for aegra-api's own tables (default: the bench's)",
    )
    args = parser.parse_args()
    only = set(args.only or ["first-token", "overhead", "concurrent", "streams"])
    results: dict[str, Any] = {}

    def show(name: str, value: Any) -> None:
        results[name] = value
        print(name, value, flush=True)

    if not args.no_pg and "first-token" in only:
        show("first_token_across_servers", await first_token(min(args.runs, 100)))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if "overhead" in only:
            sqlite = f"sqlite:///{work / 'bench.db'}"
            show("overhead_sqlite", await overhead(sqlite, args.runs, args.baseline))
            if not args.no_pg:
                show("overhead_postgres", await overhead(PG_URL, args.runs, args.baseline))
        if "concurrent" in only:
            with serve(f"sqlite:///{work / 'concurrent.db'}") as url:
                show("serve_sqlite_concurrent", await concurrent(url, args.runs, args.clients))
            if args.baseline:
                with serve(f"sqlite:///{work / 'concurrent-base.db'}", args.baseline) as url:
                    show(
                        "baseline_sqlite_concurrent",
                        await concurrent(url, args.runs, args.clients),
                    )
            if not args.no_pg:
                with serve(PG_URL) as url:
                    show("serve_pg_concurrent", await concurrent(url, args.runs, args.clients))
            if args.aegra_python:
                with aegra(work, args.aegra_python, args.aegra_db) as url:
                    show("aegra_concurrent", await concurrent(url, args.runs, args.clients))
            if not args.no_dev:
                with langgraph_dev(work) as url:
                    show("langgraph_dev_concurrent", await concurrent(url, args.runs, args.clients))
        if "streams" in only:
            sqlite = f"sqlite:///{work / 'streams.db'}"
            show(
                "open_streams_sqlite",
                await open_streams(sqlite, args.streams, args.ticks, args.every),
            )
            if not args.no_pg:
                show(
                    "open_streams_postgres",
                    await open_streams(PG_URL, args.streams, args.ticks, args.every),
                )
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
