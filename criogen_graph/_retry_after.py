"""How long a server asks us to wait: `Retry-After` and its relatives, read one way.

Used by every HTTP client of the library (the provider models, LangChain chat models'
errors, the OTLP exporter), so a date, a fraction or a bad value means the same wait
everywhere.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

__all__ = ["MAX_RETRY_AFTER_SECS", "parse_retry_after", "retry_after_from_headers"]

#: The longest wait a header can ask for; longer ones (up to an overflowing number of
#: digits) are read as this, which keeps the value finite (JSON-safe) and still longer
#: than any sensible `max_retry_after_secs`.
MAX_RETRY_AFTER_SECS = 366 * 24 * 3600.0

#: Delay-seconds (RFC 9110: ASCII digits), with the fraction some servers add. No sign, no
#: exponent, no `inf` / `nan`: those are not a delay.
_SECONDS = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*")


def parse_retry_after(
    value: str | None, *, now: float | None = None, unit_secs: float = 1.0
) -> float | None:
    """The wait in seconds a `Retry-After` value asks for, or None when there is none.

    `value` is delay-seconds (`"120"`, or with a fraction: `"1.5"`) or an HTTP date
    (`"Wed, 21 Oct 2026 07:28:00 GMT"`; a date in the past means 0). `unit_secs` scales
    a number (`0.001` for `retry-after-ms`); `now` (a `time.time()`) is the clock a date
    is compared with. Anything else (empty, a negative or signed number, `inf`, `nan`,
    text that is neither) is None: the caller's own backoff applies. The result is at
    most `MAX_RETRY_AFTER_SECS`.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"a Retry-After value must be a str, got {type(value).__name__}")
    match = _SECONDS.fullmatch(value)
    if match is not None:
        # Only an absurd number of digits overflows to inf; it reads as the maximum.
        return min(float(match.group(1)) * unit_secs, MAX_RETRY_AFTER_SECS)
    if unit_secs != 1.0:
        return None  # dates are for `Retry-After` only
    return _until(value, time.time() if now is None else now)


def _until(value: str, now: float) -> float | None:
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        # `-0000` ("no zone information"): HTTP dates are GMT.
        from datetime import UTC

        when = when.replace(tzinfo=UTC)
    try:
        wait = when.timestamp() - now
    except (OverflowError, ValueError, OSError):
        return None
    return min(max(wait, 0.0), MAX_RETRY_AFTER_SECS)


def retry_after_from_headers(headers: Any, *, now: float | None = None) -> float | None:
    """The wait the headers of a response ask for: `retry-after-ms` (OpenAI and Azure send
    it, in milliseconds; it is the more precise, so it wins) else `Retry-After`. Names
    are matched case-insensitively, in an `httpx.Headers`, a plain mapping or a list of
    pairs; None when neither header holds a usable value."""
    if headers is None:
        return None
    millis = parse_retry_after(_header(headers, "retry-after-ms"), unit_secs=0.001)
    if millis is not None:
        return millis
    return parse_retry_after(_header(headers, "retry-after"), now=now)


def _header(headers: Any, name: str) -> str | None:
    """The value of header `name` (lower case), whatever holds the headers."""
    get = getattr(headers, "get", None)
    if get is not None:
        value = get(name)
        if value is not None:
            return _text(value)
    items: Any = headers.items() if isinstance(headers, Mapping) else headers
    try:
        for key, value in items:
            if _text(key).lower() == name:
                return _text(value)
    except (TypeError, ValueError):
        return None
    return None


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return value if isinstance(value, str) else str(value)
