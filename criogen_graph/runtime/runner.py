"""The run-segment runner: the one path every run of an agent takes.

A run segment is one invocation of an agent's graph: `agent.run(...)`, or a thread's
`send`, `approve` / `reject` / `decide`, `retry`, streamed or not, in the caller's task
or as a background run. Each goes through `run_segment`, which in order:

1. puts the agent's redaction policy in force for the whole segment (its log records,
   hooks and audit records included);
2. makes sure the agent's tool sources are connected and compiles (or reuses) the graph;
3. holds the thread (across processes; see `Storage.hold`) and reads its head;
4. lets the caller's `prepare` decide the input from that head (or refuse);
5. opens the run's observation (span, redactor) and invokes the graph, which runs the
   `on_start` / `on_end` hooks around the segment itself (see `graph.invocation`);
6. saves what the savers held back (deferred writes) and the transcript cache, or on a
   raise or a cancellation saves what the run wrote before the lock goes;
7. writes the audit records; builds the `RunResult` / `Reply`; raises for a limit.

`agent.run` has no thread: its `place` holds nothing, reads no head and saves nothing,
so steps 3 and 6 do nothing. The outcome of a segment ("completed", "suspended",
"failed") is decided by one rule, `criogen_graph.results.outcome`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar, cast

from criogen_graph._aio import uncancelled
from criogen_graph.audit import record
from criogen_graph.errors import LimitExceededError
from criogen_graph.graph.approval import APPROVAL_INTERRUPT
from criogen_graph.graph.events import API_RUN, STREAM_SINK
from criogen_graph.redact import CURRENT, effective
from criogen_graph.results import (
    ApprovalRequest,
    PendingApprovals,
    Reply,
    RunResult,
    empty_usage,
)
from criogen_graph.runtime.segment import SEGMENT, Segment
from criogen_graph.stream import ApprovalNeededEvent, Stream, to_event
from criogen_graph.telemetry.observe import observe

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import CheckpointTuple

    from criogen_graph.agent import Agent
    from criogen_graph.graph.spec import AgentSpec
    from criogen_graph.messages import LimitRecord, Message
    from criogen_graph.redact import Redactor

__all__ = [
    "ERROR",
    "INTERRUPT",
    "Head",
    "Prepare",
    "Start",
    "build_result",
    "checkpoint_version",
    "open_graph",
    "raise_for_limit",
    "run_on_thread",
    "run_once",
]

Output = TypeVar("Output")

# LangGraph's reserved write channels (pending writes of a checkpoint).
INTERRUPT = "__interrupt__"
ERROR = "__error__"

_log = logging.getLogger("criogen_graph")


# -- the input of a segment ---------------------------------------------------------------


def checkpoint_version(meta: Mapping[str, Any]) -> int:
    """A checkpoint's version: it grows by one with every checkpoint saved on the thread,
    across branches (rewinds continue from the newest)."""
    step = int(meta.get("step", -1))
    if "criogen_v0" in meta:
        return int(meta["criogen_v0"]) + step - int(meta["criogen_s0"])
    return step + 2  # a checkpoint written outside the API (e.g. LangGraph Studio)


class Head:
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
        "tuple",
        "version",
    )

    def __init__(self, tup: CheckpointTuple | None) -> None:
        self.tuple = tup
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
        self.has_interrupt = any(w[1] == INTERRUPT for w in writes)
        self.has_error = any(w[1] == ERROR for w in writes)

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


class Start(NamedTuple):
    """What a segment's `prepare` decided: the graph's input (a `Command` to resume, or
    None to continue), the run id, and the details of the segment's audit record."""

    input: Any
    run_id: str
    details: dict[str, Any]


#: Decides a segment's start from the thread's head, holding the thread; it may raise to
#: refuse (nothing ran). Called with the head, the compiled graph and the thread config.
Prepare = Callable[[Head, Any, "RunnableConfig"], Awaitable[Start]]


# -- the result of a segment --------------------------------------------------------------


