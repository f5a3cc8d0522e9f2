"""Tool-call middleware (`wrap_tool_call`): where it runs relative to the `before_tool` /
`after_tool` hooks and to other middleware, changing the call, answering without the tool,
calling the handler twice, its errors under `on_tool_exception`, approvals, redaction,
and a cancellation while it awaits after the tool returned (the result is saved, the tool
never runs again)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import (
    Agent,
    Decision,
    FakeModel,
    FakeReply,
    FunctionModel,
    Hook,
    Redactor,
    Storage,
    ToolCall,
    ToolContext,
    ToolError,
    ToolExecutionError,
    ValidationError,
    tool,
)
from criogen_graph.graph.tools import ToolsNode
from criogen_graph.middleware import (
    Middleware,
    ModelCall,
    ModelHandler,
    ToolCallRequest,
    ToolHandler,
    model_middleware,
    tool_middleware,
)
from tests.conftest import storage_url

#: Event-loop iterations after the tool's return at which a cancellation lands.
K = 30


@tool
async def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@tool
async def get_time(city: str) -> str:
    """The time in a city."""
    return f"noon in {city}"


def _calls(*calls: tuple[str, dict[str, Any]]) -> FakeModel:
    """A model that makes the given tool calls (one per turn), then says "done"."""
    return FakeModel([*(FakeReply.tool_call(name, args) for name, args in calls), "done"])


def _tool_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    return [m for m in messages if m["role"] == "tool"]


class Trace(Middleware):
    def __init__(self, label: str, log: list[str]) -> None:
        self.label = label
        self.log = log

    async def wrap_tool_call(self, call: ToolCallRequest, handler: ToolHandler) -> Any:
        self.log.append(f"{self.label}:in {call.name} {call.args}")
        result = await handler(call)
        self.log.append(f"{self.label}:out {result}")
        return result


class TraceHook(Hook):
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def before_tool(self, call: ToolCall) -> ToolCall:
        self.log.append(f"before_tool {call.args}")
        return ToolCall(call.call_id, call.name, {"city": call.args["city"].upper()})

    def after_tool(self, call: ToolCall, result: Any) -> Any:
        self.log.append(f"after_tool {result}")
        return f"{result}!"


async def test_middleware_runs_between_the_tool_hooks_first_outermost() -> None:
    log: list[str] = []

    @tool
    async def weather(city: str) -> str:
        """The weather in a city."""
        log.append(f"tool {city}")
        return f"sunny in {city}"

    agent = Agent(
        _calls(("weather", {"city": "oslo"})),
        tools=[weather],
        hooks=[TraceHook(log)],
        middleware=[Trace("a", log), Trace("b", log)],
    )
    result = await agent.run("go")
    assert log == [
        "before_tool {'city': 'oslo'}",
        "a:in weather {'city': 'OSLO'}",  # after the hook's change
        "b:in weather {'city': 'OSLO'}",
        "tool OSLO",
        "b:out sunny in OSLO",
        "a:out sunny in OSLO",
        "after_tool sunny in OSLO",
    ]
    (msg,) = _tool_messages(result.messages)
    assert msg["content"] == "sunny in OSLO!" and msg["status"] == "ok"
    assert "tool" not in msg


async def test_a_model_only_middleware_builds_no_tool_chain() -> None:
    async def passthrough(call: ModelCall, handler: ModelHandler) -> Any:
        return await handler(call)

    async def tools_too(call: ToolCallRequest, handler: ToolHandler) -> Any:
        return await handler(call)

    plain = Agent(FakeModel(["x"]), middleware=[model_middleware(passthrough), Middleware()])
    assert ToolsNode(plain.spec).wrappers == ()
    wrapped = Agent(FakeModel(["x"]), middleware=[model_middleware(passthrough)])
    with_tools = Agent(FakeModel(["x"]), middleware=[tool_middleware(tools_too)])
    assert ToolsNode(wrapped.spec).wrappers == ()
    assert len(ToolsNode(with_tools.spec).wrappers) == 1


async def test_middleware_changes_the_args() -> None:
    @tool_middleware
    async def to_rome(call: ToolCallRequest, handler: ToolHandler) -> Any:
        return await handler(call.replace(args={"city": "Rome"}))

    agent = Agent(
        _calls(("get_weather", {"city": "Oslo"})), tools=[get_weather], middleware=[to_rome]
    )
    result = await agent.run("go")
    (msg,) = _tool_messages(result.messages)
    assert msg["content"] == "sunny in Rome" and msg["status"] == "ok"
    # The transcript keeps the model's own call.
    call: Any = result.messages[1]
    assert call["tool_calls"][0]["args"] == {"city": "Oslo"}


async def test_args_a_middleware_breaks_get_the_usual_invalid_args_message() -> None:
    @tool_middleware
    async def breaks(call: ToolCallRequest, handler: ToolHandler) -> Any:
        return await handler(call.replace(args={"town": 3}))

    plain = await Agent(_calls(("get_weather", {"town": 3})), tools=[get_weather]).run("go")
    broken = await Agent(
        _calls(("get_weather", {"city": "Oslo"})), tools=[get_weather], middleware=[breaks]
    ).run("go")
    (expected,) = _tool_messages(plain.messages)
    (msg,) = _tool_messages(broken.messages)
    assert msg["content"].startswith("Error: invalid arguments for get_weather: ")
    assert msg["content"] == expected["content"]
    assert msg["status"] == "error" and msg["error_kind"] == "invalid_args"


async def test_a_middleware_sees_invalid_args_and_can_fix_them() -> None:
    seen: list[str] = []

    @tool_middleware
    async def fixer(call: ToolCallRequest, handler: ToolHandler) -> Any:
        from criogen_graph.tools import ToolArgumentsError

        try:
            return await handler(call)
        except ToolArgumentsError as exc:
            seen.append(str(exc))
            return await handler(call.replace(args={"city": "Paris"}))

    result = await Agent(
        _calls(("get_weather", {"town": "Paris"})), tools=[get_weather], middleware=[fixer]
    ).run("go")
    assert _tool_messages(result.messages)[0]["content"] == "sunny in Paris"
    assert len(seen) == 1 and "invalid arguments for get_weather" in seen[0]


async def test_a_cache_answers_without_running_the_tool() -> None:
    ran: list[str] = []

    @tool
    async def expensive(q: str) -> dict[str, str]:
        """Compute something costly."""
        ran.append(q)
        return {"answer": q.upper()}

    class Cache(Middleware):
        def __init__(self) -> None:
            self.seen: dict[str, Any] = {}

        async def wrap_tool_call(self, call: ToolCallRequest, handler: ToolHandler) -> Any:
            key = f"{call.name}:{sorted(call.args.items())}"
            if key not in self.seen:
                self.seen[key] = await handler(call)
            return self.seen[key]

    cache = Cache()
    agent = Agent(
        _calls(("expensive", {"q": "a"}), ("expensive", {"q": "a"}), ("expensive", {"q": "b"})),
        tools=[expensive],
        middleware=[cache],
    )
    result = await agent.run("go")
    assert ran == ["a", "b"]  # the second "a" came from the cache
    msgs = _tool_messages(result.messages)
    assert [m["content"] for m in msgs] == [
        '{"answer": "A"}',
        '{"answer": "A"}',
        '{"answer": "B"}',
    ]
    # A value a middleware gives is the call's result: `ok`.
    assert [m["status"] for m in msgs] == ["ok", "ok", "ok"]
    assert result.usage is not None


async def test_a_retry_middleware_calls_the_handler_twice() -> None:
    attempts: list[int] = []

    @tool
    async def flaky(n: int) -> str:
        """Fails the first time."""
        attempts.append(n)
        if len(attempts) == 1:
            raise ConnectionError("reset")
        return f"got {n}"

    @tool_middleware
    async def retry_once(call: ToolCallRequest, handler: ToolHandler) -> Any:
        try:
            return await handler(call)
        except ConnectionError:
            return await handler(call)

    result = await Agent(_calls(("flaky", {"n": 1})), tools=[flaky], middleware=[retry_once]).run(
        "go"
    )
    assert attempts == [1, 1]
    (msg,) = _tool_messages(result.messages)
    assert msg["content"] == "got 1" and msg["status"] == "ok"


async def test_tool_error_from_middleware_goes_to_the_model() -> None:
    ran: list[str] = []

    @tool
    async def delete(path: str) -> str:
        """Delete a file."""
        ran.append(path)
        return "deleted"

    @tool_middleware
    async def guard(call: ToolCallRequest, handler: ToolHandler) -> Any:
        if call.args["path"].startswith("/etc"):
            raise ToolError(f"{call.args['path']} is protected")
        return await handler(call)

    result = await Agent(
        _calls(("delete", {"path": "/etc/passwd"}), ("delete", {"path": "/tmp/x"})),
        tools=[delete],
        middleware=[guard],
    ).run("go")
    first, second = _tool_messages(result.messages)
    assert first["content"] == "Error: /etc/passwd is protected"
    assert first["status"] == "error" and "error_kind" not in first
    assert second["content"] == "deleted"
    assert ran == ["/tmp/x"]


@pytest.mark.parametrize("policy", ["return_to_model", "return_generic", "fail"])
@pytest.mark.parametrize("when", ["before", "after"])
async def test_other_exceptions_from_middleware_follow_on_tool_exception(
    policy: str, when: str
) -> None:
    """A middleware's own exception is the tool's failure, before or after the tool."""
    ran: list[str] = []

    @tool
    async def pay(amount: int) -> str:
        """Pay."""
        ran.append("pay")
        return "paid"

    @tool_middleware
    async def broken(call: ToolCallRequest, handler: ToolHandler) -> Any:
        if when == "after":
            await handler(call)
        raise KeyError("ledger")

    agent = Agent(
        _calls(("pay", {"amount": 5})),
        tools=[pay],
        middleware=[broken],
        on_tool_exception=policy,
    )
    if policy == "fail":
        with pytest.raises(ToolExecutionError) as info:
            await agent.run("go")
        assert isinstance(info.value.__cause__, KeyError)
        assert ("ran, then failed" in str(info.value)) == (when == "after")
        return
    result = await agent.run("go")
    (msg,) = _tool_messages(result.messages)
    assert msg["status"] == "error"
    if policy == "return_to_model":
        assert msg["content"] == "Error: KeyError: 'ledger'"
    else:
        assert msg["content"] == "Error: the tool pay failed."
        assert msg["artifact"] == {"error": "KeyError: 'ledger'"}
    assert ran == (["pay"] if when == "after" else [])


async def test_a_failure_after_the_tool_ran_is_saved_and_retry_does_not_run_it_again(
    tmp_path: Path,
) -> None:
    """`on_tool_exception="fail"`: a middleware that raises after the tool returned fails
    the run, but the call is finished: `retry()` goes on without paying again."""
    paid: list[int] = []
    fail = [True]

    @tool
    async def pay(amount: int) -> str:
        """Pay."""
        paid.append(amount)
        return "paid"

    @tool_middleware
    async def audit(call: ToolCallRequest, handler: ToolHandler) -> Any:
        result = await handler(call)
        if fail[0]:
            raise RuntimeError("audit log unreachable")
        return result

    storage = Storage(f"sqlite:///{tmp_path}/t.db")
    agent = Agent(
        _calls(("pay", {"amount": 5})),
        tools=[pay],
        middleware=[audit],
        on_tool_exception="fail",
        storage=storage,
    )
    thread = agent.thread("audit")
    try:
        with pytest.raises(ToolExecutionError):
            await thread.send("pay")
        fail[0] = False
        reply = await thread.retry()
        assert reply.text == "done"
        assert paid == [5]
        (msg,) = _tool_messages(await thread.messages())
        assert msg["content"] == "Error: RuntimeError: audit log unreachable"
    finally:
        await storage.close()


async def test_middleware_can_run_another_tool() -> None:
    log: list[str] = []

    @tool_middleware
    async def swap_tool(call: ToolCallRequest, handler: ToolHandler) -> Any:
        log.append(call.context.tool)
        return await handler(call.replace(tool=get_time))

    @tool_middleware
    async def swap_name(call: ToolCallRequest, handler: ToolHandler) -> Any:
        return await handler(call.replace(name="get_time"))

    @tool_middleware
    async def unknown(call: ToolCallRequest, handler: ToolHandler) -> Any:
        return await handler(call.replace(name="nope"))

    for middleware in (swap_tool, swap_name):
        result = await Agent(
            _calls(("get_weather", {"city": "Oslo"})),
            tools=[get_weather, get_time],
            middleware=[middleware],
        ).run("go")
        (msg,) = _tool_messages(result.messages)
        assert msg["content"] == "noon in Oslo"
        assert msg["name"] == "get_weather" and msg["tool"] == "get_time"
    assert log == ["get_weather"]
    result = await Agent(
        _calls(("get_weather", {"city": "Oslo"})), tools=[get_weather], middleware=[unknown]
    ).run("go")
    (msg,) = _tool_messages(result.messages)
    assert msg["status"] == "error" and msg["error_kind"] == "unknown_tool"
    assert msg["content"] == "Error: there is no tool named 'nope'. Available tools: get_weather."


async def test_the_tool_sees_which_tool_it_runs_as() -> None:
    contexts: list[str] = []

    @tool
    async def whoami(city: str, ctx: ToolContext) -> str:
        """Say which tool runs."""
        contexts.append(ctx.tool)
        return ctx.tool

    @tool_middleware
    async def swap(call: ToolCallRequest, handler: ToolHandler) -> Any:
        return await handler(call.replace(tool=whoami))

    await Agent(
        _calls(("get_weather", {"city": "Oslo"})), tools=[get_weather], middleware=[swap]
    ).run("go")
    assert contexts == ["whoami"]


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_middleware_on_an_approved_tool_runs_after_the_decision(
    backend: str, tmp_path: Path
) -> None:
    log: list[str] = []
    paid: list[int] = []

    @tool
    async def pay(amount: int) -> str:
        """Pay an amount."""
        paid.append(amount)
        return f"paid {amount}"

    storage = Storage(storage_url(backend, tmp_path))
    agent = Agent(
        _calls(("pay", {"amount": 500}), ("pay", {"amount": 7})),
        tools=[pay],
        approve=["pay"],
        middleware=[Trace("m", log)],
        storage=storage,
    )
    thread = agent.thread("approved")
    try:
        reply = await thread.send("pay")
        assert reply.needs_approval and log == []
        (pending,) = reply.approvals
        reply = await thread.decide({pending.call_id: Decision.edit({"amount": 50})})
        assert log == ["m:in pay {'amount': 50}", "m:out paid 50"]
        assert paid == [50]
        assert reply.needs_approval  # the second call
        log.clear()
        reply = await thread.decide({reply.approvals[0].call_id: "reject"})
        assert log == [] and paid == [50]  # a rejected call reaches no middleware
        assert reply.text == "done"
    finally:
        await storage.close()


async def test_what_a_middleware_returns_is_redacted() -> None:
    @tool_middleware
    async def enrich(call: ToolCallRequest, handler: ToolHandler) -> Any:
        result = await handler(call)
        return {"weather": result, "contact": "ops@example.com"}

    result = await Agent(
        _calls(("get_weather", {"city": "Oslo"})),
        tools=[get_weather],
        middleware=[enrich],
        redact=Redactor.pii(),
    ).run("go")
    (msg,) = _tool_messages(result.messages)
    assert "ops@example.com" not in msg["content"]
    assert "sunny in Oslo" in msg["content"]


async def test_a_middleware_raising_cancelled_error_itself_is_its_failure() -> None:
    @tool_middleware
    async def odd(call: ToolCallRequest, handler: ToolHandler) -> Any:
        raise asyncio.CancelledError()

    result = await Agent(
        _calls(("get_weather", {"city": "Oslo"})), tools=[get_weather], middleware=[odd]
    ).run("go")
    (msg,) = _tool_messages(result.messages)
    assert msg["status"] == "error"
    assert "a middleware raised asyncio.CancelledError" in msg["content"]


def _after(k: int, fn: Callable[[], object]) -> None:
    """Call `fn` k event-loop iterations from now (k = 0: now)."""
    if k <= 0:
        fn()
        return
    asyncio.get_running_loop().call_soon(_after, k - 1, fn)


async def _settle(thread: Any) -> None:
    """Retry whatever a cancellation left unfinished."""
    for _ in range(4):
        try:
            await thread.retry()
        except ValidationError as exc:
            if exc.code != "nothing_to_retry":
                raise
            return
    raise AssertionError("the thread did not settle")


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_a_cancellation_while_a_middleware_awaits_after_the_tool_keeps_its_result(
    backend: str, tmp_path: Path
) -> None:
    """The run is cancelled k event-loop iterations after the tool returned, while the
    middleware still awaits: the middleware finishes, its result is saved, and `retry()`
    never runs the tool again."""
    paid: Counter[str] = Counter()
    victim: list[asyncio.Task[Any]] = []
    k_now = [0]

    @tool
    async def pay(amount: int, ctx: ToolContext) -> str:
        """Pay an amount."""
        await asyncio.sleep(0)
        paid[ctx.call_id] += 1
        if victim:
            _after(k_now[0], victim.pop().cancel)
        return f"paid {amount}"

    @tool_middleware
    async def receipt(call: ToolCallRequest, handler: ToolHandler) -> Any:
        result = await handler(call)
        for _ in range(8):  # e.g. writing an audit record
            await asyncio.sleep(0)
        return f"{result} (receipt)"

    def model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if messages[-1]["role"] == "tool":
            return "Paid."
        return FakeReply.tool_call("pay", {"amount": 50})

    storage = Storage(storage_url(backend, tmp_path))
    agent = Agent(FunctionModel(model), tools=[pay], middleware=[receipt], storage=storage)
    outcomes: Counter[str] = Counter()
    try:
        for k in range(K + 1):
            thread = agent.thread(f"cancel-{k}")
            task = asyncio.ensure_future(thread.send("pay 50"))
            victim[:] = [task]
            k_now[0] = k
            try:
                await task
                outcomes["completed"] += 1
            except asyncio.CancelledError:
                assert task.cancelled()
                outcomes["cancelled"] += 1
            victim.clear()
            await _settle(thread)
            messages = await thread.messages()
            assert messages[-1]["content"] == "Paid."
            (msg,) = _tool_messages(messages)
            assert msg["status"] == "ok" and msg["content"] == "paid 50 (receipt)", (k, msg)
    finally:
        await storage.close()
    assert len(paid) == K + 1 and set(paid.values()) == {1}, paid
    # The cancellation landed inside the middleware's awaits for the first k at least.
    assert outcomes["cancelled"] >= 8, outcomes


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_a_cancellation_before_the_tool_finished_passes_through(
    backend: str, tmp_path: Path
) -> None:
    """Cancelled while the tool awaits inside the middleware: the tool is stopped, nothing
    is saved for the call, and `retry()` runs it (once)."""
    entered = asyncio.Event()
    runs: list[str] = []

    @tool
    async def slow(ctx: ToolContext) -> str:
        """Take a while the first time."""
        runs.append(ctx.call_id)
        if len(runs) == 1:
            entered.set()
            await asyncio.Event().wait()
        return "finished"

    seen: list[str] = []

    @tool_middleware
    async def watch(call: ToolCallRequest, handler: ToolHandler) -> Any:
        try:
            return await handler(call)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    storage = Storage(storage_url(backend, tmp_path))
    agent = Agent(_calls(("slow", {})), tools=[slow], middleware=[watch], storage=storage)
    thread = agent.thread("slow")
    try:
        task = asyncio.ensure_future(thread.send("go"))
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert seen == ["cancelled"]
        assert _tool_messages(await thread.messages()) == []
        reply = await thread.retry()
        assert reply.text == "done"
        (msg,) = _tool_messages(await thread.messages())
        assert msg["content"] == "finished"
        assert len(runs) == 2 and runs[0] == runs[1]
    finally:
        await storage.close()


async def test_streamed_events_of_a_call_through_middleware() -> None:
    """One `tool_call_started` per call however often the handler runs (it names the
    tool that starts, with its checked args); `tool_call_finished` names the tool that
    ran; a cached answer starts no tool."""
    calls: list[str] = []

    @tool
    async def flaky(city: str) -> str:
        """Fails the first time."""
        calls.append(city)
        if len(calls) == 1:
            raise ConnectionError("reset")
        return f"rain in {city}"

    @tool_middleware
    async def retry_as_flaky(call: ToolCallRequest, handler: ToolHandler) -> Any:
        if call.args.get("city") == "cached":
            return "from cache"
        call = call.replace(tool=flaky)
        try:
            return await handler(call)
        except ConnectionError:
            return await handler(call)

    agent = Agent(
        _calls(("get_weather", {"city": "Oslo"}), ("get_weather", {"city": "cached"})),
        tools=[get_weather],
        middleware=[retry_as_flaky],
    )
    events = [e async for e in agent.thread("streamed").stream("go")]
    started = [e for e in events if e.type == "tool_call_started"]
    finished = [e for e in events if e.type == "tool_call_finished"]
    assert [(e.tool, e.args) for e in started] == [("flaky", {"city": "Oslo"})]
    assert [(e.tool, e.status) for e in finished] == [("flaky", "ok"), ("get_weather", "ok")]
    assert calls == ["Oslo", "Oslo"]


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_a_cancelled_send_waits_for_a_stuck_middleware_at_most_the_tool_timeout(
    backend: str, tmp_path: Path
) -> None:
    """A middleware that awaits forever after its handler returned (an audit sink that
    never answers): the cancelled `send` ends with CancelledError once the tool's timeout
    has passed, the middleware is cancelled, the tool's own result is saved, and
    `retry()` never runs the tool again."""
    paid: list[int] = []
    tool_done = asyncio.Event()
    left = asyncio.Event()

    @tool(timeout_secs=0.3)
    async def pay(amount: int) -> str:
        """Pay."""
        paid.append(amount)
        tool_done.set()
        return f"paid {amount}"

    @tool_middleware
    async def stuck(call: ToolCallRequest, handler: ToolHandler) -> Any:
        result = await handler(call)
        try:
            await asyncio.Event().wait()
        finally:
            left.set()
        return result

    storage = Storage(storage_url(backend, tmp_path))
    agent = Agent(
        FakeModel([FakeReply.tool_call("pay", {"amount": 5}), "Paid."]),
        tools=[pay],
        middleware=[stuck],
        storage=storage,
    )
    thread = agent.thread("stuck")
    try:
        task = asyncio.ensure_future(thread.send("pay 5"))
        await tool_done.wait()
        started = asyncio.get_running_loop().time()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(task), 10)
        waited = asyncio.get_running_loop().time() - started
        assert task.cancelled()
        assert 0.2 <= waited < 5, waited
        await asyncio.wait_for(left.wait(), 5)  # the middleware was cancelled, not leaked
        (msg,) = _tool_messages(await thread.messages())
        assert msg["content"] == "paid 5" and msg["status"] == "ok"
        reply = await thread.retry()
        assert reply.text == "Paid."
        assert paid == [5]
    finally:
        await storage.close()
