"""MCP (Model Context Protocol) servers as tools: `McpServer` (all the tools of a server,
over stdio or streamable HTTP) and `McpTool` (one of them).

Needs the `mcp` package (`pip install -e '.[mcp]'` in a checkout); it is imported only when a
server is created, so `import criogen_graph` never loads it. Users import the public
names from `criogen_graph` (or `criogen_graph.mcp`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import json
import math
import os
import re
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypedDict, Unpack
from urllib.parse import urlsplit

from criogen_graph._urls import mask_url
from criogen_graph._version import __version__
from criogen_graph.errors import CriogenError, ToolError, ValidationError
from criogen_graph.redact import package_logger
from criogen_graph.tools import Tool, ToolContext, ToolSource

if TYPE_CHECKING:
    import anyio
    import httpx2
    import mcp.types as mcp_types
    from mcp import Client

    from criogen_graph.messages import ErrorCode

__all__ = ["McpServer", "McpServerError", "McpServerOptions", "McpTool"]

# The public module's name (`criogen_graph.mcp`), which users configure logging by.
_log = package_logger("criogen_graph.mcp")

INSTALL_HINT = "pip install -e '.[mcp]' in the criogen_graph checkout"
#: How many lines of a stdio server's stderr an error message quotes.
_STDERR_TAIL = 12
_BAD_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")
#: What a session id may be made of (the spec: visible ASCII characters only).
_SESSION_ID = re.compile(rb"[\x21-\x7e]+")
#: How long the end of a session (an HTTP server's DELETE) may take, at most (and at
#: most the server's startup timeout).
_CLOSE_GRACE_SECS = 3.0


class McpServerError(CriogenError):
    """An MCP server cannot be used, named by `server`.

    `code` says why: `"mcp_unavailable"` (it does not start, exits at once, cannot be
    reached, does not finish its handshake or list its tools within
    `startup_timeout_secs`, or cannot be started again after it stopped) or
    `"mcp_connection_lost"` (it stopped or dropped the connection while a call ran; that
    call is not sent again, since it may have run). Raised where the server is first
    needed: loading the agent's tools, or a call (where `on_tool_exception` applies to
    it).
    """

    code = "mcp_unavailable"

    def __init__(self, message: str, *, server: str, code: ErrorCode | None = None) -> None:
        super().__init__(message, code=code)
        self.server = server


def _import_mcp() -> None:
    try:
        import mcp  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"MCP servers need the 'mcp' package, which is not installed: {INSTALL_HINT}"
        ) from exc


# -- configuration -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Stdio:
    command: str
    args: tuple[str, ...]
    env: dict[str, str] | None
    cwd: str | None


@dataclass(frozen=True, slots=True)
class _Http:
    url: str
    headers: dict[str, str] = field(repr=False)


class McpServerOptions(TypedDict, total=False):
    """The options both `McpServer` constructors take besides `name` (see `McpServer`)."""

    include: Iterable[str] | None
    exclude: Iterable[str]
    prefix: str
    timeout_secs: float | None
    startup_timeout_secs: float


class McpServer(ToolSource):
    """An MCP server whose tools the agent can use: `Agent(tools=[server])` gives the
    model all of them, with the server's names, descriptions and input schemas;
    `server.tool(name)` gives one.

    Create it with `McpServer.stdio(command, args)` (a local process spoken to over
    stdin/stdout) or `McpServer.http(url, headers=...)` (streamable HTTP).

    Lifecycle: nothing starts until the tools are first needed (the agent's first run,
    or `async with server:`). Then one session serves every call made on that event
    loop, from any task. `aclose()` (which `agent.aclose()` calls) ends it and stops a
    stdio process; using the server again afterwards starts a new session.

    Reconnecting: when the process exits or the connection drops, the next call (or
    tool listing) starts a new session and goes on. A call that was running when the
    server died is not sent again (it may have done its work): it fails with
    `McpServerError` (code `"mcp_connection_lost"`), and the agent's
    `on_tool_exception` policy decides what the model sees. A server that cannot be
    started (again) raises `McpServerError` (code `"mcp_unavailable"`); the next run
    tries again.

    HTTP sessions: a server that restarted (or let the session go) answers the old
    `Mcp-Session-Id` with 404 (or 400, as servers did before the spec said 404). The
    call did not run, so it is sent once more, to a new session; calls that notice at
    the same time share one new session. A call the server refuses for the new session
    too is the model's error. A call that could not reach the server at all (connection
    refused) is also sent once more; one whose answer was cut off or was not JSON is
    not. `aclose()` ends the session with the HTTP `DELETE` the spec describes (waiting
    at most 3 s, or `startup_timeout_secs` when shorter).

    Results: an error result (`isError`) reaches the model as a `ToolError`; otherwise
    the model gets the structured content when there is some, else the text content
    (other content, such as images, is described in a few words). Arguments are checked
    against the tool's input schema before anything is sent. Server-side JSON-RPC errors
    to a call (e.g. an unknown tool) also reach the model as a `ToolError`.

    Options of both constructors: `name` (shown in errors; defaults to the command or
    the URL), `include` / `exclude` (MCP tool names to keep / drop), `prefix` (put in
    front of every tool name, to keep the tools of two servers apart), `timeout_secs`
    (a per-call timeout for these tools instead of the agent's
    `Limits.tool_timeout_secs`) and `startup_timeout_secs` (how long starting and the
    protocol handshake may take, and then listing the tools). Tool names are made fit
    for models (characters other than letters, digits, `_` and `-` become `_`; at most
    64 characters); the server still gets its own names.

    Tool annotations of the server (`readOnlyHint`, `idempotentHint`) are not trusted:
    MCP tools are never retried by `tool_retry`.
    """

    def __init__(
        self,
        target: _Stdio | _Http,
        *,
        name: str,
        include: Iterable[str] | None = None,
        exclude: Iterable[str] = (),
        prefix: str = "",
        timeout_secs: float | None = None,
        startup_timeout_secs: float = 30,
    ) -> None:
        if not isinstance(target, _Stdio | _Http):
            raise TypeError("create an McpServer with McpServer.stdio(...) or McpServer.http(...)")
        _import_mcp()
        if not isinstance(name, str) or not name:
            raise TypeError("name must be a non-empty str")
        if isinstance(include, str) or isinstance(exclude, str):
            raise TypeError("include and exclude take lists of tool names, not one str")
        if not isinstance(prefix, str):
            raise TypeError("prefix must be a str")
        for option, value in (
            ("startup_timeout_secs", startup_timeout_secs),
            ("timeout_secs", timeout_secs),
        ):
            if value is None and option == "timeout_secs":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValidationError(
                    f"McpServer {option} must be a positive number", code="invalid_value"
                )
        self._target = target
        self.name = name
        self._include = tuple(include) if include is not None else None
        self._exclude = frozenset(exclude)
        self._prefix = prefix
        self._timeout_secs = timeout_secs
        self._startup_timeout_secs = float(startup_timeout_secs)
        self._loops: dict[asyncio.AbstractEventLoop, _LoopState] = {}
        self._loops_lock = threading.Lock()

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        name: str | None = None,
        **options: Unpack[McpServerOptions],
    ) -> McpServer:
        """A server run as a local process (`command` with `args`, in `cwd`), spoken to
        over its stdin and stdout.

        The process gets `PATH`, `HOME` and a few other basic variables of this
        process's environment, plus `env` (nothing else leaks to it, secrets included).
        What it writes on stderr goes to this process's stderr; its last lines are
        quoted when it fails to start.
        """
        if not isinstance(command, str) or not command:
            raise TypeError("command must be a non-empty str")
        if isinstance(args, str) or not all(isinstance(a, str) for a in args):
            raise TypeError("args must be a list of str")
        if env is not None and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise TypeError("env must map str to str")
        target = _Stdio(command, tuple(args), dict(env) if env is not None else None, _fspath(cwd))
        return cls(
            target,
            name=name if name is not None else _stdio_name(command, args),
            **options,
        )

    @classmethod
    def http(
        cls,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        name: str | None = None,
        **options: Unpack[McpServerOptions],
    ) -> McpServer:
        """A server reached over streamable HTTP at `url` (e.g. `https://host/mcp`);
        `headers` go with every request (e.g. `{"Authorization": "Bearer ..."}`)."""
        if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https"):
            raise ValidationError(
                "McpServer.http needs an http:// or https:// URL, got "
                f"{mask_url(url) if isinstance(url, str) else url!r}",
                code="invalid_value",
            )
        if headers is not None and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise TypeError("headers must map str to str")
        return cls(
            _Http(url, dict(headers or {})),
            name=name if name is not None else _http_name(url),
            **options,
        )

    # -- the public API ----------------------------------------------------------------

    def tool(self, name: str) -> McpTool:
        """One tool of this server, by its MCP name (a missing name fails when the
        agent loads its tools). The server's `prefix` and `timeout_secs` apply."""
        return McpTool(self, name)

    async def load_tools(self) -> list[Tool]:
        """Connect if needed and return the server's tools (after `include` /
        `exclude`)."""
        listed = await self._list_tools()
        by_name = {t.name: t for t in listed}
        if self._include is not None:
            missing = [n for n in self._include if n not in by_name]
            if missing:
                raise ValidationError(
                    f"MCP server {self.name!r} has no tool named "
                    f"{', '.join(repr(n) for n in missing)} (include=); it has: "
                    f"{', '.join(sorted(by_name)) or '(none)'}",
                    code="unknown",
                )
            chosen = [by_name[n] for n in dict.fromkeys(self._include)]
        else:
            chosen = list(listed)
        return self._make_tools([t for t in chosen if t.name not in self._exclude])

    async def aclose(self) -> None:
        """End the session (stopping a stdio process). Safe to call more than once;
        using the server afterwards starts a new session."""
        loop = asyncio.get_running_loop()
        with self._loops_lock:
            states = list(self._loops.items())
            self._loops = {lp: s for lp, s in states if lp is not loop and not lp.is_closed()}
        for lp, state in states:
            if lp is loop:
                await state.close()
            elif not lp.is_closed():
                # A session of another (running) loop must be ended from that loop.
                with contextlib.suppress(RuntimeError):
                    lp.call_soon_threadsafe(state.stop_nowait)

    async def __aenter__(self) -> McpServer:
        """Start the session now (so a server that cannot start fails here)."""
        await self._session()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<McpServer {self.name!r}>"

    # -- tools ---------------------------------------------------------------------------

    def _make_tools(self, infos: Sequence[mcp_types.Tool]) -> list[Tool]:
        tools: list[Tool] = []
        seen: dict[str, str] = {}
        for info in infos:
            local = _BAD_NAME_CHARS.sub("_", self._prefix + info.name)[:64]
            if local in seen:
                raise ValidationError(
                    f"MCP server {self.name!r}: the tools {seen[local]!r} and {info.name!r} "
                    f"both become {local!r}; use include= or exclude= to keep one",
                    code="invalid_value",
                )
            seen[local] = info.name
            try:
                tools.append(_RemoteTool(self, info, local, self._timeout_secs))
            except ValidationError as exc:
                raise ValidationError(
                    f"MCP server {self.name!r}, tool {info.name!r}: {exc.message}", code=exc.code
                ) from None
        return tools

    async def _list_tools(self) -> list[mcp_types.Tool]:
        from mcp.shared.exceptions import MCPError
        from mcp.types import CONNECTION_CLOSED

        timeout = self._startup_timeout_secs
        loop = asyncio.get_running_loop()
        for attempt in (1, 2):
            session = await self._session()
            trace = _Trace()
            token = _TRACE.set(trace)
            session.enter()
            # Past the deadline the session is stopped under the listing, rather than
            # the listing cancelled: the SDK would first wait (seconds) to tell a stuck
            # session that the request was abandoned.
            late = loop.call_later(timeout, session.abort)
            tools: list[mcp_types.Tool] = []
            cursor: str | None = None
            try:
                for _ in range(1000):  # a server whose pages never end cannot hang us
                    page = await session.client().list_tools(cursor=cursor)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if cursor is None:
                        return tools
                raise self._error("lists its tools in more than 1000 pages")
            except McpServerError:
                raise
            except Exception as exc:
                if session.aborted:
                    raise self._error(f"did not list its tools within {timeout:g} s") from None
                if trace.refused() is not None:
                    session.forget()
                retry = (
                    session.lost
                    or session.expired
                    or (isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED)
                )
                if not retry:
                    raise self._error(f"could not list its tools: {_describe(exc)}") from exc
                if attempt == 2:
                    raise self._error(
                        f"stopped while its tools were being listed ({_describe(exc)})"
                    ) from exc
                # Listing changes nothing on the server: asking a new session is safe.
                # (Not the same one: its transport may be gone without it knowing yet.)
                if trace.answered():
                    session.drop()
                else:
                    session.lost = True
            finally:
                late.cancel()
                _TRACE.reset(token)
                session.leave()
        raise AssertionError("unreachable")

    async def _call(self, mcp_name: str, args: dict[str, Any]) -> Any:
        from mcp.shared.exceptions import MCPError
        from mcp.types import CONNECTION_CLOSED

        http = isinstance(self._target, _Http)
        for attempt in (1, 2):
            session = await self._session()
            trace = _Trace()
            token = _TRACE.set(trace)
            # No await between the liveness check in _session() and the send: a session
            # seen alive here had not lost its transport when the request went out.
            session.enter()
            try:
                result = await session.client().call_tool(mcp_name, args)
            except MCPError as exc:
                error = exc
            else:
                return _result_value(mcp_name, result)
            finally:
                _TRACE.reset(token)
                session.leave()
            refused = trace.refused() if http else None
            if refused is not None:
                # The server answered 404 (or 400) to a request of this session: it no
                # longer knows the session (it restarted, or let an idle session go), so
                # the call did not run and a new session may send it, once.
                session.forget()
                if attempt == 1:
                    continue
                raise ToolError(
                    f"the MCP server refused the call to {mcp_name} ({refused}), for a new "
                    f"session too: {error}"
                ) from error
            closed = error.code == CONNECTION_CLOSED or session.lost
            if http and closed and trace.unsent():
                # The request never left (e.g. the connection was refused): it cannot have
                # run, and the session is gone with the transport.
                session.lost = True
                if attempt == 1:
                    continue
                raise self._error(
                    f"could not be sent the call to {mcp_name!r} ({trace.problem() or error})",
                    code="mcp_connection_lost",
                ) from error
            if closed:
                if not http or not trace.answered():
                    session.lost = True
                again = " (the next call starts a new session)" if session.lost else ""
                raise self._error(
                    f"stopped or dropped the connection while {mcp_name!r} ran; the call "
                    "may or may not have taken effect, so it is not sent again" + again,
                    code="mcp_connection_lost",
                ) from error
            raise ToolError(_call_failure(mcp_name, error, trace)) from error
        raise AssertionError("unreachable")

    # -- sessions ------------------------------------------------------------------------

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        with self._loops_lock:
            state = self._loops.get(loop)
            if state is None:
                # Sessions of finished event loops are gone with their loop.
                self._loops = {lp: s for lp, s in self._loops.items() if not lp.is_closed()}
                state = self._loops[loop] = _LoopState()
            return state

    async def _session(self) -> _Session:
        state = self._state()
        session = state.session
        if session is not None and session.usable:
            return session
        async with state.lock:
            # Calls that found the session gone all wait here; the first starts a new
            # one and the others use it.
            session = state.session
            if session is not None and session.usable:
                return session
            restarting = session is not None and (session.lost or session.expired)
            if session is not None:
                # Calls still running on it finish first (their answers may be on the
                # way); it ends when the last one does.
                state.retire(session)
            session = state.session = _Session(self)
            try:
                await session.start()
            except McpServerError as exc:
                state.session = None
                if restarting:
                    again = "started" if isinstance(self._target, _Stdio) else "connected to"
                    problem = exc.message.removeprefix(f"MCP server {self.name!r} ")
                    raise self._error(
                        f"stopped and could not be {again} again: {problem}"
                    ) from exc.__cause__
                raise
            except BaseException:
                # The caller was cancelled (e.g. its tool timed out) while the server
                # started: stop it rather than leave a half-started session behind.
                state.session = None
                state.retire(session)
                raise
            return session

    def _error(self, what: str, *, code: ErrorCode | None = None) -> McpServerError:
        return McpServerError(f"MCP server {self.name!r} {what}", server=self.name, code=code)


