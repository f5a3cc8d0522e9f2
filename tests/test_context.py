"""Threads that live for months (`ContextPolicy`): the model is sent a view that fits the
budget (a summary of older messages, the newest verbatim, old tool results cleared), the
storage keeps every message, on every backend; provider context-overflow errors replayed
from recorded traffic compact and retry once; a fresh process continues from the saved
summary."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import (
    Agent,
    ContextPolicy,
    FakeReply,
    FunctionModel,
    HookAction,
    HookContext,
    ModelError,
    Redactor,
    Retry,
    Storage,
    Telemetry,
    ValidationError,
    anthropic,
    gemini,
    openai,
    tool,
)
from tests.conftest import storage_url
from tests.servers.otlp_receiver import OtlpReceiver
from tests.servers.replay_server import ReplayServer

ROOT = Path(__file__).resolve().parent.parent
SUMMARIZING = "You keep a running summary"
NO_WAIT = Retry(max_attempts=3, initial_backoff_secs=0, jitter=False)


def is_summary_call(messages: list[dict[str, Any]]) -> bool:
    return bool(messages) and str(messages[0].get("content", "")).startswith(SUMMARIZING)


class Script:
    """A model that answers "ok" and, asked for a summary, writes a short one naming
    the messages it was given; it keeps what each turn was sent."""

    def __init__(self, summary: str | None = None) -> None:
        self.sent: list[list[dict[str, Any]]] = []
        self.summaries: list[str] = []
        self.summary = summary

    def __call__(self, messages: list[dict[str, Any]], tools: list[Any]) -> Any:
        if is_summary_call(messages):
            n = len(self.summaries) + 1
            text = self.summary if self.summary is not None else f"summary {n} of the talk"
            self.summaries.append(messages[-1]["content"])
            return text
        self.sent.append(messages)
        return "ok"


def turn_text(i: int, size: int = 400) -> str:
    return f"message {i} " + "x" * size


def sent_tokens(messages: list[dict[str, Any]]) -> int:
    """What the FunctionModel reports as input tokens for `messages` (chars / 4)."""
    chars = sum(len(m["content"]) for m in messages if isinstance(m.get("content"), str))
    return (chars + 3) // 4


# -- the policy ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"max_input_tokens": 1000, "keep_last": 0}, "keep_last"),
        ({"max_input_tokens": 0}, "max_input_tokens"),
        ({"max_input_tokens": True}, "max_input_tokens"),
        ({"max_input_tokens": 1000, "on_overflow": "truncate"}, "on_overflow"),
    ],
)
def test_a_policy_that_cannot_work_is_a_validation_error(kwargs: Any, named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        ContextPolicy(**kwargs)


def test_a_budget_below_instructions_and_tools_fails_at_agent() -> None:
    @tool
    def lookup(order_id: str) -> str:
        """Look up an order by its id and return its status, items and shipping state."""
        return "shipped"

    with pytest.raises(ValidationError, match=r"max_input_tokens=50 .*instructions and tool"):
        Agent(
            FunctionModel(Script()),
            instructions="You are a support agent. " * 20,
            tools=[lookup],
            context=ContextPolicy(max_input_tokens=50),
        )
    with pytest.raises(TypeError, match="ContextPolicy"):
        Agent(FunctionModel(Script()), context={"max_input_tokens": 5})  # type: ignore[call-overload]


async def test_without_a_policy_nothing_is_added_to_the_state(tmp_path: Path) -> None:
    script = Script()
    agent = Agent(FunctionModel(script), storage=f"sqlite:///{tmp_path}/t.db")
    thread = agent.thread("plain")
    for i in range(3):
        reply = await thread.send(turn_text(i))
        assert reply.compacted is False
    snap = await agent.thread_graph(agent.storage).aget_state(
        {"configurable": {"thread_id": "plain"}}
    )
    assert "context" not in snap.values
    assert len(script.sent[-1]) == 5  # the whole transcript
    assert await thread.context() == await thread.messages()
    await agent.storage.close()


# -- a long thread on every backend ------------------------------------------------------------


async def test_a_long_thread_is_sent_a_view_that_fits_and_stores_everything(
    backend: str, tmp_path: Path, thread_id: str
) -> None:
    script = Script()
    policy = ContextPolicy(max_input_tokens=700, keep_last=4)
    async with Storage(storage_url(backend, tmp_path)) as storage:
        agent = Agent(
            FunctionModel(script), instructions="Be brief.", context=policy, storage=storage
        )
        thread = agent.thread(thread_id)
        compacted = []
        for i in range(24):
            reply = await thread.send(turn_text(i))
            compacted.append(reply.compacted)
            assert sent_tokens(script.sent[-1]) <= policy.max_input_tokens
        stored = await thread.messages()
        assert len(stored) == 48  # every message is kept
        assert [m["content"] for m in stored if m["role"] == "user"] == [
            turn_text(i) for i in range(24)
        ]
        assert any(compacted) and not all(compacted)
        # At most one summary call per keep_last messages.
        assert 1 <= len(script.summaries) <= 48 // policy.keep_last
        # The last call: instructions, the summary, then the newest messages verbatim.
        last = script.sent[-1]
        assert last[0] == {"role": "system", "content": "Be brief."}
        assert last[1]["kind"] == "summary" and "summary" in last[1]["content"]
        assert last[-1]["content"] == turn_text(23)
        assert last[2:] == stored[-(len(last) - 1) : -1]  # all but the last answer
        # What the model would be sent next is what it was sent, plus the last answer.
        view = await thread.context()
        assert view[: len(last)] == last and view[-1] == stored[-1]


async def test_the_summarizer_sees_the_older_messages_and_the_previous_summary(
    tmp_path: Path,
) -> None:
    script = Script()
    agent = Agent(FunctionModel(script), context=ContextPolicy(max_input_tokens=500, keep_last=2))
    thread = agent.thread("t")
    for i in range(12):
        await thread.send(turn_text(i, 300))
    assert len(script.summaries) >= 2
    assert "message 0 " in script.summaries[0] and "user: " in script.summaries[0]
    assert "Summary so far:\nsummary 1 of the talk" in script.summaries[1]
    # The newest messages are never summarized before they are sent once.
    assert all("message 11 " not in s for s in script.summaries)


# -- tools: clearing old results comes first -----------------------------------------------


async def test_old_tool_results_are_cleared_before_anything_is_summarized() -> None:
    @tool
    def fetch(page: int) -> str:
        """Fetch a page."""
        return f"page {page}: " + "y" * 1200

    sent: list[list[dict[str, Any]]] = []
    summaries = 0

    def fn(messages: list[dict[str, Any]], tools: list[Any]) -> Any:
        nonlocal summaries
        if is_summary_call(messages):
            summaries += 1
            return "summary"
        sent.append(messages)
        last = messages[-1]
        if last["role"] == "user":
            return FakeReply.tool_call("fetch", {"page": len(sent)})
        return "read it"

    agent = Agent(
        FunctionModel(fn), tools=[fetch], context=ContextPolicy(max_input_tokens=900, keep_last=3)
    )
    thread = agent.thread("t")
    for i in range(3):
        await thread.send(f"read page {i}")
    assert summaries == 0
    last = sent[-1]
    results = [m for m in last if m["role"] == "tool"]
    assert results[-1]["content"].startswith("page ")  # the newest result is sent
    assert all(r["content"].startswith("[tool result cleared") for r in results[:-1])
    stored = [m for m in await thread.messages() if m["role"] == "tool"]
    assert all(m["content"].startswith("page ") for m in stored)  # storage keeps them
    # A tool call is never separated from its result.
    for i, m in enumerate(last):
        if m["role"] == "tool":
            assert last[i - 1]["role"] in ("assistant", "tool")


# -- bad input: the run fails naming the budget, nothing is lost, retry() works -----------------


async def test_a_message_bigger_than_the_budget_fails_and_retry_works_after_a_new_policy(
    durable_backend: str, tmp_path: Path, thread_id: str
) -> None:
    url = storage_url(durable_backend, tmp_path)
    script = Script()
    async with Storage(url) as storage:
        small = Agent(
            FunctionModel(script), context=ContextPolicy(max_input_tokens=300), storage=storage
        )
        thread = small.thread(thread_id)
        await thread.send("hello")
        with pytest.raises(ModelError, match=r"max_input_tokens=300.*user message alone") as info:
            await thread.send("z" * 4000)
        assert info.value.kind == "context_overflow"
        stored = await thread.messages()
        assert [m["content"] for m in stored] == ["hello", "ok", "z" * 4000]
        big = Agent(
            FunctionModel(script), context=ContextPolicy(max_input_tokens=5000), storage=storage
        )
        reply = await big.thread(thread_id).retry()
        assert reply.text == "ok" and len(reply.messages) == 4


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        (ModelError("upstream down", kind="auth"), "summarizing the thread .* failed"),
        ("", "empty summary"),
        ("w" * 20_000, "returned a summary of ~"),
    ],
)
async def test_a_summarizer_that_fails_names_the_budget_and_retry_works(
    tmp_path: Path, answer: Any, match: str
) -> None:
    def broken(messages: list[dict[str, Any]], tools: list[Any]) -> Any:
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def first_failure(thread: Any) -> ModelError:
        for i in range(10):
            try:
                await thread.send(turn_text(i, 300))
            except ModelError as err:
                return err
        raise AssertionError("no call needed a summary")

    script = Script()
    url = f"sqlite:///{tmp_path}/t.db"
    policy = ContextPolicy(max_input_tokens=500, keep_last=2, summarize_with=FunctionModel(broken))
    async with Storage(url) as storage:
        agent = Agent(FunctionModel(script), context=policy, storage=storage)
        thread = agent.thread("t")
        failure = await first_failure(thread)
        assert re.search(match, str(failure)) and "max_input_tokens=500" in str(failure)
        before = await thread.messages()
        assert before[-1]["role"] == "user"
        fixed = Agent(
            FunctionModel(script),
            context=ContextPolicy(max_input_tokens=500, keep_last=2),
            storage=storage,
        )
        reply = await fixed.thread("t").retry()
        assert reply.compacted and reply.text == "ok"
        assert await fixed.thread("t").messages() == [*before, reply.messages[-1]]


# -- what sees the view: hooks, redaction, telemetry ---------------------------------------------


async def test_hooks_see_the_view_and_their_edits_change_only_what_is_sent() -> None:
    seen: list[list[dict[str, Any]]] = []

    class Trim:
        def before_model(self, ctx: HookContext) -> HookAction | None:
            seen.append(list(ctx.messages))
            if ctx.messages and ctx.messages[0].get("kind") == "summary":
                return HookAction(messages=[m for m in ctx.messages if m.get("kind") != "summary"])
            return None

    script = Script()
    agent = Agent(
        FunctionModel(script),
        hooks=[Trim()],
        context=ContextPolicy(max_input_tokens=500, keep_last=2),
    )
    thread = agent.thread("t")
    for i in range(8):
        await thread.send(turn_text(i, 300))
    assert any(s and s[0].get("kind") == "summary" for s in seen)
    assert all(m.get("kind") != "summary" for call in script.sent for m in call)
    assert len(await thread.messages()) == 16  # the hook's edit did not cut the stored thread


async def test_the_summary_is_redacted_and_encrypted_at_rest(tmp_path: Path) -> None:
    script = Script(summary="the user is ana@example.com and likes tea")
    db = tmp_path / "enc.db"
    async with Storage(f"sqlite:///{db}", encryption_key="k" * 32) as storage:
        agent = Agent(
            FunctionModel(script),
            redact=Redactor.pii(),
            context=ContextPolicy(max_input_tokens=500, keep_last=2),
            storage=storage,
        )
        thread = agent.thread("t")
        for i in range(8):
            await thread.send(turn_text(i, 300))
        view = await thread.context()
        summary = next(m for m in view if m.get("kind") == "summary")
        assert "likes tea" in summary["content"]
        assert "ana@example.com" not in summary["content"]
    with sqlite3.connect(db) as conn:
        blobs = b"".join(
            bytes(v) if isinstance(v, bytes | memoryview) else str(v).encode()
            for row in conn.execute("SELECT * FROM checkpoints")
            for v in row
            if v is not None
        )
    assert b"likes tea" not in blobs


async def test_the_summary_call_is_a_chat_span_marked_as_summary(rx: OtlpReceiver) -> None:
    telemetry = Telemetry.otlp(rx.url)
    rx.users.append(telemetry)
    agent = Agent(
        FunctionModel(Script()),
        telemetry=telemetry,
        context=ContextPolicy(max_input_tokens=500, keep_last=2),
    )
    thread = agent.thread("t")
    compacted = [(await thread.send(turn_text(i, 300))).compacted for i in range(10)]
    assert any(compacted)
    assert telemetry.flush(10)
    chats = [s for s in rx.spans if s.name.startswith("chat ")]
    marked = [s for s in chats if s.attributes.get("criogen.summary") is True]
    assert marked and len(marked) < len(chats)
    assert all(s.attributes["gen_ai.operation.name"] == "chat" for s in marked)


# -- rewind, agent.run, LangGraph itself -------------------------------------------------------


async def test_rewind_before_a_summary_brings_the_earlier_view_back(tmp_path: Path) -> None:
    script = Script()
    agent = Agent(
        FunctionModel(script),
        context=ContextPolicy(max_input_tokens=500, keep_last=2),
        storage=f"sqlite:///{tmp_path}/t.db",
    )
    thread = agent.thread("t")
    replies = []
    for i in range(8):
        replies.append(await thread.send(turn_text(i, 300)))
    first = next(i for i, r in enumerate(replies) if r.compacted)
    assert all(m.get("kind") != "summary" for m in await thread.context()) is False
    await thread.rewind(replies[first - 1].checkpoint_id)
    view = await thread.context()
    assert all(m.get("kind") != "summary" for m in view)
    assert view == await thread.messages()
    await agent.storage.close()


async def test_agent_run_and_the_langgraph_graph_compact_too() -> None:
    script = Script()
    agent = Agent(FunctionModel(script), context=ContextPolicy(max_input_tokens=300, keep_last=2))
    result = await agent.run("q " * 100)
    assert result.compacted is False and result.text == "ok"
    long = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": turn_text(i, 300)}
        for i in range(9)
    ]
    out = await agent.graph.ainvoke({"messages": long})
    assert script.summaries and out["run"].get("compacted") is True
    assert out["context"]["through"] > 0 and len(out["messages"]) == 10
    assert script.sent[-1][0]["kind"] == "summary"


# -- provider context-overflow errors, replayed -------------------------------------------------


@pytest.fixture
def srv() -> Iterator[ReplayServer]:
    with ReplayServer() as server:
        yield server


def replay_model(provider: str, server: ReplayServer) -> Any:
    if provider == "openai":
        return openai("gpt-test", api_key="sk-test", base_url=server.base_url + "/v1")
    if provider == "anthropic":
        return anthropic("claude-test", api_key="test", base_url=server.base_url)
    return gemini("gemini-test", api_key="test", base_url=server.base_url)


OVERFLOWS = [
    ("openai/context_length_exceeded", False),
    ("openai/openrouter_stream_context", True),
    ("anthropic/prompt_too_long", False),
    ("gemini/token_limit_400", False),
]


def _text(provider: str, streamed: bool) -> str:
    if provider == "openai":
        return "openai/streamed_text" if streamed else "openai/text"
    return f"{provider}/stream_text" if streamed else f"{provider}/text"


@pytest.mark.parametrize(("fixture", "streamed"), OVERFLOWS)
async def test_a_provider_overflow_compacts_and_retries_once(
    srv: ReplayServer, fixture: str, streamed: bool
) -> None:
    provider = fixture.split("/")[0]
    text = _text(provider, streamed)
    model = replay_model(provider, srv)
    agent = Agent(
        model, model_retry=NO_WAIT, context=ContextPolicy(max_input_tokens=1_000_000, keep_last=2)
    )
    thread = agent.thread("t")

    async def send(prompt: str) -> Any:
        if not streamed:
            return await thread.send(prompt)
        stream = thread.stream(prompt)
        async for _ in stream:
            pass
        return await stream.reply()

    try:
        srv.replay(text, text)
        await send("first question")
        await send("second question")
        # The call is refused as too long; a summary is written; the call is made again.
        srv.replay(fixture, _text(provider, False), text)  # the summary is not streamed
        reply = await send("third question")
        assert reply.compacted and reply.stop_reason == "final_answer"
        assert len(srv.requests) == 5
        summary_request = json.dumps(srv.requests[3])
        assert SUMMARIZING in summary_request and "first question" in summary_request
        retried = json.dumps(srv.requests[4])
        assert "first question" not in retried and "third question" in retried
        assert len(await thread.messages()) == 6
        # A second overflow in the same call is not retried again.
        srv.replay(fixture, _text(provider, False), fixture)
        with pytest.raises(ModelError) as info:
            await send("fourth question")
        assert info.value.kind == "context_overflow"
        assert len(srv.requests) == 8
    finally:
        await model.aclose()


@pytest.mark.parametrize(("fixture", "streamed"), OVERFLOWS[:1])
async def test_on_overflow_fail_raises_the_provider_error(
    srv: ReplayServer, fixture: str, streamed: bool
) -> None:
    model = replay_model("openai", srv)
    policy = ContextPolicy(max_input_tokens=1_000_000, keep_last=2, on_overflow="fail")
    agent = Agent(model, model_retry=NO_WAIT, context=policy)
    try:
        srv.replay("openai/text", fixture)
        await agent.thread("t").send("one")
        with pytest.raises(ModelError, match="maximum context length") as info:
            await agent.thread("t").send("two")
        assert info.value.kind == "context_overflow" and len(srv.requests) == 2
    finally:
        await model.aclose()


# -- a fresh process continues from the saved summary ---------------------------------------------

CHILD = """
import asyncio, json, sys
from criogen_graph import Agent, ContextPolicy, FunctionModel, Storage
from tests.test_context import Script, turn_text

