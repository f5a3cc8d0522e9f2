"""Approval rules: which tool calls wait for a person, and what the person may decide."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from criogen_graph.errors import ValidationError
from criogen_graph.results import DECISION_TYPES, ApprovalRequest

__all__ = ["Approval"]


class Approval:
    """A rule that gates calls to one tool behind a person's decision.

    `approve=["refund"]` is short for `approve=[Approval("refund")]`. `description` is
    shown to the reviewer (a string, or a function of the call's args returning one);
    `allowed` limits the decisions (default: all of `"approve"`, `"edit"`, `"reject"`,
    `"respond"`); `when(args) -> bool` gates only the calls it returns true for.
    """

    __slots__ = ("allowed", "description", "tool", "when")

    def __init__(
        self,
        tool: str,
        *,
        description: str | Callable[[dict[str, Any]], str] | None = None,
        allowed: Sequence[str] | None = None,
        when: Callable[[dict[str, Any]], bool] | None = None,
    ) -> None:
        if not isinstance(tool, str) or not tool:
            raise TypeError(f"Approval needs a tool name, got {tool!r}")
        if description is not None and not (isinstance(description, str) or callable(description)):
            raise TypeError("Approval description must be a str or a function of the args")
        if allowed is not None:
            if isinstance(allowed, str):
                raise TypeError("Approval allowed must be a list, e.g. ['approve', 'reject']")
            allowed = list(allowed)
            bad = [a for a in allowed if a not in DECISION_TYPES]
            if bad or not allowed:
                raise ValidationError(
                    f"Approval({tool!r}) allowed {allowed!r}: each must be one of "
                    f"{list(DECISION_TYPES)}, and at least one",
                    code="invalid_value",
                )
        if when is not None and not callable(when):
            raise TypeError("Approval when must be a function of the args")
        self.tool = tool
        self.description = description
        self.allowed = allowed
        self.when = when

    def applies(self, args: dict[str, Any]) -> bool:
        """Whether a call with `args` needs a decision."""
        return self.when is None or bool(self.when(args))

    def request(self, call: Mapping[str, Any]) -> ApprovalRequest:
        """The `ApprovalRequest` for one call."""
        args = dict(call.get("args") or {})
        desc = self.description
        if callable(desc):
            desc = desc(args)
        return ApprovalRequest(
            call_id=str(call["id"]),
            tool=str(call["name"]),
            args=args,
            description=desc,
            allowed=list(self.allowed) if self.allowed is not None else None,
        )

    def __repr__(self) -> str:
        return f"Approval({self.tool!r})"


def compile_approvals(approve: Iterable[str | Approval]) -> dict[str, Approval]:
    if isinstance(approve, str | bytes):
        raise TypeError(f"approve must be a list of tool names, got the string {approve!r}")
    rules: dict[str, Approval] = {}
    for entry in approve:
        rule = Approval(entry) if isinstance(entry, str) else entry
        if not isinstance(rule, Approval):
            raise TypeError(f"approve entries must be tool names or Approval rules, got {entry!r}")
        if rule.tool in rules:
            raise ValidationError(f"approve names {rule.tool!r} twice", code="invalid_value")
        rules[rule.tool] = rule
    return rules
