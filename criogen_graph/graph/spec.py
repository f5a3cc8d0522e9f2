"""What the nodes are built from: an agent's options, checked and compiled once."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from criogen_graph.approvals import Approval
from criogen_graph.errors import ValidationError
from criogen_graph.hooks import CompiledHooks
from criogen_graph.messages import SystemMessage
from criogen_graph.middleware import Middleware
from criogen_graph.models.base import Model
from criogen_graph.options import Limits, Retry
from criogen_graph.runtime.output import OutputSpec
from criogen_graph.tools import Tool, ToolSource


@dataclass(slots=True)
class AgentSpec:
    models: tuple[Model, ...]
    instructions: str | None = None
    tools: dict[str, Tool] = field(default_factory=dict)
    approvals: dict[str, Approval] = field(default_factory=dict)
    output: OutputSpec | None = None
    limits: Limits = field(default_factory=Limits)
    on_tool_exception: str = "return_to_model"
    fallback_on: frozenset[str] = frozenset()
    model_retry: Retry = field(default_factory=Retry)
    tool_retry: Retry = field(default_factory=Retry)
    max_retry_after_secs: float = 60
    hooks: CompiledHooks = field(default_factory=CompiledHooks)
    #: The user's middleware, outermost first.
    middleware: tuple[Middleware, ...] = ()
    name: str = "agent"
    #: Tools known only at run time; loaded once by `ensure_tools()`.
    sources: tuple[ToolSource, ...] = ()
    memory: Any = None
    #: `telemetry.Spans` when the agent exports telemetry.
    spans: Any = None
    #: The agent's `Redactor`.
    redact: Any = None
    #: The agent's `ContextPolicy` (None: the whole transcript is sent).
    context: Any = None
    #: The model that writes summaries (`context.summarize_with`), None: `models[0]`.
    summarizer: Model | None = None
    system_message: SystemMessage | None = field(init=False, default=None)
    tool_specs: list[dict[str, Any]] = field(init=False, default_factory=list)
    loaded: bool = field(init=False, default=False)
    _loading: asyncio.Lock | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.system_message = (
            {"role": "system", "content": self.instructions} if self.instructions else None
        )
        self.tool_specs = [t.spec() for t in self.tools.values()]
        self.loaded = not self.sources

    async def ensure_tools(self) -> None:
        """Load the tools of the sources (once), and check the approval rules against
        them. Cheap after the first call."""
        if self.loaded:
            return
        if self._loading is None:
            self._loading = asyncio.Lock()
        async with self._loading:
            if self.loaded:
                return
            tools = dict(self.tools)
            for source in self.sources:
                add_tools(
                    tools,
                    await source.load_tools(),
                    clash=functools.partial(_source_clash, source.name),
                )
            unknown = [name for name in self.approvals if name not in tools]
            if unknown:
                raise ValidationError(
                    f"approve names {unknown}, which are not among the agent's tools "
                    f"{sorted(tools)}",
                    code="unknown",
                )
            self.tools = tools
            self.tool_specs = [t.spec() for t in tools.values()]
            self.loaded = True


def add_tools(tools: dict[str, Tool], more: Iterable[Tool], *, clash: Callable[[str], str]) -> None:
    """Add `more` to `tools`, by name; a name already taken is a `ValidationError` whose
    message is `clash(name)` (what clashed, and how to fix it)."""
    for t in more:
        if t.name in tools:
            raise ValidationError(clash(t.name), code="invalid_value")
        tools[t.name] = t


def _source_clash(source: str, name: str) -> str:
    return f"{source} has a tool named {name!r}, like another tool of the agent; rename one"
