"""Provider models built from `"provider:model"` strings."""

from __future__ import annotations

from criogen_graph.adapters.models.base import Model


def from_string(provider: str, name: str) -> Model:
    """The model for a checked `"provider:model"` string (its key is in the environment)."""
    if provider == "openai":
        from criogen_graph.adapters.models.openai import openai

        return openai(name)
    if provider == "openai-responses":
        from criogen_graph.adapters.models.openai_responses import openai_responses

        return openai_responses(name)
    if provider == "openrouter":
        from criogen_graph.adapters.models.openai import openrouter

        return openrouter(name)
    if provider == "azure":
        from criogen_graph.adapters.models.openai import azure

        return azure(name)
    if provider == "anthropic":
        from criogen_graph.adapters.models.anthropic import anthropic

        return anthropic(name)
    if provider == "gemini":
        from criogen_graph.adapters.models.gemini import gemini

        return gemini(name)
    raise TypeError(f"unknown model provider {provider!r}")
