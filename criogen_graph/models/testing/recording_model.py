"""`RecordingModel`: a real model's replies recorded to a JSON file, and the format of
such a recording (which `FakeModel.from_file` replays)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from criogen_graph.errors import ModelError
from criogen_graph.models.base import Model, ModelRequest, ModelResponse
from criogen_graph.models.testing.fake_reply import FakeReply

__all__ = ["RECORDING_VERSION", "RecordingModel", "load_recording", "reply_from_record"]

#: The version of the recording format, written in every file.
RECORDING_VERSION = 1


def reply_from_record(entry: Mapping[str, Any]) -> FakeReply:
    """The `FakeReply` that replays one recorded reply (or error)."""
    err = entry.get("error")
    if err is not None:
        reply = FakeReply.error(
            err.get("kind", "transient"),
            err.get("message"),
            retry_after=err.get("retry_after"),
            status=err.get("status"),
        )
        return reply
    return FakeReply(
        entry.get("content") or None,
        [
            {"id": c["id"], "name": c["name"], "args": c.get("args") or {}}
            for c in entry.get("tool_calls") or ()
        ],
        usage=entry.get("usage"),
        chunks=entry.get("chunks"),
        stop_reason=entry.get("stop_reason"),
    )


def load_recording(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A recording's JSON; `ValueError` saying why a file is not one."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"no recording at {path}: record one with RecordingModel") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not a recording (invalid JSON: {exc.msg})") from None
    if not isinstance(data, dict) or data.get("version") != RECORDING_VERSION:
        raise ValueError(f"{path} is not a criogen_graph recording (version {RECORDING_VERSION})")
    return data


class RecordingModel(Model):
    """Record a real model's replies to a JSON file while it runs, to replay them later
    with `FakeModel.from_file(path)` (e.g. in CI, without a key or network).

    `model` is anything `Agent(model=...)` accepts. Each call appends its reply (or its
    error) to `path`, rewritten atomically, so a recording survives a crash mid-run.
    Recording starts afresh unless `append=True`.
    """

    def __init__(self, model: Any, path: str | os.PathLike[str], *, append: bool = False) -> None:
        from criogen_graph.models import resolve_model

        self.inner = resolve_model(model, option="RecordingModel model")
        self.provider = self.inner.provider
        self.name = self.inner.name
        self.path = Path(path)
        self.replies: list[dict[str, Any]] = []
        if append and self.path.exists():
            self.replies = list(load_recording(self.path).get("replies") or ())

    async def generate(self, request: ModelRequest) -> ModelResponse:
        chunks: list[str] = []
        sink = request.on_text
        if sink is not None:

            def tee(piece: str) -> None:
                chunks.append(piece)
                sink(piece)

            request.on_text = tee
        try:
            response = await self.inner.generate(request)
        except ModelError as exc:
            self._save(
                {
                    "error": {
                        "kind": exc.kind,
                        "message": exc.message,
                        "status": exc.status,
                        "retry_after": exc.retry_after,
                    }
                }
            )
            raise
        finally:
            request.on_text = sink
        msg = response.message
        entry: dict[str, Any] = {"content": msg.get("content") or "", "usage": response.usage}
        if msg.get("tool_calls"):
            entry["tool_calls"] = [
                {"id": c["id"], "name": c["name"], "args": c.get("args") or {}}
                for c in msg["tool_calls"]
            ]
        if response.stop_reason:
            entry["stop_reason"] = response.stop_reason
        if chunks and "".join(chunks) == entry["content"]:
            entry["chunks"] = chunks
        self._save(entry)
        return response

    def _save(self, entry: dict[str, Any]) -> None:
        self.replies.append(entry)
        data = {"version": RECORDING_VERSION, "model": self.inner.identity, "replies": self.replies}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, self.path)

    async def aclose(self) -> None:
        await self.inner.aclose()
