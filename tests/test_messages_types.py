"""The typed vocabulary (`criogen_graph.messages`) against what the code does: every
`Literal` equals the runtime set it names (model error kinds, error codes, usage keys,
decision types), the messages and run records a real run writes fit their `TypedDict`s,
and mypy holds code using the types to them."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, get_args, get_type_hints

import criogen_graph
from criogen_graph import Agent, FakeModel, FakeReply, tool
from criogen_graph import messages as m
from criogen_graph.errors import MODEL_ERROR_KINDS, TRANSIENT_KINDS, CriogenError
from criogen_graph.graph.state import RAN_STATUSES, new_run, not_run_messages
from criogen_graph.results import DECISION_TYPES, USAGE_KEYS, empty_usage

PACKAGE = Path(criogen_graph.__file__).resolve().parent


def _literal(alias: Any) -> set[str]:
    return set(get_args(alias))


def _sources() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(), str(p))) for p in sorted(PACKAGE.rglob("*.py"))]


def _strings(node: ast.AST) -> set[str]:
    """The string constants an expression can give (`x or "a"`, `"a" if c else "b"`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.BoolOp):
        return set().union(*(_strings(v) for v in node.values))
    if isinstance(node, ast.IfExp):
        return _strings(node.body) | _strings(node.orelse)
    return set()


def test_model_error_kind_is_the_runtime_set() -> None:
    assert _literal(m.ModelErrorKind) == MODEL_ERROR_KINDS
    assert TRANSIENT_KINDS < MODEL_ERROR_KINDS


def _given_codes(node: ast.AST) -> set[str]:
    """The codes `node` gives: `code="x"` (an argument), `code = "x"`, `code: T = "x"`."""
    if isinstance(node, ast.keyword):
        return _strings(node.value) if node.arg == "code" else set()
    if isinstance(node, ast.Assign):
        named = any(isinstance(t, ast.Name) and t.id == "code" for t in node.targets)
        return _strings(node.value) if named else set()
    if isinstance(node, ast.AnnAssign) and node.value is not None:
        named = isinstance(node.target, ast.Name) and node.target.id == "code"
        return _strings(node.value) if named else set()
    return set()


def test_error_code_lists_every_code_the_package_gives() -> None:
    """Every `code = "..."` (a class default, a local that is passed on) and every
    `code="..."` argument in the package, and nothing else."""
    found: dict[str, str] = {}
    for path, tree in _sources():
        for node in ast.walk(tree):
            for v in _given_codes(node):
                found.setdefault(v, f"{path.relative_to(PACKAGE)}:{getattr(node, 'lineno', 0)}")
    listed = _literal(m.ErrorCode)
    assert set(found) - listed == set(), {c: found[c] for c in set(found) - listed}
    assert listed - set(found) == set()
    assert len(listed) > 25


def test_every_error_class_default_code_is_listed() -> None:
    def subclasses(cls: type) -> list[type]:
        return [cls, *(s for c in cls.__subclasses__() for s in subclasses(c))]

    # Loaded on first use: the errors of background runs and MCP servers.
    assert issubclass(criogen_graph.RunFailedError, CriogenError)
    assert issubclass(criogen_graph.McpServerError, CriogenError)

    codes = {c.code for c in subclasses(CriogenError)}
    assert codes <= _literal(m.ErrorCode)
    assert {"invalid_value", "model_error", "mcp_unavailable", "run_failed"} <= codes


def test_other_literals_are_their_runtime_sets() -> None:
    assert _literal(m.UsageKey) == set(USAGE_KEYS) == set(get_type_hints(m.Usage))
    assert set(empty_usage()) == set(USAGE_KEYS)
    assert _literal(m.DecisionType) == set(DECISION_TYPES)
    assert _literal(m.ToolStatus) > RAN_STATUSES
    assert _literal(m.StopReason) > _literal(m.ModelStopReason)
    # `compacted` is set only by a run that summarized (ContextPolicy).
    assert set(new_run("r", {})) | {"compacted"} == set(get_type_hints(m.RunRecord))
    assert m.RunRecord.__optional_keys__ == {"hooks", "compacted"}


def test_every_stop_reason_the_package_sets_is_listed() -> None:
    """`...["stop_reason"] = "<x>"`, `ModelResponse(..., "<x>")`, `....stop("<x>")`."""
    found: set[str] = set()
    for _, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if (
                        isinstance(t, ast.Subscript)
                        and isinstance(t.slice, ast.Constant)
                        and t.slice.value == "stop_reason"
                    ):
                        found |= _strings(node.value)
            elif isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                if name == "ModelResponse" and len(node.args) == 3:
                    found |= _strings(node.args[2])
                elif name == "stop" and node.args:
                    found |= _strings(node.args[0])
    assert {"limit", "content_filter", "max_tokens"} <= found
    assert found <= _literal(m.StopReason), found - _literal(m.StopReason)


