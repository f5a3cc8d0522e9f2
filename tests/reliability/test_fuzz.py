"""Property-based fuzzing of public inputs (hypothesis): storage URLs and options, approval
decisions, the tool calls a model writes, model outputs, and what hooks return.

Each property asserts that only documented errors come out (subclasses of `CriogenError`,
or the `TypeError` documented for a value of the wrong Python type) and, for approvals,
that a refused answer leaves the stored thread exactly as it was. Every example runs in
one event loop per test (`asyncio.Runner`), so storages stay open across examples.
The tests at the end pin library bugs these properties found (fixed).
"""

from __future__ import annotations

import asyncio
import math
import os
import sqlite3
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.types import Command

from criogen_graph import (
    Agent,
    Approval,
    CriogenError,
    Decision,
    FakeReply,
    FunctionModel,
    HookAction,
    HookContext,
    HookFailedError,
    LimitExceededError,
    Limits,
    ModelError,
    Retry,
    RunResult,
    Storage,
    StorageError,
    ToolCall,
    ToolContext,
    ToolError,
    ToolExecutionError,
    ToolResult,
    ValidationError,
    tool,
)
from criogen_graph.errors import MODEL_ERROR_KINDS
from tests.reliability._report import report

Strategy = st.SearchStrategy[Any]

# Shared settings: no example database (nothing written into the repository), no
# per-example deadline (the machine is shared), and the slow-data health checks off
# (each example is a whole agent run).
FUZZ = settings(
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
)

STOP_REASONS = {"final_answer", "output", "return_direct", "content_filter", "hook_end"}

# -- strategies shared by the properties ---------------------------------------------------

TEXT = st.text(max_size=16)  # any code point but lone surrogates, NUL included
# For storage URLs: no NUL and no lone surrogates (those are a known bug there, pinned by
# test_storage_url_with_unencodable_characters_is_a_storage_error).
URL_TEXT = st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=16)
SCALARS: Strategy = (
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
JSON: Strategy = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(TEXT, children, max_size=3),
    max_leaves=8,
)
JSON_DICTS: Strategy = st.dictionaries(TEXT, JSON, max_size=4)


def label(exc: BaseException) -> str:
    """`ErrorType(code)`, for the counts."""
    code = getattr(exc, "code", None)
    return f"{type(exc).__name__}({code})" if code else type(exc).__name__


async def outcome_of(run: Awaitable[RunResult[Any]]) -> RunResult[Any] | CriogenError:
    """The run's result, or the documented error it raised (anything else propagates)."""
    try:
        return await run
    except CriogenError as exc:
        return exc


@contextmanager
def cwd(path: Path) -> Iterator[None]:
    """Run with `path` as the current directory (relative SQLite URLs land there)."""
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


# == 1. storage URLs and options ===========================================================

KNOWN_SCHEMES = ("memory", "sqlite", "postgres", "postgresql")

NEAR_MISSES = [
    "",
    ":",
    "://",
    "memory",
    "mem://",
    "sqlite",
    "sqlite:",
    "sqlite:/x.db",
    "sqlite:x.db",
    "sqlite:///",
    "sqlite//x.db",
    "sqlite3:///x.db",
    "sqlit:///x.db",
    " sqlite:///x.db",
    "file:///x.db",
    "postgres",
    "postgres:",
    "postgres:/x",
    "postgres:x",
    "postgresql:",
    "postgresql:/127.0.0.1/x",
    "postgre://127.0.0.1/x",
    "postgress://127.0.0.1/x",
    "pg://127.0.0.1/x",
    "http://127.0.0.1:5432/x",
]


def _scheme(url: str) -> str:
    return url.split(":", 1)[0].lower() if ":" in url else ""


@st.composite
def random_case(draw: st.DrawFn, text: str) -> str:
    flips = draw(st.lists(st.booleans(), min_size=len(text), max_size=len(text)))
    return "".join(c.upper() if f else c for c, f in zip(text, flips, strict=True))


SEGMENT = st.text(
    st.characters(exclude_characters="\x00/", exclude_categories=["Cs"]), min_size=1, max_size=12
).filter(lambda s: s not in (".", ".."))


@st.composite
def sqlite_urls(draw: st.DrawFn, root: Path) -> str:
    """SQLite URLs whose file is always inside `root` (the current directory)."""
    rel = "/".join(draw(st.lists(SEGMENT, min_size=1, max_size=3)))
    form = draw(st.sampled_from(["sqlite:///{rel}", "sqlite://{rel}", "sqlite:///{root}/{rel}"]))
    url = form.format(rel=rel, root=root)
    # (No trailing "/": a failed open then leaks its connections, a known bug pinned by
    # test_a_failed_sqlite_open_leaves_no_connection_open, and the leaked connections make
    # later opens of the same file flaky.)
    if draw(st.booleans()):
        url += "?" + draw(st.text(max_size=12))  # queries are ignored, even with NUL
    return url