def build_result(
    spec: AgentSpec,
    values: Mapping[str, Any],
    interrupts: Sequence[Any],
    run_id: str,
    started: float,
    cls: type[RunResult[Any]] = RunResult,
    **extra: Any,
) -> RunResult[Any]:
    """The `RunResult` (or `Reply`, with its `extra` fields) of a segment that ended with
    the graph's `values` and `interrupts`."""
    run = values.get("run") or {}
    messages: list[Message] = values.get("messages") or []
    approvals = _approval_requests(interrupts)
    stop = None if approvals else run.get("stop_reason")
    text, output = _answer(spec, run, messages, stop)
    result = cls(
        text=text,
        output=output,
        messages=list(messages),  # the caller's own list, not the cached one
        usage=dict(run.get("usage") or empty_usage()),  # type: ignore[arg-type]
        stop_reason=stop,
        needs_approval=bool(approvals),
        # A thread's reply names the checkpoint that asked, so an answer pinned to
        # `reply.approvals` tells these requests from any later one.
        approvals=PendingApprovals(
            approvals,
            checkpoint_id=extra.get("checkpoint_id") or None,
            version=extra.get("version"),
        ),
        model_calls=run.get("model_calls", 0),
        tool_calls=run.get("tool_calls", 0),
        run_id=run.get("run_id") or run_id,
        duration_ms=(time.perf_counter() - started) * 1000.0,
        answered_by=run.get("answered_by"),
        models=list(run.get("models") or ()),
        compacted=bool(run.get("compacted")),
        **extra,
    )
    if stop == "limit":
        result.limit = cast("LimitRecord", run.get("error") or {})
    return result


def _approval_requests(interrupts: Sequence[Any]) -> list[ApprovalRequest]:
    out: list[ApprovalRequest] = []
    for intr in interrupts:
        value = getattr(intr, "value", None)
        if isinstance(value, Mapping) and value.get("type") == APPROVAL_INTERRUPT:
            out.extend(ApprovalRequest.from_dict(r) for r in value["requests"])
    return out


def _answer(
    spec: AgentSpec, run: Mapping[str, Any], messages: Sequence[Message], stop: str | None
) -> tuple[str | None, Any]:
    """The result's `text` and `output` for stop reason `stop`."""
    if stop in ("final_answer", "max_tokens"):
        last = _last_assistant(messages)
        text: Any = (last.get("content") or "") if last is not None else ""
        return text, text
    if stop == "output":
        raw = run.get("output")
        return None, spec.output.to_user(raw) if spec.output is not None else raw
    if stop == "hook_end":
        output = run.get("output")
        return (output if isinstance(output, str) else None), output
    if stop == "return_direct":
        return run.get("output"), run.get("output")
    return None, None


def _last_assistant(messages: Sequence[Message]) -> Message | None:
    for m in reversed(messages):
        if m.get("role") == "assistant":
            found: Message = m
            return found
    return None


def raise_for_limit(result: RunResult[Any]) -> None:
    """Raise `LimitExceededError` (carrying `result`) for a segment that reached a limit."""
    if result.stop_reason != "limit":
        return
    err: Mapping[str, Any] = result.limit or {}
    limit = err.get("limit", "limit")
    value = err.get("value", 0)
    raise LimitExceededError(
        f"the run reached its {limit} limit ({value}); raise Limits({limit}=...) if the "
        "task needs more",
        limit=limit,
        value=value,
        result=result,
    )


# -- where a segment runs ---------------------------------------------------------------


class _Place(Protocol):
    """Where a segment runs: the thread it holds, reads and saves (or none)."""

    thread_id: str | None
    actor: str | None
    result_cls: type[RunResult[Any]]

    async def graph(self) -> tuple[Any, RunnableConfig]: ...
    def hold(self) -> contextlib.AbstractAsyncContextManager[None]: ...
    async def head(self, cfg: RunnableConfig) -> Head: ...
    def begin(self, action: str, start: Start, head: Head) -> Segment | None: ...
    def config(self, run_id: str, head: Head) -> tuple[RunnableConfig, dict[str, Any]]: ...
    async def ran(self, seg: Segment | None, values: Mapping[str, Any]) -> None: ...
    def extra(self, seg: Segment | None, head: Head) -> dict[str, Any]: ...
    async def stopped(self, seg: Segment | None, exc: BaseException) -> None: ...
    async def ended(self, seg: Segment | None) -> None: ...


class _Unsaved:
    """`agent.run`: no thread, nothing held, read or saved."""

    thread_id: str | None = None
    actor: str | None = None
    result_cls: type[RunResult[Any]] = RunResult

    def __init__(self, agent: Agent[Any]) -> None:
        self.agent = agent

    async def graph(self) -> tuple[Any, RunnableConfig]:
        agent = self.agent
        await agent.spec.ensure_tools()
        if agent.spec.memory is None:
            return agent.graph, {}
        return agent.memory_graph(await agent.storage.get_store()), {}

    def hold(self) -> contextlib.AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()

    async def head(self, cfg: RunnableConfig) -> Head:
        return Head(None)

    def begin(self, action: str, start: Start, head: Head) -> Segment | None:
        return None

    def config(self, run_id: str, head: Head) -> tuple[RunnableConfig, dict[str, Any]]:
        return self.agent.run_config, {}

    async def ran(self, seg: Segment | None, values: Mapping[str, Any]) -> None:
        return None

    def extra(self, seg: Segment | None, head: Head) -> dict[str, Any]:
        return {}

    async def stopped(self, seg: Segment | None, exc: BaseException) -> None:
        return None

    async def ended(self, seg: Segment | None) -> None:
        return None


