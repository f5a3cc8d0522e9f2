"""`Agent`: a model with tools and instructions, compiled into a LangGraph graph."""

from __future__ import annotations

import contextvars
import time
import uuid
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from criogen_graph._observe import observe, run_redactor
from criogen_graph._output import OutputSpec
from criogen_graph.adapters.models import resolve_model
from criogen_graph.approvals import Approval, compile_approvals
from criogen_graph.errors import (
    MODEL_ERROR_KINDS,
    LimitExceededError,
    ValidationError,
)
from criogen_graph.hooks import (
    compile_hooks,
)
from criogen_graph.middleware import Middleware, check_middleware
from criogen_graph.nodes.approval import APPROVAL_INTERRUPT
from criogen_graph.nodes.events import API_RUN
from criogen_graph.nodes.spec import AgentSpec
from criogen_graph.nodes.state import new_run
from criogen_graph.nodes.tools import ToolOutput
from criogen_graph.options import Limits, Retry
from criogen_graph.results import ApprovalRequest, PendingApprovals, RunResult, empty_usage
from criogen_graph.tools import Tool, ToolContext, ToolError, ToolSource, check_tool_name

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.graph.state import CompiledStateGraph

    from criogen_graph.adapters.models.base import Model
    from criogen_graph.memory import MemoryView
    from criogen_graph.redact import Redactor
    from criogen_graph.storage import Storage
    from criogen_graph.thread import Thread

__all__ = ["Agent", "AgentTool"]

Output = TypeVar("Output")

ON_TOOL_EXCEPTION = ("return_to_model", "return_generic", "fail")
#: How deep agents may call agents (`agent.as_tool`).
MAX_AGENT_DEPTH = 8
_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("criogen_agent_depth", default=0)


