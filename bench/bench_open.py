"""The first opening of a PostgreSQL storage: what a worker or web process that opens its
storage per request pays before its first statement.

Side by side in one process, interleaved, each repetition on fresh connections:

  ours        `await Storage(url).open()` on an already set-up database (connections,
              the tables checked, the encryption claim read), then `close()`
  langgraph   LangGraph's documented production setup: an `AsyncConnectionPool`
              (min_size=1, opened with wait=True) and `AsyncPostgresSaver(pool).setup()`,
              then the pool closed

Only the opening is timed (not the closing). With `--processes N` the same pair is also
measured in N fresh interpreters each (imports done before the clock starts), the order
alternating, for the first opening of a process as such.

    python bench/bench_open.py [--pg URL] [--reps 200] [--processes 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from _common import machine

PG_DEFAULT = os.environ.get(
    "CRIOGEN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)

Open = Callable[[], Awaitable[float]]


def ours(url: str) -> Open:
    from criogen_graph import Storage

    async def run() -> float:
        storage = Storage(url)
        t0 = time.perf_counter_ns()
        await storage.open()
        ms = (time.perf_counter_ns() - t0) / 1e6
        await storage.close()
        return ms

    return run


def langgraph(url: str) -> Open:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    async def run() -> float:
        t0 = time.perf_counter_ns()
        pool = AsyncConnectionPool(
            url,
            min_size=1,
            open=False,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        )
        await pool.open(wait=True)
        await AsyncPostgresSaver(pool).setup()  # type: ignore[arg-type]
        ms = (time.perf_counter_ns() - t0) / 1e6
        await pool.close()
        return ms

    return run


async def side_by_side(url: str, reps: int) -> dict[str, list[float]]:
    variants = {"ours": ours(url), "langgraph": langgraph(url)}
    for fn in variants.values():  # imports, and the tables set up once
        for _ in range(3):
            await fn()
    samples: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for i in range(reps):
        for name in names if i % 2 == 0 else reversed(names):
            gc.collect()
            samples[name].append(await variants[name]())
    return samples


_CHILD = """
import asyncio, json, sys
sys.path.insert(0, {bench!r})
import bench_open as b
url, first = {url!r}, {first!r}
fns = {{"ours": b.ours(url), "langgraph": b.langgraph(url)}}
import criogen_graph.storage.postgres as _p
_p.import_once("psycopg", "psycopg_pool", "langgraph.checkpoint.postgres.aio")
async def main():
    order = [first] + [n for n in fns if n != first]
    return {{n: await fns[n]() for n in order}}
print(json.dumps(asyncio.run(main())))
"""


def in_fresh_processes(url: str, n: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"ours": [], "langgraph": []}
    here = os.path.dirname(os.path.abspath(__file__))
    for i in range(n):
        first = "ours" if i % 2 == 0 else "langgraph"
        code = _CHILD.format(bench=here, url=url, first=first)
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
        for name, ms in json.loads(out.strip().splitlines()[-1]).items():
            samples[name].append(ms)
    return samples


def summary(samples: dict[str, list[float]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, xs in samples.items():
        xs = sorted(xs)
        q = statistics.quantiles(xs, n=10) if len(xs) >= 10 else [xs[0]] * 9
        out[name] = {
            "p50_ms": statistics.median(xs),
            "p10_ms": q[0],
            "p90_ms": q[-1],
            "n": len(xs),
        }
    out["ratio_p50"] = out["ours"]["p50_ms"] / out["langgraph"]["p50_ms"]
    return out


def show(title: str, s: dict[str, Any]) -> None:
    print(title)
    for name in ("ours", "langgraph"):
        r = s[name]
        print(
            f"  {name:10s} p50 {r['p50_ms']:7.2f} ms   p10 {r['p10_ms']:7.2f}   "
            f"p90 {r['p90_ms']:7.2f}   (n={r['n']})"
        )
    print(f"  ratio ours / langgraph (p50): {s['ratio_p50']:.2f}   (target <= 1.5)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pg", default=PG_DEFAULT)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--processes", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args()
    result: dict[str, Any] = {"machine": machine()}
    result["fresh_pools"] = summary(asyncio.run(side_by_side(args.pg, args.reps)))
    show("first open, fresh connections, one process (ms)", result["fresh_pools"])
    if args.processes:
        result["fresh_processes"] = summary(in_fresh_processes(args.pg, args.processes))
        show("first open of a fresh process (ms)", result["fresh_processes"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
