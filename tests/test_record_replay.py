"""Record a real provider run to a JSON file, replay it later as a FakeModel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from criogen_graph import Agent, FakeModel, RecordingModel, Retry, TextEvent, openai, tool
from tests.servers import openai_server as oa


@tool
async def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


async def test_record_then_replay(openai_server: oa.OpenAIServer, tmp_path: Path) -> None:
    path = tmp_path / "replies.json"
    openai_server.add(
        oa.error(429, "slow down", headers={"retry-after": "0"}),
        oa.tool_calls(("add", {"a": 2, "b": 3})),
        oa.text(
            "2 + 3 is five, as computed by the tool.",
            usage={"prompt_tokens": 30, "completion_tokens": 9},
        ),
    )
    live = RecordingModel(openai("gpt-test", api_key="k", base_url=openai_server.base_url), path)
    agent = Agent(live, tools=[add], model_retry=Retry(initial_backoff_secs=0))
    stream = agent.thread("rec").stream("2+3?")
    live_text = "".join([e.text async for e in stream if isinstance(e, TextEvent)])
    recorded = await stream.reply()

    data = json.loads(path.read_text())
    assert data["model"] == {"provider": "openai", "model": "gpt-test"}
    assert [("error" in r) for r in data["replies"]] == [True, False, False]
    assert data["replies"][0]["error"]["kind"] == "rate_limit"

    # replay: no server, same conversation
    replay = FakeModel.from_file(path)
    agent2 = Agent(replay, tools=[add], model_retry=Retry(initial_backoff_secs=0))
    stream = agent2.thread("replay").stream("2+3?")
    events = [e async for e in stream]
    replayed = await stream.reply()
    assert "".join(e.text for e in events if isinstance(e, TextEvent)) == live_text
    assert [len(e.text) for e in events if isinstance(e, TextEvent)] == [8] * 4 + [
        7
    ]  # the recorded chunks
    strip = lambda ms: [{k: v for k, v in m.items() if k != "id"} for m in ms]  # noqa: E731
    assert strip(replayed.messages) == strip(recorded.messages)  # tool call ids included
    assert replayed.usage == recorded.usage
    assert replayed.model_calls == recorded.model_calls == 2
    assert replayed.answered_by == {"provider": "fake", "model": "gpt-test"}
    assert replay.remaining == 0


def test_bad_recordings(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no recording"):
        FakeModel.from_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a recording"):
        FakeModel.from_file(bad)
    bad.write_text(json.dumps({"replies": []}))
    with pytest.raises(ValueError, match="not a criogen_graph recording"):
        FakeModel.from_file(bad)
