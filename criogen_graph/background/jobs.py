"""A background run's job, whichever queue holds it: its statuses and record (`RunInfo`),
its payload (`payload`: the same input checks as `Thread.send`, made before anything is
queued; `read_payload` on the worker's side) and its execution (`execute`: a worker that
takes over a dead worker's run continues it from its last saved step, `_continue`).
Imports no queue: the in-process queue (`local`) and PostgreSQL's (`postgres`) import it."""

from __future__ import annotations

import importlib
import json
import os
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from criogen_graph.errors import ValidationError
from criogen_graph.results import Decision, PendingApprovals, Reply

if TYPE_CHECKING:
    from criogen_graph.agent import Agent
    from criogen_graph.thread import Thread

#: Statuses of a background run; the last three are final.
QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = (
    "queued",
    "running",
    "succeeded",
    "failed",
    "cancelled",
)
FINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
_ACTIONS = frozenset({"send", "approve", "reject", "decide", "retry"})
_PAYLOAD_VERSION = 1


@dataclass(frozen=True)
class RunInfo:
    """What the queue knows of one background run.

    `status`: queued, running, succeeded, failed or cancelled. `attempts` counts the
    workers that started it (more than one when a worker died and another took over);
    `worker` is the last one (`host:pid`). A failed run has `error_code`, `error_type`
    and `error`. A run that ended has `run_id` and `checkpoint_id` (read the `Reply`
    with `handle.reply()`); `needs_approval` says it stopped for an approval.
    `heartbeat_age_ms`: for a running run on PostgreSQL, how long ago its worker last
    sent a heartbeat (past the workers' `stalled_after_secs`, it is taken for dead once
    it no longer holds the thread's lock); None otherwise.
    """

    id: str
    thread_id: str
    agent: str
    action: str
    status: str
    attempts: int = 0
    worker: str | None = None
    error_code: str | None = None
    error_type: str | None = None
    error: str | None = None
    run_id: str | None = None
    checkpoint_id: str | None = None
    stop_reason: str | None = None
    needs_approval: bool | None = None
    job_id: int | None = None
    submitted_at_ms: int | None = None
    started_at_ms: int | None = None
    first_started_at_ms: int | None = None
    finished_at_ms: int | None = None
    heartbeat_age_ms: int | None = None

    @property
    def done(self) -> bool:
        """The run ended (succeeded, failed or cancelled)."""
        return self.status in FINAL

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


async def make_payload(thread: Thread[Any], action: str, **fields: Any) -> dict[str, Any]:
    from criogen_graph.redact import effective
    from criogen_graph.runtime.inputs import send_input

    payload: dict[str, Any] = {
        "v": _PAYLOAD_VERSION,
        "id": uuid.uuid4().hex,
        "thread_id": thread.id,
        "agent": thread.agent.name,
        "actor": thread.actor,
        "action": action,
    }
    if action == "send":
        # The same checks as send(); the queue keeps the text as redacted as the thread.
        user, state = send_input(thread.agent.spec, fields["input"], fields.get("state"))
        payload["input"] = user["content"]
        payload["state"] = state
    elif action in ("approve", "reject", "decide"):
        # Answers are redacted as the thread redacts them when it applies them (the
        # graph redacts a resume's values), so the queue holds nothing the thread would not.
        redactor = effective(thread.agent.spec.redact)
        if action == "reject":
            if not isinstance(fields["message"], str):
                raise ValidationError("reject message must be a str", code="invalid_type")
            message = fields["message"]
            payload["message"] = redactor.redact(message) if redactor is not None else message
        if action == "decide":
            decisions = fields["decisions"]
            if not isinstance(decisions, Mapping):
                raise ValidationError(
                    "decide takes a dict {call_id: Decision}", code="invalid_type"
                )
            payload["decisions"] = {
                str(k): _redacted(redactor, v.to_dict() if isinstance(v, Decision) else v)
                for k, v in decisions.items()
            }
        payload["expected"], asked = await _pin(thread, fields.get("expected"))
        if asked is not None:
            payload["asked"] = asked
    try:
        json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValidationError(
            f"a background run's input must be plain JSON (it is stored in the queue): {exc}",
            code="invalid_type",
        ) from None
    return payload


def _redacted(redactor: Any, value: Any) -> Any:
    return redactor.redact_value(value) if redactor is not None else value


