"""The agent loop as a LangGraph `StateGraph`:

```
START -> model --(answer / output / end)--------------------------> END
           |--(tool calls, none gated)--> Send("tools", call) each --> model
           '--(a gated call)--> approval --interrupt()--> Send("tools", call) each --> model
```

`model` routes with `Command(goto=...)`, so the graph needs no traced branch functions;
`destinations` tells LangGraph (and Studio's drawing) where it can go.

The compiled graph is the whole agent: its `astream` (which `ainvoke`, `astream_events`,
a parent graph and LangGraph's server all go through) redacts new input, runs the hooks
of the run segment and keeps its audit records (see `graph.invocation`), so LangGraph
running the graph itself gets what our `Thread` gets.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import ensure_config
from langgraph.errors import GraphBubbleUp
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, GraphOutput, Overwrite, StateUpdate
from pydantic import BaseModel, TypeAdapter, create_model

from criogen_graph._aio import uncancelled
from criogen_graph.audit import SegmentAudit, answer_action
from criogen_graph.graph.approval import ApprovalNode
from criogen_graph.graph.events import API_RUN, CUSTOM_STREAM
from criogen_graph.graph.invocation import INVOCATION_KEY, Invocation
from criogen_graph.graph.model import ModelNode
from criogen_graph.graph.spec import AgentSpec
from criogen_graph.graph.state import (
    AgentInput,
    AgentState,
    admitted,
    as_langchain_message,
    normalize_message,
)
from criogen_graph.graph.tools import ToolsNode
from criogen_graph.messages import Message
from criogen_graph.redact import Redactor, effective
from criogen_graph.runtime.segment import SegmentSaver
from criogen_graph.telemetry import Spans
from criogen_graph.telemetry.observe import run_spans

__all__ = ["AgentGraph", "AgentState", "build_graph"]

_CHECKPOINTER = "__pregel_checkpointer"
_RUNTIME = "__pregel_runtime"
_CHECKPOINT_NS = "checkpoint_ns"
#: Where a parent graph that streams its subgraphs hands them its stream (with its modes).
_PARENT_STREAM = "__pregel_stream"


class _AgentBuilder(StateGraph[Any]):
    """The agent's `StateGraph`; compiling it (also as `agent.graph.builder.compile(...)`)
    gives an `AgentGraph`."""

    def __init__(self, spec: AgentSpec) -> None:
        super().__init__(AgentState)
        self.spec = spec

    def compile(self, *args: Any, **kwargs: Any) -> Any:
        graph = super().compile(*args, **kwargs)
        # LangGraph builds a plain `CompiledStateGraph`; ours only adds `astream`.
        graph.__class__ = AgentGraph
        return graph


class AgentGraph(CompiledStateGraph[Any, Any, Any, Any]):
    """An agent's compiled LangGraph graph (`agent.graph`): a `CompiledStateGraph` whose
    runs, however LangGraph drives them, redact new input with the agent's policy, run
    `on_start` / `on_end` once per run segment, and keep audit records in the run's store
    when the checkpointer is not ours (see `criogen_graph.audit`)."""

    def get_input_schema(self, config: RunnableConfig | None = None) -> type[BaseModel]:
        """The input LangGraph's server and Studio offer (`AgentInput`): new messages and
        the run state, not the graph's own `run` channel."""
        if getattr(self.builder, "spec", None) is None:
            return super().get_input_schema(config)
        fields: dict[str, Any] = {
            "messages": (list[Message] | None, None),
            "state": (dict[str, Any] | None, None),
        }
        model: type[BaseModel] = create_model(self.get_name("Input"), **fields)
        return model

    def get_input_jsonschema(self, config: RunnableConfig | None = None) -> dict[str, Any]:
        if getattr(self.builder, "spec", None) is None:
            return super().get_input_jsonschema(config)
        schema: dict[str, Any] = TypeAdapter(AgentInput).json_schema()
        return schema

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        """LangGraph's `ainvoke`; run inside another LangGraph graph (as its node, or
        from a node's code), the messages it returns are LangChain messages, as the
        parent's `add_messages` (`MessagesState`) takes them (see
        `graph.state.as_langchain_message`)."""
        out = await super().ainvoke(input, config, **kwargs)
        if API_RUN.get() or not _in_parent_graph(config):
            return out
        if isinstance(out, GraphOutput):
            return GraphOutput(_for_parent(out.value), out.interrupts)
        return _for_parent(out)

    def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        spec: AgentSpec | None = getattr(self.builder, "spec", None)
        if spec is None:
            return super().astream(input, config, **kwargs)
        audit: SegmentAudit | None = None
        spans: Spans | None = None
        if not API_RUN.get():
            # Driven by LangGraph itself: our API redacts its input, keeps its audit
            # trail and opens the run's span before it gets here.
            redactor = effective(spec.redact)
            input = _read_input(input, redactor)
            audit = self._store_audit(config, redactor)
            if audit is not None:
                _note_action(audit, input)
            config = self._with_listeners(config, kwargs)
            spans = run_spans(spec)
        hooks = spec.hooks
        if not hooks.on_start and not hooks.on_end and audit is None and spans is None:
            configurable = (config or {}).get("configurable")
            if configurable and configurable.get(INVOCATION_KEY) is not None:
                # Run inside another agent's segment (a subgraph): not ours to note.
                config = {**(config or {}), "configurable": {**configurable, INVOCATION_KEY: None}}
            return super().astream(input, config, **kwargs)
        seg = Invocation(spec, note_records=audit is not None)
        config = {**(config or {})}
        config["configurable"] = {**(config.get("configurable") or {}), INVOCATION_KEY: seg}
        if spans is not None:
            return self._observed(spans, spec, input, config, kwargs, seg, audit)
        return self._segment(input, config, kwargs, seg, audit)

    def bulk_update_state(
        self, config: RunnableConfig, supersteps: Sequence[Sequence[StateUpdate]]
    ) -> RunnableConfig:
        return super().bulk_update_state(config, self._redacted_updates(supersteps))

    async def abulk_update_state(
        self, config: RunnableConfig, supersteps: Sequence[Sequence[StateUpdate]]
    ) -> RunnableConfig:
        return await super().abulk_update_state(config, self._redacted_updates(supersteps))

    def _redacted_updates(
        self, supersteps: Sequence[Sequence[StateUpdate]]
    ) -> Sequence[Sequence[StateUpdate]]:
        """`update_state` writes into the thread without running the graph: the new
        messages it brings are redacted like graph input."""
        spec: AgentSpec | None = getattr(self.builder, "spec", None)
        redactor = effective(spec.redact) if spec is not None else None
        if redactor is None:
            return supersteps
        return [
            [
                u._replace(values=_read_input(u.values, redactor))
                if isinstance(u.values, Mapping)
                else u
                for u in step
            ]
            for step in supersteps
        ]

    def _with_listeners(self, config: RunnableConfig | None, kwargs: dict[str, Any]) -> Any:
        """`config` saying whether anyone reads LangGraph's `custom` stream mode (this
        call's, or its parent graph's when that streams its subgraphs): if not, the
        nodes build no events and no model streams for them (`graph.events`)."""
        modes = kwargs.get("stream_mode") or self.stream_mode
        listened = "custom" in ((modes,) if isinstance(modes, str) else modes)
        if not listened:
            parent = (ensure_config(config).get("configurable") or {}).get(_PARENT_STREAM)
            listened = "custom" in (getattr(parent, "modes", None) or ())
        return {
            **(config or {}),
            "configurable": {**((config or {}).get("configurable") or {}), CUSTOM_STREAM: listened},
        }

    async def _observed(
        self,
        spans: Spans,
        spec: AgentSpec,
        input: Any,
        config: RunnableConfig,
        kwargs: dict[str, Any],
        seg: Invocation,
        audit: SegmentAudit | None,
    ) -> AsyncIterator[Any]:
        """`_segment` in the run segment's `invoke_agent` span, as our API opens it."""
        configurable = config.get("configurable") or {}
        metadata = config.get("metadata") or {}
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": spec.name,
            "gen_ai.conversation.id": configurable.get("thread_id"),
            "criogen.action": _action(input),
            "criogen.actor": configurable.get("actor") or metadata.get("actor"),
        }
        with spans.span(f"invoke_agent {spec.name}", attributes) as span:
            try:
                async for chunk in self._segment(input, config, kwargs, seg, audit):
                    yield chunk
            except BaseException as exc:
                spans.set(span, _span_end(seg, seg.outcome_after(exc)))
                raise
            spans.set(span, _span_end(seg, seg.outcome_after(None)))

    async def _segment(
        self,
        input: Any,
        config: RunnableConfig,
        kwargs: dict[str, Any],
        seg: Invocation,
        audit: SegmentAudit | None,
    ) -> AsyncIterator[Any]:
        try:
            async for chunk in super().astream(input, config, **kwargs):
                yield chunk
        except GraphBubbleUp as up:
            # Run as a subgraph, it stopped for approval: the interrupt goes up.
            await uncancelled(self._end(seg, audit, seg.outcome_after(up), None))
            raise
        except BaseException as exc:
            # A raise, a cancellation (a timeout, a client gone), or the consumer leaving.
            await uncancelled(self._end(seg, audit, seg.outcome_after(exc), exc))
            raise
        await self._end(seg, audit, seg.outcome_after(None), None)

    @staticmethod
    async def _end(
        seg: Invocation, audit: SegmentAudit | None, outcome: str, exc: BaseException | None
    ) -> None:
        try:
            await seg.end(outcome)
        finally:
            if audit is not None:
                audit.run_id = seg.run_id or None
                if seg.decisions is not None:
                    audit.decided(seg.decisions)
                audit.tool_calls(seg.records)
                if exc is not None:
                    cancelled = isinstance(exc, asyncio.CancelledError | GeneratorExit)
                    text = str(exc)
                    audit.add(
                        "run_cancelled" if cancelled else "run_failed",
                        error=type(exc).__name__,
                        message=text[:2000],
                    )
                await audit.write(seg.run_id or None)

    def _store_audit(
        self, config: RunnableConfig | None, redactor: Redactor | None
    ) -> SegmentAudit | None:
        """Where a run LangGraph drives keeps its audit records: our storage's table when
        the checkpointer is ours, else the run's store (none without a thread id)."""
        configurable = (config or {}).get("configurable") or {}
        thread_id = configurable.get("thread_id")
        if thread_id is None or thread_id == "":
            return None
        metadata = (config or {}).get("metadata") or {}
        actor = (
            configurable.get("actor")
            or metadata.get("actor")
            or configurable.get("langgraph_auth_user_id")
            or None
        )
        checkpointer = self.checkpointer or configurable.get(_CHECKPOINTER)
        if isinstance(checkpointer, SegmentSaver):
            if checkpointer.audit_writer is None:
                return None
            return SegmentAudit(
                None, str(thread_id), actor, redactor, writer=checkpointer.audit_writer
            )
        store = self.store
        if store is None:
            runtime = configurable.get(_RUNTIME)
            store = getattr(runtime, "store", None)
        if store is None:
            return None
        return SegmentAudit(store, str(thread_id), actor, redactor)


