"""Audit records of runs that LangGraph drives with a checkpointer that is not ours.

A run through our `Storage` (a `Thread`) saves its audit records with its checkpoints, in
the storage's own table (`Storage.audit`). When LangGraph runs the agent's graph with its
own checkpointer (`graph.ainvoke` on a graph compiled with `InMemorySaver` or
`AsyncPostgresSaver`, `langgraph dev`, LangGraph's server, a parent graph), the records
go to the LangGraph store the run has (every LangGraph server provides one): one item per
record under the namespace `("criogen_audit", <thread id>)` (a thread id holding `.`,
`%` or NUL has them percent-encoded), keyed so that keys sort in the order the records
were made, the value being the record. They are written when the run segment ends
(completed, suspended, failed or cancelled). A run on one of our storage's checkpointers
without our `Thread` (`agent.graph.builder.compile(checkpointer=storage.checkpointer)`)
writes them to the storage's own table when the segment ends. A run with no thread id,
or neither a store nor our checkpointer, keeps none.

`read_audit(source, thread_id)` reads either kind: a `Storage` or a LangGraph store.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from criogen_graph.errors import ValidationError
from criogen_graph.redact import Redactor

if TYPE_CHECKING:
    from langgraph.store.base import BaseStore

    from criogen_graph.storage import Storage

__all__ = ["AUDIT_NAMESPACE", "audit_namespace", "read_audit", "record", "tool_call_details"]


def now_ns() -> int:
    return time.time_ns()


def record(
    action: str,
    thread_id: str,
    *,
    run_id: str | None,
    actor: str | None,
    **details: Any,
) -> dict[str, Any]:
    """One audit record. `ts_ns` orders records made in the same millisecond."""
    ns = now_ns()
    return {
        "ts_ms": ns // 1_000_000,
        "ts_ns": ns,
        "thread_id": thread_id,
        "run_id": run_id,
        "actor": actor,
        "action": action,
        "details": details,
    }


def tool_call_details(m: Mapping[str, Any]) -> dict[str, Any]:
    """The details of a `tool_call` audit record, from the tool message that answers it:
    the call, the tool that ran, its status, and the hooks or decision that changed it."""
    details: dict[str, Any] = {
        "call_id": m.get("tool_call_id"),
        "tool": m.get("name"),
        "status": m.get("status"),
    }
    if "tool" in m:
        details["ran_as"] = m["tool"]
    for key in ("changed_by", "decision", "error_kind"):
        if key in m:
            details[key] = m[key]
    return details


#: The first label of the store namespace audit records are kept under.
AUDIT_NAMESPACE = "criogen_audit"
_PAGE = 500


def audit_namespace(thread_id: str) -> tuple[str, str]:
    """The store namespace of a thread's audit records: `("criogen_audit", thread_id)`,
    with `%`, `.` and NUL percent-encoded (a namespace label cannot hold `.`)."""
    if not isinstance(thread_id, str) or not thread_id:
        raise ValidationError("a thread id is a non-empty str", code="invalid_value")
    label = "".join(f"%{ord(ch):02X}" if ch in "%.\x00" else ch for ch in thread_id)
    return AUDIT_NAMESPACE, label


async def read_audit(
    source: Storage | BaseStore, thread_id: str, *, limit: int | None = None
) -> list[dict[str, Any]]:
    """A thread's audit records, oldest first (the newest `limit` if given), from our
    `Storage` or from a LangGraph store that runs outside our storage wrote them to.

    Each record is `{"id", "ts_ms", "thread_id", "run_id", "actor", "action",
    "details"}`, as `Storage.audit` returns them (`id` is the store key for a store)."""
    from langgraph.store.base import BaseStore

    if not isinstance(source, BaseStore):
        return await source.audit(thread_id, limit=limit)
    namespace = audit_namespace(thread_id)
    items: list[Any] = []
    offset = 0
    while True:
        page = await source.asearch(namespace, limit=_PAGE, offset=offset)
        items.extend(page)
        if len(page) < _PAGE:
            break
        offset += _PAGE
    # Each label of the namespace must match: a search by prefix also finds
    # ("criogen_audit", thread_id, ...) namespaces, which are not ours.
    items = [i for i in items if tuple(i.namespace) == namespace]
    items.sort(key=lambda i: i.key)
    out = []
    for item in items:
        value = dict(item.value)
        value.pop("ts_ns", None)
        out.append({"id": item.key, **value})
    if limit is not None:
        out = out[-limit:] if limit > 0 else []
    return out


class SegmentAudit:
    """The records of one run segment, written when it ends: to a LangGraph store, or
    with `writer` (our storage's own table)."""

    __slots__ = ("actor", "records", "redactor", "run_id", "store", "thread_id", "writer")

    def __init__(
        self,
        store: Any,
        thread_id: str,
        actor: str | None,
        redactor: Redactor | None,
        writer: Callable[[list[dict[str, Any]]], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        self.writer = writer
        self.thread_id = thread_id
        self.actor = actor
        self.run_id: str | None = None
        self.redactor = redactor
        self.records: list[dict[str, Any]] = []

    def add(self, action: str, **details: Any) -> dict[str, Any]:
        if self.redactor is not None:
            details = self.redactor.redact_value(details)
        made = record(action, self.thread_id, run_id=self.run_id, actor=self.actor, **details)
        self.records.append(made)
        return made

    def decided(self, decisions: list[dict[str, Any]]) -> None:
        """The answer's record names each decision, as our `Thread` records them."""
        for r in self.records:
            if r["action"] in ("approve", "reject", "decide"):
                details = {"decisions": decisions}
                if self.redactor is not None:
                    details = self.redactor.redact_value(details)
                r["details"] = details
                return

    def tool_calls(self, messages: list[dict[str, Any]]) -> None:
        for m in messages:
            self.records.append(
                record(
                    "tool_call",
                    self.thread_id,
                    run_id=self.run_id,
                    actor=self.actor,
                    **tool_call_details(m),
                )
            )

    async def write(self, run_id: str | None) -> None:
        """Write every record in one batch (in a store, each keyed by the time it was
        made)."""
        from langgraph.store.base import PutOp

        if not self.records:
            return
        for r in self.records:
            if r["run_id"] is None:
                r["run_id"] = run_id
        if self.writer is not None:
            records, self.records = self.records, []
            await self.writer(records)
            return
        namespace = audit_namespace(self.thread_id)
        ops = []
        for r in self.records:
            key = f"{r['ts_ns']:020d}-{uuid.uuid4().hex[:8]}"
            ops.append(PutOp(namespace, key, dict(r), index=False))
        self.records = []
        await self.store.abatch(ops)


def answer_action(answer: Any) -> str:
    """The audit action of a resume value given to an approval: `approve`, `reject`, or
    `decide` (one decision per call)."""
    if isinstance(answer, str):
        return answer if answer in ("approve", "reject") else "decide"
    if isinstance(answer, Mapping) and "type" in answer:
        kind = answer.get("type")
        return kind if kind in ("approve", "reject") else "decide"
    return "decide"
