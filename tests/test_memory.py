"""Long-term memory and document collections on every backend; one user's facts never
reach another user's run."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import (
    Agent,
    CollectionTool,
    FakeModel,
    FakeReply,
    FunctionModel,
    Memory,
    Storage,
    ValidationError,
)
from tests.conftest import storage_url


class Seen:
    """A model that records what it was shown and plays a script of replies."""

    def __init__(self, *replies: Any) -> None:
        self.replies = list(replies)
        self.calls: list[list[dict[str, Any]]] = []

    def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        self.calls.append(messages)
        return self.replies.pop(0) if self.replies else "ok"

    def shown(self, i: int = -1) -> str:
        return "\n".join(str(m.get("content")) for m in self.calls[i])


def tool_results(reply: Any) -> list[str]:
    return [m["content"] for m in reply.messages if m["role"] == "tool"]


async def test_recall_and_memory_tools(storage: Storage, thread_id: str) -> None:
    model = Seen(
        FakeReply.tool_call("remember", {"fact": "Ada prefers green tea"}),
        "noted",
        "",  # second run: recall happens before this call
        FakeReply.tool_call("search_memory", {"query": "tea"}),
        "found",
    )
    agent = Agent(FunctionModel(model), memory=Memory.by_state("user_id"), storage=storage)
    ada = {"user_id": f"ada-{thread_id}"}  # tests share the PostgreSQL store
    reply = await agent.thread(thread_id).send("I like green tea", state=ada)
    assert tool_results(reply)[0].startswith("Remembered [fact_")
    (fact,) = await agent.memory.facts(state=ada)
    assert fact["text"] == "Ada prefers green tea" and fact["source"]["thread_id"] == thread_id
    await agent.thread(thread_id + "-2").send("what tea?", state=ada)
    recall = next(m for m in model.calls[2] if m["role"] == "system")
    assert f"[{fact['id']}] Ada prefers green tea" in recall["content"]
    assert all(
        m.get("role") != "system" for m in (await agent.thread(thread_id + "-2").messages())
    )  # not saved
    reply = await agent.thread(thread_id + "-3").send("search", state=ada)
    assert '"fact": "Ada prefers green tea"' in tool_results(reply)[0]
    forgot = Agent(
        FakeModel([FakeReply.tool_call("forget", {"fact_id": fact["id"]}), "gone"]),
        memory=Memory.by_state("user_id"),
        storage=storage,
    )
    reply = await forgot.thread(thread_id + "-4").send("forget it", state=ada)
    assert tool_results(reply) == [f"Forgot [{fact['id']}]"]
    assert await agent.memory.facts(state=ada) == []


async def test_one_users_facts_never_reach_another(storage: Storage, thread_id: str) -> None:
    memory = Memory.by_state("user_id")
    ada, bob_state = {"user_id": f"ada-{thread_id}"}, {"user_id": f"bob-{thread_id}"}
    setup = Agent(FakeModel([]), memory=memory, storage=storage)
    secret = await setup.memory.remember("Ada's door code is 4321", state=ada)
    await setup.memory.remember("Bob likes coffee", state=bob_state)

    model = Seen(
        FakeReply.tool_calls(
            ("search_memory", {"query": "door code"}), ("forget", {"fact_id": secret["id"]})
        ),
        "done",
    )
    bob = Agent(FunctionModel(model), memory=memory, storage=storage)
    reply = await bob.thread(thread_id).send("what is the door code?", state=bob_state)
    everything = "\n".join(model.shown(i) for i in range(len(model.calls))) + str(reply.messages)
    assert "4321" not in everything  # not through recall, not through search
    search, forget = tool_results(reply)
    assert search == "No matching facts."
    assert forget == f"Error: there is no fact {secret['id']} in memory"
    assert [f["text"] for f in await setup.memory.facts(state=ada)] == ["Ada's door code is 4321"]
    # state values that look alike stay apart
    assert await setup.memory.facts(state={"user_id": f"ada-{thread_id} "}) == []


async def test_missing_scope_key_fails_before_any_model_call(
    storage: Storage, thread_id: str
) -> None:
    model = FakeModel(["never"])
    agent = Agent(model, memory=Memory.by_state("user_id"), storage=storage)
    with pytest.raises(ValidationError) as info:
        await agent.run("hi")
    assert info.value.code == "missing" and "user_id" in str(info.value)
    with pytest.raises(ValidationError):
        await agent.thread(thread_id).send("hi", state={"tenant": "x"})
    with pytest.raises(ValidationError):
        agent.thread(thread_id).stream("hi")
    with pytest.raises(ValidationError):
        await agent.memory.facts()
    assert model.remaining == 1 and model.calls == []
    assert await agent.thread(thread_id).history() == []  # nothing saved


async def test_every_send_path_checks_the_scope_key(storage: Storage, thread_id: str) -> None:
    # One input check for every way a send starts: a background job's `send_as` and
    # `stream_as`, and `submit`, refuse a run without the scope key as `send` does.
    model = FakeModel(["never"])
    agent = Agent(model, memory=Memory.by_state("user_id"), storage=storage)
    thread = agent.thread(thread_id)
    with pytest.raises(ValidationError) as info:
        await thread.send_as("hi", state={"tenant": "x"}, run_id="job-1")
    assert info.value.code == "missing"
    with pytest.raises(ValidationError):
        thread.stream_as("hi", state=None, run_id="job-2")
    with pytest.raises(ValidationError):
        await thread.submit("hi")
    assert model.calls == []
    assert await thread.history() == []


async def test_shared_memory_and_recall_ranking(storage: Storage, thread_id: str) -> None:
    memory = Memory.shared(f"team-{thread_id}", recall=2)
    model = Seen("ok", "ok")
    agent = Agent(FunctionModel(model), memory=memory, storage=storage)
    for fact in (
        "The office is in Oslo",
        "Standup is at 9:30",
        "The VPN needs a token",
        "Lunch is at noon",
    ):
        await agent.memory.remember(fact)
    await agent.run("when is standup?", state={"user_id": "anyone"})
    recall = next(m["content"] for m in model.calls[0] if m["role"] == "system")
    lines = recall.splitlines()[1:]
    assert len(lines) == 2 and "Standup is at 9:30" in lines[0]  # best match first, then the newest
    assert "Lunch is at noon" in lines[1]
    memory0 = Agent(
        FunctionModel(model), memory=Memory.shared(f"team-{thread_id}", recall=0), storage=storage
    )
    await memory0.run("when is standup?")
    assert all(m["role"] != "system" for m in model.calls[-1])


async def test_semantic_recall_with_an_embedding_function(storage: Storage, thread_id: str) -> None:
    topics = {
        "tea": [1.0, 0.0, 0.0],
        "beverage": [0.9, 0.1, 0.0],
        "car": [0.0, 1.0, 0.0],
        "vehicle": [0.0, 0.95, 0.05],
    }

    def embed(texts: list[str]) -> list[list[float]]:
        out = []
        for t in texts:
            v = [0.0, 0.0, 0.01]
            for word, vec in topics.items():
                if word in t.lower():
                    v = [a + b for a, b in zip(v, vec, strict=True)]
            out.append(v)
        return out

    memory = Memory.shared(f"semantic-{thread_id}", recall=1, embed=embed)
    agent = Agent(FakeModel([]), memory=memory, storage=storage)
    await agent.memory.remember("Drinks green tea daily")
    await agent.memory.remember("Drives an old car")
    (hit,) = await agent.memory.search("which beverage?", limit=1)
    assert hit["text"] == "Drinks green tea daily"  # no shared word: found by meaning
    (hit,) = await agent.memory.search("what vehicle?", limit=1)
    assert hit["text"] == "Drives an old car"
    assert "embedding" not in hit


async def test_memory_without_tools_and_bounded_size(storage: Storage, thread_id: str) -> None:
    model = Seen("ok")
    memory = Memory.shared(f"small-{thread_id}", tools=False, max_facts=3)
    agent = Agent(FunctionModel(model), memory=memory, storage=storage)
    assert agent.tools == []
    for i in range(5):
        await agent.memory.remember(f"fact number {i}")
    assert [f["text"] for f in await agent.memory.facts()] == [
        "fact number 4",
        "fact number 3",
        "fact number 2",
    ]
    assert await agent.memory.clear() == 3
    with pytest.raises(ValidationError):
        await agent.memory.remember("   ")


def test_memory_options_are_checked() -> None:
    with pytest.raises(TypeError):
        Memory.by_state("")
    with pytest.raises(ValidationError):
        Memory.shared(recall=-1)
    with pytest.raises(TypeError, match="memory must be a Memory"):
        Agent(FakeModel([]), memory={"user_id": 1})
    from criogen_graph import tool

    @tool
    async def remember(x: str) -> str:
        """A tool that clashes with memory's."""
        return x

    with pytest.raises(ValidationError, match="remember"):
        Agent(FakeModel([]), tools=[remember], memory=Memory.shared())


