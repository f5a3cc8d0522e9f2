"""`Thread`: one conversation kept in the agent's storage (a LangGraph thread)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from langgraph.types import Command

from criogen_graph.audit import record
from criogen_graph.errors import (
    ThreadSuspendedError,
    ValidationError,
)
from criogen_graph.graph.approval import APPROVAL_INTERRUPT, check_decisions, decision_details
from criogen_graph.graph.state import new_run, not_run_messages
from criogen_graph.results import ApprovalRequest, Decision, PendingApprovals, Reply
from criogen_graph.runtime.history import history_entry
from criogen_graph.runtime.inputs import check_actor, check_thread_id, send_input
from criogen_graph.runtime.pins import Expected, Pin
from criogen_graph.runtime.runner import (
    Head,
    Prepare,
    Start,
    build_result,
    checkpoint_version,
    open_graph,
    run_on_thread,
)
from criogen_graph.runtime.segment import SEGMENT, Segment
from criogen_graph.stream import MessageEvent, Stream

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from criogen_graph.agent import Agent
    from criogen_graph.background.runs import RunHandle

__all__ = ["Thread"]

Output = TypeVar("Output")


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
        check_actor(actor)
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
        user, run_state = send_input(self.agent.spec, input, state)
        return await self._send(user, run_state, None)

    def stream(self, input: str, *, state: Mapping[str, Any] | None = None) -> Stream[Output]:
        """`send`, streaming its events: `async for event in stream`, then
        `await stream.reply()`. Cancel with `stream.cancel()` or by leaving the loop."""
        user, run_state = send_input(self.agent.spec, input, state)
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

    async def send_as(
        self, input: str, *, state: Mapping[str, Any] | None, run_id: str
    ) -> Reply[Output]:
        """Internal: `send`, with the run id chosen by the caller (a background job's
        id, by which a worker taking over finds whether the send was already applied).
        For the runtime's own modules; not a stable interface for users."""
        user, run_state = send_input(self.agent.spec, input, state)
        return await self._send(user, run_state, None, run_id)

    def stream_as(
        self, input: str, *, state: Mapping[str, Any] | None, run_id: str
    ) -> Stream[Output]:
        """Internal: `stream`, with the run id chosen by the caller (as `send_as`).
        For the runtime's own modules; not a stable interface for users."""
        user, run_state = send_input(self.agent.spec, input, state)
        return Stream(lambda s: self._send(user, run_state, s, run_id))

    async def _send(
        self,
        user: dict[str, Any],
        run_state: dict[str, Any],
        stream: Stream[Output] | None,
        run_id: str | None = None,
    ) -> Reply[Output]:
        async def prepare(head: Head, graph: Any, cfg: RunnableConfig) -> Start:
            if head.has_interrupt and await self._suspended(graph, cfg):
                raise self._suspended_error()
            prefix: list[dict[str, Any]] = []
            if not head.finished:
                prefix = await self._close_unfinished(graph, cfg)
            rid = run_id or uuid.uuid4().hex
            inp = {"messages": (*prefix, user), "run": new_run(rid), "state": run_state}
            if stream is not None:
                for m in (*prefix, user):
                    stream.emit(MessageEvent(m))
            return Start(inp, rid, {"input": user["content"]})

        return await self._segment("send", prepare, stream)

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
        async def prepare(head: Head, graph: Any, cfg: RunnableConfig) -> Start:
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
            return Start(None, run_id, {})

        return await self._segment("retry", prepare, stream)

    # -- background runs ---------------------------------------------------------------------

    async def submit(
        self, input: str, *, state: Mapping[str, Any] | None = None
    ) -> RunHandle[Output]:
        """`send` as a background run: queued at once, run by a worker (`criogen-graph
        worker` on PostgreSQL; a task of this process on memory:// and SQLite). Returns a
        `RunHandle` (`id`, `status()`, `reply()`, `cancel()`). The runs submitted to one
        thread run one at a time, in order."""
        from criogen_graph.background.runs import submit

        return await submit(self, "send", input=input, state=state)

    async def submit_approve(self, *, expected: Expected | None = None) -> RunHandle[Output]:
        """`approve` as a background run; a bare call pins what waits now."""
        from criogen_graph.background.runs import submit

        return await submit(self, "approve", expected=expected)

    async def submit_reject(
        self, message: str = "rejected", *, expected: Expected | None = None
    ) -> RunHandle[Output]:
        """`reject` as a background run."""
        from criogen_graph.background.runs import submit

        return await submit(self, "reject", message=message, expected=expected)

    async def submit_decide(
        self,
        decisions: Mapping[str, Decision | Mapping[str, Any] | str],
        *,
        expected: Expected | None = None,
    ) -> RunHandle[Output]:
        """`decide` as a background run."""
        from criogen_graph.background.runs import submit

        return await submit(self, "decide", decisions=decisions, expected=expected)

    async def submit_retry(self) -> RunHandle[Output]:
        """`retry` as a background run."""
        from criogen_graph.background.runs import submit

        return await submit(self, "retry")

    def run(self, run_id: str) -> RunHandle[Output]:
        """A handle on a background run submitted earlier (by any process sharing the
        storage), from its id."""
        from criogen_graph.background.runs import handle

        return handle(self, run_id)

    # -- reading ---------------------------------------------------------------------------

    async def messages(self) -> list[dict[str, Any]]:
        """The stored conversation."""
        graph, cfg = await self._graph()
        snap = await graph.aget_state(cfg)
        return list(snap.values.get("messages") or [])

    async def context(self) -> list[dict[str, Any]]:
        """What the model would be sent next (before the next input): the instructions
        as a system message, then, with a `ContextPolicy`, the summary of older messages
        (a user message with `kind: "summary"`) and the newer ones (old tool results
        cleared when the budget asks for it); without one, the whole transcript. A call
        that does not fit any more summarizes further first. `messages()` keeps every
        message."""
        graph, cfg = await self._graph()
        snap = await graph.aget_state(cfg)
        stored = list(snap.values.get("messages") or [])
        spec = self.agent.spec
        head: list[dict[str, Any]] = []
        if spec.system_message is not None:
            head.append(dict(spec.system_message))
        if spec.context is None:
            return head + stored
        from criogen_graph.graph.context import current_view

        view = current_view(spec, spec.context, stored, snap.values.get("context"))
        return head + [dict(m) for m in view.messages]

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
        await storage.backend()
        saver = storage.checkpointer
        out: list[dict[str, Any]] = []
        cfg: dict[str, Any] = {"configurable": {"thread_id": self.id, "checkpoint_ns": ""}}
        while len(out) < limit:
            tup = await saver.aget_tuple(cfg)  # type: ignore[arg-type]
            if tup is None:
                break
            out.append(history_entry(tup))
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
        backend = await storage.backend()
        async with storage.hold(self.id):
            saver = storage.checkpointer
            head = Head(await saver.aget_tuple(cfg))
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
                await backend.write_audit(seg.audit)
            tup = await saver.aget_tuple(new_cfg)
        assert tup is not None
        return history_entry(tup)

    async def delete(self, *, audit: bool = False) -> bool:
        """Delete the thread and its checkpoints; `True` if it existed. Its audit records
        are kept unless `audit=True`; either way the deletion is recorded (`delete`, with
        `existed` and `audit_deleted`). Deleting and recording are one transaction: a crash
        leaves the thread whole and unrecorded, or deleted and recorded once."""
        if not isinstance(audit, bool):
            raise ValidationError("delete(audit=...) takes a bool", code="invalid_type")
        storage = self.agent.storage
        backend = await storage.backend()
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

        async with storage.hold(self.id):
            existed = await backend.delete_thread(self.id, make_record, audit=audit)
        return existed

    # -- internals ----------------------------------------------------------------------------

    async def reply_at(self, checkpoint_id: str, run_id: str) -> Reply[Output]:
        """Internal: the `Reply` the run `run_id` ended with, rebuilt from its checkpoint
        (a background run's result, read by any process). For the runtime's own
        modules; not a stable interface for users."""
        graph, _ = await self._graph()
        cfg = {
            "configurable": {
                "thread_id": self.id,
                "checkpoint_ns": "",
                "checkpoint_id": checkpoint_id,
            }
        }
        snap = await graph.aget_state(cfg)
        result = build_result(
            self.agent.spec,
            dict(snap.values),
            snap.interrupts,
            run_id,
            time.perf_counter(),
            Reply,
            version=checkpoint_version(snap.metadata or {}),
            checkpoint_id=checkpoint_id,
        )
        return result  # type: ignore[return-value]

    async def _graph(self) -> tuple[Any, RunnableConfig]:
        _, graph, cfg = await open_graph(self.agent, self.id)
        return graph, cfg

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

    async def _close_unfinished(self, graph: Any, cfg: RunnableConfig) -> list[Any]:
        """Tool messages that close a run which failed, was cancelled or was rewound into:
        the results of the calls that finished (LangGraph would drop them with the new
        input) and a "not run" answer for the others, so nothing is lost and the
        transcript stays well-formed."""
        snap = await graph.aget_state(cfg)
        finished = _finished_results(snap.tasks)
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
            await storage.backend()
            now = Head(
                await storage.checkpointer.aget_tuple(
                    {"configurable": {"thread_id": self.id, "checkpoint_ns": ""}}
                )
            )
            pin = Pin.now(now.id, now.has_interrupt)
        pinned = pin

        async def prepare(head: Head, graph: Any, cfg: RunnableConfig) -> Start:
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
            asker = self.agent.spec_named(self._asking_agent(snap))
            decisions = check_decisions(make(requests), requests, asker)
            run_id = head.run.get("run_id") or uuid.uuid4().hex
            details = {"decisions": decision_details(requests, decisions)}
            return Start(Command(resume={interrupt_id: decisions}), run_id, details)

        return await self._segment(action, prepare, stream)

    async def _segment(
        self, action: str, prepare: Prepare, stream: Stream[Output] | None
    ) -> Reply[Output]:
        return await run_on_thread(self.agent, self.id, self.actor, action, prepare, stream)


def _finished_results(tasks: Any) -> dict[str, dict[str, Any]]:
    """The tool messages of the snapshot's tasks that finished, by call id."""
    finished: dict[str, dict[str, Any]] = {}
    for task in tasks:
        result = task.result if isinstance(task.result, Mapping) else None
        for m in (result or {}).get("messages") or ():
            if isinstance(m, Mapping) and m.get("role") == "tool":
                finished[m["tool_call_id"]] = dict(m)
    return finished
