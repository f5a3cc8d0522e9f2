"""What the models of both OpenAI APIs (Chat Completions in `openai`, the Responses API
in `openai_responses`) share: how they reach the server and authenticate. Both import
it; neither imports the other for it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Required, Unpack

from criogen_graph.models.http import HttpModel, HttpOptions, base_url_and_key

__all__ = ["OPENAI_URL", "OpenAIConnection", "OpenAIHttpModel", "openai_endpoint"]

OPENAI_URL = "https://api.openai.com/v1"


class OpenAIConnection(HttpOptions, total=False):
    """How an OpenAI-style model reaches its server (see `OpenAIHttpModel`)."""

    api_key: Required[str | None]
    base_url: str
    provider: str
    headers: Mapping[str, str] | None
    key_header: str


class OpenAIHttpModel(HttpModel):
    """What the models of both OpenAI APIs share: OpenAI's URL unless `base_url` names
    another (compatible) server, whose name `provider` is; the key as a bearer token, or
    as the value of `key_header` (Azure's `api-key`)."""

    provider = "openai"

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None,
        base_url: str = OPENAI_URL,
        provider: str = "openai",
        headers: Mapping[str, str] | None = None,
        key_header: str = "authorization",
        **options: Unpack[HttpOptions],
    ) -> None:
        auth: dict[str, str] = {}
        if api_key:
            auth = (
                {"authorization": f"Bearer {api_key}"}
                if key_header == "authorization"
                else {key_header: api_key}
            )
        super().__init__(model, base_url=base_url, auth=auth, headers=headers, **options)
        self.provider = provider


def openai_endpoint(
    base_url: str | None,
    api_key: str | None,
    organization: str | None,
    headers: Mapping[str, str] | None,
    what: str,
) -> tuple[str, str | None, dict[str, str]]:
    """OpenAI's base URL and API key (see `base_url_and_key`), and `headers` with the
    organization's."""
    url, key = base_url_and_key(
        base_url,
        api_key,
        default_url=OPENAI_URL,
        url_env="OPENAI_BASE_URL",
        key_env="OPENAI_API_KEY",
        what=what,
    )
    extra = dict(headers or {})
    if organization:
        extra["openai-organization"] = organization
    return url, key, extra