class McpTool(ToolSource):
    """One tool of an MCP server (`server.tool(name)`): put it in `Agent(tools=[...])`
    to give the model only that tool. Loading fails with `ValidationError` (code
    `"unknown"`) when the server has no such tool. Shares the server's session;
    `aclose()` closes the server."""

    def __init__(self, server: McpServer, name: str) -> None:
        if not isinstance(server, McpServer):
            raise TypeError("McpTool needs an McpServer")
        if not isinstance(name, str) or not name:
            raise TypeError("the MCP tool name must be a non-empty str")
        self.server = server
        self.tool_name = name
        self.name = f"{server.name}:{name}"

    async def load_tools(self) -> list[Tool]:
        """Connect if needed and return the one tool."""
        listed = await self.server._list_tools()
        for info in listed:
            if info.name == self.tool_name:
                return self.server._make_tools([info])
        raise ValidationError(
            f"MCP server {self.server.name!r} has no tool named {self.tool_name!r}; it has: "
            f"{', '.join(sorted(t.name for t in listed)) or '(none)'}",
            code="unknown",
        )

    async def aclose(self) -> None:
        """Close the server's session."""
        await self.server.aclose()

    def __repr__(self) -> str:
        return f"<McpTool {self.tool_name!r} of {self.server.name!r}>"


