"""What the nodes are built from: an agent's options, checked and compiled once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from criogen_graph._output import OutputSpec
from criogen_graph.adapters.models.base import Model
from criogen_graph.approvals import Approval
from criogen_graph.hooks import CompiledHooks
from criogen_graph.options import Limits, Retry
from criogen_graph.tools import Tool


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
    name: str = "agent"
    system_message: dict[str, Any] | None = field(init=False, default=None)
    tool_specs: list[dict[str, Any]] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.system_message = (
            {"role": "system", "content": self.instructions} if self.instructions else None
        )
        self.tool_specs = [t.spec() for t in self.tools.values()]