async def _pin(thread: Thread[Any], expected: Any) -> tuple[Any, str | None]:
    """`expected` as JSON, and the checkpoint that asked what it answers (None if the
    pin does not match what waits now: the run will fail `stale`). A bare answer pins
    what waits now (as a bare `approve()` does), so a queued answer never applies to a
    request asked after it was made. A worker taking the run over finds by the asking
    checkpoint whether the answer was applied, whatever the pin's form."""
    from criogen_graph.runtime.pins import Pin

    pending = await thread.pending_approvals()
    if expected is None:
        if not pending:
            raise ValidationError(
                f"thread {thread.id!r} has no pending approvals to answer", code="not_suspended"
            )
        return pending.checkpoint_id, pending.checkpoint_id
    if isinstance(expected, Reply | PendingApprovals):
        pinned: Any = expected.checkpoint_id
    elif isinstance(expected, bool):
        raise ValidationError("expected= cannot be a bool", code="invalid_type")
    elif isinstance(expected, str | int):
        pinned = expected
    elif isinstance(expected, Sequence):
        pinned = [r.to_dict() if hasattr(r, "to_dict") else r for r in expected]
    else:
        raise ValidationError(
            f"expected= takes a Reply, pending_approvals(), a checkpoint id or version, or "
            f"the requests; got {type(expected).__name__}",
            code="invalid_type",
        )
    pin = Pin.of(pinned)
    if pin is None or not pending or pending.checkpoint_id is None:
        return pinned, None
    try:
        pin.check(
            thread_id=thread.id,
            action="submit",
            head_id=pending.checkpoint_id,
            head_version=pending.version or 0,
            pending=[r.to_dict() for r in pending],
        )
    except ValidationError:
        return pinned, None
    return pinned, pending.checkpoint_id


# -- running a job (shared by the in-process and the PostgreSQL workers) ------------------


class BadPayload(Exception):
    """A job's payload this worker cannot read (the run fails with `bad_payload`)."""


def read_payload(raw: Any) -> dict[str, Any]:
    """A job's payload, checked (`BadPayload` naming what is wrong)."""
    if not isinstance(raw, Mapping):
        raise BadPayload(f"the job's payload is a {type(raw).__name__}, not an object")
    if raw.get("v") != _PAYLOAD_VERSION:
        raise BadPayload(
            f"the job's payload has version {raw.get('v')!r}; this worker reads version "
            f"{_PAYLOAD_VERSION} (upgrade the worker or the submitter)"
        )
    for key in ("id", "thread_id", "agent", "action"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise BadPayload(f"the job's payload has no {key!r}")
    if raw["action"] not in _ACTIONS:
        raise BadPayload(f"the job's payload has an unknown action {raw['action']!r}")
    if raw["action"] == "send" and not isinstance(raw.get("input"), str):
        raise BadPayload("the job's payload has no 'input' text")
    return dict(raw)


#: The run code of a job created over HTTP (a payload with a `serve` field), named
#: rather than imported: the server queues jobs here, so the queue must not import the
#: server back (that would be an import circle); imported on a served job's first run.
SERVED_BY = "criogen_graph.serve._worker:execute_served"


def _executor(name: str) -> Any:
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)


async def execute(agent: Agent[Any], payload: dict[str, Any], resumed: bool) -> Reply[Any]:
    """Run one job. `resumed`: a worker started it before (and died): whatever it had
    applied is not applied again; an unfinished run is continued as `retry()` does."""
    if payload.get("serve") is not None:
        # A run created over HTTP: executed by the server's run code, which saves its
        # events where every `serve` process reads them.
        execute_served = _executor(SERVED_BY)
        return cast("Reply[Any]", await execute_served(agent, payload, resumed))
    thread = agent.thread(payload["thread_id"], actor=payload.get("actor"))
    action = payload["action"]
    if resumed:
        done = await _continue(thread, payload)
        if done is not None:
            return done
    if action == "send":
        # The job's id is the run's: a worker taking over finds by it whether the send
        # was already applied.
        return await thread.send_as(
            payload["input"], state=payload.get("state"), run_id=payload["id"]
        )
    if action == "retry":
        return await thread.retry()
    expected = payload.get("expected")
    if action == "approve":
        return await thread.approve(expected=expected)
    if action == "reject":
        return await thread.reject(payload.get("message", "rejected"), expected=expected)
    return await thread.decide(payload.get("decisions") or {}, expected=expected)


