"""`Agent`: a model with tools and instructions, compiled into a LangGraph graph."""

from __future__ import annotations

import contextvars
import uuid
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypedDict, TypeVar, Unpack, overload

from criogen_graph.approvals import Approval, compile_approvals
from criogen_graph.errors import MODEL_ERROR_KINDS, LimitExceededError, ValidationError
from criogen_graph.graph.spec import AgentSpec, add_tools
from criogen_graph.graph.state import new_run
from criogen_graph.graph.tools import ToolOutput
from criogen_graph.hooks import compile_hooks
from criogen_graph.middleware import Middleware, check_middleware
from criogen_graph.models import resolve_model
from criogen_graph.options import Limits, Retry
from criogen_graph.results import RunResult
from criogen_graph.runtime.inputs import send_input, user_message
from criogen_graph.runtime.output import OutputSpec
from criogen_graph.runtime.runner import Head, Start, run_once
from criogen_graph.telemetry.observe import run_redactor
from criogen_graph.tools import Tool, ToolContext, ToolError, ToolSource, check_tool_name

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langchain_core.runnables import RunnableConfig
    from langgraph.graph.state import CompiledStateGraph

    from criogen_graph.context import ContextPolicy
    from criogen_graph.memory import Memory, MemoryView
    from criogen_graph.models.base import Model
    from criogen_graph.redact import Redactor
    from criogen_graph.storage import Storage
    from criogen_graph.telemetry import Spans, Telemetry
    from criogen_graph.thread import Thread

__all__ = ["Agent", "AgentOptions", "AgentTool"]

Output = TypeVar("Output")

ON_TOOL_EXCEPTION = ("return_to_model", "return_generic", "fail")
#: How deep agents may call agents (`agent.as_tool`).
MAX_AGENT_DEPTH = 8
_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("criogen_agent_depth", default=0)


class AgentOptions(TypedDict, total=False):
    """The keyword options of `Agent(...)` other than `output` (see `Agent`): one list
    for the two typed signatures, which differ only in `output`."""

    instructions: str | None
    tools: Iterable[Tool | ToolSource]
    approve: Iterable[str | Approval]
    limits: Limits | Mapping[str, Any] | None
    on_tool_exception: str
    storage: Storage | str | None
    memory: Memory | None
    fallbacks: Sequence[Model | str | BaseChatModel]
    fallback_on: Iterable[str]
    model_retry: Retry | Mapping[str, Any] | None
    tool_retry: Retry | Mapping[str, Any] | None
    max_retry_after_secs: float
    telemetry: Telemetry | None
    hooks: Sequence[object]
    middleware: Sequence[Middleware]
    redact: Redactor | None
    context: ContextPolicy | None
    name: str


