"""The agents of the behaviour suite, defined once: the tests build them in-process (our
API, LangGraph's own savers) and `langgraph dev` serves the same definitions
(`tests/behaviour/langgraph.json` names the `*_graph` variables below).

Every model is a scripted `FunctionModel` that decides from the transcript alone (no
hidden state), so any number of threads, resumes and processes work. What happens is
made observable where it happens: each model call (with the messages the model got),
each tool run and each hook call appends one JSON line to the file named by
`CRIOGEN_BEHAVIOUR_LOG` (in the dev server too, which gets the variable when the tests
start it). The lines are written from a worker thread: the dev server's `blockbuster`
check refuses blocking file writes on the event loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import uuid
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from criogen_graph import (
    Agent,
    Approval,
    FakeReply,
    FunctionModel,
    Hook,
    HookAction,
    HookContext,
    Limits,
    Memory,
    Redactor,
    ToolCall,
    tool,
)

LOG_ENV = "CRIOGEN_BEHAVIOUR_LOG"
RECALL_HEADER = "Facts from your long-term memory"


def _append(line: str) -> None:
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)


async def log(event: str, **fields: Any) -> None:
    """Append one record `{"event": ..., **fields}` to the behaviour log."""
    line = json.dumps({"event": event, **fields}, default=repr) + "\n"
    await asyncio.to_thread(_append, line)


# -- hooks -------------------------------------------------------------------------------


class Recorder(Hook):
    """Logs every call it gets. `on_start` saves a fresh token as its hook state, so the
    log shows which `on_start` the later calls of a segment see in `ctx.hook_state`."""

    def __init__(self, agent: str) -> None:
        self.agent = agent

    async def on_start(self, ctx: HookContext) -> HookAction:
        token = uuid.uuid4().hex
        await log(
            "on_start",
            agent=self.agent,
            token=token,
            last=ctx.messages[-1] if ctx.messages else None,
            previous=ctx.hook_state,
        )
        return HookAction(state={"token": token})

    async def before_model(self, ctx: HookContext) -> None:
        await log("before_model", agent=self.agent, hook_state=ctx.hook_state)

    async def before_tool(self, call: ToolCall) -> None:
        await log(
            "before_tool", agent=self.agent, call_id=call.call_id, tool=call.name, args=call.args
        )

    async def on_end(self, ctx: HookContext, outcome: str) -> None:
        await log("on_end", agent=self.agent, outcome=outcome, hook_state=ctx.hook_state)


# -- tools -------------------------------------------------------------------------------


@tool
async def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: What to look up.
    """
    await log("tool", tool="lookup", args={"key": key})
    return f"value of {key}"


@tool
async def transfer(to: str, amount: int) -> str:
    """Transfer money. A person approves every transfer before it runs.

    Args:
        to: Who gets the money.
        amount: How much.
    """
    await log("tool", tool="transfer", args={"to": to, "amount": amount})
    return f"sent {amount} to {to}"


@tool
async def explode(reason: str) -> str:
    """A tool that always fails.

    Args:
        reason: Why it fails.
    """
    await log("tool", tool="explode", args={"reason": reason})
    raise RuntimeError(f"exploded: {reason}")


# -- scripted models ---------------------------------------------------------------------

_LOOKUP = re.compile(r"look up (\w+)", re.IGNORECASE)
_TRANSFER = re.compile(r"send (\d+) to (\w+)", re.IGNORECASE)
_SAY = re.compile(r"^say (.+)$", re.IGNORECASE)
_REMEMBER = re.compile(r"^\s*remember(?:\s+that)?\s+(.+?)\.?\s*$", re.IGNORECASE | re.DOTALL)
_FACT = re.compile(r"^- \[[^\]]+\] (.+)$", re.MULTILINE)

ModelFn = Callable[[list[dict[str, Any]], list[dict[str, Any]]], Any]


def _last_user(messages: list[dict[str, Any]]) -> str:
    user = next((m for m in reversed(messages) if m["role"] == "user"), None)
    return str(user.get("content") or "") if user else ""