class _RemoteTool(Tool):
    """A tool that lives on an MCP server: `run` sends `tools/call`."""

    def __init__(
        self, server: McpServer, info: mcp_types.Tool, name: str, timeout_secs: float | None
    ) -> None:
        super().__init__(
            name,
            info.description or info.title or "",
            info.input_schema,
            timeout_secs=timeout_secs,
        )
        self.server = server
        self.mcp_name = info.name

    async def run(self, args: Any, ctx: ToolContext) -> Any:
        return await self.server._call(self.mcp_name, dict(args))

    def __repr__(self) -> str:
        return f"<McpServer tool {self.name!r} of {self.server.name!r}>"


def _result_value(name: str, result: mcp_types.CallToolResult) -> Any:
    if result.is_error:
        raise ToolError(_content_text(result.content) or f"the MCP tool {name} failed")
    if result.structured_content is not None:
        return result.structured_content
    return _content_text(result.content)


def _content_text(blocks: Sequence[Any]) -> str:
    import mcp.types as t

    parts: list[str] = []
    for block in blocks:
        if isinstance(block, t.TextContent):
            parts.append(block.text)
        elif isinstance(block, t.ImageContent | t.AudioContent):
            kind = "image" if isinstance(block, t.ImageContent) else "audio"
            parts.append(f"[{kind} {block.mime_type}, {_b64_size(block.data)} bytes]")
        elif isinstance(block, t.ResourceLink):
            label = f" ({block.name})" if block.name else ""
            parts.append(f"[resource link {block.uri}{label}]")
        elif isinstance(block, t.EmbeddedResource):
            res = block.resource
            if isinstance(res, t.TextResourceContents):
                parts.append(res.text)
            else:
                mime = f" {res.mime_type}" if res.mime_type else ""
                parts.append(f"[resource {res.uri}{mime}, {_b64_size(res.blob)} bytes]")
        else:
            parts.append(f"[{getattr(block, 'type', 'unknown')} content]")
    return "\n".join(parts)


