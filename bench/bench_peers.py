"""Per-turn framework overhead against the peer runtimes, side by side in one process.

Every variant does the same job, in interleaved blocks: one user message ("go") answered
in two turns (the fake model asks for one call to the `echo` tool, the tool runs, the
model answers "done"); ms per turn = ms per run / 2. Each framework uses its own fake
model (the setups of `peers_baseline.py`); every tool is an `async def`, so nobody pays a
worker-thread hop. No network, no tracing export.

  criogen_graph   agent.run (FunctionModel, no storage); thread.send and thread.stream
                  (events drained, then `await stream.reply()`) on Storage("memory://"),
                  a fresh thread per run
  langchain       create_agent (scripted chat model): ainvoke without checkpointer;
                  ainvoke + InMemorySaver; astream(stream_mode="messages") + InMemorySaver
                  (fresh thread per run)
  openai-agents   Runner.run and Runner.run_streamed (drained), ScriptedModel, tracing off
  pydantic-ai     agent.run and run_stream_events (drained), FunctionModel

openai-agents and pydantic-ai are skipped (with the reason printed) when not installed.

    python bench/bench_peers.py [--blocks 10] [--runs 40] [--warmup 40] [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

os.environ.setdefault("LANGSMITH_TRACING", "false")
os.environ.setdefault("LANGCHAIN_TRACING_V2", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

sys.path.insert(0, os.path.dirname(__file__))
from _common import (
    interleaved,
    lc_echo_async,
    machine,
    our_agent_async_tool,
    scripted_chat_model,
)

Run = Callable[[], Awaitable[None]]

OURS_RUN = "criogen_graph agent.run"
OURS_SEND = "criogen_graph thread.send memory://"
OURS_STREAM = "criogen_graph thread.stream memory://"
LC = "langchain create_agent"
LC_SAVER = "langchain create_agent + InMemorySaver"
LC_STREAM = "langchain create_agent astream(messages) + InMemorySaver"
OA = "openai-agents Runner.run"
OA_STREAM = "openai-agents run_streamed (drained)"
PAI = "pydantic-ai agent.run"
PAI_STREAM = "pydantic-ai run_stream_events (drained)"

# name: (numerator, denominator, target or None)
RATIOS: dict[str, tuple[str, str, float | None]] = {
    "ours agent.run / create_agent": (OURS_RUN, LC, 0.70),
    "ours agent.run / openai-agents Runner.run": (OURS_RUN, OA, None),
    "ours agent.run / pydantic-ai agent.run": (OURS_RUN, PAI, None),
    "ours thread.send memory / create_agent+InMemorySaver": (OURS_SEND, LC_SAVER, 0.70),
    "ours thread.stream memory / create_agent astream": (OURS_STREAM, LC_STREAM, None),
}


def peer_versions() -> dict[str, str]:
    out = {}
    for dist in ("openai-agents", "pydantic-ai-slim", "pydantic"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "not installed"
    return out


# -- criogen_graph ----------------------------------------------------------------------


def make_ours_run() -> Run:
    agent = our_agent_async_tool()

    async def run() -> None:
        result = await agent.run("go")
        assert result.text == "done" and result.tool_calls == 1

    return run


def make_ours_send(storage: Any) -> Run:
    agent = our_agent_async_tool(storage)

    async def run() -> None:
        reply = await agent.thread(uuid.uuid4().hex).send("go")
        assert reply.text == "done"

    return run


def make_ours_stream(storage: Any) -> Run:
    agent = our_agent_async_tool(storage)

    async def run() -> None:
        stream = agent.thread(uuid.uuid4().hex).stream("go")
        async for _ in stream:
            pass
        reply = await stream.reply()
        assert reply.text == "done"

    return run


# -- langchain create_agent -------------------------------------------------------------


def make_create_agent(*, saver: bool = False, stream: bool = False) -> Run:
    from langchain.agents import create_agent
    from langchain_core.messages import HumanMessage

    checkpointer = None
    if saver:
        from langgraph.checkpoint.memory import InMemorySaver

        checkpointer = InMemorySaver()
    graph = create_agent(scripted_chat_model(), [lc_echo_async()], checkpointer=checkpointer)

    def config() -> Any:
        return {"configurable": {"thread_id": uuid.uuid4().hex}} if saver else None

    async def run() -> None:
        out = await graph.ainvoke({"messages": [HumanMessage("go")]}, config())
        assert out["messages"][-1].content == "done"

    async def run_stream() -> None:
        last: Any = None
        async for message, _metadata in graph.astream(
            {"messages": [HumanMessage("go")]}, config(), stream_mode="messages"
        ):
            last = message
        assert last is not None and last.content == "done"

    return run_stream if stream else run


# -- openai-agents ----------------------------------------------------------------------


def make_openai_agents(*, streamed: bool = False) -> Run:
    from agents import Agent, RunConfig, Runner, function_tool, set_trace_processors
    from agents.testing import ScriptedModel, assistant_message, function_call

    set_trace_processors([])  # never export anything, even if tracing got switched on

    @function_tool
    async def echo(text: str) -> str:
        """Echo the text back."""
        return text

    model = ScriptedModel([])
    agent = Agent(name="bench", model=model, tools=[echo])
    config = RunConfig(tracing_disabled=True)
    calls = itertools.count()

    def script() -> None:
        call_id = f"call_{next(calls)}"
        model.extend(
            [
                [function_call("echo", {"text": "hi"}, call_id=call_id)],
                [assistant_message("done")],
            ]
        )

    async def run() -> None:
        script()
        result = await Runner.run(agent, "go", run_config=config)
        assert result.final_output == "done", result.final_output

    async def run_streamed() -> None:
        script()
        result = Runner.run_streamed(agent, "go", run_config=config)
        async for _ in result.stream_events():
            pass
        assert result.final_output == "done", result.final_output

    return run_streamed if streamed else run


# -- pydantic-ai ------------------------------------------------------------------------


def make_pydantic_ai(*, stream: bool = False) -> Run:
    from pydantic_ai import Agent
    from pydantic_ai.messages import (
        ModelMessage,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

    async def echo(text: str) -> str:
        """Echo the text back."""
        return text

    calls = itertools.count()

    def answered(messages: list[ModelMessage]) -> bool:
        return any(isinstance(p, ToolReturnPart) for p in messages[-1].parts)

    async def fn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if answered(messages):
            return ModelResponse(parts=[TextPart("done")])
        call = ToolCallPart("echo", {"text": "hi"}, tool_call_id=f"call_{next(calls)}")
        return ModelResponse(parts=[call])

    async def stream_fn(
        messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        if answered(messages):
            yield "done"
            return
        yield {0: DeltaToolCall("echo", '{"text": "hi"}', tool_call_id=f"call_{next(calls)}")}

    agent = Agent(FunctionModel(fn, stream_function=stream_fn), tools=[echo])

    async def run() -> None:
        result = await agent.run("go")
        assert result.output == "done", result.output

    async def run_stream_events() -> None:
        output = None
        async with agent.run_stream_events("go") as events:
            async for event in events:
                if type(event).__name__ == "AgentRunResultEvent":
                    output = event.result.output  # type: ignore[union-attr]
        assert output == "done", output

    return run_stream_events if stream else run


# -- main -------------------------------------------------------------------------------


async def measure(args: argparse.Namespace) -> tuple[dict[str, list[float]], dict[str, str]]:
    from criogen_graph import Storage

    skipped: dict[str, str] = {}
    variants: dict[str, Run] = {OURS_RUN: make_ours_run()}
    storages = [Storage("memory://"), Storage("memory://")]
    for storage in storages:
        await storage.open()
    variants[OURS_SEND] = make_ours_send(storages[0])
    variants[OURS_STREAM] = make_ours_stream(storages[1])
    variants[LC] = make_create_agent()
    variants[LC_SAVER] = make_create_agent(saver=True)
    variants[LC_STREAM] = make_create_agent(saver=True, stream=True)
    peers: list[tuple[str, Callable[[], Run]]] = [
        (OA, make_openai_agents),
        (OA_STREAM, lambda: make_openai_agents(streamed=True)),
        (PAI, make_pydantic_ai),
        (PAI_STREAM, lambda: make_pydantic_ai(stream=True)),
    ]
    for name, make in peers:
        try:
            variants[name] = make()
        except ImportError as exc:
            skipped[name] = f"not installed: {exc}"
            print(f"[skip] {name}: {skipped[name]}", flush=True)
    try:
        samples = await interleaved(variants, args.blocks, args.runs, args.warmup)
    finally:
        for storage in storages:
            await storage.close()
    return samples, skipped


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument("--runs", type=int, default=40, help="runs per block and variant")
    ap.add_argument("--warmup", type=int, default=40, help="untimed runs per variant")
    ap.add_argument("--quick", action="store_true", help="--blocks 4 --runs 15 --warmup 15 (~20 s)")
    ap.add_argument("--json", default=None, help="write the numbers here")
    args = ap.parse_args()
    if args.quick:
        args.blocks, args.runs, args.warmup = 4, 15, 15

    info = {**machine(), **peer_versions()}
    print("# machine:", json.dumps(info))
    samples, skipped = asyncio.run(measure(args))

    per_turn = {k: statistics.median(v) / 2 for k, v in samples.items()}
    title = f"per-turn overhead (2 turns/run, {args.blocks}x{args.runs} runs)"
    print(f"\n{title:58s} {'median ms/turn':>14s} {'p90':>7s} {'block medians':>15s}")
    for name, values in samples.items():
        p90 = statistics.quantiles(values, n=10)[-1] / 2 if len(values) > 1 else values[0] / 2
        blocks = [
            statistics.median(values[i : i + args.runs]) / 2
            for i in range(0, len(values), args.runs)
        ]
        spread = f"{min(blocks):.2f}..{max(blocks):.2f}"
        print(f"{name:58s} {per_turn[name]:14.3f} {p90:7.3f} {spread:>15s}")
    for name, reason in skipped.items():
        print(f"{name:58s} {'skipped':>14s}   ({reason})")

    ratios: dict[str, float] = {}
    print()
    for label, (num, den, target) in RATIOS.items():
        if num in per_turn and den in per_turn:
            ratios[label] = per_turn[num] / per_turn[den]
            note = f"   (target <= {target:.2f})" if target is not None else ""
            print(f"{'ratio ' + label:58s} {ratios[label]:14.2f}{note}")
        else:
            print(f"{'ratio ' + label:58s} {'n/a':>14s}   (a side was skipped)")

    if args.json:
        result: dict[str, Any] = {
            "machine": info,
            "settings": {"blocks": args.blocks, "runs": args.runs, "warmup": args.warmup},
            "ms_per_turn": per_turn,
            "ratios": ratios,
            "targets": {k: t for k, (_, _, t) in RATIOS.items() if t is not None},
            "skipped": skipped,
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
