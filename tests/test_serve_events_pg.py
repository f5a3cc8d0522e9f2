"""What a run a worker executes costs the events table (criogen_serve_events): each
`messages/partial` event a client receives carries the whole message so far (LangGraph's
protocol), but the table keeps each one as the text it adds, so its bytes grow with the
answer, not with its square. Real `serve --workers external` processes and a worker on
PostgreSQL, raw SSE read from both servers: every event is sent as before, byte for byte,
in a full stream and in a `join_stream` resumed with a `Last-Event-ID` in the middle of
the message."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest

from tests.serve_agents import DRIP, DRIP_PIECES

pytest.importorskip("starlette")
pytest.importorskip("procrastinate")

from tests.test_serve_workers import Cluster, running_cluster

pytestmark = pytest.mark.asyncio(loop_scope="module")

#: Bytes an event of the table may take besides the text it carries (its metadata,
#: the message's id, JSON punctuation).
PER_EVENT = 512
#: Every mode the server sends (each saved in the table whatever a client asks for).
ALL_MODES = ["values", "updates", "custom", "messages-tuple", "messages"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("serve-events")
    with running_cluster(workdir, agents=("tests.serve_agents:drip",), workers=1) as c:
        yield c


def _events(body: bytes) -> list[tuple[str, str, bytes]]:
    """(id, event, the raw `data:` line) of each event of an SSE body, heartbeats left out."""
    out = []
    for block in body.split(b"\n\n"):
        fields: dict[bytes, bytes] = {}
        for line in block.split(b"\n"):
            if line and not line.startswith(b":"):
                name, _, value = line.partition(b": ")
                fields[name] = value
        if b"event" in fields:
            out.append(
                (fields.get(b"id", b"").decode(), fields[b"event"].decode(), fields[b"data"])
            )
    return out


def _stored(url: str, run_id: str) -> tuple[int, int]:
    """Bytes of the run's events in the table, and how many there are."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(octet_length(data)), 0), count(*) "
            "FROM criogen_serve_events WHERE run_id = %s",
            (run_id,),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def test_a_workers_streamed_answer_costs_the_table_its_length_and_is_sent_as_before(
    cluster: Cluster,
) -> None:
    a, b = cluster.servers
    async with httpx.AsyncClient(timeout=120) as http:
        thread_id = (await http.post(f"{a.url}/threads", json={})).json()["thread_id"]
        body = {
            "assistant_id": "drip",
            "input": {"messages": [{"role": "user", "content": "go"}]},
            "stream_mode": ALL_MODES,
        }
        answer = await http.post(f"{a.url}/threads/{thread_id}/runs/stream", json=body)
        assert answer.status_code == 200, answer.text
        full = _events(answer.content)
        run_id = json.loads(full[0][2])["run_id"]

        # The client got each partial with the whole text so far, as LangGraph sends it.
        partials = [(i, d) for i, e, d in full if e == "messages/partial"]
        assert len(partials) == DRIP_PIECES
        (first,) = json.loads(partials[0][1])
        assert list(first) == [
            "type",
            "content",
            "id",
            "tool_calls",
            "tool_call_chunks",
            "additional_kwargs",
            "response_metadata",
        ]
        for n, (_, data) in enumerate(partials, start=1):
            expected = [{**first, "content": "".join(DRIP[:n])}]
            assert data == json.dumps(expected, separators=(",", ":")).encode(), n
        ids = [int(i) for i, _, _ in full]
        assert ids == list(range(1, len(ids) + 1))

        # The table holds the answer a few times over (values, updates, the pieces),
        # not the square of it (about 9 MB here).
        size = len("".join(DRIP))
        stored, rows = _stored(cluster.url, run_id)
        assert rows == len(full)
        assert stored < 8 * size + PER_EVENT * rows, (stored, size, rows)

        # A client reconnecting in the middle of the message, to the other server, gets
        # the events it missed exactly as the first stream had them.
        middle = partials[DRIP_PIECES // 2][0]
        joined = await http.get(
            f"{b.url}/threads/{thread_id}/runs/{run_id}/stream",
            params=[("stream_mode", m) for m in ALL_MODES],
            headers={"Last-Event-ID": middle},
        )
        assert joined.status_code == 200, joined.text
        assert _events(joined.content) == [e for e in full if int(e[0]) > int(middle)]

        # And one that only asks for `messages`, from the first event on.
        again = await http.get(
            f"{b.url}/threads/{thread_id}/runs/{run_id}/stream",
            params={"stream_mode": "messages"},
        )
        messages = [e for e in full if e[1].startswith("messages/") or e[1] == "metadata"]
        assert _events(again.content) == messages


async def test_sealed_partials_read_by_another_server_are_whole_from_any_event(
    pg_schema_url: str,
) -> None:
    """On an encrypted storage too: a server that did not run the run (it reads the
    table) sends each `messages/partial` whole, from the start or from any event."""
    from criogen_graph import Storage
    from criogen_graph.serve import create_app
    from tests.serve_agents import CHUNKS, chunky

    ran, other = (Storage(pg_schema_url, encryption_key="k" * 32) for _ in range(2))
    apps = [create_app([chunky], storage=s) for s in (ran, other)]
    try:
        async with (
            apps[0].router.lifespan_context(apps[0]),
            apps[1].router.lifespan_context(apps[1]),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=apps[0]), base_url="http://a") as a,
            httpx.AsyncClient(transport=httpx.ASGITransport(app=apps[1]), base_url="http://b") as b,
        ):
            await a.post("/threads", json={"thread_id": "sealed"})
            body = {
                "assistant_id": "chunky",
                "input": {"messages": ["hi"]},
                "stream_mode": ["messages"],
            }
            full = _events((await a.post("/threads/sealed/runs/stream", json=body)).content)
            partials = [e for e in full if e[1] == "messages/partial"]
            assert [json.loads(d)[0]["content"] for _, _, d in partials] == [
                "".join(CHUNKS[:n]) for n in range(1, len(CHUNKS) + 1)
            ]
            run_id = json.loads(full[0][2])["run_id"]
            path = f"/threads/sealed/runs/{run_id}/stream"
            # Resumed after each event, all at once (followers at different places in
            # the message): the rest, exactly as the first stream had it.
            lasts = ["0", *(i for i, _, _ in full)]
            got = await asyncio.gather(
                *(
                    b.get(path, params={"stream_mode": "messages"}, headers={"Last-Event-ID": i})
                    for i in lasts
                )
            )
            for last, answer in zip(lasts, got, strict=True):
                assert _events(answer.content) == [e for e in full if int(e[0]) > int(last)], last
    finally:
        for s in (ran, other):
            await s.close()
