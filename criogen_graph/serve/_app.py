"""The HTTP endpoints: the subset of the LangGraph Platform API that `langgraph_sdk` and
`@langchain/langgraph-sdk` (its React `useStream` included) use, each a thin adapter
onto the `Thread` API: every run is a `Thread` call, so its lock, pinned answers,
audit (with the caller's identity as actor), redaction and encryption hold."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from criogen_graph._version import __version__
from criogen_graph.agent import Agent
from criogen_graph.errors import (
    CriogenError,
    StorageError,
    ThreadBusyError,
    ThreadSuspendedError,
    ValidationError,
)
from criogen_graph.runtime.inputs import check_thread_id
from criogen_graph.serve._events_pg import PgEvents
from criogen_graph.serve._openapi import openapi
from criogen_graph.serve._protocol import (
    BadRequest,
    dumps,
    interrupts_json,
    now_iso,
    read_input,
    sse,
    state_json,
    storable,
    storable_str,
    stream_modes,
    with_message_ids,
)
from criogen_graph.serve._records import Records
from criogen_graph.serve._runs import HEARTBEAT_SECS, Run, Runs, is_terminal
from criogen_graph.storage import Storage
from criogen_graph.stream import Stream
from criogen_graph.thread import Thread

__all__ = ["MAX_BODY_BYTES", "Auth", "build_app"]

_log = logging.getLogger("criogen_graph.serve")

#: The largest request body the server reads (bigger ones get 413 before they are read).
MAX_BODY_BYTES = 8 * 1024 * 1024

#: `auth`: request headers -> the caller's identity (None refuses), sync or async.
Auth = Callable[[Mapping[str, str]], "str | Awaitable[str | None] | None"]

#: `ValidationError` codes that mean "not now" (409) rather than "not like this" (422).
_CONFLICT_CODES = frozenset({"stale", "not_suspended", "nothing_to_retry"})
_UNSUPPORTED_RUN_FIELDS = ("interrupt_before", "interrupt_after", "webhook", "after_seconds")


#: Seconds a run may wait to be started by a worker (`start_timeout`): a run record
#: with no job that long is taken for lost (its server died between saving the record
#: and queueing the job), and a queued run that long with no worker alive in that time
#: ends in error.
START_TIMEOUT_SECS = 30.0


def _why(code: str, message: str) -> dict[str, Any]:
    """The data of the `error` event of a run the workers did not run."""
    return {"error": "RunFailedError", "code": code, "message": message}


async def _fail_unstarted(storage: Storage, run_id: str, within: float, message: str) -> bool:
    from criogen_graph.background.postgres import pg_queue

    queue = await pg_queue(storage)
    return await queue.fail_unstarted(run_id, idle_secs=within, message=message)


def _age_secs(record: Mapping[str, Any]) -> float:
    try:
        created = datetime.fromisoformat(str(record.get("created_at")))
    except ValueError:
        return float("inf")
    if created.tzinfo is None:
        created = created.replace(tzinfo=UTC)
    return (datetime.now(UTC) - created).total_seconds()


def _json(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(dumps(data), status, headers=dict(headers or {}), media_type="application/json")


def _error(status: int, detail: str) -> Response:
    return _json({"detail": detail}, status)


def error_status(exc: CriogenError) -> int:
    """The HTTP status of a library error met while serving a request."""
    if isinstance(exc, ThreadSuspendedError | ThreadBusyError):
        return 409
    if isinstance(exc, ValidationError):
        return 409 if exc.code in _CONFLICT_CODES else 422
    if isinstance(exc, StorageError):
        return 503
    return 422


class _Server:
    """What every endpoint shares: the agents by name, the storage, the run registry."""

    def __init__(
        self,
        agents: dict[str, Agent[Any]],
        storage: Storage,
        auth: Auth | None,
        workers: bool,
        heartbeat: float = HEARTBEAT_SECS,
        start_timeout: float = START_TIMEOUT_SECS,
    ) -> None:
        self.agents = agents
        #: Seconds between heartbeat comments on a quiet SSE stream.
        self.heartbeat = heartbeat
        #: See `START_TIMEOUT_SECS`.
        self.start_timeout = start_timeout
        self.storage = storage
        self.auth = auth
        #: Runs are queued for the background workers (PostgreSQL) instead of run here.
        self.workers = workers
        self.records = Records(storage)
        self.runs = Runs(self.records)
        #: Tasks cancelling queued runs whose client left (kept until they end).
        self.cancelling: set[asyncio.Task[Any]] = set()

    async def busy(self, thread_id: str) -> bool:
        """A run is queued or running on the thread (here, or in the workers' queue)."""
        if self.runs.busy(thread_id):
            return True
        if not self.workers:
            return False
        from criogen_graph.background import list_runs

        for status in ("running", "queued"):
            if await list_runs(self.storage, status=status, thread_id=thread_id, limit=1):
                return True
        return False

    async def settled(self, record: dict[str, Any]) -> dict[str, Any]:
        """A run record brought up to date with the workers' queue: a run the worker
        could not even start (unknown agent, bad payload) or that was cancelled before
        it started ends there; a run whose server died before queueing it ends as an
        error instead of staying pending forever."""
        if not self.workers or is_terminal(record.get("status")):
            return record
        from criogen_graph.background import get_run

        run_id = str(record["run_id"])
        info = await get_run(self.storage, run_id)
        why: dict[str, Any] | None = None
        if info is None:
            if _age_secs(record) < self.start_timeout:
                return record
            status = "error"
            why = _why(
                "not_queued",
                "the run was never queued for the workers (the server that took it "
                "stopped first); send it again",
            )
        elif info.status == "failed":
            status = "error"
            why = _why(info.error_code or "run_failed", info.error or "the run failed")
        elif info.status == "cancelled":
            status = "interrupted"
        elif info.status == "succeeded":
            status = "success"
        elif info.status == "queued" and _age_secs(record) >= self.start_timeout:
            message = (
                f"no worker started the run: no `criogen-graph worker` has been alive "
                f"on this storage for {self.start_timeout:g} s; start one serving "
                f"assistant {record.get('assistant_id')!r} and send the run again"
            )
            if not await _fail_unstarted(self.storage, run_id, self.start_timeout, message):
                return record
            status, why = "error", _why("no_worker", message)
        else:
            return record
        if why is not None and self.runs.events is not None:
            # Before the status: a follower that reads the end reads this event too.
            await self.runs.events.fail(run_id, why)
        record = {**record, "status": status, "updated_at": now_iso()}
        await self.records.put_run(record)
        return record

    async def cancel_queued(self, run_id: str) -> None:
        """Cancel a run of the workers' queue (queued: never starts; running: its worker
        cancels it and saves the thread)."""
        from criogen_graph.background import cancel_run

        await cancel_run(self.storage, run_id)

    # -- who is asking ---------------------------------------------------------------

    async def identity(self, request: Request) -> str | None:
        if self.auth is None:
            return None
        try:
            who = self.auth(request.headers)
            if inspect.isawaitable(who):
                who = await who
        except PermissionError as exc:
            raise BadRequest(401, str(exc) or "not authenticated") from None
        except Exception:
            _log.exception("the auth callable failed")
            raise BadRequest(401, "not authenticated") from None
        if not isinstance(who, str) or not who:
            raise BadRequest(401, "not authenticated")
        return who

    # -- what is asked about -----------------------------------------------------------

    def agent(self, assistant_id: Any) -> Agent[Any]:
        agent = self.agents.get(assistant_id) if isinstance(assistant_id, str) else None
        if agent is None:
            raise BadRequest(
                404,
                f"assistant {assistant_id!r} not found; this server has "
                f"{', '.join(sorted(self.agents))}",
            )
        return agent

    async def owned(self, thread_id: str, who: str | None) -> dict[str, Any]:
        """The record of a thread `who` may see; 404 for any other (no existence leak)."""
        try:
            check_thread_id(thread_id)
        except ValidationError:
            raise BadRequest(404, f"thread {thread_id!r} not found") from None
        record = await self.records.thread(thread_id)
        if record is None or (who is not None and record.get("owner") != who):
            raise BadRequest(404, f"thread {thread_id!r} not found")
        return record

    def thread_agent(self, record: Mapping[str, Any]) -> Agent[Any]:
        name = record.get("assistant_id")
        if name is None:
            # Its first run may not have saved the thread's record yet (see `Run`).
            runs = self.runs.of_thread(str(record["thread_id"]))
            name = runs[-1].record["assistant_id"] if runs else None
        agent = self.agents.get(str(name))
        return agent if agent is not None else next(iter(self.agents.values()))

    async def graph(self, agent: Agent[Any]) -> Any:
        await self.storage.backend()
        store = await self.storage.get_store() if agent.spec.memory is not None else None
        return agent.thread_graph(self.storage, store)

    async def snapshot(self, record: Mapping[str, Any], checkpoint_id: str | None = None) -> Any:
        graph = await self.graph(self.thread_agent(record))
        conf: dict[str, Any] = {"thread_id": record["thread_id"]}
        if checkpoint_id is not None:
            conf.update(checkpoint_ns="", checkpoint_id=checkpoint_id)
        return await graph.aget_state({"configurable": conf})

    async def thread_json(self, record: Mapping[str, Any]) -> dict[str, Any]:
        snap = await self.snapshot(record)
        if await self.busy(record["thread_id"]):
            status = "busy"
        elif snap.interrupts:
            status = "interrupted"
        elif any(t.error for t in snap.tasks):
            status = "error"
        else:
            status = "idle"
        return {
            "thread_id": record["thread_id"],
            "created_at": record.get("created_at"),
            "updated_at": record.get("updated_at"),
            "metadata": record.get("metadata") or {},
            "status": status,
            "config": {},
            "values": with_message_ids(snap.values or {}),
            "interrupts": {t.id: interrupts_json(t.interrupts) for t in snap.tasks if t.interrupts},
        }


# -- reading requests ------------------------------------------------------------------


async def _body(request: Request) -> dict[str, Any]:
    """The request's JSON object (an empty body is `{}`), read up to `MAX_BODY_BYTES`."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise BadRequest(413, f"request body over {MAX_BODY_BYTES} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise BadRequest(413, f"request body over {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(422, f"request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadRequest(422, "request body must be a JSON object")
    return value


def _int(value: Any, name: str, default: int, *, low: int = 0, high: int = 10_000) -> int:
    if value is None:
        return default
    if isinstance(value, str) and value.lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRequest(422, f"{name} must be an integer from {low} to {high}")
    return value


def _str(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest(422, f"{name} must be a string")
    text: str = storable(value, name)
    return text


def _dict(body: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = body.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(422, f"{name} must be an object")
    stored: dict[str, Any] = storable(value, name)
    return stored


Handler = Callable[[_Server, Request, "str | None"], Awaitable[Response]]


#: Endpoints anyone may call (health checks come without credentials).
_PUBLIC = frozenset({"/ok", "/info", "/openapi.json"})


def _endpoint(
    server: _Server, handler: Handler, public: bool
) -> Callable[[Request], Awaitable[Response]]:
    """`handler` with the caller's identity, and every refusal as `{"detail": ...}`."""

    async def endpoint(request: Request) -> Response:
        try:
            who = None if public else await server.identity(request)
            return await handler(server, request, who)
        except BadRequest as exc:
            return _error(exc.status, exc.detail)
        except CriogenError as exc:
            return _error(error_status(exc), str(exc))

    return endpoint


# -- health and assistants -----------------------------------------------------------------


async def ok(server: _Server, request: Request, who: str | None) -> Response:
    return _json({"ok": True})


async def info(server: _Server, request: Request, who: str | None) -> Response:
    return _json(
        {
            "version": __version__,
            "server": "criogen-graph",
            "flags": {"assistants": True, "crons": False, "langsmith": False},
            "metadata": {},
        }
    )


async def openapi_json(server: _Server, request: Request, who: str | None) -> Response:
    return _json(openapi(sorted(server.agents)))


def _assistant(agent: Agent[Any]) -> dict[str, Any]:
    return {
        "assistant_id": agent.name,
        "graph_id": agent.name,
        "name": agent.name,
        "description": None,
        "config": {},
        "context": {},
        "metadata": {"created_by": "criogen-graph"},
        "version": 1,
        "created_at": None,
        "updated_at": None,
    }


async def search_assistants(server: _Server, request: Request, who: str | None) -> Response:
    body = await _body(request)
    graph_id = _str(body, "graph_id")
    name = _str(body, "name")
    limit = _int(body.get("limit"), "limit", 10, high=1000)
    offset = _int(body.get("offset"), "offset", 0)
    found = [
        _assistant(a)
        for a in server.agents.values()
        if (graph_id is None or a.name == graph_id) and (name is None or name in a.name)
    ]
    return _json(found[offset : offset + limit])


async def get_assistant(server: _Server, request: Request, who: str | None) -> Response:
    return _json(_assistant(server.agent(request.path_params["assistant_id"])))


async def assistant_graph(server: _Server, request: Request, who: str | None) -> Response:
    agent = server.agent(request.path_params["assistant_id"])
    return _json(agent.graph.get_graph().to_json())


def _schema(agent: Agent[Any], what: str, make: Callable[[], Any]) -> Any:
    """A JSON schema of the graph, or None when it cannot be made (LangGraph cannot
    convert every state type; `langgraph dev` answers None then too)."""
    try:
        return make()
    except Exception as exc:
        _log.warning("no %s schema for %s: %s", what, agent.name, exc)
        return None


async def assistant_schemas(server: _Server, request: Request, who: str | None) -> Response:
    agent = server.agent(request.path_params["assistant_id"])
    graph = agent.graph
    return _json(
        {
            "graph_id": agent.name,
            "input_schema": _schema(agent, "input", graph.get_input_jsonschema),
            "output_schema": _schema(agent, "output", graph.get_output_jsonschema),
            "state_schema": _schema(agent, "state", graph.get_input_jsonschema),
            "config_schema": None,
            "context_schema": None,
        }
    )


# -- threads -------------------------------------------------------------------------------


async def create_thread(server: _Server, request: Request, who: str | None) -> Response:
    body = await _body(request)
    thread_id = _str(body, "thread_id") or str(uuid.uuid4())
    try:
        check_thread_id(thread_id)
    except ValidationError as exc:
        raise BadRequest(422, str(exc)) from None
    if_exists = _str(body, "if_exists") or "raise"
    if if_exists not in ("raise", "do_nothing"):
        raise BadRequest(422, "if_exists must be 'raise' or 'do_nothing'")
    metadata = _dict(body, "metadata")
    existing = await server.records.thread(thread_id)
    if existing is not None:
        if who is not None and existing.get("owner") != who:
            # Someone else's id: refused like an existing one, without saying whose.
            raise BadRequest(409, f"thread {thread_id!r} already exists")
        if if_exists == "raise":
            raise BadRequest(409, f"thread {thread_id!r} already exists")
        return _json(await server.thread_json(existing))
    now = now_iso()
    graph_id = _str(body, "graph_id")
    record = {
        "thread_id": thread_id,
        "owner": who,
        "metadata": {**metadata, **({"graph_id": graph_id} if graph_id else {})},
        "assistant_id": graph_id if graph_id in server.agents else None,
        "created_at": now,
        "updated_at": now,
    }
    await server.records.put_thread(record)
    return _json(await server.thread_json(record))


def _matches(record: Mapping[str, Any], metadata: Mapping[str, Any]) -> bool:
    have = record.get("metadata") or {}
    return all(have.get(k) == v for k, v in metadata.items())


async def search_threads(server: _Server, request: Request, who: str | None) -> Response:
    body = await _body(request)
    metadata = _dict(body, "metadata")
    status = _str(body, "status")
    ids = body.get("ids")
    if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, str) for i in ids)):
        raise BadRequest(422, "ids must be a list of strings")
    limit = _int(body.get("limit"), "limit", 10, high=1000)
    offset = _int(body.get("offset"), "offset", 0)
    records = [
        r
        for r in await server.records.threads(who)
        if _matches(r, metadata) and (ids is None or r["thread_id"] in ids)
    ]
    out: list[dict[str, Any]] = []
    for record in records:
        thread = await server.thread_json(record)
        if status is None or thread["status"] == status:
            out.append(thread)
        if len(out) >= offset + limit:
            break
    return _json(out[offset : offset + limit])


