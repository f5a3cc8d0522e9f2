"""A thread on SQLite whose answers stream as they are written, with one redaction policy
for what the model sees, what is saved, what streams and what is logged.

    python examples/streaming_redaction.py

Offline it plays a scripted `FakeModel`; pass a `"provider:model"` string for a real model.
"""

import asyncio
import tempfile
from pathlib import Path

from criogen_graph import Agent, FakeModel, FakeReply, Redactor, tool


@tool
def find_customer(name: str) -> str:
    """Find a customer's contact details."""
    return f"{name}: jane.doe@example.com, +44 20 7946 0958"


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        agent = Agent(
            FakeModel(
                [
                    FakeReply.tool_call("find_customer", {"name": "Jane"}),
                    FakeReply.text(
                        "Jane is at jane.doe@example.com; call +44 20 7946 0958 after 9.",
                        chunks=[
                            "Jane is at jane.d",
                            "oe@example.com; call +4",
                            "4 20 7946 0958 after 9.",
                        ],
                    ),
                ]
            ),
            tools=[find_customer],
            storage=f"sqlite:///{Path(tmp) / 'threads.db'}",
            redact=Redactor.pii() + Redactor({r"\bJane\b": "[NAME]"}),
        )
        stream = agent.thread("ticket-7").stream("How do I reach Jane?")
        async for event in stream:
            if event.type == "tool_call_started":
                print(f"[{event.tool}({event.args})]")
            elif event.type == "text":
                print(event.text, end="", flush=True)
        reply = await stream.reply()
        print()
        print("saved:", (await agent.thread("ticket-7").messages())[-1]["content"])
        assert reply.text is not None and "@" not in reply.text
        await agent.storage.close()


if __name__ == "__main__":
    asyncio.run(main())
