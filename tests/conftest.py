from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers.openai_server import OpenAIServer


@pytest.fixture
def openai_server() -> Iterator[OpenAIServer]:
    """A scripted OpenAI-compatible server on 127.0.0.1."""
    with OpenAIServer() as server:
        yield server