class Agent(Generic[Output]):
    """A model with tools, instructions and (optionally) approval, typed output, storage
    and memory.

    Each run calls the model, runs the tools it asks for (concurrently, results in call
    order), feeds the results back, and repeats until the model answers without tools or
    a limit is reached. Use `run()` for one-off tasks and `thread(id)` for conversations
    that are saved between calls. `agent.graph` is the compiled LangGraph graph.

    Raises `TypeError` for an entry of `tools` that is not a tool or a model string that
    names no known provider, and `ValidationError` for a provider whose key is missing or
    an option the agent does not accept.
    """

    def __init__(
        self,
        model: Any,
        *,
        instructions: str | None = None,
        tools: Iterable[Any] = (),
        approve: Iterable[str | Approval] = (),
        output: Any = None,
        limits: Limits | Mapping[str, Any] | None = None,
        on_tool_exception: str = "return_to_model",
        storage: Any = None,
        memory: Any = None,
        fallbacks: Sequence[Any] = (),
        fallback_on: Iterable[str] = (),
        model_retry: Retry | Mapping[str, Any] | None = None,
        tool_retry: Retry | Mapping[str, Any] | None = None,
        max_retry_after_secs: float = 60,
        telemetry: Any = None,
        hooks: Sequence[Any] = (),
        middleware: Sequence[Middleware] = (),
        redact: Any = None,
        name: str = "agent",
    ) -> None:
        primary = resolve_model(model, option="model")
        if isinstance(fallbacks, str | bytes) or not isinstance(fallbacks, Iterable):
            raise TypeError("fallbacks must be a list of models")
        models = (primary, *(resolve_model(m, option="fallbacks entry") for m in fallbacks))
        if instructions is not None and not isinstance(instructions, str):
            raise TypeError(f"instructions must be a str, got {type(instructions).__name__}")
        tool_map, sources = _collect_tools(tools)
        approvals = compile_approvals(approve)
        unknown = [t for t in approvals if t not in tool_map]
        if unknown and not sources:
            raise ValidationError(
                f"approve names {unknown}, which are not among the agent's tools "
                f"{sorted(tool_map)}",
                code="unknown",
            )
        if on_tool_exception not in ON_TOOL_EXCEPTION:
            raise ValidationError(
                f"on_tool_exception must be one of {list(ON_TOOL_EXCEPTION)}, got "
                f"{on_tool_exception!r}",
                code="invalid_value",
            )
        if isinstance(fallback_on, str):
            raise TypeError("fallback_on must be a list of error kinds, e.g. ['context_overflow']")
        kinds = frozenset(fallback_on)
        bad = sorted(k for k in kinds if k not in MODEL_ERROR_KINDS)
        if bad:
            raise ValidationError(
                f"fallback_on has unknown error kind(s) {bad}; kinds: {sorted(MODEL_ERROR_KINDS)}",
                code="invalid_value",
            )
        if isinstance(max_retry_after_secs, bool) or not isinstance(
            max_retry_after_secs, int | float
        ):
            raise TypeError("max_retry_after_secs must be a number")
        if max_retry_after_secs < 0:
            raise ValidationError("max_retry_after_secs must be >= 0", code="invalid_value")
        if memory is not None:
            from criogen_graph.memory import Memory

            if not isinstance(memory, Memory):
                raise TypeError(
                    f"memory must be a Memory (Memory.by_state(key) or Memory.shared()), got "
                    f"{memory!r}"
                )
            for t in memory.make_tools():
                if t.name in tool_map:
                    raise ValidationError(
                        f"the agent has a tool named {t.name!r}, like a memory tool; rename it "
                        "or pass Memory(..., tools=False)",
                        code="invalid_value",
                    )
                tool_map[t.name] = t
        from criogen_graph.redact import Redactor
        from criogen_graph.telemetry import Spans, Telemetry

        if redact is not None and not isinstance(redact, Redactor):
            raise TypeError(f"redact must be a Redactor (e.g. Redactor.pii()), got {redact!r}")
        if telemetry is not None and not isinstance(telemetry, Telemetry):
            raise TypeError(
                f"telemetry must be a Telemetry (Telemetry.otlp(url) or Telemetry.langfuse()), "
                f"got {telemetry!r}"
            )
        if not isinstance(name, str) or not name:
            raise TypeError("name must be a non-empty str")
        self.name = name
        self._spec = AgentSpec(
            models=models,
            instructions=instructions,
            tools=tool_map,
            approvals=approvals,
            output=OutputSpec(output) if output is not None else None,
            limits=Limits.coerce(limits),
            on_tool_exception=on_tool_exception,
            fallback_on=kinds,
            model_retry=Retry.coerce(model_retry, name="model_retry"),
            tool_retry=Retry.coerce(tool_retry, name="tool_retry"),
            max_retry_after_secs=float(max_retry_after_secs),
            hooks=compile_hooks(list(hooks) if not isinstance(hooks, Sequence) else hooks),
            middleware=check_middleware(middleware),
            name=name,
            sources=sources,
            memory=memory,
            spans=Spans(telemetry, redact) if telemetry is not None else None,
            redact=redact,
        )
        if storage is None:
            storage = "memory://"
        if isinstance(storage, str):
            from criogen_graph.storage import Storage

            storage = Storage(storage)
        elif not _is_storage(storage):
            raise TypeError(f"storage must be a Storage or a URL, got {storage!r}")
        self._storage: Storage = storage
        self._graph: CompiledStateGraph[Any, Any, Any, Any] | None = None
        self._thread_graphs: weakref.WeakKeyDictionary[Any, tuple[Any, Any]] = (
            weakref.WeakKeyDictionary()
        )
        self._memory_graph_cache: tuple[Any, Any] | None = None
        lim = self._spec.limits
        # Each model call takes at most three supersteps (model, approval, tools).
        self._config: RunnableConfig = {"recursion_limit": 3 * lim.model_calls + 10}

    # -- the graph -------------------------------------------------------------------

    @property
    def graph(self) -> CompiledStateGraph[Any, Any, Any, Any]:
        """The compiled LangGraph graph (no checkpointer bound): nodes `model`,
        `approval`, `tools`. Draw it, step through it, or serve it in LangGraph Studio."""
        if self._graph is None:
            from criogen_graph.graph import build_graph

            self._graph = build_graph(self._spec).compile(name=self.name)
        return self._graph

    def _thread_graph(
        self, storage: Storage, store: Any = None
    ) -> CompiledStateGraph[Any, Any, Any, Any]:
        """The graph compiled with the storage's checkpointer (and store, for memory),
        once per checkpointer."""
        saver = storage.checkpointer
        # By checkpointer, held weakly: each event loop has its own, and one that closed
        # (a storage per request, a loop per request) takes its graph with it.
        cached = self._thread_graphs.get(saver)
        if cached is not None and cached[1] is store:
            hit: CompiledStateGraph[Any, Any, Any, Any] = cached[0]
            return hit
        from criogen_graph.graph import build_graph

        graph = build_graph(self._spec).compile(checkpointer=saver, store=store, name=self.name)
        self._thread_graphs[saver] = (graph, store)
        return graph

    def _memory_graph(self, store: Any) -> CompiledStateGraph[Any, Any, Any, Any]:
        """For `run()` with memory: no checkpointer, the storage's store."""
        cached = self._memory_graph_cache
        if cached is not None and cached[0] is store:
            hit: CompiledStateGraph[Any, Any, Any, Any] = cached[1]
            return hit
        from criogen_graph.graph import build_graph

        graph = build_graph(self._spec).compile(store=store, name=self.name)
        self._memory_graph_cache = (store, graph)
        return graph

    @property
    def memory(self) -> MemoryView | None:
        """The agent's long-term memory, to read and change from code (None without one)."""
        if self._spec.memory is None:
            return None
        from criogen_graph.memory import MemoryView

        return MemoryView(self._spec.memory, self._storage)

    def _spec_named(self, name: str | None) -> AgentSpec:
        """This agent's spec, or that of the agent named `name` among the agents it uses
        as tools (at any depth): the one whose approval is pending."""
        if name is None or name == self.name:
            return self._spec
        seen: set[int] = set()
        stack = [t.agent for t in self._spec.tools.values() if isinstance(t, AgentTool)]
        while stack:
            agent = stack.pop()
            if id(agent) in seen:
                continue
            seen.add(id(agent))
            if agent.name == name:
                return agent._spec
            stack.extend(t.agent for t in agent._spec.tools.values() if isinstance(t, AgentTool))
        return self._spec

    def with_storage(self, storage: Storage | str) -> Agent[Output]:
        """This agent (same model, tools and options) keeping its threads in `storage`;
        `self` when that is already its storage."""
        import copy

        if isinstance(storage, str):
            from criogen_graph.storage import Storage

            storage = Storage(storage)
        elif not _is_storage(storage):
            raise TypeError(f"storage must be a Storage or a URL, got {storage!r}")
        if storage is self._storage:
            return self
        clone = copy.copy(self)
        clone._storage = storage
        clone._thread_graphs = weakref.WeakKeyDictionary()
        clone._memory_graph_cache = None
        return clone

    @property
    def spec(self) -> AgentSpec:
        """Internal: the agent's checked, compiled options, for the runtime's own modules
        (threads, the CLI, background workers). Not a stable interface for users."""
        return self._spec

    @property
    def storage(self) -> Storage:
        """The storage that keeps this agent's threads (in memory unless `storage=` says
        otherwise)."""
        return self._storage

    def thread(self, thread_id: str, *, actor: str | None = None) -> Thread[Output]:
        """The conversation `thread_id` (created on first use); `actor` names who acts, for
        the audit trail. Nothing is read or written until a method of the thread runs. An
        id no storage can keep (over 1,024 UTF-8 bytes, a NUL, a lone surrogate) raises
        `ValidationError` here."""
        from criogen_graph.thread import Thread

        return Thread(self, thread_id, actor=actor)

    @property
    def model(self) -> Model:
        """The primary model."""
        return self._spec.models[0]

    @property
    def tools(self) -> list[Tool]:
        """The agent's tools."""
        return list(self._spec.tools.values())

    # -- running ---------------------------------------------------------------------

    async def run(self, input: str, *, state: Mapping[str, Any] | None = None) -> RunResult[Output]:
        """Run once, with no thread: nothing is saved, and a run that stops for approval
        cannot be continued (use `thread(id).send(...)` for that).

        `state` is the run state (e.g. the key per-user memory reads). Raises
        `ModelError`, `LimitExceededError`, `ToolExecutionError`, or `CancelledError`
        when the awaiting task is cancelled.
        """
        started = time.perf_counter()
        _user_message(input)  # a bad input fails before anything is observed
        run_state = _check_state(state)
        run_id = uuid.uuid4().hex
        with observe(self._spec, action="run", run_id=run_id) as segment:
            user = _user_message(input, run_redactor(self._spec))
            result = await self._run(user, run_state, run_id, started)
            segment.done(result)
        self._raise_for_limit(result)
        return result

    async def _run(
        self, user: dict[str, Any], run_state: dict[str, Any], run_id: str, started: float
    ) -> RunResult[Output]:
        await self._spec.ensure_tools()
        if self._spec.memory is not None:
            self._spec.memory.pool(run_state)  # no model call without the scope key
            graph = self._memory_graph(await self._storage.get_store())
        else:
            graph = self.graph
        inp: dict[str, Any] = {"messages": (user,), "run": new_run(run_id), "state": run_state}
        # `on_start` / `on_end` run inside the graph (see `nodes.segment`), as they do
        # however LangGraph drives it.
        api_run = API_RUN.set(True)
        try:
            out = await graph.ainvoke(inp, self._config, version="v2")
        finally:
            API_RUN.reset(api_run)
        return self._result(out.value, out.interrupts, run_id, started)

    async def aclose(self) -> None:
        """Close what the agent opened: connections of its models and of its tool sources
        (MCP servers). The storage is not closed (other agents may share it)."""
        for source in self._spec.sources:
            await source.aclose()
        for model in self._spec.models:
            await model.aclose()

    async def __aenter__(self) -> Agent[Output]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def as_tool(self, name: str, description: str) -> AgentTool:
        """This agent as a tool of another agent: it takes `{"input": str}`, runs this
        agent, and returns its answer. Agents calling agents nest at most 8 deep."""
        return AgentTool(self, name, description)

    # -- helpers shared with Thread --------------------------------------------------

    def _result(
        self,
        values: dict[str, Any],
        interrupts: Sequence[Any],
        run_id: str,
        started: float,
        cls: type[RunResult[Any]] = RunResult,
        **extra: Any,
    ) -> RunResult[Output]:
        run = values.get("run") or {}
        messages: list[dict[str, Any]] = values.get("messages") or []
        approvals: list[ApprovalRequest] = []
        for intr in interrupts:
            value = getattr(intr, "value", None)
            if isinstance(value, Mapping) and value.get("type") == APPROVAL_INTERRUPT:
                approvals.extend(ApprovalRequest.from_dict(r) for r in value["requests"])
        stop = None if approvals else run.get("stop_reason")
        text: str | None = None
        output: Any = None
        if stop in ("final_answer", "max_tokens"):
            last = _last_assistant(messages)
            text = (last.get("content") or "") if last is not None else ""
            output = text
        elif stop == "output":
            spec_output = self._spec.output
            raw = run.get("output")
            output = spec_output.to_user(raw) if spec_output is not None else raw
        elif stop == "hook_end":
            output = run.get("output")
            text = output if isinstance(output, str) else None
        elif stop == "return_direct":
            text = run.get("output")
            output = text
        result = cls(
            text=text,
            output=output,
            messages=list(messages),  # the caller's own list, not the cached one
            usage=dict(run.get("usage") or empty_usage()),
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
            **extra,
        )
        if stop == "limit":
            result.limit = run.get("error") or {}
        return result

    @staticmethod
    def _raise_for_limit(result: RunResult[Any]) -> None:
        if result.stop_reason != "limit":
            return
        err = result.limit or {}
        limit = err.get("limit", "limit")
        value = err.get("value", 0)
        raise LimitExceededError(
            f"the run reached its {limit} limit ({value}); raise Limits({limit}=...) if the "
            "task needs more",
            limit=limit,
            value=value,
            result=result,
        )

    def __repr__(self) -> str:
        m = self._spec.models[0]
        return f"<Agent {self.name!r} {m.provider}:{m.name} tools={list(self._spec.tools)}>"


