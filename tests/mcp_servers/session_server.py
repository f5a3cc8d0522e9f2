"""A stateful MCP server over streamable HTTP for the session tests of
tests/test_mcp_http.py: the SDK's own server, with faults put in front of it.

`python tests/mcp_servers/session_server.py LEDGER [--port N] [--spare]
[--unknown-session 404|400]`

It speaks the 2025 protocol (it refuses `server/discover`, so clients use the
`initialize` handshake and a session whose id the server forgets when it restarts).
It listens on 127.0.0.1 (port N, or a free one) and prints `READY <port>` once it
accepts requests; with `--spare` it loads everything first and binds only when a line
arrives on stdin (a warm spare: a restart then takes milliseconds instead of the
seconds Python needs to import the SDK).

LEDGER is a file the server appends what tests check to, one line each, ending with
the client's tag (header `x-test-tag`, `-` without one): `init <session id> <tag>` (a
session started), `delete <session id> <status> <tag>` (a client ended its session),
`call <tool> <tag>` (a call arrived); and from the tools themselves `count <label>`,
`park <label>`, `die`.

Faults: `--unknown-session 400` answers a request for a session it does not know with
400 Bad Request (as SDKs before the 2025-06 spec fix did) instead of 404. A client asks
for more with the header `x-test-fault` (comma-separated): `stall=METHOD` never answers
requests (or notifications) of that JSON-RPC method (`stall=DELETE`: the end of a
session), `refuse=METHOD` answers them with 400 Bad Request, `odd-session-id` puts
characters the protocol does not allow in the session id it hands out. The tools `cut`
(the answer's event stream is cut in the middle of the event) and `garbage` (the answer
is not JSON) run, then answer badly; `die` exits the process in the middle of the call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
from typing import Any

import anyio
import uvicorn
from mcp.server.mcpserver import MCPServer

server = MCPServer("test-sessions", log_level="WARNING")
LEDGER = ""


def note(line: str) -> None:
    with open(LEDGER, "a", encoding="utf-8") as f:
        f.write(line + "\n")


@server.tool(structured_output=False)
def count(label: str) -> str:
    """Note the label; return how many times it was counted."""
    note(f"count {label}")
    with open(LEDGER, encoding="utf-8") as f:
        return str(sum(1 for line in f if line == f"count {label}\n"))


@server.tool(structured_output=False)
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool(structured_output=False)
async def park(label: str) -> str:
    """Note the label, then wait (until the process is killed)."""
    note(f"park {label}")
    await anyio.sleep_forever()
    return "unreachable"


@server.tool(structured_output=False)
def cut() -> str:
    """Runs; its answer's event stream is cut in the middle of the event."""
    return "the whole answer"


@server.tool(structured_output=False)
def garbage() -> str:
    """Runs; its answer is replaced by something that is not JSON."""
    return "the whole answer"


@server.tool(structured_output=False)
def die() -> str:
    """Exits the server in the middle of the call."""
    note("die")
    os._exit(1)


class Faults:
    """ASGI middleware around the SDK's app: the legacy handshake, the ledger's `init`
    / `delete` / `call` lines and the faults asked for.

    A client asks for faults with the header `x-test-fault` (comma-separated:
    `stall=METHOD`, `refuse=METHOD`, `odd-session-id`) and tags its ledger lines with
    `x-test-tag`, so one process can serve many tests."""

    def __init__(self, app: Any, *, unknown_session: int) -> None:
        self.app = app
        self.unknown_session = unknown_session
        # odd id handed out -> the SDK's id (so the server still finds the session)
        self.odd_ids: dict[bytes, bytes] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        faults = set(headers.get(b"x-test-fault", b"").decode().split(","))
        tag = headers.get(b"x-test-tag", b"-").decode()
        session = headers.get(b"mcp-session-id")
        if session is not None and session in self.odd_ids:
            real = self.odd_ids[session]
            scope = {
                **scope,
                "headers": [
                    (k, real if k == b"mcp-session-id" else v) for k, v in scope["headers"]
                ],
            }
        if scope["method"] == "DELETE":
            if "stall=DELETE" in faults:
                await anyio.sleep_forever()

            async def seen(message: Any) -> None:
                if message["type"] == "http.response.start":
                    # noted before the client can see the answer
                    sid = (session or b"-").decode("latin-1")
                    note(f"delete {sid} {message['status']} {tag}")
                await send(message)

            await self.app(scope, receive, seen)
            return
        if scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        request = json.loads(body or b"null")
        method = request.get("method") if isinstance(request, dict) else None
        if method == "server/discover":
            error = {"code": -32601, "message": "Method not found"}
            reply = {"jsonrpc": "2.0", "id": request.get("id"), "error": error}
            await respond(send, 200, b"application/json", json.dumps(reply).encode())
            return
        if f"stall={method}" in faults:
            await anyio.sleep_forever()
        tool = (request.get("params") or {}).get("name") if method == "tools/call" else None
        if tool is not None:
            note(f"call {tool} {tag}")
        if f"refuse={method}" in faults and "id" in request:
            error = {"code": -32600, "message": f"Bad Request: {method} refused"}
            reply = {"jsonrpc": "2.0", "id": request["id"], "error": error}
            await respond(send, 400, b"application/json", json.dumps(reply).encode())
            return
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        odd = "odd-session-id" in faults
        await self.app(scope, replay, self.sender(send, session, method, tool, tag, odd))

    def sender(
        self, send: Any, session: bytes | None, method: Any, tool: Any, tag: str, odd: bool
    ) -> Any:
        done = False

        async def wrapped(message: Any) -> None:
            nonlocal done
            if done:
                return  # the answer was cut or replaced: the rest is dropped
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                new_id = dict(headers).get(b"mcp-session-id")
                if method == "initialize" and new_id is not None and message["status"] == 200:
                    if odd:
                        odd_id = new_id[:8] + b" \xe9t\xe9"
                        self.odd_ids[odd_id] = new_id
                        headers = [(k, odd_id if k == b"mcp-session-id" else v) for k, v in headers]
                        new_id = odd_id
                    note(f"init {new_id.decode('latin-1')} {tag}")
                if message["status"] == 404 and session is not None and self.unknown_session == 400:
                    # What SDKs answered before the 2025-06 spec fix.
                    error = {"code": -32600, "message": "Bad Request: No valid session ID provided"}
                    reply = {"jsonrpc": "2.0", "id": "server-error", "error": error}
                    await respond(send, 400, b"application/json", json.dumps(reply).encode())
                    done = True
                    return
                if tool == "garbage":
                    await respond(send, 200, b"application/json", b"<html>Bad Gateway</html>")
                    done = True
                    return
                await send({**message, "headers": headers})
                return
            if tool == "cut" and message.get("body"):
                # Half of the event that carries the result; then the connection closes
                # (the app returns without completing the response).
                data = message["body"]
                await send({**message, "body": data[: len(data) // 2], "more_body": True})
                done = True
                return
            await send(message)

        return wrapped


async def respond(send: Any, status: int, content_type: bytes, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type)],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def main(options: argparse.Namespace) -> None:
    app = Faults(
        server.streamable_http_app(host="127.0.0.1"), unknown_session=options.unknown_session
    )
    if options.spare:
        await asyncio.to_thread(sys.stdin.readline)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", options.port))
    web = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="on"))
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
    parser.add_argument("ledger")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--spare", action="store_true")
    parser.add_argument("--unknown-session", type=int, choices=(404, 400), default=404)
    options = parser.parse_args()
    LEDGER = options.ledger
    asyncio.run(main(options))
