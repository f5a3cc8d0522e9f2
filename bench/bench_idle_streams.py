"""Many idle SSE connections on one `criogen-graph serve` process (the issue's "10,000
concurrent idle SSE connections"): they are opened to the `join_stream` of a run whose
tool waits, then the server is measured with them open against the same server with
none: `GET /ok` latency and a two-turn run of another thread through `runs/wait`
(p50 / p99), the server's resident memory per connection and its CPU while the
connections idle, and errors (any non-200
answer, any refused connection). Then the waiting run is cancelled and every stream must
end cleanly.

Not part of the test suite (tests/test_serve_load.py holds 500). Run from the
repository root:

    .venv/bin/python bench/bench_idle_streams.py                  # 10,000, SQLite, inline runs
    .venv/bin/python bench/bench_idle_streams.py --streams 2000 --postgres-workers

`--postgres-workers`: two `serve --workers external` processes and a worker on
PostgreSQL ($CRIOGEN_TEST_POSTGRES_URL); the streams follow a run the worker executes
(each follower reads the run's events from the database).

Each connection is a file in the benchmark process and in the server: the soft limit of
open files is raised to the hard limit (the server inherits it); with a hard limit below
the count the benchmark says so and stops.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.serve_load import (  # noqa: E402
    close_all,
    open_idle_streams,
    raise_nofile,
    read_to_end,
    rss_bytes,
)

AGENTS = ("tests.serve_agents:chunky", "tests.serve_agents:slow")


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))], 2)


async def _probe(url: str, samples: int) -> dict[str, Any]:
    """`GET /ok` and `runs/wait` of another thread, `samples` times each: latencies (ms)
    and the statuses that were not 200."""
    oks: list[float] = []
    runs: list[float] = []
    bad: list[int] = []
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        for _ in range(samples):
            t0 = time.perf_counter()
            r = await http.get("/ok")
            oks.append((time.perf_counter() - t0) * 1000)
            if r.status_code != 200:
                bad.append(r.status_code)
            thread = await http.post("/threads", json={})
            if thread.status_code != 200:
                bad.append(thread.status_code)
                continue
            t0 = time.perf_counter()
            done = await http.post(
                f"/threads/{thread.json()['thread_id']}/runs/wait",
                json={
                    "assistant_id": "chunky",
                    "input": {"messages": [{"role": "user", "content": "hi"}]},
                },
            )
            runs.append((time.perf_counter() - t0) * 1000)
            if done.status_code != 200:
                bad.append(done.status_code)
    return {
        "ok_p50_ms": _pct(oks, 50),
        "ok_p99_ms": _pct(oks, 99),
        "run_p50_ms": _pct(runs, 50) if runs else None,
        "run_p99_ms": _pct(runs, 99) if runs else None,
        "non_200": bad,
    }


def _cpu_secs(pid: int) -> float:
    """User + system CPU seconds process `pid` has used (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(
    url: str, follow_url: str, pid: int, streams: int, samples: int
) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        thread_id = (await http.post("/threads", json={})).json()["thread_id"]
        run = (
            await http.post(
                f"/threads/{thread_id}/runs",
                json={
                    "assistant_id": "slow",
                    "input": {"messages": [{"role": "user", "content": "wait"}]},
                    "stream_mode": ["custom"],
                },
            )
        ).json()
    idle = await _probe(follow_url, samples)
    base = rss_bytes(pid)
    t0 = time.perf_counter()
    opened, errors = await open_idle_streams(
        follow_url, f"/threads/{thread_id}/runs/{run['run_id']}/stream", streams
    )
    open_secs = time.perf_counter() - t0
    out: dict[str, Any] = {
        "streams_asked": streams,
        "streams_open": len(opened),
        "open_errors": sorted(set(errors))[:5],
        "open_error_count": len(errors),
        "open_secs": round(open_secs, 2),
    }
    try:
        # What the open streams cost the server while nothing else happens.
        cpu0, t0 = _cpu_secs(pid), time.perf_counter()
        await asyncio.sleep(5)
        out["server_open_files"] = len(os.listdir(f"/proc/{pid}/fd"))
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            now = await http.get(f"/threads/{thread_id}/runs/{run['run_id']}")
            out["run_status_while_idle"] = now.json().get("status")
        out["streams_at_eof"] = sum(1 for r, _ in opened if r.at_eof())
        out["idle_cpu_pct"] = round(100 * (_cpu_secs(pid) - cpu0) / (time.perf_counter() - t0), 1)
        busy = await _probe(follow_url, samples)
        grown = rss_bytes(pid) - base
        out.update(
            rss_growth_mb=round(grown / 2**20, 1),
            kb_per_stream=round(grown / 1024 / max(1, len(opened)), 1),
            without_streams=idle,
            with_streams=busy,
        )
        if idle["ok_p50_ms"] and busy["ok_p50_ms"]:
            out["ok_p50_ratio"] = round(busy["ok_p50_ms"] / idle["ok_p50_ms"], 2)
        if idle["run_p50_ms"] and busy["run_p50_ms"]:
            out["run_p50_ratio"] = round(busy["run_p50_ms"] / idle["run_p50_ms"], 2)
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            t0 = time.perf_counter()
            await http.post(f"/threads/{thread_id}/runs/{run['run_id']}/cancel?wait=true")
        ends = await asyncio.wait_for(
            asyncio.gather(*(read_to_end(r) for r, _ in opened), return_exceptions=True), 300
        )
        out["all_ended_secs"] = round(time.perf_counter() - t0, 2)
        out["ended_cleanly"] = sum(
            1 for e in ends if isinstance(e, bytes) and e.endswith(b"0\r\n\r\n")
        )
    finally:
        close_all(opened)
    return out


@contextmanager
def _sqlite(work: Path) -> Iterator[tuple[str, str, int]]:
    from tests.test_serve import serve

    with serve(f"sqlite:///{work / 'idle.db'}", work, agents=AGENTS) as server:
        yield server.url, server.url, server.pid


@contextmanager
def _postgres(work: Path) -> Iterator[tuple[str, str, int]]:
    from tests.test_serve_workers import running_cluster

    # The workers' default timing (the tests' 1 s --stalled-after is for killing them).
    with running_cluster(work, agents=AGENTS, workers=1, timing=("2", "10")) as cluster:
        a, b = cluster.servers
        # Runs are created through A, the idle streams follow them through B.
        yield a.url, b.url, b.pid


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=30, help="probes per side")
    parser.add_argument("--postgres-workers", action="store_true")
    args = parser.parse_args()
    need = args.streams + 1024
    limit = raise_nofile(need)
    if limit < need:
        sys.exit(
            f"the hard limit of open files is {limit}: {args.streams} connections need "
            f"{need} in this process and in the server (raise it: ulimit -Hn)"
        )
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        where = _postgres(work) if args.postgres_workers else _sqlite(work)
        with where as (url, follow_url, pid):
            result = await measure(url, follow_url, pid, args.streams, args.samples)
    result["mode"] = "postgres, external workers" if args.postgres_workers else "sqlite, inline"
    result["open_files_limit"] = limit
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
