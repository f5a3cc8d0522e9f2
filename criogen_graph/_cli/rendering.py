"""How the command line prints: stored messages, approval requests, audit records, JSON,
and the events of a run as they stream."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from criogen_graph.results import ApprovalRequest, Reply
    from criogen_graph.stream import Stream, StreamEvent

__all__ = [
    "Printer",
    "args_json",
    "audit_summary",
    "fmt_ms",
    "message_lines",
    "one_line",
    "print_json",
    "request_lines",
]


def fmt_ms(ms: int | None) -> str:
    """A timestamp in milliseconds as local time (`-` for none)."""
    if not ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def one_line(value: Any, limit: int = 200) -> str:
    """`value` (text, or JSON) on one line, cut to `limit` characters."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def args_json(args: Any) -> str:
    """A tool call's arguments as compact JSON."""
    return json.dumps(args, ensure_ascii=False, default=str)


def print_json(data: Any, out: TextIO) -> None:
    """`data` as indented JSON (for scripts)."""
    out.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")


def message_lines(m: Mapping[str, Any]) -> list[str]:
    """A stored message, readable."""
    role = m.get("role")
    content = m.get("content")
    if role == "tool":
        status = m.get("status") or "ok"
        return [f"tool {m.get('name')} [{status}]: {one_line(content, 500)}"]
    lines: list[str] = []
    if content:
        text = content if isinstance(content, str) else one_line(content, 2000)
        lines.append(f"{role}: {text}")
    for c in m.get("tool_calls") or ():
        lines.append(f"  calls {c.get('name')}({args_json(c.get('args'))})  [{c.get('id')}]")
    return lines or [f"{role}: "]


def request_lines(r: ApprovalRequest) -> list[str]:
    """A call waiting for approval: its id, tool and args, then what the rule says."""
    lines = [f"{r.call_id}  {r.tool}({args_json(r.args)})"]
    if r.description:
        lines.append(f"    {r.description}")
    if r.allowed is not None:
        lines.append(f"    allowed: {', '.join(r.allowed)}")
    return lines


def _tool_call_summary(d: Mapping[str, Any]) -> str:
    ran = f" as {d['ran_as']}" if d.get("ran_as") and d.get("ran_as") != d.get("tool") else ""
    extra = f" ({d['decision']})" if isinstance(d.get("decision"), str) else ""
    return f"{d.get('tool')}{ran} [{d.get('status')}]{extra}"


def _decisions_summary(d: Mapping[str, Any]) -> str:
    return ", ".join(
        f"{x.get('tool')}: {(x.get('decision') or {}).get('type')}"
        for x in d.get("decisions") or ()
    )


def _failure_summary(d: Mapping[str, Any]) -> str:
    message = one_line(d.get("message") or "", 100)
    return f"{d.get('error')}: {message}" if message else str(d.get("error") or "")


def audit_summary(r: Mapping[str, Any]) -> str:
    """The details of an audit record, on one line (empty for an action without any)."""
    d: Mapping[str, Any] = r.get("details") or {}
    action = r.get("action")
    if action == "send":
        return one_line(d.get("input"), 80)
    if action == "tool_call":
        return _tool_call_summary(d)
    if action in ("approve", "reject", "decide"):
        return _decisions_summary(d)
    if action in ("run_failed", "run_cancelled"):
        return _failure_summary(d)
    if action == "rewind":
        return f"to {d.get('checkpoint_id')}"
    return ""


class Printer:
    """Prints stream events as they arrive: the answer as it is written, tool calls and
    their results."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self._text_id: str | None = None
        self._streamed: set[str] = set()
        self._open = False

    def write(self, text: str) -> None:
        """Write `text` now (a streamed answer shows as it comes)."""
        self.out.write(text)
        self.out.flush()

    def line(self, text: str = "") -> None:
        """`text` on a line of its own."""
        self.end_line()
        self.write(text + "\n")

    def end_line(self) -> None:
        """End the line a streamed answer left open."""
        if self._open:
            self.write("\n")
            self._open = False
            self._text_id = None

    def _text(self, message_id: str, text: str) -> None:
        if message_id != self._text_id:
            self.end_line()
            self.write("assistant> ")
            self._text_id = message_id
            self._streamed.add(message_id)
        self.write(text)
        self._open = True

    def _message(self, m: Mapping[str, Any]) -> None:
        if m.get("role") == "assistant":
            # An answer already streamed as text is not printed again.
            if m.get("content") and m.get("id") not in self._streamed:
                self.line(f"assistant> {m['content']}")
        elif m.get("role") == "tool":
            status = m.get("status") or "ok"
            self.line(f"  < {m.get('name')} [{status}] {one_line(m.get('content'))}")

    def show(self, event: StreamEvent) -> None:
        """Print one stream event (events it does not show are skipped)."""
        from criogen_graph.stream import MessageEvent, TextEvent, ToolCallStartedEvent

        if isinstance(event, TextEvent):
            self._text(event.message_id, event.text)
        elif isinstance(event, ToolCallStartedEvent):
            self.line(f"  > {event.tool}({args_json(event.args)})")
        elif isinstance(event, MessageEvent):
            self._message(event.message)

    async def consume(self, stream: Stream[Any]) -> Reply[Any]:
        """Print the events of `stream` until it ends; its reply."""
        try:
            async for event in stream:
                self.show(event)
            return await stream.reply()
        finally:
            self.end_line()
