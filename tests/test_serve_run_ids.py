"""A run id no storage can hold (a NUL character, as `%00` in the path) is a run that
does not exist: a 404 naming it on every run endpoint, never a 500 (PostgreSQL refuses
such text in a query). In process, on PostgreSQL, through HTTP."""

from __future__ import annotations

import httpx
import pytest

pytest.importorskip("starlette")


@pytest.mark.parametrize("tail", ["", "/stream", "/join", "/cancel"])
async def test_a_run_id_with_a_nul_is_not_found(pg_schema_url: str, tail: str) -> None:
    from criogen_graph import Storage
    from criogen_graph.serve import create_app
    from tests.serve_agents import chunky

    storage = Storage(pg_schema_url)
    app = create_app([chunky], storage=storage)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://app") as http,
        ):
            await http.post("/threads", json={"thread_id": "t"})
            method = "POST" if tail == "/cancel" else "GET"
            answer = await http.request(method, f"/threads/t/runs/a%00b{tail}")
            assert answer.status_code == 404, answer.text
            assert "not found" in answer.json()["detail"]
            # A thread that does not exist is still told first.
            other = await http.request(method, f"/threads/nope/runs/a%00b{tail}")
            assert other.status_code == 404
            assert "thread 'nope'" in other.json()["detail"]
    finally:
        await storage.close()
