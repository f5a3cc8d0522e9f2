"""LangChain callbacks and LangSmith: a handler in a run's config (or LangSmith tracing from
the environment) sees each model call as a chat-model run and each tool call as a tool run,
nested under the graph's node runs, with usage, errors, and every text redacted."""

from __future__ import annotations

import email
import email.policy
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessageChunk, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGenerationChunk, LLMResult
from langchain_core.tracers.context import register_configure_hook

from criogen_graph import Agent, FakeModel, FakeReply, ModelError, Redactor, TextEvent, tool
from criogen_graph.models.base import ModelRequest, ModelResponse

SECRET = "jane.doe@example.com"
ROOT = Path(__file__).resolve().parent.parent


class Recorder(BaseCallbackHandler):
    """Every callback with its run id, parent and payload."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def _add(self, kind: str, run_id: UUID, parent_run_id: UUID | None, **data: Any) -> None:
        self.events.append({"kind": kind, "run": run_id, "parent": parent_run_id, **data})

    def on_chain_start(
        self,
        serialized: Any,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kw: Any,
    ) -> None:
        self._add("chain", run_id, parent_run_id, inputs=inputs, **kw)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kw: Any) -> None:
        self._add("chain_end", run_id, kw.get("parent_run_id"), outputs=outputs)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kw: Any) -> None:
        self._add("chain_error", run_id, kw.get("parent_run_id"), error=error)

    def on_chat_model_start(
        self,
        serialized: Any,
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kw: Any,
    ) -> None:
        self._add("chat", run_id, parent_run_id, messages=messages, **kw)

    def on_llm_new_token(self, token: str, *, run_id: UUID, **kw: Any) -> None:
        self._add("token", run_id, kw.get("parent_run_id"), token=token, chunk=kw.get("chunk"))

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kw: Any) -> None:
        self._add("llm_end", run_id, kw.get("parent_run_id"), response=response)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kw: Any) -> None:
        self._add("llm_error", run_id, kw.get("parent_run_id"), error=error)

    def on_tool_start(
        self,
        serialized: Any,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kw: Any,
    ) -> None:
        self._add("tool", run_id, parent_run_id, input_str=input_str, serialized=serialized, **kw)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kw: Any) -> None:
        self._add("tool_end", run_id, kw.get("parent_run_id"), output=output)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kw: Any) -> None:
        self._add("tool_error", run_id, kw.get("parent_run_id"), error=error)

    def on_llm_start(self, serialized: Any, prompts: list[str], *, run_id: UUID, **kw: Any) -> None:
        self._add("llm", run_id, kw.get("parent_run_id"), prompts=prompts, **kw)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] == kind]


#: A handler LangChain adds to every run configured while it is set (as LangSmith's tracer
#: is, from the environment): how a handler reaches runs made through our API.
_CONTEXT_HANDLER: ContextVar[Recorder | None] = ContextVar("test_handler", default=None)
register_configure_hook(_CONTEXT_HANDLER, inheritable=True)


@tool
def lookup(order_id: str) -> str:
    """Look up an order."""
    return f"order {order_id}: shipped to {SECRET}"


@tool
def broken(note: str) -> str:
    """Always fails."""
    raise RuntimeError(f"could not mail {note}")


def start(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


async def streamed(agent: Agent, text: str, handlers: list[Any]) -> list[Any]:
    """The graph run by LangGraph in its `messages` stream mode (a chat model streams,
    and reports its tokens, when it is streamed): the messages it streamed."""
    config: Any = {"callbacks": handlers}
    return [m async for m, _ in agent.graph.astream(start(text), config, stream_mode="messages")]


async def test_a_handler_sees_chat_model_and_tool_runs_under_the_node_runs() -> None:
    agent = Agent(
        FakeModel(
            [
                FakeReply.tool_call("lookup", {"order_id": "A-1"}, id="c1"),
                FakeReply.text("Shipped.", usage={"input_tokens": 40, "output_tokens": 3}),
            ]
        ),
        tools=[lookup],
    )
    handler = Recorder()
    out = await agent.graph.ainvoke(start("where is A-1?"), {"callbacks": [handler]})
    assert out["messages"][-1]["content"] == "Shipped."

    nodes = {e["run"]: e["name"] for e in handler.of("chain")}
    chats = handler.of("chat")
    assert len(chats) == 2
    for chat in chats:
        assert nodes[chat["parent"]] == "model"
        assert chat["metadata"]["ls_provider"] == "fake"
        assert chat["metadata"]["ls_model_name"] == "fake"
        assert chat["invocation_params"]["model"] == "fake"
        assert chat["invocation_params"]["tools"][0]["function"]["name"] == "lookup"
    first = chats[0]["messages"][0]
    assert isinstance(first[-1], HumanMessage) and first[-1].content == "where is A-1?"
    # The second call sees the tool call and its result as LangChain messages.
    second = chats[1]["messages"][0]
    assert isinstance(second[-1], ToolMessage) and second[-1].tool_call_id == "c1"

    ends = handler.of("llm_end")
    assert [e["run"] for e in ends] == [c["run"] for c in chats]
    last: LLMResult = ends[1]["response"]
    message = last.generations[0][0].message  # type: ignore[attr-defined]
    assert message.content == "Shipped."
    assert message.usage_metadata == {"input_tokens": 40, "output_tokens": 3, "total_tokens": 43}
    assert message.response_metadata["finish_reason"] == "stop"
    assert last.llm_output is not None and last.llm_output["token_usage"]["total_tokens"] == 43
    called = ends[0]["response"].generations[0][0].message
    assert called.tool_calls[0]["name"] == "lookup" and called.tool_calls[0]["id"] == "c1"

    (run,) = handler.of("tool")
    assert nodes[run["parent"]] == "tools"
    assert run["name"] == "lookup" and run["tool_call_id"] == "c1"
    assert run["inputs"] == {"order_id": "A-1"}
    assert json.loads(run["input_str"]) == {"order_id": "A-1"}
    (done,) = handler.of("tool_end")
    assert done["run"] == run["run"]
    assert isinstance(done["output"], ToolMessage)
    assert done["output"].content == f"order A-1: shipped to {SECRET}"


async def test_model_and_tool_failures_are_error_runs() -> None:
    handler = Recorder()
    agent = Agent(
        FakeModel([FakeReply.tool_call("broken", {"note": "x"}), FakeReply.text("Sorry.")]),
        tools=[broken],
    )
    await agent.graph.ainvoke(start("go"), {"callbacks": [handler]})
    (failed,) = handler.of("tool_error")
    assert failed["run"] == handler.of("tool")[0]["run"]
    assert "could not mail x" in str(failed["error"])
    assert handler.of("tool_end") == []

    handler = Recorder()
    agent = Agent(FakeModel([FakeReply.error("bad_request", "no such thing")]))
    with pytest.raises(ModelError):
        await agent.graph.ainvoke(start("go"), {"callbacks": [handler]})
    (error,) = handler.of("llm_error")
    assert error["run"] == handler.of("chat")[0]["run"]
    assert isinstance(error["error"], ModelError)
    assert handler.of("llm_end") == []


async def test_every_text_a_handler_receives_is_redacted() -> None:
    handler = Recorder()
    agent = Agent(
        FakeModel(
            [
                FakeReply.tool_call("lookup", {"order_id": SECRET}, id="c1"),
                FakeReply.tool_call("broken", {"note": SECRET}, id="c2"),
                FakeReply.text(f"Mailed {SECRET}."),
            ]
        ),
        tools=[lookup, broken],
        redact=Redactor.pii(),
    )
    await agent.graph.ainvoke(start(f"write to {SECRET}"), {"callbacks": [handler]})
    kinds = {e["kind"] for e in handler.events}
    assert {"chat", "llm_end", "tool", "tool_end", "tool_error"} <= kinds
    received = repr([e for e in handler.events if e["kind"] != "chain"])
    assert "write to" in received and "Mailed" in received
    assert SECRET not in received


async def test_through_the_api_no_run_a_handler_sees_carries_an_unredacted_text() -> None:
    # Node runs too (their inputs and outputs are the graph's state): the user's message,
    # tool arguments and results, answers, streamed text and error texts all carry the
    # secret before redaction.
    agent = Agent(
        FakeModel(
            [
                FakeReply.tool_call("lookup", {"order_id": SECRET}, id="c1"),
                FakeReply.tool_call("broken", {"note": SECRET}, id="c2"),
                FakeReply.text(f"Mailed {SECRET}."),
                FakeReply.text(
                    f"Again to {SECRET}.", chunks=["Again to ", "jane.", "doe@ex", "ample.com."]
                ),
                FakeReply.error("bad_request", f"refused {SECRET}"),
            ]
        ),
        tools=[lookup, broken],
        redact=Redactor.pii(),
    )
    handler = Recorder()
    thread = agent.thread("t-redacted")
    token = _CONTEXT_HANDLER.set(handler)
    try:
        assert (await thread.send(f"write to {SECRET}")).text == "Mailed [EMAIL]."
        stream = thread.stream(f"and again to {SECRET}")
        assert [e async for e in stream] and (await stream.reply()).text == "Again to [EMAIL]."
        with pytest.raises(ModelError):
            await thread.send(f"once more, {SECRET}")
    finally:
        _CONTEXT_HANDLER.reset(token)
    kinds = {e["kind"] for e in handler.events}
    assert kinds >= {"chain", "chain_end", "chain_error", "chat", "token", "llm_end"}
    assert kinds >= {"llm_error", "tool", "tool_end", "tool_error"}
    # Not checked here: a failed node run's error, the exception the node raised, which
    # LangGraph reports itself (the caller of `send` gets that same exception).
    received = repr([e for e in handler.events if e["kind"] != "chain_error"])
    assert "write to" in received and "Again to" in received and "refused" in received
    assert SECRET not in received
    (failed,) = handler.of("llm_error")
    assert isinstance(failed["error"], ModelError) and failed["error"].kind == "bad_request"


async def test_no_handler_no_runs_and_the_same_answer() -> None:
    agent = Agent(
        FakeModel([FakeReply.tool_call("lookup", {"order_id": "A-1"}), "done"]), tools=[lookup]
    )
    out = await agent.graph.ainvoke(start("go"))
    assert out["messages"][-1]["content"] == "done"


async def test_streamed_text_is_reported_as_new_tokens_of_the_chat_model_run() -> None:
    answer = "Your order A-1 left the depot this morning and arrives on Friday."
    agent = Agent(
        FakeModel([FakeReply.text(answer, chunks=[answer[i : i + 7] for i in range(0, 70, 7)])])
    )
    handler = Recorder()
    await streamed(agent, "where is A-1?", [handler])
    kinds = [e["kind"] for e in handler.events if e["kind"] in ("chat", "token", "llm_end")]
    assert kinds[0] == "chat" and kinds[-1] == "llm_end"
    assert set(kinds[1:-1]) == {"token"}
    (chat,) = handler.of("chat")
    tokens = handler.of("token")
    assert len(tokens) == 10
    assert "".join(t["token"] for t in tokens) == answer
    assert {t["run"] for t in tokens} == {chat["run"]}
    (end,) = handler.of("llm_end")
    final = end["response"].generations[0][0].message
    for t in tokens:
        # As LangChain's chat models send them: chunks of the final message (same id).
        assert isinstance(t["chunk"], ChatGenerationChunk)
        assert isinstance(t["chunk"].message, AIMessageChunk)
        assert t["chunk"].message.content == t["token"]
        assert t["chunk"].message.id == final.id is not None


async def test_a_run_nobody_streams_reports_no_tokens_as_langchains_chat_models() -> None:
    # `ainvoke`: nobody reads LangGraph's `custom` stream mode and no handler asks for a
    # stream: the model is not asked to stream, and no tokens are reported, as a
    # LangChain chat model run under `ainvoke` sends none.
    answer = "Shipped on Monday."
    model = FakeModel([FakeReply.text(answer, chunks=["Shipped ", "on ", "Monday."])])
    handler = Recorder()
    await Agent(model).graph.ainvoke(start("where?"), {"callbacks": [handler]})
    assert len(handler.of("chat")) == len(handler.of("llm_end")) == 1
    assert handler.of("token") == []
    assert model.calls[0].on_text is None  # nobody listened: it did not stream


async def test_streamed_tokens_are_redacted_and_secrets_never_split() -> None:
    answer = f"I will mail the label to {SECRET} today. " + "Thanks for waiting. " * 20
    pieces = [answer[i : i + 5] for i in range(0, len(answer), 5)]
    agent = Agent(FakeModel([FakeReply.text(answer, chunks=pieces)]), redact=Redactor.pii())
    handler = Recorder()
    chunks = await streamed(agent, f"mail {SECRET}", [handler])
    tokens = [t["token"] for t in handler.of("token")]
    assert [c.content for c in chunks] == tokens
    assert len(tokens) > 1
    sent = "".join(tokens)
    (end,) = handler.of("llm_end")
    final = end["response"].generations[0][0].message.content
    assert sent == final and "mail the label to" in sent
    assert SECRET not in sent and not any(SECRET[:8] in t for t in tokens)
    assert SECRET not in repr(handler.events)


async def test_a_model_call_that_fails_after_streaming_reports_its_tokens_then_the_error() -> None:
    class Broken(FakeModel):
        async def generate(self, request: ModelRequest) -> ModelResponse:
            assert request.on_text is not None
            request.on_text("Let me check")
            raise ModelError("the stream broke", kind="bad_request")

    handler = Recorder()
    agent = Agent(Broken([]))
    with pytest.raises(ModelError):
        await streamed(agent, "go", [handler])
    kinds = [e["kind"] for e in handler.events if e["kind"] in ("chat", "token", "llm_error")]
    assert kinds == ["chat", "token", "llm_error"]
    assert handler.of("token")[0]["token"] == "Let me check"


async def test_through_the_api_a_streamed_reply_reports_its_tokens_send_does_not_stream() -> None:
    answer = "Shipped on Monday, arriving Thursday."
    pieces = ["Shipped on ", "Monday, ", "arriving Thursday."]
    agent = Agent(FakeModel([FakeReply.text(answer, chunks=pieces), "Again."]))
    thread = agent.thread("t-1")
    handler = Recorder()
    token = _CONTEXT_HANDLER.set(handler)
    try:
        stream = thread.stream("where is it?")
        texts = [e.text async for e in stream if isinstance(e, TextEvent)]
        assert (await stream.reply()).text == answer
        streamed = [t["token"] for t in handler.of("token")]
        assert (await thread.send("and again?")).text == "Again."
    finally:
        _CONTEXT_HANDLER.reset(token)
    assert streamed == texts == pieces
    assert len(handler.of("chat")) == 2
    # `send` does not stream: its chat-model run has no tokens.
    assert [t["token"] for t in handler.of("token")] == pieces
    last = handler.of("llm_end")[-1]["response"].generations[0][0].message
    assert last.content == "Again."


async def test_handlers_that_ignore_a_kind_of_run_or_implement_none_of_its_events() -> None:
    class NoChat(Recorder):
        ignore_llm = True
        ignore_chat_model = True

    class NoTools(Recorder):
        ignore_agent = True

    class Silent(BaseCallbackHandler):
        """Implements no event: LangChain calls nothing that does anything."""

    class Tokens(BaseCallbackHandler):
        """Implements one event only: it is sent the whole chat-model run."""

        def __init__(self) -> None:
            self.tokens: list[str] = []

        def on_llm_new_token(self, token: str, **kw: Any) -> None:
            self.tokens.append(token)

    agent = Agent(
        FakeModel(
            [
                FakeReply.tool_call("lookup", {"order_id": "A-1"}, id="c1"),
                FakeReply.text("Shipped.", chunks=["Ship", "ped."]),
            ]
        ),
        tools=[lookup],
    )
    no_chat, no_tools, both, tokens = NoChat(), NoTools(), Recorder(), Tokens()
    await streamed(agent, "where is A-1?", [no_chat, Silent(), no_tools, both, tokens])
    assert no_chat.of("chat") == no_chat.of("llm_end") == no_chat.of("token") == []
    assert len(no_chat.of("tool")) == len(no_chat.of("tool_end")) == 1
    assert no_tools.of("tool") == no_tools.of("tool_end") == []
    assert len(no_tools.of("chat")) == len(no_tools.of("llm_end")) == 2
    assert [len(both.of(k)) for k in ("chat", "llm_end", "tool", "tool_end")] == [2, 2, 1, 1]
    assert tokens.tokens == ["Ship", "ped."]
    # Every handler still sees the graph's node runs.
    assert len(no_chat.of("chain")) == len(no_tools.of("chain")) == len(both.of("chain")) == 4


async def test_langgraph_messages_stream_mode_shows_the_streamed_chunks_once() -> None:
    answer = "Shipped on Monday."
    agent = Agent(FakeModel([FakeReply.text(answer, chunks=["Shipped ", "on ", "Monday."])]))
    seen: list[Any] = []
    async for message, _meta in agent.graph.astream(start("where?"), stream_mode="messages"):
        seen.append(message)
    assert [m.content for m in seen] == ["Shipped ", "on ", "Monday."]
    assert all(isinstance(m, AIMessageChunk) for m in seen)
    assert len({m.id for m in seen}) == 1


# -- LangSmith, from the environment, to a receiver on 127.0.0.1 ---------------------------


class LangSmithReceiver:
    """Speaks enough of LangSmith's API: `/info`, and run ingestion (multipart or batch)."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.runs: dict[str, dict[str, Any]] = {}
        self.paths: list[str] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, body: bytes = b"{}") -> None:
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._answer(json.dumps({"version": "0.10.0", "instance_flags": {}}).encode())

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with receiver.lock:
                    receiver.paths.append(self.path)
                    receiver.bodies.append(body)
                    receiver.ingest(self.path, self.headers.get("content-type") or "", body)
                self._answer()

            do_PATCH = do_POST

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def ingest(self, path: str, content_type: str, body: bytes) -> None:
        if content_type.startswith("multipart/"):
            parsed = email.message_from_bytes(
                f"Content-Type: {content_type}\r\n\r\n".encode() + body,
                policy=email.policy.HTTP,
            )
            for part in parsed.iter_parts():
                name = part.get_param("name", header="content-disposition")
                assert isinstance(name, str)
                _op, run_id, *field = name.split(".")
                data = json.loads(part.get_payload(decode=True))
                run = self.runs.setdefault(run_id, {})
                if field:
                    run[field[0]] = data
                else:
                    run.update(data)
        elif path.endswith("/runs/batch"):
            batch = json.loads(body)
            for item in [*batch.get("post", []), *batch.get("patch", [])]:
                self.runs.setdefault(str(item["id"]), {}).update(item)
        elif path.rstrip("/").endswith("/runs"):
            item = json.loads(body)
            self.runs.setdefault(str(item["id"]), {}).update(item)

    def __enter__(self) -> LangSmithReceiver:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def langsmith() -> Iterator[LangSmithReceiver]:
    with LangSmithReceiver() as receiver:
        yield receiver


