"""Redaction gaps: with `redact=Redactor.pii()`, no secret reaches storage, the audit trail,
the exported spans or the log records, whatever path it takes through a run.

Distinct secrets (a card number as text and as an int, an e-mail address, an API key) are
planted in every place a run can carry them: a tool's exception (failing the run, and
returned to the model), each hook method's exception, a model's error (a `FunctionModel`
and a real HTTP provider's error body), the model's own tool-call arguments, a reviewer's
edited arguments, a reject message and a respond message, the user's input and a tool's
result. Then everything stored is searched, byte for byte: the SQLite file and its WAL,
every table of the PostgreSQL schema, the memory backend's saver and audit list, the audit
records, the spans an OTLP receiver got (raw bodies and decoded), and every log record of
every logger. Each place also plants a marker (not a secret) that must show up in the
sinks the place writes to, so the search is known to look where the text went.
"""

from __future__ import annotations

import asyncio
import logging
import random
import sqlite3
import string
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ormsgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from criogen_graph import (
    Agent,
    CriogenError,
    Decision,
    FakeReply,
    FunctionModel,
    Hook,
    HookAction,
    HookContext,
    ModelError,
    Redactor,
    Retry,
    Storage,
    Telemetry,
    ValidationError,
    openai,
    tool,
)
from criogen_graph.redact import CURRENT
from tests.conftest import storage_url
from tests.reliability._report import report
from tests.servers import openai_server as srv
from tests.servers.otlp_receiver import OtlpReceiver

SINKS = ("storage", "audit", "spans", "logs")


def _luhn_completed(partial: str) -> str:
    total = 0
    for i, ch in enumerate(reversed(partial)):
        d = int(ch)
        if i % 2 == 0:  # these digits are doubled once the check digit is appended
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return partial + str((10 - total % 10) % 10)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


@dataclass(frozen=True)
class Planted:
    """The secrets planted in one place, and a marker that is no secret."""

    place: str
    card: str  # "4xxx xxxx xxxx xxxx", Luhn-valid
    card_int: int  # another card, as a number
    email: str
    key: str
    marker: str

    @classmethod
    def make(cls, place: str, rng: random.Random) -> Planted:
        digits = _luhn_completed("4" + "".join(rng.choice(string.digits) for _ in range(14)))
        number = _luhn_completed("5" + "".join(rng.choice(string.digits) for _ in range(14)))
        word = "".join(rng.choice(string.ascii_lowercase) for _ in range(10))
        hexes = "".join(rng.choice("0123456789abcdef") for _ in range(24))
        return cls(
            place=place,
            card=" ".join(digits[i : i + 4] for i in range(0, 16, 4)),
            card_int=int(number),
            email=f"{word}.{place.replace('_', '')}@example.com",
            key=f"sk-proj-{hexes}",
            marker=f"zq{place.replace('_', '')}{word}",
        )

    def text(self) -> str:
        return (
            f"{self.marker}: card {self.card}, ref {self.card_int}, "
            f"mail {self.email}, key {self.key}"
        )

    def args(self) -> dict[str, Any]:
        """Arguments of `charge` carrying every secret (the card number as an int)."""
        return {
            "card": self.card,
            "ref": self.card_int,
            "email": self.email,
            "note": f"{self.key} {self.marker}",
        }

    def needles(self) -> dict[str, list[bytes]]:
        """Each secret in every form it could be stored in: text, its distinctive core,
        and for the number its decimal text, msgpack and protobuf varint encodings."""
        return {
            "card": [self.card.encode(), self.card.replace(" ", "").encode()],
            "card_int": [
                str(self.card_int).encode(),
                ormsgpack.packb(self.card_int),
                _varint(self.card_int),
            ],
            "email": [self.email.encode(), self.email.split("@")[0].encode()],
            "key": [self.key.encode(), self.key.removeprefix("sk-proj-").encode()],
        }


