"""criogen_graph: durable agents on LangGraph.

The small `Agent` / `Thread` / `Reply` / `Hook` API; underneath, a real LangGraph graph
(`agent.graph`) with `model`, `approval` and `tools` nodes.
"""

from typing import TYPE_CHECKING

from criogen_graph.agent import Agent, AgentTool
from criogen_graph.approvals import Approval
from criogen_graph.audit import read_audit
from criogen_graph.context import ContextPolicy
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
from criogen_graph.graph.compiled import AgentGraph
from criogen_graph.hooks import (
    Hook,
    HookAction,
    HookContext,
    HookFailedError,
    ToolCall,
    ToolResult,
)
from criogen_graph.messages import (
    AssistantMessage,
    ErrorCode,
    Message,
    ModelErrorKind,
    RunRecord,
    StopReason,
    SystemMessage,
    ToolCallData,
    ToolMessage,
    ToolStatus,
    Usage,
    UserMessage,
)
from criogen_graph.models.base import Model, ModelRequest, ModelResponse
from criogen_graph.options import Limits, Retry
from criogen_graph.redact import Redactor
from criogen_graph.results import ApprovalRequest, Decision, PendingApprovals, Reply, RunResult
from criogen_graph.telemetry import Telemetry
from criogen_graph.tools import Tool, ToolContext, ToolSource, tool

if TYPE_CHECKING:
    from criogen_graph.background import (
        RunFailedError,
        RunHandle,
        RunInfo,
        Worker,
        cancel_run,
        close_runs,
        get_run,
        list_runs,
    )
    from criogen_graph.env import load_env
    from criogen_graph.mcp import McpServer, McpServerError, McpTool
    from criogen_graph.memory import Memory, MemoryView
    from criogen_graph.memory.documents import CollectionTool
    from criogen_graph.models.anthropic import AnthropicModel, anthropic
    from criogen_graph.models.gemini import GeminiModel, gemini
    from criogen_graph.models.openai import OpenAIModel, azure, openai, openrouter
    from criogen_graph.models.openai_responses import (
        OpenAIResponsesModel,
        openai_responses,
    )
    from criogen_graph.models.testing import (
        FakeModel,
        FakeReply,
        FunctionModel,
        RecordingModel,
    )
    from criogen_graph.storage import Storage
    from criogen_graph.stream import (
        ApprovalNeededEvent,
        MessageEvent,
        OtherEvent,
        ReasoningEvent,
        Stream,
        StreamEvent,
        TextEvent,
        ToolCallFinishedEvent,
        ToolCallStartedEvent,
    )
    from criogen_graph.thread import Thread

from criogen_graph._version import __version__

# Loaded on first use, so `import criogen_graph` pays only for what an agent needs:
# provider factories (httpx), MCP, storage and threads (LangGraph's savers), streams,
# memory and documents.
_LAZY = {
    "openai": "criogen_graph.models.openai",
    "openrouter": "criogen_graph.models.openai",
    "azure": "criogen_graph.models.openai",
    "OpenAIModel": "criogen_graph.models.openai",
    "openai_responses": "criogen_graph.models.openai_responses",
    "OpenAIResponsesModel": "criogen_graph.models.openai_responses",
    "anthropic": "criogen_graph.models.anthropic",
    "AnthropicModel": "criogen_graph.models.anthropic",
    "gemini": "criogen_graph.models.gemini",
    "GeminiModel": "criogen_graph.models.gemini",
    "McpServer": "criogen_graph.mcp",
    "McpServerError": "criogen_graph.mcp",
    "McpTool": "criogen_graph.mcp",
    "FakeModel": "criogen_graph.models.testing.fake_model",
    "FakeReply": "criogen_graph.models.testing.fake_reply",
    "FunctionModel": "criogen_graph.models.testing.function_model",
    "RecordingModel": "criogen_graph.models.testing.recording_model",
    "CollectionTool": "criogen_graph.memory.documents",
    "load_env": "criogen_graph.env",
    "Memory": "criogen_graph.memory",
    "MemoryView": "criogen_graph.memory",
    "Storage": "criogen_graph.storage",
    "Thread": "criogen_graph.thread",
    **dict.fromkeys(
        (
            "RunFailedError",
            "RunHandle",
            "RunInfo",
            "Worker",
            "cancel_run",
            "close_runs",
            "get_run",
            "list_runs",
        ),
        "criogen_graph.background",
    ),
    **dict.fromkeys(
        (
            "ApprovalNeededEvent",
            "MessageEvent",
            "OtherEvent",
            "ReasoningEvent",
            "Stream",
            "StreamEvent",
            "TextEvent",
            "ToolCallFinishedEvent",
            "ToolCallStartedEvent",
        ),
        "criogen_graph.stream",
    ),
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'criogen_graph' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "Agent",
    "AgentGraph",
    "AgentTool",
    "AnthropicModel",
    "Approval",
    "ApprovalNeededEvent",
    "ApprovalRequest",
    "AssistantMessage",
    "CancelledError",
    "CollectionTool",
    "ContextPolicy",
    "CriogenError",
    "Decision",
    "ErrorCode",
    "FakeModel",
    "FakeReply",
    "FunctionModel",
    "GeminiModel",
    "Hook",
    "HookAction",
    "HookContext",
    "HookFailedError",
    "LimitExceededError",
    "Limits",
    "McpServer",
    "McpServerError",
    "McpTool",
    "Memory",
    "MemoryView",
    "Message",
    "MessageEvent",
    "Model",
    "ModelError",
    "ModelErrorKind",
    "ModelRequest",
    "ModelResponse",
    "OpenAIModel",
    "OpenAIResponsesModel",
    "OtherEvent",
    "PendingApprovals",
    "ReasoningEvent",
    "RecordingModel",
    "Redactor",
    "Reply",
    "Retry",
    "RunFailedError",
    "RunHandle",
    "RunInfo",
    "RunRecord",
    "RunResult",
    "StopReason",
    "Storage",
    "StorageError",
    "Stream",
    "StreamEvent",
    "SystemMessage",
    "Telemetry",
    "TextEvent",
    "Thread",
    "ThreadBusyError",
    "ThreadSuspendedError",
    "Tool",
    "ToolCall",
    "ToolCallData",
    "ToolCallFinishedEvent",
    "ToolCallStartedEvent",
    "ToolContext",
    "ToolError",
    "ToolExecutionError",
    "ToolMessage",
    "ToolResult",
    "ToolSource",
    "ToolStatus",
    "Usage",
    "UserMessage",
    "ValidationError",
    "Worker",
    "__version__",
    "anthropic",
    "azure",
    "cancel_run",
    "close_runs",
    "gemini",
    "get_run",
    "list_runs",
    "load_env",
    "openai",
    "openai_responses",
    "openrouter",
    "read_audit",
    "tool",
]
