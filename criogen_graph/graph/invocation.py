"""One invocation of an agent graph, however LangGraph runs it: the graph's side of a run
segment (`runtime.segment.Segment` is what our storage writes of it).

A run segment is one invocation of the compiled graph: a run, or its continuation after
an approval answer or a retry. Whoever drives the graph (our `Thread`, `agent.run`,
`graph.ainvoke` / `astream` with any checkpointer, `langgraph dev`, LangGraph's server,
a parent graph), the compiled graph's `astream` (every LangGraph entry point goes
through it) opens an `Invocation` and hands it to the nodes in the run's `configurable`:

- `on_start` runs once, in the first node of the segment, before it does anything, with
  the transcript as the node sees it (the new input included); what it saves
  (`HookAction(state=...)`) goes into the `run` channel with that node's writes;
- `on_end` runs once when the invocation ends, with `"completed"`, `"suspended"` or
  `"failed"` (a raise, a cancellation, a limit), as the nodes noted it;
- the audit records the nodes note go to the LangGraph store the run has when the
  checkpointer is not one of ours (see `criogen_graph.audit`).

The invocation exists only when there is something to do (hooks, or an audit sink), so a
plain graph pays one dict lookup per node.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphBubbleUp

from criogen_graph._aio import cancel_pending
from criogen_graph.graph.spec import AgentSpec
from criogen_graph.hooks import (
    HookAction,
    HookContext,
    HookFailedError,
    call_hook,
    call_run_hook,
)
from criogen_graph.redact import logger
from criogen_graph.results import Outcome, outcome

#: Where the nodes find the segment of the invocation they run in.
INVOCATION_KEY = "__criogen_run_segment"
#: LangGraph's key (in a task's `configurable`) for reading the current state.
_READ = "__pregel_read"

_EMPTY: Mapping[str, Any] = {}


class Invocation:
    """What one invocation of an agent graph keeps across its nodes (module docstring)."""

    __slots__ = (
        "_starting",
        "decisions",
        "hook_states",
        "messages",
        "new",
        "note_records",
        "outcome",
        "records",
        "run",
        "run_id",
        "spec",
        "started",
        "unsaved_states",
        "user_state",
    )

    def __init__(self, spec: AgentSpec, *, note_records: bool = False) -> None:
        self.spec = spec
        self.started = False
        self._starting: asyncio.Future[None] | None = None
        #: The hook states as `on_start` left them (None: it changed nothing).
        self.hook_states: dict[str, Any] | None = None
        #: Hook states `on_start` saved that no node has written yet.
        self.unsaved_states: dict[str, Any] | None = None
        self.run_id: str | None = None
        self.user_state: Mapping[str, Any] = _EMPTY
        #: The transcript and run as the last node that ran saw or made them (for `on_end`).
        self.messages: list[dict[str, Any]] = []
        self.new: list[dict[str, Any]] = []
        self.run: Mapping[str, Any] = _EMPTY
        #: The outcome the nodes noted (None: no node saw the run end or wait).
        self.outcome: Outcome | None = None
        #: Tool messages of the segment, for audit records (when `note_records`).
        self.records: list[dict[str, Any]] = []
        #: The approval answer's decisions as audit details (when `note_records`).
        self.decisions: list[dict[str, Any]] | None = None
        self.note_records = note_records

    # -- for the nodes ------------------------------------------------------------------

    async def start(
        self,
        run: Mapping[str, Any],
        messages: list[dict[str, Any]],
        user_state: Mapping[str, Any],
    ) -> dict[str, Any] | None:
        """Run `on_start` if this is the segment's first node (the calls of one step run
        concurrently: the others wait for it). Returns the hook states to write with this
        node's update when `on_start` changed them, else None."""
        if self.started:
            if self._starting is not None and not self._starting.done():
                await asyncio.shield(self._starting)
            return None
        self.started = True
        self.run_id = str(run.get("run_id") or "")
        self.user_state = user_state
        self.messages = messages
        self.run = run
        hooks = self.spec.hooks.on_start
        if not hooks:
            return None
        self._starting = asyncio.get_running_loop().create_future()
        try:
            before = dict(run.get("hooks") or {})
            states = await run_on_start(self.spec, self.run_id, messages, user_state, before)
        finally:
            self._starting.set_result(None)
        if states == before:
            return None
        self.hook_states = states
        return states

    async def start_from(self, config: RunnableConfig) -> dict[str, Any] | None:
        """`start` for a node that is not given the state (a `Send` task): it reads it."""
        if self.started:
            return await self.start(_EMPTY, [], _EMPTY)
        read: Callable[..., Any] | None = (config.get("configurable") or {}).get(_READ)
        values = read(["messages", "run", "state"], False) if read is not None else {}
        run = values.get("run") or {}
        states = await self.start(
            run, list(values.get("messages") or ()), values.get("state") or _EMPTY
        )
        return states

    def saw(
        self,
        messages: list[dict[str, Any]],
        new: list[dict[str, Any]],
        run: Mapping[str, Any],
    ) -> None:
        """What the node that just ran saw and added (for `on_end`'s context; joined only
        if `on_end` runs)."""
        self.messages = messages
        self.new = new
        self.run = run
        if run.get("stop_reason") is not None:
            self.outcome = outcome(run["stop_reason"])

    def outcome_after(self, exc: BaseException | None) -> Outcome:
        """How the invocation ended, by the one rule (`results.outcome`): a raise or a
        cancellation failed it, an interrupt going up (run as a subgraph) suspended it;
        otherwise as the nodes noted it (none did: it stopped before the end, it waits)."""
        if isinstance(exc, GraphBubbleUp):
            return outcome(None, waiting=True)
        if exc is not None:
            return outcome(None, error=True)
        return self.outcome or outcome(None)

    # -- for the graph's `astream` --------------------------------------------------------

    async def end(self, outcome: str) -> None:
        """Run `on_end` once (a segment no node ran in never started: nothing to end)."""
        if not self.started or not self.spec.hooks.on_end:
            return
        run = self.run
        states = self.hook_states if self.hook_states is not None else run.get("hooks") or {}
        await run_on_end(
            self.spec,
            self.run_id or str(run.get("run_id") or ""),
            [*self.messages, *self.new] if self.new else self.messages,
            int(run.get("model_calls") or 0),
            states,
            self.user_state,
            outcome,
        )


