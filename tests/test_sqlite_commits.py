"""Commits per `thread.send` on SQLite, read from the write-ahead log: a regression guard
for what `synchronous=full` costs per turn (one disk flush per commit).

A send of the benchmarks' job (the model calls a tool, then answers) commits three
times: the tool call before the tool runs (with the input and the first model turn),
the tool's result as it exists, the answer. LangGraph's savers commit nine times."""

from __future__ import annotations

import struct
import uuid
from pathlib import Path
from typing import Any

from criogen_graph import Agent, FakeReply, FunctionModel, Storage, tool


def wal_commits(db: Path) -> int:
    """Commit frames in `db`'s write-ahead log since it was last reset: frames whose salt
    is the log's current one and whose "database size after commit" field is set."""
    wal = Path(f"{db}-wal")
    if not wal.exists():
        return 0
    data = wal.read_bytes()
    if len(data) < 32:
        return 0
    page_size = struct.unpack(">I", data[8:12])[0]
    salt = data[16:24]
    commits, offset = 0, 32
    while offset + 24 + page_size <= len(data):
        header = data[offset : offset + 24]
        if header[8:16] != salt:
            break  # frames of before the last reset
        commits += struct.unpack(">I", header[4:8])[0] != 0
        offset += 24 + page_size
    return commits


def agent_on(storage: Storage) -> Agent[Any]:
    @tool
    def echo(text: str) -> str:
        """Echo the text back."""
        return text

    def script(messages: Any, tools: Any) -> Any:
        if messages[-1]["role"] == "user":
            return FakeReply.tool_call("echo", {"text": "hi"}, id=f"c{uuid.uuid4().hex[:8]}")
        return "done"

    return Agent(FunctionModel(script), tools=[echo], storage=storage)


async def test_a_send_commits_three_times(tmp_path: Path) -> None:
    db = tmp_path / "threads.db"
    storage = Storage(f"sqlite:///{db}?synchronous=full")
    await storage.open()
    try:
        agent = agent_on(storage)
        await agent.thread("warm-up").send("go")
        before = wal_commits(db)
        tids = [uuid.uuid4().hex for _ in range(5)]
        for tid in tids:
            assert (await agent.thread(tid).send("go")).text == "done"
        per_send = (wal_commits(db) - before) / len(tids)
        assert per_send <= 3, f"{per_send} commits per send"
        # What the sends saved is all there, the audit trail included.
        for tid in tids:
            roles = [m["role"] for m in await agent.thread(tid).messages()]
            assert roles == ["user", "assistant", "tool", "assistant"]
            actions = [r["action"] for r in await storage.audit(tid)]
            assert actions.count("tool_call") == 1
            assert actions == ["send", "tool_call"], actions
    finally:
        await storage.close()
