"""Per-call cost of our OpenAI adapters (Chat Completions and Responses) against the
official `openai` SDK, the same call to the same loopback server (bench/loopback.py, in
its own process), non-streamed and streamed, side by side in one process, interleaved
blocks.

    python bench/bench_providers.py [--blocks 10] [--runs 100]

Needs the `dev` extra (it installs `openai` for the comparison; the package itself never
imports it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
from collections.abc import Awaitable, Callable

sys.path.insert(0, os.path.dirname(__file__))
from _common import interleaved, loopback_server, machine

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]


async def run(args: argparse.Namespace, base_url: str) -> dict[str, float]:
    import openai as sdk

    from criogen_graph import ModelRequest, openai

    ours = openai("bench", api_key="k", base_url=base_url)
    theirs = sdk.AsyncOpenAI(api_key="k", base_url=base_url, max_retries=0)

    async def ours_json() -> None:
        r = await ours.generate(ModelRequest(list(MESSAGES), []))
        assert r.message["content"].startswith("Hello")

    async def ours_stream() -> None:
        pieces: list[str] = []
        r = await ours.generate(ModelRequest(list(MESSAGES), [], on_text=pieces.append))
        assert r.message["content"] == "".join(pieces)

    async def sdk_json() -> None:
        r = await theirs.chat.completions.create(model="bench", messages=MESSAGES)  # type: ignore[arg-type]
        assert (r.choices[0].message.content or "").startswith("Hello")

    async def sdk_stream() -> None:
        pieces: list[str] = []
        s = await theirs.chat.completions.create(
            model="bench",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},  # type: ignore[arg-type]
        )
        async for chunk in s:
            for c in chunk.choices:
                if c.delta.content:
                    pieces.append(c.delta.content)
        assert "".join(pieces).startswith("Hello")

    ours_r = openai("bench", api_key="k", base_url=base_url, api="responses")

    async def ours_r_json() -> None:
        r = await ours_r.generate(ModelRequest(list(MESSAGES), []))
        assert r.message["content"].startswith("Hello")

    async def ours_r_stream() -> None:
        pieces: list[str] = []
        r = await ours_r.generate(ModelRequest(list(MESSAGES), [], on_text=pieces.append))
        assert r.message["content"] == "".join(pieces)

    async def sdk_r_json() -> None:
        r = await theirs.responses.create(
            model="bench", instructions="Be brief.", input="Say hello.", store=False
        )
        assert r.output_text.startswith("Hello")

    async def sdk_r_stream() -> None:
        pieces: list[str] = []
        s = await theirs.responses.create(
            model="bench", instructions="Be brief.", input="Say hello.", store=False, stream=True
        )
        async for event in s:
            if event.type == "response.output_text.delta":
                pieces.append(event.delta)
        assert "".join(pieces).startswith("Hello")

    variants: dict[str, Callable[[], Awaitable[None]]] = {
        "ours non-streamed": ours_json,
        "openai SDK non-streamed": sdk_json,
        "ours streamed": ours_stream,
        "openai SDK streamed": sdk_stream,
        "ours responses non-streamed": ours_r_json,
        "SDK responses non-streamed": sdk_r_json,
        "ours responses streamed": ours_r_stream,
        "SDK responses streamed": sdk_r_stream,
    }
    samples = await interleaved(variants, args.blocks, args.runs, args.warmup)
    await ours.aclose()
    await ours_r.aclose()
    await theirs.close()
    return {k: statistics.median(v) for k, v in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from importlib.metadata import version

    print(
        "# machine:",
        json.dumps({**machine(), "openai": version("openai"), "httpx": version("httpx")}),
    )
    with loopback_server() as base:
        per = asyncio.run(run(args, f"{base}/v1"))
    print(f"\n{'one call to the loopback server':34s} {'median ms':>10s}")
    for k, v in per.items():
        print(f"{k:34s} {v:10.3f}")
    r_json = per["ours non-streamed"] / per["openai SDK non-streamed"]
    r_stream = per["ours streamed"] / per["openai SDK streamed"]
    print(f"{'ratio non-streamed ours / SDK':34s} {r_json:10.2f}   (target <= 1.00)")
    print(f"{'ratio streamed ours / SDK':34s} {r_stream:10.2f}   (target <= 1.00)")
    rr_json = per["ours responses non-streamed"] / per["SDK responses non-streamed"]
    rr_stream = per["ours responses streamed"] / per["SDK responses streamed"]
    print(f"{'ratio responses non-streamed':34s} {rr_json:10.2f}   (target <= 1.00)")
    print(f"{'ratio responses streamed':34s} {rr_stream:10.2f}   (target <= 1.00)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "ms_per_call": per,
                    "ratio_json": r_json,
                    "ratio_stream": r_stream,
                    "ratio_responses_json": rr_json,
                    "ratio_responses_stream": rr_stream,
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
