"""`Redactor`: one policy that strips identifiers from every text the agent handles."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from typing import Any, TypeVar, cast

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


_non_digits = re.compile(r"\D").sub
_spaces = re.compile(r"\s").sub


def _card(m: re.Match[str]) -> str:
    digits = _non_digits("", m.group(0))
    return "[CARD]" if 13 <= len(digits) <= 19 and _luhn(digits) else m.group(0)


def _iban(m: re.Match[str]) -> str:
    raw = _spaces("", m.group(0)).upper()
    moved = raw[4:] + raw[:4]
    number = "".join(str(int(c, 36)) for c in moved)
    return "[IBAN]" if 15 <= len(raw) <= 34 and int(number) % 97 == 1 else m.group(0)


def _phone(m: re.Match[str]) -> str:
    digits = _non_digits("", m.group(0))
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
    return "[IP]" if all(int(part) <= 255 for part in m.group(0).split(".")) else m.group(0)


# The built-ins, family by family, in the order they apply: secrets and cards before phones
# (long digit runs), IBANs before both. Each rule: needles (it runs only when one of them is
# in the text), the pattern, its replacement. Patterns start with a literal or a character
# class and check the character before it with a lookbehind placed after that first
# character, so the regex engine skips ahead to candidates instead of trying every position.
# `Redactor.pii()` runs them through the fast paths below; the result is the same as
# running these patterns in this order over the whole text.
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
    """A pattern and its replacement, run only when one of its needles is in the text."""

    __slots__ = ("fold", "needles", "pattern", "replacement", "sub")

    def __init__(
        self,
        pattern: re.Pattern[str],
        replacement: Replace,
        needles: tuple[str, ...] | None = None,
    ) -> None:
        self.pattern = pattern
        self.sub = pattern.sub
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
        return self.sub(self.replacement, text)


def _rules(name: str) -> list[_Rule]:
    return [_Rule(re.compile(p), r, n) for n, p, r in _BUILTINS[name]]


# -- the fast paths of the built-ins ----------------------------------------------------
#
# A regex scan costs about 0.1 us at every position where the pattern's first character
# could match, and a whole scan more than that when the code and tables are not in the
# CPU's caches, as in an agent turn. So each family runs only where it can match, found
# with as few scans as possible. tests/test_redact.py checks on generated texts that the
# result is the same as running the patterns of `_BUILTINS` in order over the whole text.


class _Secrets:
    """The secret rules. The token rules share parts of their needles (`k-` in `sk-`,
    `pk-`, `rk-`, `sk-ant-`; `_` in `_live_` and `ghp_`), so a text with neither skips
    five rules after two searches."""

    __slots__ = ("keyword", "tokens")

    #: Per token rule of `_BUILTINS["secrets"]`, the part all its needles contain.
    _SHARED = ("k-", "k-", "_", None, "_", None, None, None)

    def __init__(self) -> None:
        *tokens, self.keyword = _rules("secrets")
        self.tokens = list(zip(tokens, self._SHARED, strict=True))

    def __call__(self, text: str) -> str:
        dash = "k-" in text
        underscore = "_" in text
        for rule, shared in self.tokens:
            if (shared == "k-" and not dash) or (shared == "_" and not underscore):
                continue
            text = rule(text)
        return self.keyword(text)


_EMAIL_DOMAIN = re.compile(r"@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,}\b")
_EMAIL_LOCAL = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._%+-")


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"  # what `\b` calls a word character


def _email(text: str) -> str:
    """The e-mail rule: `@` and the domain are found by a search that starts with a
    literal; the local part is read backwards from the `@`, from where the pattern's `\b`
    lets it start."""
    if "@" not in text:
        return text
    out: list[str] = []
    last = 0
    for m in _EMAIL_DOMAIN.finditer(text):
        at = m.start()
        start = at
        while start > last and text[start - 1] in _EMAIL_LOCAL:
            start -= 1
        while start < at and (start > 0 and _is_word(text[start - 1])) == _is_word(text[start]):
            start += 1
        if start == at:
            continue
        out.append(text[last:start])
        out.append("[EMAIL]")
        last = m.end()
    if not out:
        return text
    out.append(text[last:])
    return "".join(out)


#: Runs of digits and of the separators the digit-shaped rules allow, from a character
#: one of them can start with, at least `_RUN_MIN` long: every match of those rules lies
#: inside one such run (the shortest are an IPv4 address, `1.1.1.1`, and `+123456`).
#: An ASCII text (`str.isascii` costs nothing) is scanned with a character class the
#: engine checks by bitmap; any other with `\d`, which takes every script's digits.
_RUN_MIN = 7
_RUN_ASCII = re.compile(r"[0-9+(][0-9 \-.()+]{6,}")
_RUN_ANY = re.compile(r"[\d+(][\d \-.()+]{6,}")
#: Where an IBAN could start: two capitals and a digit.
_IBAN_START = re.compile(r"[A-Z][A-Z]\d")
#: The shortest match of each digit-shaped rule, by its pattern.
_SHORTEST = {"card": 13, "ipv4": 7, "+": 7, "(": 13, "nanp": 12, "0": 8}


class _Digits:
    """The IBAN, card, IPv4, IPv6 and phone rules, in that order. The IBAN rule runs on
    the whole text when two capitals and a digit are in it, the IPv6 rule when two colons
    at most four hex digits apart are; the others run on each run of digits long enough to
    hold a match of one of them, with the characters around it that the patterns look at
    (one before, two after)."""

    __slots__ = ("after_ipv6", "before_ipv6", "everything", "iban", "ipv6")

    _IPV6_GATE = re.compile(r":[0-9A-Fa-f]{0,4}:")

    def __init__(
        self,
        iban: _Rule | None,
        before_ipv6: list[tuple[_Rule, int]],
        ipv6: _Rule | None,
        after_ipv6: list[tuple[_Rule, int]],
    ) -> None:
        self.iban = iban
        self.before_ipv6 = before_ipv6
        self.ipv6 = ipv6
        self.after_ipv6 = after_ipv6
        self.everything = before_ipv6 + after_ipv6

    def __call__(self, text: str) -> str:
        if self.iban is not None and _IBAN_START.search(text) is not None:
            text = self.iban(text)
        if self.ipv6 is not None and ":" in text and self._IPV6_GATE.search(text) is not None:
            # The replacement of an address can change what the phone patterns see
            # around it, so the order holds: cards, IPv4, IPv6, then phones.
            text = self.ipv6(_in_runs(text, self.before_ipv6))
            return _in_runs(text, self.after_ipv6)
        return _in_runs(text, self.everything)


def _in_runs(text: str, rules: list[tuple[_Rule, int]]) -> str:
    """`rules` (each with the length of its shortest match) applied to the runs of digits."""
    if not rules:
        return text
    windows: list[list[int]] = []
    for m in (_RUN_ASCII if text.isascii() else _RUN_ANY).finditer(text):
        s, e = m.span()
        lo, hi = max(s - 1, 0), e + 2
        if windows and lo < windows[-1][1]:
            windows[-1][1] = hi
        else:
            windows.append([lo, hi])
    if not windows:
        return text
    out: list[str] = []
    last = 0
    for lo, hi in windows:
        window = text[lo:hi]
        for rule, shortest in rules:
            if len(window) >= shortest:  # the window holds up to three characters of context
                window = rule(window)
        out.append(text[last:lo])
        out.append(window)
        last = hi
    out.append(text[last:])
    return "".join(out)


_NEVER = float("inf")


class Redactor:
    """Strips identifiers from text: regex `patterns` mapped to replacements, and/or a
    plain function `fn(text) -> text`. `Redactor.pii()` has the built-ins; `a + b` applies
    `a`, then `b`.

    Give it as `Agent(redact=...)`: it applies to every text before each model call (the
    input, the model's replies and its tool-call arguments, tool results), ahead of all
    hooks, so the saved transcript is the redacted one; and the same policy applies to
    everything else a run saves, audits, exports or logs: a failed run's error text, a
    reviewer's decisions (an edit's arguments are redacted before they are checked and
    run), what hooks write, telemetry attributes and the library's log records. Numbers
    inside values are redacted by their digits (see `redact_value`).
    """

    __slots__ = ("_fractions", "_numbers_from", "_steps")

    def __init__(
        self,
        patterns: Mapping[str, str] | None = None,
        fn: Callable[[str], str] | None = None,
    ) -> None:
        self._steps: list[Callable[[str], str]] = []
        # Which numbers a step may change by their text: a pattern or a function any;
        # of the built-ins only the card rule matches digits alone, from 13 of them,
        # and no identifier they know is a fraction (`pii` sets both).
        custom = bool(patterns) or fn is not None
        self._numbers_from: float = 0 if custom else _NEVER
        self._fractions = custom
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
        out = cls()
        if secrets:
            out._steps.append(_Secrets())
        if email:
            out._steps.append(_email)
        ipv4, ipv6 = _rules("ip") if ip else (None, None)
        before_ipv6 = [
            *(zip(_rules("card"), [_SHORTEST["card"]], strict=True) if card else []),
            *([(ipv4, _SHORTEST["ipv4"])] if ipv4 is not None else []),
        ]
        after_ipv6 = (
            list(zip(_rules("phone"), [_SHORTEST[k] for k in ("+", "(", "nanp", "0")], strict=True))
            if phone
            else []
        )
        if iban or before_ipv6 or ipv6 or after_ipv6:
            out._steps.append(
                _Digits(_rules("iban")[0] if iban else None, before_ipv6, ipv6, after_ipv6)
            )
        out._numbers_from = 10**12 if card else _NEVER
        out._fractions = False
        return out

    def __add__(self, other: Redactor) -> Redactor:
        if not isinstance(other, Redactor):
            return NotImplemented
        out = Redactor()
        out._steps = [*self._steps, *other._steps]
        out._numbers_from = min(self._numbers_from, other._numbers_from)
        out._fractions = self._fractions or other._fractions
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
        """`value` with every string inside dicts, lists and tuples redacted, dict keys
        included. A number is redacted by its decimal text (an integral float by its
        digits): one the policy changes (a card number given as an int) becomes that
        text, `"[CARD]"`, a string; other numbers, and values of other types, are kept.
        The built-ins change no fraction: no identifier they know is one."""
        return self._value(value, {})

    def _value(self, value: Any, keys: dict[str, str]) -> Any:
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                if isinstance(k, str):
                    # Records in a list repeat their keys: each is redacted once.
                    clean = keys.get(k)
                    if clean is None:
                        clean = keys[k] = self.redact(k)
                    k = clean
                elif isinstance(k, int | float):
                    k = self._number(k)
                out[k] = self._value(v, keys)
            return out
        if isinstance(value, list | tuple):
            return [self._value(v, keys) for v in value]
        if isinstance(value, int | float):
            return self._number(value)
        return value

    def _number(self, value: float) -> Any:
        if isinstance(value, bool):
            return value
        try:
            if isinstance(value, int) or value.is_integer():
                if not abs(value) >= self._numbers_from:
                    return value
                text = str(int(value))  # a card number read as a float is still its digits
            elif self._fractions:
                text = str(value)
            else:
                return value
        except ValueError:
            return value  # beyond Python's int-to-text limit: no JSON or msgpack holds it
        clean = self.redact(text)
        return value if clean == text else clean

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


_FILTER = _LogFilter()


def package_logger(name: str) -> logging.Logger:
    """The library's logger `name` (`criogen_graph` or one under it), its records
    redacted with the policy of the run that emits them. (A logger's filter does not
    apply to records of the loggers under it, so each gets its own.)"""
    log = logging.getLogger(name)
    if _FILTER not in log.filters:
        log.addFilter(_FILTER)
    return log


logger = package_logger("criogen_graph")


#: A transcript message type (`messages.Message` or one of its kinds, or a plain dict).
_M = TypeVar("_M", bound=Mapping[str, Any])


def redact_messages(redactor: Redactor, messages: Iterable[_M]) -> list[_M]:
    """Transcript messages with their content, reasoning and tool-call arguments
    redacted. A signed thinking block whose text the policy changes loses its signature
    (it no longer matches, and the provider would reject it): it is not sent back.
    Each comes back as a copy of the same kind: the same keys, text for text."""
    out: list[_M] = []
    for given in messages:
        m = dict(given)
        if "content" in m:
            m["content"] = redact_content(redactor, m["content"])
        for key in ("reasoning", "commentary"):
            if isinstance(m.get(key), str):
                m[key] = redactor.redact(m[key])
        if isinstance(m.get("reasoning_blocks"), list):
            m["reasoning_blocks"] = [_redacted_block(redactor, b) for b in m["reasoning_blocks"]]
        if isinstance(m.get("reasoning_items"), list):
            # OpenAI Responses reasoning items: the summary is readable text; the
            # encrypted content is the provider's ciphertext and goes back as it came.
            m["reasoning_items"] = [_redacted_item(redactor, r) for r in m["reasoning_items"]]
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {**c, "args": redactor.redact_value(c.get("args") or {})} for c in m["tool_calls"]
            ]
        out.append(cast(_M, m))
    return out


#: Keys of content blocks whose values are binary data (base64), not text: a pattern that
#: happened to match inside one would corrupt the image or file.
_DATA_KEYS = frozenset({"data", "base64", "image_bytes"})


def redact_content(redactor: Redactor, content: Any) -> Any:
    """A message's content with its text redacted: a string, or a list of content blocks
    (text blocks, and any text nested in other blocks: a URL, a document's text, a
    tool result's parts). Base64 data (`data:` URLs, `data` fields) is kept as it is."""
    if isinstance(content, str):
        if content.startswith("data:") and ";base64," in content[:200]:
            return content
        return redactor.redact(content)
    if isinstance(content, list | tuple):
        return [redact_content(redactor, part) for part in content]
    if isinstance(content, Mapping):
        return {
            k: v if k in _DATA_KEYS or k == "type" else redact_content(redactor, v)
            for k, v in content.items()
        }
    return content


def _redacted_block(redactor: Redactor, block: Any) -> Any:
    if isinstance(block, dict) and isinstance(block.get("input"), dict):
        # A server tool's call (Anthropic web search): its input is the model's text.
        return {**block, "input": redactor.redact_value(block["input"])}
    if not isinstance(block, dict) or not isinstance(block.get("thinking"), str):
        return block
    clean = redactor.redact(block["thinking"])
    if clean == block["thinking"]:
        return block
    out = {**block, "thinking": clean}
    out.pop("signature", None)
    return out


def _redacted_item(redactor: Redactor, item: Any) -> Any:
    if not isinstance(item, dict):
        return item
    out = dict(item)
    # The summary and the reasoning text (`content`) are readable text.
    for key in ("summary", "content"):
        if isinstance(item.get(key), list):
            out[key] = [redactor.redact(x) if isinstance(x, str) else x for x in item[key]]
    return out