def logged(agent: str, decide: ModelFn) -> FunctionModel:
    """A `FunctionModel` that logs the messages it gets, then replies with `decide`."""

    async def fn(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        await log("model", agent=agent, messages=messages)
        return decide(messages, tools)

    return FunctionModel(fn, name=f"scripted-{agent}")


def tools_model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    """'look up X' -> lookup(X) -> 'Found: <result>'."""
    last = messages[-1]
    if last["role"] == "tool":
        return f"Found: {last['content']}"
    wanted = _LOOKUP.search(_last_user(messages))
    if wanted is None:
        return "What should I look up?"
    return FakeReply.tool_call("lookup", {"key": wanted.group(1)})


def approval_model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    """'send N to X' -> lookup(X) -> transfer(X, N) (gated) -> a sentence on its result.
    'say T' -> 'T'."""
    last = messages[-1]
    text = _last_user(messages)
    said = _SAY.match(text)
    if last["role"] == "user" and said is not None:
        return said.group(1)
    wanted = _TRANSFER.search(text)
    if wanted is None:
        return "Tell me what to send to whom."
    amount, to = int(wanted.group(1)), wanted.group(2)
    if last["role"] == "user":
        return FakeReply.tool_call("lookup", {"key": to})
    if last.get("name") == "lookup":
        return FakeReply.tool_call("transfer", {"to": to, "amount": amount})
    status = last.get("status")
    if status == "ok":
        return f"Done: {last['content']}."
    if status == "rejected":
        return f"Not sent: {last['content']}"
    return f"Transfer {status}: {last['content']}"


def failing_model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    """'explode' -> a tool that raises (the agent fails on tool exceptions);
    'break the model' -> a model error that is not retried."""
    last = messages[-1]
    text = _last_user(messages)
    if last["role"] == "tool":
        return f"Tool said: {last['content']}"
    if "break the model" in text:
        return FakeReply.error("bad_request", "the scripted model refuses")
    if "explode" in text:
        return FakeReply.tool_call("explode", {"reason": "asked to"})
    return "Nothing to do."


def redacting_model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    """Repeats what it was told, so the answer shows what the model got."""
    return f"You said: {_last_user(messages)}"


class Ticket(BaseModel):
    """The typed output of the `typed` agent."""

    title: str
    priority: int


def typed_model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    return {"title": _last_user(messages)[:40], "priority": 2}


def limited_model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    """Always asks for one more lookup."""
    return FakeReply.tool_call("lookup", {"key": f"k{len(messages)}"})


def memory_model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    """'remember that F' -> remember(F); otherwise answers from the recalled facts."""
    last = messages[-1]
    if last["role"] == "tool":
        return "Noted." if last.get("status") == "ok" else str(last["content"])
    wanted = _REMEMBER.match(str(last.get("content") or ""))
    if wanted is not None:
        return FakeReply.tool_call("remember", {"fact": f"The user says: {wanted.group(1)}."})
    recalled = [
        fact
        for m in messages
        if m["role"] == "system" and str(m.get("content", "")).startswith(RECALL_HEADER)
        for fact in _FACT.findall(m["content"])
    ]
    if not recalled:
        return "I know nothing about you."
    return "I recall: " + " ".join(recalled)


# -- the agents --------------------------------------------------------------------------


def _agent(name: str, decide: ModelFn, storage: Any, **options: Any) -> Agent[Any]:
    return Agent(
        logged(name, decide),
        instructions=f"You are the {name} test agent.",
        hooks=[Recorder(name)],
        storage=storage,
        name=name,
        **options,
    )


def build(name: str, storage: Any = None) -> Agent[Any]:
    """The test agent `name` (`storage=None`: in memory; the dev server brings its own
    checkpointer and store)."""
    if name == "tools":
        return _agent(name, tools_model, storage, tools=[lookup])
    if name == "approval":
        return _agent(
            name,
            approval_model,
            storage,
            tools=[lookup, transfer],
            approve=[Approval("transfer", description="Send money")],
        )
    if name == "failing":
        return _agent(name, failing_model, storage, tools=[explode], on_tool_exception="fail")
    if name == "redacting":
        return _agent(name, redacting_model, storage, redact=Redactor.pii())
    if name == "typed":
        return _agent(name, typed_model, storage, output=Ticket)
    if name == "limited":
        return _agent(name, limited_model, storage, tools=[lookup], limits=Limits(model_calls=2))
    if name == "memory":
        return _agent(name, memory_model, storage, memory=Memory.by_state("user_id"))
    raise KeyError(name)


NAMES = ("tools", "approval", "failing", "redacting", "typed", "limited", "memory")
AGENTS: dict[str, Agent[Any]] = {name: build(name) for name in NAMES}

# What `langgraph.json` serves: each compiled without a checkpointer.
tools_graph = AGENTS["tools"].graph
approval_graph = AGENTS["approval"].graph
failing_graph = AGENTS["failing"].graph
redacting_graph = AGENTS["redacting"].graph
typed_graph = AGENTS["typed"].graph
limited_graph = AGENTS["limited"].graph
memory_graph = AGENTS["memory"].graph
