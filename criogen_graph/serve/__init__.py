"""Serving agents over HTTP the way LangGraph's clients expect (extra `server`).

`create_app(agents, storage=...)` returns an ASGI application (Starlette) that speaks the
subset of the LangGraph Platform HTTP API that `langgraph_sdk`, `@langchain/langgraph-sdk`
and its React `useStream` hook use: assistants (one per agent, id = the agent's name),
threads, their state and history, and runs (background, `wait`, `stream` over SSE with
the `values`, `updates`, `messages-tuple`, `messages` and `custom` modes, `join`,
`join_stream` with `Last-Event-ID`, `cancel`). Every run is a `Thread` call, so the
thread's lock, pinned answers, audit, redaction and encryption hold for requests as for
`thread.send`. `criogen-graph serve` runs it with uvicorn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from criogen_graph.errors import ValidationError

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from criogen_graph.agent import Agent
    from criogen_graph.serve._app import Auth
    from criogen_graph.storage import Storage

__all__ = ["create_app"]


def create_app(
    agents: Agent[Any] | Sequence[Agent[Any]],
    *,
    storage: Storage | str | None = None,
    auth: Auth | None = None,
    cors: str | Sequence[str] | None = None,
    workers: str = "inline",
    heartbeat: float = 15.0,
    start_timeout: float = 30.0,
) -> Starlette:
    """An ASGI application serving `agents` (mount it in your Starlette or FastAPI app,
    or run it with uvicorn).

    `storage` (a `Storage` or URL) keeps every agent's threads; without it the agents'
    own storage, which must then be one. A URL given here is opened and closed with the
    application; a `Storage` stays the caller's to close. Runs execute in this process,
    one at a time per thread. On PostgreSQL every event of a run is also saved (sealed
    with the storage's key) and announced with NOTIFY, so any number of applications on
    the database serve each other's runs (`join`, `join_stream`, `cancel`).

    `auth`: a callable (sync or async) taking the request headers and returning the
    caller's identity (a non-empty str); returning None or raising refuses the request
    (401). Each thread belongs to the identity that created it: any other identity gets
    404 on it, in every endpoint; the identity is the audit actor of the runs it starts.
    Without `auth` every caller may use every thread (bind to loopback).

    `cors`: origins allowed to call from a browser (e.g. "http://localhost:5173").

    `workers`: "inline" (the default) runs each run in this process; "external" (on
    PostgreSQL only) queues it for the background workers (`criogen-graph worker` with
    the same agents and storage), which save its events for every server process: N
    servers and M workers on one database, a run continued by another worker when its
    worker dies, and no run left pending when the server that took it dies.

    `heartbeat`: seconds between the heartbeat comments (`: heartbeat`) of a quiet SSE
    stream (a tool running for minutes), so proxies and clients keep the connection.

    `start_timeout` (with `workers="external"`): seconds a run may wait for a worker to
    start it. A run still queued after that, with no worker alive on the storage in that
    time, ends in error (its stream ends with an `error` event saying so, its status is
    `error`) instead of hanging; so does a run whose server stopped before queueing it.

    Raises `ValidationError` for no agents, two agents with one name, agents on
    different storages without `storage=`, or `workers="external"` on a storage that
    is not PostgreSQL, or a `heartbeat` or `start_timeout` that is not a positive
    number; `TypeError` for a non-Agent.
    """
    from criogen_graph.agent import Agent
    from criogen_graph.serve._app import build_app
    from criogen_graph.storage import Storage

    listed = [agents] if isinstance(agents, Agent) else list(agents)
    if not listed:
        raise ValidationError("create_app needs at least one agent", code="invalid_value")
    for agent in listed:
        if not isinstance(agent, Agent):
            raise TypeError(f"create_app serves Agents, got {type(agent).__name__}")
    names = [a.name for a in listed]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValidationError(
            f"two agents are named {twice[0]!r}: give each a name (Agent(..., name=...))",
            code="invalid_value",
        )
    owns = isinstance(storage, str)
    if storage is None:
        kept = {id(a.storage): a.storage for a in listed}
        if len(kept) > 1:
            raise ValidationError(
                "the agents keep their threads in different storages: pass storage=",
                code="invalid_value",
            )
        store = listed[0].storage
    else:
        store = Storage(storage) if isinstance(storage, str) else storage
    if workers not in ("inline", "external"):
        raise ValidationError(
            f"workers must be 'inline' or 'external', got {workers!r}", code="invalid_value"
        )
    if workers == "external" and store.scheme != "postgres":
        raise ValidationError(
            f"workers='external' needs a PostgreSQL storage (the workers' queue is there), "
            f"not {store.scheme}://; on memory and SQLite runs execute in the server "
            "(workers='inline')",
            code="invalid_value",
        )
    for name, value in (("heartbeat", heartbeat), ("start_timeout", start_timeout)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ValidationError(
                f"{name} must be a positive number of seconds, got {value!r}",
                code="invalid_value",
            )
    served = [a.with_storage(store) for a in listed]
    if isinstance(cors, str):
        cors = [cors]
    return build_app(
        served,
        store,
        auth=auth,
        cors=list(cors or ()),
        owns_storage=owns,
        workers=workers == "external",
        heartbeat=float(heartbeat),
        start_timeout=float(start_timeout),
    )