# -- what a real run writes ----------------------------------------------------------

_KINDS = {
    "system": m.SystemMessage,
    "user": m.UserMessage,
    "assistant": m.AssistantMessage,
    "tool": m.ToolMessage,
}


def _fits(value: dict[str, Any], kind: Any) -> None:
    """`value` has the keys of `kind` that are required and no key it does not list."""
    keys = set(get_type_hints(kind))
    assert kind.__required_keys__ <= set(value), (kind.__name__, value)
    assert set(value) <= keys, (kind.__name__, set(value) - keys)


@tool
async def lookup(order_id: str) -> str:
    """Look an order up."""
    return f"order {order_id}: shipped"


async def test_a_run_writes_messages_and_a_run_record_of_the_typed_shapes() -> None:
    model = FakeModel(
        [
            FakeReply.tool_call("lookup", {"order_id": "A-1"}),
            FakeReply.tool_call("nope", {}),
            "It shipped.",
        ]
    )
    agent = Agent(model, tools=[lookup], instructions="Be brief.")
    result = await agent.run("Where is A-1?")
    assert result.stop_reason == "final_answer"
    roles = [msg["role"] for msg in result.messages]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    for msg in result.messages:
        _fits(dict(msg), _KINDS[msg["role"]])
        if msg["role"] == "assistant":
            for call in msg.get("tool_calls") or ():
                _fits(dict(call), m.ToolCallData)
        if msg["role"] == "tool":
            assert msg.get("status") in _literal(m.ToolStatus)
    unknown = result.messages[4]
    assert unknown["role"] == "tool"
    assert unknown.get("error_kind") in _literal(m.ToolErrorKind)
    _fits(dict(result.usage), m.Usage)
    assert result.answered_by is not None
    _fits(dict(result.answered_by), m.ModelIdentity)

    stored = new_run("run-1")
    _fits(dict(stored), m.RunRecord)
    skipped = not_run_messages([{"id": "c1", "name": "lookup", "args": {}}], "it was not run")
    _fits(dict(skipped[0]), m.ToolMessage)


# -- mypy holds code to the types ----------------------------------------------------

_CHECKED = """
from messages import (
    AssistantMessage, Message, ModelErrorKind, RunRecord, ToolMessage, Usage, UserMessage,
)


def last_text(transcript: list[Message]) -> str:
    for msg in transcript[::-1]:
        if msg["role"] == "assistant":
            return msg["content"]
    return ""


def answered(msg: Message) -> str | None:
    if msg["role"] == "tool":
        return msg["tool_call_id"]
    return None


ok: ToolMessage = {"role": "tool", "tool_call_id": "c1", "name": "t", "content": "x", "status": "ok"}
reply: AssistantMessage = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"id": "c1", "name": "t", "args": {}}],
}
user: UserMessage = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
kind: ModelErrorKind = "rate_limit"

bad_status: ToolMessage = {"role": "tool", "tool_call_id": "c1", "content": "x", "status": "done"}  # E
bad_usage: Usage = {"input_tokens": 1, "output_tokens": 2}  # E
bad_kind: ModelErrorKind = "overloaded"  # E
bad_call: AssistantMessage = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]}  # E


def unnarrowed(msg: Message) -> str:
    return msg["tool_call_id"]  # E


def stop(run: RunRecord) -> None:
    run["stop_reason"] = "finished"  # E
"""


def test_mypy_holds_code_to_the_types(tmp_path: Path) -> None:
    shutil.copy(PACKAGE / "messages.py", tmp_path / "messages.py")
    checked = tmp_path / "checked.py"
    checked.write_text(textwrap.dedent(_CHECKED).lstrip())
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--no-error-summary",
            "--hide-error-context",
            "--cache-dir",
            str(tmp_path / ".mypy_cache"),
            "checked.py",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    out = done.stdout + done.stderr
    lines = checked.read_text().splitlines()
    expected = {n for n, line in enumerate(lines, 1) if line.endswith("# E")}
    errors = {int(x) for x in re.findall(r"^checked\.py:(\d+): error:", out, re.M)}
    assert len(expected) == 6
    assert errors == expected, out
