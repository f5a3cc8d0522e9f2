"""What runs return (`RunResult`, `Reply`) and the approval records (`ApprovalRequest`,
`Decision`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Generic, Literal, TypeVar

from criogen_graph.errors import ValidationError
from criogen_graph.messages import (
    DecisionType,
    LimitRecord,
    Message,
    ModelIdentity,
    StopReason,
    Usage,
    UsageKey,
)

__all__ = ["ApprovalRequest", "Decision", "PendingApprovals", "Reply", "RunResult"]

#: How a run segment ended, as `on_end` hooks, spans and the runner name it.
Outcome = Literal["completed", "suspended", "failed"]

Output = TypeVar("Output")

DECISION_TYPES: tuple[DecisionType, ...] = ("approve", "edit", "reject", "respond")
USAGE_KEYS: tuple[UsageKey, ...] = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
)


def outcome(stop_reason: str | None, *, waiting: bool = False, error: bool = False) -> Outcome:
    """The one rule for how a run segment ended: `"failed"` for a raise or a cancellation
    (`error`) or a reached limit; `"suspended"` when it waits (an approval, a breakpoint:
    `waiting`, or no stop reason yet); else `"completed"`."""
    if error or stop_reason == "limit":
        return "failed"
    if waiting or stop_reason is None:
        return "suspended"
    return "completed"


def empty_usage() -> Usage:
    """A usage record with every key at zero."""
    return {
        "input_tokens": 0,
        "output_tokens": 0,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
        "reasoning_tokens": 0,
    }


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """A tool call waiting for a reviewer's decision.

    `allowed` lists the decisions the reviewer may make (a subset of `"approve"`,
    `"edit"`, `"reject"`, `"respond"`; `None` means all of them).
    """

    call_id: str
    tool: str
    args: dict[str, Any]
    description: str | None = None
    allowed: list[str] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The request as a JSON-ready dict (what the graph's interrupt carries)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ApprovalRequest:
        """The inverse of `to_dict`."""
        return cls(
            call_id=str(data["call_id"]),
            tool=str(data["tool"]),
            args=dict(data.get("args") or {}),
            description=data.get("description"),
            allowed=list(data["allowed"]) if data.get("allowed") is not None else None,
        )


class PendingApprovals(list[ApprovalRequest]):
    """The calls a thread waits on (`Thread.pending_approvals()`, `Reply.approvals`):
    a list of `ApprovalRequest` that also names where the thread asked for them,
    `checkpoint_id` and `version` (`None` for a run without a thread).

    Pass it as it is to `approve` / `reject` / `decide` (`expected=`) and the answer
    applies to these requests only, as they were asked: not to a later request, even one
    with the same call id and args. Slicing or filtering it gives a plain list, which
    pins the calls by id, tool and args only.
    """

    checkpoint_id: str | None
    version: int | None

    def __init__(
        self,
        requests: Iterable[ApprovalRequest] = (),
        *,
        checkpoint_id: str | None = None,
        version: int | None = None,
    ) -> None:
        super().__init__(requests)
        self.checkpoint_id = checkpoint_id
        self.version = version


@dataclass(frozen=True, slots=True)
class Decision:
    """A reviewer's answer to one pending call (see `Thread.decide`).

    Build it with `Decision.approve()`, `Decision.reject(message)`,
    `Decision.edit(args, name=None)` or `Decision.respond(message)`.
    """

    type: DecisionType
    message: str | None = None
    args: dict[str, Any] | None = None
    name: str | None = None

    @classmethod
    def approve(cls) -> Decision:
        """Run the call as the model wrote it."""
        return cls("approve")

    @classmethod
    def reject(cls, message: str | None = None) -> Decision:
        """Do not run the call; the model is told it was rejected (with `message`)."""
        return cls("reject", message=message)

    @classmethod
    def edit(cls, args: Mapping[str, Any], name: str | None = None) -> Decision:
        """Run the call with `args` (and, given `name`, another tool); the model is told.
        The agent's redaction policy applies to `args` first, as to the model's own."""
        if not isinstance(args, Mapping):
            raise TypeError(f"Decision.edit args must be a dict, got {type(args).__name__}")
        return cls("edit", args=dict(args), name=name)

    @classmethod
    def respond(cls, message: str) -> Decision:
        """Skip the call; the model gets `message` as its result."""
        if not isinstance(message, str):
            raise TypeError(f"Decision.respond message must be a str, got {type(message).__name__}")
        return cls("respond", message=message)

    def to_dict(self) -> dict[str, Any]:
        """The decision as JSON: `{"type": ..., "message"?: ..., "args"?: ..., "name"?: ...}`."""
        out: dict[str, Any] = {"type": self.type}
        if self.message is not None:
            out["message"] = self.message
        if self.args is not None:
            out["args"] = self.args
        if self.name is not None:
            out["name"] = self.name
        return out

    @classmethod
    def coerce(cls, value: Decision | Mapping[str, Any] | str) -> Decision:
        """A `Decision` from itself, its JSON dict, or a bare type name like `"approve"`.
        Raises `ValidationError` for one that does not make sense (a `respond` without a
        message, say), however it was built."""
        if isinstance(value, Decision):
            if type(value.type) is not str:
                raise ValidationError("decision type must be text", code="invalid_type")
            return cls.coerce(value.to_dict())
        if isinstance(value, str):
            if value not in ("approve", "reject"):
                raise ValidationError(
                    f"a decision given as text must be 'approve' or 'reject', got {value!r}",
                    code="invalid_value",
                )
            return cls(value)  # type: ignore[arg-type]
        if isinstance(value, Mapping):
            kind = value.get("type")
            if kind not in DECISION_TYPES:
                raise ValidationError(
                    f"decision type must be one of {list(DECISION_TYPES)}, got {kind!r}",
                    code="invalid_value",
                )
            message = value.get("message")
            if message is not None and not isinstance(message, str):
                raise ValidationError("decision message must be text", code="invalid_type")
            if kind == "respond" and message is None:
                raise ValidationError("a 'respond' decision needs a message", code="missing")
            args = value.get("args")
            name = value.get("name")
            if kind == "edit":
                if not isinstance(args, Mapping):
                    raise ValidationError("an 'edit' decision needs args (a dict)", code="missing")
                args = dict(args)
                if name is not None and not isinstance(name, str):
                    raise ValidationError("edit name must be text", code="invalid_type")
            return cls(kind, message=message, args=args, name=name)
        raise TypeError(
            f"a decision must be a Decision, a dict or a str, got {type(value).__name__}"
        )


@dataclass(slots=True)
class RunResult(Generic[Output]):
    """What a run produced.

    `text` is the final answer as text (`None` when the output is not text or the run
    waits for approval); `output` the parsed answer with the agent's `output` option,
    else the final text. `messages` is the whole transcript (plain dicts, typed as
    `messages.Message`). `stop_reason` (a `messages.StopReason`) is `"final_answer"`,
    `"output"`, `"return_direct"`, `"content_filter"`,
    `"max_tokens"` (the answer was cut off by the model's output-token cap: its text is
    kept in `messages`, its tool calls are not run; beyond the original API),
    `"hook_end"` or `"limit"`, and `None` while the run waits for approval
    (`needs_approval`, `approvals`). `answered_by` is the `{"provider", "model"}` that
    wrote the last answer; `models` each model called, in first-use order.
    """

    text: str | None
    output: Output | None
    messages: list[Message]
    usage: Usage
    stop_reason: StopReason | None
    needs_approval: bool
    approvals: list[ApprovalRequest]
    model_calls: int
    tool_calls: int
    run_id: str
    duration_ms: float
    answered_by: ModelIdentity | None = None
    models: list[ModelIdentity] = field(default_factory=list)
    #: Which limit was reached, when `stop_reason == "limit"` (`{"limit", "value"}`).
    limit: LimitRecord | None = field(default=None, repr=False)
    #: The run wrote a new summary of older messages to fit the agent's `ContextPolicy`.
    compacted: bool = False


@dataclass(slots=True)
class Reply(RunResult[Output]):
    """A thread call's result, saved as the thread's new head.

    `version` grows with every saved checkpoint; `checkpoint_id` is the checkpoint this
    call saved (`Thread.rewind` takes it).
    """

    version: int = 0
    checkpoint_id: str = ""
