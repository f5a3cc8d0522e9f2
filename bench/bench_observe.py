"""The cost of telemetry and of redaction per agent turn.

One job, four ways, in one process, in interleaved blocks: `agent.run` of a customer
message (about 600 characters, with an e-mail address and a phone number) answered in two
turns (a tool call whose result is about 800 characters, then a 400-character answer),
with a scripted model that does no work. Variants: nothing; telemetry exporting every
span over OTLP/HTTP to a sink on 127.0.0.1 (bench/loopback.py, its own process); a
`Redactor.pii()`; both. Each block of runs ends with `telemetry.flush()` inside the timed
span, so the export work done by the background thread is paid for, not hidden. Reported:
median over blocks of ms per turn (= per model call), and the ratios to nothing.

    python bench/bench_observe.py [--blocks 12] [--runs 100] [--json out.json]
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
            t0 = time.perf_counter_ns()
            for _ in range(runs):
                await fn()
            end()
            per_block[name].append((time.perf_counter_ns() - t0) / 1e6 / runs / 2)
    return {k: statistics.median(v) for k, v in per_block.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from criogen_graph import Redactor, Telemetry

    print("# machine:", json.dumps(machine()))
    with loopback_server() as base:
        telemetry = Telemetry.otlp(base)
        both_telemetry = Telemetry.otlp(base)
        agents = {
            "off": (make_agent(), None),
            "telemetry": (make_agent(telemetry=telemetry), telemetry),
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

        per = asyncio.run(
            measure(
                {k: variant(a, t) for k, (a, t) in agents.items()},
                args.blocks,
                args.runs,
                args.warmup,
            )
        )
        telemetry.shutdown()
        both_telemetry.shutdown()
    print(f"\n{'per turn (spans flushed)':30s} {'median ms':>10s} {'ratio':>7s}")
    off = per["off"]
    for k, v in per.items():
        print(f"{k:30s} {v:10.3f} {v / off:7.2f}")
    r_tel = per["telemetry"] / off
    r_red = per["redactor (pii built-ins)"] / off
    print(f"\nratio telemetry / off          {r_tel:.2f}   (target <= 1.20)")
    print(f"ratio redactor / none          {r_red:.2f}   (target <= 1.15)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"ms_per_turn": per, "ratio_telemetry": r_tel, "ratio_redactor": r_red},
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