def invocation_of(config: RunnableConfig) -> Invocation | None:
    """The invocation a node runs in (None when there is nothing to do around the run)."""
    configurable = config.get("configurable")
    if not configurable:
        return None
    seg: Invocation | None = configurable.get(INVOCATION_KEY)
    return seg


async def run_on_start(
    spec: AgentSpec,
    run_id: str,
    messages: list[dict[str, Any]],
    state: Mapping[str, Any],
    hook_states: dict[str, Any],
) -> dict[str, Any]:
    """The agent's `on_start` hooks, in order; returns the hook states they left."""
    states = dict(hook_states)
    for name, fn in spec.hooks.on_start:
        ctx = HookContext(run_id, messages, 0, states.get(name), state)
        action = await call_run_hook(name, "on_start", fn, ctx)
        if action is None:
            continue
        if not isinstance(action, HookAction):
            raise HookFailedError(
                f"hook {name!r}: on_start must return HookAction(state=...) or None, got "
                f"{type(action).__name__}",
                hook=name,
                method="on_start",
            )
        if action.messages is not None or action.message is not None or action.end:
            raise HookFailedError(
                f"hook {name!r}: on_start may only save state (HookAction(state=...))",
                hook=name,
                method="on_start",
            )
        if action.saves_state:
            states[name] = action.state
    return states


async def run_on_end(
    spec: AgentSpec,
    run_id: str,
    messages: list[dict[str, Any]],
    model_calls: int,
    hook_states: Mapping[str, Any],
    state: Mapping[str, Any],
    outcome: str,
) -> None:
    """The agent's `on_end` hooks, in reverse order. They cannot change the outcome: a
    raise is logged, not raised."""
    for name, fn in spec.hooks.on_end:
        ctx = HookContext(run_id, messages, model_calls, hook_states.get(name), state)
        try:
            await call_hook(fn, ctx, outcome)
        except asyncio.CancelledError:
            if cancel_pending():
                raise
            # Raised by the hook itself (the run was not cancelled): its failure.
            logger.exception("hook %r raised asyncio.CancelledError in on_end (ignored)", name)
        except Exception:
            logger.exception("hook %r raised in on_end (ignored)", name)
