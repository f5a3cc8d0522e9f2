"""Durable turns: `thread.send` on SQLite / PostgreSQL against LangChain's `create_agent`
with LangGraph's own savers, side by side in one process, interleaved blocks.

Also `thread.stream` against `thread.send` on SQLite (every event consumed).

Each run is one user message on a fresh thread, answered in two turns (the scripted model
calls `echo`, then answers "done"); ms per turn = ms per run / 2. The baselines are
`create_agent` with `SqliteSaver` (sync `invoke`, the saver's home) and `AsyncSqliteSaver`
(`ainvoke`), both on a WAL file with LangGraph's defaults, and `AsyncPostgresSaver` on a
pool / `PostgresSaver` on one connection. Then the growth test: one thread, 100 user
messages of ~2 KB (two turns each): SQLite file size and the first vs last 10 turns.

At equal durability: `--synchronous normal` (the default) puts every SQLite file, ours
and LangGraph's savers', on WAL + `synchronous=NORMAL`; `--synchronous full` puts all of
them on WAL + `synchronous=FULL` (ours through `sqlite:///x.db?synchronous=full`, theirs
through `PRAGMA synchronous` on their connection after `setup()`).

    python bench/bench_storage.py [--blocks 8] [--runs 25] [--pg URL | --no-pg] [--growth 100]
        [--synchronous normal|full]
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
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from _common import (
    baseline_pg_saver,
    interleaved,
    lc_echo,
    machine,
    our_agent,
    scripted_chat_model,
)

PG_DEFAULT = os.environ.get(
    "CRIOGEN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)


async def per_turn(args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    import sqlite3

    from langchain.agents import create_agent
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    from criogen_graph import Storage

    closers: list[Callable[[], Awaitable[None]]] = []
    variants: dict[str, Callable[[], Awaitable[None]]] = {}

    sync = args.synchronous
    ours_sqlite = Storage(f"sqlite:///{tmp}/ours.db?synchronous={sync}")
    await ours_sqlite.open()
    closers.append(ours_sqlite.close)
    agent = our_agent(ours_sqlite)

    async def ours_sqlite_run() -> None:
        reply = await agent.thread(uuid.uuid4().hex).send("go")
        assert reply.text == "done"

    conn = sqlite3.connect(f"{tmp}/lc-sync.db", check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()
    conn.execute(f"PRAGMA synchronous={sync.upper()}")
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == {"normal": 1, "full": 2}[sync]
    lc_sync = create_agent(scripted_chat_model(), [lc_echo()], checkpointer=saver)

    async def lc_sync_run() -> None:
        out = lc_sync.invoke(
            {"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": uuid.uuid4().hex}}
        )
        assert out["messages"][-1].content == "done"

    acm = AsyncSqliteSaver.from_conn_string(f"{tmp}/lc-async.db")
    asaver = await acm.__aenter__()
    await asaver.setup()
    async with asaver.conn.execute(f"PRAGMA synchronous={sync.upper()}"):
        pass
    async with asaver.conn.execute("PRAGMA synchronous") as cur:
        row = await cur.fetchone()
        assert row is not None and row[0] == {"normal": 1, "full": 2}[sync]
    closers.append(lambda: acm.__aexit__(None, None, None))
    lc_async = create_agent(scripted_chat_model(), [lc_echo()], checkpointer=asaver)

    async def lc_async_run() -> None:
        out = await lc_async.ainvoke(
            {"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": uuid.uuid4().hex}}
        )
        assert out["messages"][-1].content == "done"

    async def ours_sqlite_stream_run() -> None:
        stream = agent.thread(uuid.uuid4().hex).stream("go")
        async for _ in stream:
            pass
        reply = await stream.reply()
        assert reply.text == "done"

    variants["ours sqlite (thread.send)"] = ours_sqlite_run
    variants["ours sqlite (thread.stream)"] = ours_sqlite_stream_run
    variants["create_agent SqliteSaver (invoke)"] = lc_sync_run
    variants["create_agent AsyncSqliteSaver (ainvoke)"] = lc_async_run

    if args.pg:
        ours_pg = Storage(args.pg)
        await ours_pg.open()
        closers.append(ours_pg.close)
        pg_agent = our_agent(ours_pg)

        async def ours_pg_run() -> None:
            reply = await pg_agent.thread(uuid.uuid4().hex).send("go")
            assert reply.text == "done"

        pg_saver, pool = await baseline_pg_saver(args.pg)
        closers.append(pool.close)
        lc_pg = create_agent(scripted_chat_model(), [lc_echo()], checkpointer=pg_saver)

        async def lc_pg_run() -> None:
            out = await lc_pg.ainvoke(
                {"messages": [HumanMessage("go")]},
                {"configurable": {"thread_id": uuid.uuid4().hex}},
            )
            assert out["messages"][-1].content == "done"

        variants["ours postgres (thread.send)"] = ours_pg_run
        variants["create_agent AsyncPostgresSaver"] = lc_pg_run

    samples = await interleaved(variants, args.blocks, args.runs, args.warmup)
    for close in closers:
        await close()
    conn.close()
    return {k: statistics.median(v) / 2 for k, v in samples.items()}


async def growth(args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    from criogen_graph import Storage

    path = f"{tmp}/growth.db"
    storage = Storage(f"sqlite:///{path}")
    agent = our_agent(storage)
    thread = agent.thread("growth")
    pad = "x" * 2000
    times = []
    for i in range(args.growth):
        t0 = time.perf_counter()
        reply = await thread.send(f"{i} {pad}")
        times.append((time.perf_counter() - t0) * 1000 / 2)
        assert reply.text == "done"
    n_messages = len(reply.messages)
    await storage.close()
    import sqlite3

    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    k = max(1, args.growth // 10)
    return {
        "user_messages": args.growth,
        "transcript_messages": n_messages,
        "db_mb": round(os.path.getsize(path) / 1e6, 2),  # noqa: ASYNC240
        "first10_ms_per_turn": round(statistics.median(times[:k]), 3),
        "last10_ms_per_turn": round(statistics.median(times[-k:]), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--runs", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--pg", default=PG_DEFAULT)
    ap.add_argument("--no-pg", action="store_true")
    ap.add_argument("--growth", type=int, default=100)
    ap.add_argument("--synchronous", choices=["normal", "full"], default="normal")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.no_pg:
        args.pg = None
    print("# machine:", json.dumps(machine()))
    print(f"# every SQLite file on WAL + synchronous={args.synchronous.upper()}")
    tmp = tempfile.mkdtemp(prefix="criogen-bench-")
    per = asyncio.run(per_turn(args, tmp))
    print(f"\n{'durable turn (fresh thread per run)':44s} {'median ms/turn':>15s}")
    for k, v in per.items():
        print(f"{k:44s} {v:15.3f}")
    ours = per["ours sqlite (thread.send)"]
    r_sync = ours / per["create_agent SqliteSaver (invoke)"]
    r_async = ours / per["create_agent AsyncSqliteSaver (ainvoke)"]
    print(f"{'ratio sqlite ours / SqliteSaver':44s} {r_sync:15.2f}   (target <= 0.60)")
    print(f"{'ratio sqlite ours / AsyncSqliteSaver':44s} {r_async:15.2f}   (target <= 0.60)")
    r_stream = per["ours sqlite (thread.stream)"] / ours
    print(f"{'ratio sqlite streamed / send':44s} {r_stream:15.2f}   (target <= 1.30)")
    result: dict[str, Any] = {
        "machine": machine(),
        "synchronous": args.synchronous,
        "ms_per_turn": per,
        "ratio_sqlite_sync": r_sync,
        "ratio_sqlite_async": r_async,
    }
    if args.pg:
        r_pg = per["ours postgres (thread.send)"] / per["create_agent AsyncPostgresSaver"]
        print(f"{'ratio postgres ours / AsyncPostgresSaver':44s} {r_pg:15.2f}   (target <= 0.70)")
        result["ratio_postgres"] = r_pg
    if args.growth:
        g = asyncio.run(growth(args, tmp))
        print(f"\n# growth: {json.dumps(g)}")
        print(f"{'sqlite file after 100 messages':44s} {g['db_mb']:12.2f} MB   (target <= 5)")
        print(
            f"{'last 10 / first 10 turns':44s} {g['last10_ms_per_turn'] / g['first10_ms_per_turn']:15.2f}   (target <= 1.5)"
        )
        result["growth"] = g
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