async def main() -> None:
    script = Script()
    async with Storage(sys.argv[1]) as storage:
        agent = Agent(FunctionModel(script), instructions="Be brief.",
                      context=ContextPolicy(max_input_tokens=700, keep_last=4), storage=storage)
        reply = await agent.thread(sys.argv[2]).send(turn_text(99))
        print(json.dumps({"summaries": len(script.summaries), "sent": script.sent[-1],
                          "compacted": reply.compacted}))

asyncio.run(main())
"""


async def test_a_fresh_process_continues_from_the_saved_summary(
    durable_backend: str, tmp_path: Path, thread_id: str
) -> None:
    url = storage_url(durable_backend, tmp_path)
    script = Script()
    async with Storage(url) as storage:
        agent = Agent(
            FunctionModel(script),
            instructions="Be brief.",
            context=ContextPolicy(max_input_tokens=700, keep_last=4),
            storage=storage,
        )
        thread = agent.thread(thread_id)
        i = 0
        while True:  # until the newest reply wrote a summary: the next turn needs none
            reply = await thread.send(turn_text(i))
            i += 1
            if reply.compacted:
                break
        view = await thread.context()
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        url,
        thread_id,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(child.communicate(), 120)
    assert child.returncode == 0, stderr.decode()
    out = json.loads(stdout.decode().strip().splitlines()[-1])
    assert out["summaries"] == 0 and out["compacted"] is False
    assert out["sent"][: len(view)] == view  # the summary saved by the first process
    assert out["sent"][-1]["content"] == turn_text(99)


# -- approvals and background runs on a compacted thread -----------------------------------------


async def test_approvals_and_background_runs_work_on_a_compacted_thread(tmp_path: Path) -> None:
    @tool
    def refund(order_id: str) -> str:
        """Refund an order."""
        return f"refunded {order_id}"

    sent: list[list[dict[str, Any]]] = []

    def fn(messages: list[dict[str, Any]], tools: list[Any]) -> Any:
        if is_summary_call(messages):
            return "summary: the user chatted"
        sent.append(messages)
        last = messages[-1]
        if last["role"] == "user" and "refund" in str(last["content"]):
            return FakeReply.tool_call("refund", {"order_id": "A1"})
        return "done" if last["role"] == "tool" else "ok"

    async with Storage(f"sqlite:///{tmp_path}/t.db") as storage:
        agent = Agent(
            FunctionModel(fn),
            tools=[refund],
            approve=["refund"],
            context=ContextPolicy(max_input_tokens=700, keep_last=2),
            storage=storage,
        )
        thread = agent.thread("t")
        compacted = []
        for i in range(10):
            handle = await thread.submit(turn_text(i, 300))
            compacted.append((await handle.reply()).compacted)
        assert any(compacted)
        asked = await thread.send("please refund A1")
        assert asked.needs_approval and [a.tool for a in asked.approvals] == ["refund"]
        done = await thread.approve()
        assert done.text == "done"
        # The call and its result were sent together after the summary.
        last = sent[-1]
        assert last[0]["kind"] == "summary"
        assert [m["role"] for m in last[-3:]] == ["user", "assistant", "tool"]
        assert last[-1]["content"] == "refunded A1"
        assert len(await thread.messages()) == 10 * 2 + 4


async def test_an_overflow_with_nothing_older_to_summarize_raises_the_provider_error(
    srv: ReplayServer,
) -> None:
    model = replay_model("anthropic", srv)
    agent = Agent(model, model_retry=NO_WAIT, context=ContextPolicy(max_input_tokens=1_000_000))
    try:
        srv.replay("anthropic/prompt_too_long")
        with pytest.raises(ModelError, match="prompt is too long") as info:
            await agent.thread("t").send("one very long question")
        assert info.value.kind == "context_overflow" and len(srv.requests) == 1
        assert [m["role"] for m in await agent.thread("t").messages()] == ["user"]
    finally:
        await model.aclose()