QUERY_KEYS = st.sampled_from(
    ["sslmode", "application_name", "options", "target_session_attrs", "keepalives", "gssencmode"]
) | URL_TEXT.filter(lambda k: k.lower() not in ("host", "hostaddr", "connect_timeout", "port"))


@st.composite
def postgres_urls(draw: st.DrawFn) -> str:
    """PostgreSQL URLs on 127.0.0.1 (no DNS) that do not name a database that exists, so
    none opens, whatever runs there; each fails fast."""
    scheme = draw(st.sampled_from(["postgres", "postgresql"]))
    user = quote(draw(URL_TEXT), safe="")
    port = draw(st.sampled_from(["", ":1", ":5432", ":99999", ":abc", ":-1"]))
    db = "criogen_nodb_" + quote(draw(URL_TEXT), safe="")
    url = f"{scheme}://{user}{'@' if user else ''}127.0.0.1{port}/{db}"
    params = draw(st.lists(st.tuples(QUERY_KEYS, URL_TEXT), max_size=2))
    if params:
        url += "?" + "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in params)
    return url


async def try_open(url: str, **options: Any) -> str:
    """Open and close a storage: `"opened"`, or the documented error's label. Anything
    else propagates and fails the property."""
    try:
        storage = Storage(url, **options)
    except (CriogenError, TypeError) as exc:
        return label(exc)
    try:
        await storage.open()
    except CriogenError as exc:
        return label(exc)
    finally:
        await storage.close()
    return "opened"