def _chunks(value: Any, out: list[bytes]) -> None:
    """Every string, byte string and number inside `value`, as bytes."""
    if isinstance(value, bytes | bytearray | memoryview):
        out.append(bytes(value))
    elif isinstance(value, str):
        out.append(value.encode("utf-8", "surrogatepass"))
    elif value is None or isinstance(value, bool):
        return
    elif isinstance(value, int | float):
        out.append(str(value).encode())
    elif isinstance(value, dict):
        for k, v in value.items():
            _chunks(k, out)
            _chunks(v, out)
    elif isinstance(value, list | tuple | set | frozenset):
        for v in value:
            _chunks(v, out)
    else:
        out.append(repr(value).encode("utf-8", "surrogatepass"))


def haystack(*values: Any) -> bytes:
    out: list[bytes] = []
    for v in values:
        _chunks(v, out)
    return b"\x00".join(out)


def sqlite_dump(db: Path) -> bytes:
    """The database files' bytes, and every row of every table."""
    parts = [p.read_bytes() for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")) if p.exists()]
    conn = sqlite3.connect(db)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for t in tables:
            parts.append(haystack(conn.execute(f'SELECT * FROM "{t}"').fetchall()))
    finally:
        conn.close()
    return b"\x00".join(parts)


def pg_dump(url: str) -> tuple[bytes, dict[str, int]]:
    """Every row of every table of the URL's schema, and the row count per table."""
    import psycopg

    counts: dict[str, int] = {}
    parts: list[bytes] = []
    with psycopg.connect(url) as conn:
        schema = conn.execute("SELECT current_schema()").fetchone()
        assert schema is not None and schema[0].startswith("criogen_test_")
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            )
        ]
        for t in tables:
            rows = conn.execute(f'SELECT * FROM "{t}"').fetchall()
            counts[t] = len(rows)
            parts.append(haystack(rows))
    return b"\x00".join(parts), counts


class Capture(logging.Handler):
    """Every log record of every logger, formatted with its traceback."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def logs() -> Iterator[Capture]:
    root = logging.getLogger()
    capture = Capture()
    level = root.level
    root.setLevel(logging.DEBUG)
    root.addHandler(capture)
    try:
        yield capture
    finally:
        root.removeHandler(capture)
        root.setLevel(level)


# -- the places ---------------------------------------------------------------------------


@tool
def lookup(query: str) -> str:
    """Look something up."""
    return "nothing found"


@tool
def charge(card: str, ref: int | str, email: str, note: str) -> str:
    """Charge a card."""
    return f"charged {card} (ref {ref}) for {email}: {note}"


def _calls_then_answers(name: str, args: dict[str, Any]) -> FunctionModel:
    def script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if messages[-1]["role"] == "user":
            return FakeReply.tool_call(name, args)
        return FakeReply.text("done")

    return FunctionModel(script)


@dataclass
class Run:
    """What one place's runs share: the storage, the telemetry, the loopback provider."""

    storage: Storage
    telemetry: Telemetry
    server: srv.OpenAIServer
    prefix: str

    def agent(self, model: Any, **kw: Any) -> Agent[Any]:
        kw.setdefault("tools", [lookup, charge])
        return Agent(
            model,
            storage=self.storage,
            telemetry=self.telemetry,
            redact=Redactor.pii(),
            model_retry=Retry(max_attempts=1),
            **kw,
        )


async def _fails(coro: Awaitable[Any]) -> CriogenError:
    try:
        await asyncio.wait_for(coro, 30)
    except CriogenError as exc:
        return exc
    raise AssertionError("the run was expected to fail")


async def tool_raises_and_fails_the_run(run: Run, p: Planted) -> None:
    @tool
    def explode(query: str) -> str:
        """Fail."""
        raise ValueError(p.text())

    agent = run.agent(
        _calls_then_answers("explode", {"query": "x"}),
        tools=[explode],
        on_tool_exception="fail",
    )
    err = await _fails(agent.thread(f"{run.prefix}-{p.place}").send("go"))
    assert err.code == "tool_failed"


async def tool_raises_back_to_the_model(run: Run, p: Planted) -> None:
    @tool
    def explode(query: str) -> str:
        """Fail."""
        raise ValueError(p.text())

    agent = run.agent(_calls_then_answers("explode", {"query": "x"}), tools=[explode])
    await asyncio.wait_for(agent.thread(f"{run.prefix}-{p.place}").send("go"), 30)


