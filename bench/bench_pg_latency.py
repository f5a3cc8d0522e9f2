"""PostgreSQL a network hop away: `thread.send` against `create_agent` +
`AsyncPostgresSaver`, both through a TCP proxy (a process of its own, tests/pg_proxy.py)
that delays every packet by D ms each way, interleaved blocks at D = 0, 0.5 and 1 ms.

The job is the one of the other benchmarks: one user message on a fresh thread answered
in two model turns (the scripted model calls `echo`, then answers "done"); ms per turn =
ms per send / 2. Round trips are given two ways:

- counted: the proxy counts, per connection, each time the client sends after having
  received (a pipeline of statements is one), summed over every connection, over
  `--count` sends at D = 0 (deterministic);
- slope: the least-squares slope of ms per send against the round-trip delay the proxy
  actually applied (2 x its measured mean delay per packet: on a busy machine the proxy
  wakes up late), i.e. the round trips on the critical path.

    python bench/bench_pg_latency.py [--pg URL] [--blocks 6] [--runs 15] [--count 50]
        [--delays 0,0.5,1] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from _common import baseline_pg_saver, interleaved, lc_echo, machine, our_agent, scripted_chat_model  # noqa: E402

from tests.pg_proxy import PgProxy  # noqa: E402

PG_DEFAULT = os.environ.get(
    "CRIOGEN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
OURS = "criogen_graph thread.send"
BASE = "create_agent + AsyncPostgresSaver"


async def variants(url: str) -> tuple[dict[str, Callable[[], Awaitable[None]]], Any]:
    """Both sides on `url` (the proxy), and a closer."""
    from langchain.agents import create_agent
    from langchain_core.messages import HumanMessage

    from criogen_graph import Storage

    storage = Storage(url)
    await storage.open()
    agent = our_agent(storage)

    async def ours() -> None:
        reply = await agent.thread(uuid.uuid4().hex).send("go")
        assert reply.text == "done"

    saver, pool = await baseline_pg_saver(url)
    graph = create_agent(scripted_chat_model(), [lc_echo()], checkpointer=saver)

    async def base() -> None:
        out = await graph.ainvoke(
            {"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": uuid.uuid4().hex}}
        )
        assert out["messages"][-1].content == "done"

    async def close() -> None:
        await storage.close()
        await pool.close()

    return {OURS: ours, BASE: base}, close


async def counted(proxy: PgProxy, fn: Callable[[], Awaitable[None]], n: int) -> float:
    """Round trips per send, counted by the proxy over `n` sends."""
    await fn()
    proxy.reset()
    for _ in range(n):
        await fn()
    return proxy.round_trips() / n


def slope(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


async def main_async(args: argparse.Namespace, proxy: PgProxy) -> dict[str, Any]:
    runs, close = await variants(proxy.url)
    result: dict[str, Any] = {"machine": machine(), "delays_ms": args.delays}
    try:
        proxy.set_delay_ms(0)
        result["round_trips_per_send_counted"] = {
            name: await counted(proxy, fn, args.count) for name, fn in runs.items()
        }
        per_delay: dict[str, Any] = {}
        for d in args.delays:
            proxy.set_delay_ms(d)
            proxy.reset()
            samples = await interleaved(runs, args.blocks, args.runs, args.warmup)
            per_delay[str(d)] = {
                "applied_ms": proxy.mean_delay_ms(),
                "ms_per_send": {k: statistics.median(v) for k, v in samples.items()},
            }
        result["per_delay"] = per_delay
    finally:
        await close()
    slopes = {}
    for name in runs:
        xs = [2 * v["applied_ms"] for v in result["per_delay"].values()]
        ys = [v["ms_per_send"][name] for v in result["per_delay"].values()]
        slopes[name] = slope(xs, ys)
    result["round_trips_per_send_slope"] = slopes
    return result


def report(result: dict[str, Any]) -> None:
    print(
        f"\n{'D ms each way':>14s} {'applied':>8s} {'ours ms/turn':>13s} {'base ms/turn':>13s} {'ratio':>6s}"
    )
    for d, v in result["per_delay"].items():
        ours, base = v["ms_per_send"][OURS] / 2, v["ms_per_send"][BASE] / 2
        target = "   (target <= 0.40)" if float(d) == 1.0 else ""
        print(
            f"{d:>14s} {v['applied_ms']:8.3f} {ours:13.3f} {base:13.3f} {ours / base:6.2f}{target}"
        )
    print(f"\n{'round trips':36s} {'per send':>9s} {'per turn':>9s}")
    for how in ("counted", "slope"):
        for name, n in result[f"round_trips_per_send_{how}"].items():
            goal = "   (target <= 3 per turn, stretch 2)" if name == OURS else ""
            print(f"  {name + ' (' + how + ')':34s} {n:9.2f} {n / 2:9.2f}{goal}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--pg", default=PG_DEFAULT)
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--count", type=int, default=50, help="sends counted at D = 0")
    ap.add_argument("--delays", default="0,0.5,1", help="ms each way, comma-separated")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    args.delays = [float(d) for d in args.delays.split(",")]
    print("# machine:", json.dumps(machine()))
    with PgProxy(args.pg) as proxy:
        result = asyncio.run(main_async(args, proxy))
    report(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
