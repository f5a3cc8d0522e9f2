"""Redaction: one policy for what the model sees, what is saved, what is exported and what
the library logs."""

from __future__ import annotations

import itertools
import logging
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from criogen_graph import (
    Agent,
    FakeModel,
    FakeReply,
    FunctionModel,
    Hook,
    HookContext,
    Redactor,
    Storage,
    Telemetry,
    ToolCall,
    ValidationError,
    tool,
)
from criogen_graph.graph.events import RedactedText
from tests.servers.otlp_receiver import OtlpReceiver

PII = Redactor.pii()

# -- the built-ins ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("write to jane.doe+work@mail.example.co.uk now", "write to [EMAIL] now"),
        ("call +1 (415) 555-0100 or (415) 555-0199", "call [PHONE] or [PHONE]"),
        ("office 030 1234 5678, cell +44 20 7946 0958", "office [PHONE], cell [PHONE]"),
        ("also 415.555.0123", "also [PHONE]"),
        ("card 4111 1111 1111 1111 exp 12/29", "card [CARD] exp 12/29"),
        ("card 4111-1111-1111-1111", "card [CARD]"),
        ("iban DE89 3704 0044 0532 0130 00 ok", "iban [IBAN] ok"),
        ("iban GB29NWBK60161331926819", "iban [IBAN]"),
        ("from 192.168.10.7 and 2001:db8::8a2e:370:7334", "from [IP] and [IP]"),
        ("key sk-proj-abcDEF1234567890abcdef", "key [SECRET]"),
        ("anthropic sk-ant-api03-abcdefghijklmnopqrstuvwxyz", "anthropic [SECRET]"),
        ("aws AKIAIOSFODNN7EXAMPLE", "aws [SECRET]"),
        ("gh ghp_abcdefghijklmnopqrstuvwxyz0123456789", "gh [SECRET]"),
        ("password=hunter2hunter", "password=[SECRET]"),
        ('"api_key": "abcdef123456"', '"api_key": "[SECRET]"'),
        (
            "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
            "jwt [SECRET]",
        ),
    ],
)
def test_the_built_ins_catch_common_identifiers(text: str, expected: str) -> None:
    assert PII.redact(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "order A-12345 ships 2026-11-30 at 14:05",
        "total 1,234.56 EUR for 3 items",
        "card 4111 1111 1111 1112 fails its checksum",  # not a valid card number
        "version 1.2.3 and ratio 0.52",
        "ticket #20261130",
        "std::vector<int> is C++, 12:30:45 a time",
    ],
)
def test_the_built_ins_leave_ordinary_text_alone(text: str) -> None:
    assert PII.redact(text) == text


def test_an_iban_that_fails_its_checksum_is_not_called_one() -> None:
    assert "[IBAN]" not in PII.redact("DE89 3704 0044 0532 0130 01")


# Pieces of text the generated texts are made of: identifiers of every kind, their near
# misses, and the characters the patterns look at around them.
_PIECES = [
    "jane.doe+work@mail.example.co.uk",
    "-x@y.io",
    "_a@b.cd",
    "a@b.c.d@e.com",
    " @x.com",
    "é@ex.com",
    "+1 (415) 555-0100",
    "(415) 555-0199",
    "+44 20 7946 0958",
    "030 1234 5678",
    "415.555.0123",
    "4111 1111 1111 1111",
    "4111-1111-1111-1111",
    "4111111111111112",
    "5555555555554444",
    "DE89 3704 0044 0532 0130 00",
    "GB29NWBK60161331926819",
    "GB29 NWBK 6016 1331 9268 19",
    "192.168.10.7",
    "256.1.1.1",
    "1.2.3.4.5",
    "2001:db8::8a2e:370:7334",
    "::ffff:10.0.0.1",
    "fe80::1",
    "12:30:45",
    "sk-proj-abcDEF1234567890abcdef",
    "sk-ant-api03-abcdefghijklmnopqrstuvwxyz",
    "sk_live_abcdefghijklmnop1234",
    "AKIAIOSFODNN7EXAMPLE",
    "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "xoxb-1234567890-abc",
    "AIzaSyA1234567890abcdefghijklmnopqrstuv",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dozjgNryP4J3jVmNH",
    "password=hunter2hunter",
    'API_KEY: "abcdef123456"',
    "2026-11-30",
    "٣٣٣.٣٣٣.٣٣٣٣",
    "+٤٤ ٢٠ ٧٩٤٦ ٠٩٥٨",
]
_ALPHABET = "0123456789 .-+()@:_abcAZ\n,x٣é"


