"""Cold start: import, build the agent and answer the first message in a fresh process.

What a serverless worker, a CLI call or a notebook kernel restart pays before its first
answer. Each sample is a new Python interpreter that imports the framework, builds the
agent (and opens storage where there is one) and runs one user message answered in two
turns (a call to `echo`, then "done"); the variants are interleaved, sample by sample.
Reported: median ms for the import, for everything after it up to the first answer, and
for the whole (both measured inside the child with `perf_counter`, interpreter start-up
excluded, which is the same for every variant).

  ours                      import criogen_graph; Agent(...).run("go")
  create_agent              from langchain.agents import create_agent; ainvoke
  ours SQLite               Storage("sqlite:///...") on a new file; thread.send("go")
  create_agent SQLite       AsyncSqliteSaver on a new file (WAL); ainvoke with a thread id

    python bench/bench_fresh.py [--samples 9] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from _common import machine, precompile

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))

PRELUDE = f"""
import asyncio, json, os, sys, time
sys.path.insert(0, {BENCH_DIR!r})
import _common
t0 = time.perf_counter()
"""

EPILOGUE = """
print(json.dumps({"import_ms": (t1 - t0) * 1000, "first_ms": (t2 - t1) * 1000}))
"""

VARIANTS: dict[str, str] = {
    "ours": """
import criogen_graph
t1 = time.perf_counter()
result = asyncio.run(_common.our_agent_async_tool().run("go"))
assert result.text == "done"
t2 = time.perf_counter()
""",
    "create_agent": """
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
t1 = time.perf_counter()
graph = create_agent(_common.scripted_chat_model(), [_common.lc_echo_async()])
out = asyncio.run(graph.ainvoke({"messages": [HumanMessage("go")]}))
assert out["messages"][-1].content == "done"
t2 = time.perf_counter()
""",
    "ours SQLite": """
import criogen_graph
t1 = time.perf_counter()
async def main():
    async with criogen_graph.Storage(f"sqlite:///{DB}") as storage:
        reply = await _common.our_agent_async_tool(storage).thread("t1").send("go")
        assert reply.text == "done"
asyncio.run(main())
t2 = time.perf_counter()
""",
    "create_agent SQLite": """
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
t1 = time.perf_counter()
async def main():
    async with AsyncSqliteSaver.from_conn_string(DB) as saver:
        await saver.conn.execute("PRAGMA journal_mode=WAL")
        graph = create_agent(
            _common.scripted_chat_model(), [_common.lc_echo_async()], checkpointer=saver
        )
        config = {"configurable": {"thread_id": "t1"}}
        out = await graph.ainvoke({"messages": [HumanMessage("go")]}, config)
        assert out["messages"][-1].content == "done"
asyncio.run(main())
t2 = time.perf_counter()
""",
}

RATIOS = {
    "first answer, no storage": ("ours", "create_agent"),
    "first answer, SQLite": ("ours SQLite", "create_agent SQLite"),
}


def sample(name: str, tmp: str, i: int) -> dict[str, float]:
    db = os.path.join(tmp, f"{name.replace(' ', '_')}-{i}.db")
    code = PRELUDE + f"DB = {db!r}\n" + VARIANTS[name] + EPILOGUE
    env = {**os.environ, "LANGSMITH_TRACING": "false", "LANGCHAIN_TRACING_V2": "false"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    if proc.returncode:
        raise RuntimeError(f"{name} failed:\n{proc.stderr}")
    out: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["total_ms"] = out["import_ms"] + out["first_ms"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--samples", type=int, default=9, help="fresh processes per variant")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    print("# machine:", json.dumps(machine()))
    precompile()
    tmp = tempfile.mkdtemp(prefix="criogen-fresh-")
    names = list(VARIANTS)
    for name in names:  # once each untimed, so .pyc files exist for every side
        sample(name, tmp, -1)
    raw: dict[str, list[dict[str, float]]] = {k: [] for k in names}
    for i in range(args.samples):
        for name in names if i % 2 == 0 else reversed(names):
            raw[name].append(sample(name, tmp, i))
    med = {
        name: {key: statistics.median(s[key] for s in raw[name]) for key in raw[name][0]}
        for name in names
    }
    print(f"\n{'fresh process':22s} {'import ms':>10s} {'first answer ms':>16s} {'total ms':>10s}")
    for name, m in med.items():
        print(f"{name:22s} {m['import_ms']:10.1f} {m['first_ms']:16.1f} {m['total_ms']:10.1f}")
    ratios: dict[str, float] = {}
    for label, (ours, theirs) in RATIOS.items():
        ratios[label] = med[ours]["total_ms"] / med[theirs]["total_ms"]
        print(f"{'ratio total ' + label:40s} {ratios[label]:6.2f}")
    if args.json:
        result: dict[str, Any] = {"machine": machine(), "median_ms": med, "ratios": ratios}
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