async def get_thread(server: _Server, request: Request, who: str | None) -> Response:
    record = await server.owned(request.path_params["thread_id"], who)
    return _json(await server.thread_json(record))


async def patch_thread(server: _Server, request: Request, who: str | None) -> Response:
    record = await server.owned(request.path_params["thread_id"], who)
    body = await _body(request)
    metadata = {**(record.get("metadata") or {}), **_dict(body, "metadata")}
    await server.records.touch_thread(record["thread_id"], metadata=metadata)
    record = await server.owned(record["thread_id"], who)
    return _json(await server.thread_json(record))


async def delete_thread(server: _Server, request: Request, who: str | None) -> Response:
    record = await server.owned(request.path_params["thread_id"], who)
    thread_id = record["thread_id"]
    if await server.busy(thread_id):
        raise BadRequest(409, f"thread {thread_id!r} has a run in progress; cancel it first")
    await server.thread_agent(record).thread(thread_id, actor=who).delete()
    if server.runs.events is not None:
        # The runs' events hold the conversation too: they go with the thread.
        run_ids = [str(r["run_id"]) for r in await server.records.runs(thread_id)]
        await server.runs.events.forget(run_ids)
    await server.records.delete_thread(thread_id)
    return Response(status_code=204)


async def get_state(server: _Server, request: Request, who: str | None) -> Response:
    record = await server.owned(request.path_params["thread_id"], who)
    checkpoint_id = request.path_params.get("checkpoint_id")
    snap = await server.snapshot(record, checkpoint_id)
    if checkpoint_id is not None and snap.config is None:
        raise BadRequest(404, f"thread has no checkpoint {checkpoint_id!r}")
    return _json(state_json(snap, record["thread_id"]))


