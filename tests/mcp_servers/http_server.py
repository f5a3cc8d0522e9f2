"""An MCP server over streamable HTTP for tests:
`python tests/mcp_servers/http_server.py TOKEN [--port N] [--legacy]`.

Listens on 127.0.0.1 (on port N, or a free one) and prints `READY <port>` once it
accepts requests. Every request must carry `Authorization: Bearer TOKEN` (401
otherwise). With `--legacy` it acts like the many servers that predate the 2026
protocol: it refuses `server/discover`, so clients fall back to the `initialize`
handshake and a stateful session (whose id the server forgets when it restarts).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer

server = MCPServer("test-http", log_level="WARNING")


@server.tool(structured_output=False)
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool(structured_output=False)
def pid() -> int:
    """The server's process id."""
    return os.getpid()


class Gate:
    """ASGI middleware: 401 without the bearer token; `server/discover` refused when
    `legacy`."""

    def __init__(self, app: Any, token: str, legacy: bool) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()
        self.legacy = legacy

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if dict(scope["headers"]).get(b"authorization") != self.expected:
            await respond(send, 401, b"text/plain", b"missing or wrong token")
            return
        if self.legacy and scope["method"] == "POST":
            body = b""
            more = True
            while more:
                message = await receive()
                body += message.get("body", b"")
                more = message.get("more_body", False)
            request = json.loads(body or b"null")
            if isinstance(request, dict) and request.get("method") == "server/discover":
                error = {"code": -32601, "message": "Method not found"}
                reply = {"jsonrpc": "2.0", "id": request.get("id"), "error": error}
                await respond(send, 200, b"application/json", json.dumps(reply).encode())
                return
            replayed = False

            async def replay() -> Any:
                nonlocal replayed
                if replayed:
                    return await receive()
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}

            await self.app(scope, replay, send)
            return
        await self.app(scope, receive, send)


async def respond(send: Any, status: int, content_type: bytes, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type)],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def main(token: str, port: int, legacy: bool) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    app = Gate(server.streamable_http_app(host="127.0.0.1"), token, legacy)
    web = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    serving = asyncio.create_task(web.serve(sockets=[sock]))
    while not web.started:
        if serving.done():
            await serving  # it failed: say why
            return
        await asyncio.sleep(0.01)
    print(f"READY {sock.getsockname()[1]}", flush=True)
    await serving


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("token")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--legacy", action="store_true")
    options = parser.parse_args()
    asyncio.run(main(options.token, options.port, options.legacy))
