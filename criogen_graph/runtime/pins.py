"""Pinned answers: what a reviewer was shown, checked against what is pending once the
answer holds the thread (`Thread.approve(expected=...)` and friends).

The same request means the same question of the same run: the checkpoint where the
thread asked (its id, or its version), when the caller holds it; else the same call
ids, each with the same tool and the same args (a later reply may reuse an id, with
other args or with the same ones)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from criogen_graph.errors import ValidationError
from criogen_graph.results import ApprovalRequest, PendingApprovals, RunResult

#: What `expected=` accepts (documented on `Thread.approve`).
Expected = RunResult[Any] | Sequence[ApprovalRequest | Mapping[str, Any] | str] | int | str

#: One pinned call: its id, and its tool and args fingerprint when the caller saw them.
_Call = tuple[str, str | None, str | None]


def fingerprint(args: Any) -> str:
    """SHA-256 of `args` as canonical JSON (so `1`, `1.0` and `True` differ)."""
    return hashlib.sha256(
        json.dumps(args, sort_keys=True, separators=(",", ":"), default=str).encode("utf-8")
    ).hexdigest()


@dataclass(frozen=True, slots=True)
class Pin:
    """What an answer may apply to.

    `checkpoint_id` / `version`: the thread's head must still be that checkpoint.
    `calls`: the pending calls must be exactly these (`None`: not known). `shown_any`:
    the caller was shown some pending call (else finding none is not stale, just
    nothing to answer). `implicit`: read by a bare call when it was made.
    """

    checkpoint_id: str | None = None
    version: int | None = None
    calls: tuple[_Call, ...] | None = None
    shown_any: bool = True
    implicit: bool = False

    @classmethod
    def of(cls, expected: Any) -> Pin | None:
        """The pin `expected` describes (None for None); `ValidationError` for anything
        that cannot say what the caller was shown, before anything is read."""
        if expected is None:
            return None
        if isinstance(expected, RunResult):
            calls = tuple(_call(r) for r in expected.approvals)
            checkpoint = getattr(expected, "checkpoint_id", None) or None
            if checkpoint is None and isinstance(expected.approvals, PendingApprovals):
                checkpoint = expected.approvals.checkpoint_id
            return cls(checkpoint_id=checkpoint, calls=calls, shown_any=bool(calls))
        if isinstance(expected, bool):
            raise _bad_type(expected)
        if isinstance(expected, int):
            if expected < 0:
                raise ValidationError(
                    f"expected={expected}: a version is an int >= 0 (Reply.version)",
                    code="invalid_value",
                )
            return cls(version=expected)
        if isinstance(expected, str):
            if not expected:
                raise ValidationError(
                    "expected='' names no checkpoint: pass Reply.checkpoint_id",
                    code="invalid_value",
                )
            return cls(checkpoint_id=expected)
        if isinstance(expected, Sequence) and not isinstance(expected, bytes | bytearray):
            calls = _unique(tuple(_call(item) for item in expected))
            checkpoint = expected.checkpoint_id if isinstance(expected, PendingApprovals) else None
            return cls(checkpoint_id=checkpoint, calls=calls, shown_any=bool(calls))
        raise _bad_type(expected)

    @classmethod
    def now(cls, head_id: str | None, waiting: bool) -> Pin:
        """A bare call's pin: the head it found when it was made (`""`: no thread yet)
        and whether that head waited for approval."""
        return cls(checkpoint_id=head_id or "", shown_any=waiting, implicit=True)

    def check(
        self,
        *,
        thread_id: str,
        action: str,
        head_id: str | None,
        head_version: int,
        pending: Sequence[Mapping[str, Any]],
    ) -> None:
        """Raise `ValidationError(code="stale")` unless the thread still waits on what
        this pin names; return quietly when nothing is pending and nothing was shown
        (the caller then says there is nothing to answer)."""
        now = {
            str(r["call_id"]): (str(r["tool"]), fingerprint(r.get("args") or {})) for r in pending
        }
        same = True
        if self.checkpoint_id is not None and self.checkpoint_id != (head_id or ""):
            if not self.implicit and self.calls is None and self.checkpoint_id in now:
                raise ValidationError(
                    f"expected={self.checkpoint_id!r} is the id of a pending call, but a str "
                    "names a checkpoint (Reply.checkpoint_id): pass call ids as a list, "
                    f"expected=[{self.checkpoint_id!r}], or the Reply or pending_approvals() "
                    "you showed the reviewer",
                    code="invalid_value",
                )
            same = False
        elif self.version is not None and self.version != head_version:
            same = False
        if same and self.calls is not None:
            same = {c[0] for c in self.calls} == set(now) and all(
                (tool is None or tool == now[cid][0]) and (args is None or args == now[cid][1])
                for cid, tool, args in self.calls
            )
        if same or (not pending and not self.shown_any):
            return
        if pending:
            listed = ", ".join(f"{r['tool']} [{r['call_id']}]" for r in pending)
            state = f"it now waits on {listed} (version {head_version})"
        else:
            state = f"nothing waits for approval now (version {head_version})"
        raise ValidationError(
            f"thread {thread_id!r} moved on before this {action}() could apply: it was "
            f"pinned to {self._shown()}, and {state}. Nothing was changed: show the "
            "reviewer thread.pending_approvals() and answer what they see",
            code="stale",
        )

    def _shown(self) -> str:
        if self.implicit:
            return "what was pending when it was called"
        parts: list[str] = []
        if self.checkpoint_id is not None:
            parts.append(f"checkpoint {self.checkpoint_id}")
        if self.version is not None:
            parts.append(f"version {self.version}")
        if self.calls is not None:
            calls = ", ".join(f"{tool or '?'} [{cid}]" for cid, tool, _ in self.calls)
            parts.append(f"the calls {calls}" if calls else "no pending call")
        return " and ".join(parts)


def _call(item: Any) -> _Call:
    if isinstance(item, ApprovalRequest):
        return (item.call_id, item.tool, fingerprint(item.args))
    if isinstance(item, str):
        if not item:
            raise ValidationError("expected holds an empty call id", code="invalid_value")
        return (item, None, None)
    if isinstance(item, Mapping) and isinstance(item.get("call_id"), str):
        tool = item.get("tool")
        if tool is not None and not isinstance(tool, str):
            raise ValidationError("expected: a request's tool must be a str", code="invalid_type")
        args = fingerprint(item["args"]) if "args" in item else None
        return (item["call_id"], tool, args)
    raise ValidationError(
        "expected lists what the reviewer was shown: ApprovalRequests (reply.approvals, "
        "thread.pending_approvals()), their dicts, or call ids; got an item of type "
        f"{type(item).__name__}",
        code="invalid_type",
    )


def _unique(calls: tuple[_Call, ...]) -> tuple[_Call, ...]:
    seen: dict[str, _Call] = {}
    for call in calls:
        if seen.setdefault(call[0], call) != call:
            raise ValidationError(
                f"expected lists call {call[0]!r} twice, differently", code="invalid_value"
            )
    return tuple(seen.values())


def _bad_type(expected: Any) -> ValidationError:
    return ValidationError(
        "expected is what the reviewer was shown: a Reply, its approvals or "
        "thread.pending_approvals() (or their dicts), a list of call ids, a version (int) "
        f"or a checkpoint id (str); got {type(expected).__name__}",
        code="invalid_type",
    )