async def update_state(server: _Server, request: Request, who: str | None) -> Response:
    """Only what maps onto the Thread API: going back to a checkpoint (`rewind`)."""
    record = await server.owned(request.path_params["thread_id"], who)
    body = await _body(request)
    checkpoint = _dict(body, "checkpoint")
    checkpoint_id = _str(body, "checkpoint_id") or checkpoint.get("checkpoint_id")
    if body.get("values") is not None or body.get("as_node") is not None or not checkpoint_id:
        raise BadRequest(
            422,
            "update_state here only rewinds: send checkpoint_id (and no values); writing "
            "values into the state would bypass the agent's run (its hooks, audit and "
            "approvals)",
        )
    if await server.busy(record["thread_id"]):
        raise BadRequest(409, "the thread has a run in progress; cancel it first")
    thread = server.thread_agent(record).thread(record["thread_id"], actor=who)
    entry = await thread.rewind(str(checkpoint_id))
    return _json(
        {
            "checkpoint": {
                "thread_id": record["thread_id"],
                "checkpoint_ns": "",
                "checkpoint_id": entry["id"],
                "checkpoint_map": None,
            }
        }
    )


async def history(server: _Server, request: Request, who: str | None) -> Response:
    record = await server.owned(request.path_params["thread_id"], who)
    if request.method == "POST":
        body = await _body(request)
    else:
        body = dict(request.query_params)
    limit = _int(body.get("limit"), "limit", 10, low=1, high=1000)
    before = body.get("before")
    if isinstance(before, str):
        before = {"configurable": {"checkpoint_id": before}}
    elif isinstance(before, dict):
        before = {"configurable": {"checkpoint_id": before.get("checkpoint_id")}}
    elif before is not None:
        raise BadRequest(422, "before must be a checkpoint id or a checkpoint object")
    graph = await server.graph(server.thread_agent(record))
    cfg = {"configurable": {"thread_id": record["thread_id"]}}
    states = [
        state_json(s, record["thread_id"])
        async for s in graph.aget_state_history(cfg, limit=limit, before=before)
    ]
    return _json(states)