async def tool_raises_generic(run: Run, p: Planted) -> None:
    @tool
    def explode(query: str) -> str:
        """Fail."""
        raise ValueError(p.text())

    agent = run.agent(
        _calls_then_answers("explode", {"query": "x"}),
        tools=[explode],
        on_tool_exception="return_generic",
    )
    await asyncio.wait_for(agent.thread(f"{run.prefix}-{p.place}").send("go"), 30)


def hook_raising(method: str) -> Callable[[Run, Planted], Awaitable[None]]:
    async def place(run: Run, p: Planted) -> None:
        def boom(*args: Any) -> None:
            raise RuntimeError(p.text())

        hook = type(f"Leaky_{method}", (Hook,), {method: boom})()
        agent = run.agent(
            _calls_then_answers("lookup", {"query": "x"}),
            hooks=[hook],
            on_tool_exception="fail",
        )
        thread = agent.thread(f"{run.prefix}-{p.place}")
        if method == "on_end":  # logged, not raised: the run completes
            reply = await asyncio.wait_for(thread.send("go"), 30)
            assert reply.text == "done"
        else:
            await _fails(thread.send("go"))

    return place


async def hook_writes(run: Run, p: Planted, what: str) -> None:
    class Writer(Hook):
        def before_model(self, ctx: HookContext) -> HookAction | None:
            if what == "messages":
                return HookAction(messages=[*ctx.messages, {"role": "user", "content": p.text()}])
            if what == "changed":  # the hook's copy of the transcript, changed in place
                ctx.messages[-1]["content"] += " " + p.text()
                return HookAction(messages=ctx.messages)
            if what == "output":
                return HookAction(end=True, output={"note": p.text(), "ref": p.card_int})
            return None

        def after_model(self, ctx: HookContext) -> HookAction | None:
            if what == "message":
                return HookAction(message={"role": "assistant", "content": p.text()})
            return None

    agent = run.agent(FunctionModel(lambda messages, tools: FakeReply.text("ok")), hooks=[Writer()])
    await asyncio.wait_for(agent.thread(f"{run.prefix}-{p.place}").send("go"), 30)


async def model_raises(run: Run, p: Planted) -> None:
    def script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        raise ModelError(p.text(), kind="bad_request", status=400)

    err = await _fails(
        run.agent(FunctionModel(script)).thread(f"{run.prefix}-{p.place}").send("hi")
    )
    assert isinstance(err, ModelError)


async def provider_error_body(run: Run, p: Planted) -> None:
    run.server.add(srv.error(400, p.text()))
    model = openai("gpt-test", base_url=run.server.base_url, api_key="k", timeout_secs=10)
    err = await _fails(run.agent(model).thread(f"{run.prefix}-{p.place}").send("hi"))
    assert isinstance(err, ModelError) and err.kind == "bad_request"


def _gated(run: Run, model_args: dict[str, Any]) -> Agent[Any]:
    return run.agent(_calls_then_answers("charge", model_args), approve=["charge"])


async def model_args_then_edit(run: Run, p: Planted, edit: Planted) -> None:
    thread = _gated(run, p.args()).thread(f"{run.prefix}-{p.place}")
    reply = await asyncio.wait_for(thread.send("charge it"), 30)
    assert reply.needs_approval
    call_id = reply.approvals[0].call_id
    reply = await asyncio.wait_for(thread.decide({call_id: Decision.edit(edit.args())}), 30)
    assert reply.text == "done"


async def reject_message(run: Run, p: Planted) -> None:
    thread = _gated(run, {"card": "-", "ref": 1, "email": "-", "note": "-"}).thread(
        f"{run.prefix}-{p.place}"
    )
    reply = await asyncio.wait_for(thread.send("charge it"), 30)
    assert reply.needs_approval
    reply = await asyncio.wait_for(thread.reject(f"not allowed: {p.text()}"), 30)
    assert reply.text == "done"