def test_storage_urls_only_raise_storage_errors(tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("urls")
    tally: Counter[str] = Counter()

    urls = (
        URL_TEXT.filter(lambda u: _scheme(u) not in KNOWN_SCHEMES).map(lambda u: ("random", u))
        | st.sampled_from(NEAR_MISSES).flatmap(random_case).map(lambda u: ("near_miss", u))
        | sqlite_urls(root).map(lambda u: ("sqlite", u))
        | postgres_urls().map(lambda u: ("postgres", u))
    )

    with cwd(root), asyncio.Runner() as runner:

        @settings(FUZZ, max_examples=160)
        @given(urls)
        def check(kind_url: tuple[str, str]) -> None:
            kind, url = kind_url
            outcome = runner.run(try_open(url))
            tally[f"{kind}:{outcome}"] += 1
            if kind == "random" and _scheme(url) != "memory":
                # Not one of the four schemes: refused before anything is opened.
                assert outcome == "StorageError(invalid_url)", url
            elif kind == "postgres":
                assert outcome.startswith("StorageError"), url
            else:
                assert outcome == "opened" or outcome.startswith("StorageError"), url

        check()

    assert sum(n for k, n in tally.items() if k.startswith("random:StorageError")) > 0
    report(
        "fuzz_storage_urls",
        examples=sum(tally.values()),
        **{k.replace(":", "__"): v for k, v in sorted(tally.items())},
    )


def mostly(valid: Strategy, invalid: Strategy) -> Strategy:
    """`valid` three times in four: most examples then get past the other checks."""
    return st.integers(0, 3).flatmap(lambda n: invalid if n == 0 else valid)


ON_BUSY = mostly(st.sampled_from(["fail", "wait"]), JSON)
BUSY_TIMEOUT = mostly(
    st.integers(0, 100) | st.floats(0, 1e6) | st.just(math.inf),
    st.integers(-5, -1)
    | st.floats(max_value=-1e-9, allow_nan=False)
    | st.booleans()
    | st.none()
    | TEXT,
)
KEYS = mostly(
    st.none() | TEXT.filter(bool) | st.sampled_from([b"k" * 16, b"k" * 24, b"k" * 32]),
    st.just("")
    | st.binary(max_size=40).filter(lambda b: len(b) not in (16, 24, 32))
    | st.integers()
    | st.lists(st.integers(0, 255), max_size=3)
    | st.builds(bytearray, st.binary(min_size=16, max_size=16)),
)


def _options_valid(on_busy: Any, timeout: Any, key: Any) -> bool:
    if not (isinstance(on_busy, str) and on_busy in ("fail", "wait")):
        return False
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0:
        return False
    if key is None:
        return True
    if isinstance(key, str):
        return key != ""
    return isinstance(key, bytes) and len(key) in (16, 24, 32)


def test_storage_options_raise_documented_errors(tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("options")
    tally: Counter[str] = Counter()

    with asyncio.Runner() as runner:

        @settings(FUZZ, max_examples=120)
        @given(on_busy=ON_BUSY, timeout=BUSY_TIMEOUT, key=KEYS, sqlite=st.booleans())
        def check(on_busy: Any, timeout: Any, key: Any, sqlite: bool) -> None:
            url = f"sqlite:///{root}/{uuid.uuid4().hex}.db" if sqlite else "memory://"
            outcome = runner.run(
                try_open(url, on_busy=on_busy, busy_timeout_secs=timeout, encryption_key=key)
            )
            tally[outcome] += 1
            if _options_valid(on_busy, timeout, key):
                assert outcome == "opened", (on_busy, timeout, key)
            else:
                assert outcome == "TypeError" or outcome.startswith("ValidationError"), (
                    on_busy,
                    timeout,
                    key,
                    outcome,
                )

        check()

    report("fuzz_storage_options", examples=sum(tally.values()), **dict(sorted(tally.items())))


def _echo_agent(storage: Storage) -> Agent[Any]:
    return Agent(FunctionModel(lambda messages, tools: "noted"), storage=storage)


def test_wrong_encryption_keys_change_nothing(tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("keys")
    url = f"sqlite:///{root}/sealed.db"
    right = "the right key"
    tally: Counter[str] = Counter()

    async def saved() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with Storage(url, encryption_key=right) as storage:
            thread = _echo_agent(storage).thread("sealed")
            return await thread.messages(), await thread.history(limit=100)

    async def setup() -> None:
        async with Storage(url, encryption_key=right) as storage:
            await _echo_agent(storage).thread("sealed").send("a secret")

    async def attempt(key: str | bytes | None) -> str:
        storage = Storage(url, encryption_key=key)
        try:
            await _echo_agent(storage).thread("sealed").send("must not be saved")
        except StorageError as exc:
            return label(exc)
        finally:
            await storage.close()
        return "sent"

    with asyncio.Runner() as runner:
        runner.run(setup())
        before = runner.run(saved())
        assert [m["content"] for m in before[0]] == ["a secret", "noted"]

        @settings(FUZZ, max_examples=25)
        @given(
            key=st.none()
            | TEXT.filter(lambda k: k not in ("", right))
            | st.binary(min_size=16, max_size=16)
        )
        def check(key: str | bytes | None) -> None:
            outcome = runner.run(attempt(key))
            tally[outcome] += 1
            assert outcome == "StorageError(encryption)"
            assert runner.run(saved()) == before

        check()

    report("fuzz_encryption_keys", examples=sum(tally.values()), **dict(tally))


# == 2. approval decisions =================================================================

GATED = ("c-refund", "c-partial")


def _approval_agent(storage: Storage, ledger: list[str]) -> Agent[Any]:
    @tool
    async def refund(order_id: str, amount: float = 0) -> str:
        """Refund an order."""
        ledger.append(f"refund {order_id} {amount:g}")
        return f"refunded {order_id}"

    @tool
    async def partial(order_id: str, amount: float) -> str:
        """Refund part of an order."""
        ledger.append(f"partial {order_id} {amount:g}")
        return f"partly refunded {order_id}"

    @tool
    async def lookup(order_id: str) -> str:
        """Look an order up."""
        ledger.append(f"lookup {order_id}")
        return f"{order_id}: delivered"

    def model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if messages[-1]["role"] == "user":
            return FakeReply.tool_calls(
                {"name": "refund", "args": {"order_id": "A-1"}, "id": "c-refund"},
                {"name": "partial", "args": {"order_id": "B-2", "amount": 5}, "id": "c-partial"},
                {"name": "lookup", "args": {"order_id": "C-3"}, "id": "c-lookup"},
            )
        return "results: " + " / ".join(m["content"] for m in messages if m["role"] == "tool")

    return Agent(
        FunctionModel(model),
        tools=[refund, partial, lookup],
        approve=["refund", Approval("partial", allowed=["approve", "reject"])],
        storage=storage,
    )


# Decisions that are fine for each pending call (to fill the calls a bad answer leaves
# alone, so that the only thing wrong is the drawn one).
GOOD_REFUND: Strategy = st.sampled_from(
    [
        Decision.approve(),
        "approve",
        "reject",
        {"type": "approve"},
        Decision.reject("no"),
        Decision.respond("answered by hand"),
        Decision.edit({"order_id": "A-1", "amount": 1}),
    ]
)
GOOD_PARTIAL: Strategy = st.sampled_from([Decision.approve(), "reject", {"type": "reject"}])

# Edited args that never fit refund(order_id: str, amount: float = 0).
NOT_STR = st.none() | st.booleans() | st.integers() | st.lists(SCALARS, max_size=2) | JSON_DICTS
BAD_REFUND_ARGS: Strategy = (
    st.dictionaries(TEXT.filter(lambda k: k != "order_id"), JSON, max_size=3)
    | st.fixed_dictionaries({"order_id": NOT_STR})
    | st.fixed_dictionaries({"order_id": TEXT}, optional={"amount": st.just(0)}).flatmap(
        lambda base: st.dictionaries(
            TEXT.filter(lambda k: k not in ("order_id", "amount")), JSON, min_size=1, max_size=2
        ).map(lambda extra: {**base, **extra})
    )
    | st.fixed_dictionaries(
        {"order_id": TEXT, "amount": st.none() | st.lists(SCALARS, max_size=2) | JSON_DICTS}
    )
)
# (An empty name means "the same tool", so it is not unknown.)
UNKNOWN_TOOL = TEXT.filter(lambda n: n not in ("", "refund", "partial", "lookup"))


@st.composite
def bad_value_for_refund(draw: st.DrawFn) -> tuple[Any, type[Exception]]:
    """One decision for the refund call that must be refused, and the error it gets."""
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(TEXT.filter(lambda t: t not in ("approve", "reject"))), ValidationError
    if kind == 1:
        extra = draw(st.dictionaries(TEXT, JSON, max_size=2))
        bad_type = draw(JSON.filter(lambda t: t not in ("approve", "edit", "reject", "respond")))
        return {**extra, "type": bad_type}, ValidationError
    if kind == 2:
        message = draw(st.none() | st.integers() | st.lists(SCALARS, max_size=2))
        return {"type": "respond", "message": message}, ValidationError
    if kind == 3:
        message = draw(st.booleans() | st.integers() | st.lists(SCALARS, max_size=2) | JSON_DICTS)
        return {"type": "reject", "message": message}, ValidationError
    if kind == 4:
        args = draw(st.none() | TEXT | st.integers() | st.lists(SCALARS, max_size=2))
        return {"type": "edit", "args": args}, ValidationError
    if kind == 5:
        return {"type": "edit", "args": draw(BAD_REFUND_ARGS)}, ValidationError
    if kind == 6:
        return Decision.edit(draw(BAD_REFUND_ARGS)), ValidationError
    if kind == 7:
        return Decision.edit({"order_id": "A-1"}, name=draw(UNKNOWN_TOOL)), ValidationError
    if kind == 8:
        name = draw(st.integers() | st.lists(TEXT, max_size=2) | st.booleans())
        return {"type": "edit", "args": {"order_id": "A-1"}, "name": name}, ValidationError
    # Not a Decision, a dict or a str: the documented TypeError for a wrong Python type.
    return draw(st.none() | st.integers() | st.floats() | st.lists(JSON, max_size=2)), TypeError


BAD_FOR_PARTIAL: Strategy = st.sampled_from(
    [
        Decision.edit({"order_id": "B-2", "amount": 1}),
        Decision.respond("skip it"),
        {"type": "respond", "message": "skip it"},
        {"type": "edit", "args": {"order_id": "B-2", "amount": 1}},
    ]
)


@st.composite
def refused_answers(draw: st.DrawFn) -> tuple[str, Any, type[Exception]]:
    """`(method, argument, expected error)` for an answer that must change nothing."""
    kind = draw(st.integers(0, 7))
    good = {"c-refund": draw(GOOD_REFUND), "c-partial": draw(GOOD_PARTIAL)}
    if kind == 0:  # not a mapping at all
        return "decide", draw(JSON.filter(lambda v: not isinstance(v, dict))), ValidationError
    if kind == 1:  # keys that are no pending call (never "type": that is the one-for-all form)
        keys = st.text(max_size=12).filter(lambda k: k not in (*GATED, "type"))
        return "decide", draw(st.dictionaries(keys, JSON, max_size=3)), ValidationError
    if kind == 2:  # a wrong call id beside the right ones
        wrong = draw(st.text(max_size=12).filter(lambda k: k not in (*GATED, "type")))
        return "decide", {**good, wrong: Decision.approve()}, ValidationError
    if kind == 3:  # a pending call without a decision
        keep = draw(st.sampled_from(GATED))
        return "decide", {keep: good[keep]}, ValidationError
    if kind == 4:  # one bad decision among good ones
        value, error = draw(bad_value_for_refund())
        return "decide", {**good, "c-refund": value}, error
    if kind == 5:  # a decision outside `allowed`
        return "decide", {**good, "c-partial": draw(BAD_FOR_PARTIAL)}, ValidationError
    if kind == 6:  # one edit given for every pending call
        return "decide", {"type": "edit", "args": {"order_id": "A-1"}}, ValidationError
    message = draw(st.none() | st.integers() | st.lists(TEXT, max_size=2) | st.binary(max_size=4))
    return "reject", message, ValidationError


Snapshot = tuple[Any, ...]


async def snapshot(storage: Storage, thread_id: str, agent: Agent[Any]) -> Snapshot:
    thread = agent.thread(thread_id)
    return (
        await thread.history(limit=100),
        await thread.messages(),
        await thread.pending_approvals(),
        await storage.audit(thread_id),
    )


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_refused_decisions_change_nothing(
    backend: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("decisions")
    url = "memory://" if backend == "memory" else f"sqlite:///{root}/threads.db"
    storage = Storage(url)
    ledger: list[str] = []
    agent = _approval_agent(storage, ledger)
    thread_id = f"fuzz-{uuid.uuid4().hex}"
    tally: Counter[str] = Counter()

    with asyncio.Runner() as runner:
        reply = runner.run(agent.thread(thread_id, actor="fuzz").send("sort out my orders"))
        assert [a.call_id for a in reply.approvals] == list(GATED)
        before = runner.run(snapshot(storage, thread_id, agent))

        async def answer(method: str, arg: Any) -> None:
            thread = agent.thread(thread_id, actor="fuzz")
            if method == "reject":
                await thread.reject(arg)
            else:
                await thread.decide(arg)

        @settings(FUZZ, max_examples=110)
        @given(refused_answers())
        def check(case: tuple[str, Any, type[Exception]]) -> None:
            method, arg, expected = case
            with pytest.raises(expected) as info:
                runner.run(answer(method, arg))
            assert type(info.value) is expected, info.value
            tally[label(info.value)] += 1
            assert runner.run(snapshot(storage, thread_id, agent)) == before
            assert ledger == []

        check()

        # Still suspended and answerable: a correct decision completes the run.
        done = runner.run(
            agent.thread(thread_id, actor="fuzz").decide(
                {
                    "c-refund": Decision.edit({"order_id": "A-1", "amount": 2}),
                    "c-partial": Decision.reject("not this one"),
                }
            )
        )
        runner.run(storage.close())

    assert done.stop_reason == "final_answer" and not done.needs_approval
    assert sorted(ledger) == ["lookup C-3", "refund A-1 2"]
    statuses = [m["status"] for m in done.messages if m["role"] == "tool"]
    assert statuses == ["ok", "rejected", "ok"]
    report(
        f"fuzz_decisions_{backend}",
        refused=sum(tally.values()),
        changed_threads=0,
        tools_run_before_decision=0,
        **dict(sorted(tally.items())),
    )


# == 3. tool arguments the model writes ====================================================

SEARCH_SCHEMA = {
    "type": "object",
    "properties": {
        "q": {"type": "string", "minLength": 1},
        "limit": {"type": "integer", "minimum": 1, "maximum": 10},
    },
    "required": ["q"],
    "additionalProperties": False,
}

VALID_ORDER: Strategy = st.fixed_dictionaries(
    {"order_id": TEXT}, optional={"qty": st.integers(-100, 100)}
)
VALID_SEARCH: Strategy = st.fixed_dictionaries(
    {"q": TEXT.filter(bool)}, optional={"limit": st.integers(1, 10)}
)
NEAR_MISS_ARGS: Strategy = (
    st.fixed_dictionaries({"order_id": NOT_STR})
    | st.fixed_dictionaries({"order_id": TEXT, "qty": st.floats(0.1, 0.9) | TEXT | JSON_DICTS})
    | st.fixed_dictionaries({"q": st.just("")})
    | st.fixed_dictionaries({"q": TEXT, "limit": st.integers(11, 1000) | st.integers(-100, 0)})
    | st.fixed_dictionaries({"q": TEXT, "unexpected": JSON})
)


@st.composite
def model_calls(draw: st.DrawFn) -> list[dict[str, Any]]:
    """1-4 tool calls as a model might write them: valid, near misses, random args, and
    names no tool has."""
    calls = []
    for i in range(draw(st.integers(1, 4))):
        kind = draw(st.integers(0, 4))
        if kind == 0:
            name, args, valid = "order", draw(VALID_ORDER), True
        elif kind == 1:
            name, args, valid = "search", draw(VALID_SEARCH), True
        elif kind == 2:
            name, args, valid = (
                draw(st.sampled_from(["order", "search"])),
                draw(NEAR_MISS_ARGS),
                None,
            )
        elif kind == 3:
            name, args, valid = draw(st.sampled_from(["order", "search"])), draw(JSON_DICTS), None
        else:
            name = draw(st.text(max_size=20).filter(lambda n: n not in ("order", "search")))
            args, valid = draw(JSON_DICTS), False
        calls.append({"id": f"call-{i}", "name": name, "args": args, "valid": valid})
    return calls


def _order_args_ok(order_id: Any, qty: Any) -> bool:
    return isinstance(order_id, str) and isinstance(qty, int)


def _search_args_ok(args: Mapping[str, Any]) -> bool:
    q, limit = args.get("q"), args.get("limit", 1)
    return (
        set(args) <= {"q", "limit"}
        and isinstance(q, str)
        and len(q) >= 1
        and not isinstance(limit, bool)
        and isinstance(limit, int | float)
        and float(limit).is_integer()
        and 1 <= limit <= 10
    )


def test_tool_arguments_from_the_model_never_reach_a_tool_invalid() -> None:
    ran: list[tuple[str, str, bool]] = []  # (call id, tool, args were valid)
    tally: Counter[str] = Counter()

    @tool
    async def order(order_id: str, ctx: ToolContext, qty: int = 1) -> str:
        """Place an order."""
        ran.append((ctx.call_id, "order", _order_args_ok(order_id, qty)))
        return f"ordered {qty} x {order_id}"

    def search_run(args: dict[str, Any], ctx: ToolContext) -> str:
        ran.append((ctx.call_id, "search", _search_args_ok(args)))
        return f"found {args['q']}"

    search = tool(name="search", description="Search.", input=SEARCH_SCHEMA, run=search_run)

    with asyncio.Runner() as runner:

        @settings(FUZZ, max_examples=120)
        @given(model_calls())
        def check(calls: list[dict[str, Any]]) -> None:
            ran.clear()

            def model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
                if messages[-1]["role"] == "user":
                    return FakeReply.tool_calls(
                        *({"id": c["id"], "name": c["name"], "args": c["args"]} for c in calls)
                    )
                return "done"

            agent = Agent(FunctionModel(model), tools=[order, search])
            result = runner.run(agent.run("go"))
            assert result.stop_reason == "final_answer" and result.text == "done"
            tool_msgs = [m for m in result.messages if m["role"] == "tool"]
            assert [m["tool_call_id"] for m in tool_msgs] == [c["id"] for c in calls]
            ran_ids = [r[0] for r in ran]
            assert len(ran_ids) == len(set(ran_ids)), "a call ran twice"
            assert all(ok for _, _, ok in ran), f"a tool ran with invalid args: {ran}"
            for call, msg in zip(calls, tool_msgs, strict=True):
                if msg["status"] == "ok":
                    assert call["id"] in ran_ids and call["valid"] is not False
                    tally["ran"] += 1
                else:
                    assert call["id"] not in ran_ids and call["valid"] is not True, msg
                    assert msg["status"] == "error" and msg["content"].startswith("Error: ")
                    assert msg["error_kind"] in ("invalid_args", "unknown_tool")
                    tally[f"refused_{msg['error_kind']}"] += 1

        check()

    report("fuzz_tool_arguments", calls=sum(tally.values()), **dict(sorted(tally.items())))


# == 4. model outputs =====================================================================


class Answer(pydantic.BaseModel):
    city: str
    count: int


@st.composite
def model_replies(draw: st.DrawFn) -> Any:
    """One reply a model might give: text, JSON, tool calls, an error, a stop reason."""
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return draw(st.text(max_size=40))
    if kind == 1:
        return draw(
            st.dictionaries(TEXT, JSON, max_size=3) | st.lists(JSON, max_size=3)
        )  # JSON text
    if kind == 2:
        names = st.sampled_from(["echo", "search_memory"]) | st.text(max_size=10)
        calls = draw(st.lists(st.tuples(names, JSON_DICTS), min_size=1, max_size=3))
        return FakeReply.tool_calls(*calls, text=draw(st.none() | TEXT))
    if kind == 3:
        return FakeReply.error(draw(st.sampled_from(sorted(MODEL_ERROR_KINDS))))
    if kind == 4:
        stop = draw(st.sampled_from([None, "content_filter", "length", "stop", "tool_calls"]))
        return FakeReply(draw(st.none() | st.text(max_size=20)), stop_reason=stop)
    return FakeReply.text(
        draw(st.text(max_size=20)), usage={"output_tokens": draw(st.integers(0, 50))}
    )


def _check_result(result: RunResult[Any], typed: bool) -> str:
    assert result.stop_reason in STOP_REASONS, result.stop_reason
    if result.stop_reason == "output":
        assert typed and isinstance(result.output, Answer)
    if result.stop_reason == "final_answer":
        assert not typed and isinstance(result.text, str)
    return f"stop_{result.stop_reason}"


def test_model_outputs_end_in_a_result_or_a_documented_error() -> None:
    tally: Counter[str] = Counter()

    @tool
    async def echo(text: str) -> str:
        """Echo."""
        return text

    with asyncio.Runner() as runner:

        @settings(FUZZ, max_examples=120)
        @given(
            script=st.lists(model_replies(), max_size=5),
            typed=st.booleans(),
            model_calls=st.integers(1, 6),
            tokens=st.none() | st.integers(1, 200),
        )
        def check(script: list[Any], typed: bool, model_calls: int, tokens: int | None) -> None:
            replies = list(script)

            def model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
                if replies:
                    return replies.pop(0)
                return {"city": "Oslo", "count": 3} if typed else "final"

            agent: Agent[Any] = Agent(
                FunctionModel(model),
                tools=[echo],
                output=Answer if typed else None,
                limits=Limits(model_calls=model_calls, tokens=tokens),
                model_retry=Retry(max_attempts=2, initial_backoff_secs=0, jitter=False),
            )
            result = runner.run(outcome_of(agent.run("go")))
            if isinstance(result, LimitExceededError):
                assert result.limit in ("model_calls", "tokens")
                assert result.result is not None and result.result.stop_reason == "limit"
                tally[f"LimitExceededError({result.limit})"] += 1
            elif isinstance(result, ModelError):
                assert result.kind in MODEL_ERROR_KINDS
                tally[f"ModelError({result.kind})"] += 1
            else:
                assert isinstance(result, RunResult), f"undocumented error: {result!r}"
                tally[_check_result(result, typed)] += 1

        check()

    report("fuzz_model_outputs", examples=sum(tally.values()), **dict(sorted(tally.items())))


# == 5. what hooks return ==================================================================

MESSAGE_DICTS: Strategy = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system"]), "content": TEXT}
)
REPLY_CALLS: Strategy = st.lists(
    st.fixed_dictionaries(
        {"name": st.sampled_from(["echo"]) | TEXT, "args": JSON_DICTS},
        optional={"id": TEXT},
    ),
    max_size=2,
)
REPLACEMENT_MESSAGES: Strategy = (
    st.fixed_dictionaries(
        {},
        optional={
            "role": st.sampled_from(["assistant", "user"]) | TEXT,
            "content": st.none() | TEXT,
            "tool_calls": REPLY_CALLS,
        },
    )
    | JSON
)


@st.composite
def hook_actions(draw: st.DrawFn) -> HookAction:
    kw: dict[str, Any] = {}
    if draw(st.booleans()):
        kw["state"] = draw(JSON)
    if draw(st.integers(0, 3)) == 0:
        kw["messages"] = draw(st.lists(MESSAGE_DICTS | JSON, max_size=3) | JSON)
    if draw(st.integers(0, 3)) == 0:
        kw["message"] = draw(REPLACEMENT_MESSAGES)
    if draw(st.integers(0, 3)) == 0:
        kw["end"] = True
        kw["output"] = draw(JSON)
    return HookAction(**kw)


class Boom(Exception):
    """What a fuzzed hook raises."""


RAISE = object()  # a plan entry: the hook method raises


@st.composite
def hook_returns(draw: st.DrawFn, method: str) -> Any:
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return None
    if kind == 1:
        return draw(JSON)
    if kind == 2:
        return RAISE
    if method == "before_tool":
        return draw(
            st.builds(
                ToolCall,
                call_id=TEXT,
                name=st.sampled_from(["echo", "nope"]) | TEXT,
                args=JSON_DICTS,
            )
            | st.builds(ToolResult, JSON)
        )
    return draw(hook_actions())


HOOK_METHODS = ("on_start", "before_model", "after_model", "before_tool", "after_tool", "on_end")


class FuzzHook:
    """A hook whose every method returns (or raises) what the plan says."""

    name = "fuzz"

    def __init__(self, plan: Mapping[str, Any]) -> None:
        self.plan = plan

    def _give(self, method: str) -> Any:
        value = self.plan[method]
        if value is RAISE:
            raise (ToolError("hook says no") if method == "before_tool" else Boom(method))
        return value

    def on_start(self, ctx: HookContext) -> Any:
        return self._give("on_start")

    def before_model(self, ctx: HookContext) -> Any:
        return self._give("before_model")

    async def after_model(self, ctx: HookContext) -> Any:
        return self._give("after_model")

    def before_tool(self, call: ToolCall) -> Any:
        return self._give("before_tool")

    async def after_tool(self, call: ToolCall, result: Any) -> Any:
        return self._give("after_tool")

    def on_end(self, ctx: HookContext, outcome: str) -> Any:
        return self._give("on_end")


@st.composite
def hook_plans(draw: st.DrawFn) -> dict[str, Any]:
    """What each hook method gives: one or two methods (chosen at random) fuzzed, the
    others return None, so every method's failures are reached often."""
    chosen = draw(st.sets(st.sampled_from(HOOK_METHODS), min_size=1, max_size=2))
    return {m: draw(hook_returns(m)) if m in chosen else None for m in HOOK_METHODS}


def _hook_model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    """Calls `echo` once per user message, then answers (whatever the transcript holds)."""
    last = messages[-1] if messages else {}
    if last.get("role") == "user":
        return FakeReply.tool_call("echo", {"text": "hi"})
    return "done"


def _run_with_hooks(
    runner: asyncio.Runner, plan: Mapping[str, Any], policy: str, thread: bool
) -> tuple[str, RunResult[Any] | None]:
    @tool
    async def echo(text: str) -> str:
        """Echo."""
        return text

    agent = Agent(
        FunctionModel(_hook_model),
        tools=[echo],
        hooks=[FuzzHook(plan)],
        limits=Limits(model_calls=4),
        on_tool_exception=policy,
    )
    run: Callable[[], Any] = (
        (lambda: agent.thread(f"hooks-{uuid.uuid4().hex}").send("go"))
        if thread
        else (lambda: agent.run("go"))
    )
    result = runner.run(outcome_of(run()))
    if isinstance(result, HookFailedError):
        assert result.code == "hook_failed" and result.method in HOOK_METHODS
        return label(result) + f"@{result.method}", None
    if isinstance(result, LimitExceededError):
        assert result.result is not None and result.result.stop_reason == "limit"
        return label(result), None
    if isinstance(result, ToolExecutionError):
        assert policy == "fail" and result.tool
        return label(result), None
    assert isinstance(result, RunResult), f"undocumented error: {result!r}"
    return f"stop_{result.stop_reason}", result


# Replacement replies whose tool calls are not a list of dicts with dict args are a known
# bug (undocumented TypeError / ValueError), pinned by
# test_hook_replacement_reply_with_malformed_tool_calls_fails_with_hook_failed.
def _known_bug(plan: Mapping[str, Any]) -> bool:
    action = plan["after_model"]
    if not isinstance(action, HookAction) or not isinstance(action.message, Mapping):
        return False
    calls = action.message.get("tool_calls")
    return bool(calls) and not (
        isinstance(calls, list)
        and all(isinstance(c, Mapping) and isinstance(c.get("args") or {}, dict) for c in calls)
    )


def test_hook_returns_give_documented_errors_only() -> None:
    tally: Counter[str] = Counter()

    with asyncio.Runner() as runner:

        @settings(FUZZ, max_examples=160)
        @given(
            plan=hook_plans().filter(lambda p: not _known_bug(p)),
            policy=st.sampled_from(["return_to_model", "return_generic", "fail"]),
            thread=st.booleans(),
        )
        def check(plan: dict[str, Any], policy: str, thread: bool) -> None:
            outcome, result = _run_with_hooks(runner, plan, policy, thread)
            if result is not None:
                assert result.stop_reason in STOP_REASONS
            tally[outcome] += 1

        check()

    report("fuzz_hook_returns", examples=sum(tally.values()), **dict(sorted(tally.items())))


# == library bugs the properties above found (each fixed; kept as regressions) ==========


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///fuzz-\x00.db",
        "sqlite:///fuzz-\ud800.db",
        "postgresql://127.0.0.1:1/fuzz\ud800",
    ],
)
async def test_storage_url_with_unencodable_characters_is_a_storage_error(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StorageError):
        await Storage(url).open()


def _open_fds(path: Path) -> list[str]:
    """The files under `path` this process has open (Linux /proc)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(path)):
            out.append(target)
    return out


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux /proc")
async def test_a_failed_sqlite_open_leaves_no_connection_open(tmp_path: Path) -> None:
    storage = Storage(f"sqlite:///{tmp_path}/file-not-dir/")
    with pytest.raises(StorageError):
        await storage.open()
    await storage.close()
    assert _open_fds(tmp_path) == []


async def test_a_file_that_is_not_a_database_is_a_storage_error(tmp_path: Path) -> None:
    (tmp_path / "notes.db").write_text("not a database " * 100)
    with pytest.raises(StorageError):
        await Storage(f"sqlite:///{tmp_path}/notes.db").open()


async def test_a_sqlite_file_locked_by_another_connection_is_a_storage_error(
    tmp_path: Path,
) -> None:
    path = tmp_path / "held.db"
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("CREATE TABLE t (x)")
        other.execute("BEGIN EXCLUSIVE")
        other.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(StorageError):
            await Storage(f"sqlite:///{path}").open()
    finally:
        other.execute("ROLLBACK")
        other.close()


def test_nan_busy_timeout_is_refused() -> None:
    with pytest.raises(ValidationError):
        Storage("memory://", on_busy="wait", busy_timeout_secs=math.nan)


async def test_plain_json_resume_with_a_non_dict_decision_is_asked_again(
    tmp_path: Path,
) -> None:
    ledger: list[str] = []
    async with Storage(f"sqlite:///{tmp_path}/studio.db") as storage:
        agent = _approval_agent(storage, ledger)
        thread = agent.thread("studio")
        await thread.send("sort out my orders")
        studio = agent.graph.builder.compile(checkpointer=storage.checkpointer)
        cfg: Any = {"configurable": {"thread_id": "studio"}}
        out = await studio.ainvoke(
            Command(resume={"c-refund": None, "c-partial": "approve"}), cfg, version="v2"
        )
        assert out.interrupts and "error" in out.interrupts[0].value  # asked again
        done = await thread.approve()
        assert done.stop_reason == "final_answer"
        assert sorted(ledger) == ["lookup C-3", "partial B-2 5", "refund A-1 0"]


async def test_a_decision_built_directly_is_checked_like_its_json() -> None:
    storage = Storage("memory://")
    ledger: list[str] = []
    agent = _approval_agent(storage, ledger)
    thread = agent.thread("direct")
    await thread.send("sort out my orders")
    audit = await storage.audit("direct")
    with pytest.raises(ValidationError):
        await thread.decide({"c-refund": Decision("respond"), "c-partial": "approve"})
    assert await storage.audit("direct") == audit


@pytest.mark.parametrize(
    "tool_calls",
    [
        5,
        [{"name": "echo", "args": [1, 2]}],
        [{"name": "echo", "args": "text"}],
        [{"name": "echo", "args": 7}],
    ],
)
async def test_hook_replacement_reply_with_malformed_tool_calls_fails_with_hook_failed(
    tool_calls: Any,
) -> None:
    plan: dict[str, Any] = dict.fromkeys(HOOK_METHODS)
    plan["after_model"] = HookAction(message={"role": "assistant", "tool_calls": tool_calls})

    @tool
    async def echo(text: str) -> str:
        """Echo."""
        return text

    agent = Agent(FunctionModel(_hook_model), tools=[echo], hooks=[FuzzHook(plan)])
    with pytest.raises(HookFailedError) as info:
        await agent.run("go")
    assert info.value.code == "hook_failed" and info.value.method == "after_model"
