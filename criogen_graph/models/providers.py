"""Provider models built from `"provider:model"` strings."""

from __future__ import annotations

import importlib
from typing import cast

from criogen_graph.models.base import Model

#: The factory of each provider, as (module, function): a provider's module (and its HTTP
#: client) loads only when a model string names it.
_FACTORIES = {
    "openai": ("openai", "openai"),
    "openai-responses": ("openai_responses", "openai_responses"),
    "openrouter": ("openai", "openrouter"),
    "azure": ("openai", "azure"),
    "anthropic": ("anthropic", "anthropic"),
    "gemini": ("gemini", "gemini"),
}


def from_string(provider: str, name: str) -> Model:
    """The model for a checked `"provider:model"` string (its key is in the environment)."""
    where = _FACTORIES.get(provider)
    if where is None:
        raise TypeError(f"unknown model provider {provider!r}")
    module, factory = where
    found = importlib.import_module(f"criogen_graph.models.{module}")
    return cast(Model, getattr(found, factory)(name))