_CHILD = textwrap.dedent(
    """
    import asyncio
    from langchain_core.tracers.langchain import wait_for_all_tracers
    from criogen_graph import Agent, FakeModel, FakeReply, Redactor, tool

    SECRET = "jane.doe@example.com"

    @tool
    def lookup(order_id: str) -> str:
        '''Look up an order.'''
        return f"order {order_id}: shipped to {SECRET}"

    agent = Agent(
        FakeModel([
            FakeReply.tool_call("lookup", {"order_id": SECRET}, id="c1"),
            FakeReply.text(f"Shipped to {SECRET}.", usage={"input_tokens": 40, "output_tokens": 3}),
        ]),
        tools=[lookup],
        redact=Redactor.pii(),
        name="support",
    )
    print(asyncio.run(agent.thread("t-1").send(f"where is my order? {SECRET}")).text)
    wait_for_all_tracers()
    """
)


def test_langsmith_tracing_from_the_environment_shows_model_and_tool_runs(
    langsmith: LangSmithReceiver, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "LANGSMITH_TRACING": "true",
        "LANGSMITH_ENDPOINT": langsmith.url,
        "LANGSMITH_API_KEY": "lsv2-test-key",
        "LANGSMITH_PROJECT": "criogen-test",
        "PYTHONPATH": str(ROOT),
    }
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "Shipped to" in done.stdout

    runs = langsmith.runs
    by_type: dict[str, list[dict[str, Any]]] = {}
    for run in runs.values():
        by_type.setdefault(run.get("run_type", "?"), []).append(run)
    chains = {str(r["id"]): r["name"] for r in by_type["chain"]}
    llms = by_type["llm"]
    assert len(llms) == 2
    for llm in llms:
        assert chains[str(llm["parent_run_id"])] == "model"
        assert llm["extra"]["metadata"]["ls_model_name"] == "fake"
        assert llm["inputs"]["messages"]
        assert llm.get("end_time") and not llm.get("error")
    answered = [r for r in llms if "Shipped to" in json.dumps(r["outputs"])]
    assert len(answered) == 1
    usage = json.dumps(answered[0]["outputs"])
    assert '"input_tokens": 40' in usage and '"output_tokens": 3' in usage
    (tool_run,) = by_type["tool"]
    assert tool_run["name"] == "lookup"
    assert chains[str(tool_run["parent_run_id"])] == "tools"
    assert "shipped to" in json.dumps(tool_run["outputs"])
    everything = b"".join(langsmith.bodies)
    assert SECRET.encode() not in everything


async def test_thread_id_and_actor_reach_handlers_only_redacted() -> None:
    """A thread id or actor holding personal data (an e-mail address) is redacted in the
    metadata every handler (LangSmith) sees, as it is on spans."""
    secret = "jane.doe@example.com"
    seen: list[str] = []

    class Metadata(BaseCallbackHandler):
        def on_chain_start(self, serialized: Any, inputs: Any, **kwargs: Any) -> None:
            seen.append(json.dumps(kwargs.get("metadata") or {}, default=str))

        def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
            seen.append(json.dumps(kwargs.get("metadata") or {}, default=str))

    handler = Metadata()
    token = _CONTEXT_HANDLER.set(handler)  # type: ignore[arg-type]
    try:
        agent = Agent(FakeModel(["hello"]), redact=Redactor.pii())
        await agent.thread(f"user-{secret}", actor=secret).send("hi")
    finally:
        _CONTEXT_HANDLER.reset(token)
    assert seen
    assert not any(secret in s for s in seen), seen
    assert any("thread_id" in s for s in seen)
