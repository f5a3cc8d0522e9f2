"""What the reliability tests run in child processes (started by a forkserver that has
imported this module, so a child starts in milliseconds, not in an interpreter's
import time), and the agent they share with the test."""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

from criogen_graph import Agent, FakeReply, FunctionModel, Storage, ToolContext, tool


def ledger(workdir: Path) -> list[str]:
    path = workdir / "ledger"
    return path.read_text().splitlines() if path.exists() else []


def _append(workdir: Path, line: str) -> None:
    # O_APPEND + fsync: a line is either wholly in the file or not at all, even when the
    # process is killed right after.
    fd = os.open(workdir / "ledger", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


#: What the model asks for, turn by turn: three calls at once, then two, then the answer.
PLAN: list[list[tuple[str, dict[str, Any]]]] = [
    [("charge", {"amount": 10}), ("email", {"to": "a"}), ("charge", {"amount": 20})],
    [("ship", {"order": "A-1"}), ("email", {"to": "b"})],
]


def kill_agent(storage: Storage | str, workdir: Path) -> Agent[Any]:
    """A multi-tool run: three parallel calls, then two, then "done". Each tool writes
    `start <call_id>` when it begins, `effect <call_id>` once per call id (the
    idempotency key a real tool would use: `ctx.call_id` is stable across retries) and
    `end <call_id>` when it returns; the model writes `model <turn>` when a call begins
    and `model-end <turn>` when it answers. So the ledger left by a killed process says
    whether the kill landed while a tool or the model was running."""

    async def effect(ctx: ToolContext, what: str) -> str:
        _append(workdir, f"start {ctx.call_id}")
        await asyncio.sleep(random.uniform(0.003, 0.02))
        if not any(line == f"effect {ctx.call_id}" for line in ledger(workdir)):
            _append(workdir, f"effect {ctx.call_id}")
        await asyncio.sleep(random.uniform(0, 0.005))
        _append(workdir, f"end {ctx.call_id}")
        return f"{what} ok"

    @tool
    async def charge(amount: int, ctx: ToolContext) -> str:
        """Charge a card."""
        return await effect(ctx, f"charged {amount}")

    @tool
    async def email(to: str, ctx: ToolContext) -> str:
        """Send an e-mail."""
        return await effect(ctx, f"mailed {to}")

    @tool
    async def ship(order: str, ctx: ToolContext) -> str:
        """Ship an order."""
        return await effect(ctx, f"shipped {order}")

    async def script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        turn = sum(1 for m in messages if m["role"] == "assistant")
        _append(workdir, f"model {turn}")
        # A real model takes a while to answer: a kill can land during the call.
        await asyncio.sleep(random.uniform(0.003, 0.015))
        _append(workdir, f"model-end {turn}")
        if turn < len(PLAN):
            return FakeReply.tool_calls(*PLAN[turn])
        return "done"

    return Agent(FunctionModel(script), tools=[charge, email, ship], storage=storage)


def running_at_kill(lines: list[str]) -> str | None:
    """What the ledger of a killed process says was running when it died: `"tool"` (a
    tool had begun and not returned), `"model"` (a model call had begun and not
    answered), or None (neither: the run was between steps, saving, or not started)."""
    steps = {"start": ("tool", 1), "end": ("tool", -1), "model": ("model", 1)}
    steps["model-end"] = ("model", -1)
    running: Counter[tuple[str, str]] = Counter()
    for line in lines:
        kind, _, key = line.partition(" ")
        if kind in steps:
            what, n = steps[kind]
            running[what, key] += n
    busy = {what for (what, _), n in running.items() if n > 0}
    return "tool" if "tool" in busy else "model" if "model" in busy else None


async def _send(url: str, thread_id: str, workdir: str, started: Any, done: Any) -> None:
    storage = Storage(url)
    try:
        await storage.open()
        # A first run on a thread of its own, before the kill window opens: the process's
        # one-time costs (lazy imports, first queries) then fall outside it, and the window
        # is spent in the run's steps like a long-lived worker's.
        warmup = Path(workdir) / "warmup"
        warmup.mkdir()
        await kill_agent(storage, warmup).thread(f"{thread_id}-warmup").send("go")
        agent = kill_agent(storage, Path(workdir))
        agent.thread_graph(storage, None)  # compiled before the kill window opens
        started.set()  # the parent kills this process at a random moment from now on
        await agent.thread(thread_id).send("go")
        done.set()
    finally:
        await storage.close()


def send(url: str, thread_id: str, workdir: str, started: Any, done: Any) -> None:
    """Child: start the run (the parent kills it somewhere along the way)."""
    asyncio.run(_send(url, thread_id, workdir, started, done))


async def recover(url: str, thread_id: str, workdir: Path) -> str:
    """What a user does after a crash: send again if the message never got saved, else
    continue the unfinished run. Returns what it did."""
    from criogen_graph import ValidationError

    storage = Storage(url, on_busy="wait", busy_timeout_secs=30)
    try:
        thread = kill_agent(storage, workdir).thread(thread_id)
        if not any(m["role"] == "user" for m in await thread.messages()):
            await thread.send("go")
            return "sent_again"
        try:
            await thread.retry()
        except ValidationError as exc:
            if exc.code != "nothing_to_retry":
                raise
            return "was_done"
        return "retried"
    finally:
        await storage.close()


def recover_child(url: str, thread_id: str, workdir: str, out: Any) -> None:
    """Child: recover the thread in a new process; puts what it did (or its error) on
    `out`."""
    try:
        out.put(asyncio.run(recover(url, thread_id, Path(workdir))))
    except BaseException as exc:
        out.put(f"error: {type(exc).__name__}: {exc}")


def echo_agent(storage: Storage | str) -> Agent[Any]:
    """Answers each message with "ack <message>", taking a few milliseconds to do it."""

    def script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        return FakeReply.text(f"ack {messages[-1]['content']}", delay=0.003)

    return Agent(FunctionModel(script), storage=storage)


async def _hammer(
    url: str, thread_id: str, me: int, sends: int, on_busy: str, go: Any, out: Any
) -> None:
    from criogen_graph import ThreadBusyError

    storage = Storage(url, on_busy=on_busy, busy_timeout_secs=120)
    sent: list[str] = []
    busy = 0
    try:
        await storage.open()
        thread = echo_agent(storage).thread(thread_id, actor=f"p{me}")
        await asyncio.to_thread(go.wait)  # all processes start together
        for n in range(sends):
            text = f"p{me}-{n}"
            try:
                await thread.send(text)
                sent.append(text)
            except ThreadBusyError:
                busy += 1
    finally:
        await storage.close()
    out.put({"me": me, "sent": sent, "busy": busy})


def hammer(url: str, thread_id: str, me: int, sends: int, on_busy: str, go: Any, out: Any) -> None:
    """Child: send `sends` messages to one thread that other processes also write to."""
    try:
        asyncio.run(_hammer(url, thread_id, me, sends, on_busy, go, out))
    except BaseException as exc:
        out.put({"me": me, "error": f"{type(exc).__name__}: {exc}"})


# -- approvals across restarts ----------------------------------------------------------

#: The reply that needs approval: one ungated lookup, two gated calls.
APPROVAL_PLAN: list[tuple[str, dict[str, Any]]] = [
    ("lookup", {"order": "A-7"}),
    ("refund", {"amount": 30}),
    ("charge", {"amount": 5}),
]


def approval_agent(storage: Storage | str, workdir: Path) -> Agent[Any]:
    """One reply with a lookup (ungated) and two gated calls, `refund` and `charge`, then
    "done". Each tool writes `start <call_id>` when it begins and, once per call id,
    `effect <call_id> <tool>:<amount or order>` (what it was run with)."""
    from criogen_graph import Approval

    async def effect(ctx: ToolContext, what: str) -> str:
        _append(workdir, f"start {ctx.call_id}")
        await asyncio.sleep(random.uniform(0, 0.01))
        if not any(line.startswith(f"effect {ctx.call_id} ") for line in ledger(workdir)):
            _append(workdir, f"effect {ctx.call_id} {what}")
        return f"{what} ok"

    @tool
    async def lookup(order: str, ctx: ToolContext) -> str:
        """Look an order up."""
        return await effect(ctx, f"lookup:{order}")

    @tool
    async def refund(amount: int, ctx: ToolContext) -> str:
        """Refund an amount."""
        return await effect(ctx, f"refund:{amount}")

    @tool
    async def charge(amount: int, ctx: ToolContext) -> str:
        """Charge an amount."""
        return await effect(ctx, f"charge:{amount}")

    def script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if not any(m["role"] == "assistant" for m in messages):
            return FakeReply.tool_calls(*APPROVAL_PLAN)
        return "done"

    return Agent(
        FunctionModel(script),
        tools=[lookup, refund, charge],
        approve=[Approval("refund", description="Refunds need a person"), "charge"],
        storage=storage,
    )


def approval_decisions(requests: list[Any]) -> dict[str, Any]:
    """The reviewer's answer: the refund edited down to 25, the charge rejected."""
    from criogen_graph import Decision

    out: dict[str, Any] = {}
    for r in requests:
        if r.tool == "refund":
            out[r.call_id] = Decision.edit({"amount": 25})
        else:
            out[r.call_id] = Decision.reject("not this one")
    return out


async def _suspend(url: str, thread_id: str, workdir: str, out: Any, hold: Any) -> None:
    storage = Storage(url)
    await storage.open()
    reply = await approval_agent(storage, Path(workdir)).thread(thread_id).send("go")
    out.put(
        {"needs_approval": reply.needs_approval, "tools": sorted(r.tool for r in reply.approvals)}
    )
    await asyncio.to_thread(hold.wait)  # the parent kills this process here


def suspend(url: str, thread_id: str, workdir: str, out: Any, hold: Any) -> None:
    """Child: send until the run waits for approval, report it, then wait to be killed."""
    try:
        asyncio.run(_suspend(url, thread_id, workdir, out, hold))
    except BaseException as exc:
        out.put({"error": f"{type(exc).__name__}: {exc}"})


async def _answer(url: str, thread_id: str, workdir: str, started: Any, done: Any) -> None:
    storage = Storage(url)
    try:
        await storage.open()
        agent = approval_agent(storage, Path(workdir))
        agent.thread_graph(storage, None)  # compiled before the kill window opens
        thread = agent.thread(thread_id, actor="reviewer-b")
        pending = await thread.pending_approvals()
        started.set()  # the parent may kill this process at a random moment from now on
        await thread.decide(approval_decisions(pending))
        done.set()
    finally:
        await storage.close()


def answer(url: str, thread_id: str, workdir: str, started: Any, done: Any) -> None:
    """Child: answer the pending approvals (the parent may kill it along the way)."""
    asyncio.run(_answer(url, thread_id, workdir, started, done))


async def finish_approved(url: str, thread_id: str, workdir: Path) -> str:
    """What a reviewer does in a third process: answer whatever is still pending, else
    continue the unfinished run. Returns what it did."""
    from criogen_graph import ValidationError

    storage = Storage(url, on_busy="wait", busy_timeout_secs=30)
    try:
        thread = approval_agent(storage, workdir).thread(thread_id, actor="reviewer-c")
        pending = await thread.pending_approvals()
        if pending:
            await thread.decide(approval_decisions(pending))
            return "answered_again"
        try:
            await thread.retry()
        except ValidationError as exc:
            if exc.code != "nothing_to_retry":
                raise
            return "was_done"
        return "retried"
    finally:
        await storage.close()


def finish_child(url: str, thread_id: str, workdir: str, out: Any) -> None:
    """Child: `finish_approved` in a new process; puts what it did (or its error) on `out`."""
    try:
        out.put(asyncio.run(finish_approved(url, thread_id, Path(workdir))))
    except BaseException as exc:
        out.put(f"error: {type(exc).__name__}: {exc}")


async def _stuck_in_first_call(url: str, thread_id: str, started: Any) -> None:
    storage = Storage(url)
    try:
        await storage.open()

        async def script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
            started.set()
            await asyncio.Event().wait()  # never answers: the parent kills the process

        await (
            Agent(FunctionModel(script), storage=storage)
            .thread(thread_id)
            .send("my order 1234 never arrived")
        )
    finally:
        await storage.close()


def stuck_in_first_call(url: str, thread_id: str, started: Any) -> None:
    """Child: send a message to a model that never answers (the parent kills it while
    the model call runs)."""
    asyncio.run(_stuck_in_first_call(url, thread_id, started))
