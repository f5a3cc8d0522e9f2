"""Load helpers for `criogen-graph serve` (tests/test_serve_load.py and
bench/bench_idle_streams.py): many raw SSE connections, a client that never reads, the
server's memory."""

from __future__ import annotations

import asyncio
import json
import resource
import socket
from pathlib import Path
from urllib.parse import urlsplit

__all__ = [
    "close_all",
    "never_reading_stream",
    "open_idle_streams",
    "raise_nofile",
    "read_to_end",
    "rss_bytes",
]


def raise_nofile(want: int) -> int:
    """Raise this process's soft limit of open files towards `want` (up to the hard
    limit; the processes it starts inherit it); the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    cap = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if cap > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (cap, hard))
        soft = cap
    return soft


def rss_bytes(pid: int) -> int:
    """The resident memory of process `pid` (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def _request(method: str, url: str, path: str, body: bytes = b"", headers: str = "") -> bytes:
    host = urlsplit(url).netloc
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{headers}"
    if body:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


async def _open_stream(
    url: str, path: str, headers: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.write(_request("GET", url, path, headers=headers))
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    status = head.split(b" ", 2)[1]
    if status != b"200":
        writer.close()
        raise RuntimeError(f"GET {path} answered {head.decode(errors='replace')!r}")
    return reader, writer


async def open_idle_streams(
    url: str, path: str, n: int, *, headers: str = "", at_once: int = 100
) -> tuple[list[tuple[asyncio.StreamReader, asyncio.StreamWriter]], list[str]]:
    """`n` SSE connections to `path` (each answered 200, then left idle): the open
    ones, and the errors of those that could not be opened."""
    gate = asyncio.Semaphore(at_once)
    opened: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    errors: list[str] = []

    async def one() -> None:
        async with gate:
            try:
                opened.append(await _open_stream(url, path, headers))
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")

    await asyncio.gather(*(one() for _ in range(n)))
    return opened, errors


async def read_to_end(reader: asyncio.StreamReader) -> bytes:
    """The rest of a response, up to the server closing the connection."""
    return await reader.read()


def close_all(streams: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]) -> None:
    for _, writer in streams:
        writer.close()


def never_reading_stream(url: str, path: str, body: dict[str, object]) -> socket.socket:
    """A connection that sends `POST path` with `body` and then never reads (its receive
    buffer kept small, so the server meets the back-pressure soon)."""
    parts = urlsplit(url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((parts.hostname or "127.0.0.1", parts.port or 80))
    sock.sendall(_request("POST", url, path, json.dumps(body).encode()))
    return sock
