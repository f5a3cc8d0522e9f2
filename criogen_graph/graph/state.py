"""The graph state: the transcript, the run's bookkeeping, and the user's run state.

- `messages`: the transcript as plain dicts (`{"role", "content", ...}`), appended to by
  the nodes; a `before_model` hook may replace it (written as `Overwrite`).
- `run`: one dict of bookkeeping for the current run (id, counters, usage, models, stop
  reason, output) plus `hooks`, the state hooks saved, which outlives the run.
- `state`: the run state the caller passed (`state=`), read-only to hooks and tools.
- `context`: with a `ContextPolicy`, the summary of older messages and the token count
  of the previous call (see `graph.context`); absent otherwise.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, cast

from langgraph.channels.delta import DeltaChannel
from typing_extensions import TypedDict

from criogen_graph.messages import (
    Message,
    RunRecord,
    ToolCallData,
    ToolMessage,
    ToolStatus,
    Usage,
)
from criogen_graph.redact import Redactor, redact_messages
from criogen_graph.results import USAGE_KEYS, empty_usage

_LC_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}


def _lc_content(content: Any) -> Any:
    """A LangChain message's content: a list of text blocks only (what chat UIs such as
    LangGraph Studio send, `[{"type": "text", "text": ...}]`) becomes its text; anything
    else (images, a plain string) stays as it is."""
    if (
        type(content) is list
        and content
        and all(type(b) is dict and b.get("type") == "text" for b in content)
    ):
        return "".join(str(b.get("text") or "") for b in content)
    return content


def normalize_message(m: object) -> Message:
    """A transcript dict from a dict, a `(role, text)` pair, a string (a user message) or
    a LangChain message or its dict form (`{"type": "human", "content": ...}`, what
    LangGraph Studio sends).

    This is where messages from outside (a caller, a hook, Studio, a checkpoint, a parent
    graph) enter the transcript: a dict with a `role` is taken as the message it says it
    is. A LangChain message keeps its id (a parent graph's `add_messages` matches on it)
    and the data `as_langchain_message` kept in `additional_kwargs["criogen"]`."""
    if type(m) is dict and "role" in m:
        if m["role"] == "assistant" and type(m.get("content")) is list:
            # An assistant message's content is its text (what `Reply.text`, typed
            # output and the providers read): text blocks become that text.
            content = _lc_content(m["content"])
            if type(content) is str:
                return cast(Message, {**m, "content": content})
        return cast(Message, m)
    if isinstance(m, str):
        return {"role": "user", "content": m}
    if isinstance(m, tuple) and len(m) == 2:
        return cast(Message, {"role": _LC_ROLES.get(m[0], m[0]), "content": m[1]})
    if isinstance(m, dict):
        kind = m.get("type")
        role = _LC_ROLES.get(kind) if isinstance(kind, str) else None
        if role is None:
            raise ValueError(f"a message needs a 'role' (user, assistant, tool, system): {m!r}")
        return _from_langchain(role, m.get("content", ""), m, m.get("id"))
    kind = getattr(m, "type", None)
    if kind in _LC_ROLES and hasattr(m, "content"):
        parts = {
            "tool_calls": getattr(m, "tool_calls", None),
            "tool_call_id": getattr(m, "tool_call_id", None),
            "name": getattr(m, "name", None),
            "status": getattr(m, "status", None),
            "artifact": getattr(m, "artifact", None),
            "additional_kwargs": getattr(m, "additional_kwargs", None),
        }
        return _from_langchain(_LC_ROLES[kind], m.content, parts, getattr(m, "id", None))
    raise ValueError(f"cannot read {m!r} as a message")


def admitted(messages: Iterable[object], redactor: Redactor | None) -> list[Message]:
    """Messages entering the transcript from outside the model node's own reply (a
    caller's graph input or state update, a hook's `HookAction`, a middleware's reply),
    whatever their shape (see `normalize_message`), as they may be saved: redacted with
    `redactor`, list content included. `ValueError` for one that is not a message."""
    out = [normalize_message(m) for m in messages]
    return redact_messages(redactor, out) if redactor is not None else out


def _from_langchain(role: str, content: Any, parts: Mapping[str, Any], msg_id: Any) -> Message:
    """A transcript message from the parts of a LangChain message (or its dict form)."""
    out: dict[str, Any] = {"role": role, "content": _lc_content(content)}
    kwargs = parts.get("additional_kwargs")
    ours = kwargs.get(CRIOGEN_KEY) if isinstance(kwargs, Mapping) else None
    ours = dict(ours) if isinstance(ours, Mapping) else {}
    full_calls = ours.pop("tool_calls", None)
    calls = parts.get("tool_calls")
    if full_calls:
        # Ours, with what LangChain's calls have no field for (`provider_id`, ...).
        out["tool_calls"] = [dict(c) for c in full_calls]
    elif calls:
        out["tool_calls"] = [
            {"id": c.get("id"), "name": c.get("name"), "args": c.get("args") or {}} for c in calls
        ]
    if role == "tool":
        if parts.get("tool_call_id"):
            out["tool_call_id"] = parts["tool_call_id"]
        if parts.get("name"):
            out["name"] = parts["name"]
        if parts.get("status") == "error":
            out["status"] = "error"
        if parts.get("artifact") is not None:
            out["artifact"] = parts["artifact"]
    elif parts.get("tool_call_id"):
        out["tool_call_id"] = parts["tool_call_id"]
    out.update(ours)
    if msg_id:
        out["id"] = msg_id
    return cast(Message, out)


#: Where `as_langchain_message` keeps what a LangChain message has no field for.
CRIOGEN_KEY = "criogen"
_LC_FIELDS = frozenset({"role", "content", "id", "tool_calls", "tool_call_id", "name", "artifact"})
_CALL_FIELDS = frozenset({"id", "name", "args"})


def as_langchain_message(m: Mapping[str, Any]) -> Any:
    """A transcript message as the LangChain message LangGraph's `add_messages` (a
    `MessagesState` parent graph) accepts: a tool result's status is `success` (the tool
    ran and returned, or its call was skipped) or `error`; what LangChain has no field for
    (our own `status`, `decision`, `usage`, a call's `provider_id`...) is kept in
    `additional_kwargs["criogen"]`, and `normalize_message` reads it back. A message
    without an id gets one that does not change between conversions (a tool result's
    comes from its call id), so a parent graph replaces it instead of adding it twice."""
    from langchain_core.messages import HumanMessage, SystemMessage

    role = m.get("role")
    extra = {k: v for k, v in m.items() if k not in _LC_FIELDS}
    msg_id = m.get("id") or _stable_id(m)
    if role == "assistant":
        return _lc_assistant(m, extra, msg_id)
    if role == "tool":
        return _lc_tool(m, extra, msg_id)
    kwargs = {CRIOGEN_KEY: extra} if extra else {}
    content = m.get("content")
    content = "" if content is None else content
    if role == "system":
        return SystemMessage(content, id=msg_id, additional_kwargs=kwargs)
    if role == "user":
        return HumanMessage(content, id=msg_id, additional_kwargs=kwargs)
    raise ValueError(f"cannot convert a message with role {role!r} to a LangChain message")


def _lc_assistant(m: Mapping[str, Any], extra: dict[str, Any], msg_id: str) -> Any:
    from langchain_core.messages import AIMessage

    calls = list(m.get("tool_calls") or ())
    if any(set(c) - _CALL_FIELDS for c in calls):
        extra["tool_calls"] = calls
    lc_calls = [
        {"id": c.get("id"), "name": c.get("name"), "args": c.get("args") or {}} for c in calls
    ]
    return AIMessage(
        m.get("content") or "",
        tool_calls=lc_calls,
        id=msg_id,
        additional_kwargs={CRIOGEN_KEY: extra} if extra else {},
    )


def _lc_tool(m: Mapping[str, Any], extra: dict[str, Any], msg_id: str) -> Any:
    from langchain_core.messages import ToolMessage

    content = m.get("content")
    return ToolMessage(
        "" if content is None else content,
        tool_call_id=str(m.get("tool_call_id") or ""),
        name=m.get("name"),
        status="success" if m.get("status", "ok") in ("ok", "skipped") else "error",
        artifact=m.get("artifact"),
        id=msg_id,
        additional_kwargs={CRIOGEN_KEY: extra} if extra else {},
    )


def _stable_id(m: Mapping[str, Any]) -> str:
    if m.get("role") == "tool" and m.get("tool_call_id"):
        return f"tool_{m['tool_call_id']}"
    return str(uuid.uuid4())


def append_messages(state: list[Message], writes: Sequence[Any]) -> list[Message]:
    """The `messages` reducer: appends each write (a message or a list of them).

    It is batching-invariant, as `DeltaChannel` requires, so checkpoints store only what
    each step added instead of a copy of the whole transcript.

    The nodes write tuples: LangGraph turns message dicts inside a *list* written to a
    `DeltaChannel` into LangChain messages (`ensure_message_ids`), and the transcript is
    meant to stay plain dicts. Lists (from Studio, or tuples read back from a checkpoint)
    are normalized here.

    A user message that arrives while the last assistant message has calls without a
    result (a graph driven by LangGraph itself, e.g. Studio, given a new message instead
    of an answer to a pending approval) first gets a "Not run" result for each of them:
    providers refuse a transcript with unanswered calls, and the thread would be stuck.
    """
    out = list(state)
    for w in writes:
        for m in w if type(w) is tuple or type(w) is list else (w,):
            if type(m) is not dict or "role" not in m:
                m = normalize_message(m)
            if m["role"] == "user" and out:
                pending = _unanswered(out)
                if pending:
                    out.extend(not_run_messages(pending, "a new message arrived before it ran"))
            out.append(m)
    return out


def _unanswered(messages: list[Message]) -> list[ToolCallData]:
    """The calls of the last assistant message that have no result after it."""
    # Counted, not a set: a thread saved before call ids were made unique may hold two
    # calls with one id, and one result must not answer both.
    answered: Counter[Any] = Counter()
    for m in reversed(messages):
        if m["role"] == "tool":
            answered[m.get("tool_call_id")] += 1
        elif m["role"] == "assistant":
            out = []
            for c in m.get("tool_calls") or ():
                if answered[c.get("id")] > 0:
                    answered[c.get("id")] -= 1
                else:
                    out.append(c)
            return out
        else:
            return []
    return []


def unique_call_ids(calls: list[ToolCallData], transcript: list[Message]) -> None:
    """Make the ids of a new reply's `calls` unique in the thread, in place.

    Everything that keys on a call id (decisions, the tool messages that answer calls,
    audit records, the closing of an unfinished run) needs one id per call, and some
    servers give two calls the same id, reuse `call_0` every turn, or send none. The
    rule: a call keeps the provider's id when no earlier call of the thread or of the
    reply has it; a repeated id `X` becomes `X-<n>` (the smallest n >= 2 not yet used);
    a call without an id (missing, empty) gets a fresh `call_<16 hex>`. A renamed call
    keeps the provider's id as `provider_id`, and that is what goes back to the provider
    (see `models.base.wire_call_id`), so the provider reads its own ids.
    """
    used = _call_ids(transcript)
    for i, c in enumerate(calls):
        # The id as the provider sent it: an adapter passes on any JSON value.
        raw: object = c.get("id")
        if raw is None or raw == "":
            calls[i] = c = c.copy()
            c.pop("provider_id", None)
            c["id"] = "call_" + uuid.uuid4().hex[:16]
            used.add(c["id"])
            continue
        base = raw if isinstance(raw, str) else str(raw)
        if base in used:
            n = 2
            while f"{base}-{n}" in used:
                n += 1
            calls[i] = c = {**c, "id": f"{base}-{n}", "provider_id": c.get("provider_id", raw)}
        elif base is not raw:
            calls[i] = c = {**c, "id": base, "provider_id": c.get("provider_id", raw)}
        used.add(c["id"])


def _call_ids(transcript: list[Message]) -> set[object]:
    # One comprehension: this runs on every reply with calls, over the whole thread.
    return {
        c.get("id")
        for m in transcript
        if m["role"] == "assistant"
        for c in m.get("tool_calls") or ()
    }


def not_run_messages(calls: list[ToolCallData], reason: str) -> list[ToolMessage]:
    """Tool messages for calls that will not run, so the transcript stays well-formed
    (every call answered) for the next turn."""
    return [
        {
            "role": "tool",
            "tool_call_id": c["id"],
            "name": c["name"],
            "content": f"Not run: {reason}",
            "status": "skipped",
        }
        for c in calls
    ]


def merge_run(old: RunRecord | None, new: Mapping[str, Any]) -> RunRecord:
    """The `run` reducer: keys merge; a write with a new `run_id` starts a new run and
    keeps only the saved hook states.

    A write is a whole record (`new_run`, the model node's) or some keys of one (the
    approval node writes `{"hooks": ...}`), as LangGraph hands it over."""
    if not old:
        return cast(RunRecord, new)
    rid = new.get("run_id")
    if rid is not None and rid != old.get("run_id"):
        if "hooks" not in new and "hooks" in old:
            return cast(RunRecord, {**new, "hooks": old["hooks"]})
        return cast(RunRecord, new)
    return cast(RunRecord, {**old, **new})


class AgentState(TypedDict, total=False):
    """The state of an agent graph (see the module docstring)."""

    messages: Annotated[list[Message], DeltaChannel(append_messages)]
    run: Annotated[RunRecord, merge_run]
    state: dict[str, Any]
    context: dict[str, Any]


class AgentInput(TypedDict, total=False):
    """What a caller gives the graph (the JSON schema LangGraph's server and Studio show
    as the input form): new messages and the run state. `run` is the graph's own."""

    messages: list[Message]
    state: dict[str, Any]


def new_run(run_id: str, hooks: dict[str, Any] | None = None) -> RunRecord:
    """The bookkeeping a run starts with."""
    run: RunRecord = {
        "run_id": run_id,
        "model_calls": 0,
        "tool_calls": 0,
        "usage": empty_usage(),
        "models": [],
        "answered_by": None,
        "stop_reason": None,
        "output": None,
        "error": None,
    }
    if hooks is not None:
        run["hooks"] = hooks
    return run


def add_usage(total: Usage, more: Usage) -> Usage:
    """`total` plus `more`, key by key (a key either lacks counts as zero: a sub-agent's
    usage saved by an older version may lack some)."""
    out = total.copy()
    for k in USAGE_KEYS:
        v = more.get(k)
        if v:
            out[k] = out.get(k, 0) + v
    return out


#: Statuses of a tool message whose tool function actually ran.
RAN_STATUSES: frozenset[ToolStatus] = frozenset({"ok", "error", "timeout"})


def tool_ran(m: ToolMessage) -> bool:
    """Whether a tool message records a call whose tool function ran."""
    return m.get("status") in RAN_STATUSES and "error_kind" not in m
