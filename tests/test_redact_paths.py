"""A secret the Redactor removes is stored nowhere in clear, whatever path brings it into
the transcript: graph input run by LangGraph (text blocks, LangChain messages, a
`Command` update, `update_state`), a hook's `HookAction(messages=...)` or
`HookAction(message=...)`, a model middleware's reply. Each path plants its own secret;
every byte each checkpointer keeps (LangGraph's own savers and ours) is searched for it."""

from __future__ import annotations

import contextlib
import pickle
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.types import Command

from criogen_graph import (
    Agent,
    FakeModel,
    HookAction,
    HookContext,
    ModelResponse,
    Redactor,
    Storage,
)
from criogen_graph.middleware import ModelCall, ModelHandler, model_middleware
from tests.conftest import require_postgres

#: One secret per path, so a leak names the path it came through.
PATHS = (
    "blocks",
    "nested",
    "lcmixed",
    "command",
    "update",
    "hookmsgs",
    "hooklc",
    "hookreply",
    "middleware",
)
SECRET = {p: f"sk-proj-{p}{'Q' * 24}" for p in PATHS}


def blocks(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": "see:"}, {"type": "text", "text": text}]


class BeforeModel:
    """Adds a user message to the transcript it is shown (once)."""

    def __init__(self, message: Any) -> None:
        self.message = message

    def before_model(self, ctx: HookContext) -> HookAction | None:
        if len(ctx.messages) > 1:
            return None
        return HookAction(messages=[*ctx.messages, self.message])


class AfterModel:
    def after_model(self, ctx: HookContext) -> HookAction:
        return HookAction(message={"role": "assistant", "content": blocks(SECRET["hookreply"])})


@model_middleware
async def leaky_reply(call: ModelCall, handler: ModelHandler) -> ModelResponse:
    response = await handler(call)
    response.message = {"role": "assistant", "content": blocks(SECRET["middleware"])}
    return response


def agent(**options: Any) -> Agent:
    return Agent(FakeModel(["noted"] * 10), redact=Redactor.pii(), **options)


async def plant(checkpointer: Any) -> list[Any]:
    """Run every path on `checkpointer`; each thread's saved messages."""
    plain = agent().graph.builder.compile(checkpointer=checkpointer)
    runs: list[tuple[Any, Any]] = [
        (plain, {"messages": [{"role": "user", "content": blocks(SECRET["blocks"])}]}),
        (
            plain,
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "look"},
                            {"type": "note", "parts": [{"body": SECRET["nested"]}]},
                        ],
                    }
                ]
            },
        ),
        (
            plain,
            {
                "messages": [
                    HumanMessage(
                        content=[
                            {"type": "text", "text": SECRET["lcmixed"]},
                            {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
                        ]
                    )
                ]
            },
        ),
        (
            plain,
            Command(update={"messages": [{"role": "user", "content": blocks(SECRET["command"])}]}),
        ),
    ]
    hooked = [
        agent(hooks=[BeforeModel({"role": "user", "content": blocks(SECRET["hookmsgs"])})]),
        agent(hooks=[BeforeModel(HumanMessage(content=f"mine: {SECRET['hooklc']}"))]),
        agent(hooks=[AfterModel()]),
        agent(middleware=[leaky_reply]),
    ]
    for a in hooked:
        graph = a.graph.builder.compile(checkpointer=checkpointer)
        runs.append((graph, {"messages": [{"role": "user", "content": "hello"}]}))
    saved = []
    for graph, given in runs:
        cfg: dict[str, Any] = {"configurable": {"thread_id": f"t-{uuid.uuid4().hex}"}}
        await graph.ainvoke(given, cfg)
        saved.append((await graph.aget_state(cfg)).values["messages"])
    cfg = {"configurable": {"thread_id": f"t-{uuid.uuid4().hex}"}}
    await plain.ainvoke({"messages": [{"role": "user", "content": "hi"}]}, cfg)
    await plain.aupdate_state(
        cfg, {"messages": [{"role": "user", "content": blocks(SECRET["update"])}]}
    )
    saved.append((await plain.aget_state(cfg)).values["messages"])
    return saved


def leaked(text: str) -> list[str]:
    return [p for p, s in SECRET.items() if s in text]


def pg_dump(url: str) -> str:
    """Every row of every table of the URL's schema, bytes as latin-1 text."""
    import psycopg

    parts: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT quote_ident(table_name) FROM information_schema.tables "
            "WHERE table_schema = current_schema()"
        ).fetchall()
        assert tables
        for (table,) in tables:
            for row in conn.execute(f"SELECT * FROM {table}").fetchall():
                for value in row:
                    if isinstance(value, bytes | memoryview):
                        parts.append(bytes(value).decode("latin-1"))
                    else:
                        parts.append(str(value))
    return "\n".join(parts)


@contextlib.asynccontextmanager
async def saver_of(kind: str, tmp_path: Path, pg_url: str | None) -> AsyncIterator[Any]:
    if kind == "langgraph-memory":
        from langgraph.checkpoint.memory import InMemorySaver

        yield InMemorySaver()
    elif kind == "langgraph-sqlite":
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "t.db")) as saver:
            yield saver
    elif kind == "langgraph-postgres":
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        assert pg_url is not None
        async with AsyncPostgresSaver.from_conn_string(pg_url) as saver:
            await saver.setup()
            yield saver
    else:
        url = f"sqlite:///{tmp_path}/t.db" if kind == "ours-sqlite" else pg_url
        assert url is not None
        storage = Storage(url)
        await storage.open()
        try:
            yield storage.checkpointer
        finally:
            await storage.close()


def stored_bytes(kind: str, saver: Any, tmp_path: Path, pg_url: str | None) -> str:
    if kind == "langgraph-memory":
        kept = (dict(saver.storage), dict(saver.writes), dict(saver.blobs))
        return pickle.dumps(kept).decode("latin-1") + repr(kept)
    if kind.endswith("sqlite"):
        files = [p for p in tmp_path.glob("t.db*") if p.is_file()]
        assert files
        return b"".join(p.read_bytes() for p in files).decode("latin-1")
    assert pg_url is not None
    return pg_dump(pg_url)


@pytest.mark.parametrize(
    "kind",
    ["langgraph-memory", "langgraph-sqlite", "ours-sqlite", "langgraph-postgres", "ours-postgres"],
)
async def test_no_path_stores_a_secret_in_clear(kind: str, tmp_path: Path, request: Any) -> None:
    pg_url = None
    if kind.endswith("postgres"):
        require_postgres()
        pg_url = request.getfixturevalue("pg_schema_url")
    async with saver_of(kind, tmp_path, pg_url) as saver:
        saved = await plant(saver)
        # Each thread kept its message, redacted: the search below looks where they are.
        for messages in saved:
            assert "[SECRET]" in repr(messages), messages
            assert not leaked(repr(messages)), messages
        if kind == "langgraph-memory":
            on_disk = stored_bytes(kind, saver, tmp_path, pg_url)
    if kind != "langgraph-memory":
        on_disk = stored_bytes(kind, None, tmp_path, pg_url)
    assert "[SECRET]" in on_disk
    assert leaked(on_disk) == []
