"""Collection search at scale: `CollectionTool` over N generated documents (~120 words
each, Zipf-distributed words of a 20,000-word vocabulary) on SQLite (FTS5) and
PostgreSQL (full-text search): insert rate, query latency p50 / p99 (2-3 word queries),
the process's peak RSS, and an agent's per-turn time in the same process (same storage)
alone and while two searches are always in flight.

    python bench/bench_search.py [--docs 100000] [--queries 300] [--pg URL | --no-pg]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from _common import machine, our_agent

PG_DEFAULT = os.environ.get(
    "CRIOGEN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
_SYL = ["ka", "lo", "mi", "ne", "ru", "ta", "vo", "si", "de", "pa", "zu", "ge", "bo", "fi"]


def vocabulary(n: int, rng: random.Random) -> list[str]:
    words: set[str] = set()
    while len(words) < n:
        words.add("".join(rng.choice(_SYL) for _ in range(rng.randint(2, 4))))
    return sorted(words)


def make_docs(n: int, seed: int = 7) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    vocab = vocabulary(20_000, rng)
    weights = [1 / (i + 1) for i in range(len(vocab))]
    docs = [" ".join(rng.choices(vocab, weights, k=120)) for _ in range(n)]
    return docs, vocab


async def run_backend(url: str, docs: list[str], vocab: list[str], queries: int) -> dict[str, Any]:
    from langgraph.store.base import PutOp

    from criogen_graph import CollectionTool, Storage

    storage = Storage(url)
    tool = CollectionTool(storage=storage, collection=f"bench-{uuid.uuid4().hex[:8]}")
    store = await storage.get_store()
    # Bulk load through the store (the index triggers run as they would on add()).
    t0 = time.perf_counter()
    batch = 500
    for i in range(0, len(docs), batch):
        ops = [
            PutOp(tool._ns, f"d{j}", {"text": docs[j], "metadata": {}}, index=False)
            for j in range(i, min(i + batch, len(docs)))
        ]
        await store.abatch(ops)
    insert_s = time.perf_counter() - t0
    await tool.search("warm up the index")
    rng = random.Random(3)
    # Queries mix common and rare words (ranks 50..5000 of the Zipf vocabulary).
    qs = [
        " ".join(rng.choice(vocab[50:5000]) for _ in range(rng.randint(2, 3)))
        for _ in range(queries)
    ]
    lat = []
    hits = 0
    for q in qs:
        t = time.perf_counter()
        found = await tool.search(q)
        lat.append((time.perf_counter() - t) * 1000)
        hits += bool(found)
    lat.sort()
    # The event loop stays free while searches run: the longest gap a ticker sees.
    gaps: list[float] = []

    async def ticker(stop: asyncio.Event) -> None:
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append((now - last) * 1000)
            last = now

    stop = asyncio.Event()
    tick = asyncio.create_task(ticker(stop))
    await asyncio.gather(*(tool.search(q) for q in qs[:50]))
    stop.set()
    await tick
    turns = await agent_turns(storage, tool, qs)
    if storage.scheme == "postgres":
        # The test database is shared: drop the bench collection (its index rows follow).
        async with store.conn.connection() as conn:
            await conn.execute("DELETE FROM store WHERE prefix = %s", (".".join(tool._ns),))
    await storage.close()
    return {
        **turns,
        "docs": len(docs),
        "insert_docs_per_s": round(len(docs) / insert_s),
        "query_p50_ms": round(statistics.median(lat), 2),
        "query_p99_ms": round(lat[int(len(lat) * 0.99) - 1], 2),
        "queries_with_hits": f"{hits}/{len(qs)}",
        "loop_max_gap_ms_during_50_concurrent_searches": round(max(gaps), 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


async def agent_turns(storage: Any, tool: Any, qs: list[str]) -> dict[str, Any]:
    agent = our_agent(storage)

    async def turns(n: int) -> float:
        times = []
        for _ in range(n):
            t = time.perf_counter()
            reply = await agent.thread(uuid.uuid4().hex).send("go")
            times.append((time.perf_counter() - t) * 1000 / 2)
            assert reply.text == "done"
        return statistics.median(times)

    await turns(10)
    alone = await turns(40)
    stop = asyncio.Event()

    async def searcher(k: int) -> None:
        i = k
        while not stop.is_set():
            await tool.search(qs[i % len(qs)])
            i += 2

    tasks = [asyncio.create_task(searcher(k)) for k in range(2)]
    busy = await turns(40)
    stop.set()
    await asyncio.gather(*tasks)
    return {
        "agent_ms_per_turn_alone": round(alone, 2),
        "agent_ms_per_turn_with_searches": round(busy, 2),
        "agent_turn_ratio": round(busy / alone, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--pg", default=PG_DEFAULT)
    ap.add_argument("--no-pg", action="store_true")
    ap.add_argument("--no-sqlite", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    print("# machine:", json.dumps(machine()))
    docs, vocab = make_docs(args.docs)
    result: dict[str, Any] = {"machine": machine()}
    if not args.no_sqlite:
        tmp = tempfile.mkdtemp(prefix="criogen-bench-search-")
        result["sqlite"] = asyncio.run(
            run_backend(f"sqlite:///{tmp}/s.db", docs, vocab, args.queries)
        )
        print("sqlite  ", json.dumps(result["sqlite"]))
    if not args.no_pg:
        result["postgres"] = asyncio.run(run_backend(args.pg, docs, vocab, args.queries))
        print("postgres", json.dumps(result["postgres"]))
    print(
        "targets: query p50 <= 20 ms, p99 <= 100 ms at 100,000 documents; agent turn ratio <= 1.1"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