class _Saved:
    """A thread of the agent's storage: held for the segment, its head read, the run's
    writes and audit records saved (also when it fails or is cancelled)."""

    result_cls: type[RunResult[Any]] = Reply

    def __init__(self, agent: Agent[Any], thread_id: str, actor: str | None) -> None:
        self.agent = agent
        self.storage = agent.storage
        self.thread_id: str | None = thread_id
        self.id = thread_id
        self.actor = actor
        self.backend: Any = None

    async def graph(self) -> tuple[Any, RunnableConfig]:
        self.backend, graph, cfg = await open_graph(self.agent, self.id)
        return graph, cfg

    def hold(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self.storage.hold(self.id)

    async def head(self, cfg: RunnableConfig) -> Head:
        return Head(await self.storage.checkpointer.aget_tuple(cfg))

    def begin(self, action: str, start: Start, head: Head) -> Segment | None:
        seg = Segment(self.id, start.run_id, self.actor, head=head.tuple, head_cached=True)
        redactor = CURRENT.get()
        details = start.details
        audited = redactor.redact_value(details) if redactor is not None else details
        seg.audit.append(record(action, self.id, run_id=start.run_id, actor=self.actor, **audited))
        return seg

    def config(self, run_id: str, head: Head) -> tuple[RunnableConfig, dict[str, Any]]:
        metadata: dict[str, Any] = {
            "run_id": run_id,
            "actor": self.actor,
            "criogen_v0": head.version + 1,
            "criogen_s0": head.step + 1,
        }
        redactor = CURRENT.get()
        if redactor is not None:
            # The metadata reaches every callback handler (LangSmith) and the checkpoint's
            # metadata: under the policy, like the spans. LangGraph copies the thread id
            # there only when it is not set already.
            metadata["thread_id"] = redactor.redact(self.id)
            if self.actor is not None:
                metadata["actor"] = redactor.redact(self.actor)
        config: RunnableConfig = {
            "configurable": {"thread_id": self.id},
            "metadata": metadata,
            "recursion_limit": self.agent.run_config["recursion_limit"],
        }
        # Each step is saved before the next one starts, so no tool runs with a call id
        # that a crash could take back (the model would be asked again and answer with
        # other ids), and a finished step is never lost.
        return config, {"durability": "sync"}

    async def ran(self, seg: Segment | None, values: Mapping[str, Any]) -> None:
        assert seg is not None
        if seg.holds_writes():
            # The run ended: a cancellation now must not cut its last write.
            await uncancelled(self.backend.flush_deferred(seg))
        if seg.last_config is not None and "messages" in values:
            self.storage.remember_transcript(
                self.id, seg.last_config["configurable"]["checkpoint_id"], values["messages"]
            )

    def extra(self, seg: Segment | None, head: Head) -> dict[str, Any]:
        assert seg is not None
        if seg.last_config is None or seg.last_step is None:
            version = head.version
        else:
            version = head.version + 1 + seg.last_step - (head.step + 1)
        if seg.last_config is None:
            checkpoint_id = head.id or ""
        else:
            checkpoint_id = str(seg.last_config["configurable"]["checkpoint_id"])
        return {"version": version, "checkpoint_id": checkpoint_id}

    async def stopped(self, seg: Segment | None, exc: BaseException) -> None:
        """The run failed or was cancelled (`on_end` ran in the graph): what it wrote
        (and the results of the tool calls that finished) is saved before the lock goes,
        and the failure recorded. If saving fails too, the run's own error is the one the
        caller re-raises: a cancellation stays the caller's own `asyncio.CancelledError`,
        so `asyncio.timeout`, `wait_for` and `TaskGroup` see the cancellation they made."""
        assert seg is not None
        try:
            await uncancelled(self.backend.settle(seg))
            if seg.holds_writes():
                await uncancelled(self.backend.flush_deferred(seg))
        except Exception as save_exc:
            _log.warning(
                "could not save the last writes of the stopped run on thread %r: %s",
                self.id,
                save_exc,
            )
        action = "run_cancelled" if isinstance(exc, asyncio.CancelledError) else "run_failed"
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
            await uncancelled(self.backend.write_audit(records))
        except Exception as audit_exc:  # the run's own error matters more
            _log.warning("could not record %s for thread %r: %s", action, self.id, audit_exc)

    async def ended(self, seg: Segment | None) -> None:
        assert seg is not None
        if seg.audit:
            await uncancelled(self.backend.write_audit(seg.audit))


# -- the runner ---------------------------------------------------------------------------


async def open_graph(agent: Agent[Any], thread_id: str) -> tuple[Any, Any, RunnableConfig]:
    """The agent's graph on its storage for thread `thread_id`, as every run and every
    read of a thread opens it: `(backend, graph, config)`, the storage's backend open,
    the tools of the agent's tool sources (MCP servers) listed, and the store given
    when the agent has memory."""
    storage = agent.storage
    backend = await storage.backend()
    await agent.spec.ensure_tools()
    store = await storage.get_store() if agent.spec.memory is not None else None
    return backend, agent.thread_graph(storage, store), {"configurable": {"thread_id": thread_id}}


async def run_once(agent: Agent[Output], prepare: Prepare) -> RunResult[Output]:
    """`agent.run`: one segment on no thread."""
    result = await _redacted(
        agent.spec.redact, _segment(agent, "run", prepare, _Unsaved(agent), None)
    )
    return cast("RunResult[Output]", result)


async def run_on_thread(
    agent: Agent[Output],
    thread_id: str,
    actor: str | None,
    action: str,
    prepare: Prepare,
    stream: Stream[Output] | None = None,
) -> Reply[Output]:
    """A thread's `action` (send, approve, reject, decide, retry): one segment on thread
    `thread_id` of the agent's storage, streaming its events into `stream` if given."""
    place = _Saved(agent, thread_id, actor)
    result = await _redacted(agent.spec.redact, _segment(agent, action, prepare, place, stream))
    return cast("Reply[Output]", result)


async def _redacted(own: Redactor | None, segment: Awaitable[RunResult[Any]]) -> RunResult[Any]:
    """`segment` run under the redaction policy of an agent whose own redactor is `own`."""
    if own is None:
        return await segment
    # The policy holds for the whole segment, hooks and audit records included, so
    # the library's log records from any part of it are redacted.
    token = CURRENT.set(effective(own))
    try:
        return await segment
    finally:
        CURRENT.reset(token)


async def _segment(
    agent: Agent[Any],
    action: str,
    prepare: Prepare,
    place: _Place,
    stream: Stream[Any] | None,
) -> RunResult[Any]:
    started = time.perf_counter()
    spec = agent.spec
    graph, cfg = await place.graph()
    async with place.hold():
        head = await place.head(cfg)
        start = await prepare(head, graph, cfg)
        seg = place.begin(action, start, head)
        token = SEGMENT.set(seg) if seg is not None else None
        try:
            with observe(
                spec,
                action=action,
                run_id=start.run_id,
                thread_id=place.thread_id,
                actor=place.actor,
            ) as observed:
                if "decisions" in start.details:
                    observed.decided(start.details["decisions"])
                config, options = place.config(start.run_id, head)
                values, interrupts = await _invoke(graph, start.input, config, options, stream)
                await place.ran(seg, values)
                result = build_result(
                    spec,
                    values,
                    interrupts,
                    start.run_id,
                    started,
                    place.result_cls,
                    **place.extra(seg, head),
                )
                observed.done(result)
        except BaseException as exc:
            await place.stopped(seg, exc)
            raise
        finally:
            if token is not None:
                SEGMENT.reset(token)
        await place.ended(seg)
    raise_for_limit(result)
    return result


async def _invoke(
    graph: Any,
    inp: Any,
    config: RunnableConfig,
    options: dict[str, Any],
    stream: Stream[Any] | None,
) -> tuple[dict[str, Any], Sequence[Any]]:
    """Run the graph with `ainvoke`; a streamed run hands the nodes a sink that turns
    their payloads into events of `stream` as they are written. Returns the final values
    and the interrupts. `on_start` / `on_end` run inside the graph (`graph.invocation`), as
    they do however LangGraph drives it."""
    if stream is not None:
        config["configurable"][STREAM_SINK] = _sink(stream)
    api_run = API_RUN.set(True)
    try:
        out = await graph.ainvoke(inp, config, version="v2", **options)
    finally:
        API_RUN.reset(api_run)
    values, interrupts = out.value, out.interrupts
    if stream is not None:
        stream.final = (values, interrupts)
        requests = _approval_requests(interrupts)
        if requests:
            stream.emit(ApprovalNeededEvent(requests))
    return values, interrupts


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