def _action(input: Any) -> str:
    """What started a segment LangGraph drives, as our API names it."""
    if isinstance(input, Command):
        return answer_action(input.resume) if input.resume is not None else "update"
    return "retry" if input is None else "send"


def _span_end(seg: Invocation, outcome: str) -> dict[str, Any]:
    """The `invoke_agent` span's closing attributes, from what the nodes noted."""
    run = seg.run
    usage = run.get("usage") or {}
    return {
        "criogen.outcome": outcome,
        "criogen.stop_reason": run.get("stop_reason"),
        "criogen.run_id": seg.run_id or run.get("run_id"),
        "gen_ai.usage.input_tokens": usage.get("input_tokens", 0),
        "gen_ai.usage.output_tokens": usage.get("output_tokens", 0),
        "criogen.model_calls": run.get("model_calls", 0),
        "criogen.tool_calls": run.get("tool_calls", 0),
    }


def _in_parent_graph(config: RunnableConfig | None) -> bool:
    """Whether the graph runs inside a parent LangGraph graph: its config (or the one
    LangGraph set in context for the node that calls it) names a parent namespace."""
    configurable = ensure_config(config).get("configurable") or {}
    return bool(configurable.get(_CHECKPOINT_NS))


def _for_parent(values: Any) -> Any:
    """The output values with their messages as LangChain messages."""
    if not isinstance(values, Mapping):
        return values
    messages = values.get("messages")
    if not isinstance(messages, list | tuple):
        return values
    return {**values, "messages": [as_langchain_message(m) for m in messages]}


