"""Memory keyed by any user key (issue 15, item 10).

`Memory.by_state("user_id")` with an e-mail address (or any key with `.` or NUL) used
to fail on every backend with LangGraph's `InvalidNamespaceError`, and `0` / `"0"`
(`True` / `"True"`) shared one pool of facts. Every key gets a pool of its own, on every
backend; facts stored the old way under plain string keys stay readable; and the key
encoding is injective (a property test)."""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from criogen_graph import (
    Agent,
    CollectionTool,
    FakeReply,
    FunctionModel,
    Memory,
    Storage,
    ValidationError,
)
from tests.conftest import storage_url
from tests.reliability._report import report

#: Keys that look alike, or that LangGraph's namespaces cannot hold as they are.
TRICKY: list[Any] = [
    "ada@example.com",
    "ada@example",
    "ada@example%2Ecom",
    "ada@example%2ecom",
    "a.b",
    "a..b",
    ".",
    "..",
    "a\x00b",
    "a%00b",
    "%",
    "%%",
    "%25",
    "user_1",
    "user%1",
    "[*?]",
    "s:a.b",
    " ",
    "ünïcødé 🎉 ключ",
    "long:" + "é" * 3000,
    "long:" + "é" * 3000 + ".",
    0,
    "0",
    1,
    "1",
    True,
    "True",
    False,
    "False",
    1.0,
    "1.0",
    -0.0,
    0.0,
    10**30,
    str(10**30),
]


def key_of(value: Any) -> tuple[str, str]:
    """What makes two state values the same key: their type and their exact value."""
    return (type(value).__name__, repr(value))


async def test_every_key_has_a_pool_of_its_own(
    backend: str, tmp_path: Path, thread_id: str
) -> None:
    """A fact per tricky key, saved from code; each key sees its own fact and no other,
    and a run keyed by an e-mail address recalls its fact to the model."""
    ns = f"facts_{uuid.uuid4().hex[:8]}"  # the PostgreSQL database is shared
    async with Storage(storage_url(backend, tmp_path)) as storage:
        shown: list[str] = []

        def model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
            shown.append(json.dumps(messages, ensure_ascii=False))
            if messages[-1]["role"] == "user":
                return FakeReply.tool_call("remember", {"fact": "likes green tea"})
            return "noted"

        agent = Agent(
            FunctionModel(model), memory=Memory.by_state("user_id", namespace=ns), storage=storage
        )
        memory = agent.memory
        assert memory is not None
        for i, value in enumerate(TRICKY):
            await memory.remember(f"fact {i}", state={"user_id": value})
        for i, value in enumerate(TRICKY):
            facts = await memory.facts(state={"user_id": value})
            assert [f["text"] for f in facts] == [f"fact {i}"], value

        reply = await agent.thread(thread_id).send("hi", state={"user_id": "ada@example.com"})
        assert reply.text == "noted"
        assert "fact 0" in shown[0] and "fact 4" not in shown[0]  # recalled: own fact only
        facts = await memory.facts(state={"user_id": "ada@example.com"})
        assert sorted(f["text"] for f in facts) == ["fact 0", "likes green tea"]
        assert [f["text"] for f in await memory.facts(state={"user_id": "ada@example"})] == [
            "fact 1"
        ]
        assert await memory.clear(state={"user_id": "a.b"}) == 1
        assert await memory.facts(state={"user_id": "a..b"}) != []
    report(f"memory_keys[{backend}]", keys=len(TRICKY), shared_pools=0)


