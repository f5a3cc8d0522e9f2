"""Reading the behaviour log (see `tests/behaviour/agents.py`): tool runs, model inputs,
and the hook calls of each run segment."""

from __future__ import annotations

from typing import Any

Record = dict[str, Any]

HOOK_EVENTS = ("on_start", "before_model", "before_tool", "on_end")


def tool_runs(log: list[Record]) -> list[tuple[str, dict[str, Any]]]:
    """Each tool function that ran, with its arguments, in order."""
    return [(r["tool"], r["args"]) for r in log if r["event"] == "tool"]


def model_inputs(log: list[Record], agent: str) -> list[list[dict[str, Any]]]:
    """The messages the model of `agent` got, one list per model call."""
    return [r["messages"] for r in log if r["event"] == "model" and r["agent"] == agent]


def segments(log: list[Record], agent: str) -> list[list[Record]]:
    """The log of `agent` split where `on_start` starts a segment (anything before the
    first `on_start` forms a segment of its own, which the checks then reject)."""
    out: list[list[Record]] = []
    for r in log:
        if r.get("agent") != agent and r["event"] != "tool":
            continue
        if r["event"] == "on_start" or not out:
            out.append([])
        out[-1].append(r)
    return out


def events(segment: list[Record]) -> list[str]:
    return [r["event"] for r in segment]


def check_segment(segment: list[Record], outcome: str) -> None:
    """A run segment as the hooks see it: `on_start` first (before any model call), once;
    `on_end` last, once, with `outcome`."""
    kinds = events(segment)
    assert kinds[0] == "on_start", f"the segment does not begin with on_start: {kinds}"
    assert kinds.count("on_start") == 1, kinds
    assert kinds.count("on_end") == 1, f"on_end must run exactly once per segment: {kinds}"
    assert kinds[-1] == "on_end", f"on_end must be the segment's last call: {kinds}"
    assert segment[-1]["outcome"] == outcome, kinds


def check_hook_state(segment: list[Record]) -> None:
    """Every `before_model` and the `on_end` of a segment see, as `ctx.hook_state`, the
    `HookAction(state=...)` this segment's `on_start` returned."""
    token = {"token": segment[0]["token"]}
    for r in segment:
        if r["event"] in ("before_model", "on_end"):
            assert r["hook_state"] == token, (
                f"{r['event']} saw hook_state {r['hook_state']!r}, on_start saved {token!r}"
            )
