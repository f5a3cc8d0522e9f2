"""SIGKILL at random points of a multi-tool run, then recovery in a new process: every
thread completes, no message is lost or doubled, no saved tool result is run again, and
every tool effect happens exactly once (tools keyed by their stable call ids).

The ledger the killed process leaves says where each kill landed (while a tool ran, while
the model answered, between steps, after the run); a good share must land mid-run, and
every count reported is measured from the recovered threads and ledgers."""

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
from tests.reliability._workers import PLAN, kill_agent, ledger, running_at_kill
from tests.reliability.conftest import run_child

TRIALS = 50


#: The thread after a run, message by message.
EXPECTED_ROLES = [
    "user",
    "assistant",
    "tool",
    "tool",
    "tool",
    "assistant",
    "tool",
    "tool",
    "assistant",
]
#: The least share of trials whose kill must land while a tool or the model was running
#: (a kill after the run, or only ever between steps, tests far less than it claims to).
#: Measured: 40-80% of the trials, the lower figures on PostgreSQL on a loaded machine,
#: where more of the run is spent in round trips between the steps.
MIN_MID_RUN_SHARE = 0.2


async def state_at_kill(url: str, thread_id: str) -> tuple[set[str], bool]:
    """The call ids whose results are saved (in the head's transcript or its pending
    writes), and whether the saved transcript already holds the final answer."""
    storage = Storage(url)
    try:
        await storage.open()
        tup = await storage.checkpointer.aget_tuple({"configurable": {"thread_id": thread_id}})
        if tup is None:
            return set(), False
        messages = await kill_agent(storage, Path()).thread(thread_id).messages()
        ids = {m["tool_call_id"] for m in messages if m["role"] == "tool"}
        for _, channel, value in tup.pending_writes or ():
            if channel == "messages":
                items = value if isinstance(value, list | tuple) else [value]
                ids |= {m["tool_call_id"] for m in items if m.get("role") == "tool"}
        last = messages[-1] if messages else {}
        return ids, last.get("role") == "assistant" and last.get("content") == "done"
    finally:
        await storage.close()


async def final_messages(url: str, thread_id: str) -> list[dict[str, Any]]:
    storage = Storage(url)
    try:
        return await kill_agent(storage, Path()).thread(thread_id).messages()
    finally:
        await storage.close()


def where_the_kill_landed(exitcode: int | None, at_kill: list[str], finished: bool) -> str:
    if exitcode != -signal.SIGKILL:
        return "finished_before_kill"
    running = running_at_kill(at_kill)
    if running is not None:
        return f"killed_mid_{running}"
    return "killed_after_run" if finished else "killed_between_steps"


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

    # Every count below is measured; problems are collected so the report shows the
    # counts of a failing run too.
    counts: Counter[str] = Counter()
    for key in (
        "completed", "lost_messages", "duplicated_messages", "results_missing",
        "lost_effects", "duplicated_effects", "saved_results_rerun",
    ):  # fmt: skip
        counts[key] = 0
    problems: list[str] = []
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

        at_kill = ledger(workdir)
        before = Counter(line.split()[1] for line in at_kill if line.startswith("start "))
        saved, finished = await state_at_kill(url, thread_id)
        landed = where_the_kill_landed(proc.exitcode, at_kill, finished)
        counts[landed] += 1

        out = forkserver.Queue()
        proc = run_child(forkserver, _workers.recover_child, url, thread_id, str(workdir), out)
        what = await asyncio.to_thread(out.get, True, 60)
        await asyncio.to_thread(proc.join, 60)
        counts["recovery_" + what.split(":")[0].replace(" ", "_")] += 1

        messages = await final_messages(url, thread_id)
        roles = [m["role"] for m in messages]
        calls = [
            c["id"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or ()
        ]
        names = [
            c["name"]
            for m in messages
            if m["role"] == "assistant"
            for c in m.get("tool_calls") or ()
        ]
        results = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
        lines = ledger(workdir)
        effects = Counter(line.split()[1] for line in lines if line.startswith("effect "))
        starts = Counter(line.split()[1] for line in lines if line.startswith("start "))

        lost = sum((Counter(EXPECTED_ROLES) - Counter(roles)).values())
        doubled = sum((Counter(roles) - Counter(EXPECTED_ROLES)).values())
        missing = len(set(calls) - set(results))
        lost_effects = len(set(calls) - set(effects)) + len(set(effects) - set(calls))
        doubled_effects = sum(n - 1 for n in effects.values())
        rerun = sorted(c for c in saved if starts[c] != before[c])
        counts["lost_messages"] += lost
        counts["duplicated_messages"] += doubled
        counts["results_missing"] += missing
        counts["lost_effects"] += lost_effects
        counts["duplicated_effects"] += doubled_effects
        counts["saved_results_rerun"] += len(rerun)
        counts["calls_rerun_after_kill_mid_call"] += sum(
            starts[c] - 1 for c in calls if starts[c] > 1
        )
        counts["saved_results_at_kill"] += len(saved)
        counts["tool_calls"] += len(calls)

        right = (
            roles == EXPECTED_ROLES
            and messages[0]["content"] == "go"
            and messages[-1]["content"] == "done"
            and names == [n for turn in PLAN for n, _ in turn]
            and sorted(results) == sorted(calls)
        )
        counts["completed"] += right and not (lost_effects or doubled_effects or rerun)
        if what.startswith("error") or not right or lost_effects or doubled_effects or rerun:
            problems.append(
                f"trial {trial} ({landed}, recovery {what}): roles {roles}, names {names}, "
                f"effects {dict(effects)}, saved at kill and run again {rerun}; "
                f"saved {sorted(saved)}; ledger {lines}"
            )

    mid_run = counts["killed_mid_tool"] + counts["killed_mid_model"]
    report(
        f"sigkill_{backend}",
        trials=TRIALS,
        kill_window_ms=round(span * 1000),
        **dict(counts),
    )
    assert not problems, f"{len(problems)} of {TRIALS} trials went wrong; first: {problems[0]}"
    assert counts["completed"] == TRIALS
    # The suite tests what it claims only if its kills land mid-run: a good share while a
    # tool or the model was running (each of the two at least once).
    assert mid_run >= MIN_MID_RUN_SHARE * TRIALS, f"too few kills landed mid-run: {dict(counts)}"
    assert counts["killed_mid_tool"] and counts["killed_mid_model"], dict(counts)
