"""Every public method of LangGraph's `BaseCheckpointSaver` and `BaseStore`, called
directly on the saver and store of each storage we ship (sync and async), as LangGraph's
servers and users' own code call them — not only through our `Thread`.

A method we do not offer raises a `NotImplementedError` that says what to use instead."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import CheckpointMetadata, empty_checkpoint

from criogen_graph import Agent, FakeReply, FunctionModel, Storage, tool
from tests.conftest import storage_url

KEYS = [None, "saver methods key"]


def metadata(step: int, run_id: str) -> CheckpointMetadata:
    return {"source": "loop", "step": step, "parents": {}, "run_id": run_id}  # type: ignore[typeddict-unknown-key]


def config(thread_id: str, checkpoint_id: str | None = None) -> Any:
    configurable: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


@pytest.fixture(params=KEYS, ids=["plain", "encrypted"])
async def opened(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Storage]:
    # PostgreSQL in a schema of its own: an encrypted storage claims its database.
    if backend == "postgres":
        url = str(request.getfixturevalue("pg_schema_url"))
    else:
        url = storage_url(backend, tmp_path)
    storage = Storage(url, encryption_key=request.param)
    await storage.open()
    yield storage
    await storage.close()


async def put_three(saver: Any, thread_id: str) -> list[Any]:
    """Three checkpoints in a chain (runs r0, r1, r2), a pending write on the last."""
    configs: list[Any] = []
    parent = config(thread_id)
    for step in range(3):
        cp = empty_checkpoint()
        cp["channel_values"] = {"note": f"value {step}"}
        cp["channel_versions"] = {
            "note": saver.get_next_version(None, None)
            if step == 0
            else saver.get_next_version(configs[-1]["v"], None)
        }
        stored = await saver.aput(
            parent, cp, metadata(step, f"r{step}"), dict(cp["channel_versions"])
        )
        stored["v"] = cp["channel_versions"]["note"]
        configs.append(stored)
        parent = {"configurable": dict(stored["configurable"])}
    await saver.aput_writes(parent, [("note", "pending")], "task-1")
    return configs


async def test_checkpoint_methods_async_and_sync(opened: Storage, backend: str) -> None:
    saver = opened.checkpointer
    tid, other = f"t-{uuid.uuid4().hex}", f"t-{uuid.uuid4().hex}"
    configs = await put_three(saver, tid)
    await put_three(saver, other)
    last_id = configs[-1]["configurable"]["checkpoint_id"]
    first_id = configs[0]["configurable"]["checkpoint_id"]

    # get / get_tuple: the latest, and one by id.
    latest = await saver.aget_tuple(config(tid))
    assert latest is not None and latest.config["configurable"]["checkpoint_id"] == last_id
    assert latest.checkpoint["channel_values"]["note"] == "value 2"
    assert [w[1:] for w in latest.pending_writes or []] == [("note", "pending")]
    by_id = await saver.aget(config(tid, first_id))
    assert by_id is not None and by_id["channel_values"]["note"] == "value 0"

    # list: all newest first, with a metadata filter, before a checkpoint, with a limit.
    ids = [t.config["configurable"]["checkpoint_id"] async for t in saver.alist(config(tid))]
    assert ids == [c["configurable"]["checkpoint_id"] for c in reversed(configs)]
    filtered = [t async for t in saver.alist(config(tid), filter={"run_id": "r1"})]
    assert [t.metadata["run_id"] for t in filtered] == ["r1"]
    before = [t async for t in saver.alist(config(tid), before=config(tid, last_id))]
    assert len(before) == 2
    assert len([t async for t in saver.alist(config(tid), limit=1)]) == 1
    assert len([t async for t in saver.alist(None, filter={"run_id": "r0"})]) >= 2

    # The sync methods, from another OS thread (LangGraph's async savers run them on
    # their loop); from the loop's own thread they are refused with LangGraph's advice.
    sync_latest = await asyncio.to_thread(saver.get_tuple, config(tid))
    assert sync_latest is not None and sync_latest.checkpoint["id"] == last_id
    assert (await asyncio.to_thread(saver.get, config(tid, first_id)))["id"] == first_id
    assert len(await asyncio.to_thread(lambda: list(saver.list(config(tid), limit=2)))) == 2
    parent = {"configurable": dict(configs[-1]["configurable"])}
    cp = empty_checkpoint()
    cp["channel_values"] = {"note": "value 3"}
    cp["channel_versions"] = {"note": saver.get_next_version(configs[-1]["v"], None)}
    fourth = await asyncio.to_thread(
        saver.put, parent, cp, metadata(3, "r3"), dict(cp["channel_versions"])
    )
    await asyncio.to_thread(saver.put_writes, fourth, [("note", "sync pending")], "task-2")
    now = await saver.aget_tuple(config(tid))
    assert now is not None and now.checkpoint["channel_values"]["note"] == "value 3"
    assert [w[2] for w in now.pending_writes or []] == ["sync pending"]
    if backend != "memory":
        with pytest.raises(asyncio.InvalidStateError, match="different thread"):
            saver.get_tuple(config(tid))

    # get_next_version grows.
    assert saver.get_next_version(
        saver.get_next_version(None, None), None
    ) > saver.get_next_version(None, None)

    # delete_thread: this thread gone, the other untouched (async, then sync).
    await saver.adelete_thread(tid)
    assert await saver.aget_tuple(config(tid)) is None
    assert [t async for t in saver.alist(config(tid))] == []
    assert await saver.aget_tuple(config(other)) is not None
    await asyncio.to_thread(saver.delete_thread, other)
    assert await saver.aget_tuple(config(other)) is None


async def test_methods_not_offered_say_what_to_use(opened: Storage, backend: str) -> None:
    saver = opened.checkpointer
    tid = f"t-{uuid.uuid4().hex}"
    await put_three(saver, tid)
    for call in (
        lambda: saver.acopy_thread(tid, f"{tid}-copy"),
        lambda: asyncio.to_thread(saver.copy_thread, tid, f"{tid}-copy"),
    ):
        with pytest.raises(NotImplementedError, match=r"thread\.messages\(\)"):
            await call()
    for call in (
        lambda: saver.adelete_for_runs(["r1"]),
        lambda: asyncio.to_thread(saver.delete_for_runs, ["r1"]),
    ):
        with pytest.raises(NotImplementedError, match=r"adelete_thread"):
            await call()
    # Nothing was changed by the refused calls.
    assert len([t async for t in saver.alist(config(tid))]) == 3
    assert await saver.aget_tuple(config(f"{tid}-copy")) is None
    if backend != "postgres":
        for call in (
            lambda: saver.aprune([tid]),
            lambda: asyncio.to_thread(saver.prune, [tid]),
        ):
            with pytest.raises(NotImplementedError, match="PostgreSQL"):
                await call()
        return
    # PostgreSQL prunes: keep_latest leaves the newest checkpoint; delete removes all.
    await saver.aprune([tid])
    kept = [t async for t in saver.alist(config(tid))]
    assert len(kept) == 1 and kept[0].checkpoint["channel_values"]["note"] == "value 2"
    other = f"t-{uuid.uuid4().hex}"
    await put_three(saver, other)
    await asyncio.to_thread(lambda: saver.prune([tid], strategy="delete"))
    assert await saver.aget_tuple(config(tid)) is None
    assert await saver.aget_tuple(config(other)) is not None
    with pytest.raises(TypeError):
        await saver.aprune(other)


@tool
async def lookup(order_id: str) -> str:
    """Look up an order."""
    return f"order {order_id}: shipped"


async def test_an_agent_thread_deleted_through_the_checkpointer(opened: Storage) -> None:
    """What LangGraph's servers do to delete a thread: `adelete_thread` on the saver. The
    thread is then empty for our API too, and a new conversation on the same id starts
    from nothing (the model sees only the new message)."""
    seen: list[int] = []

    def script(messages: list[dict[str, Any]], _tools: Any) -> Any:
        seen.append(sum(m["role"] != "system" for m in messages))
        if messages[-1]["role"] == "user":
            return FakeReply.tool_call("lookup", {"order_id": "A-1"})
        return "It shipped."

    agent = Agent(FunctionModel(script), tools=[lookup], storage=opened)
    thread = agent.thread(f"t-{uuid.uuid4().hex}")
    assert (await thread.send("Where is A-1?")).text == "It shipped."
    await opened.checkpointer.adelete_thread(thread.id)
    assert await thread.messages() == []
    assert await thread.history() == []
    seen.clear()
    assert (await thread.send("And A-1 again?")).text == "It shipped."
    assert seen[0] == 1  # only the new user message
    assert [m["role"] for m in await thread.messages()] == [
        "user",
        "assistant",
        "tool",
        "assistant",
    ]


async def test_store_methods_async_and_sync(opened: Storage, backend: str) -> None:
    store = await opened.get_store()
    ns = ("conformance", uuid.uuid4().hex)
    await store.aput(ns, "a", {"kind": "fact", "n": 1})
    await asyncio.to_thread(store.put, ns, "b", {"kind": "fact", "n": 2})
    await store.aput((*ns, "deeper"), "c", {"kind": "note", "n": 3})
    item = await store.aget(ns, "a")
    assert item is not None and item.value == {"kind": "fact", "n": 1}
    assert (await asyncio.to_thread(store.get, ns, "b")).value["n"] == 2

    found = await store.asearch(ns, filter={"kind": "fact"})
    assert sorted(i.key for i in found) == ["a", "b"]
    assert [i.key for i in await store.asearch(ns, filter={"n": {"$gt": 1}, "kind": "fact"})] == [
        "b"
    ]
    assert len(await store.asearch(ns, limit=1)) == 1
    assert sorted(i.key for i in await asyncio.to_thread(store.search, ns)) == ["a", "b", "c"]

    spaces = await store.alist_namespaces(prefix=ns)
    assert sorted(spaces) == sorted([ns, (*ns, "deeper")])
    assert await asyncio.to_thread(store.list_namespaces, prefix=ns, max_depth=2) == [ns]

    results = await store.abatch([])
    assert results == []

    await store.adelete(ns, "a")
    await asyncio.to_thread(store.delete, ns, "b")
    assert await store.aget(ns, "a") is None and await store.aget(ns, "b") is None

    # TTL: kept by the stores that offer it (SQLite, PostgreSQL, encrypted or not);
    # LangGraph's in-memory store refuses it with its own clear error.
    if backend == "memory":
        with pytest.raises(NotImplementedError, match="TTL"):
            await store.aput(ns, "t", {"n": 4}, ttl=1.0)
    else:
        assert store.supports_ttl
        await store.aput(ns, "t", {"n": 4}, ttl=10.0)
        ttl_item = await store.aget(ns, "t", refresh_ttl=False)
        assert ttl_item is not None and ttl_item.value == {"n": 4}
