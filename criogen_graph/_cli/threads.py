"""`criogen-graph threads`: read (list, show, history, pending, audit) and answer
(approve, reject, decide, retry) the threads kept in a storage."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from criogen_graph._cli.common import EXIT_OK, EXIT_USAGE, CliError, run
from criogen_graph._cli.loading import (
    bare_agent,
    close,
    default_actor,
    load_agent,
    safe_url,
    threads_storage,
)
from criogen_graph._cli.rendering import (
    Printer,
    args_json,
    audit_summary,
    fmt_ms,
    message_lines,
    print_json,
    request_lines,
)

if TYPE_CHECKING:
    from criogen_graph.agent import Agent
    from criogen_graph.results import Decision, PendingApprovals
    from criogen_graph.storage import Storage
    from criogen_graph.stream import Stream
    from criogen_graph.thread import Thread

__all__ = ["ANSWERING", "Decisions", "cmd_threads", "parse_decisions"]

#: The actions that continue a run, and so need `--agent`.
ANSWERING = ("approve", "reject", "decide", "retry")

#: The keys of a decision given as a JSON object (`{"type": ..., ...}`).
_DECISION_KEYS = frozenset({"type", "message", "args", "name"})

#: What `threads list` shows for a status.
#: (`completed` as in `--json` and `threads history`.)
_STATUS_LABELS = {"suspended": "waits for approval", "pending": "unfinished"}


# -- decide --json ----------------------------------------------------------------------


@dataclass(frozen=True)
class Decisions:
    """What `threads decide --json` gave: decisions by call id, one decision for every
    pending call, or a list of decisions for the pending calls in their order."""

    by_call: Mapping[str, Decision] | None = None
    every: Decision | None = None
    in_order: Sequence[Decision] | None = None

    def for_calls(self, call_ids: Sequence[str]) -> dict[str, Decision]:
        """The decisions keyed by call id, for the pending calls `call_ids` (in the order
        `threads pending` lists them)."""
        if self.by_call is not None:
            return dict(self.by_call)
        if self.every is not None:
            return dict.fromkeys(call_ids, self.every)
        listed = list(self.in_order or ())
        if len(listed) != len(call_ids):
            raise CliError(
                f"--json lists {len(listed)} decision(s) but {len(call_ids)} call(s) wait "
                f"({', '.join(call_ids)}): give one per call, in that order, or key them by "
                "call id"
            )
        return dict(zip(call_ids, listed, strict=True))


def _decision(value: Any, where: str) -> Decision:
    from criogen_graph.errors import ValidationError
    from criogen_graph.results import Decision

    try:
        return Decision.coerce(value)
    except (ValidationError, TypeError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def _is_one_decision(data: Mapping[str, Any]) -> bool:
    """Whether a JSON object is one decision (`{"type": "approve"}`) rather than decisions
    keyed by call id. (A call whose id is "type" is answered with the list form.)"""
    return isinstance(data.get("type"), str) and set(data) <= _DECISION_KEYS


def parse_decisions(text: str) -> Decisions:
    """`threads decide --json`: `{call_id: decision, ...}`, one decision for every
    pending call (`"approve"`, `"reject"` or `{"type": ...}`), or a list of decisions,
    one per pending call. Raises `ValueError` saying what is wrong."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"invalid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); expected "
            '{"call_id": {"type": "approve"}, ...}, one decision such as \'"approve"\', or a '
            "list of decisions"
        ) from None
    if isinstance(data, str):
        return Decisions(every=_decision(data, "the decision"))
    if isinstance(data, list):
        return Decisions(
            in_order=[_decision(d, f"decision {i} of the list") for i, d in enumerate(data)]
        )
    if not isinstance(data, dict):
        raise ValueError(
            'expected a JSON object {"call_id": decision, ...}, one decision ("approve", '
            f'"reject", {{"type": ...}}) or a list of decisions, got {type(data).__name__}'
        )
    if _is_one_decision(data):
        return Decisions(every=_decision(data, "the decision"))
    return Decisions(by_call={k: _decision(v, f"call {k!r}") for k, v in data.items()})


# -- the command --------------------------------------------------------------------------


