"""An agent with long-term memory, served in LangGraph Studio or run as a script.

`Memory.by_state("user_id")` keeps one pool of facts per user, in the LangGraph store:
the facts relevant to the latest message are recalled before each model call, and the
model gets `remember`, `forget` and `search_memory` tools. In Studio the server supplies
the store; give the run input a user, e.g. `{"messages": [{"role": "user", "content":
"Remember that I prefer email"}], "state": {"user_id": "ada"}}`, then ask "How should
you contact me?" in a new thread with the same `user_id`.

Offline by default: a scripted model decides each reply from the transcript alone (it
remembers what follows "remember that" and answers from the recalled facts). Set
`CRIOGEN_EXAMPLE_MODEL=openai:gpt-5-mini` (or any "provider:model") for a real provider.

    python examples/memory_agent.py   # remember in one thread, recall in another
"""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from criogen_graph import Agent, FakeReply, FunctionModel, Memory

_REMEMBER = re.compile(r"^\s*remember(?:\s+that)?\s+(.+?)\.?\s*$", re.IGNORECASE | re.DOTALL)
_FACT = re.compile(r"^- \[[^\]]+\] (.+)$", re.MULTILINE)
RECALL_HEADER = "Facts from your long-term memory"


def scripted(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    """The offline model: each reply follows from the transcript (no hidden state)."""
    last = messages[-1]
    if last["role"] == "tool":
        return "Noted, I will remember that." if last["status"] == "ok" else last["content"]
    wanted = _REMEMBER.match(str(last.get("content") or ""))
    if wanted is not None:
        fact = wanted.group(1)
        return FakeReply.tool_call("remember", {"fact": f"The user says: {fact}."})
    recalled = [
        fact
        for m in messages
        if m["role"] == "system" and str(m.get("content", "")).startswith(RECALL_HEADER)
        for fact in _FACT.findall(m["content"])
    ]
    if not recalled:
        return "I know nothing about you yet. Tell me: 'Remember that ...'."
    return "From my memory: " + " ".join(recalled)


def build_agent(storage: str | None = None) -> Agent[Any]:
    """The memory agent (`storage=None`: in memory; Studio brings its own store)."""
    model = os.environ.get("CRIOGEN_EXAMPLE_MODEL") or FunctionModel(scripted, name="scripted")
    return Agent(
        model,
        instructions="You are a personal assistant. Remember what the user asks you to.",
        memory=Memory.by_state("user_id"),
        storage=storage,
        name="memory",
    )


agent = build_agent()
graph = agent.graph


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        assistant = build_agent(f"sqlite:///{Path(tmp) / 'memory.db'}")
        ada = {"user_id": "ada"}
        reply = await assistant.thread("monday").send("Remember that I prefer email.", state=ada)
        print(f"monday: {reply.text}")
        reply = await assistant.thread("friday").send("How should you contact me?", state=ada)
        print(f"friday: {reply.text}")
        reply = await assistant.thread("other").send(
            "How should you contact me?", state={"user_id": "bob"}
        )
        print(f"another user: {reply.text}")
        memory = assistant.memory
        assert memory is not None  # the agent has memory
        print(f"ada's facts: {[f['text'] for f in await memory.facts(state=ada)]}")
        await assistant.storage.close()


if __name__ == "__main__":
    asyncio.run(main())
