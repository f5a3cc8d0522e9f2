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

With `--workers W --threads T`, instead: many workers on one PostgreSQL. T threads, one
send each, spread over W worker processes (each with its own pool of 10 connections and
`--concurrency` sends in flight), ours and then `create_agent` + `AsyncPostgresSaver` the
same way: wall time (from the moment every worker is ready until the last is done),
p50 / p99 latency per send and per turn (a send is two turns), errors (sends that raised),
and the memory (RSS, after `gc.collect()`) each worker still holds per 1,000 threads it
served, which are idle in the database by then.

    python bench/bench_scale.py [--n 1000] [--rounds 3] [--pg URL | --no-pg] [--json out.json]
    python bench/bench_scale.py --workers 2 --threads 10000 [--concurrency 50] [--pg URL]
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
from _common import baseline_pg_saver, lc_echo, machine, our_agent, scripted_chat_model

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
        # Every run is the two turns the table claims: one tool call, then the answer.
        assert [m.type for m in out["messages"]] == ["human", "ai", "tool", "ai"]
        assert out["messages"][-1].content == "done"

    await asyncio.gather(*(one() for _ in range(n)))


def ours_runs(agent: Any) -> Batch:
    async def batch(n: int) -> None:
        results = await asyncio.gather(*(agent.run("go") for _ in range(n)))
        assert all(r.text == "done" and r.tool_calls == 1 for r in results)

    return batch


def ours_threads(agent: Any) -> Batch:
    async def batch(n: int) -> None:
        replies = await asyncio.gather(
            *(agent.thread(uuid.uuid4().hex).send("go") for _ in range(n))
        )
        assert all(r.text == "done" and len(r.messages) == 4 for r in replies)

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


def rss_mb() -> float:
    """The process's resident memory now, in MB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


async def worker_async(kind: str, pg: str, threads: int, concurrency: int) -> dict[str, Any]:
    """One worker process's share: open its storage (its own pool), warm up, say "ready"
    on stdout, wait for "go" on stdin, then `threads` sends on fresh threads with
    `concurrency` in flight. Returns its latencies (ms per send), errors and memory."""
    if kind == "ours":
        from criogen_graph import Storage

        storage = Storage(pg, max_connections=10)
        await storage.open()
        agent = our_agent(storage)

        async def send() -> None:
            reply = await agent.thread(uuid.uuid4().hex).send("go")
            assert reply.text == "done"

        close: Callable[[], Awaitable[None]] = storage.close
    else:
        from langchain_core.messages import HumanMessage

        saver, pool = await baseline_pg_saver(pg)
        graph = lc_graph(saver)

        async def send() -> None:
            out = await graph.ainvoke(
                {"messages": [HumanMessage("go")]},
                {"configurable": {"thread_id": uuid.uuid4().hex}},
            )
            assert out["messages"][-1].content == "done"

        close = pool.close
    for _ in range(20):  # first-use imports, caches, the pool's connections
        await send()
    gc.collect()
    rss0 = rss_mb()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    latencies: list[float] = []
    errors: list[str] = []
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            t0 = time.perf_counter()
            try:
                await send()
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
                return
            latencies.append((time.perf_counter() - t0) * 1000)

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(threads)))
    wall = time.perf_counter() - t0
    gc.collect()
    rss1 = rss_mb()
    await close()
    return {
        "wall_s": wall,
        "latencies_ms": latencies,
        "errors": len(errors),
        "first_errors": errors[:3],
        "rss_mb_per_1000": (rss1 - rss0) * 1000 / threads,
    }


def run_workers(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """`args.workers` processes sharing `args.threads`, started together."""
    import subprocess

    share = [
        args.threads // args.workers + (i < args.threads % args.workers)
        for i in range(args.workers)
    ]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                os.path.abspath(__file__),
                "--worker",
                kind,
                "--pg",
                args.pg,
                "--threads",
                str(n),
                "--concurrency",
                str(args.concurrency),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in share
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    t0 = time.perf_counter()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = []
    for p in procs:
        out, _ = p.communicate()
        assert p.returncode == 0, f"a {kind} worker failed ({p.returncode})"
        outs.append(json.loads(out.strip().splitlines()[-1]))
    wall = time.perf_counter() - t0
    lat = sorted(x for o in outs for x in o["latencies_ms"])

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else float("nan")

    return {
        "wall_s": wall,
        "sends_per_s": args.threads / wall,
        "send_p50_ms": pct(0.50),
        "send_p99_ms": pct(0.99),
        "errors": sum(o["errors"] for o in outs),
        "first_errors": [e for o in outs for e in o["first_errors"]][:3],
        "rss_mb_per_1000_idle_threads": statistics.fmean(o["rss_mb_per_1000"] for o in outs),
    }


def workers_main(args: argparse.Namespace) -> None:
    print("# machine:", json.dumps(machine()))
    result: dict[str, Any] = {
        "machine": machine(),
        "workers": args.workers,
        "threads": args.threads,
        "concurrency_per_worker": args.concurrency,
    }
    names = {"ours": "criogen_graph thread.send", "base": "create_agent + AsyncPostgresSaver"}
    for kind in ("ours", "base"):
        result[names[kind]] = run_workers(kind, args)
    print(
        f"\n{args.threads} threads, one send each, {args.workers} workers on one PostgreSQL "
        f"({args.concurrency} in flight per worker)"
    )
    head = ["wall s", "sends/s", "p50 ms", "p99 ms", "turn p50", "turn p99", "errors", "MB/1k"]
    print(f"  {'':36s}" + "".join(f"{h:>10s}" for h in head))
    for name in names.values():
        v = result[name]
        cells = [
            v["wall_s"],
            v["sends_per_s"],
            v["send_p50_ms"],
            v["send_p99_ms"],
            v["send_p50_ms"] / 2,
            v["send_p99_ms"] / 2,
            v["errors"],
            v["rss_mb_per_1000_idle_threads"],
        ]
        row = "".join(f"{c:10.2f}" if isinstance(c, float) else f"{c:10d}" for c in cells)
        print(f"  {name:36s}{row}")
        for e in v["first_errors"]:
            print(f"    error: {e}")
    ours, base = (result[n] for n in names.values())
    print(f"  {'ratio wall ours / baseline':36s}{ours['wall_s'] / base['wall_s']:10.2f}")
    print("  (MB/1k: RSS a worker still holds per 1,000 threads it served, idle by then)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


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
        ours_pg = Storage(args.pg, max_connections=10)
        await ours_pg.open()
        lc_pg, pool = await baseline_pg_saver(args.pg)
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
    ap.add_argument("--workers", type=int, default=0, help="worker processes on PostgreSQL")
    ap.add_argument("--threads", type=int, default=10000, help="threads over the workers")
    ap.add_argument("--concurrency", type=int, default=50, help="sends in flight per worker")
    ap.add_argument("--worker", choices=["ours", "base"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        out = asyncio.run(worker_async(args.worker, args.pg, args.threads, args.concurrency))
        print(json.dumps(out))
        return
    if args.workers:
        workers_main(args)
        return
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
