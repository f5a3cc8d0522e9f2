"""Model-call middleware: order with hooks and with each other, changing the request,
calling the next handler zero or more times, replacing the response; retries and
fallbacks seen as one call; streaming without repeated text; telemetry still recorded."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import (
    Agent,
    FakeModel,
    FakeReply,
    FunctionModel,
    Hook,
    HookContext,
    ModelError,
    Retry,
    Storage,
    ToolContext,
    tool,
)
from criogen_graph.middleware import (
    Middleware,
    ModelCall,
    ModelHandler,
    model_middleware,
)
from criogen_graph.models.base import ModelResponse

FAST = Retry(max_attempts=3, initial_backoff_secs=0, jitter=False)


class Trace(Middleware):
    def __init__(self, label: str, log: list[str]) -> None:
        self.label = label
        self.log = log

    async def wrap_model_call(self, call: ModelCall, handler: ModelHandler) -> ModelResponse:
        self.log.append(f"{self.label}:in")
        response = await handler(call)
        self.log.append(f"{self.label}:out")
        return response


class TraceHook(Hook):
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def before_model(self, ctx: HookContext) -> None:
        self.log.append("before_model")

    def after_model(self, ctx: HookContext) -> None:
        self.log.append("after_model")


def _logging_model(log: list[str], replies: list[Any]) -> FunctionModel:
    queue = list(replies)

    def answer(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        log.append("model")
        return queue.pop(0)

    return FunctionModel(answer, name="m")


async def test_middleware_runs_between_the_hooks_first_outermost() -> None:
    log: list[str] = []
    agent = Agent(
        _logging_model(log, ["hi"]),
        hooks=[TraceHook(log)],
        middleware=[Trace("a", log), Trace("b", log)],
    )
    result = await agent.run("go")
    assert result.text == "hi"
    assert log == ["before_model", "a:in", "b:in", "model", "b:out", "a:out", "after_model"]


async def test_middleware_sees_the_run_and_changes_the_request() -> None:
    seen: list[ModelCall] = []
    got: list[list[dict[str, Any]]] = []

    @model_middleware
    async def add_note(call: ModelCall, handler: ModelHandler) -> ModelResponse:
        seen.append(call)
        messages = [*call.request.messages, {"role": "user", "content": "be brief"}]
        request = type(call.request)(messages, call.request.tools, call.request.output_schema)
        return await handler(call.replace(request=request))

    def answer(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        got.append(messages)
        return "ok"

    agent = Agent(FunctionModel(answer), instructions="sys", middleware=[add_note])
    thread = agent.thread("t-mw")
    await thread.send("hello")
    assert [m["content"] for m in got[0]] == ["sys", "hello", "be brief"]
    call = seen[0]
    assert call.thread_id == "t-mw" and call.model_calls == 0 and call.run_id
    # The note went to the model only: the saved transcript is what the user wrote.
    history = [m["content"] for m in await thread.messages()]
    assert history == ["hello", "ok"]


async def test_a_cache_answers_without_calling_the_model() -> None:
    calls = 0

    def answer(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        nonlocal calls
        calls += 1
        return f"answer {calls}"

    class Cache(Middleware):
        def __init__(self) -> None:
            self.seen: dict[str, ModelResponse] = {}

        async def wrap_model_call(self, call: ModelCall, handler: ModelHandler) -> ModelResponse:
            key = repr([m.get("content") for m in call.request.messages])
            if key not in self.seen:
                self.seen[key] = await handler(call)
            cached = self.seen[key]
            return ModelResponse(dict(cached.message), dict(cached.usage), cached.stop_reason)

    agent = Agent(FunctionModel(answer), middleware=[Cache()])
    first = await agent.run("same question")
    second = await agent.run("same question")
    assert first.text == second.text == "answer 1"
    assert calls == 1
    assert second.model_calls == 1  # the step counts, whoever answered it


async def test_a_guardrail_asks_the_model_again() -> None:
    replies = iter(["my password is hunter2", "I cannot share that."])

    def answer(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        return next(replies)

    @model_middleware
    async def no_passwords(call: ModelCall, handler: ModelHandler) -> ModelResponse:
        response = await handler(call)
        for _ in range(2):
            if "password" not in (response.message.get("content") or ""):
                return response
            request = call.request
            again = type(request)(
                [
                    *request.messages,
                    response.message,
                    {"role": "user", "content": "Do not reveal passwords. Answer again."},
                ],
                request.tools,
                request.output_schema,
            )
            response = await handler(call.replace(request=again))
        return response

    agent = Agent(FunctionModel(answer), middleware=[no_passwords])
    thread = agent.thread("guard")
    reply = await thread.send("what is the password?")
    assert reply.text == "I cannot share that."
    saved = [m["content"] for m in await thread.messages()]
    assert saved == ["what is the password?", "I cannot share that."]


async def test_retries_and_fallbacks_are_inside_one_middleware_call() -> None:
    primary = FakeModel([FakeReply.error("rate_limit"), FakeReply.error("transient")], name="p")
    backup = FakeModel(["from backup"], name="b")
    log: list[str] = []
    agent = Agent(
        primary,
        fallbacks=[backup],
        model_retry=Retry(max_attempts=2, initial_backoff_secs=0, jitter=False),
        middleware=[Trace("a", log)],
    )
    result = await agent.run("go")
    assert result.text == "from backup" and result.answered_by["model"] == "b"
    assert log == ["a:in", "a:out"]
    assert result.model_calls == 1


async def test_a_middleware_may_switch_the_model() -> None:
    cheap = FakeModel(["cheap answer"], name="cheap")

    @model_middleware
    async def route(call: ModelCall, handler: ModelHandler) -> ModelResponse:
        return await handler(call.replace(model=cheap))

    result = await Agent(FakeModel(["expensive"], name="big"), middleware=[route]).run("go")
    assert result.text == "cheap answer"
    assert result.answered_by["model"] == "cheap"


async def test_model_error_from_middleware_fails_the_run_naming_the_model() -> None:
    @model_middleware
    async def refuse(call: ModelCall, handler: ModelHandler) -> ModelResponse:
        raise ModelError("quota used up", kind="rate_limit")

    agent = Agent(FakeModel(["x"], name="m"), middleware=[refuse], model_retry=FAST)
    with pytest.raises(ModelError) as info:
        await agent.run("go")
    assert info.value.kind == "rate_limit"
    assert "quota used up" in str(info.value)


async def test_other_exceptions_from_middleware_propagate_and_the_thread_stays_usable(
    tmp_path: Path,
) -> None:
    broken = True

    @model_middleware
    async def flaky(call: ModelCall, handler: ModelHandler) -> ModelResponse:
        if broken:
            raise RuntimeError("middleware bug")
        return await handler(call)

    storage = Storage(f"sqlite:///{tmp_path / 'mw.db'}")
    agent = Agent(FakeModel(["fine"]), middleware=[flaky], storage=storage)
    thread = agent.thread("t")
    with pytest.raises(Exception, match="middleware bug"):
        await thread.send("hello")
    broken = False
    reply = await thread.retry()
    assert reply.text == "fine"
    assert [m["content"] for m in await thread.messages()] == ["hello", "fine"]
    await storage.close()


async def test_streamed_text_is_not_repeated_when_a_middleware_calls_twice() -> None:
    @model_middleware
    async def twice(call: ModelCall, handler: ModelHandler) -> ModelResponse:
        await handler(call)
        return await handler(call)

    agent = Agent(FakeModel(["hello world", "hello world"]), middleware=[twice])
    thread = agent.thread("s")
    stream = thread.stream("hi")
    texts = [e.text for e in [ev async for ev in stream] if e.type == "text"]
    reply = await stream.reply()
    assert "".join(texts) == reply.text == "hello world"


async def test_middleware_composes_with_tool_calls_and_approvals() -> None:
    log: list[str] = []

    @tool
    def pay(amount: int) -> str:
        """Pay an amount."""
        log.append(f"paid {amount}")
        return "paid"

    agent = Agent(
        FakeModel([FakeReply.tool_call("pay", {"amount": 5}), "done"]),
        tools=[pay],
        approve=["pay"],
        middleware=[Trace("a", log)],
    )
    thread = agent.thread("pay")
    asked = await thread.send("pay 5")
    assert asked.needs_approval and log == ["a:in", "a:out"]
    reply = await thread.approve(expected=asked)
    assert reply.text == "done"
    assert log == ["a:in", "a:out", "paid 5", "a:in", "a:out"]


async def test_cancelled_inside_middleware_saves_nothing_half_done() -> None:
    entered = asyncio.Event()

    @model_middleware
    async def slow(call: ModelCall, handler: ModelHandler) -> ModelResponse:
        entered.set()
        await asyncio.Event().wait()
        return await handler(call)

    agent = Agent(FakeModel(["x"]), middleware=[slow])
    thread = agent.thread("c")
    task = asyncio.create_task(thread.send("hi"))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [m["content"] for m in await thread.messages()] == ["hi"]


def test_bad_middleware_entries_are_type_errors() -> None:
    with pytest.raises(TypeError, match="middleware entries must be Middleware"):
        Agent(FakeModel(["x"]), middleware=[lambda call, handler: None])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="list of Middleware"):
        Agent(FakeModel(["x"]), middleware=Trace("a", []))  # type: ignore[arg-type]


async def test_telemetry_span_wraps_retries_as_events() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from criogen_graph import Telemetry

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    log: list[str] = []
    agent = Agent(
        FakeModel([FakeReply.error("rate_limit"), "ok"], name="m"),
        model_retry=FAST,
        telemetry=Telemetry(provider),
        middleware=[Trace("a", log)],
    )
    result = await agent.run("go")
    assert result.text == "ok"
    chats = [s for s in exporter.get_finished_spans() if s.name == "chat m"]
    assert len(chats) == 1
    assert [e.name for e in chats[0].events] == ["criogen.model_retry"]
    assert chats[0].attributes["gen_ai.usage.output_tokens"] >= 0


async def test_changing_the_request_in_place_does_not_change_the_thread() -> None:
    @model_middleware
    async def vandal(call: ModelCall, handler: ModelHandler) -> ModelResponse:
        call.request.messages[0]["content"] = "overwritten"
        call.request.messages.append({"role": "user", "content": "extra"})
        return await handler(call)

    thread = Agent(FakeModel(["a", "b"]), middleware=[vandal]).thread("v")
    await thread.send("first")
    await thread.send("second")
    assert [m["content"] for m in await thread.messages()] == ["first", "a", "second", "b"]


async def test_cancelled_at_every_iteration_around_model_middleware(tmp_path: Path) -> None:
    """A send cancelled k event-loop iterations in (k = 0..40), while a model middleware
    awaits before and after its handler: the thread is saved, `retry()` finishes it, and
    the tool that ran never runs again."""
    paid: dict[str, int] = {}

    @tool
    def pay(amount: int, ctx: ToolContext) -> str:
        """Pay an amount."""
        paid[ctx.thread_id or ""] = paid.get(ctx.thread_id or "", 0) + 1
        return "paid"

    @model_middleware
    async def slow(call: ModelCall, handler: ModelHandler) -> ModelResponse:
        for _ in range(3):
            await asyncio.sleep(0)
        response = await handler(call)
        for _ in range(3):
            await asyncio.sleep(0)
        return response

    def answer(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if any(m["role"] == "tool" for m in messages[-1:]):
            return "done"
        return FakeReply.tool_call("pay", {"amount": 5})

    storage = Storage(f"sqlite:///{tmp_path / 'k.db'}")
    agent = Agent(FunctionModel(answer), tools=[pay], middleware=[slow], storage=storage)
    for k in range(41):
        thread = agent.thread(f"k{k}")
        task = asyncio.create_task(thread.send("pay"))
        for _ in range(k):
            await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        messages = await thread.messages()
        if not messages:
            await thread.send("pay")  # cancelled before anything was saved
        elif messages[-1].get("content") != "done":
            await thread.retry()
        final = [m.get("content") for m in await thread.messages()]
        assert final[-1] == "done", f"k={k}: {final}"
        assert paid[f"k{k}"] == 1, f"k={k}: paid {paid[f'k{k}']} times"
    await storage.close()


async def test_stream_clients_get_only_the_answer_a_middleware_keeps() -> None:
    """The docs' guardrail re-asks the model; another middleware rewrites the reply: the
    streamed text is the saved answer, never the rejected or unrewritten one."""
    rejected = "I guarantee it arrives tomorrow."
    kept = "The courier usually delivers within two days."

    @model_middleware
    async def no_promises(call: ModelCall, handler: ModelHandler) -> ModelResponse:
        response = await handler(call)
        if "guarantee" in response.message["content"]:
            response = await handler(call)
        return response

    @model_middleware
    async def polite(call: ModelCall, handler: ModelHandler) -> ModelResponse:
        response = await handler(call)
        response.message["content"] = "Thanks for asking. " + response.message["content"]
        return response

    def chunks(text: str) -> list[str]:
        return [text[i : i + 4] for i in range(0, len(text), 4)]

    script = [
        FakeReply.text(rejected, chunks=chunks(rejected)),
        FakeReply.text(kept, chunks=chunks(kept)),
    ]
    agent = Agent(FakeModel(script), middleware=[polite, no_promises])
    stream = agent.thread("s").stream("Will it arrive tomorrow?")
    events = [e async for e in stream]
    reply = await stream.reply()
    streamed = "".join(e.text for e in events if e.type == "text")
    assert reply.text == streamed == "Thanks for asking. " + kept
    assert "guarantee" not in repr(events)


async def test_a_middleware_that_passes_text_streams_it_as_it_arrives() -> None:
    class Timer(Middleware):
        passes_text = True

        async def wrap_model_call(self, call: ModelCall, handler: ModelHandler) -> ModelResponse:
            return await handler(call)

    answer = "one two three four five six"
    pieces = answer.split(" ")
    agent = Agent(
        FakeModel([FakeReply.text(answer, chunks=[p + " " for p in pieces[:-1]] + [pieces[-1]])]),
        middleware=[Timer()],
    )
    stream = agent.thread("s").stream("count")
    texts = [e.text for e in [ev async for ev in stream] if e.type == "text"]
    assert "".join(texts) == (await stream.reply()).text == answer
    assert len(texts) == len(pieces)
