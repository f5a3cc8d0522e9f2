"""Model adapters and the resolution of the `model=` option."""

from __future__ import annotations

import os
from typing import Any

from criogen_graph.errors import ValidationError
from criogen_graph.models.base import Model, ModelRequest, ModelResponse

__all__ = ["PROVIDER_KEYS", "Model", "ModelRequest", "ModelResponse", "resolve_model"]

#: provider -> the environment variables its key (and endpoint) come from.
PROVIDER_KEYS: dict[str, tuple[str, ...]] = {
    "openai": ("OPENAI_API_KEY",),
    "openai-responses": ("OPENAI_API_KEY",),
    "anthropic": ("ANTHROPIC_API_KEY",),
    "gemini": ("GEMINI_API_KEY",),
    "openrouter": ("OPENROUTER_API_KEY",),
    "azure": ("AZURE_OPENAI_API_KEY", "AZURE_OPENAI_ENDPOINT"),
}


def parse_model_string(value: str) -> tuple[str, str]:
    """Split `"provider:model"`; raises `TypeError` for an unknown provider."""
    provider, sep, name = value.partition(":")
    provider = provider.strip().lower()
    if not sep or not name.strip():
        raise TypeError(
            f"model string {value!r} is not 'provider:model' (e.g. 'openai:gpt-5-mini'); "
            f"providers: {sorted(PROVIDER_KEYS)}"
        )
    if provider not in PROVIDER_KEYS:
        raise TypeError(
            f"unknown model provider {provider!r} in {value!r}; known providers: "
            f"{sorted(PROVIDER_KEYS)} (or pass a model object)"
        )
    return provider, name.strip()


def resolve_model(value: Any, *, option: str = "model") -> Model:
    """The `Model` for a `model=` / `fallbacks=` entry.

    Accepts a `Model` object, a `langchain_core` chat model, or a `"provider:model"`
    string whose key must be set in the environment.
    """
    if isinstance(value, Model):
        return value
    if isinstance(value, str):
        provider, name = parse_model_string(value)
        missing = [var for var in PROVIDER_KEYS[provider] if not os.environ.get(var)]
        if missing:
            raise ValidationError(
                f"{option} {value!r} needs {' and '.join(missing)} in the environment; set "
                f"it (or put it in a .env file and call load_env()) or pass a model object",
                code="invalid_value",
            )
        from criogen_graph.models.providers import from_string

        return from_string(provider, name)
    from criogen_graph.models.langchain import LangChainModel, is_langchain_chat_model

    if is_langchain_chat_model(value):
        return LangChainModel(value)
    raise TypeError(
        f"{option} must be a 'provider:model' string, a model object (FakeModel, "
        f"FunctionModel, openai(...), ...) or a langchain chat model; got {value!r}"
    )
