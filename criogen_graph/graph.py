"""The agent loop as a LangGraph `StateGraph`:

```
START -> model --(answer / output / end)--------------------------> END
           |--(tool calls, none gated)--> Send("tools", call) each --> model
           '--(a gated call)--> approval --interrupt()--> Send("tools", call) each --> model
```

`model` routes with `Command(goto=...)`, so the graph needs no traced branch functions;
`destinations` tells LangGraph (and Studio's drawing) where it can go.
"""

from __future__ import annotations

from typing import Any

from langgraph.graph import END, START, StateGraph

from criogen_graph.nodes.approval import ApprovalNode
from criogen_graph.nodes.model import ModelNode
from criogen_graph.nodes.spec import AgentSpec
from criogen_graph.nodes.state import AgentState
from criogen_graph.nodes.tools import ToolsNode

__all__ = ["AgentState", "build_graph"]


def build_graph(spec: AgentSpec) -> StateGraph[Any]:
    """The uncompiled graph of an agent: nodes `model`, `approval` and `tools`."""
    builder: StateGraph[Any] = StateGraph(AgentState)
    # The nodes are callables taking the state (or a Send payload); LangGraph's overloads
    # only type plain functions, hence the casts.
    model: Any = ModelNode(spec)
    approval: Any = ApprovalNode(spec)
    tools: Any = ToolsNode(spec)
    builder.add_node("model", model, destinations=("approval", "tools", "model", END))
    builder.add_node("approval", approval, destinations=("tools",))
    builder.add_node("tools", tools)
    builder.add_edge(START, "model")
    builder.add_edge("tools", "model")
    return builder
