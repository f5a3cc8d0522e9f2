"""The cost of telemetry and of redaction per agent turn.

One job, four ways, in one process, in interleaved blocks: `agent.run` of a customer
message (about 600 characters, with an e-mail address and a phone number) answered in two
turns (a tool call whose result is about 800 characters, then a 400-character answer),
with a scripted model that does no work. Variants: nothing; telemetry exporting every
span over OTLP/HTTP to a sink on 127.0.0.1 (bench/loopback.py, its own process); a
`Redactor.pii()`; both. Each block of runs ends with `telemetry.flush()` inside the timed
span, so the export work done by the background thread is paid for, not hidden. Reported:
median over blocks of ms per turn (= per model call), and the ratios to nothing.

Also measured: a sampler that drops every trace; LangChain callbacks (the graph run with
`ainvoke` and a handler that does nothing, against the same without a handler: node runs
are LangGraph's, chat-model and tool runs ours; each also with our runs taken out, which
leaves LangGraph's own share), for a handler that implements no method, an async one,
and one that implements the methods of every run and does nothing in them; and "nothing
configured" (`agent.run` against the same with the nodes' callback checks taken out).
Timings on a busy machine are noisy: bench/callgrind_observe.py counts instructions.

    python bench/bench_observe.py [--blocks 12] [--runs 100] [--cpu] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from _common import loopback_server, machine

USER = (
    "Hello, I ordered a standing desk three weeks ago (order A-20931) and it still has not "
    "arrived. The tracking page says it left the warehouse on the 4th and nothing since. "
    "I need it before the end of the month because I am moving offices. Could you check "
    "where it is, and if it is lost, send a replacement or refund me? You can reach me at "
    "jane.doe@example.com or on +44 20 7946 0958 during the day. I would also like to know "
    "whether the replacement would come from the same warehouse, because the last two "
    "deliveries from there were late as well, and whether express shipping is possible "
    "at no cost given the delay. Thanks for your help, Jane."
)
RESULT = (
    "Order A-20931: standing desk, 160x80, oak top, black frame. Status: in transit. "
    "Carrier: ParcelNet, tracking PN-88213377-GB. Last scan: 2026-11-04 09:12 at the "
    "Tilbury depot (left warehouse). No scan since; the carrier's claim window opens after "
    "21 days without a scan, which is today. Warehouse: Tilbury (UK-EAST-2). Replacement "
    "stock: 14 units at Tilbury, 6 units at Daventry (UK-MID-1). Express shipping from "
    "Daventry: 2 working days, normally 24.00 GBP. Customer tier: standard, 2 previous "
    "late deliveries recorded on orders A-17702 and A-19115, both from Tilbury. Refund "
    "eligibility: full refund or replacement, customer's choice; goodwill credit up to "
    "30.00 GBP allowed for repeated delays at the agent's discretion. Notes: none."
)
ANSWER = (
    "I am sorry about the delay, Jane. Your desk left our Tilbury warehouse on 4 November "
    "and the carrier has not scanned it since, so I have opened a claim. I can send a "
    "replacement from our Daventry warehouse instead, by express shipping at no cost, and "
    "it would arrive within two working days, well before your move. Alternatively I can "
    "refund the order in full. Which would you prefer?"
)


def make_agent(**options: Any) -> Any:
    from criogen_graph import Agent, FakeReply, FunctionModel, tool

    @tool
    def find_order(order_id: str) -> str:
        """Look up an order."""
        return RESULT

    def script(messages: Any, tools: Any) -> Any:
        if messages[-1]["role"] == "user":
            return FakeReply.tool_call("find_order", {"order_id": "A-20931"}, id="c1")
        return FakeReply.text(ANSWER)

    return Agent(FunctionModel(script), tools=[find_order], **options)


async def measure(
    variants: dict[str, tuple[Callable[[], Awaitable[None]], Callable[[], None]]],
    blocks: int,
    runs: int,
    warmup: int,
    clock: Callable[[], int] = time.perf_counter_ns,
) -> dict[str, float]:
    for fn, end in variants.values():
        for _ in range(warmup):
            await fn()
        end()
    per_block: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for b in range(blocks):
        for name in names if b % 2 == 0 else reversed(names):
            fn, end = variants[name]
            gc.collect()
            t0 = clock()
            for _ in range(runs):
                await fn()
            end()
            per_block[name].append((clock() - t0) / 1e6 / runs / 2)
    return {k: statistics.median(v) for k, v in per_block.items()}


def noop_handlers() -> dict[str, Any]:
    """Callback handlers that do nothing, by how LangChain dispatches to them."""
    from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler

    class NoOp(BaseCallbackHandler):
        """Does nothing with what it is told (under `ainvoke`, LangChain runs a sync
        handler's methods in a worker thread)."""

    class AsyncNoOp(AsyncCallbackHandler):
        """The same, async (run on the event loop)."""

    class IgnoringNoOp(BaseCallbackHandler):
        """Wants chain (node) runs only."""

        ignore_llm = True
        ignore_chat_model = True
        ignore_agent = True

    class ListeningNoOp(BaseCallbackHandler):
        """Overrides every method it is told of, and does nothing in them: what a
        handler that looks at the runs (a tracer) costs, without its own work."""

        def on_chain_start(self, *args: Any, **kwargs: Any) -> None:
            pass

        def on_chain_end(self, *args: Any, **kwargs: Any) -> None:
            pass

        def on_chat_model_start(self, *args: Any, **kwargs: Any) -> None:
            pass

        def on_llm_new_token(self, *args: Any, **kwargs: Any) -> None:
            pass

        def on_llm_end(self, *args: Any, **kwargs: Any) -> None:
            pass

        def on_tool_start(self, *args: Any, **kwargs: Any) -> None:
            pass

        def on_tool_end(self, *args: Any, **kwargs: Any) -> None:
            pass

    return {
        "no-op": NoOp,
        "async no-op": AsyncNoOp,
        "ignoring no-op": IgnoringNoOp,
        "listening no-op": ListeningNoOp,
    }


class Bypass:
    """Our nodes with no LangChain-callback reporting at all (the model and tool calls
    awaited directly), while entered: the baseline for what checking for callbacks costs,
    and, with a handler, what LangGraph's own node runs cost alone."""

    def __init__(self) -> None:
        import importlib
        import pkgutil

        import criogen_graph.graph
        from criogen_graph.telemetry import callbacks as _callbacks

        self.patched: list[tuple[Any, str, Any]] = []
        for info in pkgutil.iter_modules(criogen_graph.graph.__path__):
            module = importlib.import_module(f"criogen_graph.graph.{info.name}")
            for name in ("report_chat", "report_tool", "token_sink"):
                if getattr(module, name, None) is getattr(_callbacks, name, False):
                    self.patched.append((module, name, getattr(module, name)))
        assert {n for _, n, _ in self.patched} >= {"report_chat", "report_tool"}

    def __enter__(self) -> None:
        for module, name, _ in self.patched:
            if name == "token_sink":
                setattr(module, name, lambda sink: sink)
            else:
                setattr(module, name, lambda spec, x, call, *a, **k: call)

    def __exit__(self, *exc: Any) -> None:
        for module, name, saved in self.patched:
            setattr(module, name, saved)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--cpu",
        action="store_true",
        help="time the process's CPU (all its threads, so the export thread too) instead "
        "of the wall clock: steadier on a shared machine",
    )
    args = ap.parse_args()
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    from criogen_graph import Redactor, Telemetry

    handlers = noop_handlers()
    NoOp, AsyncNoOp, Listening = (
        handlers["no-op"],
        handlers["async no-op"],
        handlers["listening no-op"],
    )

    print("# machine:", json.dumps(machine()))
    with loopback_server() as base:
        telemetry = Telemetry.otlp(base)
        both_telemetry = Telemetry.otlp(base)
        unsampled = Telemetry(TracerProvider(sampler=ALWAYS_OFF))
        plain = make_agent()
        agents = {
            "off": (plain, None),
            "telemetry": (make_agent(telemetry=telemetry), telemetry),
            "telemetry, sampled out": (make_agent(telemetry=unsampled), unsampled),
            "redactor (pii built-ins)": (make_agent(redact=Redactor.pii()), None),
            "telemetry + redactor": (
                make_agent(telemetry=both_telemetry, redact=Redactor.pii()),
                both_telemetry,
            ),
        }

        def variant(agent: Any, tel: Any) -> tuple[Callable[[], Awaitable[None]], Any]:
            async def run() -> None:
                result = await agent.run(USER)
                assert result.model_calls == 2 and result.tool_calls == 1

            def end() -> None:
                if tel is not None:
                    assert tel.flush(30), "spans were not exported"

            return run, end

        variants = {k: variant(a, t) for k, (a, t) in agents.items()}
        bypass = Bypass()
        graph = plain.graph
        start = {"messages": [{"role": "user", "content": USER}]}
        no_op = {"callbacks": [NoOp()]}
        async_no_op = {"callbacks": [AsyncNoOp()]}
        listening = {"callbacks": [Listening()]}

        async def graph_off() -> None:
            await graph.ainvoke(start)

        async def graph_no_op() -> None:
            await graph.ainvoke(start, no_op)

        async def bypassed() -> None:
            with bypass:
                await plain.run(USER)

        variants["graph, no callbacks"] = (graph_off, lambda: None)
        variants["graph, no-op handler"] = (graph_no_op, lambda: None)

        async def graph_async_no_op() -> None:
            await graph.ainvoke(start, async_no_op)

        async def graph_async_no_op_nodes_only() -> None:
            with bypass:
                await graph.ainvoke(start, async_no_op)

        async def graph_no_op_nodes_only() -> None:
            with bypass:
                await graph.ainvoke(start, no_op)

        variants["graph, no-op, node runs only"] = (graph_no_op_nodes_only, lambda: None)

        async def graph_listening() -> None:
            await graph.ainvoke(start, listening)

        async def graph_listening_nodes_only() -> None:
            with bypass:
                await graph.ainvoke(start, listening)

        variants["graph, listening handler"] = (graph_listening, lambda: None)
        variants["graph, listening, nodes only"] = (graph_listening_nodes_only, lambda: None)
        variants["graph, async no-op handler"] = (graph_async_no_op, lambda: None)
        variants["graph, async no-op, nodes only"] = (graph_async_no_op_nodes_only, lambda: None)
        variants["off, no callback checks"] = (bypassed, lambda: None)
        clock = time.process_time_ns if args.cpu else time.perf_counter_ns
        per = asyncio.run(measure(variants, args.blocks, args.runs, args.warmup, clock))
        telemetry.shutdown()
        both_telemetry.shutdown()
    print(f"\n{'per turn (spans flushed)':30s} {'median ms':>10s} {'ratio':>7s}")
    off = per["off"]
    for k, v in per.items():
        print(f"{k:30s} {v:10.3f} {v / off:7.2f}")
    r_tel = per["telemetry"] / off
    r_red = per["redactor (pii built-ins)"] / off
    r_cb = per["graph, no-op handler"] / per["graph, no callbacks"]
    r_cb_ours = per["graph, no-op handler"] / per["graph, no-op, node runs only"]
    r_lcb = per["graph, listening handler"] / per["graph, no callbacks"]
    r_lcb_nodes = per["graph, listening, nodes only"] / per["graph, no callbacks"]
    r_lcb_ours = per["graph, listening handler"] / per["graph, listening, nodes only"]
    r_cb_nodes = per["graph, no-op, node runs only"] / per["graph, no callbacks"]
    r_acb = per["graph, async no-op handler"] / per["graph, no callbacks"]
    r_acb_ours = per["graph, async no-op handler"] / per["graph, async no-op, nodes only"]
    r_none = off / per["off, no callback checks"]
    print(f"\nratio telemetry / off          {r_tel:.2f}   (target <= 1.20)")
    print(f"ratio no-op callbacks / none   {r_cb:.2f}   (target <= 1.15)")
    print(f"ratio with our runs / without  {r_cb_ours:.2f}   (LangGraph's node runs in both)")
    print(f"ratio node runs only / none    {r_cb_nodes:.2f}   (LangGraph's own share)")
    print(f"ratio listening / none         {r_lcb:.2f}")
    print(f"ratio listening, nodes / none  {r_lcb_nodes:.2f}   (LangGraph's own share)")
    print(f"ratio with our runs / without  {r_lcb_ours:.2f}   (listening; node runs in both)")
    print(f"ratio async no-op / none       {r_acb:.2f}   (target <= 1.15)")
    print(f"ratio with our runs / without  {r_acb_ours:.2f}   (async; node runs in both)")
    print(f"ratio off / no checks at all   {r_none:.2f}   (target <= 1.02)")
    print(f"ratio redactor / none          {r_red:.2f}   (target <= 1.15)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "ms_per_turn": per,
                    "ratio_telemetry": r_tel,
                    "ratio_callbacks": r_cb,
                    "ratio_callbacks_our_runs": r_cb_ours,
                    "ratio_callbacks_node_runs_only": r_cb_nodes,
                    "ratio_listening_callbacks": r_lcb,
                    "ratio_listening_node_runs_only": r_lcb_nodes,
                    "ratio_listening_our_runs": r_lcb_ours,
                    "ratio_async_callbacks": r_acb,
                    "ratio_async_callbacks_our_runs": r_acb_ours,
                    "ratio_nothing_configured": r_none,
                    "ratio_redactor": r_red,
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
