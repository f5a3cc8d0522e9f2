"""What LangChain callbacks cost per agent run, in instructions (valgrind's callgrind), so
the figures hold on a machine other processes keep busy.

All variants run one after the other in one process under `valgrind --tool=callgrind`:
each is warmed up, then run `--runs` times between two calls of a C function nothing else
calls (`ffi_call`, through ctypes), before each of which callgrind writes the count so far
(`--dump-before`): the count written at the second call is the variants' runs alone. A run is
bench_observe.py's job (a 600-character customer message, a tool call with an
800-character result, a 400-character answer: two model calls and one tool call), as
`graph.ainvoke` of our agent and of LangChain's `create_agent` doing the same job with a
scripted chat model. Variants:

- `ours` / `create_agent`: no callbacks.
- `... + no-op`: a `BaseCallbackHandler` that does nothing, in the run's config.
- `ours + no-op, nodes only`: the same, with our chat-model and tool runs taken out
  (LangGraph's node runs only): what LangGraph's own reporting costs.
- `... + async no-op`: the same with an `AsyncCallbackHandler` (no worker thread per
  event).
- `... + ignoring no-op`: a handler that sets `ignore_llm`, `ignore_chat_model` and
  `ignore_agent` (it wants node runs only).

    python bench/callgrind_observe.py [--runs 15] [--warmup 5] [--only "ours;create_agent"]
                                      [--tree DIR] [--keep DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

VARIANTS = [
    "ours",
    "ours + no-op",
    "ours + no-op, nodes only",
    "ours + async no-op",
    "ours + async no-op, nodes only",
    "ours + ignoring no-op",
    "ours + listening no-op",
    "ours + listening no-op, nodes only",
    "create_agent",
    "create_agent + no-op",
    "create_agent + async no-op",
    "create_agent + ignoring no-op",
    "create_agent + listening no-op",
]


def child(variants: list[str], runs: int, warmup: int) -> None:
    """Run each variant `warmup` times, then `runs` times between two markers."""
    import contextlib
    import ctypes

    from _common import lc_echo, scripted_chat_model
    from bench_observe import USER, Bypass, make_agent, noop_handlers

    marker = ctypes.CDLL(None).getpid  # any C function: callgrind dumps at ffi_call
    handlers = noop_handlers()
    start = {"messages": [{"role": "user", "content": USER}]}

    async def go() -> None:
        for variant in variants:
            if variant.startswith("create_agent"):
                from langchain.agents import create_agent

                graph = create_agent(scripted_chat_model(), [lc_echo()])
            else:
                graph = make_agent().graph
            kind, _, only = variant.partition(" + ")[2].partition(", ")
            if (kind and kind not in handlers) or only not in ("", "nodes only"):
                raise SystemExit(f"unknown variant {variant!r}")
            config: dict[str, Any] = {"callbacks": [handlers[kind]()]} if kind else {}
            with Bypass() if only else contextlib.nullcontext():
                for _ in range(warmup):
                    await graph.ainvoke(start, config)
                marker()
                for _ in range(runs):
                    out = await graph.ainvoke(start, config)
                    assert len(out["messages"]) == 4
                marker()

    asyncio.run(go())
    import criogen_graph

    print("criogen_graph from", os.path.dirname(criogen_graph.__file__), file=sys.stderr)


def instructions(
    variants: list[str], runs: int, warmup: int, folder: str, tree: str | None
) -> dict[str, float]:
    """Instructions per run of each variant."""
    from _callgrind import callgrind_totals

    child = ["--child", ";".join(variants), str(runs), str(warmup)]
    totals = callgrind_totals(__file__, child, tree, folder)
    # One dump at each marker: anything else calling ffi_call would add more.
    assert len(totals) == 2 * len(variants), (len(totals), "dumps; expected", 2 * len(variants))
    return {v: totals[2 * i + 1] / runs for i, v in enumerate(variants)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--only", default=None, help="variants, separated by semicolons")
    ap.add_argument("--keep", default=None, help="keep the callgrind files in this folder")
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--tree",
        default=None,
        help="a folder holding the criogen_graph package to measure (e.g. a copy of an "
        "earlier version) instead of the installed one",
    )
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0].split(";"), int(args.child[1]), int(args.child[2]))
        return
    variants = args.only.split(";") if args.only else VARIANTS
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or tmp
        os.makedirs(folder, exist_ok=True)
        per_run = instructions(variants, args.runs, args.warmup, folder, args.tree)
    for v in variants:
        print(f"{v:34s} {per_run[v] / 1e6:9.3f} M instructions per run")
    print()

    def ratio(a: str, b: str, label: str) -> None:
        if a in per_run and b in per_run:
            print(f"{label:58s} {per_run[a] / per_run[b]:6.3f}")

    ratio("ours + no-op", "ours", "ours: no-op handler / no callbacks (target <= 1.15)")
    ratio("ours + no-op, nodes only", "ours", "ours: LangGraph's node runs only / no callbacks")
    ratio("ours + no-op", "ours + no-op, nodes only", "ours: with our runs / node runs only")
    ratio("ours + async no-op", "ours", "ours: async no-op / no callbacks")
    ratio("ours + async no-op, nodes only", "ours", "ours: async, node runs only / none")
    ratio("ours + ignoring no-op", "ours", "ours: handler ignoring llm+agent / none")
    ratio("ours + listening no-op", "ours", "ours: listening no-op / no callbacks")
    ratio("ours + listening no-op, nodes only", "ours", "ours: listening, node runs only / none")
    ratio("create_agent + no-op", "create_agent", "create_agent: no-op / no callbacks")
    ratio("create_agent + async no-op", "create_agent", "create_agent: async no-op / none")
    ratio("create_agent + ignoring no-op", "create_agent", "create_agent: ignoring / none")
    ratio("create_agent + listening no-op", "create_agent", "create_agent: listening / none")
    for kind in ("no-op", "async no-op", "listening no-op"):
        full, nodes, none = f"ours + {kind}", f"ours + {kind}, nodes only", "ours"
        if {full, nodes, none} <= per_run.keys():
            ours = per_run[full] - per_run[nodes]
            graph = per_run[nodes] - per_run[none]
            print(
                f"{kind}: per run, LangGraph's node runs {graph / 1e6:.3f} M "
                f"({graph / per_run[none] * 100:.1f}% of a run without callbacks), our "
                f"chat-model + tool runs {ours / 1e6:.3f} M ({ours / per_run[none] * 100:.1f}%)"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"instructions_per_run": per_run}, f, indent=2)


if __name__ == "__main__":
    main()