async def respond_message(run: Run, p: Planted) -> None:
    thread = _gated(run, {"card": "-", "ref": 1, "email": "-", "note": "-"}).thread(
        f"{run.prefix}-{p.place}"
    )
    reply = await asyncio.wait_for(thread.send("charge it"), 30)
    call_id = reply.approvals[0].call_id
    reply = await asyncio.wait_for(thread.decide({call_id: Decision.respond(p.text())}), 30)
    assert reply.text == "done"


async def user_input(run: Run, p: Planted) -> None:
    agent = run.agent(FunctionModel(lambda messages, tools: FakeReply.text("noted")))
    await asyncio.wait_for(agent.thread(f"{run.prefix}-{p.place}").send(p.text()), 30)


async def tool_result(run: Run, p: Planted) -> None:
    @tool
    def record(query: str) -> dict[str, Any]:
        """Read a record."""
        return {"summary": p.text(), "card": p.card_int, p.email: "primary contact"}

    agent = run.agent(_calls_then_answers("record", {"query": "x"}), tools=[record])
    await asyncio.wait_for(agent.thread(f"{run.prefix}-{p.place}").send("go"), 30)


#: place -> (the sinks its marker must reach, how to plant it).
PLACES: dict[str, tuple[tuple[str, ...], Any]] = {
    "tool_fail": (("storage", "audit", "spans"), tool_raises_and_fails_the_run),
    "tool_error": (("storage", "spans"), tool_raises_back_to_the_model),
    "tool_generic": (("storage",), tool_raises_generic),
    "hook_on_start": (("audit", "spans"), hook_raising("on_start")),
    "hook_before_model": (("storage", "audit", "spans"), hook_raising("before_model")),
    "hook_after_model": (("storage", "audit", "spans"), hook_raising("after_model")),
    "hook_before_tool": (("storage", "audit", "spans"), hook_raising("before_tool")),
    "hook_after_tool": (("storage", "audit", "spans"), hook_raising("after_tool")),
    "hook_on_end": (("logs",), hook_raising("on_end")),
    "hook_messages": (("storage", "spans"), lambda run, p: hook_writes(run, p, "messages")),
    "hook_changed": (("storage", "spans"), lambda run, p: hook_writes(run, p, "changed")),
    "hook_message": (("storage",), lambda run, p: hook_writes(run, p, "message")),
    "hook_output": (("storage",), lambda run, p: hook_writes(run, p, "output")),
    "model_error": (("storage", "audit", "spans"), model_raises),
    "provider_error": (("storage", "audit", "spans"), provider_error_body),
    "model_args": (("storage", "audit", "spans"), None),  # planted with "edit"
    "edit": (("storage", "audit", "spans"), None),
    "reject": (("storage", "audit", "spans"), reject_message),
    "respond": (("storage", "audit", "spans"), respond_message),
    "input": (("storage", "audit", "spans"), user_input),
    "tool_result": (("storage", "spans"), tool_result),
}


