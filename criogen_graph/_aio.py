"""Awaiting work that a cancellation must not cut off half-way.

A run that is cancelled (a request timeout, a client that went away) still has to save
what it finished and release what it holds; these helpers finish such work first and
let the cancellation take effect after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def to_the_end(aw: Awaitable[T]) -> T:
    """Await `aw` to its end even if this task is cancelled meanwhile. The cancellation
    stays pending (`asyncio.current_task().cancelling()`) for the caller to raise once it
    has handed over what `aw` produced (see `cancel_pending`)."""
    inner = asyncio.ensure_future(aw)
    while True:
        try:
            await asyncio.shield(inner)
        except asyncio.CancelledError:
            if not inner.done():
                continue
            # Done as the cancellation came: its outcome stands (and is not lost).
        return inner.result()


async def uncancelled(aw: Awaitable[T]) -> T:
    """Await `aw` to its end even if this task is cancelled meanwhile, then raise that
    cancellation (if any)."""
    inner = asyncio.ensure_future(aw)
    cancelled: asyncio.CancelledError | None = None
    while True:
        try:
            await asyncio.shield(inner)
        except asyncio.CancelledError as exc:
            if not inner.done() or not inner.cancelled():
                cancelled = exc
            if not inner.done():
                continue
        break
    result = inner.result()  # its own error (or cancellation) first
    if cancelled is not None:
        raise cancelled
    return result


def cancel_pending() -> bool:
    """Whether this task was asked to cancel and has not let it take effect yet."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
