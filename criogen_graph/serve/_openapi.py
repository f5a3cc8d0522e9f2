"""The server's own OpenAPI document (`GET /openapi.json`): every endpoint it serves,
with the request bodies and parameters it reads, so clients can be generated from it
and fuzzers (tests/test_serve_fuzz.py, schemathesis) can aim at it."""

from __future__ import annotations

from typing import Any

from criogen_graph._version import __version__

__all__ = ["openapi"]

_OBJ: dict[str, Any] = {"type": "object"}
_STR: dict[str, Any] = {"type": "string"}
_INT: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": 10000}
_ERROR = {
    "type": "object",
    "required": ["detail"],
    "properties": {"detail": _STR},
}
_STREAM_MODE = {
    "enum": ["values", "updates", "messages", "messages-tuple", "custom", "events", "debug"]
}

_RUN_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["assistant_id"],
    "properties": {
        "assistant_id": _STR,
        "input": {
            "type": ["object", "null"],
            "properties": {
                "messages": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"role": _STR, "type": _STR, "content": {}},
                    },
                },
                "state": _OBJ,
            },
        },
        "command": {"type": ["object", "null"], "properties": {"resume": {}}},
        "stream_mode": {"oneOf": [_STREAM_MODE, {"type": "array", "items": _STREAM_MODE}]},
        "metadata": _OBJ,
        "multitask_strategy": {"enum": ["reject", "enqueue", "interrupt", "rollback"]},
        "on_disconnect": {"enum": ["cancel", "continue"]},
        "if_not_exists": {"enum": ["reject", "create"]},
        "checkpoint_id": _STR,
    },
}

_THREAD_ID = {"name": "thread_id", "in": "path", "required": True, "schema": _STR}
_RUN_ID = {"name": "run_id", "in": "path", "required": True, "schema": _STR}
_ASSISTANT_ID = {"name": "assistant_id", "in": "path", "required": True, "schema": _STR}


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": False, "content": {"application/json": {"schema": schema}}}


def _op(
    summary: str,
    op_id: str,
    *,
    params: list[dict[str, Any]] | None = None,
    body: dict[str, Any] | None = None,
    ok: str = "200",
    stream: bool = False,
) -> dict[str, Any]:
    media = "text/event-stream" if stream else "application/json"
    error = {"description": "refused", "content": {"application/json": {"schema": _ERROR}}}
    op: dict[str, Any] = {
        "summary": summary,
        "operationId": op_id,
        "parameters": params or [],
        "responses": {
            ok: {"description": "done", "content": {media: {"schema": {}}}},
            **{code: error for code in ("401", "404", "409", "413", "422")},
        },
    }
    if body is not None:
        op["requestBody"] = _body(body)
    return op


def _query(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema}


