"""criogen_graph: durable agents on LangGraph.

The small `Agent` / `Thread` / `Reply` / `Hook` API; underneath, a real LangGraph graph
(`agent.graph`) with `model`, `approval` and `tools` nodes.
"""

from criogen_graph.adapters.models.base import Model, ModelRequest, ModelResponse
from criogen_graph.adapters.models.fake import FakeModel, FakeReply, FunctionModel
from criogen_graph.agent import Agent, AgentTool
from criogen_graph.approvals import Approval
from criogen_graph.env import load_env
from criogen_graph.errors import (
    CancelledError,
    CriogenError,
    LimitExceededError,
    ModelError,
    StorageError,
    ThreadBusyError,
    ThreadSuspendedError,
    ToolError,
    ToolExecutionError,
    ValidationError,
)
from criogen_graph.hooks import (
    Hook,
    HookAction,
    HookContext,
    HookFailedError,
    ToolCall,
    ToolResult,
)
from criogen_graph.options import Limits, Retry
from criogen_graph.results import ApprovalRequest, Decision, Reply, RunResult
from criogen_graph.storage import Storage
from criogen_graph.stream import (
    ApprovalNeededEvent,
    MessageEvent,
    OtherEvent,
    Stream,
    StreamEvent,
    TextEvent,
    ToolCallFinishedEvent,
    ToolCallStartedEvent,
)
from criogen_graph.thread import Thread
from criogen_graph.tools import Tool, ToolContext, tool

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentTool",
    "Approval",
    "ApprovalNeededEvent",
    "ApprovalRequest",
    "CancelledError",
    "CriogenError",
    "Decision",
    "FakeModel",
    "FakeReply",
    "FunctionModel",
    "Hook",
    "HookAction",
    "HookContext",
    "HookFailedError",
    "LimitExceededError",
    "Limits",
    "MessageEvent",
    "Model",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "OtherEvent",
    "Reply",
    "Retry",
    "RunResult",
    "Storage",
    "StorageError",
    "Stream",
    "StreamEvent",
    "TextEvent",
    "Thread",
    "ThreadBusyError",
    "ThreadSuspendedError",
    "Tool",
    "ToolCall",
    "ToolCallFinishedEvent",
    "ToolCallStartedEvent",
    "ToolContext",
    "ToolError",
    "ToolExecutionError",
    "ToolResult",
    "ValidationError",
    "__version__",
    "load_env",
    "tool",
]