class Agent(Generic[Output]):
    """A model with tools, instructions and (optionally) approval, typed output, storage
    and memory.

    Each run calls the model, runs the tools it asks for (concurrently, results in call
    order), feeds the results back, and repeats until the model answers without tools or
    a limit is reached. Use `run()` for one-off tasks and `thread(id)` for conversations
    that are saved between calls. `agent.graph` is the compiled LangGraph graph.

    `context=ContextPolicy(max_input_tokens=...)` keeps what each model call is sent
    within a token budget on threads that live long (older messages summarized, old tool
    results cleared; the storage keeps every message).

    Raises `TypeError` for an entry of `tools` that is not a tool or a model string that
    names no known provider, and `ValidationError` for a provider whose key is missing or
    an option the agent does not accept.
    """

    @overload
    def __init__(
        self: Agent[str],
        model: Model | str | BaseChatModel,
        *,
        output: None = None,
        **options: Unpack[AgentOptions],
    ) -> None: ...

    @overload
    def __init__(
        self: Agent[Output],
        model: Model | str | BaseChatModel,
        *,
        output: type[Output],
        **options: Unpack[AgentOptions],
    ) -> None: ...

    def __init__(
        self,
        model: Model | str | BaseChatModel,
        *,
        instructions: str | None = None,
        tools: Iterable[Tool | ToolSource] = (),
        approve: Iterable[str | Approval] = (),
        output: Any = None,
        limits: Limits | Mapping[str, Any] | None = None,
        on_tool_exception: str = "return_to_model",
        storage: Storage | str | None = None,
        memory: Memory | None = None,
        fallbacks: Sequence[Model | str | BaseChatModel] = (),
        fallback_on: Iterable[str] = (),
        model_retry: Retry | Mapping[str, Any] | None = None,
        tool_retry: Retry | Mapping[str, Any] | None = None,
        max_retry_after_secs: float = 60,
        telemetry: Telemetry | None = None,
        hooks: Sequence[object] = (),
        middleware: Sequence[Middleware] = (),
        redact: Redactor | None = None,
        context: ContextPolicy | None = None,
        name: str = "agent",
    ) -> None:
        models = _check_models(model, fallbacks)
        if instructions is not None and not isinstance(instructions, str):
            raise TypeError(f"instructions must be a str, got {type(instructions).__name__}")
        tool_map, sources = _collect_tools(tools)
        approvals = _check_approvals(approve, tool_map, sources)
        _check_choice("on_tool_exception", on_tool_exception, ON_TOOL_EXCEPTION)
        _check_retry_after(max_retry_after_secs)
        _add_memory_tools(memory, tool_map)
        spans = _check_observability(telemetry, redact)
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
            fallback_on=_check_fallback_on(fallback_on),
            model_retry=Retry.coerce(model_retry, name="model_retry"),
            tool_retry=Retry.coerce(tool_retry, name="tool_retry"),
            max_retry_after_secs=float(max_retry_after_secs),
            hooks=compile_hooks(list(hooks) if not isinstance(hooks, Sequence) else hooks),
            middleware=check_middleware(middleware),
            name=name,
            sources=sources,
            memory=memory,
            spans=spans,
            redact=redact,
            context=context,
            summarizer=_check_context(context),
        )
        if context is not None:
            _check_budget(self._spec)
        self._storage: Storage = _resolve_storage(storage if storage is not None else "memory://")
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
            from criogen_graph.graph.compiled import build_graph

            self._graph = build_graph(self._spec).compile(name=self.name)
        return self._graph

    def thread_graph(
        self, storage: Storage, store: Any = None
    ) -> CompiledStateGraph[Any, Any, Any, Any]:
        """Internal: the graph compiled with the storage's checkpointer (and store, for
        memory), once per checkpointer. For the runtime's own modules (threads, the
        run-segment runner); not a stable interface for users."""
        saver = storage.checkpointer
        # By checkpointer, held weakly: each event loop has its own, and one that closed
        # (a storage per request, a loop per request) takes its graph with it.
        cached = self._thread_graphs.get(saver)
        if cached is not None and cached[1] is store:
            hit: CompiledStateGraph[Any, Any, Any, Any] = cached[0]
            return hit
        from criogen_graph.graph.compiled import build_graph

        graph = build_graph(self._spec).compile(checkpointer=saver, store=store, name=self.name)
        self._thread_graphs[saver] = (graph, store)
        return graph

    def memory_graph(self, store: Any) -> CompiledStateGraph[Any, Any, Any, Any]:
        """Internal: the graph of `run()` with memory: no checkpointer, the storage's
        store. For the run-segment runner; not a stable interface for users."""
        cached = self._memory_graph_cache
        if cached is not None and cached[0] is store:
            hit: CompiledStateGraph[Any, Any, Any, Any] = cached[1]
            return hit
        from criogen_graph.graph.compiled import build_graph

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

    def spec_named(self, name: str | None) -> AgentSpec:
        """Internal: this agent's spec, or that of the agent named `name` among the
        agents it uses as tools (at any depth): the one whose approval is pending. For
        threads; not a stable interface for users."""
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
                return agent.spec
            stack.extend(t.agent for t in agent.spec.tools.values() if isinstance(t, AgentTool))
        return self._spec

    def with_storage(self, storage: Storage | str) -> Agent[Output]:
        """This agent (same model, tools and options) keeping its threads in `storage`;
        `self` when that is already its storage."""
        import copy

        storage = _resolve_storage(storage)
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
    def run_config(self) -> RunnableConfig:
        """Internal: the LangGraph config of the agent's runs (its recursion limit), for
        the run-segment runner. Not a stable interface for users."""
        return self._config

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
        # A bad input fails before anything is observed (the same checks as a send).
        _, run_state = send_input(self._spec, input, state)
        run_id = uuid.uuid4().hex
        spec = self._spec

        async def prepare(head: Head, graph: Any, cfg: RunnableConfig) -> Start:
            user = user_message(input, run_redactor(spec))
            inp = {"messages": (user,), "run": new_run(run_id), "state": run_state}
            return Start(inp, run_id, {})

        return await run_once(self, prepare)

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


def _resolve_storage(storage: object) -> Storage:
    if isinstance(storage, str):
        from criogen_graph.storage import Storage

        return Storage(storage)
    if not _is_storage(storage):
        raise TypeError(f"storage must be a Storage or a URL, got {storage!r}")
    return storage  # type: ignore[return-value]


