"""What a hook's `HookAction` may write into a run, checked and redacted before anything
is saved: a replaced transcript (`before_model`), a replaced reply (`after_model`). A
malformed message in a thread would fail every later run on it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from criogen_graph.graph.state import admitted, normalize_message
from criogen_graph.hooks import HookAction, HookFailedError
from criogen_graph.messages import AssistantMessage, Message

_NOT_GIVEN: Any = object()


def redacted_action(
    redactor: Any,
    action: HookAction,
    shown: list[dict[str, Any]],
    transcript: Sequence[Message],
) -> HookAction:
    """What a hook writes into the run, under the policy too: the hook saw redacted
    text, but may add its own. A message it passes on as it was shown (`shown`, its
    copy of `transcript`), unchanged, is redacted already. A malformed message is left
    for the checks that reject it."""
    if action.messages is None and action.message is None and action.output is None:
        return action
    out = HookAction(end=action.end, output=redactor.redact_value(action.output))
    out.state = action.state

    def clean(m: Any) -> Any:
        try:
            return admitted([dict(m) if isinstance(m, Mapping) else m], redactor)[0]
        except (ValueError, TypeError, AttributeError):
            return m

    if isinstance(action.messages, list | tuple):
        given = {id(c): m for c, m in zip(shown, transcript, strict=False)}
        out.messages = [
            m if given.get(id(m), _NOT_GIVEN) == m else clean(m) for m in action.messages
        ]
    else:
        out.messages = action.messages
    out.message = clean(action.message) if action.message is not None else None
    return out


def checked_transcript(hook: str, messages: Any) -> list[Message]:
    if isinstance(messages, str | bytes) or not isinstance(messages, list | tuple):
        raise HookFailedError(
            f"hook {hook!r}: HookAction(messages=...) must be a list of message dicts",
            hook=hook,
            method="before_model",
        )
    out: list[Message] = []
    for i, given in enumerate(messages):
        try:
            m = normalize_message(dict(given) if isinstance(given, Mapping) else given)
        except ValueError as exc:
            raise HookFailedError(
                f"hook {hook!r}: HookAction(messages=...) message {i}: {exc}",
                hook=hook,
                method="before_model",
            ) from exc
        problem = _message_problem(cast(dict[str, Any], m))
        if problem is not None:
            # Checked like a model's reply before anything is saved: a malformed message
            # in the thread would fail every later run on it.
            raise HookFailedError(
                f"hook {hook!r}: HookAction(messages=...) message {i} ({m.get('role')!r}): "
                f"{problem}",
                hook=hook,
                method="before_model",
            )
        out.append(m)
    return out


_ROLES = frozenset({"system", "user", "assistant", "tool"})


def _message_problem(m: dict[str, Any]) -> str | None:
    """What is wrong with a transcript message a hook wrote (None: nothing). Fixes up, in
    `m` (the hook's copy), the shape of good tool calls."""
    role = m.get("role")
    if role not in _ROLES:
        return f"role must be one of {sorted(_ROLES)}, got {role!r}"
    content = m.get("content")
    if content is not None and not isinstance(content, str | list):
        return f"content must be text or a list of content blocks, got {type(content).__name__}"
    if role == "tool":
        call_id = m.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            return "a tool result needs a 'tool_call_id' (the id of the call it answers)"
        return None
    calls = m.get("tool_calls")
    if role != "assistant" or calls is None:
        return None
    if not isinstance(calls, list | tuple):
        kind = type(calls).__name__
        return f"tool_calls must be a list of {{'id', 'name', 'args'}} dicts, got {kind}"
    fixed = []
    seen: set[str] = set()
    for c in calls:
        problem = _call_problem(c, seen)
        if problem is not None:
            return problem
        fixed.append({**c, "args": dict(c.get("args") or {})})
    if fixed:
        m["tool_calls"] = fixed
    else:
        m.pop("tool_calls", None)
    return None


def _call_problem(c: Any, seen: set[str]) -> str | None:
    """What is wrong with one tool call of a hook's assistant message (None: nothing)."""
    if not isinstance(c, Mapping):
        return f"each tool call must be a dict with 'id', 'name' and 'args', got {c!r:.80}"
    call_id, name, args = c.get("id"), c.get("name"), c.get("args")
    if not isinstance(call_id, str) or not call_id:
        return f"a tool call needs an 'id' (a non-empty str), got {call_id!r:.80}"
    if call_id in seen:
        return f"two tool calls have the id {call_id!r}; ids must be unique"
    seen.add(call_id)
    if not isinstance(name, str) or not name:
        return f"tool call {call_id!r} needs a 'name' (a non-empty str), got {name!r:.80}"
    if args is not None and not isinstance(args, Mapping):
        return f"tool call {call_id!r}: 'args' must be a dict, got {type(args).__name__}"
    return None


def checked_reply(hook: str, message: Any, msg_id: str) -> AssistantMessage:
    if not isinstance(message, Mapping):
        raise HookFailedError(
            f"hook {hook!r}: HookAction(message=...) must be an assistant message dict",
            hook=hook,
            method="after_model",
        )
    out = dict(message)
    if out.setdefault("role", "assistant") != "assistant":
        raise HookFailedError(
            f"hook {hook!r}: the replacement reply must have role 'assistant'",
            hook=hook,
            method="after_model",
        )
    out.setdefault("content", "")
    out.setdefault("id", msg_id)
    calls = out.get("tool_calls")
    if calls:
        if not isinstance(calls, list | tuple):
            raise HookFailedError(
                f"hook {hook!r}: the replacement reply's tool_calls must be a list of "
                f"{{'name', 'args'}} dicts, got {type(calls).__name__}",
                hook=hook,
                method="after_model",
            )
        fixed = []
        for c in calls:
            if (
                not isinstance(c, Mapping)
                or not isinstance(c.get("name"), str)
                or not isinstance(c.get("args") or {}, Mapping)
            ):
                raise HookFailedError(
                    f"hook {hook!r}: each tool call needs a 'name' (text) and 'args' (a dict), "
                    f"got {c!r}",
                    hook=hook,
                    method="after_model",
                )
            # Other keys (the provider's own id, a signature) stay with the call.
            fixed.append(
                {**c, "id": c.get("id"), "name": c["name"], "args": dict(c.get("args") or {})}
            )
        out["tool_calls"] = fixed
    else:
        out.pop("tool_calls", None)
    return cast(AssistantMessage, out)  # its shape checked above