# -- runs ----------------------------------------------------------------------------------


async def _thread_for_run(
    server: _Server, thread_id: str, body: Mapping[str, Any], who: str | None
) -> dict[str, Any]:
    if body.get("if_not_exists") not in (None, "reject", "create"):
        raise BadRequest(422, "if_not_exists must be 'reject' or 'create'")
    try:
        return await server.owned(thread_id, who)
    except BadRequest:
        if body.get("if_not_exists") != "create":
            raise
    check_thread_id(thread_id)
    if await server.records.thread(thread_id) is not None:
        raise BadRequest(404, f"thread {thread_id!r} not found")
    now = now_iso()
    record: dict[str, Any] = {
        "thread_id": thread_id,
        "owner": who,
        "metadata": {},
        "assistant_id": None,
        "created_at": now,
        "updated_at": now,
    }
    await server.records.put_thread(record)
    return record


@dataclasses.dataclass(frozen=True, slots=True)
class _Action:
    """The Thread call a run asks for: `name` (send, approve, reject, decide, retry) and
    its arguments, as a call made here or a job queued for the workers."""

    name: str
    fields: dict[str, Any]

    def call(self, thread: Thread[Any]) -> Callable[[], Stream[Any]]:
        f = self.fields
        if self.name == "send":
            return lambda: thread.stream(f["input"], state=f["state"])
        if self.name == "approve":
            return lambda: thread.stream_approve(expected=f["expected"])
        if self.name == "reject":
            return lambda: thread.stream_reject(f["message"], expected=f["expected"])
        if self.name == "decide":
            return lambda: thread.stream_decide(f["decisions"], expected=f["expected"])
        return thread.stream_retry