async def test_no_planted_secret_reaches_any_sink(
    backend: str, tmp_path: Path, rx: OtlpReceiver, logs: Capture, request: pytest.FixtureRequest
) -> None:
    url = (
        request.getfixturevalue("pg_schema_url")
        if backend == "postgres"
        else storage_url(backend, tmp_path)
    )
    rng = random.Random(f"redaction-gaps-{backend}")
    planted = {place: Planted.make(place, rng) for place in PLACES}
    storage = Storage(url)
    telemetry = Telemetry.otlp(rx.url, content=True)
    rx.users.append(telemetry)

    with srv.OpenAIServer() as server:
        run = Run(storage, telemetry, server, f"gaps-{rng.getrandbits(32):08x}")
        for place, (_, plant) in PLACES.items():
            if plant is not None:
                await plant(run, planted[place])
        await model_args_then_edit(run, planted["model_args"], planted["edit"])

    assert telemetry.flush(10), "the spans were not exported in time"
    audit = await storage.audit()
    sinks: dict[str, bytes] = {
        "audit": haystack(audit),
        "spans": haystack(
            rx.bodies, [(s.name, s.attributes, s.events, s.status_message) for s in rx.spans]
        ),
        "logs": "\n".join(logs.lines).encode(),
    }
    if backend == "memory":
        saver: Any = storage.checkpointer
        sinks["storage"] = haystack(saver.storage, saver.writes, saver.blobs, audit)
        await storage.close()
    elif backend == "sqlite":
        db = tmp_path / "threads.db"
        before_close = sqlite_dump(db)
        await storage.close()
        sinks["storage"] = before_close + b"\x00" + sqlite_dump(db)
    else:
        await storage.close()
        sinks["storage"], counts = pg_dump(url)
        assert counts["checkpoints"] and counts["checkpoint_writes"] and counts["criogen_audit"]

    # The search looks where each place's text went: its marker is there.
    missing = [
        f"{place} -> {sink}"
        for place, (expected, _) in PLACES.items()
        for sink in expected
        if planted[place].marker.encode() not in sinks[sink]
    ]
    assert not missing, f"markers missing (the search would not see these): {missing}"
    assert b"[CARD]" in sinks["storage"] and b"[EMAIL]" in sinks["storage"]

    leaks = [
        f"{place}: {secret} in {sink}"
        for place, p in planted.items()
        for secret, needles in p.needles().items()
        for sink, hay in sinks.items()
        if any(n in hay for n in needles)
    ]
    checks = len(planted) * 4 * len(sinks)
    report(
        "redaction_gaps",
        backend=backend,
        places=len(planted),
        secrets_planted=len(planted) * 4,
        sinks=len(sinks),
        checks=checks,
        leaks=len(leaks),
    )
    assert not leaks, f"{len(leaks)} of {checks} checks found a secret:\n" + "\n".join(leaks)


# -- numbers --------------------------------------------------------------------------------


CARD_INT = 4111111111111111


@tool
def pay(card: int, amount: int) -> str:
    """Pay with a card."""
    return f"paid {amount} with {card}"


async def test_a_card_number_given_as_an_int_reaches_an_int_tool_as_invalid_arguments(
    tmp_path: Path,
) -> None:
    seen: list[list[dict[str, Any]]] = []

    def script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        seen.append(messages)
        if messages[-1]["role"] == "user":
            return FakeReply.tool_call("pay", {"card": CARD_INT, "amount": 25}, id="c1")
        return FakeReply.text("could not pay")

    db = tmp_path / "t.db"
    agent = Agent(
        FunctionModel(script), tools=[pay], storage=f"sqlite:///{db}", redact=Redactor.pii()
    )
    reply = await asyncio.wait_for(agent.thread("t").send("pay"), 30)
    assert reply.text == "could not pay"
    call, result = reply.messages[-3], reply.messages[-2]
    # The number is redacted as text, so the int field rejects it; the model is told.
    assert call["tool_calls"][0]["args"] == {"card": "[CARD]", "amount": 25}
    assert result["status"] == "error" and result["error_kind"] == "invalid_args"
    assert "invalid arguments for pay" in result["content"] and "card" in result["content"]
    assert str(CARD_INT) not in repr(seen)
    await agent.storage.close()
    assert str(CARD_INT).encode() not in sqlite_dump(db)
    assert ormsgpack.packb(CARD_INT) not in sqlite_dump(db)


async def test_an_edit_that_no_longer_fits_once_redacted_is_refused_and_changes_nothing(
    tmp_path: Path,
) -> None:
    agent = Agent(
        _calls_then_answers("pay", {"card": 1234, "amount": 25}),
        tools=[pay],
        approve=["pay"],
        storage=f"sqlite:///{tmp_path}/t.db",
        redact=Redactor.pii(),
    )
    thread = agent.thread("t")
    reply = await asyncio.wait_for(thread.send("pay"), 30)
    call_id = reply.approvals[0].call_id
    before = await thread.history()
    with pytest.raises(ValidationError) as info:
        await thread.decide({call_id: Decision.edit({"card": CARD_INT, "amount": 25})})
    assert info.value.code == "invalid_value"
    assert "redact" in str(info.value) and str(CARD_INT) not in str(info.value)
    assert await thread.history() == before
    assert [a.call_id for a in await thread.pending_approvals()] == [call_id]
    # An edit that fits is taken.
    reply = await thread.decide({call_id: Decision.edit({"card": 42, "amount": 25})})
    assert reply.text == "done"
    await agent.storage.close()


