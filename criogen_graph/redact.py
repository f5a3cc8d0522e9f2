"""`Redactor`: one policy that strips identifiers from every text the agent handles."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from typing import Any

from criogen_graph.errors import ValidationError

__all__ = ["Redactor"]

Replace = str | Callable[[re.Match[str]], str]


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card(m: re.Match[str]) -> str:
    digits = re.sub(r"\D", "", m.group(0))
    return "[CARD]" if 13 <= len(digits) <= 19 and _luhn(digits) else m.group(0)


def _iban(m: re.Match[str]) -> str:
    raw = re.sub(r"\s", "", m.group(0)).upper()
    moved = raw[4:] + raw[:4]
    number = "".join(str(int(c, 36)) for c in moved)
    return "[IBAN]" if 15 <= len(raw) <= 34 and int(number) % 97 == 1 else m.group(0)


def _phone(m: re.Match[str]) -> str:
    digits = re.sub(r"\D", "", m.group(0))
    return "[PHONE]" if 8 <= len(digits) <= 15 else m.group(0)


def _ipv6(m: re.Match[str]) -> str:
    import ipaddress

    try:
        ipaddress.IPv6Address(m.group(0))
    except ValueError:
        return m.group(0)
    return "[IP]"


def _keep_name(m: re.Match[str]) -> str:
    return f"{m.group(1)}{m.group(2)}[SECRET]"


def _ipv4(m: re.Match[str]) -> str:
    return (
        "[IP]"
        if all(
            int(part) <= 255
            for part in m.group(0).split(
                ".",
            )
        )
        else m.group(0)
    )


# Each rule: needles (the rule runs only when one of them is in the text; `str.__contains__`
# is far cheaper than a regex scan), the pattern, its replacement. Patterns start with a
# literal or a character class and check the character before it with a lookbehind placed
# after that first character, so the regex engine can skip ahead to candidates instead of
# trying every position. Order matters: secrets and cards before phones (long digit runs),
# IBANs before both.
_W = "A-Za-z0-9_"
_BUILTINS: dict[str, list[tuple[tuple[str, ...] | None, str, Replace]]] = {
    "secrets": [
        (("sk-ant-",), rf"s(?<![{_W}]s)k-ant-[{_W}\-]{{20,}}", "[SECRET]"),
        (
            ("sk-", "pk-", "rk-"),
            rf"[spr](?<![{_W}][spr])k-(?:proj-|live_|test_)?[{_W}\-]{{16,}}",
            "[SECRET]",
        ),
        (
            ("_live_", "_test_"),
            rf"[spr](?<![{_W}][spr])k_(?:live|test)_[A-Za-z0-9]{{16,}}",
            "[SECRET]",
        ),
        (("AKIA",), r"AKIA(?<![\w]AKIA)[0-9A-Z]{16}\b", "[SECRET]"),
        (
            ("ghp_", "gho_", "ghs_", "ghu_", "ghr_"),
            r"g(?<!\wg)h[opsur]_[A-Za-z0-9]{30,}\b",
            "[SECRET]",
        ),
        (("xox",), r"x(?<!\wx)ox[abprs]-[A-Za-z0-9\-]{10,}", "[SECRET]"),
        (("AIza",), r"A(?<!\wA)Iza[0-9A-Za-z_\-]{35}\b", "[SECRET]"),
        (
            ("eyJ",),
            r"e(?<!\we)yJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
            "[SECRET]",
        ),
        (
            ("key", "secret", "token", "passw", "pwd"),  # matched case-insensitively
            r"(?i)\b((?:api[_\-]?key|secret|token|password|passwd|pwd)[\"']?)"
            r"(\s*[:=]\s*[\"']?)[^\s\"',;]{6,}",
            _keep_name,
        ),
    ],
    "email": [
        (
            ("@",),
            r"\b[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,}\b",
            "[EMAIL]",
        )
    ],
    "iban": [(None, r"[A-Z](?<![\w][A-Z])[A-Z]\d{2}(?: ?[A-Z0-9]){11,30}\b", _iban)],
    "card": [(None, r"\d(?<![\d\-]\d)(?:[ \-]?\d){12,18}(?![\d\-])", _card)],
    "ip": [
        ((".",), r"\d(?<![\w.]\d)\d{0,2}\.\d{1,3}\.\d{1,3}\.\d{1,3}(?!\w|\.\d)", _ipv4),
        (
            (":",),
            r"[0-9A-Fa-f:](?<![\w:][0-9A-Fa-f:])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:])",
            _ipv6,
        ),
    ],
    # Phone numbers need a phone's shape, so dates, amounts and ids are left alone: an
    # international number (+...), a North-American one, or a national one starting
    # with 0 written in groups.
    "phone": [
        (("+",), r"\+(?<![\w+]\+)\d(?:[ .\-]?\(?\d+\)?){5,}", _phone),
        (("(",), r"\((?<!\w\()\d{3}\)[ .\-]?\d{3}[ .\-]\d{4}(?!\w)", "[PHONE]"),
        (None, r"\d(?<![\w\-.]\d)\d{2}[.\-]\d{3}[.\-]\d{4}(?![\w\-])", "[PHONE]"),
        (None, r"0(?<![\w\-.]0)\d{1,4}(?:[ .\-]\d{2,4}){2,4}(?![\w\-])", _phone),
    ],
}


class _Rule:
    __slots__ = ("fold", "needles", "pattern", "replacement")

    def __init__(
        self,
        pattern: re.Pattern[str],
        replacement: Replace,
        needles: tuple[str, ...] | None = None,
    ) -> None:
        self.pattern = pattern
        self.replacement = replacement
        self.needles = needles
        self.fold = bool(pattern.flags & re.IGNORECASE)

    def __call__(self, text: str) -> str:
        needles = self.needles
        if needles is not None:
            hay = text.lower() if self.fold else text
            for needle in needles:
                if needle in hay:
                    break
            else:
                return text
        return self.pattern.sub(self.replacement, text)


class Redactor:
    """Strips identifiers from text: regex `patterns` mapped to replacements, and/or a
    plain function `fn(text) -> text`. `Redactor.pii()` has the built-ins; `a + b` applies
    `a`, then `b`.

    Give it as `Agent(redact=...)`: it applies to every text before each model call (the
    input, the model's replies and its tool-call arguments, tool results), ahead of all
    hooks, so the saved transcript is the redacted one; and the same policy applies to
    telemetry attributes and to the library's log records.
    """

    __slots__ = ("_steps",)

    def __init__(
        self,
        patterns: Mapping[str, str] | None = None,
        fn: Callable[[str], str] | None = None,
    ) -> None:
        self._steps: list[Callable[[str], str]] = []
        for pattern, replacement in (patterns or {}).items():
            if not isinstance(replacement, str):
                raise TypeError(f"the replacement for {pattern!r} must be a str")
            self._steps.append(_Rule(_compile(pattern), replacement))
        if fn is not None:
            if not callable(fn):
                raise TypeError("fn must be a function from text to text")
            self._steps.append(fn)

    @classmethod
    def pii(
        cls,
        *,
        email: bool = True,
        phone: bool = True,
        card: bool = True,
        iban: bool = True,
        ip: bool = True,
        secrets: bool = True,
    ) -> Redactor:
        """The built-ins: e-mail addresses → `[EMAIL]`, phone numbers → `[PHONE]`, payment
        cards (Luhn-checked) → `[CARD]`, IBANs (checksum-checked) → `[IBAN]`, IPv4 and IPv6
        addresses → `[IP]`, API keys and other secrets (OpenAI, Anthropic, AWS, GitHub,
        Slack, Google keys, JWTs, `password=...`) → `[SECRET]`."""
        chosen = {
            "secrets": secrets,
            "email": email,
            "iban": iban,
            "card": card,
            "ip": ip,
            "phone": phone,
        }
        out = cls()
        for name, on in chosen.items():
            if on:
                out._steps.extend(_Rule(re.compile(p), r, n) for n, p, r in _BUILTINS[name])
        return out

    def __add__(self, other: Redactor) -> Redactor:
        if not isinstance(other, Redactor):
            return NotImplemented
        out = Redactor()
        out._steps = [*self._steps, *other._steps]
        return out

    def redact(self, text: str) -> str:
        """The text with every match replaced."""
        if not text:
            return text
        for step in self._steps:
            text = step(text)
            if not isinstance(text, str):
                raise TypeError("a redaction function must return a str")
        return text

    __call__ = redact

    def redact_value(self, value: Any) -> Any:
        """Strings redacted anywhere inside dicts, lists and tuples; other values kept."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {k: self.redact_value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.redact_value(v) for v in value]
        return value

    def __repr__(self) -> str:
        return f"<Redactor of {len(self._steps)} steps>"


def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValidationError(
            f"redaction pattern {pattern!r} is not a valid regex: {exc}"
        ) from None


#: The redactor of the run in progress: for the nodes, for telemetry attributes and for
#: log records emitted during it. An agent run as a tool of another inherits the caller's.
CURRENT: ContextVar[Redactor | None] = ContextVar("criogen_redactor", default=None)


def effective(own: Redactor | None) -> Redactor | None:
    """The policy for a run of an agent whose own redactor is `own`: the caller's policy
    (when it runs as a tool of another agent) followed by its own."""
    outer = CURRENT.get()
    if outer is None or outer is own:
        return own
    if own is None:
        return outer
    return outer + own


class _LogFilter(logging.Filter):
    """Redacts the library's log records with the policy of the run that emits them."""

    def filter(self, record: logging.LogRecord) -> bool:
        redactor = CURRENT.get()
        if redactor is not None:
            record.msg = redactor.redact(record.getMessage())
            record.args = ()
            if record.exc_info and record.exc_info[1] is not None:
                record.exc_text = redactor.redact(
                    logging.Formatter().formatException(record.exc_info)
                )
                record.exc_info = None
        return True


logger = logging.getLogger("criogen_graph")
logger.addFilter(_LogFilter())


def redact_messages(redactor: Redactor, messages: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Transcript messages with their content and tool-call arguments redacted."""
    out = []
    for m in messages:
        m = dict(m)
        if isinstance(m.get("content"), str):
            m["content"] = redactor.redact(m["content"])
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {**c, "args": redactor.redact_value(c.get("args") or {})} for c in m["tool_calls"]
            ]
        out.append(m)
    return out
