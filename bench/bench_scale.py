"""Many runs at once, and what idle threads cost.

Side by side in one process, our runtime against LangChain's `create_agent` with
LangGraph's own savers, the same job everywhere (one user message answered in two turns:
a call to `echo`, then "done"):

- 1,000 concurrent `agent.run`s (`asyncio.gather`) against 1,000 concurrent
  `create_agent.ainvoke`s without a checkpointer: wall time (median of interleaved
  rounds) and peak traced memory (one `tracemalloc` round each);
- 1,000 concurrent threads (`thread.send` on 1,000 thread ids) on SQLite and on
  PostgreSQL, against `create_agent` with `AsyncSqliteSaver` / `AsyncPostgresSaver`
  (a pool of 10 connections, like ours);
- resident memory per 1,000 idle threads: memory still held (traced, after a
  `gc.collect()`) once 1,000 threads have each answered one message ("first"), and what
  1,000 more add ("further": the steady state, once bounded caches are full), on SQLite
  (what the process keeps for threads that live in the database) and on `memory://` /
  `InMemorySaver` (where the threads themselves live in the process).

    python bench/bench_scale.py [--n 1000] [--rounds 3] [--pg URL | --no-pg] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from _common import lc_echo, machine, our_agent, scripted_chat_model

PG_DEFAULT = os.environ.get(
    "CRIOGEN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)

Batch = Callable[[int], Awaitable[None]]


def lc_graph(checkpointer: Any = None) -> Any:
    from langchain.agents import create_agent

    return create_agent(scripted_chat_model(), [lc_echo()], checkpointer=checkpointer)


async def lc_batch(graph: Any, n: int, threads: bool) -> None:
    from langchain_core.messages import HumanMessage

    async def one() -> None:
        config: Any = {"configurable": {"thread_id": uuid.uuid4().hex}} if threads else None
        out = await graph.ainvoke({"messages": [HumanMessage("go")]}, config)
        assert out["messages"][-1].content == "done"

    await asyncio.gather(*(one() for _ in range(n)))


def ours_runs(agent: Any) -> Batch:
    async def batch(n: int) -> None:
        results = await asyncio.gather(*(agent.run("go") for _ in range(n)))
        assert all(r.text == "done" for r in results)

    return batch


def ours_threads(agent: Any) -> Batch:
    async def batch(n: int) -> None:
        replies = await asyncio.gather(
            *(agent.thread(uuid.uuid4().hex).send("go") for _ in range(n))
        )
        assert all(r.text == "done" for r in replies)

    return batch


async def wall_and_peak(
    variants: dict[str, Batch], n: int, rounds: int
) -> dict[str, dict[str, float]]:
    """Median wall seconds over interleaved rounds, then one traced round each for the
    peak memory (MB) the batch allocated on top of what was there."""
    for batch in variants.values():
        await batch(min(n, 50))  # warm up: first-use imports and caches
    walls: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            gc.collect()
            t0 = time.perf_counter()
            await variants[name](n)
            walls[name].append(time.perf_counter() - t0)
    out: dict[str, dict[str, float]] = {}
    for name, batch in variants.items():
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        await batch(n)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        out[name] = {
            "wall_s": statistics.median(walls[name]),
            "peak_mb": (peak - base) / 1e6,
        }
    return out


async def idle_memory(
    make: Callable[[], Awaitable[tuple[Batch, Callable[[], Awaitable[None]]]]], n: int
) -> dict[str, float]:
    """MB still allocated (traced, after gc) once `n` threads have each answered one
    message ("first"), and what `n` more threads add on top ("further": the steady-state
    cost, once bounded caches are full), both scaled to 1,000 threads."""
    batch, close = await make()
    await batch(10)  # first-use imports and caches are not the threads' cost
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    await batch(n)
    gc.collect()
    first = tracemalloc.get_traced_memory()[0]
    await batch(n)
    gc.collect()
    further = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    await close()
    scale = 1000 / n / 1e6
    return {"first": (first - before) * scale, "further": (further - first) * scale}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    from criogen_graph import Storage

    tmp = tempfile.mkdtemp(prefix="criogen-scale-")
    result: dict[str, Any] = {"machine": machine(), "n": args.n}

    # -- concurrent runs, no storage ----------------------------------------------------
    no_storage = lc_graph()
    runs = await wall_and_peak(
        {
            "criogen_graph agent.run": ours_runs(our_agent()),
            "create_agent ainvoke": lambda n: lc_batch(no_storage, n, threads=False),
        },
        args.n,
        args.rounds,
    )
    result["concurrent_runs"] = runs

    # -- concurrent threads on SQLite -----------------------------------------------------
    ours_sqlite = Storage(f"sqlite:///{tmp}/ours.db")
    await ours_sqlite.open()
    acm = AsyncSqliteSaver.from_conn_string(f"{tmp}/lc.db")
    lc_sqlite = await acm.__aenter__()
    await lc_sqlite.setup()
    lc_sqlite_graph = lc_graph(lc_sqlite)
    result["concurrent_threads_sqlite"] = await wall_and_peak(
        {
            "criogen_graph thread.send (SQLite)": ours_threads(our_agent(ours_sqlite)),
            "create_agent + AsyncSqliteSaver": lambda n: lc_batch(lc_sqlite_graph, n, True),
        },
        args.n,
        args.rounds,
    )
    await ours_sqlite.close()
    await acm.__aexit__(None, None, None)

    # -- concurrent threads on PostgreSQL -------------------------------------------------
    if args.pg:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from psycopg.rows import dict_row
        from psycopg_pool import AsyncConnectionPool

        ours_pg = Storage(args.pg, max_connections=10)
        await ours_pg.open()
        pool = AsyncConnectionPool(
            args.pg,
            min_size=1,
            max_size=10,
            open=False,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        )
        await pool.open()
        lc_pg = AsyncPostgresSaver(pool)
        await lc_pg.setup()
        lc_pg_graph = lc_graph(lc_pg)
        result["concurrent_threads_postgres"] = await wall_and_peak(
            {
                "criogen_graph thread.send (PostgreSQL)": ours_threads(our_agent(ours_pg)),
                "create_agent + AsyncPostgresSaver": lambda n: lc_batch(lc_pg_graph, n, True),
            },
            args.n,
            args.rounds,
        )
        await ours_pg.close()
        await pool.close()

    # -- idle threads ---------------------------------------------------------------------
    async def ours_on(url: str) -> tuple[Batch, Callable[[], Awaitable[None]]]:
        storage = Storage(url)
        await storage.open()
        return ours_threads(our_agent(storage)), storage.close

    async def lc_memory() -> tuple[Batch, Callable[[], Awaitable[None]]]:
        graph = lc_graph(InMemorySaver())

        async def close() -> None:
            return None

        return (lambda n: lc_batch(graph, n, True)), close

    async def lc_sqlite_on() -> tuple[Batch, Callable[[], Awaitable[None]]]:
        cm = AsyncSqliteSaver.from_conn_string(f"{tmp}/lc-idle.db")
        saver = await cm.__aenter__()
        await saver.setup()
        graph = lc_graph(saver)

        async def close() -> None:
            await cm.__aexit__(None, None, None)

        return (lambda n: lc_batch(graph, n, True)), close

    result["idle_mb_per_1000_threads"] = {
        "criogen_graph SQLite": await idle_memory(
            lambda: ours_on(f"sqlite:///{tmp}/idle.db"), args.n
        ),
        "create_agent + AsyncSqliteSaver": await idle_memory(lc_sqlite_on, args.n),
        "criogen_graph memory://": await idle_memory(lambda: ours_on("memory://"), args.n),
        "create_agent + InMemorySaver": await idle_memory(lc_memory, args.n),
    }
    return result


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=1000, help="concurrent runs / threads")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    ap.add_argument("--pg", default=PG_DEFAULT)
    ap.add_argument("--no-pg", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.no_pg:
        args.pg = None
    print("# machine:", json.dumps(machine()))
    result = asyncio.run(main_async(args))
    ratios: dict[str, float] = {}
    for key, ours_name, base_name, target in (
        ("concurrent_runs", "criogen_graph agent.run", "create_agent ainvoke", 0.7),
        (
            "concurrent_threads_sqlite",
            "criogen_graph thread.send (SQLite)",
            "create_agent + AsyncSqliteSaver",
            None,
        ),
        (
            "concurrent_threads_postgres",
            "criogen_graph thread.send (PostgreSQL)",
            "create_agent + AsyncPostgresSaver",
            None,
        ),
    ):
        if key not in result:
            continue
        section = result[key]
        print(f"\n{key} (n={args.n}) {'wall s':>10s} {'peak MB':>10s}")
        for name, v in section.items():
            print(f"  {name:44s} {v['wall_s']:10.3f} {v['peak_mb']:10.1f}")
        ratio = section[ours_name]["wall_s"] / section[base_name]["wall_s"]
        mem = section[ours_name]["peak_mb"] / section[base_name]["peak_mb"]
        ratios[f"{key}_wall"] = ratio
        ratios[f"{key}_peak_memory"] = mem
        goal = f"   (target <= {target:.2f})" if target else ""
        print(f"  {'ratio wall ours / baseline':44s} {ratio:10.2f}{goal}")
        print(f"  {'ratio peak memory ours / baseline':44s} {mem:10.2f}")
    print(f"\n{'MB held per 1,000 idle threads':46s} {'first':>8s} {'further':>8s}")
    for name, v in result["idle_mb_per_1000_threads"].items():
        print(f"  {name:44s} {v['first']:8.2f} {v['further']:8.2f}")
    result["ratios"] = ratios
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
