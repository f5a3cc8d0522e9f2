"""`Thread`: one conversation kept in the agent's storage (a LangGraph thread)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from langgraph.types import Command

from criogen_graph._aio import uncancelled
from criogen_graph._observe import observe
from criogen_graph._pins import Expected, Pin
from criogen_graph.adapters.storage.base import SEGMENT, Segment, check_thread_id, record
from criogen_graph.errors import (
    ThreadSuspendedError,
    ValidationError,
)
from criogen_graph.nodes.approval import APPROVAL_INTERRUPT, check_decisions, decision_details
from criogen_graph.nodes.events import API_RUN, STREAM_SINK
from criogen_graph.nodes.state import new_run, not_run_messages
from criogen_graph.redact import CURRENT, effective
from criogen_graph.results import ApprovalRequest, Decision, PendingApprovals, Reply
from criogen_graph.stream import ApprovalNeededEvent, MessageEvent, Stream, to_event

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import CheckpointTuple

    from criogen_graph.agent import Agent
    from criogen_graph.background import RunHandle

__all__ = ["Thread"]

Output = TypeVar("Output")

# LangGraph's reserved write channels (pending writes of a checkpoint).
_INTERRUPT = "__interrupt__"
_ERROR = "__error__"


class _Head:
    """What the latest checkpoint of a thread says, read without rebuilding the
    transcript (a `DeltaChannel` would replay its writes)."""

    __slots__ = (
        "exists",
        "has_error",
        "has_interrupt",
        "id",
        "run",
        "source",
        "state",
        "step",
        "version",
    )

    def __init__(self, tup: CheckpointTuple | None) -> None:
        self.exists = tup is not None
        if tup is None:
            self.id = None
            self.run: dict[str, Any] = {}
            self.state: dict[str, Any] = {}
            self.source = None
            self.step = -2
            self.version = 0
            self.has_interrupt = self.has_error = False
            return
        self.id = tup.config["configurable"]["checkpoint_id"]
        values = tup.checkpoint["channel_values"]
        self.run = values.get("run") or {}
        self.state = values.get("state") or {}
        meta = tup.metadata or {}
        self.source = meta.get("source")
        self.step = int(meta.get("step", -1))
        self.version = checkpoint_version(meta)
        writes = tup.pending_writes or ()
        self.has_interrupt = any(w[1] == _INTERRUPT for w in writes)
        self.has_error = any(w[1] == _ERROR for w in writes)

    @property
    def finished(self) -> bool:
        """The last run ended (or there was none): a new input needs no clean-up."""
        if not self.exists:
            return True
        # An "input" checkpoint holds the values before its input: a run starts there.
        return (
            self.source != "input"
            and self.run.get("stop_reason") is not None
            and not self.has_error
        )


def checkpoint_version(meta: Mapping[str, Any]) -> int:
    """A checkpoint's version: it grows by one with every checkpoint saved on the thread,
    across branches (rewinds continue from the newest)."""
    step = int(meta.get("step", -1))
    if "criogen_v0" in meta:
        return int(meta["criogen_v0"]) + step - int(meta["criogen_s0"])
    return step + 2  # a checkpoint written outside the API (e.g. LangGraph Studio)


def _unencodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _ms(ts: str | None) -> int | None:
    if not ts:
        return None
    return int(datetime.fromisoformat(ts).timestamp() * 1000)


class Thread(Generic[Output]):
    """One conversation, kept in the agent's storage (made by `agent.thread(id)`).

    Every call loads the saved conversation, runs, and saves the result, so a thread
    survives restarts when the storage is a database. A run that stops for approval waits
    in the thread until `approve`, `reject` or `decide` continues it; a failed or cancelled
    run is saved too, and `retry` continues it without running again the tool calls that
    had finished. Calls that run hold the thread: see the storage's `on_busy`.

    A thread id is a non-empty str of at most 1,024 bytes in UTF-8 (`MAX_THREAD_ID_BYTES`:
    1,024 ASCII characters, 256 of four bytes each) with no NUL character and no lone
    surrogate, so that every storage can keep it; any other id raises `ValidationError`
    at once (hash a longer key into an id).
    """

    def __init__(self, agent: Agent[Output], thread_id: str, *, actor: str | None = None) -> None:
        # An id no backend can keep is refused here, before it reaches any lock or table.
        check_thread_id(thread_id)
        if actor is not None and not isinstance(actor, str):
            raise ValidationError("actor must be a str", code="invalid_type")
        if actor is not None and ("\x00" in actor or _unencodable(actor)):
            raise ValidationError(
                "actor must not contain a NUL character or a lone surrogate", code="invalid_value"
            )
        self.agent = agent
        self.id = thread_id
        self.actor = actor

    def __repr__(self) -> str:
        return f"<Thread {self.id!r} of {self.agent.name!r}>"

    # -- running -----------------------------------------------------------------------

    async def send(self, input: str, *, state: Mapping[str, Any] | None = None) -> Reply[Output]:
        """One turn: the stored conversation plus `input`; saved as the thread's new head.

        Raises `ThreadSuspendedError` while approvals are pending, `ThreadBusyError` while
        another run holds the thread, and the run errors (`ModelError`,
        `LimitExceededError`, `ToolExecutionError`, `CancelledError`); a failed or cancelled
        run is saved, and `retry()` continues it.
        """
        from criogen_graph.agent import _check_state, _user_message

        run_state = _check_state(state)
        if self.agent._spec.memory is not None:
            self.agent._spec.memory.pool(run_state)  # no model call without the scope key
        return await self._send(
            _user_message(input, effective(self.agent._spec.redact)), run_state, None
        )

    def stream(self, input: str, *, state: Mapping[str, Any] | None = None) -> Stream[Output]:
        """`send`, streaming its events: `async for event in stream`, then
        `await stream.reply()`. Cancel with `stream.cancel()` or by leaving the loop."""
        from criogen_graph.agent import _check_state, _user_message

        user = _user_message(input, effective(self.agent._spec.redact))
        run_state = _check_state(state)
        if self.agent._spec.memory is not None:
            self.agent._spec.memory.pool(run_state)
        return Stream(lambda s: self._send(user, run_state, s))

    def stream_approve(self, *, expected: Expected | None = None) -> Stream[Output]:
        """`approve`, streaming the events of the run it continues (a bare call pins
        what is pending when the stream starts)."""
        pin = Pin.of(expected)
        return Stream(lambda s: self._answer("approve", lambda requests: "approve", s, pin))

    def stream_reject(
        self, message: str = "rejected", *, expected: Expected | None = None
    ) -> Stream[Output]:
        """`reject`, streaming the events of the run it continues."""
        if not isinstance(message, str):
            raise ValidationError("reject message must be a str", code="invalid_type")
        pin = Pin.of(expected)
        return Stream(
            lambda s: self._answer(
                "reject",
                lambda requests: {r["call_id"]: Decision.reject(message) for r in requests},
                s,
                pin,
            )
        )

    def stream_decide(
        self,
        decisions: Mapping[str, Decision | Mapping[str, Any] | str],
        *,
        expected: Expected | None = None,
    ) -> Stream[Output]:
        """`decide`, streaming the events of the run it continues."""
        if not isinstance(decisions, Mapping):
            raise ValidationError("decide takes a dict {call_id: Decision}", code="invalid_type")
        chosen = dict(decisions)
        pin = Pin.of(expected)
        return Stream(lambda s: self._answer("decide", lambda requests: chosen, s, pin))

    def stream_retry(self) -> Stream[Output]:
        """`retry`, streaming the events of the run it continues."""
        return Stream(self._retry)

    async def _send(
        self, user: dict[str, Any], run_state: dict[str, Any], stream: Stream[Output] | None
    ) -> Reply[Output]:
        async def prepare(
            head: _Head, graph: Any, cfg: RunnableConfig
        ) -> tuple[Any, str, dict[str, Any]]:
            if head.has_interrupt and await self._suspended(graph, cfg):
                raise self._suspended_error()
            prefix: list[dict[str, Any]] = []
            if not head.finished:
                prefix = await self._close_unfinished(graph, cfg)
            run_id = uuid.uuid4().hex
            inp = {"messages": (*prefix, user), "run": new_run(run_id), "state": run_state}
            if stream is not None:
                for m in (*prefix, user):
                    stream.emit(MessageEvent(m))
            return inp, run_id, {"input": user["content"]}

        return await self._segment(
            "send", prepare, run_state=run_state, new_messages=[user], stream=stream
        )

    async def approve(self, *, expected: Expected | None = None) -> Reply[Output]:
        """Approve every pending call and continue.

        `expected` pins the answer to what the reviewer was shown: the `Reply` that
        asked, its `approvals` or `pending_approvals()` as they are (these name the
        checkpoint that asked, so even the same request asked again under the same call
        id is told apart), a `Reply.version` or `Reply.checkpoint_id`, or the requests
        as dicts or a list of call ids (pinning ids, tools and args; ids alone). If the
        thread no longer waits on exactly that when the answer gets the thread (another
        answer came first, the run moved on), it raises `ValidationError(code="stale")`
        and changes nothing. Without `expected`, the call pins what was pending when it
        was made, so a call queued behind another (`on_busy="wait"`) never answers a
        request asked meanwhile.
        """
        return await self._answer("approve", lambda requests: "approve", None, Pin.of(expected))

    async def reject(
        self, message: str = "rejected", *, expected: Expected | None = None
    ) -> Reply[Output]:
        """Reject every pending call; the model is told `message` instead of each result.
        `expected`: as for `approve`."""
        if not isinstance(message, str):
            raise ValidationError("reject message must be a str", code="invalid_type")
        return await self._answer(
            "reject",
            lambda requests: {r["call_id"]: Decision.reject(message) for r in requests},
            None,
            Pin.of(expected),
        )

    async def decide(
        self,
        decisions: Mapping[str, Decision | Mapping[str, Any] | str],
        *,
        expected: Expected | None = None,
    ) -> Reply[Output]:
        """One `Decision` per pending call, keyed by `call_id` (from `reply.approvals`).
        The keys name the calls; `expected` (as for `approve`) pins which request each
        id was, since a later reply may reuse an id."""
        if not isinstance(decisions, Mapping):
            raise ValidationError("decide takes a dict {call_id: Decision}", code="invalid_type")
        chosen = dict(decisions)
        return await self._answer("decide", lambda requests: chosen, None, Pin.of(expected))

    async def retry(self) -> Reply[Output]:
        """Continue a failed or interrupted run. Tool calls that finished (and were saved)
        before the failure are not run again."""
        return await self._retry(None)

    async def _retry(self, stream: Stream[Output] | None) -> Reply[Output]:
        async def prepare(
            head: _Head, graph: Any, cfg: RunnableConfig
        ) -> tuple[Any, str, dict[str, Any]]:
            if not head.exists:
                raise ValidationError(
                    f"thread {self.id!r} has nothing to retry", code="nothing_to_retry"
                )
            snap = await graph.aget_state(cfg)
            if snap.interrupts:
                raise self._suspended_error()
            # A step whose tasks all finished (their writes saved) before the run was
            # cancelled has no `next`, but its tasks are still to be committed.
            if not snap.next and not snap.tasks:
                stop = head.run.get("stop_reason")
                why = f"its last run ended ({stop})" if stop else "no run is unfinished"
                raise ValidationError(
                    f"thread {self.id!r} has nothing to retry: {why}", code="nothing_to_retry"
                )
            run_id = head.run.get("run_id") or uuid.uuid4().hex
            return None, run_id, {}

        return await self._segment("retry", prepare, resume=True, stream=stream)

    # -- background runs ---------------------------------------------------------------------

    async def submit(
        self, input: str, *, state: Mapping[str, Any] | None = None
    ) -> RunHandle[Output]:
        """`send` as a background run: queued at once, run by a worker (`criogen-graph
        worker` on PostgreSQL; a task of this process on memory:// and SQLite). Returns a
        `RunHandle` (`id`, `status()`, `reply()`, `cancel()`). The runs submitted to one
        thread run one at a time, in order."""
        from criogen_graph.background import submit

        return await submit(self, "send", input=input, state=state)

    async def submit_approve(self, *, expected: Expected | None = None) -> RunHandle[Output]:
        """`approve` as a background run; a bare call pins what waits now."""
        from criogen_graph.background import submit

        return await submit(self, "approve", expected=expected)

    async def submit_reject(
        self, message: str = "rejected", *, expected: Expected | None = None
    ) -> RunHandle[Output]:
        """`reject` as a background run."""
        from criogen_graph.background import submit

        return await submit(self, "reject", message=message, expected=expected)

    async def submit_decide(
        self,
        decisions: Mapping[str, Decision | Mapping[str, Any] | str],
        *,
        expected: Expected | None = None,
    ) -> RunHandle[Output]:
        """`decide` as a background run."""
        from criogen_graph.background import submit

        return await submit(self, "decide", decisions=decisions, expected=expected)

    async def submit_retry(self) -> RunHandle[Output]:
        """`retry` as a background run."""
        from criogen_graph.background import submit

        return await submit(self, "retry")

    def run(self, run_id: str) -> RunHandle[Output]:
        """A handle on a background run submitted earlier (by any process sharing the
        storage), from its id."""
        from criogen_graph.background import handle

        return handle(self, run_id)

    # -- reading ---------------------------------------------------------------------------

    async def messages(self) -> list[dict[str, Any]]:
        """The stored conversation."""
        graph, cfg = await self._graph()
        snap = await graph.aget_state(cfg)
        return list(snap.values.get("messages") or [])

    async def pending_approvals(self) -> PendingApprovals:
        """The calls waiting for a decision, read from storage (works after a restart and
        from another process sharing the storage); empty when the thread is not waiting.
        The list names the checkpoint that asked (`checkpoint_id`, `version`): pass it
        to `approve(expected=...)` to answer exactly these."""
        graph, cfg = await self._graph()
        snap = await graph.aget_state(cfg)
        checkpoint_id = (snap.config or {}).get("configurable", {}).get("checkpoint_id")
        return PendingApprovals(
            (ApprovalRequest.from_dict(r) for _, r in self._requests(snap)),
            checkpoint_id=checkpoint_id,
            version=checkpoint_version(snap.metadata) if checkpoint_id else None,
        )

    async def history(self, limit: int = 20) -> list[dict[str, Any]]:
        """Checkpoints of the current branch, newest first: `{id, parent_id, version,
        source, status, run_id, step, created_at_ms}`."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValidationError("history limit must be a positive int", code="invalid_value")
        storage = self.agent.storage
        await storage._ensure_open()
        saver = storage.checkpointer
        out: list[dict[str, Any]] = []
        cfg: dict[str, Any] = {"configurable": {"thread_id": self.id, "checkpoint_ns": ""}}
        while len(out) < limit:
            tup = await saver.aget_tuple(cfg)  # type: ignore[arg-type]
            if tup is None:
                break
            out.append(_entry(tup))
            if tup.parent_config is None:
                break
            cfg = dict(tup.parent_config)
        return out

    # -- managing ----------------------------------------------------------------------------

    async def rewind(self, checkpoint_id: str) -> dict[str, Any]:
        """Make an older checkpoint current again, saved as a new head. Newer checkpoints
        stay stored but leave the history; the next call runs from there. A checkpoint
        where the run waited for approval waits again (answer it anew); one in the
        middle of a run leaves the run unfinished, and `retry()` continues it from there
        (the new head is then a copy of that checkpoint, beside it in the history)."""
        if not isinstance(checkpoint_id, str) or not checkpoint_id:
            raise ValidationError("rewind takes a checkpoint id (a str)", code="invalid_type")
        graph, cfg = await self._graph()
        storage = self.agent.storage
        async with storage._hold(self.id):
            saver = storage.checkpointer
            head = _Head(await saver.aget_tuple(cfg))
            target_cfg: Any = {
                "configurable": {
                    "thread_id": self.id,
                    "checkpoint_ns": "",
                    "checkpoint_id": checkpoint_id,
                }
            }
            target = await saver.aget_tuple(target_cfg)
            if target is None:
                raise ValidationError(
                    f"thread {self.id!r} has no checkpoint {checkpoint_id!r}; see thread.history()",
                    code="unknown",
                )
            step = int((target.metadata or {}).get("step", -1)) + 1
            run_id = head.run.get("run_id")
            seg = Segment(self.id, run_id or "", self.actor)
            seg.audit.append(
                record(
                    "rewind",
                    self.id,
                    run_id=run_id,
                    actor=self.actor,
                    checkpoint_id=checkpoint_id,
                    previous_head=head.id,
                )
            )
            target_snap = await graph.aget_state(target_cfg)
            meta = {"criogen_v0": head.version + 1, "criogen_s0": step, "actor": self.actor}
            token = SEGMENT.set(seg)
            try:
                if not target_snap.next and not target_snap.tasks:
                    # Where a run ended: a new head on top of it.
                    new_cfg = await graph.aupdate_state({**target_cfg, "metadata": meta}, None)
                else:
                    # In the middle of a run: a copy, which keeps the pending tasks (an
                    # update would drop them); its parent is the checkpoint's parent.
                    seg.put_metadata = {**meta, "run_id": (target.metadata or {}).get("run_id")}
                    new_cfg = await graph.aupdate_state(target_cfg, None, as_node="__copy__")
                    seg.put_metadata = None
                    if target_snap.interrupts and set(target_snap.next) == {"approval"}:
                        # Ask for the approval again: only the approval node runs, and
                        # it stops at once (it has no effects).
                        await graph.ainvoke(
                            None, {"configurable": {"thread_id": self.id}}, durability="sync"
                        )
            finally:
                SEGMENT.reset(token)
            if seg.audit:
                await storage._backend.write_audit(seg.audit)  # type: ignore[union-attr]
            tup = await saver.aget_tuple(new_cfg)
        assert tup is not None
        return _entry(tup)

    async def delete(self, *, audit: bool = False) -> bool:
        """Delete the thread and its checkpoints; `True` if it existed. Its audit records
        are kept unless `audit=True`; either way the deletion is recorded (`delete`, with
        `existed` and `audit_deleted`). Deleting and recording are one transaction: a crash
        leaves the thread whole and unrecorded, or deleted and recorded once."""
        if not isinstance(audit, bool):
            raise ValidationError("delete(audit=...) takes a bool", code="invalid_type")
        storage = self.agent.storage
        backend = await storage._ensure_open()
        thread_id, actor = self.id, self.actor

        def make_record(existed: bool, removed: int) -> dict[str, Any]:
            return record(
                "delete",
                thread_id,
                run_id=None,
                actor=actor,
                existed=existed,
                audit_deleted=removed,
            )

        async with storage._hold(self.id):
            existed = await backend.delete_thread(self.id, make_record, audit=audit)
        return existed

    # -- internals ----------------------------------------------------------------------------

    async def _graph(self) -> tuple[Any, RunnableConfig]:
        storage = self.agent.storage
        await storage._ensure_open()
        store = await storage.get_store() if self.agent._spec.memory is not None else None
        graph = self.agent._thread_graph(storage, store)
        return graph, {"configurable": {"thread_id": self.id}}

    def _suspended_error(self) -> ThreadSuspendedError:
        return ThreadSuspendedError(
            f"thread {self.id!r} waits for approval: answer with approve(), reject() or "
            "decide() first (pending_approvals() lists the calls)"
        )

    @staticmethod
    def _requests(snap: Any) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        for intr in snap.interrupts:
            value = intr.value
            if isinstance(value, Mapping) and value.get("type") == APPROVAL_INTERRUPT:
                out.extend((intr.id, r) for r in value["requests"])
        return out

    @staticmethod
    def _asking_agent(snap: Any) -> str | None:
        for intr in snap.interrupts:
            value = intr.value
            if isinstance(value, Mapping) and value.get("type") == APPROVAL_INTERRUPT:
                return value.get("agent")
        return None

    async def _suspended(self, graph: Any, cfg: RunnableConfig) -> bool:
        snap = await graph.aget_state(cfg)
        return bool(self._requests(snap))

    async def _close_unfinished(self, graph: Any, cfg: RunnableConfig) -> list[dict[str, Any]]:
        """Tool messages that close a run which failed, was cancelled or was rewound into:
        the results of the calls that finished (LangGraph would drop them with the new
        input) and a "not run" answer for the others, so nothing is lost and the
        transcript stays well-formed."""
        snap = await graph.aget_state(cfg)
        finished: dict[str, dict[str, Any]] = {}
        for task in snap.tasks:
            result = task.result if isinstance(task.result, Mapping) else None
            for m in (result or {}).get("messages") or ():
                if isinstance(m, Mapping) and m.get("role") == "tool":
                    finished[m["tool_call_id"]] = dict(m)
        # The snapshot's values include the finished tasks' writes, which the new input
        # would discard: only the others are really saved in the transcript.
        messages: list[dict[str, Any]] = snap.values.get("messages") or []
        i = len(messages)
        saved: set[Any] = set()
        while i and messages[i - 1].get("role") == "tool":
            i -= 1
            call_id = messages[i].get("tool_call_id")
            if call_id not in finished:
                saved.add(call_id)
        if not i or messages[i - 1].get("role") != "assistant":
            return []
        calls = [c for c in messages[i - 1].get("tool_calls") or () if c["id"] not in saved]
        reason = "the run stopped before this call finished and was not retried"
        return [finished.get(c["id"]) or not_run_messages([c], reason)[0] for c in calls]

    async def _answer(
        self, action: str, make: Any, stream: Stream[Output] | None, pin: Pin | None
    ) -> Reply[Output]:
        if pin is None:
            # What is pending now, read before waiting for the thread: an answer queued
            # behind another must not apply to a request asked while it waited.
            storage = self.agent.storage
            await storage._ensure_open()
            now = _Head(
                await storage.checkpointer.aget_tuple(
                    {"configurable": {"thread_id": self.id, "checkpoint_ns": ""}}
                )
            )
            pin = Pin.now(now.id, now.has_interrupt)
        pinned = pin

        async def prepare(
            head: _Head, graph: Any, cfg: RunnableConfig
        ) -> tuple[Any, str, dict[str, Any]]:
            snap = await graph.aget_state(cfg) if head.has_interrupt else None
            pending = self._requests(snap) if snap is not None else []
            pinned.check(
                thread_id=self.id,
                action=action,
                head_id=head.id,
                head_version=head.version,
                pending=[r for _, r in pending],
            )
            if not pending:
                raise ValidationError(
                    f"thread {self.id!r} has no pending approvals to {action}",
                    code="not_suspended",
                )
            interrupt_id = pending[0][0]
            requests = [r for _, r in pending]
            asker = self.agent._spec_named(self._asking_agent(snap))
            decisions = check_decisions(make(requests), requests, asker)
            run_id = head.run.get("run_id") or uuid.uuid4().hex
            details = {"decisions": decision_details(requests, decisions)}
            return Command(resume={interrupt_id: decisions}), run_id, details

        return await self._segment(action, prepare, resume=True, stream=stream)

    async def _segment(
        self,
        action: str,
        prepare: Any,
        *,
        run_state: dict[str, Any] | None = None,
        new_messages: list[dict[str, Any]] | None = None,
        resume: bool = False,
        stream: Stream[Output] | None = None,
    ) -> Reply[Output]:
        own = self.agent._spec.redact
        if own is None:
            return await self._run_segment(action, prepare, run_state, new_messages, stream)
        # The policy holds for the whole segment, hooks and audit records included, so
        # the library's log records from any part of it are redacted.
        token = CURRENT.set(effective(own))
        try:
            return await self._run_segment(action, prepare, run_state, new_messages, stream)
        finally:
            CURRENT.reset(token)

    async def _run_segment(
        self,
        action: str,
        prepare: Any,
        run_state: dict[str, Any] | None,
        new_messages: list[dict[str, Any]] | None,
        stream: Stream[Output] | None,
    ) -> Reply[Output]:
        started = time.perf_counter()
        agent = self.agent
        storage = agent.storage
        backend = await storage._ensure_open()
        await agent._spec.ensure_tools()
        store = await storage.get_store() if agent._spec.memory is not None else None
        graph = agent._thread_graph(storage, store)
        cfg: RunnableConfig = {"configurable": {"thread_id": self.id}}
        async with storage._hold(self.id):
            tup = await storage.checkpointer.aget_tuple(cfg)
            head = _Head(tup)
            inp, run_id, details = await prepare(head, graph, cfg)
            seg = Segment(self.id, run_id, self.actor, head=tup, head_cached=True)
            redactor = CURRENT.get()
            audited = redactor.redact_value(details) if redactor is not None else details
            seg.audit.append(record(action, self.id, run_id=run_id, actor=self.actor, **audited))
            values: dict[str, Any] | None = None
            token = SEGMENT.set(seg)
            try:
                with observe(
                    agent._spec, action=action, run_id=run_id, thread_id=self.id, actor=self.actor
                ) as observed:
                    if "decisions" in details:
                        observed.decided(details["decisions"])
                    config: RunnableConfig = {
                        "configurable": {"thread_id": self.id},
                        "metadata": {
                            "run_id": run_id,
                            "actor": self.actor,
                            "criogen_v0": head.version + 1,
                            "criogen_s0": head.step + 1,
                        },
                        "recursion_limit": agent._config["recursion_limit"],
                    }
                    values, interrupts = await self._invoke(graph, inp, config, stream)
                    if seg.deferred:
                        # The run ended: a cancellation now must not cut its last write.
                        await uncancelled(backend.flush_deferred(seg))
                    if seg.last_config is not None and "messages" in values:
                        storage.checkpointer.transcripts.remember(  # type: ignore[attr-defined]
                            self.id,
                            seg.last_config["configurable"]["checkpoint_id"],
                            {"messages": values["messages"]},
                        )
                    result: Reply[Output] = agent._result(  # type: ignore[assignment]
                        values,
                        interrupts,
                        run_id,
                        started,
                        cls=Reply,
                        version=self._version(seg, head),
                        checkpoint_id=self._checkpoint_id(seg, head),
                    )
                    observed.done(result)
            except BaseException as exc:
                # What the run wrote (and the results of the tool calls that finished)
                # is saved before the lock goes, cancelled or not; if that fails too, the
                # run's own error is the one to report.
                try:
                    await uncancelled(backend.settle(seg))
                    if seg.deferred:
                        await uncancelled(backend.flush_deferred(seg))
                except Exception as save_exc:
                    import logging

                    logging.getLogger("criogen_graph").warning(
                        "could not save the last writes of the stopped run on thread %r: %s",
                        self.id,
                        save_exc,
                    )
                await self._failed(backend, seg, exc)
                raise
            finally:
                SEGMENT.reset(token)
            if seg.audit:
                await uncancelled(backend.write_audit(seg.audit))
        agent._raise_for_limit(result)
        return result

    async def _failed(self, backend: Any, seg: Segment, exc: BaseException) -> None:
        """Record a run that failed or was cancelled (`on_end` ran in the graph). The caller
        re-raises the error: a cancellation stays the caller's own `asyncio.CancelledError`,
        so `asyncio.timeout`, `wait_for` and `TaskGroup` see the cancellation they made."""
        cancelled = isinstance(exc, asyncio.CancelledError)
        await self._after_failure(backend, seg, "run_cancelled" if cancelled else "run_failed", exc)

    async def _invoke(
        self, graph: Any, inp: Any, config: RunnableConfig, stream: Stream[Output] | None
    ) -> tuple[dict[str, Any], tuple[Any, ...]]:
        """Run the graph with `ainvoke`; a streamed run hands the nodes a sink that turns
        their payloads into events of `stream` as they are written. Returns the final
        values and the interrupts.

        Durability is "sync": each step is saved before the next one starts, so no tool
        runs with a call id that a crash could take back (the model would be asked again
        and answer with other ids), and a finished step is never lost."""
        if stream is not None:
            config["configurable"][STREAM_SINK] = _sink(stream)
        api_run = API_RUN.set(True)
        try:
            out = await graph.ainvoke(inp, config, version="v2", durability="sync")
        finally:
            API_RUN.reset(api_run)
        values, interrupts = out.value, out.interrupts
        if stream is None:
            return values, interrupts
        requests = [
            ApprovalRequest.from_dict(r)
            for intr in interrupts
            if isinstance(intr.value, Mapping) and intr.value.get("type") == APPROVAL_INTERRUPT
            for r in intr.value["requests"]
        ]
        if requests:
            stream.emit(ApprovalNeededEvent(requests))
        return values, interrupts

    async def _after_failure(
        self, backend: Any, seg: Segment, action: str, exc: BaseException
    ) -> None:
        records = [*seg.audit]
        seg.audit = []
        # The error text can carry what a tool, hook or provider was given: redacted
        # before it is cut, so no secret is kept in part.
        redactor = CURRENT.get()
        message = redactor.redact(str(exc)) if redactor is not None else str(exc)
        records.append(
            record(
                action,
                self.id,
                run_id=seg.run_id,
                actor=self.actor,
                error=type(exc).__name__,
                message=message[:2000],
            )
        )
        try:
            await uncancelled(backend.write_audit(records))
        except Exception as audit_exc:  # the run's own error matters more
            import logging

            logging.getLogger("criogen_graph").warning(
                "could not record %s for thread %r: %s", action, self.id, audit_exc
            )

    @staticmethod
    def _version(seg: Segment, head: _Head) -> int:
        if seg.last_config is None or seg.last_step is None:
            return head.version
        return head.version + 1 + seg.last_step - (head.step + 1)

    @staticmethod
    def _checkpoint_id(seg: Segment, head: _Head) -> str:
        if seg.last_config is None:
            return head.id or ""
        return str(seg.last_config["configurable"]["checkpoint_id"])


def _error_type(error: Any) -> str:
    """The type name of a saved task error (savers keep its repr: `Name("message")`),
    not its message, which may well mention a cancellation."""
    if isinstance(error, BaseException):
        return type(error).__name__
    return str(error).lstrip("'\"").split("(", 1)[0]


def _entry(tup: CheckpointTuple) -> dict[str, Any]:
    meta = tup.metadata or {}
    writes = tup.pending_writes or ()
    run = tup.checkpoint["channel_values"].get("run") or {}
    errors = [w[2] for w in writes if w[1] == _ERROR]
    if any(w[1] == _INTERRUPT for w in writes):
        status = "suspended"
    elif meta.get("source") == "input" and not errors:
        status = "pending"
    elif errors:
        # A failing call cancels the other calls of its step: the failure is the story.
        status = "cancelled" if all("Cancelled" in _error_type(e) for e in errors) else "failed"
    elif run.get("stop_reason") is not None:
        status = "completed"
    else:
        status = "pending"
    parent = tup.parent_config
    return {
        "id": tup.config["configurable"]["checkpoint_id"],
        "parent_id": parent["configurable"]["checkpoint_id"] if parent else None,
        "version": checkpoint_version(meta),
        "source": meta.get("source"),
        "status": status,
        "run_id": meta.get("run_id"),
        "step": meta.get("step"),
        "created_at_ms": _ms(tup.checkpoint.get("ts")),
    }


def _sink(stream: Stream[Any]) -> Callable[[dict[str, Any]], None]:
    """What the nodes of a streamed run hand their event payloads to: each becomes an
    event of `stream` at once (from a thread of a model's or tool's own, via the loop)."""
    loop = asyncio.get_running_loop()
    loop_thread = threading.get_ident()

    def sink(payload: dict[str, Any]) -> None:
        event = to_event(payload)
        if event is None:
            return
        if threading.get_ident() == loop_thread:
            stream.emit(event)
        else:
            loop.call_soon_threadsafe(stream.emit, event)

    return sink
