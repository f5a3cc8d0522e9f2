"""The graph state: the transcript, the run's bookkeeping, and the user's run state.

- `messages`: the transcript as plain dicts (`{"role", "content", ...}`), appended to by
  the nodes; a `before_model` hook may replace it (written as `Overwrite`).
- `run`: one dict of bookkeeping for the current run (id, counters, usage, models, stop
  reason, output) plus `hooks`, the state hooks saved, which outlives the run.
- `state`: the run state the caller passed (`state=`), read-only to hooks and tools.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

from langgraph.channels.delta import DeltaChannel

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


def normalize_message(m: Any) -> dict[str, Any]:
    """A transcript dict from a dict, a `(role, text)` pair, a string (a user message) or
    a LangChain message or its dict form (`{"type": "human", "content": ...}`, what
    LangGraph Studio's chat sends)."""
    if type(m) is dict and "role" in m:
        return m
    if isinstance(m, str):
        return {"role": "user", "content": m}
    if isinstance(m, tuple) and len(m) == 2:
        role = _LC_ROLES.get(m[0], m[0])
        return {"role": role, "content": m[1]}
    if isinstance(m, dict):
        kind = m.get("type")
        if kind in _LC_ROLES:
            out = {"role": _LC_ROLES[kind], "content": _lc_content(m.get("content", ""))}
            if m.get("tool_calls"):
                out["tool_calls"] = [
                    {"id": c.get("id"), "name": c.get("name"), "args": c.get("args") or {}}
                    for c in m["tool_calls"]
                ]
            if m.get("tool_call_id"):
                out["tool_call_id"] = m["tool_call_id"]
            return out
        raise ValueError(f"a message needs a 'role' (user, assistant, tool, system): {m!r}")
    kind = getattr(m, "type", None)
    if kind in _LC_ROLES and hasattr(m, "content"):
        out = {"role": _LC_ROLES[kind], "content": _lc_content(m.content)}
        if getattr(m, "tool_calls", None):
            out["tool_calls"] = [
                {"id": c.get("id"), "name": c["name"], "args": c.get("args") or {}}
                for c in m.tool_calls
            ]
        if getattr(m, "tool_call_id", None):
            out["tool_call_id"] = m.tool_call_id
        return out
    raise ValueError(f"cannot read {m!r} as a message")


def append_messages(state: list[dict[str, Any]], writes: Sequence[Any]) -> list[dict[str, Any]]:
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


def _unanswered(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The calls of the last assistant message that have no result after it."""
    # Counted, not a set: a thread saved before call ids were made unique may hold two
    # calls with one id, and one result must not answer both.
    answered: Counter[Any] = Counter()
    for m in reversed(messages):
        role = m.get("role")
        if role == "tool":
            answered[m.get("tool_call_id")] += 1
        elif role == "assistant":
            calls = m.get("tool_calls")
            out = []
            for c in calls or ():
                if answered[c.get("id")] > 0:
                    answered[c.get("id")] -= 1
                else:
                    out.append(c)
            return out
        else:
            return []
    return []


def unique_call_ids(calls: list[dict[str, Any]], transcript: list[dict[str, Any]]) -> None:
    """Make the ids of a new reply's `calls` unique in the thread, in place.

    Everything that keys on a call id (decisions, the tool messages that answer calls,
    audit records, the closing of an unfinished run) needs one id per call, and some
    servers give two calls the same id, reuse `call_0` every turn, or send none. The
    rule: a call keeps the provider's id when no earlier call of the thread or of the
    reply has it; a repeated id `X` becomes `X-<n>` (the smallest n >= 2 not yet used);
    a call without an id (missing, empty) gets a fresh `call_<16 hex>`. A renamed call
    keeps the provider's id as `provider_id`, and that is what goes back to the provider
    (see `adapters.models.base.wire_call_id`), so the provider reads its own ids.
    """
    used = _call_ids(transcript)
    for i, c in enumerate(calls):
        raw = c.get("id")
        if raw is None or raw == "":
            calls[i] = c = {k: v for k, v in c.items() if k != "provider_id"}
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


def _call_ids(transcript: list[dict[str, Any]]) -> set[Any]:
    # One comprehension: this runs on every reply with calls, over the whole thread.
    return {c.get("id") for m in transcript if "tool_calls" in m for c in m["tool_calls"] or ()}


def not_run_messages(calls: list[dict[str, Any]], reason: str) -> list[dict[str, Any]]:
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


def merge_run(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """The `run` reducer: keys merge; a write with a new `run_id` starts a new run and
    keeps only the saved hook states."""
    if not old:
        return new
    rid = new.get("run_id")
    if rid is not None and rid != old.get("run_id"):
        if "hooks" not in new and "hooks" in old:
            return {**new, "hooks": old["hooks"]}
        return new
    return {**old, **new}


class AgentState(TypedDict, total=False):
    """The state of an agent graph (see the module docstring)."""

    messages: Annotated[list[dict[str, Any]], DeltaChannel(append_messages)]
    run: Annotated[dict[str, Any], merge_run]
    state: dict[str, Any]


def new_run(run_id: str, hooks: dict[str, Any] | None = None) -> dict[str, Any]:
    """The bookkeeping a run starts with."""
    run: dict[str, Any] = {
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


def add_usage(total: dict[str, int], more: dict[str, int]) -> dict[str, int]:
    out = dict(total)
    for k in USAGE_KEYS:
        v = more.get(k)
        if v:
            out[k] = out.get(k, 0) + v
    return out


#: Statuses of a tool message whose tool function actually ran.
RAN_STATUSES = frozenset({"ok", "error", "timeout"})


def tool_ran(m: dict[str, Any]) -> bool:
    """Whether a tool message records a call whose tool function ran."""
    return m.get("status") in RAN_STATUSES and "error_kind" not in m