def _b64_size(data: str) -> int:
    return len(data) * 3 // 4 - data[-2:].count("=")


# -- one session, held open by a task of its own ------------------------------------------


class _LoopState:
    """The session of one event loop, the lock that makes one task start it, and the
    sessions it replaced that are still ending."""

    def __init__(self) -> None:
        self.session: _Session | None = None
        self.lock = asyncio.Lock()
        self.retiring: set[_Session] = set()

    def retire(self, session: _Session) -> None:
        """Let `session` end once its running calls have (at once if none runs)."""
        self.retiring.add(session)
        session.retire(lambda: self.retiring.discard(session))

    async def close(self) -> None:
        sessions = self._take()
        for session in sessions:
            session.stop_nowait()
        for session in sessions:
            await session.close()

    def stop_nowait(self) -> None:
        for session in self._take():
            session.stop_nowait()

    def _take(self) -> list[_Session]:
        sessions = [*self.retiring] + ([self.session] if self.session is not None else [])
        self.session = None
        self.retiring = set()
        return sessions


class _Session:
    """One MCP session. Its transport and client are anyio context managers that must be
    entered and left by one task, so a task of its own holds them open; requests are
    sent from any task of the same loop."""

    def __init__(self, server: McpServer) -> None:
        self.server = server
        self._client: Client | None = None
        self.lost = False  # the transport ended: the server stopped or the connection dropped
        # The server no longer knows the session (it answered 404, or refused a call for
        # it): nothing more goes to it, not even the DELETE that ends a session.
        self.expired = False
        self._stopping = False
        self._retired = False
        self._dropped = False
        self.aborted = False  # stopped by a deadline (`abort`)
        self._calls = 0  # requests running on the session
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Read the outcome even when nobody waits any more (no "never retrieved" noise).
        self._ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._scope: anyio.CancelScope | None = None
        self._stderr: _StderrPump | None = None
        self._http_problems: collections.deque[str] = collections.deque(maxlen=5)

    @property
    def usable(self) -> bool:
        return (
            self._client is not None
            and not self.lost
            and not self.expired
            and not self._stopping
            and not self._retired
            and not self._dropped
        )

    def client(self) -> Client:
        if self._client is None:  # closed under a caller
            raise self.server._error("was closed", code="mcp_connection_lost")
        return self._client

    def enter(self) -> None:
        self._calls += 1

    def leave(self) -> None:
        self._calls -= 1
        if self._retired and self._calls == 0:
            self.stop_nowait()

    def forget(self) -> None:
        """The server does not know this session (any more)."""
        self.expired = True

    def drop(self) -> None:
        """Send nothing more on this session (it ends once its calls have)."""
        self._dropped = True

    def abort(self) -> None:
        """Stop the session at once, under whatever runs on it."""
        self.aborted = True
        self.lost = True
        if self._scope is not None:
            self._scope.cancel()
        elif self._task is not None:
            self._task.cancel()

    def retire(self, on_ended: Callable[[], None]) -> None:
        self._retired = True
        if self._task is None or self._task.done():
            on_ended()
        else:
            self._task.add_done_callback(lambda _: on_ended())
        if self._calls == 0:
            self.stop_nowait()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._hold(), name=f"MCP session {self.server.name}")
        # Shielded: cancelling the caller must not cancel the future the task settles.
        await asyncio.shield(self._ready)

    def stop_nowait(self) -> None:
        self._stopping = True
        if self._scope is None:
            if self._task is not None:
                self._task.cancel()  # not started yet: nothing to unwind
        elif self._client is not None and not self.lost:
            # Up: leave the session the way the protocol asks (an HTTP server gets the
            # DELETE that ends it), within a grace period.
            self._stop.set()
        else:
            self._scope.cancel()

    async def close(self) -> None:
        self.stop_nowait()
        task = self._task
        if task is not None and not task.done() and task is not asyncio.current_task():
            await asyncio.wait([task])

    def _on_transport_end(self) -> None:
        self.lost = True
        # Once up, a session whose transport ended is let go at once (reaping a dead
        # process); before that, the handshake fails on its own and says why.
        if self._ready.done() and self._scope is not None:
            asyncio.get_running_loop().call_soon(self._scope.cancel)

    async def _hold(self) -> None:
        import anyio
        from mcp import Client, Implementation

        server = self.server
        try:
            with anyio.CancelScope(
                deadline=anyio.current_time() + server._startup_timeout_secs
            ) as scope:
                self._scope = scope
                async with AsyncExitStack() as stack:
                    client = Client(
                        self._transport(),
                        client_info=Implementation(name="criogen-graph", version=__version__),
                    )
                    await stack.enter_async_context(client)
                    self._client = client
                    scope.deadline = math.inf
                    self._ready.set_result(None)
                    await self._stop.wait()
                    scope.deadline = anyio.current_time() + min(
                        _CLOSE_GRACE_SECS, server._startup_timeout_secs
                    )
            if not self._ready.done():
                if self._stopping:
                    self._fail(server._error("was closed while it was starting"))
                else:
                    self._fail(
                        server._error(
                            f"did not start within {server._startup_timeout_secs:g} s"
                            + await self._stderr_tail()
                        )
                    )
        except Exception as exc:
            if not self._ready.done():
                self._fail(server._error(await self._startup_problem(exc)), cause=exc)
            else:  # the session was up: ending it is all that was left to do
                _log.debug("MCP server %r: the session ended with %r", server.name, exc)
        finally:
            self.lost = True
            self._client = None
            if self._stderr is not None:
                self._stderr.spawned()  # even when the process never started
            if not self._ready.done():
                self._fail(server._error("was closed while it was starting"))

    def _fail(self, error: McpServerError, cause: BaseException | None = None) -> None:
        error.__cause__ = cause
        self._ready.set_exception(error)

    def _transport(self) -> Any:
        target = self.server._target
        if isinstance(target, _Stdio):
            self._stderr = _StderrPump()
            return _stdio_transport(target, self._stderr, self._on_transport_end)
        return _http_transport(
            target, self._http_problems, self._on_transport_end, self.forget, lambda: self.expired
        )

    async def _startup_problem(self, exc: BaseException) -> str:
        from mcp.shared.exceptions import MCPError
        from mcp.types import CONNECTION_CLOSED

        target = self.server._target
        leaf = _leaf(exc)
        if isinstance(target, _Stdio):
            if isinstance(leaf, FileNotFoundError | PermissionError | NotADirectoryError):
                what = "was not found" if isinstance(leaf, FileNotFoundError) else "cannot run"
                where = f" in {target.cwd!r}" if target.cwd else ""
                return (
                    f"could not start: the command {target.command!r}{where} {what} "
                    f"({_describe(leaf)})"
                )
            if isinstance(leaf, OSError):
                return f"could not start: {_describe(leaf)}"
            if isinstance(leaf, MCPError) and leaf.code == CONNECTION_CLOSED:
                return "stopped before it was ready" + await self._stderr_tail()
            return f"failed its handshake: {_describe(leaf)}" + await self._stderr_tail()
        url = mask_url(target.url)
        if not self._http_problems and isinstance(leaf, MCPError):
            return f"refused the handshake at {url}: {leaf}"
        problem = self._http_problems[-1] if self._http_problems else _describe(leaf)
        if problem.startswith("HTTP "):
            return f"answered {problem} at {url}"
        if problem == _BAD_SESSION_ID:
            return f"answered at {url} with {problem}"
        return f"could not be reached at {url}: {problem}"

    async def _stderr_tail(self) -> str:
        pump = self._stderr
        if pump is None:
            return ""
        await pump.finish()
        return self._stderr_note()

    def _stderr_note(self) -> str:
        pump = self._stderr
        if pump is None:
            return ""
        lines = list(pump.tail)[-_STDERR_TAIL:]
        if not lines:
            return " (it wrote nothing on stderr)"
        return "; the end of its stderr:\n" + "\n".join(f"  {line}" for line in lines)


