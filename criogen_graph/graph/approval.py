"""The `approval` node: one `interrupt()` per suspended turn, then every call of the turn
goes to `tools` with its decision, so results come back in call order in one superstep."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphInterrupt
from langgraph.types import Command, Send, interrupt

from criogen_graph.errors import ValidationError
from criogen_graph.graph.invocation import invocation_of
from criogen_graph.graph.spec import AgentSpec
from criogen_graph.redact import Redactor, effective
from criogen_graph.results import DECISION_TYPES, Decision
from criogen_graph.telemetry.observe import run_redactor
from criogen_graph.tools import ToolArgumentsError

APPROVAL_INTERRUPT = "approval"
#: `check_decisions` applies the policy of the agent that asks.
_ASKER: Any = object()


def check_decisions(
    answer: Any,
    requests: list[dict[str, Any]],
    spec: AgentSpec,
    redactor: Redactor | None = _ASKER,
) -> dict[str, dict[str, Any]]:
    """The decisions in `answer`, keyed by call id, as JSON dicts.

    `answer` is `"approve"` / `"reject"` or one decision dict (for every pending call), or
    a mapping `call_id -> Decision | dict | "approve" | "reject"` covering every pending
    call, or one decision per pending call in call order: a list, or LangChain's
    `HumanInTheLoopMiddleware` shape `{"decisions": [...]}` (whose edits say
    `{"type": "edit", "edited_action": {"name", "args"}}`). Raises `ValidationError`
    naming what is wrong; nothing is changed.

    A reviewer's text follows the same redaction policy as the model's: an edit's
    arguments are redacted, as the model's tool-call arguments are, before they are
    checked against the tool (and then saved and run), and so are reject and respond
    messages. `redactor` defaults to the policy of `spec`'s run (the caller's, then its
    own).
    """
    if redactor is _ASKER:
        redactor = effective(spec.redact)
    by_id = {r["call_id"]: r for r in requests}
    answer = _per_call(answer, by_id)
    return {
        call_id: _checked(call_id, raw, by_id[call_id], spec, redactor)
        for call_id, raw in answer.items()
    }


def _per_call(answer: Any, by_id: dict[str, dict[str, Any]]) -> Mapping[Any, Any]:
    """`answer` as a mapping that decides every pending call and nothing else."""
    answer = _listed(answer, by_id)
    if isinstance(answer, str | Decision) or (isinstance(answer, Mapping) and "type" in answer):
        answer = _for_all(Decision.coerce(answer), by_id)
    if not isinstance(answer, Mapping):
        raise ValidationError(
            f"decisions must map call ids to decisions, got {type(answer).__name__}",
            code="invalid_type",
        )
    unknown = [k for k in answer if k not in by_id]
    if unknown:
        raise ValidationError(
            f"no pending call has id {', '.join(map(repr, unknown))}; pending: {list(by_id)}",
            code="unknown",
        )
    missing = [k for k in by_id if k not in answer]
    if missing:
        raise ValidationError(
            f"a decision is missing for pending call(s) {missing} "
            f"({', '.join(by_id[k]['tool'] for k in missing)}); decide every pending call",
            code="missing",
        )
    return answer


def _listed(answer: Any, by_id: dict[str, dict[str, Any]]) -> Any:
    """Decisions given in call order (LangChain's `{"decisions": [...]}`, a list) keyed
    by call id; any other answer as it is."""
    if isinstance(answer, Mapping) and "decisions" in answer and "decisions" not in by_id:
        return _in_call_order(answer["decisions"], by_id, '{"decisions": [...]}')
    if isinstance(answer, list | tuple):
        return _in_call_order(answer, by_id, "a list of decisions")
    return answer


def _in_call_order(decisions: Any, by_id: dict[str, dict[str, Any]], shape: str) -> dict[str, Any]:
    """One decision per pending call, in call order (what LangChain's human-in-the-loop
    middleware resumes with), keyed by call id."""
    if not isinstance(decisions, list | tuple):
        raise ValidationError(
            f"{shape} needs a list of decisions, got {type(decisions).__name__}",
            code="invalid_type",
        )
    if len(decisions) != len(by_id):
        raise ValidationError(
            f"{shape} has {len(decisions)} decision(s) for {len(by_id)} pending calls "
            f"({', '.join(r['tool'] for r in by_id.values())}); give one per call, in order",
            code="invalid_value",
        )
    return {cid: _from_langchain(d) for cid, d in zip(by_id, decisions, strict=True)}


def _from_langchain(decision: Any) -> Any:
    """A LangChain decision (`edited_action` for an edit) in our shape; others as they
    are (`Decision.coerce` checks them)."""
    if not isinstance(decision, Mapping) or decision.get("type") != "edit":
        return decision
    if "args" in decision:
        return decision
    action = decision.get("edited_action")
    if not isinstance(action, Mapping):
        raise ValidationError(
            "an 'edit' decision needs edited_action {'name': ..., 'args': {...}} (or args)",
            code="missing",
        )
    out = {k: v for k, v in decision.items() if k != "edited_action"}
    out["args"] = action.get("args")
    if action.get("name") is not None:
        out["name"] = action["name"]
    return out


def _for_all(single: Decision, by_id: dict[str, dict[str, Any]]) -> dict[str, Decision]:
    """One decision for every pending call (an edit names one call, so it needs one)."""
    if single.type == "edit" and len(by_id) > 1:
        raise ValidationError(
            "an 'edit' decision names one call: decide({call_id: Decision.edit(...)})",
            code="invalid_value",
        )
    return dict.fromkeys(by_id, single)


def _checked(
    call_id: str, raw: Any, req: dict[str, Any], spec: AgentSpec, redactor: Redactor | None
) -> dict[str, Any]:
    """One call's decision as a JSON dict, allowed for the call, redacted, and (an edit)
    fitting the tool it names."""
    decision = Decision.coerce(raw)
    allowed = req.get("allowed") or list(DECISION_TYPES)
    if decision.type not in allowed:
        raise ValidationError(
            f"{decision.type!r} is not allowed for call {call_id} ({req['tool']}); "
            f"allowed: {allowed}",
            code="invalid_value",
        )
    chosen = decision.to_dict()
    if redactor is not None:
        if chosen.get("message") is not None:
            chosen["message"] = redactor.redact(chosen["message"])
        if chosen.get("args") is not None:
            chosen["args"] = redactor.redact_value(chosen["args"])
    if decision.type == "edit":
        _check_edit(call_id, decision, chosen.get("args") or {}, req, spec)
    return chosen


def _check_edit(
    call_id: str, decision: Decision, args: Any, req: dict[str, Any], spec: AgentSpec
) -> None:
    """`ValidationError` unless the edit's (redacted) `args` fit the tool it names."""
    name = decision.name or req["tool"]
    tool = spec.tools.get(name)
    if tool is None:
        raise ValidationError(
            f"edit of call {call_id} names tool {name!r}, which the agent does not have",
            code="unknown",
        )
    try:
        tool.validate(args)
    except ToolArgumentsError as exc:
        why = ""
        if args != (decision.args or {}):
            why = (
                " (the agent's redaction policy replaced values in them, and a "
                "replaced value is text, as it is in the model's own calls)"
            )
        raise ValidationError(
            f"edited args for call {call_id} do not fit {name!r}: {exc}{why}",
            code="invalid_value",
        ) from None


def decision_details(
    requests: list[dict[str, Any]], decisions: Mapping[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """What an audit record keeps of each decision: the call, its tool and original args,
    the decision, and a SHA-256 of the args it lets run."""
    by_id = {r["call_id"]: r for r in requests}
    return [
        {
            "call_id": cid,
            "tool": by_id[cid]["tool"],
            "args": by_id[cid]["args"],
            "decision": d,
            "approved_args_sha256": _fingerprint(d.get("args", by_id[cid]["args"]))
            if d["type"] in ("approve", "edit")
            else None,
        }
        for cid, d in decisions.items()
    ]


def _fingerprint(args: Any) -> str:
    return hashlib.sha256(
        json.dumps(args, sort_keys=True, separators=(",", ":"), default=str).encode("utf-8")
    ).hexdigest()


class ApprovalNode:
    def __init__(self, spec: AgentSpec) -> None:
        self.spec = spec

    async def __call__(self, payload: dict[str, Any], config: RunnableConfig) -> Command[Any]:
        requests: list[dict[str, Any]] = payload["requests"]
        seg = invocation_of(config)
        states = None
        if seg is not None and not seg.started:
            states = await seg.start_from(config)  # an answer starts this segment
        try:
            decisions = self._ask(requests)
        except GraphInterrupt:
            if seg is not None:
                seg.outcome = "suspended"
            raise
        if seg is not None and seg.note_records:
            seg.decisions = decision_details(requests, decisions)
        sends = _sends(payload, decisions)
        if states is not None:
            return Command(goto=sends, update={"run": {"hooks": states}})
        return Command(goto=sends)

    def _ask(self, requests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """The reviewer's decisions for `requests` (`interrupt()` until they fit)."""
        # `agent` names who asks: an agent used as a tool asks on its caller's thread.
        question: dict[str, Any] = {
            "type": APPROVAL_INTERRUPT,
            "agent": self.spec.name,
            "requests": requests,
        }
        answer = interrupt(question)
        redactor = run_redactor(self.spec)
        while True:
            try:
                return check_decisions(answer, requests, self.spec, redactor)
            except (ValidationError, TypeError) as exc:
                # An answer that does not fit (say, typed in LangGraph Studio: a null,
                # a number) asks again, saying why, instead of failing the run; nothing
                # ran.
                answer = interrupt({**question, "error": str(exc)})


def _sends(payload: dict[str, Any], decisions: dict[str, dict[str, Any]]) -> list[Send]:
    """One `tools` task per call of the turn, in call order, with its decision."""
    base: dict[str, Any] = {k: payload[k] for k in ("run_id", "state") if k in payload}
    sends = []
    for call in payload["calls"]:
        task = {**base, "call": call}
        decision = decisions.get(call["id"])
        if decision is not None:
            task["decision"] = decision
        sends.append(Send("tools", task))
    return sends
