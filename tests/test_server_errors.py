"""What a `langgraph_sdk` client sees when one of our errors fails a run of the real
`langgraph dev` server: the error's class name, its `code` and its message, in the
run's result (`runs.wait`, `runs.join`), the stream's `error` event and the thread. An
exception of no library of ours still shows as the server shows it: its class name and
"An internal error occurred"."""

from __future__ import annotations

import copy
import json
import pickle
import re
import shutil
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from criogen_graph import HookFailedError, ToolExecutionError, ValidationError
from tests.conftest import ROOT
from tests.server_errors.graphs import HOOK_MESSAGE
from tests.test_studio import DevServer, require_studio, serve_project

NO_USER = (
    "this agent's memory is kept per state['user_id'], and the run's state has no "
    "'user_id': pass state={'user_id': ...}"
)
HIDDEN = "An internal error occurred"
HELLO = {"messages": [{"role": "user", "content": "Hello"}]}


@pytest.fixture(scope="module")
def error_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """`langgraph dev` serving the memory example and tests/server_errors' graphs."""
    require_studio()
    project = tmp_path_factory.mktemp("server_errors")
    (project / "examples").mkdir()
    shutil.copy(ROOT / "examples" / "memory_agent.py", project / "examples")
    for name in ("graphs.py", "langgraph.json"):
        shutil.copy(ROOT / "tests" / "server_errors" / name, project / name)
    with serve_project(project) as server:
        yield server


@pytest.fixture
async def client(error_server: DevServer) -> AsyncIterator[Any]:
    from langgraph_sdk import get_client

    c = get_client(url=error_server.url)
    try:
        yield c
    finally:
        await c.aclose()


async def _new_thread(client: Any) -> str:
    thread_id: str = (await client.threads.create())["thread_id"]
    return thread_id


async def _streamed_errors(client: Any, graph: str, payload: dict[str, Any]) -> list[Any]:
    thread_id = await _new_thread(client)
    return [
        chunk.data
        async for chunk in client.runs.stream(thread_id, graph, input=payload)
        if chunk.event == "error"
    ]


async def test_a_memory_run_without_its_user_shows_our_validation_error(client: Any) -> None:
    expected = {"error": "ValidationError", "code": "missing", "message": NO_USER}

    thread_id = await _new_thread(client)
    out = await client.runs.wait(thread_id, "memory", input=HELLO, raise_error=False)
    assert out == {"__error__": expected}
    # The SDK's default for `wait` raises with the class name and the message.
    with pytest.raises(Exception, match=f"^{re.escape(f'ValidationError: {NO_USER}')}$"):
        await client.runs.wait(await _new_thread(client), "memory", input=HELLO)

    # The run and the thread say so too; the failed task keeps the text the server saves
    # for any task error (its repr, a string).
    (run,) = await client.runs.list(thread_id)
    assert run["status"] == "error"
    thread = await client.threads.get(thread_id)
    assert (thread["status"], thread["error"]) == ("error", expected)
    state = await client.threads.get_state(thread_id)
    (task,) = state["tasks"]
    assert (task["name"], task["error"]) == ("model", repr(ValidationError(NO_USER)))

    # A background run joined later ends the same way.
    thread_id = await _new_thread(client)
    run = await client.runs.create(thread_id, "memory", input=HELLO)
    assert await client.runs.join(thread_id, run["run_id"]) == {"__error__": expected}

    assert await _streamed_errors(client, "memory", HELLO) == [expected]


@pytest.mark.parametrize(
    ("graph", "error", "code", "message"),
    [
        (
            "hook",
            "HookFailedError",
            "hook_failed",
            f"hook 'Budget' raised in before_model: ConnectionError: {HOOK_MESSAGE}",
        ),
        (
            "tool_fails",
            "ToolExecutionError",
            "tool_failed",
            "tool 'charge' (call *) raised PermissionError: card declined for A-1",
        ),
    ],
)
async def test_our_errors_from_hooks_and_tools_keep_their_class_code_and_message(
    client: Any, graph: str, error: str, code: str, message: str
) -> None:
    thread_id = await _new_thread(client)
    out = await client.runs.wait(thread_id, graph, input=HELLO, raise_error=False)
    (streamed,) = await _streamed_errors(client, graph, HELLO)
    for seen in (out["__error__"], streamed):
        assert (seen["error"], seen["code"]) == (error, code)
        head, _, tail = message.partition("*")
        assert seen["message"].startswith(head) and seen["message"].endswith(tail)


async def test_an_exception_of_no_library_of_ours_stays_hidden_as_the_server_hides_it(
    client: Any,
) -> None:
    hidden = {"error": "ZeroDivisionError", "message": HIDDEN}
    thread_id = await _new_thread(client)
    out = await client.runs.wait(thread_id, "plain", input=HELLO, raise_error=False)
    assert out == {"__error__": hidden}
    assert await _streamed_errors(client, "plain", HELLO) == [hidden]
    assert (await client.threads.get(thread_id))["error"] == hidden


def test_our_errors_show_the_server_nothing_new_to_our_own_api_and_storage() -> None:
    """Only the server's JSON encoder sees the fields: our API, pickling and the
    checkpoint serializer (which saves a task's error as its repr) see what they did."""
    require_studio()
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
    from langgraph_api.serde import json_dumpb

    errors = [
        ValidationError(NO_USER, code="missing"),
        HookFailedError("hook 'Budget' raised", hook="Budget", method="before_model"),
        ToolExecutionError("tool 'charge' raised", tool="charge", call_id="c1"),
    ]
    for err in errors:
        assert json.loads(json_dumpb(err)) == {
            "error": type(err).__name__,
            "code": err.code,
            "message": str(err),
        }
        assert not hasattr(err, "_asdict")
        assert getattr(err, "_asdict", None) is None
        serde = JsonPlusSerializer()
        assert serde.loads_typed(serde.dumps_typed(err)) == repr(err)

    again = pickle.loads(pickle.dumps(errors[0]))
    assert (type(again), again.code, str(again)) == (ValidationError, "missing", NO_USER)
    assert copy.deepcopy(errors[0]).code == "missing"
