"""An MCP server over stdio for tests: `python tests/mcp_servers/stdio_server.py`.

`MCP_TEST_DIR` (optional) names a directory where the server notes what tests check:
`starts` (one line per process start: its pid), `counts` (one line per `count` call),
`ledger` (what `wait_for` saw) and the release files `wait_for` waits for. While a file
`refuse-start` is there, the server exits at once with a message on stderr.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TypedDict

import anyio
from mcp.server.mcpserver import Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

STATE = Path(os.environ["MCP_TEST_DIR"]) if os.environ.get("MCP_TEST_DIR") else None

server = MCPServer("test-stdio", log_level="WARNING")


def note(file: str, line: str) -> None:
    if STATE is not None:
        with open(STATE / file, "a", encoding="utf-8") as f:
            f.write(line + "\n")


class Stats(TypedDict):
    count: int
    total: float
    mean: float


@server.tool(structured_output=False)
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool(structured_output=False)
def echo(text: str) -> str:
    """Repeat the text."""
    return text


@server.tool()
def stats(numbers: list[float]) -> Stats:
    """Count, total and mean of some numbers."""
    total = sum(numbers)
    return {"count": len(numbers), "total": total, "mean": total / len(numbers)}


@server.tool(structured_output=False)
def fail(reason: str = "it went wrong") -> str:
    """Always fails with an error result."""
    raise ToolError(f"fail says: {reason}")


@server.tool(structured_output=False)
def crash() -> str:
    """Kill this server process in the middle of the call."""
    os._exit(17)


@server.tool(structured_output=False)
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await anyio.sleep(seconds)
    return f"slept {seconds}"


@server.tool(structured_output=False)
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool(structured_output=False)
def count(label: str) -> int:
    """Record one call (in the `counts` file) and return how many calls it has seen."""
    note("counts", label)
    assert STATE is not None
    return len((STATE / "counts").read_text(encoding="utf-8").splitlines())


@server.tool(structured_output=False)
async def wait_for(name: str) -> str:
    """Note that it started, then wait until the file `name` exists in MCP_TEST_DIR."""
    assert STATE is not None
    note("ledger", f"waiting {name}")
    # The test releases it from another process: a file is all the two share.
    while not (STATE / name).exists():  # noqa: ASYNC110
        await anyio.sleep(0.01)
    note("ledger", f"released {name}")
    return f"released {name}"


@server.tool(structured_output=False)
def picture() -> list[object]:
    """A caption and a tiny PNG image."""
    return ["a red dot", Image(data=b"\x89PNG\r\n\x1a\n" + b"\0" * 8, format="png")]


if __name__ == "__main__":
    if STATE is not None and (STATE / "refuse-start").exists():
        sys.stderr.write("refusing to start: refuse-start is there\n")
        sys.exit(2)
    note("starts", str(os.getpid()))
    server.run("stdio")