# -- transports ----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _stdio_transport(
    target: _Stdio, pump: _StderrPump, on_end: Callable[[], None]
) -> AsyncIterator[tuple[Any, Any]]:
    from mcp import StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(
        command=target.command, args=list(target.args), env=target.env, cwd=target.cwd
    )
    try:
        async with stdio_client(params, errlog=pump.writer) as (read, write):
            pump.spawned()
            yield _WatchedReadStream(read, on_end), write
    finally:
        pump.spawned()


@contextlib.asynccontextmanager
async def _http_transport(
    target: _Http,
    problems: collections.deque[str],
    on_end: Callable[[], None],
    on_expired: Callable[[], None],
    expired: Callable[[], bool],
) -> AsyncIterator[tuple[Any, Any]]:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    class RecordingTransport(httpx2.AsyncBaseTransport):
        """Keeps what went wrong at the HTTP level: the SDK turns it into a bare
        "connection closed" or "error response", and the user needs the status or the
        network error (and `_call` needs to know whether a request left at all)."""

        def __init__(self) -> None:
            self._inner = httpx2.AsyncHTTPTransport()

        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            with_session = "mcp-session-id" in request.headers
            if request.method == "DELETE" and expired():
                # The server no longer knows the session: there is nothing to end.
                return httpx2.Response(204, request=request)
            # Only POSTs carry requests: a GET (event stream) or DELETE (end of session)
            # that fails is allowed to, and must not hide why a request failed.
            if request.method != "POST":
                response = await self._inner.handle_async_request(request)
                if response.status_code == 404 and with_session and request.method == "GET":
                    on_expired()
                return response
            trace = _TRACE.get()
            post = _Post(with_session) if trace is not None and _is_request(request) else None
            if post is not None and trace is not None:
                trace.posts.append(post)
            try:
                response = await self._inner.handle_async_request(request)
            except Exception as exc:
                problems.append(_describe(exc))
                if post is not None:
                    post.error = exc
                raise
            status = f"HTTP {response.status_code} {response.reason_phrase}".strip()
            if post is not None:
                post.status = response.status_code
                post.answer = status
            if response.status_code >= 400:
                problems.append(status)
                if response.status_code == 404 and with_session:
                    # The spec's word for "this session is over": the request did not run.
                    on_expired()
            for name, value in response.headers.raw:
                if name.lower() == b"mcp-session-id" and not _SESSION_ID.fullmatch(value):
                    # It could not be sent back as it came (httpx refuses non-ASCII
                    # headers) and would fail every later request in a confusing way.
                    await response.aclose()
                    problems.append(_BAD_SESSION_ID)
                    raise _BadSessionId(_BAD_SESSION_ID)
            return response

        async def aclose(self) -> None:
            await self._inner.aclose()

    # The SDK's own timeouts: the read timeout is long because a server may hold a
    # response stream open.
    http = httpx2.AsyncClient(
        headers=target.headers,
        timeout=httpx2.Timeout(30.0, read=300.0),
        transport=RecordingTransport(),
    )
    async with http, streamable_http_client(target.url, http_client=http) as (read, write):
        yield _WatchedReadStream(read, on_end), write


