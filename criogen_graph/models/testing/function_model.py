"""`FunctionModel`: a model whose replies a Python function computes."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, cast

from criogen_graph.models.base import Model, ModelRequest, ModelResponse
from criogen_graph.models.testing.fake_reply import ReplyLike, respond

__all__ = ["FunctionModel", "ModelFn"]

#: What `FunctionModel` calls: `fn(messages, tools)` returning (or awaiting) a reply.
ModelFn = Callable[[list[dict[str, Any]], list[dict[str, Any]]], ReplyLike | Awaitable[ReplyLike]]


class FunctionModel(Model):
    """A model whose replies come from `fn(messages, tools)` (sync or async).

    `messages` is the transcript as the model would see it (system message first), `tools`
    the offered tools as `{"name", "description", "parameters"}`. `fn` returns what a
    `FakeModel` entry may be, or raises `ModelError`.
    """

    provider = "function"

    def __init__(self, fn: ModelFn, *, name: str | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"FunctionModel needs a function, got {fn!r}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", None) or "function"
        self.calls = 0

    async def generate(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        # The transcript's typed messages are plain dicts at run time, which is what `fn`
        # is documented to get.
        messages = cast("list[dict[str, Any]]", list(request.messages))
        reply = self.fn(messages, list(request.tools))
        if inspect.isawaitable(reply):
            reply = await reply
        return await respond(reply, request, self)