def _resume_call(resume: Any, expected: Any, interrupt_ids: set[str]) -> _Action:
    """The Thread call a `command.resume` value asks for (the JSON shapes Studio sends)."""
    if isinstance(resume, Mapping) and len(resume) == 1 and next(iter(resume)) in interrupt_ids:
        resume = next(iter(resume.values()))  # keyed by the interrupt's id
    kind = resume.get("type") if isinstance(resume, Mapping) else resume
    if kind == "approve" and (not isinstance(resume, Mapping) or set(resume) == {"type"}):
        return _Action("approve", {"expected": expected})
    if kind == "reject":
        message = resume.get("message") if isinstance(resume, Mapping) else None
        if message is not None and not isinstance(message, str):
            raise BadRequest(422, "the reject message must be a string")
        return _Action("reject", {"message": message or "rejected", "expected": expected})
    if isinstance(resume, Mapping) and resume and "type" not in resume:
        decisions = dict(resume)
        return _Action("decide", {"decisions": decisions, "expected": expected})
    raise BadRequest(
        422,
        "command.resume must be 'approve', {'type': 'reject', 'message': ...}, or "
        "{call_id: decision} with one decision per pending call ('approve', "
        "{'type': 'edit', 'args': {...}}, {'type': 'respond', 'message': ...})",
    )


async def _run_call(
    server: _Server,
    record: Mapping[str, Any],
    thread: Thread[Any],
    body: Mapping[str, Any],
    busy: bool,
    *,
    ask_pending: bool = True,
) -> _Action:
    """The Thread call a run body asks for: a new message, an answer, or a retry.
    `ask_pending=False`: a message to a thread waiting for approval is refused by the
    thread itself when the run starts (it checks under its lock anyway), not here."""
    command = body.get("command")
    has_input = body.get("input") is not None
    if has_input and command is not None:
        raise BadRequest(422, "send either input or command, not both")
    if command is not None:
        if not isinstance(command, dict) or set(command) - {"resume"} or "resume" not in command:
            raise BadRequest(
                422, "command takes only 'resume' here (goto and update are not supported)"
            )
        checkpoint_id = _str(body, "checkpoint_id") or _dict(body, "checkpoint").get(
            "checkpoint_id"
        )
        pending = await thread.pending_approvals()
        if not busy and not pending:
            raise BadRequest(409, f"thread {thread.id!r} is not waiting for approval")
        if checkpoint_id is not None and not busy and pending.checkpoint_id != checkpoint_id:
            raise BadRequest(
                409,
                f"stale answer: thread {thread.id!r} no longer waits at checkpoint "
                f"{checkpoint_id!r}; read its state and answer what is pending now",
            )
        if busy and not pending and checkpoint_id is None and server.workers:
            # A queued answer is pinned when it is queued (it may run on any machine):
            # with nothing pending yet there is nothing to pin it to.
            raise BadRequest(
                409,
                f"thread {thread.id!r} is running a run and waits for no approval yet: "
                "answer once it does (or send the checkpoint_id of the approval)",
            )
        expected: Any = checkpoint_id or (pending if pending else None)
        snap = await server.snapshot(record)
        interrupt_ids = {str(i.id) for i in snap.interrupts or ()}
        return _resume_call(command["resume"], expected, interrupt_ids)
    if has_input:
        text, state = read_input(body["input"])
        if not busy and ask_pending and await thread.pending_approvals():
            raise BadRequest(409, _waits_for_approval(thread.id))
        return _Action("send", {"input": text, "state": state})
    return _Action("retry", {})


def _waits_for_approval(thread_id: str) -> str:
    return (
        f"thread {thread_id!r} waits for approval: answer it with command={{'resume': ...}} first"
    )


async def _start_run(
    server: _Server, request: Request, who: str | None, *, followed: bool = True
) -> tuple[Run | None, dict[str, Any], dict[str, Any]]:
    """Start the run a request asks for: (the run, if it runs in this process; its
    record; options). `followed`: its events may be read (a `wait` only needs the end
    state)."""
    body = await _body(request)
    thread_id = request.path_params["thread_id"]
    record = await _thread_for_run(server, thread_id, body, who)
    agent = server.agent(body.get("assistant_id"))
    for name in _UNSUPPORTED_RUN_FIELDS:
        if body.get(name):
            raise BadRequest(422, f"{name} is not supported by criogen-graph serve")
    strategy = body.get("multitask_strategy") or "enqueue"
    if strategy in ("interrupt", "rollback"):
        raise BadRequest(
            422,
            f"multitask_strategy {strategy!r} is not supported: a thread has one writer at a "
            "time and a started run is never undone; use 'reject' or 'enqueue', or cancel "
            "the running run first",
        )
    if strategy not in ("reject", "enqueue"):
        raise BadRequest(422, "multitask_strategy must be 'reject' or 'enqueue'")
    on_disconnect = body.get("on_disconnect") or "continue"
    if on_disconnect not in ("cancel", "continue"):
        raise BadRequest(422, "on_disconnect must be 'cancel' or 'continue'")
    modes = stream_modes(body.get("stream_mode"))
    busy = await server.busy(thread_id)
    if busy and strategy == "reject":
        raise BadRequest(
            409, f"thread {thread_id!r} is already running a run (multitask_strategy='reject')"
        )
    thread = agent.thread(thread_id, actor=who)
    # A `wait` run in this process answers from its own end: a refusal of the thread
    # (it waits for approval) comes back as the same 409, without a state read first.
    here_waited = not followed and not server.workers
    action = await _run_call(server, record, thread, body, busy, ask_pending=not here_waited)
    now = now_iso()
    run_record = {
        "run_id": str(uuid.uuid4()),
        "thread_id": thread_id,
        "assistant_id": agent.name,
        "created_at": now,
        "updated_at": now,
        "status": "pending",
        "metadata": _dict(body, "metadata"),
        "multitask_strategy": strategy,
        "kwargs": {"stream_mode": sorted(modes)},
    }
    changed = None
    if record.get("assistant_id") != agent.name:
        # The thread's record as this request read it (its owner never changes).
        record = changed = {**record, "assistant_id": agent.name, "updated_at": now}
    saved = None
    # A `wait`'s client learns the run's id from the answer only: its record need not
    # be saved before the run starts. On PostgreSQL it is saved while the run runs (and
    # before its end is), for the other server processes; on a storage of one process
    # this process answers for it from memory, and saves it once, when it ends (on
    # SQLite writers take turns on the file: the run's own writes would wait for it).
    unsaved = here_waited and server.storage.scheme != "postgres"
    if here_waited and not unsaved:
        saved = asyncio.ensure_future(server.records.start_run(run_record, changed))
    elif not unsaved:
        await server.records.start_run(run_record, changed)
    options = {"on_disconnect": on_disconnect}
    if server.workers:
        await _queue_run(server, thread, action, run_record)
        return None, run_record, options
    # The values a `values` stream starts from (not needed by a `wait`).
    before = dict((await server.snapshot(record)).values or {}) if followed else {}

    async def read_state() -> tuple[dict[str, Any], list[Any]]:
        snap = await server.snapshot(record)
        return dict(snap.values or {}), list(snap.interrupts or ())

    run = server.runs.start(
        run_record,
        modes,
        action.call(thread),
        before,
        read_state,
        saved=saved,
        unsaved=unsaved,
        thread_change=changed if unsaved else None,
        refusable=here_waited and action.name == "send" and not busy,
        # Its client waits for its end: its events reach the other server processes
        # then, all at once (the run does not share the database with their writes).
        publish_at_end=here_waited,
    )
    return run, run.record, options


