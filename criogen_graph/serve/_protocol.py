"""The LangGraph Platform wire shapes: request bodies read into what the Thread API
takes, and thread state, messages and stream events written the way `langgraph_sdk`
and `@langchain/langgraph-sdk` read them."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "STREAM_MODES",
    "BadRequest",
    "dumps",
    "interrupts_json",
    "lc_message",
    "now_iso",
    "read_input",
    "sse",
    "state_json",
    "storable",
    "stream_modes",
    "with_message_ids",
]

#: The stream modes a run may ask for; those we have nothing for stay silent.
STREAM_MODES = frozenset(
    {
        "values",
        "updates",
        "messages",
        "messages-tuple",
        "custom",
        "events",
        "debug",
        "tasks",
        "checkpoints",
    }
)

_ROLES = {"user": "human", "assistant": "ai", "tool": "tool", "system": "system"}
_USER_ROLES = ("user", "human")


class BadRequest(Exception):
    """A request the server refuses: `status` and the `detail` the client is told."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def now_iso() -> str:
    """The current time as the API writes it (ISO 8601, UTC)."""
    return datetime.now(UTC).isoformat()


def _default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return repr(value)


def _finite(value: Any) -> Any:
    """`value` with non-finite floats as null (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def dumps(value: Any) -> str:
    """Compact JSON of `value` (anything the graph's state holds)."""
    try:
        return json.dumps(value, default=_default, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return json.dumps(_finite(value), default=_default, separators=(",", ":"))


def sse(event: str, data: Any, event_id: str | None = None) -> bytes:
    """One server-sent event."""
    head = f"event: {event}\ndata: {dumps(data)}\n"
    if event_id is not None:
        head += f"id: {event_id}\n"
    return (head + "\n").encode("utf-8")


def stream_modes(value: Any) -> frozenset[str]:
    """The `stream_mode` of a run body (a str or a list; default `values`)."""
    if value is None:
        return frozenset({"values"})
    modes = [value] if isinstance(value, str) else value
    if not isinstance(modes, list) or not all(isinstance(m, str) for m in modes):
        raise BadRequest(422, "stream_mode must be a string or a list of strings")
    unknown = sorted(set(modes) - STREAM_MODES)
    if unknown:
        raise BadRequest(
            422, f"unknown stream_mode {unknown[0]!r}; use one of {sorted(STREAM_MODES)}"
        )
    return frozenset(modes) or frozenset({"values"})


_INT64 = 2**63
_MAX_DEPTH = 32


def _storable_str(text: str) -> bool:
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def storable(value: Any, name: str, depth: int = 0) -> Any:
    """`value` if every storage can keep it as JSON (64-bit integers, finite floats, text
    without NUL or lone surrogates, nesting up to 32 levels), else a 422 naming `name`."""
    if depth > _MAX_DEPTH:
        raise BadRequest(422, f"{name} is nested too deeply (over {_MAX_DEPTH} levels)")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not -_INT64 <= value < _INT64:
            raise BadRequest(422, f"{name} holds an integer outside the 64-bit range")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise BadRequest(422, f"{name} holds a number that is not finite")
        return value
    if isinstance(value, str):
        if not _storable_str(value):
            raise BadRequest(422, f"{name} holds text with a NUL or a lone surrogate")
        return value
    if isinstance(value, list):
        return [storable(v, name, depth + 1) for v in value]
    if isinstance(value, dict):
        for key in value:
            storable(key, name, depth + 1)
        return {k: storable(v, name, depth + 1) for k, v in value.items()}
    raise BadRequest(422, f"{name} must be JSON")


def _text(content: Any) -> str:
    """The text of a message's content: a str, or LangChain content blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, Mapping) and block.get("type") == "text":
                text = block.get("text")
                if not isinstance(text, str):
                    raise BadRequest(422, "a text content block needs a string 'text'")
                parts.append(text)
            else:
                raise BadRequest(422, "message content blocks other than text are not supported")
        return "".join(parts)
    raise BadRequest(422, "message content must be a string or a list of text blocks")


def _user_text(message: Any) -> str:
    if isinstance(message, str):
        return message
    if isinstance(message, list | tuple) and len(message) == 2:  # ("user", "text")
        role, content = message
        if role in _USER_ROLES:
            return _text(content)
    if isinstance(message, Mapping):
        role = message.get("role", message.get("type"))
        if role in _USER_ROLES:
            return _text(message.get("content"))
    raise BadRequest(
        422,
        "input.messages must hold the user's new message ({'role': 'user', 'content': ...}); "
        "the thread keeps the rest of the conversation",
    )


def read_input(value: Any) -> tuple[str, dict[str, Any] | None]:
    """The user's message and run state of a run's `input`:
    `{"messages": [one user message], "state": {...}?}`."""
    if not isinstance(value, Mapping):
        raise BadRequest(422, "input must be an object like {'messages': [{'role': 'user', ...}]}")
    unknown = sorted(set(value) - {"messages", "state"})
    if unknown:
        raise BadRequest(
            422, f"input has unknown key {unknown[0]!r}; it takes 'messages' and 'state'"
        )
    messages = value.get("messages")
    if isinstance(messages, str | Mapping):
        messages = [messages]
    if not isinstance(messages, list) or len(messages) != 1:
        raise BadRequest(
            422,
            "input.messages must hold exactly one new user message (the thread keeps the "
            "conversation)",
        )
    text = storable(_user_text(messages[0]), "the message")
    state = value.get("state")
    if state is not None and not isinstance(state, Mapping):
        raise BadRequest(422, "input.state must be an object")
    return text, storable(dict(state), "input.state") if state is not None else None


def lc_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A transcript message in LangChain's serialized form (`type`, `content`, `id`,
    `tool_calls`...), as the SDKs' message streams carry them."""
    role = str(message.get("role") or "")
    kind = _ROLES.get(role, role)
    out: dict[str, Any] = {
        "type": kind,
        "content": message.get("content") or "",
        "id": message.get("id"),
        "name": message.get("name"),
        "additional_kwargs": {},
        "response_metadata": {},
    }
    if kind == "ai":
        out["tool_calls"] = [
            {"id": c.get("id"), "name": c.get("name"), "args": c.get("args"), "type": "tool_call"}
            for c in message.get("tool_calls") or ()
        ]
        out["invalid_tool_calls"] = []
    if kind == "tool":
        call_id = message.get("tool_call_id")
        out["tool_call_id"] = call_id
        out["id"] = out["id"] or f"tool-{call_id}"
        out["status"] = "success" if message.get("status") in (None, "ok") else "error"
    return out


def _unnamed_tool(message: Any) -> bool:
    return isinstance(message, Mapping) and message.get("role") == "tool" and not message.get("id")


def with_message_ids(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` with an id on each tool message that has none: the id its message
    events carry (`lc_message`), so a client merging a stream's messages by id
    (`useStream`) shows each once."""
    messages = values.get("messages")
    if not isinstance(messages, list) or not any(_unnamed_tool(m) for m in messages):
        return dict(values)
    return {
        **values,
        "messages": [
            {**m, "id": f"tool-{m.get('tool_call_id')}"} if _unnamed_tool(m) else m
            for m in messages
        ],
    }


def interrupts_json(interrupts: Sequence[Any]) -> list[dict[str, Any]]:
    """LangGraph interrupts as the API writes them: `[{"value", "id"}]`."""
    return [{"value": getattr(i, "value", None), "id": getattr(i, "id", None)} for i in interrupts]


def _task_json(task: Any, thread_id: str) -> dict[str, Any]:
    error = task.error
    return {
        "id": task.id,
        "name": task.name,
        "error": None if error is None else str(error),
        "interrupts": interrupts_json(task.interrupts),
        "checkpoint": None,
        "state": None,
        "result": task.result,
    }


def _checkpoint(config: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not config:
        return None
    conf = config.get("configurable") or {}
    if not conf.get("checkpoint_id"):
        return None
    return {
        "thread_id": conf.get("thread_id"),
        "checkpoint_ns": conf.get("checkpoint_ns", ""),
        "checkpoint_id": conf.get("checkpoint_id"),
        "checkpoint_map": None,
    }


def state_json(snap: Any, thread_id: str) -> dict[str, Any]:
    """A LangGraph `StateSnapshot` as the API writes a thread state."""
    if snap is None or (not snap.values and snap.config is None):
        return {
            "values": {},
            "next": [],
            "tasks": [],
            "checkpoint": None,
            "metadata": {},
            "created_at": None,
            "parent_checkpoint": None,
            "interrupts": [],
        }
    return {
        "values": with_message_ids(snap.values or {}),
        "next": list(snap.next or ()),
        "tasks": [_task_json(t, thread_id) for t in snap.tasks or ()],
        "checkpoint": _checkpoint(snap.config),
        "metadata": dict(snap.metadata or {}),
        "created_at": snap.created_at,
        "parent_checkpoint": _checkpoint(snap.parent_config),
        "interrupts": interrupts_json(snap.interrupts or ()),
    }
