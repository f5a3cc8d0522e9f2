"""What the pinned-answer tests run, in the test process and in child processes: an agent
whose model asks to refund 50, then (once that call is answered) 5000, then answers
"done"; every refund that runs is appended to a ledger file."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from criogen_graph import Agent, FakeReply, FunctionModel, Storage, ValidationError, tool


def refunds(workdir: Path) -> list[str]:
    path = workdir / "refunds"
    return path.read_text().splitlines() if path.exists() else []


def _append(workdir: Path, line: str) -> None:
    fd = os.open(workdir / "refunds", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def refund_agent(
    storage: Storage | str,
    workdir: Path,
    amounts: Sequence[int] = (50, 5000),
    *,
    reuse_ids: bool = True,
) -> Agent[Any]:
    """The model asks for one gated `refund` per answered call, in `amounts` order, then
    says "done". With `reuse_ids`, every request has the id `call_1` (as some
    OpenAI-compatible servers number the calls of each reply from 1), so only what the
    reviewer saw, not the id, tells two requests apart."""

    @tool
    async def refund(amount: int) -> str:
        """Refund an amount."""
        _append(workdir, f"refund {amount}")
        return f"refunded {amount}"

    def script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        answered = sum(1 for m in messages if m["role"] == "tool")
        if answered < len(amounts):
            call_id = "call_1" if reuse_ids else f"call_{answered + 1}"
            return FakeReply.tool_call("refund", {"amount": amounts[answered]}, id=call_id)
        return "done"

    return Agent(FunctionModel(script), tools=[refund], approve=["refund"], storage=storage)


def observe_reads(storage: Storage, on_read: Callable[[], Any] | None = None) -> list[int]:
    """Count the thread reads of an open storage (`[n]`, growing; `on_read` is called
    after each): the test waits for a reviewer's call to have read the thread before it
    lets the thread go."""
    saver: Any = storage.checkpointer
    seen = [0]
    original: Callable[..., Any] = saver.aget_tuple

    async def counted(*args: Any, **kwargs: Any) -> Any:
        try:
            return await original(*args, **kwargs)
        finally:
            seen[0] += 1
            if on_read is not None:
                on_read()

    saver.aget_tuple = counted
    return seen


def outcome(result: Any) -> dict[str, Any]:
    """What a reviewer's call came to, as plain data (it crosses processes)."""
    if isinstance(result, ValidationError):
        return {"result": result.code, "message": str(result)}
    if isinstance(result, BaseException):
        return {"result": "error", "message": f"{type(result).__name__}: {result}"}
    return {
        "result": "applied",
        "pending": [(r.tool, r.args) for r in result.approvals],
        "version": result.version,
    }


async def _review(
    url: str, thread_id: str, workdir: str, who: str, pin: Any, go: Any, out: Any
) -> None:
    storage = Storage(url, on_busy="wait", busy_timeout_secs=120)
    try:
        await storage.open()
        thread = refund_agent(storage, Path(workdir)).thread(thread_id, actor=who)
        if pin is None:
            # A bare approve(): it pins what is pending when it is called. The parent
            # holds the thread until both reviewers have read it.
            read = asyncio.Event()
            observe_reads(storage, read.set)
            task = asyncio.ensure_future(thread.approve())
            await asyncio.wait(
                [task, asyncio.ensure_future(read.wait())],
                return_when=asyncio.FIRST_COMPLETED,
            )
            out.put({"who": who, "read": True})
        else:
            await asyncio.to_thread(go.wait, 60)
            task = asyncio.ensure_future(thread.approve(expected=pin))
        try:
            result: Any = await task
        except Exception as exc:
            result = exc
        out.put({"who": who, **outcome(result)})
    finally:
        await storage.close()


def review(url: str, thread_id: str, workdir: str, who: str, pin: Any, go: Any, out: Any) -> None:
    """Child: one reviewer approving the thread (pinned to `pin`, or bare when None)."""
    try:
        asyncio.run(_review(url, thread_id, workdir, who, pin, go, out))
    except BaseException as exc:
        out.put({"who": who, "result": "error", "message": f"{type(exc).__name__}: {exc}"})
