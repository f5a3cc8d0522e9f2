"""What the benchmark scripts share: the machine description, interleaved timing, and
the scripted LangChain chat model + `echo` tool the baselines use."""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from importlib.metadata import version
from typing import Any


def machine() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        **{p: version(p) for p in ("langgraph", "langchain", "langchain-core", "criogen-graph")},
    }


async def interleaved(
    variants: dict[str, Callable[[], Awaitable[None]]], blocks: int, runs: int, warmup: int
) -> dict[str, list[float]]:
    """Milliseconds per call of each variant, measured in interleaved blocks (the order
    alternates, so neither side always runs first)."""
    for fn in variants.values():
        for _ in range(warmup):
            await fn()
    samples: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for b in range(blocks):
        for name in names if b % 2 == 0 else reversed(names):
            fn = variants[name]
            gc.collect()
            out = samples[name]
            for _ in range(runs):
                t0 = time.perf_counter_ns()
                await fn()
                out.append((time.perf_counter_ns() - t0) / 1e6)
    return samples


def scripted_chat_model() -> Any:
    """A LangChain chat model that answers a user's message with a call to `echo` and the
    tool's result with "done", whatever other runs it serves at the same time."""
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    class ScriptedChatModel(BaseChatModel):
        i: int = 0

        @property
        def _llm_type(self) -> str:
            return "scripted"

        def _generate(
            self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any
        ) -> ChatResult:
            # Each run's own script, read from its transcript (one model serves many
            # concurrent runs): the user's message gets the call, the tool's result "done".
            self.i += 1
            if messages[-1].type == "human":
                call = {
                    "name": "echo",
                    "args": {"text": "hi"},
                    "id": f"call_{self.i}",
                    "type": "tool_call",
                }
                msg = AIMessage(content="", tool_calls=[call])
            else:
                msg = AIMessage(content="done")
            return ChatResult(generations=[ChatGeneration(message=msg)])

        async def _agenerate(
            self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any
        ) -> ChatResult:
            return self._generate(messages, stop)

        def bind_tools(self, tools: Any, **kw: Any) -> Any:
            return self

    return ScriptedChatModel()


def lc_echo() -> Any:
    """The `echo` tool of the LangChain baselines."""
    from langchain_core.tools import tool

    @tool
    def echo(text: str) -> str:
        """Echo the text back."""
        return text

    return echo


def our_agent(storage: Any = None, **options: Any) -> Any:
    """Our agent doing the same job: a call to `echo`, then "done"."""
    from criogen_graph import Agent, FakeReply, FunctionModel, tool

    @tool
    def echo(text: str) -> str:
        """Echo the text back."""
        return text

    state = {"i": 0}

    def script(messages: Any, tools: Any) -> Any:
        # Each run's own script, read from its transcript (one model serves many
        # concurrent runs): the user's message gets the call, the tool's result "done".
        state["i"] += 1
        if messages[-1]["role"] == "user":
            return FakeReply.tool_call("echo", {"text": "hi"}, id=f"call_{state['i']}")
        return "done"

    return Agent(FunctionModel(script), tools=[echo], storage=storage, **options)


def precompile() -> None:
    """Byte-compile criogen_graph, as `pip install .` does. From an editable install with
    PYTHONDONTWRITEBYTECODE set, every fresh process would otherwise compile our sources
    again while the baselines load the .pyc files pip wrote for them."""
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("criogen_graph")
    assert spec is not None and spec.submodule_search_locations
    for path in spec.submodule_search_locations:
        compileall.compile_dir(path, quiet=1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def loopback_server() -> Iterator[str]:
    """bench/loopback.py in its own process; yields its base URL."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, os.path.join(os.path.dirname(__file__), "loopback.py"), str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait()


def lc_echo_async() -> Any:
    """`lc_echo` as an `async def` tool: under `ainvoke` it runs on the event loop (a sync
    tool runs in a worker thread)."""
    from langchain_core.tools import tool

    @tool
    async def echo(text: str) -> str:
        """Echo the text back."""
        return text

    return echo


def our_agent_async_tool(storage: Any = None, **options: Any) -> Any:
    """`our_agent` with an `async def` echo tool (no worker-thread hop)."""
    from criogen_graph import Agent, FakeReply, FunctionModel, tool

    @tool
    async def echo(text: str) -> str:
        """Echo the text back."""
        return text

    state = {"i": 0}

    def script(messages: Any, tools: Any) -> Any:
        # Each run's own script, read from its transcript (one model serves many
        # concurrent runs): the user's message gets the call, the tool's result "done".
        state["i"] += 1
        if messages[-1]["role"] == "user":
            return FakeReply.tool_call("echo", {"text": "hi"}, id=f"call_{state['i']}")
        return "done"

    return Agent(FunctionModel(script), tools=[echo], storage=storage, **options)


async def baseline_pg_saver(url: str) -> tuple[Any, Any]:
    """LangGraph's `AsyncPostgresSaver` on a pool of 10 (as its docs set it up), set up:
    the baseline's PostgreSQL saver, and its pool to close."""
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    pool = AsyncConnectionPool(
        url,
        min_size=1,
        max_size=10,
        open=False,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
    )
    await pool.open()
    saver = AsyncPostgresSaver(pool)
    await saver.setup()
    return saver, pool
