"""Instructions per turn (valgrind's callgrind) of the scenarios `run.py --quick` times for
peers and storage, for one or more criogen_graph trees: a figure that does not move when
other processes keep the machine busy, so two versions can be compared to the percent.

Each tree runs in its own process under `valgrind --tool=callgrind` (same interpreter,
`PYTHONHASHSEED=0`, the tree first on `PYTHONPATH`). In it every scenario is warmed up,
then run `--runs` times, then `--runs` times again, with a call of a C function nothing
else calls (`ffi_call`, through ctypes) before, between and after: callgrind writes the
count so far before each such call (`--dump-before`) and starts again from zero, so the
two segments are the scenario's runs alone. Both segments are printed: when they agree,
the figure is the steady state (no warm-up left in it). A run is bench_peers' job, one
user message answered in two turns (a call to `echo`, then "done"), so a turn is half a
run. Scenarios:

- `agent.run`: bench_peers' `criogen_graph agent.run` (no storage, async tool).
- `send memory` / `stream memory`: bench_peers' `thread.send` / `thread.stream` (drained,
  then `reply()`) on `Storage("memory://")`, a fresh thread per run.
- `send sqlite` / `stream sqlite`: bench_storage's `ours sqlite (thread.send)` /
  `(thread.stream)` on a WAL file with `synchronous=normal` (sync tool), fresh thread.

    python bench/callgrind_turns.py --tree /path/before --tree /path/after [--runs 10]
        [--warmup 5] [--only "agent.run;send sqlite"] [--keep DIR] [--json out.json]

Without `--tree`, the installed criogen_graph is measured. With two trees the last column
is after/before (the second tree over the first).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

SCENARIOS = ["agent.run", "send memory", "stream memory", "send sqlite", "stream sqlite"]


def child(scenarios: list[str], runs: int, warmup: int, tmp: str) -> None:
    """Warm each scenario up, then two segments of `runs` runs between markers."""
    import ctypes
    import uuid

    from _common import our_agent, our_agent_async_tool

    from criogen_graph import Storage

    marker = ctypes.CDLL(None).getpid  # any C function: callgrind dumps at ffi_call

    def sender(agent: Any) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            reply = await agent.thread(uuid.uuid4().hex).send("go")
            assert reply.text == "done"

        return run

    def streamer(agent: Any) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            stream = agent.thread(uuid.uuid4().hex).stream("go")
            async for _ in stream:
                pass
            reply = await stream.reply()
            assert reply.text == "done"

        return run

    def runner(agent: Any) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            result = await agent.run("go")
            assert result.text == "done" and result.tool_calls == 1

        return run

    async def go() -> None:
        for scenario in scenarios:
            storage = None
            if scenario == "agent.run":
                run = runner(our_agent_async_tool())
            elif scenario.endswith(" memory"):
                storage = Storage("memory://")
                await storage.open()
                agent = our_agent_async_tool(storage)
                run = (sender if scenario.startswith("send") else streamer)(agent)
            elif scenario.endswith(" sqlite"):
                name = scenario.replace(" ", "-")
                storage = Storage(f"sqlite:///{tmp}/{name}.db?synchronous=normal")
                await storage.open()
                agent = our_agent(storage)
                run = (sender if scenario.startswith("send") else streamer)(agent)
            else:
                raise SystemExit(f"unknown scenario {scenario!r}")
            for _ in range(warmup):
                await run()
            marker()
            for _ in range(runs):
                await run()
            marker()
            for _ in range(runs):
                await run()
            marker()
            if storage is not None:
                await storage.close()

    asyncio.run(go())
    import criogen_graph

    print("criogen_graph from", os.path.dirname(criogen_graph.__file__), file=sys.stderr)


def instructions(
    scenarios: list[str], runs: int, warmup: int, folder: str, tree: str | None
) -> dict[str, tuple[float, float]]:
    """Instructions per turn of each scenario, in its first and second segment."""
    from _callgrind import callgrind_totals

    child = ["--child", ";".join(scenarios), str(runs), str(warmup), folder]
    totals = callgrind_totals(__file__, child, tree, folder)
    # Three dumps per scenario (one at each marker): anything else calling ffi_call
    # would add more.
    assert len(totals) == 3 * len(scenarios), (len(totals), "dumps; expected", 3 * len(scenarios))
    turns = 2 * runs
    return {
        s: (totals[3 * i + 1] / turns, totals[3 * i + 2] / turns) for i, s in enumerate(scenarios)
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", action="append", default=[], help="a folder holding criogen_graph")
    ap.add_argument("--runs", type=int, default=10, help="runs per segment (2 turns each)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--only", default=None, help="scenarios, separated by semicolons")
    ap.add_argument("--keep", default=None, help="keep the callgrind files in this folder")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        scen, runs, warmup, tmp = args.child
        child(scen.split(";"), int(runs), int(warmup), tmp)
        return
    scenarios = args.only.split(";") if args.only else SCENARIOS
    trees: list[str | None] = list(args.tree) or [None]
    with tempfile.TemporaryDirectory() as tmp:
        base = args.keep or tmp
        # One valgrind process per tree, side by side: counts do not depend on the load.
        with ThreadPoolExecutor(len(trees)) as pool:
            jobs = [
                pool.submit(
                    instructions,
                    scenarios,
                    args.runs,
                    args.warmup,
                    os.path.join(base, f"tree{i}"),
                    tree,
                )
                for i, tree in enumerate(trees)
            ]
            results = [job.result() for job in jobs]
    print()
    head = f"{'scenario':16s}"
    for i in range(len(trees)):
        head += f" {'tree' + str(i) + ' M/turn (seg1, seg2)':>28s}"
    if len(trees) == 2:
        head += f" {'after/before':>13s}"
    print(head)
    for s in scenarios:
        line = f"{s:16s}"
        for r in results:
            a, b = r[s]
            line += f" {b / 1e6:15.4f} ({a / 1e6:.4f})".rjust(29)
        if len(trees) == 2:
            line += f" {results[1][s][1] / results[0][s][1]:13.4f}"
        print(line)
    for i, tree in enumerate(trees):
        print(f"tree{i}: {tree or '(installed)'}")
    if args.json:
        data: dict[str, Any] = {
            "runs": args.runs,
            "warmup": args.warmup,
            "trees": trees,
            "instructions_per_turn": [{s: list(r[s]) for s in scenarios} for r in results],
        }
        with open(args.json, "w") as f:
            json.dump(data, f, indent=2)


if __name__ == "__main__":
    main()