_BAD_SESSION_ID = (
    "a session id that has characters the protocol does not allow (only visible ASCII)"
)


class _BadSessionId(Exception):
    """An HTTP server handed out a session id the protocol does not allow."""


def _is_request(request: Any) -> bool:
    """Whether an HTTP request carries a JSON-RPC request (not a notification or a
    response)."""
    try:
        message = json.loads(request.content)
    except (ValueError, TypeError, RuntimeError):
        return False
    return isinstance(message, dict) and "method" in message and "id" in message


class _Post:
    """One POST of a JSON-RPC request, and what came of it."""

    __slots__ = ("answer", "error", "status", "with_session")

    def __init__(self, with_session: bool) -> None:
        self.with_session = with_session
        self.status: int | None = None
        self.answer = ""  # e.g. "HTTP 404 Not Found"
        self.error: BaseException | None = None


class _Trace:
    """The POSTs of one call (or listing) of one session, seen by the HTTP transport:
    whether the call can have run on the server. The transport runs in a copy of the
    caller's context (the SDK passes it along with each message), so a context variable
    carries the trace to it."""

    def __init__(self) -> None:
        self.posts: list[_Post] = []

    def refused(self) -> str | None:
        """The answer (e.g. "HTTP 404 Not Found") when the server refused every request
        for the session: 404 (the spec's "no such session") or 400 (what servers
        answered to an unknown session before the spec said 404). None otherwise."""
        if self.posts and all(
            p.with_session and p.status in (400, 404) and p.error is None for p in self.posts
        ):
            return self.posts[-1].answer
        return None

    def unsent(self) -> bool:
        """Whether no request reached the server (it cannot have run)."""
        return all(isinstance(p.error, _never_sent()) for p in self.posts)

    def answered(self) -> bool:
        """Whether the server began an answer (the connection was still up)."""
        return any(p.status is not None for p in self.posts)

    def problem(self) -> str:
        errors = [p.error for p in self.posts if p.error is not None]
        return _describe(errors[-1]) if errors else ""


