"""Transient faults from a provider over real HTTP (a loopback server speaking the OpenAI
wire format): 429s, 5xx, connections reset, answers too late, malformed bodies and
streams cut short, in 100 runs (half streamed). Every run completes, each fault is
retried under the kind it belongs to, and a streamed answer never repeats text."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import Agent, Retry, Telemetry, openai, tool
from tests.reliability._report import report
from tests.servers import openai_server as srv
from tests.servers.otlp_receiver import OtlpReceiver

RUNS = 100
TIMEOUT = 0.3

#: Fault -> (the step the server plays, the error kind the runtime must see).
FAULTS: dict[str, tuple[Any, str]] = {
    "429": (lambda: srv.error(429, "slow down", headers={"retry-after": "0"}), "rate_limit"),
    "500": (lambda: srv.error(500, "oops"), "transient"),
    "503": (lambda: srv.error(503, "overloaded"), "transient"),
    "reset": (srv.reset, "connection"),
    "late": (lambda: srv.text("too late", delay=TIMEOUT * 4), "timeout"),
    "malformed": (srv.malformed, "transient"),
}


@tool
def lookup(order_id: str) -> str:
    """Look up an order."""
    return f"{order_id} shipped"


@pytest.mark.timeout(300)
async def test_transient_provider_faults_in_100_runs(rx: OtlpReceiver, tmp_path: Path) -> None:
    rng = random.Random(20261130)
    injected: Counter[str] = Counter()
    expected_kinds: Counter[str] = Counter()
    streamed_runs = 0
    telemetry = Telemetry.otlp(rx.url)
    rx.users.append(telemetry)

    with srv.OpenAIServer() as server:
        model = openai("gpt-test", base_url=server.base_url, api_key="k", timeout_secs=TIMEOUT)
        agent = Agent(
            model,
            tools=[lookup],
            model_retry=Retry(max_attempts=5, initial_backoff_secs=0, jitter=False),
            storage=f"sqlite:///{tmp_path}/faults.db",
            telemetry=telemetry,
        )

        def faults(streamed: bool) -> list[Any]:
            steps = []
            for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
                kinds = [*FAULTS, "cut"] if streamed else list(FAULTS)
                kind = rng.choice(kinds)
                injected[kind] += 1
                if kind == "cut":
                    # A stream that stops part-way: retried, its text never repeated.
                    steps.append(srv.text("Order A-1 shipped yesterday.", drop_after=2))
                    expected_kinds["connection"] += 1
                else:
                    make, error_kind = FAULTS[kind]
                    steps.append(make())
                    expected_kinds[error_kind] += 1
            return steps

        for n in range(RUNS):
            streamed = n % 2 == 1
            server.add(*faults(streamed), srv.tool_calls(("lookup", {"order_id": "A-1"})))
            server.add(*faults(streamed), srv.text("Order A-1 shipped yesterday."))
            thread = agent.thread(f"run-{n}")
            if streamed:
                stream = thread.stream("where is A-1?")
                pieces: dict[str, str] = {}
                async for event in stream:
                    if event.type == "text":
                        pieces[event.message_id] = pieces.get(event.message_id, "") + event.text
                reply = await stream.reply()
                final_id = reply.messages[-1]["id"]
                # Retries after a cut send only what was not streamed yet: no repeats.
                assert pieces[final_id] == reply.text, f"run {n}: {pieces}"
                streamed_runs += 1
            else:
                reply = await thread.send("where is A-1?")
            assert reply.text == "Order A-1 shipped yesterday.", f"run {n}"
            assert reply.tool_calls == 1 and reply.model_calls == 2
        await agent.aclose()
        assert not server.script, "a scripted step was never asked for"

    assert telemetry.flush(10)
    seen: Counter[str] = Counter(
        attrs["error.type"]
        for span in rx.spans
        for name, attrs in span.events
        if name == "criogen.model_retry"
    )
    assert seen == expected_kinds, f"retried as {dict(seen)}, expected {dict(expected_kinds)}"
    assert sum(injected.values()) > 100
    await agent.storage.close()
    report(
        "provider_faults",
        runs=RUNS,
        streamed=streamed_runs,
        completed=RUNS,
        faults=sum(injected.values()),
        **{f"injected_{k}": v for k, v in sorted(injected.items())},
        **{f"retried_as_{k}": v for k, v in sorted(seen.items())},
    )
