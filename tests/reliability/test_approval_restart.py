"""An approval survives the death of the process that asked for it and of the one that
answered it: a run waits for approval in process A (then A is SIGKILLed), process B
answers it (edit one gated call, reject the other) and is SIGKILLed at a random moment
of that answer, process C finishes what is left. Every trial ends with the decision made
once, applied once, to the call it was made for, and recorded once."""

from __future__ import annotations

import asyncio
import hashlib
import json
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
from tests.reliability._workers import APPROVAL_PLAN, approval_agent, ledger
from tests.reliability.conftest import run_child

TRIALS = 15


def sha(args: dict[str, Any]) -> str:
    return hashlib.sha256(
        json.dumps(args, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


async def suspended_then_killed(ctx: Any, url: str, thread_id: str, workdir: Path) -> None:
    """Process A sends, reports the suspension, and is SIGKILLed while still running."""
    from tests.reliability import _workers

    out, hold = ctx.Queue(), ctx.Event()
    proc = run_child(ctx, _workers.suspend, url, thread_id, str(workdir), out, hold)
    first = await asyncio.to_thread(out.get, True, 60)
    assert first == {"needs_approval": True, "tools": ["charge", "refund"]}, first
    proc.kill()
    await asyncio.to_thread(proc.join, 30)
    assert proc.exitcode == -signal.SIGKILL
    assert ledger(workdir) == [], "a tool ran before the decision"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_approval_survives_killed_asker_and_killed_answerer(
    backend: str, tmp_path: Path, forkserver: Any
) -> None:
    from tests.reliability import _workers

    url = storage_url(backend, tmp_path)
    rng = random.Random(f"{backend}-{uuid.uuid4().hex}")

    # How long an answer takes here, to spread B's kill points over it.
    spans = []
    for probe in range(2):
        workdir = tmp_path / f"probe-{probe}"
        workdir.mkdir()
        thread_id = f"probe-{uuid.uuid4().hex}"
        await suspended_then_killed(forkserver, url, thread_id, workdir)
        started, done = forkserver.Event(), forkserver.Event()
        proc = run_child(forkserver, _workers.answer, url, thread_id, str(workdir), started, done)
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
        thread_id = f"approval-{backend}-{trial}-{uuid.uuid4().hex}"
        await suspended_then_killed(forkserver, url, thread_id, workdir)

        started, done = forkserver.Event(), forkserver.Event()
        proc = run_child(forkserver, _workers.answer, url, thread_id, str(workdir), started, done)
        assert await asyncio.to_thread(started.wait, 30), "the answering child never started"
        await asyncio.sleep(rng.uniform(0, span * 1.2))  # B's kill point, chosen at random
        proc.kill()
        await asyncio.to_thread(proc.join, 30)
        counts["answerer_killed" if proc.exitcode == -signal.SIGKILL else "answer_finished"] += 1

        out = forkserver.Queue()
        proc = run_child(forkserver, _workers.finish_child, url, thread_id, str(workdir), out)
        what = await asyncio.to_thread(out.get, True, 60)
        await asyncio.to_thread(proc.join, 60)
        assert not what.startswith("error"), f"trial {trial}: finishing failed: {what}"
        counts[what] += 1

        storage = Storage(url)
        try:
            thread = approval_agent(storage, workdir).thread(thread_id)
            assert await thread.pending_approvals() == []
            messages = await thread.messages()
            audit = await storage.audit(thread_id)
        finally:
            await storage.close()

        roles = [m["role"] for m in messages]
        assert roles == ["user", "assistant", "tool", "tool", "tool", "assistant"], (
            f"trial {trial}: {roles} after {what}"
        )
        assert messages[-1]["content"] == "done"
        calls = {c["name"]: c["id"] for c in messages[1]["tool_calls"]}
        assert sorted(calls) == sorted(name for name, _ in APPROVAL_PLAN)
        results = {m["tool_call_id"]: str(m["content"]) for m in messages if m["role"] == "tool"}
        assert "refund:25 ok" in results[calls["refund"]]
        assert "not this one" in results[calls["charge"]]
        assert results[calls["lookup"]] == "lookup:A-7 ok"

        lines = ledger(workdir)
        effects = Counter(line.split(maxsplit=1)[1] for line in lines if line.startswith("effect"))
        assert effects == Counter(
            {f"{calls['lookup']} lookup:A-7": 1, f"{calls['refund']} refund:25": 1}
        ), f"trial {trial}: effects {effects} after {what}"
        starts = Counter(line.split()[1] for line in lines if line.startswith("start"))
        assert calls["charge"] not in starts, f"trial {trial}: the rejected call ran"

        decided = [r for r in audit if r["action"] == "decide"]
        assert len(decided) == 1, f"trial {trial}: {len(decided)} decision records after {what}"
        record = decided[0]
        assert record["actor"] in ("reviewer-b", "reviewer-c")
        by_call = {d["call_id"]: d for d in record["details"]["decisions"]}
        assert set(by_call) == {calls["refund"], calls["charge"]}
        refund = by_call[calls["refund"]]
        assert refund["decision"]["type"] == "edit" and refund["args"] == {"amount": 30}
        assert refund["approved_args_sha256"] == sha({"amount": 25})
        assert by_call[calls["charge"]]["decision"]["type"] == "reject"
        counts["decided_by_" + record["actor"]] += 1
        counts["tool_calls"] += len(calls)
        counts["effects"] += sum(effects.values())

    report(
        f"approval_restart_{backend}",
        trials=TRIALS,
        completed=TRIALS,
        lost_decisions=0,
        decisions_applied_twice=0,
        rejected_calls_run=0,
        kill_window_ms=round(span * 1000),
        **dict(counts),
    )