def _read_input(input: Any, redactor: Redactor | None) -> Any:
    """New messages as transcript dicts (a tuple: LangGraph gives the message dicts of a
    *list* written to a channel made-up ids, and turns them into LangChain messages), and
    with approval answers, with the agent's policy applied, before LangGraph keeps them
    (in the state, the input checkpoint, the resume write)."""
    if isinstance(input, Mapping) and input.get("messages") is not None:
        return {**input, "messages": _read_messages(input["messages"], redactor)}
    if isinstance(input, Command):
        resume = input.resume
        if resume is not None and redactor is not None:
            # The values only: the keys are call ids (or interrupt ids) to match.
            if isinstance(resume, Mapping):
                resume = {k: redactor.redact_value(v) for k, v in resume.items()}
            else:
                resume = redactor.redact_value(resume)
        update = input.update
        if isinstance(update, Mapping) and update.get("messages") is not None:
            update = {**update, "messages": _read_messages(update["messages"], redactor)}
        return Command(graph=input.graph, update=update, resume=resume, goto=input.goto)
    return input


def _read_messages(messages: Any, redactor: Redactor | None) -> Any:
    if isinstance(messages, Overwrite):
        if redactor is None:
            return messages  # a replaced transcript: the reducer is not asked
        return Overwrite(list(_read_messages(messages.value, redactor)))
    items = messages if isinstance(messages, list | tuple) else [messages]
    try:
        return tuple(admitted(items, redactor))
    except ValueError:
        return messages  # the reducer raises, saying what is wrong


