"""PostgreSQL keyword search keeps its table's statistics fresh by itself: on a server
without autovacuum (or before it comes round), a bulk load right after the index was set
up would leave the planner with the statistics of an empty table (searches 3-4x as slow
at 100,000 documents). A search analyzes the table once autovacuum's own threshold is
passed, checking at most every `_PG_STATS_EVERY_SECS`."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from langgraph.store.base import PutOp

from criogen_graph import CollectionTool, Storage
from criogen_graph.memory import fts as _fts


def modified_since_analyze(url: str, schema: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT n_mod_since_analyze FROM pg_stat_user_tables "
            "WHERE schemaname = %s AND relname = 'criogen_search'",
            (schema,),
        ).fetchone()
    return int(row[0]) if row else 0


async def test_a_search_after_a_bulk_load_analyzes_the_table(
    pg_schema_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = pg_schema_url.rsplit("%3D", 1)[1]
    storage = Storage(pg_schema_url)
    docs = CollectionTool(storage=storage, collection="handbook")
    try:
        assert await docs.search("refund") == []  # sets the index up, empty
        store: Any = await storage.get_store()
        await store.abatch(
            [
                PutOp(docs._ns, f"d{i}", {"text": f"refund policy number {i}", "metadata": {}})
                for i in range(2000)
            ]
        )
        # The server counts the load's rows once the writing session reports them (an
        # idle session does within 10 s).
        deadline = asyncio.get_running_loop().time() + 30
        while modified_since_analyze(pg_schema_url, schema) < 2000:
            assert asyncio.get_running_loop().time() < deadline, "the load was never counted"
            await asyncio.sleep(0.05)
        monkeypatch.setattr(_fts, "_PG_STATS_EVERY_SECS", 0.0, raising=False)
        found = await docs.search("refund policy")
        assert len(found) == docs.limit
        assert modified_since_analyze(pg_schema_url, schema) == 0
    finally:
        await storage.close()