async def _queue_run(
    server: _Server, thread: Thread[Any], action: _Action, run_record: dict[str, Any]
) -> None:
    """Queue the run for the background workers under the run's id (its record is
    saved first, so any server process can answer for it at once)."""
    from criogen_graph.background import submit_as

    fields = dict(action.fields)
    try:
        await submit_as(
            thread,
            action.name,
            run_id=str(run_record["run_id"]),
            extra={"serve": {"v": 1}},
            **fields,
        )
    except BaseException:
        failed = {**run_record, "status": "error", "updated_at": now_iso()}
        with contextlib.suppress(Exception):
            await asyncio.shield(server.records.put_run(failed))
        raise


def _run_headers(record: Mapping[str, Any], tail: str) -> dict[str, str]:
    base = f"/threads/{quote(str(record['thread_id']), safe='')}/runs/{record['run_id']}"
    return {"Location": f"{base}/{tail}", "Content-Location": base}


async def create_run(server: _Server, request: Request, who: str | None) -> Response:
    _, record, _ = await _start_run(server, request, who)
    return _json(record, headers=_run_headers(record, "join"))


def _sse_response(events: AsyncIterator[bytes], headers: dict[str, str]) -> Response:
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers={**headers, "Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def _watched(
    server: _Server,
    run: Run | None,
    record: Mapping[str, Any],
    events: AsyncIterator[bytes],
    cancel_on_drop: bool,
) -> Any:
    """`events`, cancelling the run if the client goes away before it ends and asked
    for that (`on_disconnect="cancel"`)."""
    finished = False
    try:
        async for chunk in events:
            yield chunk
        finished = True
    finally:
        if not finished and cancel_on_drop:
            if run is not None:
                run.cancel()
            elif server.workers:
                task = asyncio.ensure_future(server.cancel_queued(str(record["run_id"])))
                server.cancelling.add(task)
                task.add_done_callback(server.cancelling.discard)


async def stream_run(server: _Server, request: Request, who: str | None) -> Response:
    run, record, options = await _start_run(server, request, who)
    cancel = options["on_disconnect"] == "cancel"
    if run is not None:
        events = run.follow(run.modes, heartbeat=server.heartbeat)
    else:
        assert server.runs.events is not None
        modes = frozenset((record.get("kwargs") or {}).get("stream_mode") or ["values"])
        events = _remote_events(server, server.runs.events, record, modes, 0)
    return _sse_response(
        _watched(server, run, record, events, cancel), _run_headers(record, "stream")
    )


async def _outcome(server: _Server, run: Run) -> Response:
    """What `wait` and `join` answer once the run ended."""
    await asyncio.shield(run.done.wait())
    error = run.error
    if isinstance(error, asyncio.CancelledError):
        raise BadRequest(409, f"run {run.id} was cancelled")
    if isinstance(error, ThreadSuspendedError) and run.refusable:
        raise BadRequest(409, _waits_for_approval(run.thread_id))
    if isinstance(error, ValidationError | ThreadBusyError | ThreadSuspendedError):
        raise BadRequest(error_status(error), str(error))
    if error is not None:
        message = str(error) if isinstance(error, CriogenError) else "see the server's log"
        return _json({"__error__": {"error": type(error).__name__, "message": message}})
    return _json(run.values or {})


async def wait_run(server: _Server, request: Request, who: str | None) -> Response:
    run, record, _ = await _start_run(server, request, who, followed=False)
    if run is not None:
        response = await _outcome(server, run)
    else:
        response = await _remote_outcome(server, record)
    response.headers.update(_run_headers(record, "join"))
    return response