def _note_action(audit: SegmentAudit, input: Any) -> None:
    """The record of what started the segment: a message, an answer, a retry."""
    if isinstance(input, Mapping) and input.get("messages") is not None:
        items = input["messages"]
        items = items if isinstance(items, list | tuple) else [items]
        users = [m for m in map(_readable, items) if m is not None and m["role"] == "user"]
        text = users[-1].get("content") if users else None
        audit.add("send", input=text)
    elif isinstance(input, Command) and input.resume is not None:
        audit.add(answer_action(input.resume), answer=input.resume)
    elif isinstance(input, Command):
        audit.add("update")
    elif input is None:
        audit.add("retry")


def _readable(m: Any) -> Message | None:
    """`m` as a transcript dict (a parent graph's LangChain message too), or None for
    what is no message; the reducer says why when it reads it."""
    try:
        return normalize_message(m)
    except ValueError:
        return None


def build_graph(spec: AgentSpec) -> StateGraph[Any]:
    """The uncompiled graph of an agent: nodes `model`, `approval` and `tools`."""
    builder = _AgentBuilder(spec)
    # The nodes are callables taking the state (or a Send payload); LangGraph's overloads
    # only type plain functions, hence the casts.
    model: Any = ModelNode(spec)
    approval: Any = ApprovalNode(spec)
    tools: Any = ToolsNode(spec)
    builder.add_node("model", model, destinations=("approval", "tools", "model", END))
    builder.add_node("approval", approval, destinations=("tools",))
    builder.add_node("tools", tools)
    builder.add_edge(START, "model")
    builder.add_edge("tools", "model")
    return builder
