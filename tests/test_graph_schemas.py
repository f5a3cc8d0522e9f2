"""The JSON schemas LangGraph's server and Studio read from `agent.graph` (its input form,
`/assistants/{id}/schemas`): they build on Python 3.11 (pydantic wants
`typing_extensions.TypedDict` below 3.12) and the input leaves out the internal `run`
channel."""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import pytest

from criogen_graph import Agent, FakeModel
from tests.conftest import ROOT


def _example_graphs() -> dict[str, str]:
    config = json.loads((ROOT / "langgraph.json").read_text())
    out: dict[str, str] = {}
    for name, entry in config["graphs"].items():
        out[name] = entry["path"] if isinstance(entry, dict) else entry
    return out


def _load(path: str) -> Any:
    file, attr = path.split(":")
    spec = importlib.util.spec_from_file_location(f"_example_{attr}", ROOT / file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, attr)


def _check_input(schema: dict[str, Any]) -> None:
    props = schema["properties"]
    assert set(props) == {"messages", "state"}, props
    assert props["messages"]["type"] == "array"
    roles = json.dumps(schema)
    for role in ("user", "assistant", "tool", "system"):
        assert f'"{role}"' in roles
    assert "run" not in props


@pytest.mark.parametrize("name", sorted(_example_graphs()))
def test_each_example_graph_has_an_input_and_output_schema(name: str) -> None:
    graph = _load(_example_graphs()[name])
    _check_input(graph.get_input_jsonschema())
    output = graph.get_output_jsonschema()
    assert {"messages", "run", "state"} <= set(output["properties"])
    # What Studio asks for: the input model validates a chat message.
    model = graph.get_input_schema()
    model.model_validate({"messages": [{"role": "user", "content": "hi"}]})


def test_a_compiled_builder_has_the_same_schemas() -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    agent = Agent(FakeModel(["hi"]))
    graph = agent.graph.builder.compile(checkpointer=InMemorySaver())
    _check_input(graph.get_input_jsonschema())
    assert "run" in graph.get_output_jsonschema()["properties"]
