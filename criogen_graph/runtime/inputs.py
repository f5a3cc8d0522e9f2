"""The checks of what a caller gives a run, made before anything is read, queued or
written: the thread id, the actor, and a send's input (`send_input`: the one check of
`send`, `stream`, the background `submit` and a job's `send_as`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from criogen_graph.errors import ValidationError
from criogen_graph.redact import effective

if TYPE_CHECKING:
    from criogen_graph.graph.spec import AgentSpec
    from criogen_graph.redact import Redactor

__all__ = [
    "MAX_THREAD_ID_BYTES",
    "check_actor",
    "check_state",
    "check_thread_id",
    "send_input",
    "user_message",
]


def user_message(input: Any, redactor: Redactor | None = None) -> dict[str, Any]:
    """The user's message of a run (redacted by `redactor`); `TypeError` for a non-str."""
    if not isinstance(input, str):
        raise TypeError(f"input must be a str (the user's message), got {type(input).__name__}")
    return {"role": "user", "content": redactor.redact(input) if redactor is not None else input}


def check_state(state: Mapping[str, Any] | None) -> dict[str, Any]:
    """The run state a caller passed (`state=`), as a new dict; `TypeError` for a non-dict."""
    if state is None:
        return {}
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a dict, got {type(state).__name__}")
    return dict(state)


def send_input(
    spec: AgentSpec, input: Any, state: Mapping[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A send's user message (redacted by the agent's policy) and run state, checked:
    `TypeError` for a non-str input or a non-dict state, and the memory's own error when
    the agent has per-user memory and `state` lacks its scope key (no model call
    without it)."""
    user = user_message(input, effective(spec.redact))
    run_state = check_state(state)
    if spec.memory is not None:
        spec.memory.pool(run_state)
    return user, run_state


#: The longest thread id, in UTF-8 bytes. Every backend keys its tables by thread id, and
#: PostgreSQL's btree indexes hold at most ~2.7 KB per row (LangGraph's keys add the
#: namespace, checkpoint and task ids to it), so a longer id could not be stored.
MAX_THREAD_ID_BYTES = 1024


def check_thread_id(thread_id: object) -> str:
    """`thread_id` if every backend can keep it, else `ValidationError` (before anything is
    read or written): a non-empty str of at most `MAX_THREAD_ID_BYTES` bytes in UTF-8,
    with no NUL character and no lone surrogate."""
    if not isinstance(thread_id, str):
        raise ValidationError(
            f"a thread id must be a non-empty str, got {type(thread_id).__name__}",
            code="invalid_type",
        )
    if not thread_id.strip():
        raise ValidationError("a thread id must be a non-empty str", code="invalid_value")
    if len(thread_id) > MAX_THREAD_ID_BYTES:  # (a char is at least one byte)
        size = f"{len(thread_id)} characters"
    else:
        try:
            size_bytes = len(thread_id.encode("utf-8"))
        except UnicodeEncodeError:
            raise ValidationError(
                f"thread id {thread_id[:40]!r}... has a lone surrogate (half of a UTF-16 "
                "pair, e.g. from bytes decoded with 'surrogateescape'), which no storage can "
                "keep: decode the id properly",
                code="invalid_value",
            ) from None
        if size_bytes <= MAX_THREAD_ID_BYTES:
            if "\x00" in thread_id:
                raise ValidationError(
                    f"thread id {thread_id[:40]!r} contains a NUL character, which PostgreSQL "
                    "cannot store: remove it",
                    code="invalid_value",
                )
            return thread_id
        size = f"{size_bytes} bytes"
    raise ValidationError(
        f"a thread id must be at most {MAX_THREAD_ID_BYTES} bytes in UTF-8, got {size} "
        f"(starting {thread_id[:40]!r}): use a shorter id, or a hash of a long key",
        code="invalid_value",
    )


def _unencodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check_actor(actor: object) -> str | None:
    """`actor` if every backend can keep it (None or a str with no NUL character and no
    lone surrogate), else `ValidationError`."""
    if actor is not None and not isinstance(actor, str):
        raise ValidationError("actor must be a str", code="invalid_type")
    if actor is not None and ("\x00" in actor or _unencodable(actor)):
        raise ValidationError(
            "actor must not contain a NUL character or a lone surrogate", code="invalid_value"
        )
    return actor
