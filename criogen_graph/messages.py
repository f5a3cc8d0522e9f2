"""The shapes of the data a run passes around, as types: transcript messages, tool calls,
token usage, the run's bookkeeping record, and the closed sets of names (stop reasons,
model error kinds, tool statuses, error codes).

Everything here is a `TypedDict` or a `Literal`: at run time messages stay the plain dicts
the API documents (JSON-ready, saved as they are in checkpoints), and these types only
tell a type checker (and a reader) which keys they have. Messages may carry keys not
listed here (a provider's own, a hook's): the listed ones are those the library writes
or reads.

This module imports nothing of the package, so any module may use it.
"""

from typing import Any, Literal, NotRequired, TypeAlias

# Not `typing.TypedDict`: pydantic (LangGraph's JSON schemas of the graph, which Studio
# reads) refuses it below Python 3.12.
from typing_extensions import TypedDict

__all__ = [
    "AssistantMessage",
    "Content",
    "DecisionType",
    "ErrorCode",
    "LimitName",
    "LimitRecord",
    "Message",
    "ModelAttempt",
    "ModelErrorKind",
    "ModelIdentity",
    "ModelStopReason",
    "ReasoningItem",
    "Role",
    "RunRecord",
    "StopReason",
    "SystemMessage",
    "ToolCallData",
    "ToolErrorKind",
    "ToolMessage",
    "ToolStatus",
    "Usage",
    "UsageKey",
    "UserMessage",
]

#: The role of a transcript message.
Role: TypeAlias = Literal["system", "user", "assistant", "tool"]

#: The stop reasons a model reply itself may carry (`ModelResponse.stop_reason`): a
#: provider's safety stop, or an answer cut off by the output-token cap.
ModelStopReason: TypeAlias = Literal["content_filter", "max_tokens"]

#: Why a run ended (`RunResult.stop_reason`; `None` while it waits for approval): a
#: model's own stop reason ends the run too.
StopReason: TypeAlias = Literal[
    "final_answer", "output", "return_direct", "hook_end", "limit", ModelStopReason
]

#: Every `ModelError.kind` (equal to `errors.MODEL_ERROR_KINDS`). The first four are the
#: transient kinds, retried and moved on to fallbacks.
ModelErrorKind: TypeAlias = Literal[
    "rate_limit",
    "transient",
    "timeout",
    "connection",
    "context_overflow",
    "content_filter",
    "auth",
    "bad_request",
    "not_found",
]

#: The status of a tool message: the tool ran and returned (`ok`), raised or was told
#: to fail (`error`), ran out of time (`timeout`); or it did not run, a hook, a decision
#: or the run's end having answered for it (`skipped`), or a reviewer rejected it
#: (`rejected`).
ToolStatus: TypeAlias = Literal["ok", "error", "timeout", "skipped", "rejected"]

#: Why a tool call failed before its tool function ran (a tool message's `error_kind`):
#: a `before_tool` hook failed, the arguments did not fit the schema, or no tool has the
#: name the model called.
ToolErrorKind: TypeAlias = Literal["hook", "invalid_args", "unknown_tool"]

#: The kinds of a reviewer's decision (`Decision.type`).
DecisionType: TypeAlias = Literal["approve", "edit", "reject", "respond"]

#: The limits of `Limits` a run can reach (`LimitExceededError.limit`).
LimitName: TypeAlias = Literal["model_calls", "tool_calls", "tokens", "agent_depth"]

#: Every `CriogenError.code` the library raises: the default of each error class and the
#: codes given to `ValidationError`, `StorageError` and the others.
ErrorCode: TypeAlias = Literal[
    "error",
    # the default code of each error class
    "cancelled",
    "hook_failed",
    "limit_exceeded",
    "mcp_unavailable",
    "middleware_failed",
    "model_error",
    "run_failed",
    "storage_error",
    "thread_busy",
    "thread_suspended",
    "tool_error",
    "tool_failed",
    # what is wrong with input (`ValidationError`)
    "invalid_type",
    "invalid_url",
    "invalid_value",
    "missing",
    "missing_dependency",
    "missing_extra",
    "not_suspended",
    "nothing_to_retry",
    "stale",
    "unknown",
    # storages, background runs and MCP servers
    "bad_payload",
    "busy",
    "closed",
    "database_error",
    "encryption",
    "lock_lost",
    "mcp_connection_lost",
    "not_a_database",
    "setup_timeout",
    "superseded",
    "unknown_agent",
    "unreachable",
    "unwritable",
]

#: A message's content: text, or (a user's input, a LangChain message) a list of content
#: blocks such as `{"type": "text", "text": ...}` or an image.
Content: TypeAlias = str | list[Any]


#: The keys of `Usage`.
UsageKey: TypeAlias = Literal[
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
]


class Usage(TypedDict):
    """Token usage (of a model call, a run, a sub-agent's run). `input_tokens` is the whole
    prompt, cached parts included (`cache_read_tokens`, `cache_write_tokens` break them
    out); `reasoning_tokens` are part of `output_tokens`."""

    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    reasoning_tokens: int


class ModelIdentity(TypedDict):
    """Which model answered: `{"provider", "model"}` (`Model.identity`)."""

    provider: str
    model: str