async def test_facts_are_sealed_at_rest(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/sealed.db"
    storage = Storage(url, encryption_key="k1")
    agent = Agent(FakeModel([]), memory=Memory.shared("s"), storage=storage)
    await agent.memory.remember("The vault combination is 8-2-7")
    await storage.close()
    rows = sqlite3.connect(f"{tmp_path}/sealed.db").execute("SELECT value FROM store").fetchall()
    assert rows and not any(
        b"8-2-7" in (r[0] if isinstance(r[0], bytes) else r[0].encode()) for r in rows
    )
    again = Agent(
        FakeModel([]), memory=Memory.shared("s"), storage=Storage(url, encryption_key="k1")
    )
    assert [f["text"] for f in await again.memory.facts()] == ["The vault combination is 8-2-7"]
    await again.storage.close()


# -- collections ---------------------------------------------------------------------


async def test_collection_tool(backend: str, tmp_path: Path, thread_id: str) -> None:
    url = storage_url(backend, tmp_path)
    name = f"policies-{thread_id}"  # tests share the PostgreSQL store
    docs = CollectionTool("search_policies", storage=Storage(url), collection=name)
    assert docs.read_only and set(docs.spec()["parameters"]["properties"]) == {"query", "limit"}
    await docs.add(
        "refunds",
        "Refunds are possible within 30 days of delivery, with the receipt.",
        metadata={"team": "support"},
    )
    await docs.add("shipping", "We ship within two business days; express shipping costs extra.")
    await docs.add("privacy", "We never sell personal data.")
    with pytest.raises(ValidationError):
        await docs.add("refunds", "again")
    with pytest.raises(ValidationError):
        await docs.update("missing", "x")
    await docs.update("privacy", metadata={"reviewed": True})
    assert (await docs.get("privacy")) == {
        "id": "privacy",
        "text": "We never sell personal data.",
        "metadata": {"reviewed": True},
    }
    assert await docs.ids() == ["privacy", "refunds", "shipping"]

    model = FakeModel(
        [
            FakeReply.tool_call("search_policies", {"query": "how many days for refunds?"}),
            "Within 30 days.",
        ]
    )
    agent = Agent(model, tools=[docs])
    result = await agent.run("refund window?")
    (found,) = [m for m in result.messages if m["role"] == "tool"]
    assert found["status"] == "ok"
    assert '"id": "refunds"' in found["content"] and '"team": "support"' in found["content"]
    assert "shipping" not in found["content"] or found["content"].index("refunds") < found[
        "content"
    ].index("shipping")

    assert await docs.remove("shipping") is True and await docs.remove("shipping") is False
    assert [r["id"] for r in await docs.search("shipping express")] == []
    # kept in the storage: a new tool on a new storage object of the same database sees them
    if backend != "memory":
        again = CollectionTool("search_policies", storage=Storage(url), collection=name)
        assert await again.ids() == ["privacy", "refunds"]
        await again.storage.close()
    await docs.storage.close()


async def test_collection_search_cites_ids_with_snippets() -> None:
    docs = CollectionTool(storage="memory://", collection="manual", snippet_chars=60)
    await docs.add(
        "ch1",
        "Introduction. " * 20
        + "To reset the router, hold the button for ten seconds. "
        + "Appendix. " * 20,
    )
    (hit,) = await docs.search("reset the router")
    assert hit["id"] == "ch1" and "reset the router" in hit["text"] and len(hit["text"]) <= 62
    agent = Agent(
        FakeModel([FakeReply.tool_call("search_documents", {"query": "x", "limit": 0}), "ok"]),
        tools=[docs],
    )
    result = await agent.run("go")
    assert "limit must be an integer" in result.messages[2]["content"]
