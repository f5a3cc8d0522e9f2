"""A TCP proxy in front of PostgreSQL, in a process of its own, that delays every packet by
a settable number of milliseconds each way and counts round trips.

A round trip is counted per connection each time the client sends after having received
something on it (its first send counts too): a client that pipelines several statements
before reading pays one, a client that waits for each answer pays one per statement. The
sum over every connection is the number `round_trips()` reports, so work spread over
several connections is not hidden.

    with PgProxy("postgresql://postgres@127.0.0.1:5432/test") as proxy:
        url = proxy.url              # the same database, through the proxy
        proxy.set_delay_ms(1.0)      # each way, for every packet from now on
        proxy.reset()
        ...
        proxy.round_trips()          # bursts since reset()
        proxy.mean_delay_ms()        # the delay actually applied (wake-ups come late)

`PgProxy` is also used by bench/bench_pg_latency.py (the bench adds the repository root
to `sys.path`).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import selectors
import socket
from collections import deque
from typing import Any
from urllib.parse import urlsplit, urlunsplit


class _Shared:
    """The values the test process and the proxy process share, without locks: the
    proxy writes the counters (the test process only zeroes them between measurements)
    and the test process writes the delay."""

    def __init__(self, ctx: Any) -> None:
        self.delay_ms = ctx.Value("d", 0.0, lock=False)
        self.round_trips = ctx.Value("q", 0, lock=False)
        self.delayed_ns = ctx.Value("q", 0, lock=False)
        self.packets = ctx.Value("q", 0, lock=False)
        self.connections = ctx.Value("q", 0, lock=False)
        self.ended = ctx.Value("q", 0, lock=False)


async def _pipe(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    shared: _Shared,
    on_read: Any,
    on_written: Any,
) -> None:
    """Forward `reader` to `writer`, each chunk `delay_ms` after it arrived, in order."""
    queue: deque[tuple[float, float, bytes]] = deque()
    ready = asyncio.Event()
    done = False
    loop = asyncio.get_running_loop()

    async def forward() -> None:
        while True:
            while not queue:
                if done:
                    return
                ready.clear()
                await ready.wait()
            due, arrived, data = queue[0]
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            queue.popleft()
            writer.write(data)
            shared.delayed_ns.value += int((loop.time() - arrived) * 1e9)
            shared.packets.value += 1
            on_written()
            await writer.drain()

    sender = asyncio.create_task(forward())
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            on_read()
            now = loop.time()
            queue.append((now + shared.delay_ms.value / 1e3, now, data))
            ready.set()
    finally:
        done = True
        ready.set()
        with contextlib.suppress(Exception):
            await sender
        with contextlib.suppress(Exception):
            writer.close()


async def _serve(listener: socket.socket, target: tuple[str, int], shared: _Shared) -> None:
    async def handle(c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        try:
            s_reader, s_writer = await asyncio.open_connection(*target)
        except OSError:
            c_writer.close()
            return
        for w in (c_writer, s_writer):
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        shared.connections.value += 1
        # Per connection: whether the client was handed something since it last sent.
        state = {"received": True}

        def client_sent() -> None:
            if state["received"]:
                shared.round_trips.value += 1
                state["received"] = False

        def client_received() -> None:
            state["received"] = True

        def nothing() -> None:
            return None

        await asyncio.gather(
            _pipe(c_reader, s_writer, shared, client_sent, nothing),
            _pipe(s_reader, c_writer, shared, nothing, client_received),
            return_exceptions=True,
        )
        shared.ended.value += 1

    server = await asyncio.start_server(handle, sock=listener)
    async with server:
        await server.serve_forever()


def _main(listener: socket.socket, target: tuple[str, int], shared: _Shared, ready: Any) -> None:
    async def serve() -> None:
        task = asyncio.create_task(_serve(listener, target, shared))
        await asyncio.sleep(0)
        ready.set()
        await task

    # `select()` takes its timeout in microseconds; epoll and poll round it up to whole
    # milliseconds, which would turn a 0.5 ms delay into 1 ms or more.
    loop = asyncio.SelectorEventLoop(selectors.SelectSelector())
    try:
        loop.run_until_complete(serve())
    finally:
        loop.close()


class PgProxy:
    """The proxy process for the PostgreSQL at `url` (see the module docstring)."""

    def __init__(self, url: str, delay_ms: float = 0.0) -> None:
        parts = urlsplit(url)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._parts = parts
        ctx = multiprocessing.get_context("spawn")
        self._shared = _Shared(ctx)
        self._shared.delay_ms.value = delay_ms
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(512)
        self.port = int(self._listener.getsockname()[1])
        self._ready = ctx.Event()
        self._proc = ctx.Process(
            target=_main,
            args=(self._listener, self._target, self._shared, self._ready),
            daemon=True,
        )

    @property
    def url(self) -> str:
        """The database URL through the proxy."""
        netloc = self._parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{self.port}"
        netloc_new = f"{netloc[0]}@{host}" if len(netloc) == 2 else host
        return urlunsplit(self._parts._replace(netloc=netloc_new))

    def start(self) -> PgProxy:
        self._proc.start()
        # (The listener queues connections meanwhile; this only keeps a process that
        # failed to start from passing unnoticed.)
        if not self._ready.wait(60):
            self.stop()
            raise RuntimeError("the PostgreSQL proxy process did not start")
        return self

    def stop(self) -> None:
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)
        self._listener.close()

    def __enter__(self) -> PgProxy:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def set_delay_ms(self, delay_ms: float) -> None:
        """Delay every packet from now on by `delay_ms` each way."""
        self._shared.delay_ms.value = float(delay_ms)

    def reset(self) -> None:
        """Start counting round trips (and the delay applied) afresh."""
        self._shared.round_trips.value = 0
        self._shared.delayed_ns.value = 0
        self._shared.packets.value = 0

    def round_trips(self) -> int:
        """Client sends that followed a receive, over every connection, since `reset()`."""
        return int(self._shared.round_trips.value)

    def connections(self) -> int:
        """Connections the proxy has accepted since it started."""
        return int(self._shared.connections.value)

    def open_connections(self) -> int:
        """Connections through the proxy not ended yet (a client's goodbye counts as a
        round trip of the connection it ends, when the proxy gets it)."""
        return int(self._shared.connections.value - self._shared.ended.value)

    def mean_delay_ms(self) -> float:
        """The mean delay each packet actually got since `reset()` (on a busy machine the
        proxy wakes up late), for turning a slope into round trips."""
        packets = self._shared.packets.value
        return self._shared.delayed_ns.value / packets / 1e6 if packets else 0.0