async def _run_of(
    server: _Server, request: Request, who: str | None, *, settle: bool = True
) -> tuple[Run | None, Any]:
    """The run of the request's path (None if another process runs it) and its record
    (with `settle=False`, as saved: not brought up to date with the workers' queue)."""
    thread_id, run_id = request.path_params["thread_id"], request.path_params["run_id"]
    run = server.runs.get(run_id)
    if run is not None and run.thread_id == thread_id:
        await server.owned(thread_id, who)
        return run, run.record
    if not storable_str(run_id):
        # No storage can hold it (PostgreSQL refuses a NUL in a query): no such run.
        await server.owned(thread_id, who)
        raise BadRequest(404, f"run {run_id!r} not found")
    # Both at once: the store reads them in one query (with other requests' reads).
    owned, saved = await asyncio.gather(
        server.owned(thread_id, who),
        server.records.run(thread_id, run_id),
        return_exceptions=True,
    )
    if isinstance(owned, BaseException):
        raise owned
    if isinstance(saved, BaseException):
        raise saved
    if saved is None:
        raise BadRequest(404, f"run {run_id!r} not found")
    return None, await server.settled(saved) if settle else saved


async def get_run(server: _Server, request: Request, who: str | None) -> Response:
    _, record = await _run_of(server, request, who)
    return _json(record)


async def list_runs(server: _Server, request: Request, who: str | None) -> Response:
    record = await server.owned(request.path_params["thread_id"], who)
    limit = _int(request.query_params.get("limit"), "limit", 10, high=1000)
    offset = _int(request.query_params.get("offset"), "offset", 0)
    status = request.query_params.get("status")
    # The runs this process keeps are told as they are now (a saved record may not
    # have their last status yet, or not be saved yet: see `Run`).
    here = {r.id: r.record for r in server.runs.of_thread(record["thread_id"])}
    stored = await server.records.runs(record["thread_id"])
    records = [
        here.pop(str(r["run_id"])) if str(r["run_id"]) in here else await server.settled(r)
        for r in stored
    ]
    records.extend(here.values())
    records.sort(key=lambda r: str(r.get("created_at")), reverse=True)
    runs = [r for r in records if status is None or r.get("status") == status]
    return _json(runs[offset : offset + limit])


async def _ended_remotely(server: _Server, thread_id: str, run_id: str) -> dict[str, Any]:
    """The record of a run another server process runs, once it has ended."""
    while True:
        record = await _record_now(server, thread_id, run_id)
        if is_terminal(record.get("status")):
            return record
        await asyncio.sleep(_POLL_SECS)


async def _record_now(server: _Server, thread_id: str, run_id: str) -> dict[str, Any]:
    """A run's record as saved now, settled with the workers' queue."""
    record = await server.records.run(thread_id, run_id)
    if record is None:
        return {"status": "error"}
    return await server.settled(record)


async def cancel_run(server: _Server, request: Request, who: str | None) -> Response:
    run, record = await _run_of(server, request, who)
    action = request.query_params.get("action", "interrupt")
    if action != "interrupt":
        raise BadRequest(422, "cancel action 'rollback' is not supported: what a run saved is kept")
    wait = request.query_params.get("wait") in ("1", "true")
    if run is None and server.runs.events is not None and not is_terminal(record.get("status")):
        # Run by another server process on the storage: it is told through PostgreSQL.
        await server.runs.events.cancel(record["run_id"])
        if server.workers:
            await server.cancel_queued(str(record["run_id"]))
        if wait:
            await _ended_remotely(server, record["thread_id"], record["run_id"])
        return Response(status_code=202)
    if run is None or run.done.is_set():
        if is_terminal(record.get("status")):
            raise BadRequest(409, f"run {record['run_id']} has ended ({record.get('status')})")
        raise BadRequest(409, f"run {record['run_id']} is not running in this server")
    run.cancel()
    if wait:
        await asyncio.shield(run.done.wait())
    return Response(status_code=202)


#: How often `join` reads the record of a run that another server process runs.
_POLL_SECS = 0.2


async def join_run(server: _Server, request: Request, who: str | None) -> Response:
    run, record = await _run_of(server, request, who)
    if run is not None:
        return await _outcome(server, run)
    await server.owned(request.path_params["thread_id"], who)
    return await _remote_outcome(server, record)


async def _remote_outcome(server: _Server, record: Mapping[str, Any]) -> Response:
    """What `wait` and `join` answer for a run another process executes, once it ended:
    the thread's state then, or the error it ended with (as for a run of this process)."""
    thread_id = str(record["thread_id"])
    if not is_terminal(record.get("status")):
        record = await _ended_remotely(server, thread_id, str(record["run_id"]))
    if record.get("status") == "error" and server.runs.events is not None:
        error = await server.runs.events.last_error(str(record["run_id"]))
        if error is not None:
            return _json({"__error__": error})
    thread = await server.owned(thread_id, None)
    snap = await server.snapshot(thread)
    values = with_message_ids(snap.values or {})
    if snap.interrupts:
        values["__interrupt__"] = interrupts_json(snap.interrupts)
    return _json(values)


async def _no_events() -> AsyncIterator[bytes]:
    empty: tuple[bytes, ...] = ()
    for chunk in empty:
        yield chunk


async def _remote_events(
    server: _Server,
    events: PgEvents,
    record: Mapping[str, Any],
    modes: frozenset[str],
    after: int,
) -> AsyncIterator[bytes]:
    """The events of a run another server process runs, read from PostgreSQL."""
    thread_id, run_id = str(record["thread_id"]), str(record["run_id"])

    async def ended() -> bool:
        return is_terminal((await _record_now(server, thread_id, run_id)).get("status"))

    wanted = modes | {"metadata", "error"}
    async for row in events.follow(run_id, after, ended, idle=server.heartbeat):
        if row is None:
            # A tool may run for minutes without an event: proxies and clients drop
            # a silent connection.
            yield b": heartbeat\n\n"
            continue
        seq, mode, event, data = row
        if mode in wanted:
            yield sse(event, data, str(seq))


