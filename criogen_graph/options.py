"""Plain option records: `Limits` and `Retry`."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from criogen_graph.errors import ValidationError

__all__ = ["Limits", "Retry"]


def _check_number(owner: str, name: str, value: Any, *, allow_none: bool, minimum: float) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{owner}.{name} must be a number, got {value!r}")
    if value < minimum:
        raise ValidationError(
            f"{owner}.{name} must be >= {minimum}, got {value!r}", code="invalid_value"
        )


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on one run.

    `model_calls` (retries of one call do not count), `tool_calls`, `tokens` (input plus
    output tokens across the run, checked before each model call; `None` = no bound) and
    `tool_timeout_secs` (per tool call; a timeout goes back to the model as an error).
    Reaching any other limit fails the run with `LimitExceededError`.
    """

    model_calls: int = 25
    tool_calls: int = 200
    tokens: int | None = None
    tool_timeout_secs: float = 60

    def __post_init__(self) -> None:
        _check_number("Limits", "model_calls", self.model_calls, allow_none=False, minimum=1)
        _check_number("Limits", "tool_calls", self.tool_calls, allow_none=False, minimum=0)
        _check_number("Limits", "tokens", self.tokens, allow_none=True, minimum=1)
        _check_number(
            "Limits", "tool_timeout_secs", self.tool_timeout_secs, allow_none=False, minimum=0.001
        )

    @classmethod
    def coerce(cls, value: Limits | Mapping[str, Any] | None) -> Limits:
        """A `Limits` from a `Limits`, a dict of its fields, or `None` (the defaults)."""
        return _coerce(cls, value, name="limits")


@dataclass(frozen=True, slots=True)
class Retry:
    """How often and how patiently to retry; missing fields keep the defaults.

    `max_attempts` counts every attempt including the first. The wait before attempt
    `n + 1` is `initial_backoff_secs * factor ** (n - 1)`, capped at `max_backoff_secs`;
    with `jitter` a random part of it ("full jitter").
    """

    max_attempts: int = 3
    initial_backoff_secs: float = 0.5
    factor: float = 2
    max_backoff_secs: float = 20
    jitter: bool = True

    def __post_init__(self) -> None:
        _check_number("Retry", "max_attempts", self.max_attempts, allow_none=False, minimum=1)
        _check_number(
            "Retry", "initial_backoff_secs", self.initial_backoff_secs, allow_none=False, minimum=0
        )
        _check_number("Retry", "factor", self.factor, allow_none=False, minimum=1)
        _check_number(
            "Retry", "max_backoff_secs", self.max_backoff_secs, allow_none=False, minimum=0
        )
        if not isinstance(self.jitter, bool):
            raise TypeError(f"Retry.jitter must be a bool, got {self.jitter!r}")

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        wait = min(self.max_backoff_secs, self.initial_backoff_secs * self.factor ** (attempt - 1))
        return random.uniform(0, wait) if self.jitter else wait

    @classmethod
    def coerce(cls, value: Retry | Mapping[str, Any] | None, *, name: str) -> Retry:
        """A `Retry` from a `Retry`, a dict of its fields, or `None` (the defaults)."""
        return _coerce(cls, value, name=name)


_Record = TypeVar("_Record", Limits, Retry)


def _coerce(cls: type[_Record], value: object, *, name: str) -> _Record:
    """The option `name` as a `cls`: given as one, as a dict of its fields, or `None`."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in value if k not in known)
        if unknown:
            raise ValidationError(
                f"unknown {name} key(s) {unknown}; the keys are {sorted(known)}",
                code="unknown",
            )
        return cls(**value)
    raise TypeError(f"{name} must be a {cls.__name__} or a dict, got {type(value).__name__}")