async def test_facts_stored_the_old_way_stay_readable(
    backend: str, tmp_path: Path, thread_id: str
) -> None:
    """A store written by the previous version (plain string keys as namespace labels):
    after the upgrade each string key reads, recalls, searches and forgets its facts."""
    ns = f"facts_{uuid.uuid4().hex[:8]}"
    users = ["ada", "bob_1", "50%off", "ünï", "42"]
    async with Storage(storage_url(backend, tmp_path)) as storage:
        store = await storage.get_store()
        for user in users:  # exactly what the previous version wrote
            await store.aput(
                ("criogen", "memory", ns, "by", "user_id", user),
                f"fact_old_{user.encode().hex()}",
                {"text": f"old fact of {user}", "created_ms": 1, "created_ns": 1_000_000},
                index=False,
            )
        await store.aput(
            ("criogen", "memory", ns, "shared"),
            "fact_old_shared",
            {"text": "old shared fact", "created_ms": 1, "created_ns": 1_000_000},
            index=False,
        )

        shown: list[str] = []

        def model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
            shown.append(json.dumps(messages, ensure_ascii=False))
            return "ok"

        agent = Agent(
            FunctionModel(model), memory=Memory.by_state("user_id", namespace=ns), storage=storage
        )
        memory = agent.memory
        assert memory is not None
        for user in users:
            facts = await memory.facts(state={"user_id": user})
            assert [f["text"] for f in facts] == [f"old fact of {user}"]
            found = await memory.search("old fact", state={"user_id": user})
            assert [f["text"] for f in found] == [f"old fact of {user}"]
        await agent.thread(thread_id).send("what do you know?", state={"user_id": "ada"})
        assert "old fact of ada" in shown[0] and "old fact of bob_1" not in shown[0]
        await memory.remember("new fact of ada", state={"user_id": "ada"})
        assert {f["text"] for f in await memory.facts(state={"user_id": "ada"})} == {
            "old fact of ada",
            "new fact of ada",
        }
        old_id = f"fact_old_{b'ada'.hex()}"
        assert await memory.forget(old_id, state={"user_id": "ada"})
        # An int key no longer shares the pool of its string: the old facts are the string's.
        assert await memory.facts(state={"user_id": 42}) == []
        shared = Agent(FunctionModel(model), memory=Memory.shared(ns), storage=storage).memory
        assert shared is not None
        assert [f["text"] for f in await shared.facts()] == ["old shared fact"]
    report(f"memory_keys_upgrade[{backend}]", old_keys=len(users), lost=0)


scalar_keys = st.one_of(
    st.text(),
    st.text(alphabet=".%\x00sibfh:#0123456789eE+-", max_size=12),
    st.text(min_size=300, max_size=2000),
    st.integers(),
    st.booleans(),
    st.floats(allow_nan=False),
    st.integers().map(str),
    st.floats(allow_nan=False).map(repr),
    st.booleans().map(str),
)


def test_the_key_encoding_is_injective() -> None:
    """Distinct keys (by type and value) never share a pool, and every pool is a
    namespace any LangGraph store accepts (no empty label, no `.`, no NUL; short enough
    for PostgreSQL's index)."""
    memory = Memory.by_state("user_id")
    examples, keys = [0], [0]

    @settings(max_examples=600, deadline=None)
    @given(st.lists(scalar_keys, min_size=2, max_size=12, unique_by=key_of))
    def distinct_keys_distinct_pools(values: list[Any]) -> None:
        examples[0] += 1
        pools: dict[tuple[str, ...], Any] = {}
        for value in values:
            if value == "":
                with pytest.raises(ValidationError):
                    memory.pool({"user_id": value})
                continue
            pool = memory.pool({"user_id": value})
            assert pool == memory.pool({"user_id": value})  # stable
            assert all(label and "." not in label and "\x00" not in label for label in pool)
            assert len(".".join(pool).encode()) < 1200
            other = pools.setdefault(pool, value)
            assert key_of(other) == key_of(value), (other, value, pool)
            keys[0] += 1

    distinct_keys_distinct_pools()
    report("memory_key_encoding", examples=examples[0], keys=keys[0], collisions=0)


def test_keys_that_cannot_scope_memory_are_refused() -> None:
    memory = Memory.by_state("user_id")
    for bad, code in (
        ("", "missing"),
        (None, "missing"),
        (math.nan, "invalid_value"),
        ([1], "invalid_type"),
        ({"id": 1}, "invalid_type"),
        (b"ada", "invalid_type"),
    ):
        with pytest.raises(ValidationError) as info:
            memory.pool({"user_id": bad})
        assert info.value.code == code, bad
    for name in ("user.id", "a\x00b"):
        with pytest.raises(ValidationError):
            Memory.by_state(name)
        with pytest.raises(ValidationError):
            Memory.shared(name)
        with pytest.raises(ValidationError):
            CollectionTool("search_docs", storage="memory://", collection=name)
