"""Provider models built from `"provider:model"` strings."""

from __future__ import annotations

from criogen_graph.adapters.models.base import Model
from criogen_graph.errors import ValidationError


def from_string(provider: str, name: str) -> Model:
    """The model for a checked `"provider:model"` string whose key is set."""
    raise ValidationError(
        f"'{provider}:{name}': the HTTP provider adapters are not in this build yet; pass a "
        "langchain chat model (e.g. langchain_openai.ChatOpenAI) or a FakeModel instead",
        code="unsupported",
    )
