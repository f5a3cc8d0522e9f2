"""A graph that tests/test_studio.py serves beside the examples: a `CollectionTool` on a
SQLite file (`CRIOGEN_STUDIO_DOCS_DB`), so the storage opens inside a node of
`langgraph dev`, whose `blockbuster` turns blocking calls on the event loop into errors."""

from __future__ import annotations

import os
from typing import Any

from criogen_graph import Agent, CollectionTool, FakeReply, FunctionModel

docs = CollectionTool(
    "search_policies", storage=f"sqlite:///{os.environ['CRIOGEN_STUDIO_DOCS_DB']}"
)


def scripted(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    last = messages[-1]
    if last["role"] == "user":
        return FakeReply.tool_call("search_policies", {"query": str(last["content"])})
    return f"Found: {last['content']}"


graph = Agent(FunctionModel(scripted), tools=[docs], name="docs").graph