class AgentTool(Tool):
    """An agent as a tool of another agent (`agent.as_tool`): it takes `{"input": str}`
    and returns the sub-agent's answer. The sub-agent's token usage adds to the caller's."""

    def __init__(self, agent: Agent[Any], name: str, description: str) -> None:
        if not isinstance(agent, Agent):
            raise TypeError(f"AgentTool needs an Agent, got {agent!r}")
        check_tool_name(name)
        if not isinstance(description, str) or not description:
            raise TypeError("as_tool needs a description (what the agent does)")
        super().__init__(
            name,
            description,
            {
                "type": "object",
                "properties": {
                    "input": {
                        "type": "string",
                        "description": "The task or question for the agent.",
                    }
                },
                "required": ["input"],
                "additionalProperties": False,
            },
        )
        self.agent = agent

    def validate(self, args: Mapping[str, Any]) -> Any:
        from criogen_graph.tools import ToolArgumentsError

        if set(args) != {"input"} or not isinstance(args.get("input"), str):
            raise ToolArgumentsError("takes exactly one argument, input (a string)")
        return {"input": args["input"]}

    async def run(self, args: Any, ctx: ToolContext) -> Any:
        depth = _DEPTH.get()
        if depth >= MAX_AGENT_DEPTH:
            raise LimitExceededError(
                f"agent tool {self.name!r} would nest agents {depth + 1} deep; the limit is "
                f"{MAX_AGENT_DEPTH} (does an agent call itself?)",
                limit="agent_depth",
                value=MAX_AGENT_DEPTH,
            )
        token = _DEPTH.set(depth + 1)
        try:
            result = await self.agent.run(args["input"], state=dict(ctx.state))
        finally:
            _DEPTH.reset(token)
        if result.needs_approval:
            raise ToolError(
                f"the {self.name} agent stopped for approval of "
                f"{', '.join(a.tool for a in result.approvals)}, which cannot be answered from "
                "inside another agent's run in this version"
            )
        value = result.output if result.output is not None else (result.text or "")
        return ToolOutput(value, result.usage)