async def _continue(thread: Thread[Any], payload: dict[str, Any]) -> Reply[Any] | None:
    """The job's effect as far as an earlier attempt got: None if it applied nothing
    (apply it now), else the finished or continued run's `Reply`."""
    entries = await thread.history(limit=1)
    if not entries:
        return None
    head = entries[0]
    action = payload["action"]
    own: str | None = None
    if action == "send":
        # Searched in the whole history: runs saved since (an interactive send while the
        # job waited for a worker) must not hide that this one was applied.
        own = head["id"] if head["run_id"] == payload["id"] else await _own(thread, payload)
        applied = own is not None
    elif action == "retry":
        applied = True
    else:
        asked = payload.get("asked")
        if asked is None and isinstance(payload.get("expected"), str):
            asked = payload["expected"]  # a payload from before `asked`
        applied = isinstance(asked, str) and head["id"] != asked
    if not applied:
        return None
    if own is not None and own != head["id"]:
        # Later runs followed this one: its own last checkpoint is its answer, if it
        # finished; a run cut off and then overtaken is not continued (that would apply
        # it after runs the user made since).
        if await _status_of(thread, own) != "completed":
            raise Superseded(
                f"background run {payload['id']} was interrupted (its worker died) and a "
                f"later run on thread {thread.id!r} came before it was taken over: it is "
                "not continued nor applied again; what it finished is in the thread"
            )
        return await thread.reply_at(own, payload["id"])
    if head["status"] in ("pending", "failed", "cancelled"):
        try:
            return await thread.retry()
        except ValidationError as exc:
            if exc.code != "nothing_to_retry":
                raise
            # An earlier attempt finished the run while this one waited for the lock.
            head = (await thread.history(limit=1))[0]
    return await thread.reply_at(head["id"], head["run_id"] or payload["id"])


async def _status_of(thread: Thread[Any], checkpoint_id: str) -> str | None:
    """The history status of one checkpoint of the thread."""
    from criogen_graph.runtime.history import history_entry

    cfg: Any = {
        "configurable": {
            "thread_id": thread.id,
            "checkpoint_ns": "",
            "checkpoint_id": checkpoint_id,
        }
    }
    tup = await thread.agent.storage.checkpointer.aget_tuple(cfg)
    return None if tup is None else str(history_entry(tup)["status"])


class Superseded(Exception):
    """A run cut off by its worker's death that later runs overtook (`superseded`)."""


async def _own(thread: Thread[Any], payload: dict[str, Any]) -> str | None:
    """The newest checkpoint of the thread saved by the run `payload["id"]`, or None."""
    storage = thread.agent.storage
    await storage.backend()
    cfg: Any = {"configurable": {"thread_id": thread.id, "checkpoint_ns": ""}}
    async for tup in storage.checkpointer.alist(cfg, filter={"run_id": payload["id"]}, limit=1):
        return str(tup.config["configurable"]["checkpoint_id"])
    return None


def error_fields(agent: Agent[Any] | None, exc: BaseException) -> dict[str, Any]:
    """The fields of a failed run's record for `exc` (its message redacted by the
    agent's policy)."""
    from criogen_graph.redact import effective

    message = str(exc)
    redactor = effective(agent.spec.redact) if agent is not None else None
    if redactor is not None:
        message = redactor.redact(message)
    if isinstance(exc, BadPayload):
        code = "bad_payload"
    elif isinstance(exc, UnknownAgent):
        code = "unknown_agent"
    elif isinstance(exc, Superseded):
        code = "superseded"
    else:
        given = getattr(exc, "code", None)
        code = given if isinstance(given, str) and given != "error" else "run_failed"
    return {
        "error_code": code,
        "error_type": type(exc).__name__,
        "error": message[:2000],
    }


class UnknownAgent(Exception):
    """A job for an agent the worker does not serve (the run fails with `unknown_agent`)."""


def result_fields(reply: Reply[Any]) -> dict[str, Any]:
    """The fields of a finished run's record for its `reply`."""
    return {
        "run_id": reply.run_id,
        "checkpoint_id": reply.checkpoint_id,
        "stop_reason": reply.stop_reason,
        "needs_approval": reply.needs_approval,
    }


def worker_name() -> str:
    """`host:pid`, naming a worker in run records."""
    return f"{socket.gethostname()}:{os.getpid()}"


def now_ms() -> int:
    return int(time.time() * 1000)
