"""SIGKILL at random points of a multi-tool run, then recovery in a new process: every
thread completes, no message is lost or doubled, no saved tool result is run again, and
every tool effect happens exactly once (tools keyed by their stable call ids)."""

from __future__ import annotations

import asyncio
import random
import signal
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import Storage
from tests.conftest import storage_url
from tests.reliability._report import report
from tests.reliability._workers import PLAN, kill_agent, ledger
from tests.reliability.conftest import run_child

TRIALS = 50


async def saved_results(url: str, thread_id: str) -> set[str]:
    """The call ids whose results are saved: in the head's transcript or its pending writes."""
    storage = Storage(url)
    try:
        await storage.open()
        tup = await storage.checkpointer.aget_tuple({"configurable": {"thread_id": thread_id}})
        if tup is None:
            return set()
        thread = kill_agent(storage, Path()).thread(thread_id)
        ids = {m["tool_call_id"] for m in await thread.messages() if m["role"] == "tool"}
        for _, channel, value in tup.pending_writes or ():
            if channel == "messages":
                items = value if isinstance(value, list | tuple) else [value]
                ids |= {m["tool_call_id"] for m in items if m.get("role") == "tool"}
        return ids
    finally:
        await storage.close()


async def final_messages(url: str, thread_id: str) -> list[dict[str, Any]]:
    storage = Storage(url)
    try:
        return await kill_agent(storage, Path()).thread(thread_id).messages()
    finally:
        await storage.close()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_sigkill_at_random_points_then_recovery(
    backend: str, tmp_path: Path, forkserver: Any
) -> None:
    from tests.reliability import _workers

    url = storage_url(backend, tmp_path)
    rng = random.Random(f"{backend}-{uuid.uuid4().hex}")

    # How long an unkilled run takes here (after a first one that starts the forkserver),
    # to spread the kill points over it.
    spans = []
    for probe in range(3):
        workdir = tmp_path / f"probe-{probe}"
        workdir.mkdir()
        started, done = forkserver.Event(), forkserver.Event()
        thread_id = f"probe-{uuid.uuid4().hex}"
        proc = run_child(forkserver, _workers.send, url, thread_id, str(workdir), started, done)
        assert await asyncio.to_thread(started.wait, 60)
        t0 = time.monotonic()
        assert await asyncio.to_thread(done.wait, 60)
        spans.append(time.monotonic() - t0)
        await asyncio.to_thread(proc.join, 60)
        assert proc.exitcode == 0
    span = min(spans)

    counts: Counter[str] = Counter()
    for trial in range(TRIALS):
        workdir = tmp_path / f"trial-{trial}"
        workdir.mkdir()
        thread_id = f"kill-{backend}-{trial}-{uuid.uuid4().hex}"
        started, done = forkserver.Event(), forkserver.Event()
        proc = run_child(forkserver, _workers.send, url, thread_id, str(workdir), started, done)
        assert await asyncio.to_thread(started.wait, 30), "the child never started"
        await asyncio.sleep(rng.uniform(0, span * 1.1))  # the kill point, chosen at random
        proc.kill()
        await asyncio.to_thread(proc.join, 30)
        counts["killed" if proc.exitcode == -signal.SIGKILL else "finished_before_kill"] += 1

        before = Counter(line.split()[1] for line in ledger(workdir) if line.startswith("start"))
        saved = await saved_results(url, thread_id)

        out = forkserver.Queue()
        proc = run_child(forkserver, _workers.recover_child, url, thread_id, str(workdir), out)
        what = await asyncio.to_thread(out.get, True, 60)
        await asyncio.to_thread(proc.join, 60)
        assert not what.startswith("error"), f"trial {trial}: recovery failed: {what}"
        counts[what] += 1

        messages = await final_messages(url, thread_id)
        roles = [m["role"] for m in messages]
        assert roles == [
            "user",
            "assistant",
            "tool",
            "tool",
            "tool",
            "assistant",
            "tool",
            "tool",
            "assistant",
        ], f"trial {trial}: {roles} after {what}; saved {saved}; ledger {ledger(workdir)}"
        assert messages[0]["content"] == "go" and messages[-1]["content"] == "done"
        calls = [
            c["id"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or ()
        ]
        names = [
            c["name"]
            for m in messages
            if m["role"] == "assistant"
            for c in m.get("tool_calls") or ()
        ]
        assert names == [n for turn in PLAN for n, _ in turn]
        results = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
        assert sorted(results) == sorted(calls), f"trial {trial}: a call without its result"

        lines = ledger(workdir)
        effects = Counter(line.split()[1] for line in lines if line.startswith("effect"))
        starts = Counter(line.split()[1] for line in lines if line.startswith("start"))
        assert set(effects) == set(calls), (
            f"trial {trial}: an effect lost or for a lost call: {effects} {calls} after {what}"
        )
        assert all(n == 1 for n in effects.values()), f"trial {trial}: an effect twice"
        for call_id in saved:
            assert starts[call_id] == before[call_id], (
                f"trial {trial}: {call_id} was saved before the kill and ran again"
            )
        in_flight = sum(starts[c] - 1 for c in calls if starts[c] > 1)
        counts["calls_rerun_after_kill_mid_call"] += in_flight
        counts["saved_results_at_kill"] += len(saved)
        counts["tool_calls"] += len(calls)

    report(
        f"sigkill_{backend}",
        trials=TRIALS,
        completed=TRIALS,
        lost_messages=0,
        duplicated_effects=0,
        saved_results_rerun=0,
        kill_window_ms=round(span * 1000),
        **dict(counts),
    )