def _paths() -> dict[str, Any]:
    search = {
        "type": "object",
        "properties": {"metadata": _OBJ, "limit": _INT, "offset": _INT, "graph_id": _STR},
    }
    thread_search = {
        "type": "object",
        "properties": {
            "metadata": _OBJ,
            "status": _STR,
            "ids": {"type": "array", "items": _STR},
            "limit": _INT,
            "offset": _INT,
        },
    }
    new_thread = {
        "type": "object",
        "properties": {
            "thread_id": _STR,
            "metadata": _OBJ,
            "if_exists": {"enum": ["raise", "do_nothing"]},
            "graph_id": _STR,
        },
    }
    update = {
        "type": "object",
        "properties": {"checkpoint_id": _STR, "values": {}, "as_node": _STR},
    }
    history = {"type": "object", "properties": {"limit": _INT, "before": {}}}
    t, r = [_THREAD_ID], [_THREAD_ID, _RUN_ID]
    return {
        "/ok": {"get": _op("Health check", "health_check")},
        "/info": {"get": _op("Server version and flags", "server_version_and_flags")},
        "/openapi.json": {"get": _op("This document", "this_document")},
        "/assistants/search": {"post": _op("Search assistants", "search_assistants", body=search)},
        "/assistants/{assistant_id}": {
            "get": _op("Get an assistant", "get_an_assistant", params=[_ASSISTANT_ID])
        },
        "/assistants/{assistant_id}/graph": {
            "get": _op("The assistant's graph", "the_assistant_s_graph", params=[_ASSISTANT_ID])
        },
        "/assistants/{assistant_id}/schemas": {
            "get": _op("The assistant's schemas", "the_assistant_s_schemas", params=[_ASSISTANT_ID])
        },
        "/threads": {"post": _op("Create a thread", "create_a_thread", body=new_thread)},
        "/threads/search": {"post": _op("Search threads", "search_threads", body=thread_search)},
        "/threads/{thread_id}": {
            "get": _op("Get a thread", "get_a_thread", params=t),
            "patch": _op(
                "Update a thread's metadata",
                "update_a_thread_s_metadata",
                params=t,
                body={"type": "object"},
            ),
            "delete": _op("Delete a thread", "delete_a_thread", params=t, ok="204"),
        },
        "/threads/{thread_id}/state": {
            "get": _op("The thread's state", "the_thread_s_state", params=t),
            "post": _op(
                "Rewind the thread to a checkpoint",
                "rewind_the_thread_to_a_checkpoint",
                params=t,
                body=update,
            ),
        },
        "/threads/{thread_id}/state/{checkpoint_id}": {
            "get": _op(
                "The thread's state at a checkpoint",
                "the_thread_s_state_at_a_checkpoint",
                params=[
                    _THREAD_ID,
                    {"name": "checkpoint_id", "in": "path", "required": True, "schema": _STR},
                ],
            )
        },
        "/threads/{thread_id}/history": {
            "get": _op(
                "The thread's checkpoints",
                "the_thread_s_checkpoints",
                params=[*t, _query("limit", _INT)],
            ),
            "post": _op(
                "Search the thread's checkpoints",
                "search_the_thread_s_checkpoints",
                params=t,
                body=history,
            ),
        },
        "/threads/{thread_id}/runs": {
            "get": _op(
                "The thread's runs",
                "the_thread_s_runs",
                params=[*t, _query("limit", _INT), _query("offset", _INT), _query("status", _STR)],
            ),
            "post": _op(
                "Start a background run", "start_a_background_run", params=t, body=_RUN_BODY
            ),
        },
        "/threads/{thread_id}/runs/stream": {
            "post": _op(
                "Start a run and stream it",
                "start_a_run_and_stream_it",
                params=t,
                body=_RUN_BODY,
                stream=True,
            )
        },
        "/threads/{thread_id}/runs/wait": {
            "post": _op(
                "Start a run and wait for it",
                "start_a_run_and_wait_for_it",
                params=t,
                body=_RUN_BODY,
            )
        },
        "/threads/{thread_id}/runs/{run_id}": {"get": _op("Get a run", "get_a_run", params=r)},
        "/threads/{thread_id}/runs/{run_id}/cancel": {
            "post": _op(
                "Cancel a run",
                "cancel_a_run",
                params=[
                    *r,
                    _query("wait", {"enum": ["0", "1"]}),
                    _query("action", {"enum": ["interrupt", "rollback"]}),
                ],
                ok="202",
            )
        },
        "/threads/{thread_id}/runs/{run_id}/join": {
            "get": _op("Wait for a run", "wait_for_a_run", params=r)
        },
        "/threads/{thread_id}/runs/{run_id}/stream": {
            "get": _op(
                "Follow a run's events",
                "follow_a_run_s_events",
                params=[
                    *r,
                    _query("stream_mode", _STR),
                    {"name": "Last-Event-ID", "in": "header", "required": False, "schema": _STR},
                ],
                stream=True,
            )
        },
    }


def _link(paths: dict[str, Any], path: str, method: str, ok: str, params: dict[str, str]) -> None:
    """Links from the answer of `method path` to every operation that takes `params`,
    so clients (and stateful fuzzers) can follow what it created."""
    links: dict[str, Any] = {}
    for ops in paths.values():
        for op in ops.values():
            names = {p["name"] for p in op["parameters"] if p["in"] == "path"}
            if names and names <= set(params):
                links[op["operationId"]] = {
                    "operationId": op["operationId"],
                    "parameters": {n: params[n] for n in names},
                }
    paths[path][method]["responses"][ok]["links"] = links


def openapi(assistants: list[str] | None = None) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the server (`assistants`: the ids it serves)."""
    paths = _paths()
    if assistants:
        named = {"type": "string", "enum": list(assistants)}
        for ops in paths.values():
            for op in ops.values():
                for param in op["parameters"]:
                    if param["name"] == "assistant_id":
                        param["schema"] = named
        for path in ("/threads/{thread_id}/runs", "/threads/{thread_id}/runs/wait"):
            body = paths[path]["post"]["requestBody"]["content"]["application/json"]
            body["schema"] = {
                **body["schema"],
                "properties": {**body["schema"]["properties"], "assistant_id": named},
            }
    thread = {"thread_id": "$response.body#/thread_id"}
    _link(paths, "/threads", "post", "200", thread)
    run = {**thread, "run_id": "$response.body#/run_id"}
    _link(paths, "/threads/{thread_id}/runs", "post", "200", run)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "criogen-graph serve",
            "version": __version__,
            "description": "The LangGraph Platform API subset criogen_graph serves.",
        },
        "paths": paths,
    }
