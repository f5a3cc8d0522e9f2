"""The contract between the `model` node and a model: one request in, one reply out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from criogen_graph.messages import (
    AssistantMessage,
    Message,
    ModelIdentity,
    ModelStopReason,
    ToolCallData,
    Usage,
)
from criogen_graph.results import empty_usage

TextSink = Callable[[str], None]


def wire_call_id(call: ToolCallData) -> object:
    """The id to send a provider for a transcript call: the provider's own
    (`provider_id`, kept when the model node renamed a repeated or reused id to make it
    unique in its thread), else the call's id."""
    provider_id = call.get("provider_id")
    return call["id"] if provider_id is None else provider_id


@dataclass(slots=True)
class ModelRequest:
    """What the model node asks for.

    `messages` is the transcript with the system message (instructions) first; `tools` the
    offered tools as `{"name", "description", "parameters"}`; `output_schema` the JSON
    Schema the final answer must match (providers use their structured-output mode).
    `on_text`, when set, receives pieces of the answer as they are written; `on_reasoning`
    pieces of the model's reasoning (thinking) text, for models that show it.
    """

    messages: list[Message]
    tools: list[dict[str, Any]]
    output_schema: dict[str, Any] | None = None
    on_text: TextSink | None = None
    on_reasoning: TextSink | None = None


@dataclass(slots=True)
class ModelResponse:
    """One model reply: an assistant message dict (`content`, optional `tool_calls` of
    `{"id", "name", "args"}`, optional `reasoning` text and the provider's
    `reasoning_blocks` to send back), its token usage and, for a provider safety stop,
    `stop_reason="content_filter"`, for an answer cut off by the output-token cap
    `stop_reason="max_tokens"`."""

    message: AssistantMessage
    usage: Usage = field(default_factory=empty_usage)
    stop_reason: ModelStopReason | None = None


class Model:
    """Base class of every model object an `Agent` accepts (`FakeModel`, `FunctionModel`,
    provider models). `provider` and `name` are what `RunResult.answered_by` reports."""

    provider: str = "custom"
    name: str = "model"

    async def generate(self, request: ModelRequest) -> ModelResponse:
        """Answer one request; raise `ModelError` (with its `kind`) on failure."""
        raise NotImplementedError

    @property
    def identity(self) -> ModelIdentity:
        """`{"provider", "model"}` of this model."""
        return {"provider": self.provider, "model": self.name}

    async def aclose(self) -> None:
        """Release connections (no-op unless the model holds any)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.provider}:{self.name}>"
