"""`ContextPolicy`: what a long thread sends the model, so it fits a token budget.

The stored transcript keeps every message; the model is sent a view of it: instructions,
tool schemas, a summary of what is older (written by a model), and the newest messages
verbatim. Old tool results are cleared first (cheap); a summary is written only when
that is not enough. The work happens in the model node (`graph.context`), so it applies
to `agent.run`, threads, background runs and a graph driven by LangGraph itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from criogen_graph.errors import ValidationError

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

    from criogen_graph.models.base import Model

__all__ = ["ContextPolicy"]

ON_OVERFLOW = ("compact", "fail")


@dataclass(frozen=True, slots=True)
class ContextPolicy:
    """How much of a thread the model is sent: `Agent(..., context=ContextPolicy(...))`.

    - `max_input_tokens`: the budget for one model call's input (instructions, tool
      schemas and transcript together). Tokens are counted from the provider's reported
      input tokens of the previous call plus an estimate for what is new (characters per
      token: 4 for OpenAI and compatible servers, Gemini and others; 3.5 for Anthropic).
    - `keep_last`: the newest messages always sent verbatim (a tool call is never split
      from its results, and the newest user message is always sent).
    - `summarize_with`: the model that summarizes older messages (a `Model`, a
      `"provider:model"` string or a LangChain chat model); None: the agent's own model.
      The summary call goes through the agent's retries, fallbacks and telemetry (a
      `chat` span with `criogen.summary = true`).
    - `clear_tool_results`: replace old tool results by a short placeholder before
      anything is summarized.
    - `on_overflow`: on a provider's context-overflow error, `"compact"` summarizes
      everything but the newest messages and retries the call once; `"fail"` raises it.

    Raises `ValidationError` for `keep_last < 1`, a budget that is not a positive int,
    or an unknown `on_overflow`; `Agent(...)` raises it for a budget below the agent's
    instructions plus tool schemas.
    """

    max_input_tokens: int
    keep_last: int = 10
    summarize_with: Model | str | BaseChatModel | None = None
    clear_tool_results: bool = True
    on_overflow: Literal["compact", "fail"] = "compact"

    def __post_init__(self) -> None:
        budget = self.max_input_tokens
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ValidationError(
                f"ContextPolicy max_input_tokens must be a positive int (a token budget), "
                f"got {budget!r}",
                code="invalid_value",
            )
        keep = self.keep_last
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValidationError(
                f"ContextPolicy keep_last must be an int >= 1 (the newest messages sent "
                f"verbatim), got {keep!r}",
                code="invalid_value",
            )
        if not isinstance(self.clear_tool_results, bool):
            raise ValidationError(
                "ContextPolicy clear_tool_results must be True or False", code="invalid_type"
            )
        if self.on_overflow not in ON_OVERFLOW:
            raise ValidationError(
                f"ContextPolicy on_overflow must be one of {list(ON_OVERFLOW)}, got "
                f"{self.on_overflow!r}",
                code="invalid_value",
            )
