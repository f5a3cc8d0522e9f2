"""Per-turn framework overhead: `agent.run` against LangChain's `create_agent`.

Both run the same job in one process, in interleaved blocks: one user message answered in
two turns (the model calls the `echo` tool, then answers "done"), with a scripted model
that does no work, no checkpointer, through the async API (`await agent.run(...)` vs
`await graph.ainvoke(...)`). Reported: median ms per turn (= per model call) of each and
the ratio ours / create_agent. Then the import time of `criogen_graph` against LangGraph's
graph API and `langchain.agents`, each in fresh interpreters.

    python bench/bench_core.py [--blocks 15] [--runs 60] [--imports 7] [--json out.json]

Needs the `dev` extra (it installs `langchain` for `create_agent`; the package itself
never imports `langchain`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from _common import interleaved, lc_echo, machine, our_agent, precompile, scripted_chat_model


def make_create_agent() -> Callable[[], Awaitable[None]]:
    from langchain.agents import create_agent
    from langchain_core.messages import HumanMessage

    graph = create_agent(scripted_chat_model(), [lc_echo()])

    async def run() -> None:
        out = await graph.ainvoke({"messages": [HumanMessage("go")]})
        assert out["messages"][-1].content == "done"

    return run


def make_ours() -> Callable[[], Awaitable[None]]:
    agent = our_agent()

    async def run() -> None:
        result = await agent.run("go")
        assert result.text == "done" and result.tool_calls == 1

    return run


def import_time(statement: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                f"import time; t=time.perf_counter(); {statement}; print(time.perf_counter()-t)",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        times.append(float(proc.stdout.strip().splitlines()[-1]) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--blocks", type=int, default=15)
    ap.add_argument("--runs", type=int, default=60, help="runs per block and variant")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument(
        "--imports",
        type=int,
        default=7,
        help="fresh interpreters per import measurement (0 = skip)",
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    print("# machine:", json.dumps(machine()))
    variants = {
        "criogen_graph agent.run": make_ours(),
        "langchain create_agent": make_create_agent(),
    }
    samples = asyncio.run(interleaved(variants, args.blocks, args.runs, args.warmup))
    per_turn = {k: statistics.median(v) / 2 for k, v in samples.items()}
    ours, theirs = per_turn["criogen_graph agent.run"], per_turn["langchain create_agent"]
    print(f"\n{'per-turn overhead (2 turns/run)':34s} {'median ms/turn':>15s}")
    for k, v in per_turn.items():
        print(f"{k:34s} {v:15.3f}")
    ratio = ours / theirs
    print(f"{'ratio ours / create_agent':34s} {ratio:15.2f}   (target <= 0.70)")
    result: dict[str, Any] = {"machine": machine(), "ms_per_turn": per_turn, "ratio": ratio}

    if args.imports:
        precompile()
        stmts = {
            "criogen_graph": "import criogen_graph",
            "langgraph (graph API)": "from langgraph.graph import StateGraph",
            "langchain.agents": "import langchain.agents",
        }
        imp = {k: import_time(s, args.imports) for k, s in stmts.items()}
        print(f"\n{'import time (fresh interpreter)':34s} {'median ms':>15s}")
        for k, v in imp.items():
            print(f"{k:34s} {v:15.1f}")
        iratio = imp["criogen_graph"] / imp["langgraph (graph API)"]
        print(f"{'ratio criogen_graph / langgraph':34s} {iratio:15.2f}   (target <= 1.10)")
        loads_langchain = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys, criogen_graph; print('langchain' in sys.modules or any(m.startswith('langchain.') for m in sys.modules))",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        print(f"{'criogen_graph imports langchain':34s} {loads_langchain:>15s}")
        result.update(import_ms=imp, import_ratio=iratio)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