class ModelAttempt(TypedDict):
    """One failed model call behind a `ModelError` (its `attempts`, primary first)."""

    provider: str | None
    model: str | None
    kind: ModelErrorKind
    message: str


class ToolCallData(TypedDict):
    """One tool call of an assistant message.

    `args_error` says why the model's arguments could not be read (not JSON, not an
    object); the call is answered with it instead of running. `provider_id` is the
    provider's own id when the model node renamed a repeated one (see
    `graph.state.unique_call_ids`): that one goes back to the provider. `gemini_id` and
    `thought_signature` are what Gemini wants back with the call.
    """

    id: str
    name: str
    args: dict[str, Any]
    args_error: NotRequired[str]
    provider_id: NotRequired[object]
    gemini_id: NotRequired[str]
    thought_signature: NotRequired[str]


class ReasoningItem(TypedDict):
    """A reasoning item of OpenAI's Responses API, kept to be sent back next turn:
    its summary parts, and what lets a server without stored items (`store: false`)
    read it again: the encrypted reasoning (`encrypted_content`, OpenAI) or the
    reasoning text itself (`content`, one string per `reasoning_text` part: DeepSeek,
    gpt-oss through OpenRouter)."""

    id: str
    summary: list[str]
    encrypted_content: NotRequired[str]
    content: NotRequired[list[str]]


class SystemMessage(TypedDict):
    """Instructions (the agent's own, recalled memory, or a caller's)."""

    role: Literal["system"]
    content: Content
    id: NotRequired[str]


class UserMessage(TypedDict):
    """What the user said. `kind` marks one the agent wrote itself: `"output_retry"`, the
    correction asked for when a typed answer did not fit its schema; `"summary"`, the
    summary of older messages a `ContextPolicy` sends instead of them (only in what the
    model is sent, `thread.context()`, never in the stored transcript)."""

    role: Literal["user"]
    content: Content
    id: NotRequired[str]
    kind: NotRequired[Literal["output_retry", "summary"]]


class AssistantMessage(TypedDict):
    """A model's reply: its text, the tools it calls, and what the provider showed of its
    reasoning.

    `reasoning` is the thinking (or summary) text; `reasoning_field` the Chat Completions
    field it came in (sent back there in a tool loop); `reasoning_blocks` Anthropic's
    thinking blocks with their signatures and its server-tool blocks (a web search's
    `server_tool_use` and `web_search_tool_result`, ...), in their order, and
    `reasoning_items` the Responses API's items, both sent back unchanged. `phase` is
    what the Responses API called the text (`"commentary"`, a preamble before tool
    calls, or `"final_answer"`), and `commentary` the preamble of a reply whose
    `content` is its final answer; both go back with the message. `id` is the model
    node's `msg_...` id (that of the stream's `text` events).
    """

    role: Literal["assistant"]
    content: str
    tool_calls: NotRequired[list[ToolCallData]]
    id: NotRequired[str]
    reasoning: NotRequired[str]
    reasoning_field: NotRequired[str]
    reasoning_blocks: NotRequired[list[dict[str, Any]]]
    reasoning_items: NotRequired[list[ReasoningItem]]
    phase: NotRequired[str]
    commentary: NotRequired[str]


class ToolMessage(TypedDict):
    """The result of one tool call, as the model reads it (`content`).

    `name` is the tool the model called; `tool` the one that ran instead, when a decision
    or a hook changed it. The tools node always writes `name` and `status`; a result from
    outside (a caller's transcript, a LangChain `ToolMessage`) may lack them, and counts
    as `"ok"`. `decision` is the reviewer's decision type when there was one;
    `changed_by` the hooks that changed the call or its result; `error_kind` why it failed
    before its tool ran. `usage` is a sub-agent's token usage (counted into the run's);
    `return_direct` ends the run with this result; `artifact` holds what the model is not
    shown (the exception of a call under `on_tool_exception="return_generic"`).
    """

    role: Literal["tool"]
    tool_call_id: str
    content: str
    name: NotRequired[str]
    status: NotRequired[ToolStatus]
    tool: NotRequired[str]
    decision: NotRequired[DecisionType]
    changed_by: NotRequired[list[str]]
    error_kind: NotRequired[ToolErrorKind]
    usage: NotRequired[Usage]
    return_direct: NotRequired[bool]
    artifact: NotRequired[Any]
    id: NotRequired[str]


#: One transcript message; `message["role"]` tells which.
Message: TypeAlias = SystemMessage | UserMessage | AssistantMessage | ToolMessage


class LimitRecord(TypedDict):
    """The limit a run reached (`RunResult.limit`, the run record's `error`)."""

    limit: LimitName
    value: int


class RunRecord(TypedDict):
    """The graph's `run` channel: the current run's bookkeeping.

    `hooks` holds what state hooks saved (it outlives the run: a new run keeps it).
    `output` is the typed (or `return_direct`, or hook-given) answer; `error` the limit
    reached, with `stop_reason == "limit"`.
    """

    run_id: str
    model_calls: int
    tool_calls: int
    usage: Usage
    models: list[ModelIdentity]
    answered_by: ModelIdentity | None
    stop_reason: StopReason | None
    output: Any
    error: LimitRecord | None
    hooks: NotRequired[dict[str, Any]]
    #: The run wrote a new summary of the thread (`ContextPolicy`).
    compacted: NotRequired[bool]