def _never_sent() -> tuple[type[BaseException], ...]:
    """Network errors that happen before a request's first byte goes out."""
    import httpx2

    return (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout)


def _call_failure(name: str, error: Any, trace: _Trace) -> str:
    """The model's error message for a call the server answered with an error."""
    from mcp.types import PARSE_ERROR

    text = str(error).splitlines()[0][:300] if str(error) else type(error).__name__
    if error.code == PARSE_ERROR:
        return (
            f"the MCP server's answer to the call to {name} could not be read ({text}); the "
            "call may or may not have taken effect"
        )
    answers = [p.answer for p in trace.posts if p.status is not None and p.status >= 400]
    if answers and answers[-1] and not answers[-1].startswith(("HTTP 400", "HTTP 404")):
        return f"the MCP server answered the call to {name} with {answers[-1]}: {text}"
    return f"the MCP server refused the call to {name}: {error}"


_TRACE: contextvars.ContextVar[_Trace | None] = contextvars.ContextVar(
    "criogen_mcp_trace", default=None
)


class _WatchedReadStream:
    """The transport's read stream, telling the session when it ends (the server
    stopped or the connection dropped)."""

    def __init__(self, inner: Any, on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        import anyio

        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_end()
            raise

    def __aiter__(self) -> _WatchedReadStream:
        return self

    async def __anext__(self) -> Any:
        import anyio

        try:
            return await self._inner.__anext__()
        except (StopAsyncIteration, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_end()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _WatchedReadStream:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        result: bool | None = await self._inner.__aexit__(*exc)
        return result


class _StderrPump:
    """A stdio server's stderr: forwarded to ours line by line, the last lines kept for
    error messages. A pipe rather than our stderr itself, which may have no file
    descriptor (Jupyter)."""

    def __init__(self) -> None:
        read_fd, write_fd = os.pipe()
        self.writer = os.fdopen(write_fd, "w")
        self._reader = os.fdopen(read_fd, "r", encoding="utf-8", errors="replace")
        self.tail: collections.deque[str] = collections.deque(maxlen=50)
        self._thread = threading.Thread(target=self._pump, name="MCP server stderr", daemon=True)
        self._thread.start()

    def spawned(self) -> None:
        """The process has its copy of the write end; ours must go for EOF to come."""
        if not self.writer.closed:
            self.writer.close()

    def _pump(self) -> None:
        with self._reader:
            for line in self._reader:
                self.tail.append(line.rstrip("\n"))
                try:
                    sys.stderr.write(line)
                    sys.stderr.flush()
                except (OSError, ValueError, AttributeError):
                    pass

    async def finish(self) -> None:
        """Wait (at most 2 s) until the process's stderr is read to its end."""
        self.spawned()
        await asyncio.to_thread(self._thread.join, 2.0)


# -- helpers ---------------------------------------------------------------------------


def _fspath(path: str | os.PathLike[str] | None) -> str | None:
    if path is None:
        return None
    if not isinstance(path, str | os.PathLike):
        raise TypeError("cwd must be a path")
    return os.fspath(path)


def _stdio_name(command: str, args: Sequence[str]) -> str:
    """The command and its first argument that looks like a script, module or package
    (`python server.py`, `npx server-filesystem`)."""
    words = [Path(command).name]
    for arg, previous in zip(args, ("", *args), strict=False):
        if arg.startswith("-") or previous == "-c" or any(c.isspace() for c in arg):
            continue
        words.append(Path(arg).name or arg)
        break
    return " ".join(words)


def _http_name(url: str) -> str:
    parts = urlsplit(url)
    return (parts.hostname or "") + (f":{parts.port}" if parts.port else "") + parts.path


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        inner = [e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)]
        exc = (inner or list(exc.exceptions))[0]
    return exc


def _describe(exc: BaseException) -> str:
    leaf = _leaf(exc)
    text = str(leaf)
    return f"{type(leaf).__name__}: {text}" if text else type(leaf).__name__
