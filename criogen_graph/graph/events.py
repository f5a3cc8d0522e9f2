"""Stream plumbing shared by the nodes: where a node's events go (our stream's sink, or
LangGraph's `custom` stream mode), and text streamed with redaction held back."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.config import get_stream_writer

_EMPTY: Mapping[str, Any] = MappingProxyType({})
#: Set in a run's `configurable` by `Thread.stream`: a function the nodes hand their
#: event payloads to directly (no LangGraph stream queue, no thread-safe hand-over per
#: event).
STREAM_SINK = "__criogen_stream_sink"
#: True while our API (`Agent.run`, a thread's calls) runs the graph: unless it streams,
#: the nodes build no events. A graph run by LangGraph itself (`agent.graph.astream(...)`,
#: LangGraph's server, Studio) writes them to LangGraph's `custom` stream mode, which
#: drops them unless the caller asked for that mode.
API_RUN: ContextVar[bool] = ContextVar("criogen_api_run", default=False)
Writer = Callable[[Any], None]
#: Set in the `configurable` of a run LangGraph drives (by the graph's `astream`): False
#: when nobody reads LangGraph's `custom` stream mode, so the nodes build no events and
#: models are not asked to stream for them.
CUSTOM_STREAM = "__criogen_custom_stream"


def stream_writer(config: RunnableConfig) -> Writer | None:
    """The stream writer when the run is streamed, else None (no event is built)."""
    configurable = config.get("configurable") or _EMPTY
    sink: Writer | None = configurable.get(STREAM_SINK)
    if sink is not None:
        # Only the streamed graph's own nodes write to it: an agent run inside one (as a
        # tool, in a hook) is a subgraph, with a nested namespace ("tools:..|model:..")
        # and the same `configurable`, and LangGraph's stream leaves subgraphs out too.
        return None if "|" in configurable.get("checkpoint_ns", "") else sink
    if API_RUN.get() or configurable.get(CUSTOM_STREAM) is False:
        return None
    return get_stream_writer()


def step_of(config: RunnableConfig) -> int | None:
    step = (config.get("metadata") or {}).get("langgraph_step")
    return int(step) if step is not None else None


class RedactedText:
    """Streams redacted text: holds back the last `HOLD` characters, so a secret that is
    still arriving is never sent in pieces; `finish()` sends the rest. What it sends joins
    to the redacted full answer, the text that is saved."""

    HOLD = 256

    __slots__ = ("_buf", "_pending", "_redactor", "_sent", "_sink")

    def __init__(self, redactor: Any, sink: Callable[[str], None]) -> None:
        self._redactor = redactor
        self._sink = sink
        self._buf = ""
        self._sent = 0
        self._pending = 0

    def __call__(self, piece: str) -> None:
        self._buf += piece
        self._pending += len(piece)
        if self._pending < 32:
            return  # redact in batches, not on every token
        self._pending = 0
        clean = self._redactor.redact(self._buf)
        upto = len(clean) - self.HOLD
        if upto > self._sent:
            self._sink(clean[self._sent : upto])
            self._sent = upto

    def finish(self) -> None:
        clean = self._redactor.redact(self._buf)
        if len(clean) > self._sent:
            self._sink(clean[self._sent :])
        self._sent = len(clean)