async def join_stream(server: _Server, request: Request, who: str | None) -> Response:
    # A run of another process is followed until its record, settled, says it ended
    # (see `_remote_events`): settling it here too would cost each stream a query.
    run, record = await _run_of(server, request, who, settle=False)
    last = request.headers.get("last-event-id") or "0"
    if not last.isdigit():
        raise BadRequest(422, "Last-Event-ID must be an event id this server sent")
    asked = [m for m in request.query_params.getlist("stream_mode") if m]
    if run is None:
        events = server.runs.events
        if events is None:
            return StreamingResponse(_no_events(), media_type="text/event-stream")
        kept = (record.get("kwargs") or {}).get("stream_mode") or ["values"]
        wanted = stream_modes(asked) if asked else frozenset(kept)
        remote = _remote_events(server, events, record, wanted, int(last))
        base = f"/threads/{quote(record['thread_id'], safe='')}/runs/{record['run_id']}"
        return StreamingResponse(
            remote,
            media_type="text/event-stream",
            headers={"Location": f"{base}/stream", "Content-Location": base},
        )
    modes = stream_modes(asked) if asked else run.modes
    cancel = request.query_params.get("cancel_on_disconnect") in ("1", "true", "True")
    events = _watched(
        server, run, run.record, run.follow(modes, int(last), server.heartbeat), cancel
    )
    return _sse_response(events, _run_headers(run.record, "stream"))


# -- the application -------------------------------------------------------------------------

_ROUTES: Sequence[tuple[str, Handler, list[str]]] = (
    ("/ok", ok, ["GET"]),
    ("/info", info, ["GET"]),
    ("/openapi.json", openapi_json, ["GET"]),
    ("/assistants/search", search_assistants, ["POST"]),
    ("/assistants/{assistant_id}", get_assistant, ["GET"]),
    ("/assistants/{assistant_id}/graph", assistant_graph, ["GET"]),
    ("/assistants/{assistant_id}/schemas", assistant_schemas, ["GET"]),
    ("/threads", create_thread, ["POST"]),
    ("/threads/search", search_threads, ["POST"]),
    ("/threads/{thread_id}", get_thread, ["GET"]),
    ("/threads/{thread_id}", patch_thread, ["PATCH"]),
    ("/threads/{thread_id}", delete_thread, ["DELETE"]),
    ("/threads/{thread_id}/state", get_state, ["GET"]),
    ("/threads/{thread_id}/state", update_state, ["POST"]),
    ("/threads/{thread_id}/state/{checkpoint_id}", get_state, ["GET"]),
    ("/threads/{thread_id}/history", history, ["GET", "POST"]),
    ("/threads/{thread_id}/runs", create_run, ["POST"]),
    ("/threads/{thread_id}/runs", list_runs, ["GET"]),
    ("/threads/{thread_id}/runs/stream", stream_run, ["POST"]),
    ("/threads/{thread_id}/runs/wait", wait_run, ["POST"]),
    ("/threads/{thread_id}/runs/{run_id}", get_run, ["GET"]),
    ("/threads/{thread_id}/runs/{run_id}/cancel", cancel_run, ["POST"]),
    ("/threads/{thread_id}/runs/{run_id}/join", join_run, ["GET"]),
    ("/threads/{thread_id}/runs/{run_id}/stream", join_stream, ["GET"]),
)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return _error(404, f"no endpoint {request.method} {request.url.path}")
    if exc.status_code == 405:
        return _error(405, f"{request.method} is not allowed on {request.url.path}")
    return _error(exc.status_code, str(exc.detail))


async def _unexpected(request: Request, exc: Exception) -> Response:
    _log.error("unexpected error serving %s %s", request.method, request.url.path, exc_info=exc)
    return _error(500, "internal error; see the server's log")


def build_app(
    agents: Sequence[Agent[Any]],
    storage: Storage,
    *,
    auth: Auth | None,
    cors: Sequence[str],
    owns_storage: bool,
    workers: bool = False,
    heartbeat: float = HEARTBEAT_SECS,
    start_timeout: float = START_TIMEOUT_SECS,
) -> Starlette:
    """The Starlette application serving `agents` on `storage` (see `create_app`)."""
    server = _Server({a.name: a for a in agents}, storage, auth, workers, heartbeat, start_timeout)
    routes = [
        Route(path, _endpoint(server, handler, path in _PUBLIC), methods=methods)
        for path, handler, methods in _ROUTES
    ]

    def cancel_here(run_id: str) -> None:
        run = server.runs.get(run_id)
        if run is not None:
            run.cancel()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await storage.backend()
        events = None
        if storage.scheme == "postgres":
            events = PgEvents(storage, cancel_here)
            await events.open()
            server.runs.events = events
        try:
            yield
        finally:
            await server.runs.shutdown()
            if server.cancelling:
                await asyncio.wait(list(server.cancelling))
            if workers:
                from criogen_graph.background import close_runs

                with contextlib.suppress(Exception):
                    await close_runs(storage)
            if events is not None:
                await events.close()
            if owns_storage:
                await storage.close()

    middleware = []
    if cors:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(cors),
                allow_methods=["*"],
                allow_headers=["*"],
                expose_headers=["Content-Location", "Location"],
            )
        )
    app = Starlette(
        routes=routes,
        middleware=middleware,
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_error, Exception: _unexpected},
    )
    app.state.criogen = server
    return app