def test_numbers_are_redacted_by_their_decimal_text() -> None:
    pii = Redactor.pii()
    value = {
        "card": CARD_INT,
        "as_float": float(CARD_INT),
        "amount": 25,
        "ratio": 0.25,
        "flag": True,
        "nested": [CARD_INT, (7, CARD_INT)],
        "jane@example.com": "key of a secret",
    }
    assert pii.redact_value(value) == {
        "card": "[CARD]",
        "as_float": "[CARD]",
        "amount": 25,
        "ratio": 0.25,
        "flag": True,
        "nested": ["[CARD]", [7, "[CARD]"]],
        "[EMAIL]": "key of a secret",
    }
    custom = Redactor({r"\b\d{6}\b": "[PIN]"})
    assert custom.redact_value({"pin": 123456, "n": 1234567}) == {"pin": "[PIN]", "n": 1234567}


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.integers(min_value=-(10**20), max_value=10**20),
        st.integers(min_value=10**11, max_value=10**13),
        st.floats(allow_nan=True, allow_infinity=True),
        st.floats(min_value=1e11, max_value=1e17),
    )
)
def test_a_number_is_redacted_exactly_as_its_text_would_be(n: float) -> None:
    # A whole number by its digits, a fraction by its text (but the built-ins know no
    # identifier that is a fraction); the built-ins skip numbers too short for the card
    # rule, and this checks that skipping them changes nothing.
    integral = isinstance(n, int) or n.is_integer()
    text = str(int(n)) if integral else str(n)
    custom = Redactor(fn=lambda t: t.replace("7", "[7]"))
    for policy, applies in ((Redactor.pii(), integral), (custom, True)):
        expected = policy.redact(text) if applies else text
        got = policy.redact_value(n)
        if expected == text:
            assert got is n
        else:
            assert got == expected


def test_the_librarys_other_loggers_are_redacted_during_a_run(logs: Capture) -> None:
    import criogen_graph.mcp  # noqa: F401  (its logger is made when it is imported)

    email = "jane.doe@example.com"
    token = CURRENT.set(Redactor.pii())
    try:
        for name in ("criogen_graph", "criogen_graph.mcp", "criogen_graph.telemetry"):
            logging.getLogger(name).warning("seen %s", email)
    finally:
        CURRENT.reset(token)
    ours = [line for line in logs.lines if " criogen_graph" in line]
    assert len(ours) == 3 and all(line.endswith("seen [EMAIL]") for line in ours)


async def test_a_graph_run_outside_the_api_redacts_the_reviewers_answer_before_it_runs() -> None:
    # LangGraph Studio resumes the graph with the raw answer, which LangGraph itself
    # saves as given; what the approval node passes on (the tool's task, the result
    # the model reads) follows the agent's policy.
    p = Planted.make("studio", random.Random(7))
    ran: list[dict[str, Any]] = []

    @tool
    def send_mail(to: str, ref: int | str) -> str:
        """Send a mail."""
        ran.append({"to": to, "ref": ref})
        return "sent"

    agent = Agent(
        _calls_then_answers("send_mail", {"to": "-", "ref": 1}),
        tools=[send_mail],
        approve=["send_mail"],
        redact=Redactor.pii(),
    )
    graph = agent.graph.builder.compile(checkpointer=InMemorySaver())
    cfg: dict[str, Any] = {"configurable": {"thread_id": "studio"}}
    out = await graph.ainvoke({"messages": [{"role": "user", "content": "mail"}]}, cfg)
    answer = {"type": "edit", "args": {"to": p.email, "ref": p.card_int}}
    out = await graph.ainvoke(Command(resume=answer), cfg)
    assert ran == [{"to": "[EMAIL]", "ref": "[CARD]"}]
    assert not any(n in haystack(out["messages"]) for ns in p.needles().values() for n in ns)