_FAMILIES = ("secrets", "email", "iban", "card", "ip", "phone")


def _by_the_book(text: str, families: tuple[str, ...] = _FAMILIES) -> str:
    """The built-in patterns run one after the other over the whole text."""
    from criogen_graph.redact import _rules

    for family in families:
        for rule in _rules(family):
            text = rule(text)
    return text


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(st.sampled_from(_PIECES), st.text(alphabet=_ALPHABET, max_size=10)),
        max_size=12,
    ).map("".join)
)
def test_the_fast_built_ins_redact_what_the_patterns_do(text: str) -> None:
    """`Redactor.pii()` runs each family of built-ins only where it can match (one scan
    for the runs of digits, a literal search for `@`, ...), to cost little per turn; it
    must redact exactly what the patterns run in order over the whole text redact."""
    assert PII.redact(text) == _by_the_book(text)


def test_the_fast_built_ins_agree_on_the_pieces_alone_and_together() -> None:
    for piece in _PIECES:
        for text in (piece, f"x {piece} y", f"{piece}{piece}", f"({piece}).", f"A{piece}9"):
            assert PII.redact(text) == _by_the_book(text), text
    everything = " ".join(_PIECES)
    assert PII.redact(everything) == _by_the_book(everything)
    for on in itertools.product([True, False], repeat=len(_FAMILIES)):
        chosen = dict(zip(_FAMILIES, on, strict=True))
        some = Redactor.pii(**chosen)
        families = tuple(f for f in _FAMILIES if chosen[f])
        for text in (everything, "".join(_PIECES), "+".join(_PIECES)):
            assert some.redact(text) == _by_the_book(text, families), chosen


def test_patterns_functions_and_combinations() -> None:
    names = Redactor({r"\bPatient [A-Z][a-z]+\b": "Patient [NAME]"})
    upper = Redactor(fn=lambda t: t.replace("MRN-", "MRN-#"))
    both = names + upper + PII
    assert both.redact("Patient Smith, MRN-4411, smith@example.org") == (
        "Patient [NAME], MRN-#4411, [EMAIL]"
    )
    assert both("") == ""
    assert Redactor.pii(email=False).redact("a@b.io 10.0.0.1") == "a@b.io [IP]"
    assert both.redact_value({"to": ["x@y.com"], "n": 3, "nested": {"k": "Patient Jo"}}) == {
        "to": ["[EMAIL]"],
        "n": 3,
        "nested": {"k": "Patient [NAME]"},
    }


def test_bad_redactors_are_refused_with_the_reason() -> None:
    with pytest.raises(ValidationError, match=r"not a valid regex"):
        Redactor({"(unclosed": "x"})
    with pytest.raises(TypeError, match="replacement"):
        Redactor({"a": 1})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="function"):
        Redactor(fn="not callable")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must return a str"):
        Redactor(fn=lambda t: None).redact("x")  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match=r"Redactor\.pii"):
        Agent(FakeModel([]), redact={"a": "b"})  # type: ignore[arg-type]


def test_streamed_text_is_held_back_until_it_is_safe() -> None:
    sent: list[str] = []
    held = RedactedText(PII, sent.append)
    text = "x" * 300 + " mail jane.doe@example.com please " + "y" * 300
    for i in range(0, len(text), 7):  # a secret split over several pieces
        held(text[i : i + 7])
    held.finish()
    assert "".join(sent) == PII.redact(text)
    assert not any("jane" in piece for piece in sent)


# -- one policy everywhere --------------------------------------------------------------

