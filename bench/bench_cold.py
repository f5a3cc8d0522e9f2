"""A long thread picked up cold: a web worker continuing a user's long conversation.

Long threads like the one of `bench_storage.py`'s growth test (100 user messages of ~2 KB,
each answered in two turns: a call to `echo`, then "done"; 400 transcript messages) are
continued one message at a time, in two ways, neither of which finds the thread in memory:

  fresh storage   a fresh `Storage` and agent around each message (opened, closed after):
                  a new process, or a worker that opens its storage per request; the
                  turn pays the opening too (connections, tables checked, graph compiled)
  two workers     two long-lived workers (a `Storage` and an agent each) taking turns on
                  each thread, as a load balancer hands a user's messages to whichever is
                  free: each message finds the thread last written by the other worker, so
                  its transcript is read back from the database (the worker's cached one is
                  stale) while connections and the compiled graph are warm

The baseline is LangChain's `create_agent` continuing threads of its own the same two ways
(a fresh `AsyncSqliteSaver` / `AsyncPostgresSaver` via `from_conn_string` and a fresh
`create_agent` per message; or two long-lived ones taking turns). Both sides are also
measured on their threads' first turns (threads of 1 to 10 user messages, continued the
same way), all in the same interleaved blocks, so two ratios per way:

  ours long / ours first       what a long thread costs to pick up, against a new one
                               (the transcript is a `DeltaChannel`: its latest snapshot and
                               the writes since are read back)
  ours long / baseline long    against LangGraph's own savers on the same job

The long threads (`--threads` per side, taken in turn) grow by a few messages while they
are measured; the output says how many. ms per turn = ms per message / 2.

    python bench/bench_cold.py [--messages 100] [--threads 4] [--blocks 4] [--runs 4]
                               [--warmup 1] [--pg URL | --no-pg] [--no-sqlite]
                               [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from _common import interleaved, lc_echo, machine, our_agent, scripted_chat_model

PG_DEFAULT = os.environ.get(
    "CRIOGEN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
PAD = "x" * 2000
FIRST_TURNS = 10

Run = Callable[[], Awaitable[None]]


def ours(url: str, thread_id: Callable[[], str]) -> Run:
    """One message to the thread from a fresh `Storage` and agent, closed after."""
    from criogen_graph import Storage

    async def run() -> None:
        storage = Storage(url)
        try:
            reply = await our_agent(storage).thread(thread_id()).send(f"more {PAD}")
            assert reply.text == "done"
        finally:
            await storage.close()

    return run


def baseline(saver_cm: Callable[[], Any], thread_id: Callable[[], str]) -> Run:
    """One message to the thread from a fresh saver and a fresh `create_agent`."""
    from langchain.agents import create_agent
    from langchain_core.messages import HumanMessage

    async def run() -> None:
        async with saver_cm() as saver:
            agent = create_agent(scripted_chat_model(), [lc_echo()], checkpointer=saver)
            out = await agent.ainvoke(
                {"messages": [HumanMessage(f"more {PAD}")]},
                {"configurable": {"thread_id": thread_id()}},
            )
            assert out["messages"][-1].content == "done"

    return run


Send = Callable[[str], Awaitable[None]]
Opener = Callable[[], Awaitable[tuple[Send, Callable[[], Awaitable[Any]]]]]


class Workers:
    """Two long-lived workers (each its own `Storage`, or saver, and agent) taking turns
    on each thread, as a load balancer hands a user's messages to whichever worker is
    free: every message goes to the worker that did not write the thread last, so it
    finds its cached transcript stale and reads the thread from the database, while its
    connections and compiled graph are warm. This isolates reading the thread back from
    the fixed cost of opening a storage."""

    def __init__(self, open_one: Opener, thread_id: Callable[[], str]) -> None:
        self.open_one = open_one
        self.thread_id = thread_id
        self.workers: list[tuple[Send, Callable[[], Awaitable[Any]]]] = []
        self.last: dict[str, int] = {}

    async def run(self) -> None:
        if not self.workers:
            self.workers = [await self.open_one(), await self.open_one()]
        thread_id = self.thread_id()
        worker = 1 - self.last.get(thread_id, 1)
        self.last[thread_id] = worker
        await self.workers[worker][0](thread_id)

    async def close(self) -> None:
        for _, close in self.workers:
            await close()


def ours_worker(url: str) -> Opener:
    """A worker of ours: a `Storage` and an agent, kept open."""
    from criogen_graph import Storage

    async def open_one() -> tuple[Send, Callable[[], Awaitable[Any]]]:
        storage = Storage(url)
        await storage.open()
        agent = our_agent(storage)

        async def send(thread_id: str) -> None:
            reply = await agent.thread(thread_id).send(f"more {PAD}")
            assert reply.text == "done"

        return send, storage.close

    return open_one


def baseline_worker(saver_cm: Callable[[], Any]) -> Opener:
    """A baseline worker: a saver and a `create_agent`, kept open."""
    from langchain.agents import create_agent
    from langchain_core.messages import HumanMessage

    async def open_one() -> tuple[Send, Callable[[], Awaitable[Any]]]:
        cm = saver_cm()
        saver = await cm.__aenter__()
        agent = create_agent(scripted_chat_model(), [lc_echo()], checkpointer=saver)

        async def send(thread_id: str) -> None:
            out = await agent.ainvoke(
                {"messages": [HumanMessage(f"more {PAD}")]},
                {"configurable": {"thread_id": thread_id}},
            )
            assert out["messages"][-1].content == "done"

        async def close() -> None:
            await cm.__aexit__(None, None, None)

        return send, close

    return open_one


def rotating(prefix: str) -> Callable[[], str]:
    """Thread ids for "first turns": each thread takes `FIRST_TURNS` messages, then a new
    one starts."""
    n = {"i": 0}

    def next_id() -> str:
        i = n["i"]
        n["i"] += 1
        return f"{prefix}-{i // FIRST_TURNS}"

    return next_id


def cycling(prefix: str, n: int) -> Callable[[], str]:
    """Thread ids for "long": the `n` long threads in turn, so that each grows by only a
    few messages while it is measured."""
    i = {"i": 0}

    def next_id() -> str:
        i["i"] += 1
        return f"{prefix}-{i['i'] % n}"

    return next_id


async def build(open_one: Opener, thread_ids: list[str], messages: int) -> None:
    """Grow each thread to `messages` user messages (one warm worker)."""
    send, close = await open_one()
    try:
        for thread_id in thread_ids:
            for _ in range(messages):
                await send(thread_id)
    finally:
        await close()


async def measure(args: argparse.Namespace, backend: str, tmp: str) -> dict[str, Any]:
    if backend == "sqlite":
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        url = f"sqlite:///{tmp}/ours.db"

        def saver_cm() -> Any:
            return AsyncSqliteSaver.from_conn_string(f"{tmp}/baseline.db")

        async with saver_cm() as saver:
            await saver.setup()
    else:
        import uuid

        import psycopg
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        # A schema of its own, dropped after: the long threads' tables stay out of the
        # test database's shared ones.
        schema = f"criogen_bench_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(args.pg, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        sep = "&" if "?" in args.pg else "?"
        url = f"{args.pg}{sep}options=-csearch_path%3D{schema}"

        def saver_cm() -> Any:
            return AsyncPostgresSaver.from_conn_string(url)

        async with saver_cm() as saver:
            await saver.setup()

    workers: list[Workers] = []
    try:
        t0 = time.perf_counter()
        longs = range(args.threads)
        await build(ours_worker(url), [f"ours-long-{i}" for i in longs], args.messages)
        await build(baseline_worker(saver_cm), [f"base-long-{i}" for i in longs], args.messages)
        built_s = time.perf_counter() - t0
        workers = [
            Workers(ours_worker(url), cycling("ours-long", args.threads)),
            Workers(ours_worker(url), rotating("ours-wfirst")),
            Workers(baseline_worker(saver_cm), cycling("base-long", args.threads)),
            Workers(baseline_worker(saver_cm), rotating("base-wfirst")),
        ]
        variants = {
            "ours long, fresh storage": ours(url, cycling("ours-long", args.threads)),
            "ours first turns, fresh storage": ours(url, rotating("ours-first")),
            "baseline long, fresh saver": baseline(saver_cm, cycling("base-long", args.threads)),
            "baseline first turns, fresh saver": baseline(saver_cm, rotating("base-first")),
            "ours long, two workers": workers[0].run,
            "ours first turns, two workers": workers[1].run,
            "baseline long, two workers": workers[2].run,
            "baseline first turns, two workers": workers[3].run,
        }
        samples = await interleaved(variants, args.blocks, args.runs, args.warmup)
    finally:
        for w in workers:
            await w.close()
        if backend == "postgres":
            with psycopg.connect(args.pg, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    t = {k: statistics.median(v) / 2 for k, v in samples.items()}
    ratios = {}
    for mode, base_mode in (("fresh storage", "fresh saver"), ("two workers", "two workers")):
        ratios[mode] = {
            "ours_long_vs_first": t[f"ours long, {mode}"] / t[f"ours first turns, {mode}"],
            "ours_vs_baseline_long": t[f"ours long, {mode}"] / t[f"baseline long, {base_mode}"],
            "baseline_long_vs_first": (
                t[f"baseline long, {base_mode}"] / t[f"baseline first turns, {base_mode}"]
            ),
        }
    return {
        "ms_per_turn": t,
        "ratios": ratios,
        "long_thread_user_messages": [
            args.messages,
            # two variants continue the long threads
            args.messages + -(-2 * (args.warmup + args.blocks * args.runs) // args.threads),
        ],
        "build_s": round(built_s, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--messages", type=int, default=100, help="user messages in the long thread")
    ap.add_argument("--threads", type=int, default=4, help="long threads per side")
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--pg", default=PG_DEFAULT)
    ap.add_argument("--no-pg", action="store_true")
    ap.add_argument("--no-sqlite", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    print("# machine:", json.dumps(machine()))
    tmp = tempfile.mkdtemp(prefix="criogen-bench-")
    result: dict[str, Any] = {"machine": machine()}
    backends = [b for b, skip in (("sqlite", args.no_sqlite), ("postgres", args.no_pg)) if not skip]
    for backend in backends:
        r = asyncio.run(measure(args, backend, tmp))
        result[backend] = r
        lo, hi = r["long_thread_user_messages"]
        print(
            f"\n# {backend}: long threads at {lo}..{hi} user messages (built in {r['build_s']} s)"
        )
        print(f"{'cold turn':44s} {'median ms/turn':>15s}")
        for k, v in r["ms_per_turn"].items():
            print(f"{k:44s} {v:15.3f}")
        for mode, rs in r["ratios"].items():
            for name, v in rs.items():
                print(f"{'ratio ' + name + ', ' + mode:44s} {v:15.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