def _check_models(model: object, fallbacks: object) -> tuple[Model, ...]:
    primary = resolve_model(model, option="model")
    if isinstance(fallbacks, str | bytes) or not isinstance(fallbacks, Iterable):
        raise TypeError("fallbacks must be a list of models")
    return (primary, *(resolve_model(m, option="fallbacks entry") for m in fallbacks))


def _check_context(context: object) -> Model | None:
    """Check `context=`; the model that writes its summaries, when not the agent's own."""
    if context is None:
        return None
    from criogen_graph.context import ContextPolicy

    if not isinstance(context, ContextPolicy):
        raise TypeError(
            f"context must be a ContextPolicy (e.g. ContextPolicy(max_input_tokens=100_000)), "
            f"got {context!r}"
        )
    if context.summarize_with is None:
        return None
    return resolve_model(context.summarize_with, option="ContextPolicy summarize_with")


def _check_budget(spec: AgentSpec) -> None:
    """A budget that cannot hold the instructions and tool schemas is a mistake."""
    from criogen_graph.graph.context import chars_per_token, head_tokens

    policy = spec.context
    head = head_tokens(spec, chars_per_token(spec.models[0]))
    if head >= policy.max_input_tokens:
        raise ValidationError(
            f"ContextPolicy max_input_tokens={policy.max_input_tokens} is below what every "
            f"call sends besides the conversation: the instructions and tool schemas take "
            f"~{head} tokens; raise max_input_tokens (or shorten them)",
            code="invalid_value",
        )


def _check_approvals(
    approve: Iterable[str | Approval], tool_map: dict[str, Tool], sources: tuple[ToolSource, ...]
) -> dict[str, Approval]:
    approvals = compile_approvals(approve)
    unknown = [t for t in approvals if t not in tool_map]
    if unknown and not sources:
        raise ValidationError(
            f"approve names {unknown}, which are not among the agent's tools {sorted(tool_map)}",
            code="unknown",
        )
    return approvals


def _check_choice(option: str, value: object, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValidationError(
            f"{option} must be one of {list(choices)}, got {value!r}",
            code="invalid_value",
        )


def _check_fallback_on(fallback_on: Iterable[str]) -> frozenset[str]:
    if isinstance(fallback_on, str):
        raise TypeError("fallback_on must be a list of error kinds, e.g. ['context_overflow']")
    kinds = frozenset(fallback_on)
    bad = sorted(k for k in kinds if k not in MODEL_ERROR_KINDS)
    if bad:
        raise ValidationError(
            f"fallback_on has unknown error kind(s) {bad}; kinds: {sorted(MODEL_ERROR_KINDS)}",
            code="invalid_value",
        )
    return kinds


def _check_retry_after(max_retry_after_secs: object) -> None:
    if isinstance(max_retry_after_secs, bool) or not isinstance(max_retry_after_secs, int | float):
        raise TypeError("max_retry_after_secs must be a number")
    if max_retry_after_secs < 0:
        raise ValidationError("max_retry_after_secs must be >= 0", code="invalid_value")


def _add_memory_tools(memory: object, tool_map: dict[str, Tool]) -> None:
    """Check `memory=` and add its tools to the agent's."""
    if memory is None:
        return
    from criogen_graph.memory import Memory

    if not isinstance(memory, Memory):
        raise TypeError(
            f"memory must be a Memory (Memory.by_state(key) or Memory.shared()), got {memory!r}"
        )
    add_tools(
        tool_map,
        memory.make_tools(),
        clash=lambda name: (
            f"the agent has a tool named {name!r}, like a memory tool; rename it "
            "or pass Memory(..., tools=False)"
        ),
    )


def _check_observability(telemetry: object, redact: object) -> Spans | None:
    """Check `telemetry=` and `redact=`; the spans the agent reports into."""
    from criogen_graph.redact import Redactor
    from criogen_graph.telemetry import Spans, Telemetry

    if redact is not None and not isinstance(redact, Redactor):
        raise TypeError(f"redact must be a Redactor (e.g. Redactor.pii()), got {redact!r}")
    if telemetry is not None and not isinstance(telemetry, Telemetry):
        raise TypeError(
            f"telemetry must be a Telemetry (Telemetry.otlp(url) or Telemetry.langfuse()), "
            f"got {telemetry!r}"
        )
    return Spans(telemetry, redact) if telemetry is not None else None


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
