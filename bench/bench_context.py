"""A thread that lives for months: 2,000 user messages of ~2 KB on SQLite, with a context
budget, side by side with LangChain's `create_agent` + `SummarizationMiddleware`.

Both sides run the same script: each user message is ~2 KB of text, the model answers a
short line, and a summary request is answered by a ~1 KB summary. Both models are local
stand-ins (no network): what is measured is what each runtime sends the model, how often
it asks for a summary, and its own time per turn on SQLite.

  criogen_graph   Agent(context=ContextPolicy(max_input_tokens=B, keep_last=K)),
                  thread.send on Storage("sqlite:///...")
  langchain       create_agent(middleware=[SummarizationMiddleware(trigger=("tokens", B),
                  keep=("messages", K))]) + AsyncSqliteSaver, ainvoke per user message

Tokens sent per turn are counted the same way on both sides (characters / 4 + 3 per
message, LangChain's `count_tokens_approximately` rule) over what the model was sent,
system message included. Checks (criogen_graph): every turn from the first compaction on
is under the budget; the time per turn around message 2,000 is within 1.3x of around
message 100: after the long thread is written, a second thread is written up to message
100, and the next turns of both are timed in interleaved blocks (medians, wall clock), so
a machine shared with other work slows both alike. The sequential series (medians of
50-turn windows around message 100 and the last message, wall clock and the process's
CPU time) is reported beside it. Summaries <= 1 per K messages.

    python bench/bench_context.py [--turns 2000] [--budget 8000] [--keep-last 10] [--json out.json]
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
from pathlib import Path
from typing import Any

os.environ.setdefault("LANGSMITH_TRACING", "false")
os.environ.setdefault("LANGCHAIN_TRACING_V2", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

sys.path.insert(0, os.path.dirname(__file__))
from _common import machine

INSTRUCTIONS = "You are a support assistant. Answer briefly."
SUMMARY = ("The user described their account, orders and preferences in detail. " * 15).strip()
_WORDS = "order shipment refund invoice account address delivery parcel warehouse tracking"


def user_text(i: int) -> str:
    """Message `i`: ~2 KB of text that differs from turn to turn."""
    words = _WORDS.split()
    body = " ".join(words[(i + k) % len(words)] for k in range(260))
    return f"Message {i}: {body}"[:2048]


#: The short thread the long one is timed against, in interleaved blocks.
SHORT = 100
BLOCKS, PER_BLOCK = 20, 5


async def side_by_side(
    short: Callable[[int], Awaitable[Any]], long: Callable[[int], Awaitable[Any]]
) -> dict[str, float]:
    """Median ms per turn of the next turns of a thread at message SHORT and of the thread
    at its full length, in interleaved blocks (the order alternates), so a machine shared
    with other work slows both alike."""
    samples: dict[str, list[float]] = {"at_100": [], "at_end": []}
    count = {"at_100": 0, "at_end": 0}
    sides = {"at_100": short, "at_end": long}
    for b in range(BLOCKS):
        for name in ("at_100", "at_end") if b % 2 == 0 else ("at_end", "at_100"):
            for _ in range(PER_BLOCK):
                t0 = time.perf_counter()
                await sides[name](count[name])
                samples[name].append((time.perf_counter() - t0) * 1000)
                count[name] += 1
    at_100 = statistics.median(samples["at_100"])
    at_end = statistics.median(samples["at_end"])
    return {
        "at_100": round(at_100, 2),
        "at_end": round(at_end, 2),
        "ratio": round(at_end / at_100, 3),
    }


def approx_tokens(messages: list[tuple[str, str]]) -> int:
    """Characters / 4 + 3 per message (`count_tokens_approximately`)."""
    return int(sum(len(text) for _, text in messages) / 4 + 3 * len(messages))


def window(times: list[float], at: int, half: int = 25) -> float:
    """The median of the turns around turn `at` (1-based)."""
    lo = max(0, min(at + half, len(times)) - 2 * half)
    return statistics.median(times[lo : lo + 2 * half])


async def ours(turns: int, budget: int, keep_last: int, db: Path) -> dict[str, Any]:
    from criogen_graph import Agent, ContextPolicy, FunctionModel, Storage

    sent: list[int] = []
    summaries = 0

    def model(messages: list[dict[str, Any]], tools: list[Any]) -> str:
        nonlocal summaries
        if str(messages[0].get("content", "")).startswith("You keep a running summary"):
            summaries += 1
            return SUMMARY
        sent.append(approx_tokens([(m["role"], str(m.get("content") or "")) for m in messages]))
        return "Noted, thank you."

    times: list[float] = []
    cpu: list[float] = []
    compacted = 0
    first_compaction: int | None = None
    async with Storage(f"sqlite:///{db}") as storage:
        agent = Agent(
            FunctionModel(model),
            instructions=INSTRUCTIONS,
            context=ContextPolicy(max_input_tokens=budget, keep_last=keep_last),
            storage=storage,
        )
        thread = agent.thread(f"bench-{uuid.uuid4().hex[:8]}")
        for i in range(turns):
            t0, c0 = time.perf_counter(), time.process_time()
            reply = await thread.send(user_text(i))
            times.append((time.perf_counter() - t0) * 1000)
            cpu.append((time.process_time() - c0) * 1000)
            if reply.compacted:
                compacted += 1
                if first_compaction is None:
                    first_compaction = i + 1
        stored = len(await thread.messages())
        # The long thread's figures: the timing below writes more.
        made, n = summaries, len(sent)
        short = agent.thread(f"short-{uuid.uuid4().hex[:8]}")
        for i in range(SHORT):
            await short.send(user_text(i))
        side = await side_by_side(
            lambda i: short.send(user_text(SHORT + i)),
            lambda i: thread.send(user_text(turns + i)),
        )
        del sent[n:]
    return _figures(sent, times, cpu, made, turns, budget, first_compaction) | {
        "runs_that_compacted": compacted,
        "stored_messages": stored,
        "interleaved_ms_per_turn": side,
    }


async def langchain(turns: int, budget: int, keep_last: int, db: Path) -> dict[str, Any]:
    from langchain.agents import create_agent
    from langchain.agents.middleware import SummarizationMiddleware
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    sent: list[int] = []
    summaries = [0]

    class Scripted(BaseChatModel):
        @property
        def _llm_type(self) -> str:
            return "scripted"

        def _generate(self, messages: Any, stop: Any = None, **kw: Any) -> ChatResult:
            raise NotImplementedError

        async def _agenerate(
            self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any
        ) -> ChatResult:
            text = "Noted, thank you."
            first = str(messages[0].content) if messages else ""
            if len(messages) == 1 and "summar" in first.lower():
                summaries[0] += 1
                text = SUMMARY
            else:
                sent.append(approx_tokens([(m.type, str(m.content)) for m in messages]))
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text))])

        def bind_tools(self, tools: Any, **kw: Any) -> Any:
            return self

    times: list[float] = []
    cpu: list[float] = []
    async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
        agent = create_agent(
            Scripted(),
            tools=[],
            system_prompt=INSTRUCTIONS,
            middleware=[
                SummarizationMiddleware(
                    Scripted(), trigger=("tokens", budget), keep=("messages", keep_last)
                )
            ],
            checkpointer=saver,
        )
        cfg: Any = {"configurable": {"thread_id": f"bench-{uuid.uuid4().hex[:8]}"}}
        first_summary: int | None = None
        for i in range(turns):
            t0, c0 = time.perf_counter(), time.process_time()
            await agent.ainvoke({"messages": [("user", user_text(i))]}, cfg)
            times.append((time.perf_counter() - t0) * 1000)
            cpu.append((time.process_time() - c0) * 1000)
            if first_summary is None and summaries[0]:
                first_summary = i + 1
        stored = len((await agent.aget_state(cfg)).values["messages"])
        made, n = summaries[0], len(sent)
        short: Any = {"configurable": {"thread_id": f"short-{uuid.uuid4().hex[:8]}"}}
        for i in range(SHORT):
            await agent.ainvoke({"messages": [("user", user_text(i))]}, short)
        side = await side_by_side(
            lambda i: agent.ainvoke({"messages": [("user", user_text(SHORT + i))]}, short),
            lambda i: agent.ainvoke({"messages": [("user", user_text(turns + i))]}, cfg),
        )
        del sent[n:]
    return _figures(sent, times, cpu, made, turns, budget, first_summary) | {
        "stored_messages": stored,
        "interleaved_ms_per_turn": side,
    }


def _figures(
    sent: list[int],
    times: list[float],
    cpu: list[float],
    summaries: int,
    turns: int,
    budget: int,
    first: int | None,
) -> dict[str, Any]:
    after = sent[first:] if first else []
    at_100 = window(times, min(100, turns))
    at_end = window(times, turns)
    return {
        "summary_calls": summaries,
        "first_compaction_at_turn": first,
        "tokens_per_turn": {
            "at_100": sent[min(100, turns) - 1],
            "at_1000": sent[min(1000, turns) - 1],
            "at_end": sent[-1],
            "max_after_first_compaction": max(after) if after else None,
            "median_after_first_compaction": int(statistics.median(after)) if after else None,
            "over_budget_after_first_compaction": sum(1 for t in after if t > budget),
        },
        "ms_per_turn": {"at_100": round(at_100, 2), "at_end": round(at_end, 2)},
        "time_ratio_end_vs_100": round(at_end / at_100, 3),
        "cpu_ms_per_turn": {
            "at_100": round(window(cpu, min(100, turns)), 2),
            "at_end": round(window(cpu, turns), 2),
        },
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out: dict[str, Any] = {
            "machine": machine(),
            "turns": args.turns,
            "budget": args.budget,
            "keep_last": args.keep_last,
            "criogen_graph": await ours(
                args.turns, args.budget, args.keep_last, Path(tmp) / "ours.db"
            ),
        }
        if not args.skip_langchain:
            out["langchain"] = await langchain(
                args.turns, args.budget, args.keep_last, Path(tmp) / "lc.db"
            )
    ours_out = out["criogen_graph"]
    tokens = ours_out["tokens_per_turn"]
    out["checks"] = {
        "under_budget_from_first_compaction": tokens["over_budget_after_first_compaction"] == 0,
        "time_at_end_within_1.3x_of_100": ours_out["interleaved_ms_per_turn"]["ratio"] <= 1.3,
        "summaries_at_most_1_per_keep_last_messages": ours_out["summary_calls"]
        <= (2 * args.turns) // args.keep_last,
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--budget", type=int, default=8000)
    parser.add_argument("--keep-last", type=int, default=10)
    parser.add_argument("--skip-langchain", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    out = asyncio.run(measure(args))
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    if not all(out["checks"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