def _is_storage(value: object) -> bool:
    from criogen_graph.storage import Storage

    return isinstance(value, Storage)


def _collect_tools(tools: Iterable[Any]) -> tuple[dict[str, Tool], tuple[ToolSource, ...]]:
    if isinstance(tools, str | bytes | Tool | ToolSource) or not isinstance(tools, Iterable):
        raise TypeError("tools must be a list of tools")
    out: dict[str, Tool] = {}
    sources: list[ToolSource] = []
    for entry in tools:
        if isinstance(entry, ToolSource):
            sources.append(entry)
            continue
        if not isinstance(entry, Tool):
            hint = ""
            if callable(entry):
                hint = " (decorate the function with @tool)"
            raise TypeError(f"tools entry {entry!r} is not a tool{hint}")
        if entry.name in out:
            raise ValidationError(f"two tools are named {entry.name!r}", code="invalid_value")
        out[entry.name] = entry
    return out, tuple(sources)


def _user_message(input: Any, redactor: Redactor | None = None) -> dict[str, Any]:
    if not isinstance(input, str):
        raise TypeError(f"input must be a str (the user's message), got {type(input).__name__}")
    return {"role": "user", "content": redactor.redact(input) if redactor is not None else input}


def _check_state(state: Mapping[str, Any] | None) -> dict[str, Any]:
    if state is None:
        return {}
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a dict, got {type(state).__name__}")
    return dict(state)


def _last_assistant(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    for m in reversed(messages):
        if m.get("role") == "assistant":
            found: dict[str, Any] = m
            return found
    return None