def cmd_threads(args: argparse.Namespace) -> int:
    """`criogen-graph threads ACTION`."""
    action: str | None = args.action
    if action is None:
        args.threads_parser.print_help()
        return EXIT_USAGE
    if action in ANSWERING and not args.agent:
        args.action_parser.error(
            f"`threads {action}` continues the run, so it needs the agent whose model and "
            "tools run next: add --agent module:attr (an importable Agent)"
        )
    agent: Agent[Any] | None = load_agent(args.agent) if args.agent else None
    storage = threads_storage(args.storage, agent)
    reader = agent.with_storage(storage) if agent is not None else bare_agent(storage)
    return run(_threads(args, action, reader, agent, storage))


async def _threads(
    args: argparse.Namespace,
    action: str,
    reader: Agent[Any],
    agent: Agent[Any] | None,
    storage: Storage,
) -> int:
    try:
        return await _ACTIONS[action](args, reader, storage, sys.stdout)
    finally:
        await close(agent, storage)


async def _require_thread(storage: Storage, thread_id: str) -> None:
    await storage.open()
    tup = await storage.checkpointer.aget_tuple(
        {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    )
    if tup is None:
        raise CliError(
            f"no thread {thread_id!r} in {safe_url(storage.url)} (`criogen-graph threads list` "
            "shows them)"
        )


# -- reading ------------------------------------------------------------------------------


async def _list(args: argparse.Namespace, agent: Agent[Any], storage: Storage, out: TextIO) -> int:
    rows: list[dict[str, Any]] = []
    for tid in await storage.threads():
        head = await agent.thread(tid).history(limit=1)
        if not head:
            continue
        entry = head[0]
        rows.append(
            {
                "id": tid,
                "status": entry["status"],
                "waiting_for_approval": entry["status"] == "suspended",
                "version": entry["version"],
                "updated_at_ms": entry["created_at_ms"],
            }
        )
    if args.json:
        print_json(rows, out)
    elif not rows:
        out.write(f"no threads in {safe_url(storage.url)}\n")
    else:
        _thread_table(rows, out)
    return EXIT_OK


def _thread_table(rows: Sequence[Mapping[str, Any]], out: TextIO) -> None:
    width = max(6, *(len(r["id"]) for r in rows))
    out.write(f"{'THREAD':<{width}}  {'STATUS':<18}  {'VERSION':>7}  UPDATED\n")
    for r in rows:
        status = _STATUS_LABELS.get(r["status"], r["status"])
        out.write(
            f"{r['id']:<{width}}  {status:<18}  {r['version']:>7}  {fmt_ms(r['updated_at_ms'])}\n"
        )


async def _show(args: argparse.Namespace, agent: Agent[Any], storage: Storage, out: TextIO) -> int:
    await _require_thread(storage, args.thread_id)
    thread = agent.thread(args.thread_id)
    messages = await thread.messages()
    pending = await thread.pending_approvals()
    if args.json:
        print_json(
            {
                "thread_id": args.thread_id,
                "messages": messages,
                "pending_approvals": [r.to_dict() for r in pending],
                "version": pending.version,
                "checkpoint_id": pending.checkpoint_id,
            },
            out,
        )
        return EXIT_OK
    for m in messages:
        for line in message_lines(m):
            out.write(line + "\n")
    if pending:
        out.write(
            f"-- waits for approval of {len(pending)} call(s) at version {pending.version}:\n"
        )
        for r in pending:
            for line in request_lines(r):
                out.write("  " + line + "\n")
    return EXIT_OK


async def _history(
    args: argparse.Namespace, agent: Agent[Any], storage: Storage, out: TextIO
) -> int:
    await _require_thread(storage, args.thread_id)
    entries = await agent.thread(args.thread_id).history(limit=args.limit)
    if args.json:
        print_json(entries, out)
        return EXIT_OK
    out.write(f"{'VERSION':>7}  {'STATUS':<10}  {'SOURCE':<6}  {'STEP':>4}  {'CREATED':<19}  ")
    out.write("CHECKPOINT\n")
    for e in entries:
        out.write(
            f"{e['version']:>7}  {e['status']:<10}  {e['source'] or '-':<6}  "
            f"{e['step'] if e['step'] is not None else '-':>4}  {fmt_ms(e['created_at_ms']):<19}  "
            f"{e['id']}\n"
        )
    return EXIT_OK


async def _pending(
    args: argparse.Namespace, agent: Agent[Any], storage: Storage, out: TextIO
) -> int:
    await _require_thread(storage, args.thread_id)
    pending = await agent.thread(args.thread_id).pending_approvals()
    if args.json:
        print_json([r.to_dict() for r in pending], out)
        return EXIT_OK
    if not pending:
        out.write(f"thread {args.thread_id} waits for no approval\n")
        return EXIT_OK
    for r in pending:
        for line in request_lines(r):
            out.write(line + "\n")
    out.write(
        f"-- version {pending.version}: `threads approve|reject|decide {args.thread_id} "
        f"--expect {pending.version}` answers exactly these\n"
    )
    return EXIT_OK


async def _audit(args: argparse.Namespace, agent: Agent[Any], storage: Storage, out: TextIO) -> int:
    await storage.open()
    records = await storage.audit(args.thread_id, limit=args.limit)
    if args.thread_id and not records:
        await _require_thread(storage, args.thread_id)
    if args.json:
        print_json(records, out)
        return EXIT_OK
    if not records:
        out.write("no audit records\n")
        return EXIT_OK
    for r in records:
        who = r.get("actor") or "-"
        thread = "" if args.thread_id else f"{r['thread_id']}  "
        line = f"{fmt_ms(r['ts_ms'])}  {thread}{r['action']:<13} {who:<10} {audit_summary(r)}"
        out.write(line.rstrip() + "\n")
    return EXIT_OK


# -- answering ----------------------------------------------------------------------------


async def _continue(stream: Stream[Any], out: TextIO, verb: str) -> int:
    reply = await Printer(out).consume(stream)
    if reply.needs_approval:
        out.write(f"{verb}; the run stopped for approval again:\n")
        for r in reply.approvals:
            for line in request_lines(r):
                out.write("  " + line + "\n")
    else:
        out.write(f"{verb}; the run ended ({reply.stop_reason}), version {reply.version}\n")
    return EXIT_OK


def _chosen_calls(args: argparse.Namespace, pending: PendingApprovals) -> dict[str, Decision]:
    """`approve --call ID...`: approve those, reject the others (with --reject-others)."""
    from criogen_graph.results import Decision

    ids = [r.call_id for r in pending]
    unknown = [c for c in args.call if c not in ids]
    if unknown:
        raise CliError(f"no pending call {', '.join(unknown)}; pending: {', '.join(ids)}")
    others = [r for r in pending if r.call_id not in args.call]
    if others and not args.reject_others:
        listed = ", ".join(f"{r.call_id} ({r.tool})" for r in others)
        raise CliError(
            f"{listed} also wait(s) for a decision: list it with --call, add --reject-others, "
            "or use `threads decide`"
        )
    return {
        r.call_id: Decision.approve() if r.call_id in args.call else Decision.reject(args.reason)
        for r in pending
    }


def _answer_stream(
    args: argparse.Namespace, thread: Thread[Any], pending: PendingApprovals, expected: Any
) -> tuple[Stream[Any], str]:
    """The run the answer continues, and the verb that reports it."""
    if args.action == "reject":
        return thread.stream_reject(args.reason, expected=expected), "rejected"
    if args.action == "decide":
        decisions = args.decisions.for_calls([r.call_id for r in pending])
        return thread.stream_decide(decisions, expected=expected), "decided"
    if not args.call:
        return thread.stream_approve(expected=expected), "approved"
    return thread.stream_decide(_chosen_calls(args, pending), expected=expected), "decided"


async def _answer(
    args: argparse.Namespace, agent: Agent[Any], storage: Storage, out: TextIO
) -> int:
    await _require_thread(storage, args.thread_id)
    thread = agent.thread(args.thread_id, actor=args.actor or default_actor())
    if args.action == "retry":
        return await _continue(thread.stream_retry(), out, "retried")
    pending = await thread.pending_approvals()
    if not pending:
        raise CliError(f"thread {args.thread_id!r} waits for no approval")
    # The answer applies to what the user pinned (--expect), else to what this command
    # read and prints here: never to calls asked after it read them.
    expected: Any = args.expect if args.expect is not None else pending
    if args.expect is None:
        out.write(f"answering version {pending.version}:\n")
        for r in pending:
            out.write(f"  {r.call_id}  {r.tool}({args_json(r.args)})\n")
    stream, verb = _answer_stream(args, thread, pending, expected)
    return await _continue(stream, out, verb)


_ACTIONS: dict[
    str,
    Callable[[argparse.Namespace, Any, Any, TextIO], Coroutine[Any, Any, int]],
] = {
    "list": _list,
    "show": _show,
    "history": _history,
    "pending": _pending,
    "approve": _answer,
    "reject": _answer,
    "decide": _answer,
    "retry": _answer,
    "audit": _audit,
}