EMAIL = "jane.doe@example.com"
CARD = "4111 1111 1111 1111"
KEY = "sk-proj-Zx81bQ9rT2mK4vN6pL0wYs"
PHONE = "+44 20 7946 0958"
IBAN = "DE89 3704 0044 0532 0130 00"
IP = "10.20.30.40"
# Whole values only: short fragments (a run of digits) turn up by chance in ids and binary data.
SECRETS = [EMAIL, "jane.doe", CARD, KEY, "Zx81bQ9", PHONE, "7946 0958", IBAN, "0532 0130", IP]


def leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


class Watch(Hook):
    """Records what the hooks see, and fails in on_end with a secret in the message."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def before_model(self, ctx: HookContext) -> None:
        self.seen.append(repr(ctx.messages))

    def after_model(self, ctx: HookContext) -> None:
        self.seen.append(repr(ctx.messages[-1]))

    def after_tool(self, call: ToolCall, result: Any) -> None:
        self.seen.append(repr((call.args, result)))

    def on_end(self, ctx: HookContext, outcome: str) -> None:
        raise RuntimeError(f"audit sink refused {EMAIL} with key {KEY}")


def files_text(db: Path) -> str:
    """Every byte the SQLite storage wrote (database, WAL), as text."""
    data = b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*") if p.is_file())
    return data.decode("latin-1")


async def test_planted_secrets_reach_no_model_hook_saved_thread_span_or_log(
    rx: OtlpReceiver, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model_saw: list[str] = []

    def script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        model_saw.append(repr(messages))
        if messages[-1]["role"] == "user":
            # The model repeats what it was given, and invents a secret of its own.
            return FakeReply.tool_call(
                "send_note",
                {"to": EMAIL, "body": f"use key {KEY}"},
                text=f"Sending to {EMAIL}",
            )
        return FakeReply.text(f"Done. Your IBAN {IBAN} is on file, reach us at {PHONE}.")

    @tool
    def send_note(to: str, body: str) -> str:
        """Send a note."""
        return f"sent to {to}; customer phone {PHONE}, from {IP}"

    telemetry = Telemetry.otlp(rx.url, content=True)
    rx.users.append(telemetry)
    watch = Watch()
    db = tmp_path / "threads.db"
    agent = Agent(
        FunctionModel(script),
        tools=[send_note],
        storage=f"sqlite:///{db}",
        hooks=[watch],
        telemetry=telemetry,
        redact=Redactor.pii(),
    )
    thread = agent.thread(f"pii-{uuid.uuid4().hex}")
    caplog.set_level(logging.DEBUG, logger="criogen_graph")
    reply = await thread.send(f"I am {EMAIL}, card {CARD}; please send a note")
    assert reply.text == "Done. Your IBAN [IBAN] is on file, reach us at [PHONE]."

    # What the model was sent and what the hooks saw.
    assert model_saw and not leaks("".join(model_saw))
    assert "[EMAIL]" in model_saw[0] and "[CARD]" in model_saw[0]
    assert "[PHONE]" in model_saw[1] and "[IP]" in model_saw[1]
    assert watch.seen and not leaks("".join(watch.seen))

    # The saved thread: its messages, its audit records, and the bytes on disk.
    saved = repr(await thread.messages())
    assert not leaks(saved) and "[SECRET]" in saved
    assert not leaks(repr(await agent.storage.audit(thread.id)))
    await agent.storage.close()
    on_disk = files_text(db)
    assert "send_note" in on_disk  # the transcript is readable there, so the check bites
    assert not leaks(on_disk)

    # The exported spans, content included.
    assert telemetry.flush(10)
    exported = repr([(s.attributes, s.events, s.status_message) for s in rx.spans])
    assert "gen_ai.input.messages" in exported
    assert not leaks(exported)

    # The library's log records (the failing on_end hook is logged with its traceback).
    logged = [r for r in caplog.records if r.name == "criogen_graph"]
    assert any("on_end" in r.getMessage() for r in logged)
    text = "\n".join(r.getMessage() + (r.exc_text or "") for r in logged)
    assert "[EMAIL]" in text
    assert not leaks(caplog.text) and not leaks(text)


async def test_streamed_answers_are_redacted_as_they_stream(tmp_path: Path) -> None:
    answer = f"Write to {EMAIL} or call {PHONE} today."
    pieces = [answer[i : i + 5] for i in range(0, len(answer), 5)]
    agent = Agent(
        FakeModel([FakeReply.text(answer, chunks=pieces)]),
        storage=f"sqlite:///{tmp_path}/t.db",
        redact=Redactor.pii(),
    )
    stream = agent.thread("s").stream("contact?")
    events = [e async for e in stream]
    reply = await stream.reply()
    streamed = "".join(e.text for e in events if e.type == "text")
    assert streamed == reply.text == "Write to [EMAIL] or call [PHONE] today."
    assert not leaks(repr(events))
    await agent.storage.close()


async def test_a_sub_agent_without_a_policy_works_under_its_callers(tmp_path: Path) -> None:
    clerk_saw: list[str] = []

    @tool
    def crm(query: str) -> str:
        """Search the CRM."""
        return f"customer {EMAIL}, card {CARD}"

    def clerk_script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        clerk_saw.append(repr(messages))
        if messages[-1]["role"] == "user":
            return FakeReply.tool_call("crm", {"query": "jane"})
        return FakeReply.text(f"found: {messages[-1]['content']} (also {KEY})")

    clerk = Agent(FunctionModel(clerk_script), tools=[crm], name="clerk")

    def lead_script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if messages[-1]["role"] == "user":
            return FakeReply.tool_call("clerk", {"input": messages[-1]["content"]})
        return FakeReply.text(f"lead: {messages[-1]['content']}")

    db = tmp_path / "lead.db"
    lead = Agent(
        FunctionModel(lead_script),
        tools=[clerk.as_tool("clerk", "Finds customers.")],
        storage=Storage(f"sqlite:///{db}"),
        redact=Redactor.pii(),
        name="lead",
    )
    reply = await lead.thread("t").send(f"find {EMAIL}")
    assert reply.text == "lead: found: customer [EMAIL], card [CARD] (also [SECRET])"
    assert not leaks("".join(clerk_saw))
    await lead.storage.close()
    on_disk = files_text(db)
    assert "crm" in on_disk  # the clerk's own transcript is saved in the lead's thread
    assert not leaks(on_disk)


async def test_a_sub_agent_policy_adds_to_its_callers() -> None:
    names = Redactor({r"\bAda\b": "[NAME]"})

    def echo(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        return FakeReply.text(f"clerk got: {messages[-1]['content']}")

    clerk = Agent(FunctionModel(echo), name="clerk", redact=names)

    def lead_script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if messages[-1]["role"] == "user":
            return FakeReply.tool_call("clerk", {"input": "Ada at ada@example.com"})
        return FakeReply.text(messages[-1]["content"])

    lead = Agent(
        FunctionModel(lead_script),
        tools=[clerk.as_tool("clerk", "Echoes.")],
        redact=Redactor.pii(),
    )
    result = await lead.run("go")
    assert result.text == "clerk got: [NAME] at [EMAIL]"


def test_redaction_of_log_records_only_applies_during_a_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="criogen_graph")
    logging.getLogger("criogen_graph").info("outside any run: %s", EMAIL)
    assert EMAIL in caplog.text  # no policy is in force outside a run
    assert re.search(r"outside any run", caplog.text)


def test_reasoning_summaries_are_redacted_and_encrypted_reasoning_goes_back_as_it_came() -> None:
    from criogen_graph.redact import redact_messages

    item = {"id": "rs_1", "summary": ["user is ada@example.com"], "encrypted_content": "gAAA=="}
    (out,) = redact_messages(
        Redactor.pii(), [{"role": "assistant", "content": "", "reasoning_items": [item]}]
    )
    assert out["reasoning_items"] == [
        {"id": "rs_1", "summary": ["user is [EMAIL]"], "encrypted_content": "gAAA=="}
    ]
    assert item["summary"] == ["user is ada@example.com"]  # the caller's copy untouched
