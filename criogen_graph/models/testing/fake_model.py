"""`FakeModel`: a model that answers from a script, for tests and demos."""

from __future__ import annotations

import os
from collections.abc import Iterable

from criogen_graph.errors import ModelError
from criogen_graph.models.base import Model, ModelRequest, ModelResponse
from criogen_graph.models.testing.fake_reply import FakeReply, ReplyLike, respond
from criogen_graph.models.testing.recording_model import load_recording, reply_from_record

__all__ = ["FakeModel"]


class FakeModel(Model):
    """A model that answers from a script: each call takes the next entry of `replies`
    (a `str` final answer, a `FakeReply`, or a JSON value for typed output).

    The script is shared by every run of the agents that use this model, so one
    `FakeModel` can script a whole conversation. A call after the last entry fails with a
    `ModelError` (kind `bad_request`) saying the script ran out. `calls` records each
    `ModelRequest` it received.
    """

    provider = "fake"

    def __init__(self, replies: Iterable[ReplyLike], *, name: str = "fake") -> None:
        if isinstance(replies, str | bytes | FakeReply):
            raise TypeError("FakeModel takes a list of replies, e.g. FakeModel(['Hello.'])")
        self._replies: list[ReplyLike] = list(replies)
        self._next = 0
        self.name = name
        self.calls: list[ModelRequest] = []

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, name: str | None = None) -> FakeModel:
        """Replay a recording made with `RecordingModel`: the same replies (text, tool
        calls with their ids, usage, stop reasons, errors, streamed chunks), in order. The
        model's name is the recorded one."""
        data = load_recording(path)
        replies: list[ReplyLike] = [reply_from_record(e) for e in data.get("replies") or ()]
        recorded = data.get("model") or {}
        return cls(replies, name=name or str(recorded.get("model") or "replay"))

    @property
    def remaining(self) -> int:
        """Replies not used yet."""
        return len(self._replies) - self._next

    async def generate(self, request: ModelRequest) -> ModelResponse:
        self.calls.append(request)
        if self._next >= len(self._replies):
            raise ModelError(
                f"FakeModel {self.name!r} ran out of replies after {len(self._replies)} "
                "call(s); add a reply to its script for every model call the run makes",
                kind="bad_request",
                provider=self.provider,
                model=self.name,
            )
        reply = self._replies[self._next]
        self._next += 1
        return await respond(reply, request, self)
