"""A loopback server that answers each request with the next recorded reply of the
provider replay corpus (`tests/fixtures/provider_replay/`), byte for byte as the fixture
gives it, and records each request.

A fixture is a JSON file: `source` (where its wire shape comes from), `status`, optional
`headers`, and either `body` (a JSON reply) or `sse` (the lines of an event stream, sent
as they are, each followed by a newline). `cut: true` closes the connection after the
lines, without the end of the chunked body (a stream that died part-way).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.servers.base import LoopbackHandler, RecordingServer

CORPUS = Path(__file__).resolve().parent.parent / "fixtures" / "provider_replay"


def load(name: str) -> dict[str, Any]:
    """The fixture `provider/name` (without `.json`)."""
    data: dict[str, Any] = json.loads((CORPUS / f"{name}.json").read_text("utf-8"))
    assert data.get("source"), f"fixture {name} does not say where its wire shape comes from"
    return data


class ReplayServer(RecordingServer[dict[str, Any]]):
    """Start with `with ReplayServer() as srv:`; `srv.replay("openai/text", ...)` queues
    fixtures, one per request."""

    def __init__(self, base_path: str = "") -> None:
        server = self

        class Handler(LoopbackHandler):
            def do_POST(self) -> None:
                _, fixture, _ = server.take(self)
                if fixture is None:
                    self.send_json(500, {"error": {"message": "the replay script is empty"}})
                    return
                status = int(fixture.get("status", 200))
                headers = dict(fixture.get("headers") or {})
                if "sse" not in fixture:
                    self.send_json(status, fixture.get("body"), headers)
                    return
                self.send_response(status)
                self.send_header("content-type", "text/event-stream")
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for line in fixture["sse"]:
                    self.chunk(f"{line}\n".encode())
                if fixture.get("cut"):
                    self.drop()
                else:
                    self.end_stream()

        super().__init__(Handler)
        self.base_url += base_path

    def replay(self, *names: str) -> ReplayServer:
        self.add(*(load(n) for n in names))
        return self
