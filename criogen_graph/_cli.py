"""The `criogen-graph` command line: `demo`, `chat` and `threads`.

Exit codes: 0 when the command did what it was asked, 1 for a runtime error (a
`CriogenError` or a problem with what the command was pointed at, printed as one line
`error: ...` on stderr; `--debug` adds the traceback), 2 for a usage error (argparse).
Heavy modules are imported when a command runs, not when the parser is built.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
import weakref
from collections.abc import Callable, Coroutine, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO, TypeVar

if TYPE_CHECKING:
    from types import FrameType

    from criogen_graph.agent import Agent
    from criogen_graph.results import ApprovalRequest, Decision, Reply
    from criogen_graph.storage import Storage
    from criogen_graph.stream import Stream, StreamEvent
    from criogen_graph.thread import Thread

__all__ = ["build_parser", "main"]

T = TypeVar("T")

DEFAULT_STORAGE = "sqlite:///criogen.db"
#: Environment variables that give `--storage` and `--model` a default.
STORAGE_ENV = "CRIOGEN_STORAGE"
MODEL_ENV = "CRIOGEN_MODEL"

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class CliError(Exception):
    """A runtime problem the command explains in one line (exit code 1)."""


# -- the parser ---------------------------------------------------------------------------

_MAIN_EPILOG = """\
examples:
  criogen-graph demo
  criogen-graph chat --model openai:gpt-5-mini --tools my_tools:tools --approve refund
  criogen-graph threads list
  criogen-graph threads pending ticket-42
  criogen-graph threads approve ticket-42 --agent support:agent

Run `criogen-graph COMMAND --help` for the options of a command.
"""

_CHAT_DESCRIPTION = """\
Chat with an agent in the terminal. The answer streams as the model writes it, tool
calls show as they run, and a call that needs approval is asked at the prompt (approve,
reject with a reason, edit its arguments as JSON). The conversation is a saved thread:
run the command again with the same --thread to continue it, from any process.
"""

_CHAT_EPILOG = f"""\
models (--model, or ${MODEL_ENV}):
  provider:model   openai:gpt-5-mini, anthropic:claude-sonnet-4-5, gemini:gemini-2.5-flash,
                   openrouter:..., azure:...; the key comes from the environment or .env
  fake             echoes what you write (no key, no network)
  FILE.json        a FakeModel script: a RecordingModel recording, or a JSON list of replies
                   such as ["Hello!", {{"text": "Looking.", "tool_calls": [{{"name": "get_order",
                   "args": {{"order_id": "A-1"}}}}]}}]

at the prompt:
  /help  /history  /pending  /retry  /quit (or Ctrl-D)
  Ctrl-C while an answer streams cancels the run; it is saved and /retry continues it.

examples:
  criogen-graph chat --model openai:gpt-5-mini
  criogen-graph chat --model anthropic:claude-sonnet-4-5 --tools shop.tools:tools \\
      --approve refund --instructions "You are a support agent." --thread ticket-42
  criogen-graph chat --model script.json --storage sqlite:///support.db --thread ticket-42
"""

_THREADS_DESCRIPTION = """\
Read and answer the threads kept in a storage. Reading (list, show, history, pending,
audit) needs only the storage; answering (approve, reject, decide, retry) continues the
run, so it needs the agent whose tools and model run next: --agent module:attr names an
importable Agent.
"""

_THREADS_EPILOG = f"""\
storage (--storage, or ${STORAGE_ENV}; default {DEFAULT_STORAGE} in the current directory):
  sqlite:///relative.db, sqlite:////abs/path.db, a plain path to a .db file, or
  postgresql://user@host/db. With --agent and no --storage, the agent's own storage.

examples:
  criogen-graph threads list
  criogen-graph threads --storage sqlite:///support.db show ticket-42
  criogen-graph threads pending ticket-42 --json
  criogen-graph threads approve ticket-42 --agent support:agent --actor ada
  criogen-graph threads reject ticket-42 --reason "not eligible" --agent support:agent
  criogen-graph threads decide ticket-42 --agent support:agent \\
      --json '{{"call_abc": {{"type": "edit", "args": {{"order_id": "A-2"}}}}}}'
  criogen-graph threads audit ticket-42 --json
"""


def _formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32)


def _module_attr(value: str) -> str:
    module, sep, attr = value.rpartition(":")
    if not sep or not module or not attr:
        raise argparse.ArgumentTypeError(
            f"expected module:attribute (e.g. my_tools:tools or app/agents.py:agent), got {value!r}"
        )
    return value


def _expected(value: str) -> int | str:
    """`--expect`: a version (digits) or a checkpoint id."""
    value = value.strip()
    if not value:
        raise argparse.ArgumentTypeError("expected a version (e.g. 7) or a checkpoint id")
    return int(value) if value.isdigit() else value


def _expect_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--expect",
        type=_expected,
        metavar="VERSION",
        help="answer only if the thread still waits at this version (or checkpoint id), "
        "the one `threads pending` showed; else fail and change nothing. Without it, the "
        "answer applies to the calls this command reads and prints",
    )


def _json_value(value: str) -> Any:
    try:
        data = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f"invalid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); expected "
            '{"call_id": {"type": "approve"}, ...}'
        ) from None
    if not isinstance(data, dict | str):
        raise argparse.ArgumentTypeError(
            'expected a JSON object {"call_id": decision, ...} (or "approve" / "reject"), '
            f"got {type(data).__name__}"
        )
    return data


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return n


def _model_choice(value: str) -> Any:
    """`--model`: "fake", a FakeModel script file, or "provider:model" (checked here;
    its key is checked when the agent is built)."""
    value = value.strip()
    if value == "fake":
        return value
    path = Path(value)
    if path.is_file():
        try:
            return _script_model(path)
        except (ValueError, TypeError) as exc:
            raise argparse.ArgumentTypeError(f"bad FakeModel script {value}: {exc}") from None
    if value.endswith(".json") or (":" not in value and ("/" in value or os.sep in value)):
        raise argparse.ArgumentTypeError(f"no FakeModel script file at {value}")
    if ":" not in value:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a model: use provider:model (e.g. openai:gpt-5-mini), 'fake', "
            "or the path of a FakeModel script (.json)"
        )
    from criogen_graph.adapters.models import parse_model_string

    try:
        parse_model_string(value)
    except TypeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def build_parser() -> argparse.ArgumentParser:
    """The `criogen-graph` argument parser."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show the traceback of an error",
    )
    parser = argparse.ArgumentParser(
        prog="criogen-graph",
        description="Durable agents on LangGraph: a demo, a terminal chat on saved threads,\n"
        "and commands to read and answer threads (exit codes: 0 ok, 1 error, 2 usage).",
        epilog=_MAIN_EPILOG,
        formatter_class=_formatter,
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        parents=[common],
        help="run the demo: a support agent on SQLite that stops for approval, answered "
        "after a restart",
        description="A support agent on SQLite with tools and an approval gate: the first "
        "process stops for approval, a second one answers it from the file. It uses a "
        "provider when a key is set (or CRIOGEN_DEMO_MODEL=provider:model), else a "
        "scripted model.",
        epilog="example:\n  criogen-graph demo --db /tmp/demo.db",
        formatter_class=_formatter,
    )
    demo.add_argument(
        "--db", type=Path, default=Path("criogen-demo.db"), help="the SQLite file to use"
    )
    demo.add_argument("--resume", metavar="THREAD", help=argparse.SUPPRESS)
    demo.set_defaults(handler=_cmd_demo, command_parser=demo)

    chat = sub.add_parser(
        "chat",
        parents=[common],
        help="chat with an agent in the terminal (streamed, with approvals at the prompt)",
        description=_CHAT_DESCRIPTION,
        epilog=_CHAT_EPILOG,
        formatter_class=_formatter,
    )
    chat.add_argument(
        "--model",
        type=_model_choice,
        metavar="MODEL",
        help=f"provider:model, 'fake', or a FakeModel script file (default: ${MODEL_ENV})",
    )
    chat.add_argument(
        "--storage",
        metavar="URL",
        help=f"where the thread is kept (default: ${STORAGE_ENV} or {DEFAULT_STORAGE})",
    )
    chat.add_argument(
        "--thread",
        metavar="ID",
        help="the thread to continue or start (default: a new id, printed at the start)",
    )
    chat.add_argument("--instructions", metavar="TEXT", help="the agent's instructions")
    chat.add_argument(
        "--tools",
        type=_module_attr,
        action="append",
        default=[],
        metavar="MODULE:ATTR",
        help="tools to offer: a list of tools, one tool, or an Agent (its tools and approval "
        "rules), imported from your module (repeatable; the current directory is importable)",
    )
    chat.add_argument(
        "--approve",
        nargs="+",
        action="extend",
        default=[],
        metavar="TOOL",
        help="tools whose calls wait for your approval at the prompt",
    )
    chat.add_argument(
        "--actor", metavar="NAME", help="who you are, for the audit trail (default: your login)"
    )
    chat.set_defaults(handler=_cmd_chat, command_parser=chat)

    threads = sub.add_parser(
        "threads",
        parents=[common],
        help="list, read and answer saved threads",
        description=_THREADS_DESCRIPTION,
        epilog=_THREADS_EPILOG,
        formatter_class=_formatter,
    )
    threads.add_argument(
        "--storage",
        metavar="URL",
        help=f"the storage (default: ${STORAGE_ENV} or {DEFAULT_STORAGE})",
    )
    tsub = threads.add_subparsers(dest="action", metavar="ACTION")
    threads.set_defaults(handler=_cmd_threads, threads_parser=threads)

    # Options every `threads` action accepts (also after the action's name).
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument(
        "--storage",
        metavar="URL",
        default=argparse.SUPPRESS,
        help=f"the storage (default: ${STORAGE_ENV} or {DEFAULT_STORAGE})",
    )
    shared.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks"
    )
    reading = argparse.ArgumentParser(add_help=False, parents=[shared])
    reading.add_argument(
        "--agent",
        type=_module_attr,
        metavar="MODULE:ATTR",
        help="read through this Agent (e.g. for its storage or its encryption key)",
    )
    answering = argparse.ArgumentParser(add_help=False, parents=[shared])
    answering.add_argument(
        "--agent",
        type=_module_attr,
        metavar="MODULE:ATTR",
        help="the Agent whose model and tools continue the run (required)",
    )
    answering.add_argument(
        "--actor", metavar="NAME", help="who answers, for the audit trail (default: your login)"
    )

    def action(name: str, help: str, parents: Sequence[argparse.ArgumentParser], ex: str) -> Any:
        p = tsub.add_parser(
            name,
            parents=list(parents),
            help=help,
            description=help[0].upper() + help[1:] + ".",
            epilog="example:\n  " + ex,
            formatter_class=_formatter,
        )
        p.set_defaults(action_parser=p)
        return p

    json_help = "print JSON (for scripts)"
    p = action("list", "the thread ids, with their status", [reading], "criogen-graph threads list")
    p.add_argument("--json", action="store_true", help=json_help)
    p = action(
        "show", "a thread's messages", [reading], "criogen-graph threads show ticket-42 --json"
    )
    p.add_argument("thread_id", metavar="ID", help="the thread id")
    p.add_argument("--json", action="store_true", help=json_help)
    p = action(
        "history",
        "a thread's checkpoints (versions), newest first",
        [reading],
        "criogen-graph threads history ticket-42 --limit 5",
    )
    p.add_argument("thread_id", metavar="ID", help="the thread id")
    p.add_argument("--limit", type=_positive_int, default=20, help="how many (default 20)")
    p.add_argument("--json", action="store_true", help=json_help)
    p = action(
        "pending",
        "the calls of a thread waiting for approval (call ids, tools, args)",
        [reading],
        "criogen-graph threads pending ticket-42",
    )
    p.add_argument("thread_id", metavar="ID", help="the thread id")
    p.add_argument("--json", action="store_true", help=json_help)
    p = action(
        "approve",
        "approve the pending calls of a thread and continue its run",
        [answering],
        "criogen-graph threads approve ticket-42 --agent support:agent --call call_abc",
    )
    p.add_argument("thread_id", metavar="ID", help="the thread id")
    p.add_argument(
        "--call",
        nargs="+",
        action="extend",
        default=[],
        metavar="CALL_ID",
        help="approve only these calls (every other pending call then needs --reject-others)",
    )
    p.add_argument(
        "--reject-others",
        action="store_true",
        help="with --call: reject the pending calls not listed",
    )
    p.add_argument(
        "--reason",
        default="rejected",
        metavar="TEXT",
        help="with --reject-others: what the model is told",
    )
    _expect_option(p)
    p = action(
        "reject",
        "reject every pending call of a thread and continue its run",
        [answering],
        'criogen-graph threads reject ticket-42 --reason "not eligible" --agent support:agent',
    )
    p.add_argument("thread_id", metavar="ID", help="the thread id")
    p.add_argument("--reason", default="rejected", metavar="TEXT", help="what the model is told")
    _expect_option(p)
    p = action(
        "decide",
        "answer each pending call (approve, reject, edit, respond) and continue the run",
        [answering],
        "criogen-graph threads decide ticket-42 --agent support:agent --json "
        '\'{"call_abc": {"type": "edit", "args": {"order_id": "A-2"}}, '
        '"call_def": {"type": "reject", "message": "no"}}\'',
    )
    p.add_argument("thread_id", metavar="ID", help="the thread id")
    p.add_argument(
        "--json",
        dest="decisions",
        required=True,
        type=_json_value,
        metavar="JSON",
        help='{call_id: decision}; a decision is "approve", "reject", or {"type": "approve"}, '
        '{"type": "reject", "message": ...}, {"type": "edit", "args": {...}, "name"?: ...}, '
        '{"type": "respond", "message": ...}',
    )
    _expect_option(p)
    p = action(
        "retry",
        "continue a thread's run that failed or was cancelled",
        [answering],
        "criogen-graph threads retry ticket-42 --agent support:agent",
    )
    p.add_argument("thread_id", metavar="ID", help="the thread id")
    p = action(
        "audit",
        "audit records (who did what, when), oldest first",
        [reading],
        "criogen-graph threads audit ticket-42 --limit 50",
    )
    p.add_argument("thread_id", metavar="ID", nargs="?", help="one thread (default: all)")
    p.add_argument("--limit", type=_positive_int, help="only the newest N records")
    p.add_argument("--json", action="store_true", help=json_help)
    _add_background_parsers(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_USAGE
    debug = bool(getattr(args, "debug", False))
    from criogen_graph.errors import CriogenError

    try:
        return handler(args)
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (CliError, CriogenError) as exc:
        if debug:
            import traceback

            traceback.print_exc()
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:
        if debug:
            raise
        print(
            f"error: {type(exc).__name__}: {exc} (run with --debug for the traceback)",
            file=sys.stderr,
        )
        return EXIT_ERROR


# -- shared helpers -----------------------------------------------------------------------


def _usage(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    parser.error(message)


def _safe_url(url: str) -> str:
    from criogen_graph.storage import _safe

    return _safe(url)


def _default_actor() -> str | None:
    import getpass

    try:
        return getpass.getuser()
    except Exception:
        return None


def _storage_url(value: str | None) -> str:
    url = value or os.environ.get(STORAGE_ENV) or DEFAULT_STORAGE
    if "://" not in url:
        url = f"sqlite:///{url}"  # a plain path to a SQLite file
    return url


def _import_object(spec: str, option: str) -> Any:
    """`module:attr` (or `path/to/file.py:attr`), with the current directory importable."""
    import importlib
    import importlib.util

    module_name, _, attr = spec.rpartition(":")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise CliError(f"{option} {spec}: no file {module_name}")
            name = "_criogen_cli_" + path.stem
            loader_spec = importlib.util.spec_from_file_location(name, path)
            if loader_spec is None or loader_spec.loader is None:
                raise CliError(f"{option} {spec}: cannot load {module_name}")
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module
            loader_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except CliError:
        raise
    except ModuleNotFoundError as exc:
        raise CliError(
            f"{option} {spec}: cannot import {module_name!r} ({exc}); run from the directory "
            "that holds it or put it on PYTHONPATH"
        ) from exc
    except Exception as exc:
        raise CliError(
            f"{option} {spec}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    value: Any = module
    for part in attr.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise CliError(f"{option} {spec}: {module_name!r} has no attribute {attr!r}") from None
    return value


def _load_agent(spec: str) -> Agent[Any]:
    from criogen_graph.agent import Agent

    value = _import_object(spec, "--agent")
    if not isinstance(value, Agent):
        raise CliError(f"--agent {spec}: expected an Agent, got {type(value).__name__}")
    return value


def _on_storage(agent: Agent[Any], storage: Storage) -> Agent[Any]:
    """The agent, keeping its threads in `storage` (a shallow copy when it differs)."""
    import copy

    if agent.storage is storage:
        return agent
    clone = copy.copy(agent)
    clone._storage = storage
    clone._thread_graphs = weakref.WeakKeyDictionary()
    clone._memory_graph_cache = None
    return clone


def _bare_agent(storage: Storage) -> Agent[Any]:
    """An agent that only reads threads (its model is never called)."""
    from criogen_graph.adapters.models.fake import FunctionModel
    from criogen_graph.agent import Agent

    def never(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        raise CliError("this command reads threads; it runs no model")

    return Agent(FunctionModel(never, name="reader"), storage=storage, name="criogen-graph")


def _script_model(path: Path) -> Any:
    """A `FakeModel` from a script file: a `RecordingModel` recording, or a JSON list of
    replies (a string is a final answer; an object has `text`, `tool_calls` (`[{"name",
    "args", "id"?}]`), `chunks`, `delay` (seconds) or `error` (a `ModelError` kind))."""
    from criogen_graph.adapters.models.fake import FakeModel, FakeReply

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON ({exc.msg} at line {exc.lineno})") from None
    except OSError as exc:
        raise ValueError(str(exc)) from None
    if isinstance(data, dict):
        return FakeModel.from_file(path)
    if not isinstance(data, list):
        raise ValueError("expected a JSON list of replies or a RecordingModel recording")
    replies: list[Any] = []
    for i, entry in enumerate(data):
        if isinstance(entry, str):
            replies.append(entry)
            continue
        if not isinstance(entry, dict):
            raise ValueError(f"reply {i} must be a string or an object")
        if "error" in entry:
            replies.append(FakeReply.error(str(entry["error"]), entry.get("message")))
            continue
        unknown = set(entry) - {"text", "content", "tool_calls", "chunks", "delay", "usage"}
        if unknown:
            raise ValueError(f"reply {i} has unknown keys {sorted(unknown)}")
        replies.append(
            FakeReply(
                entry.get("text", entry.get("content")),
                entry.get("tool_calls") or (),
                chunks=entry.get("chunks"),
                delay=float(entry.get("delay") or 0),
                usage=entry.get("usage"),
            )
        )
    return FakeModel(replies, name=path.stem)


def _echo_model() -> Any:
    from criogen_graph.adapters.models.fake import FunctionModel

    def echo(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        said = next((m.get("content") for m in reversed(messages) if m.get("role") == "user"), "")
        return f"You said: {said}"

    return FunctionModel(echo, name="echo")


def _tools_from(spec: str) -> tuple[list[Any], list[Any]]:
    """The tools (and approval rules, for an Agent) of `--tools module:attr`."""
    from criogen_graph.agent import Agent
    from criogen_graph.tools import Tool, ToolSource

    value = _import_object(spec, "--tools")
    if isinstance(value, Agent):
        agent_spec = value._spec
        own_memory: set[str] = set()
        if agent_spec.memory is not None:
            own_memory = {t.name for t in agent_spec.memory.make_tools()}
        tools: list[Any] = [t for n, t in agent_spec.tools.items() if n not in own_memory]
        return [*tools, *agent_spec.sources], list(agent_spec.approvals.values())
    if isinstance(value, Tool | ToolSource):
        return [value], []
    if isinstance(value, list | tuple | set | frozenset):
        bad = [v for v in value if not isinstance(v, Tool | ToolSource)]
        if bad:
            raise CliError(
                f"--tools {spec}: {bad[0]!r} is not a tool (decorate functions with @tool)"
            )
        return list(value), []
    raise CliError(
        f"--tools {spec}: expected a list of tools, a tool or an Agent, got {type(value).__name__}"
    )


def _fmt_ms(ms: int | None) -> str:
    if not ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def _one_line(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _args(args: Any) -> str:
    return json.dumps(args, ensure_ascii=False, default=str)


def _print_json(data: Any, out: TextIO) -> None:
    out.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")


def _message_lines(m: Mapping[str, Any]) -> list[str]:
    """A stored message, readable."""
    role = m.get("role")
    content = m.get("content")
    lines: list[str] = []
    if role == "tool":
        status = m.get("status") or "ok"
        lines.append(f"tool {m.get('name')} [{status}]: {_one_line(content, 500)}")
        return lines
    if content:
        text = content if isinstance(content, str) else _one_line(content, 2000)
        lines.append(f"{role}: {text}")
    for c in m.get("tool_calls") or ():
        lines.append(f"  calls {c.get('name')}({_args(c.get('args'))})  [{c.get('id')}]")
    if not lines:
        lines.append(f"{role}: ")
    return lines


def _request_lines(r: ApprovalRequest) -> list[str]:
    lines = [f"{r.call_id}  {r.tool}({_args(r.args)})"]
    if r.description:
        lines.append(f"    {r.description}")
    if r.allowed is not None:
        lines.append(f"    allowed: {', '.join(r.allowed)}")
    return lines


class _Printer:
    """Prints stream events as they arrive: the answer as it is written, tool calls and
    their results."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self._text_id: str | None = None
        self._streamed: set[str] = set()
        self._open = False

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def line(self, text: str = "") -> None:
        self.end_line()
        self.write(text + "\n")

    def end_line(self) -> None:
        if self._open:
            self.write("\n")
            self._open = False
            self._text_id = None

    def show(self, event: StreamEvent) -> None:
        from criogen_graph.stream import MessageEvent, TextEvent, ToolCallStartedEvent

        if isinstance(event, TextEvent):
            if event.message_id != self._text_id:
                self.end_line()
                self.write("assistant> ")
                self._text_id = event.message_id
                self._streamed.add(event.message_id)
            self.write(event.text)
            self._open = True
        elif isinstance(event, ToolCallStartedEvent):
            self.line(f"  > {event.tool}({_args(event.args)})")
        elif isinstance(event, MessageEvent):
            m = event.message
            if m.get("role") == "assistant":
                if m.get("content") and m.get("id") not in self._streamed:
                    self.line(f"assistant> {m['content']}")
            elif m.get("role") == "tool":
                status = m.get("status") or "ok"
                self.line(f"  < {m.get('name')} [{status}] {_one_line(m.get('content'))}")

    async def consume(self, stream: Stream[Any]) -> Reply[Any]:
        try:
            async for event in stream:
                self.show(event)
            return await stream.reply()
        finally:
            self.end_line()


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


# -- demo ------------------------------------------------------------------------------


def _cmd_demo(args: argparse.Namespace) -> int:
    from criogen_graph._demo import resume_demo, run_demo

    if args.resume:
        return _run(resume_demo(args.db, args.resume))
    return _run(run_demo(args.db))


# -- chat ------------------------------------------------------------------------------

_CHAT_HELP = """\
  /help      this help
  /history   the conversation so far
  /pending   answer the calls waiting for approval
  /retry     continue the last run if it failed or was cancelled
  /quit      leave (also Ctrl-D); the thread stays saved
  Ctrl-C while an answer streams cancels the run (saved; /retry continues it)."""


class _Loop:
    """One event loop for the whole chat (connections belong to it), run a coroutine at
    a time from the synchronous prompt loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.task: asyncio.Task[Any] | None = None

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        task: asyncio.Task[T] = self.loop.create_task(coro)
        self.task = task
        try:
            return self.loop.run_until_complete(task)
        finally:
            self.task = None

    def close(self) -> None:
        loop = self.loop
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()


class _Chat:
    def __init__(
        self,
        agent: Agent[Any],
        thread: Thread[Any],
        loop: _Loop,
        out: TextIO,
        err: TextIO,
    ) -> None:
        self.agent = agent
        self.thread = thread
        self.loop = loop
        self.printer = _Printer(out)
        self.err = err
        self.active: Stream[Any] | None = None
        self.tty = sys.stdin.isatty()

    # -- Ctrl-C ----------------------------------------------------------------------

    def on_sigint(self, signum: int, frame: FrameType | None) -> None:
        stream = self.active
        if stream is not None:
            self.loop.loop.call_soon_threadsafe(stream.cancel)
            return
        task = self.loop.task
        if task is not None and not task.done():
            self.loop.loop.call_soon_threadsafe(task.cancel)
            return
        raise KeyboardInterrupt

    # -- I/O -----------------------------------------------------------------------------

    def say(self, text: str = "") -> None:
        self.printer.line(text)

    def error(self, text: str) -> None:
        self.printer.end_line()
        self.err.write(f"error: {text}\n")
        self.err.flush()

    def ask(self, prompt: str) -> str:
        """A line from the user; raises `EOFError` (end of input) and `KeyboardInterrupt`."""
        self.printer.end_line()
        line = input(prompt)
        if not self.tty:
            self.printer.write(line + "\n")  # a transcript that reads like a terminal's
        return line

    # -- running -------------------------------------------------------------------------

    async def _consume(self, make: Callable[[], Stream[Any]]) -> Reply[Any] | None:
        from criogen_graph.errors import CancelledError

        stream = make()
        self.active = stream
        try:
            return await self.printer.consume(stream)
        except CancelledError:
            return None
        finally:
            self.active = None

    def stream(
        self, make: Callable[[], Stream[Any]], *, deciding: bool = False
    ) -> Reply[Any] | None:
        """Run a streamed call; its reply, or None when it failed or was cancelled (said)."""
        from criogen_graph.errors import (
            CriogenError,
            LimitExceededError,
            ModelError,
            ToolExecutionError,
            ValidationError,
        )

        try:
            reply = self.loop.run(self._consume(make))
        except asyncio.CancelledError:
            reply = None
        except ValidationError as exc:
            if deciding and exc.code != "not_suspended":
                raise
            self.error(str(exc))
            return None
        except CriogenError as exc:
            self.error(str(exc))
            if isinstance(exc, ModelError | ToolExecutionError | LimitExceededError):
                self.say("(the run is saved: /retry continues it)")
            return None
        if reply is None:
            self.say("(cancelled: the run is saved; /retry continues it)")
        return reply

    def turn(self, make: Callable[[], Stream[Any]]) -> None:
        """A streamed call, then the approvals it stops for, until the run ends."""
        reply = self.stream(make)
        while reply is not None and reply.needs_approval:
            reply = self.decide(reply.approvals)

    def decide(self, requests: Sequence[ApprovalRequest]) -> Reply[Any] | None:
        """Ask for a decision on each request and continue the run (asked again when the
        answer does not fit)."""
        from criogen_graph.errors import ValidationError

        while True:
            decisions = self.ask_decisions(requests)
            answer = partial(self.thread.stream_decide, decisions, expected=requests)
            try:
                return self.stream(answer, deciding=True)
            except ValidationError as exc:
                self.error(str(exc))
                if exc.code == "stale":
                    # Someone else answered, or the run moved on: ask about what waits now.
                    requests = self.loop.run(self.thread.pending_approvals())
                    if not requests:
                        self.say("(nothing waits for approval now)")
                        return None
                self.say("answer again:")

    def ask_decisions(self, requests: Sequence[ApprovalRequest]) -> dict[str, Decision]:
        n = len(requests)
        self.say(f"approval needed ({n} call{'s' if n != 1 else ''}):")
        return {r.call_id: self.ask_one(r) for r in requests}

    def ask_one(self, r: ApprovalRequest) -> Decision:
        from criogen_graph.results import Decision

        self.say(f"  {r.tool}({_args(r.args)})  [{r.call_id}]")
        if r.description:
            self.say(f"    {r.description}")
        allowed = r.allowed or ["approve", "reject", "edit", "respond"]
        labels = {
            "approve": "[a]pprove",
            "reject": "[r]eject",
            "edit": "[e]dit args",
            "respond": "[s]kip with an answer",
        }
        keys = {"approve": "a", "reject": "r", "edit": "e", "respond": "s"}
        prompt = "  " + " / ".join(labels[a] for a in allowed if a in labels) + "? "
        while True:
            answer = self.ask(prompt).strip().lower()
            choice = next(
                (a for a in allowed if answer in (a, keys.get(a))),
                "approve" if answer in ("y", "yes") and "approve" in allowed else None,
            )
            if choice is None and answer in ("n", "no") and "reject" in allowed:
                choice = "reject"
            if choice == "approve":
                return Decision.approve()
            if choice == "reject":
                reason = self.ask("  reason (the model is told; empty for none)> ").strip()
                return Decision.reject(reason or None)
            if choice == "edit":
                raw = self.ask("  new args as JSON> ").strip()
                try:
                    args = json.loads(raw)
                except json.JSONDecodeError as exc:
                    self.error(f"invalid JSON: {exc.msg}")
                    continue
                if not isinstance(args, dict):
                    self.error("the args must be a JSON object")
                    continue
                return Decision.edit(args)
            if choice == "respond":
                message = self.ask("  answer for the model (the tool is skipped)> ").strip()
                if message:
                    return Decision.respond(message)
                self.error("the answer must not be empty")
                continue
            options = ", ".join(keys[a] for a in allowed if a in keys)
            self.say(f"  please answer {options}")

    def answer_pending(self) -> None:
        pending = self.loop.run(self.thread.pending_approvals())
        if not pending:
            self.say("(nothing waits for approval)")
            return
        reply = self.decide(pending)
        while reply is not None and reply.needs_approval:
            reply = self.decide(reply.approvals)

    def show_history(self) -> None:
        messages = self.loop.run(self.thread.messages())
        if not messages:
            self.say("(no messages yet)")
        for m in messages:
            for line in _message_lines(m):
                self.say(line)

    # -- the session -----------------------------------------------------------------------

    async def _status(self) -> tuple[bool, list[dict[str, Any]], list[ApprovalRequest], str]:
        from criogen_graph.thread import _entry

        storage = self.agent.storage
        await storage.open()
        tup = await storage.checkpointer.aget_tuple(
            {"configurable": {"thread_id": self.thread.id, "checkpoint_ns": ""}}
        )
        if tup is None:
            return False, [], [], "new"
        messages = await self.thread.messages()
        pending = await self.thread.pending_approvals()
        return True, messages, pending, str(_entry(tup)["status"])

    def session(self, storage_url: str, model: str) -> int:
        exists, messages, pending, status = self.loop.run(self._status())
        tid = self.thread.id
        state = f"{len(messages)} messages" if exists else "new"
        self.say(f"criogen-graph chat: thread {tid} ({state}) on {storage_url}, model {model}")
        self.say(f"Continue it later with --thread {tid}. /help lists the commands, /quit leaves.")
        if exists:
            last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
            if last is not None and last.get("content"):
                self.say(f"last answer: {_one_line(last['content'], 300)}")
            if status in ("failed", "cancelled", "pending") and not pending:
                self.say(f"(the last run did not finish ({status}): /retry continues it)")
        try:
            if pending:
                self.say("this thread waits for approval:")
                try:
                    reply = self.decide(pending)
                    while reply is not None and reply.needs_approval:
                        reply = self.decide(reply.approvals)
                except (KeyboardInterrupt, asyncio.CancelledError):
                    self.interrupted()
            self.loop_prompt()
        except EOFError:
            self.leave_note()
        return EXIT_OK

    def interrupted(self) -> None:
        self.say()
        self.say("(interrupted)")
        try:
            waiting = bool(self.loop.run(self.thread.pending_approvals()))
        except BaseException:
            waiting = False
        if waiting:
            self.say("(the thread waits for approval: /pending asks again)")

    def leave_note(self, *, newline: bool = True) -> None:
        self.printer.end_line()
        if newline:
            self.say()  # end the prompt's line
        pending: list[ApprovalRequest]
        try:
            pending = self.loop.run(self.thread.pending_approvals())
        except Exception:
            pending = []
        if pending:
            self.say(
                f"(the thread still waits for approval: continue with --thread {self.thread.id} "
                "or answer it with `criogen-graph threads`)"
            )

    def loop_prompt(self) -> None:
        while True:
            try:
                line = self.ask("you> ").strip()
            except KeyboardInterrupt:
                self.say()
                self.say("(/quit or Ctrl-D leaves)")
                continue
            if not line:
                continue
            try:
                if line.startswith("/"):
                    if not self.command(line):
                        return
                    continue
                if self.loop.run(self.thread.pending_approvals()):
                    self.say("(the thread waits for approval first)")
                    self.answer_pending()
                    if self.loop.run(self.thread.pending_approvals()):
                        continue
                self.turn(partial(self.thread.stream, line))
            except (KeyboardInterrupt, asyncio.CancelledError):
                self.interrupted()

    def command(self, line: str) -> bool:
        """Run a /command; False to leave."""
        from criogen_graph.errors import CriogenError

        name = line.split()[0].lower()
        try:
            if name in ("/quit", "/exit", "/q"):
                self.leave_note(newline=False)
                return False
            if name in ("/help", "/?"):
                self.say(_CHAT_HELP)
            elif name == "/history":
                self.show_history()
            elif name == "/pending":
                self.answer_pending()
            elif name == "/retry":
                self.turn(self.thread.stream_retry)
            else:
                self.say(f"unknown command {name}; /help lists them")
        except asyncio.CancelledError:
            self.say("(interrupted)")
        except CriogenError as exc:
            self.error(str(exc))
        return True


def _cmd_chat(args: argparse.Namespace) -> int:
    import signal
    import threading

    from criogen_graph.agent import Agent
    from criogen_graph.env import load_env
    from criogen_graph.storage import Storage

    load_env()
    model: Any = args.model
    if model is None:
        env = os.environ.get(MODEL_ENV)
        if not env:
            _usage(
                args.command_parser,
                f"chat needs --model (provider:model, 'fake' or a script file) or ${MODEL_ENV}",
            )
        try:
            model = _model_choice(env)
        except argparse.ArgumentTypeError as exc:
            raise CliError(f"${MODEL_ENV}: {exc}") from None
    if model == "fake":
        model = _echo_model()
    elif isinstance(model, str):
        from criogen_graph.adapters.models import PROVIDER_KEYS, parse_model_string

        missing = [v for v in PROVIDER_KEYS[parse_model_string(model)[0]] if not os.environ.get(v)]
        if missing:
            raise CliError(
                f"--model {model} needs {' and '.join(missing)}: set it in the environment or "
                "in a .env file in the current directory"
            )
    tools: list[Any] = []
    rules: dict[str, Any] = {}
    for spec in args.tools:
        found, approvals = _tools_from(spec)
        tools.extend(found)
        for rule in approvals:
            rules.setdefault(rule.tool, rule)
    for name in args.approve:
        rules.setdefault(name, name)
    url = _storage_url(args.storage)
    storage = Storage(url)
    try:
        agent: Agent[Any] = Agent(
            model,
            instructions=args.instructions,
            tools=tools,
            approve=list(rules.values()),
            storage=storage,
            name="chat",
        )
    except (TypeError, ValueError) as exc:
        raise CliError(str(exc)) from exc
    thread_id = args.thread or f"chat-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    actor = args.actor or _default_actor()
    loop = _Loop()
    chat = _Chat(agent, agent.thread(thread_id, actor=actor), loop, sys.stdout, sys.stderr)
    if sys.stdin.isatty():
        try:
            import readline  # noqa: F401  (line editing for input())
        except ImportError:
            pass
    own_handler = (
        signal.getsignal(signal.SIGINT) is signal.default_int_handler
        and threading.current_thread() is threading.main_thread()
    )
    if own_handler:
        signal.signal(signal.SIGINT, chat.on_sigint)
    m = agent.model
    shown = "fake (echoes you)" if args.model == "fake" else f"{m.provider}:{m.name}"
    try:
        return chat.session(_safe_url(url), shown)
    finally:
        if own_handler:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            loop.run(_close(agent, storage))
        finally:
            loop.close()


async def _close(agent: Agent[Any] | None, storage: Storage) -> None:
    try:
        if agent is not None:
            await agent.aclose()
    finally:
        await storage.close()


# -- threads ---------------------------------------------------------------------------

_ANSWERING = ("approve", "reject", "decide", "retry")


def _cmd_threads(args: argparse.Namespace) -> int:
    action: str | None = args.action
    if action is None:
        args.threads_parser.print_help()
        return EXIT_USAGE
    if action in _ANSWERING and not args.agent:
        _usage(
            args.action_parser,
            f"`threads {action}` continues the run, so it needs the agent whose model and "
            "tools run next: add --agent module:attr (an importable Agent)",
        )
    agent: Agent[Any] | None = _load_agent(args.agent) if args.agent else None
    storage = _threads_storage(args.storage, agent)
    reader = _on_storage(agent, storage) if agent is not None else _bare_agent(storage)
    return _run(_threads(args, action, reader, agent, storage))


def _threads_storage(option: str | None, agent: Agent[Any] | None) -> Storage:
    """`--storage`; with `--agent` and no `--storage`, the agent's own (unless in memory)."""
    from criogen_graph.storage import Storage

    if option is None and agent is not None and agent.storage.scheme != "memory":
        return agent.storage
    url = _storage_url(option)
    if agent is not None and agent.storage.url == url:
        return agent.storage
    storage = Storage(url)
    if storage.scheme == "sqlite":
        from criogen_graph.adapters.storage.sqlite import parse_sqlite_url

        path = parse_sqlite_url(storage.url)
        if path != ":memory:" and not Path(path).exists():
            raise CliError(f"no database at {path}; pass --storage URL (see --help)")
    return storage


async def _threads(
    args: argparse.Namespace,
    action: str,
    reader: Agent[Any],
    agent: Agent[Any] | None,
    storage: Storage,
) -> int:
    try:
        return await _THREAD_ACTIONS[action](args, reader, storage, sys.stdout)
    finally:
        await _close(agent, storage)


async def _require_thread(storage: Storage, thread_id: str) -> Any:
    await storage.open()
    tup = await storage.checkpointer.aget_tuple(
        {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    )
    if tup is None:
        raise CliError(
            f"no thread {thread_id!r} in {_safe_url(storage.url)} (`criogen-graph threads list` "
            "shows them)"
        )
    return tup


async def _list(args: argparse.Namespace, agent: Agent[Any], storage: Storage, out: TextIO) -> int:
    from criogen_graph.thread import _entry

    rows: list[dict[str, Any]] = []
    for tid in await storage.threads():
        tup = await storage.checkpointer.aget_tuple(
            {"configurable": {"thread_id": tid, "checkpoint_ns": ""}}
        )
        if tup is None:
            continue
        entry = _entry(tup)
        rows.append(
            {
                "id": tid,
                "status": entry["status"],
                "waiting_for_approval": entry["status"] == "suspended",
                "version": entry["version"],
                "updated_at_ms": entry["created_at_ms"],
            }
        )
    if args.json:
        _print_json(rows, out)
        return EXIT_OK
    if not rows:
        out.write(f"no threads in {_safe_url(storage.url)}\n")
        return EXIT_OK
    labels = {
        "suspended": "waits for approval",
        "pending": "unfinished",
        "completed": "done",
    }
    width = max(6, *(len(r["id"]) for r in rows))
    out.write(f"{'THREAD':<{width}}  {'STATUS':<18}  {'VERSION':>7}  UPDATED\n")
    for r in rows:
        status = labels.get(r["status"], r["status"])
        out.write(
            f"{r['id']:<{width}}  {status:<18}  {r['version']:>7}  {_fmt_ms(r['updated_at_ms'])}\n"
        )
    return EXIT_OK


async def _show(args: argparse.Namespace, agent: Agent[Any], storage: Storage, out: TextIO) -> int:
    await _require_thread(storage, args.thread_id)
    thread = agent.thread(args.thread_id)
    messages = await thread.messages()
    pending = await thread.pending_approvals()
    if args.json:
        _print_json(
            {
                "thread_id": args.thread_id,
                "messages": messages,
                "pending_approvals": [r.to_dict() for r in pending],
                "version": pending.version,
                "checkpoint_id": pending.checkpoint_id,
            },
            out,
        )
        return EXIT_OK
    for m in messages:
        for line in _message_lines(m):
            out.write(line + "\n")
    if pending:
        out.write(
            f"-- waits for approval of {len(pending)} call(s) at version {pending.version}:\n"
        )
        for r in pending:
            for line in _request_lines(r):
                out.write("  " + line + "\n")
    return EXIT_OK


async def _history(
    args: argparse.Namespace, agent: Agent[Any], storage: Storage, out: TextIO
) -> int:
    await _require_thread(storage, args.thread_id)
    entries = await agent.thread(args.thread_id).history(limit=args.limit)
    if args.json:
        _print_json(entries, out)
        return EXIT_OK
    out.write(f"{'VERSION':>7}  {'STATUS':<10}  {'SOURCE':<6}  {'STEP':>4}  {'CREATED':<19}  ")
    out.write("CHECKPOINT\n")
    for e in entries:
        out.write(
            f"{e['version']:>7}  {e['status']:<10}  {e['source'] or '-':<6}  "
            f"{e['step'] if e['step'] is not None else '-':>4}  {_fmt_ms(e['created_at_ms']):<19}  "
            f"{e['id']}\n"
        )
    return EXIT_OK


async def _pending(
    args: argparse.Namespace, agent: Agent[Any], storage: Storage, out: TextIO
) -> int:
    await _require_thread(storage, args.thread_id)
    pending = await agent.thread(args.thread_id).pending_approvals()
    if args.json:
        _print_json([r.to_dict() for r in pending], out)
        return EXIT_OK
    if not pending:
        out.write(f"thread {args.thread_id} waits for no approval\n")
        return EXIT_OK
    for r in pending:
        for line in _request_lines(r):
            out.write(line + "\n")
    out.write(
        f"-- version {pending.version}: `threads approve|reject|decide {args.thread_id} "
        f"--expect {pending.version}` answers exactly these\n"
    )
    return EXIT_OK


async def _continue(stream: Stream[Any], out: TextIO, verb: str) -> int:
    reply = await _Printer(out).consume(stream)
    if reply.needs_approval:
        out.write(f"{verb}; the run stopped for approval again:\n")
        for r in reply.approvals:
            for line in _request_lines(r):
                out.write("  " + line + "\n")
    else:
        out.write(f"{verb}; the run ended ({reply.stop_reason}), version {reply.version}\n")
    return EXIT_OK


async def _answer(
    args: argparse.Namespace, agent: Agent[Any], storage: Storage, out: TextIO
) -> int:
    await _require_thread(storage, args.thread_id)
    thread = agent.thread(args.thread_id, actor=args.actor or _default_actor())
    if args.action == "retry":
        return await _continue(thread.stream_retry(), out, "retried")
    pending = await thread.pending_approvals()
    if not pending:
        raise CliError(f"thread {args.thread_id!r} waits for no approval")
    # The answer applies to what the user pinned (--expect), else to what this command
    # read and prints here: never to calls asked after it read them.
    expected: Any = args.expect if args.expect is not None else pending
    if args.expect is None:
        out.write(f"answering version {pending.version}:\n")
        for r in pending:
            out.write(f"  {r.call_id}  {r.tool}({_args(r.args)})\n")
    if args.action == "reject":
        return await _continue(
            thread.stream_reject(args.reason, expected=expected), out, "rejected"
        )
    if args.action == "decide":
        return await _continue(
            thread.stream_decide(args.decisions, expected=expected), out, "decided"
        )
    if not args.call:
        return await _continue(thread.stream_approve(expected=expected), out, "approved")
    from criogen_graph.results import Decision

    ids = [r.call_id for r in pending]
    unknown = [c for c in args.call if c not in ids]
    if unknown:
        raise CliError(f"no pending call {', '.join(unknown)}; pending: {', '.join(ids)}")
    others = [r for r in pending if r.call_id not in args.call]
    if others and not args.reject_others:
        listed = ", ".join(f"{r.call_id} ({r.tool})" for r in others)
        raise CliError(
            f"{listed} also wait(s) for a decision: list it with --call, add --reject-others, "
            "or use `threads decide`"
        )
    decisions = {
        r.call_id: Decision.approve() if r.call_id in args.call else Decision.reject(args.reason)
        for r in pending
    }
    return await _continue(thread.stream_decide(decisions, expected=expected), out, "decided")


async def _audit(args: argparse.Namespace, agent: Agent[Any], storage: Storage, out: TextIO) -> int:
    await storage.open()
    records = await storage.audit(args.thread_id, limit=args.limit)
    if args.thread_id and not records:
        await _require_thread(storage, args.thread_id)
    if args.json:
        _print_json(records, out)
        return EXIT_OK
    if not records:
        out.write("no audit records\n")
        return EXIT_OK
    for r in records:
        who = r.get("actor") or "-"
        thread = "" if args.thread_id else f"{r['thread_id']}  "
        out.write(
            f"{_fmt_ms(r['ts_ms'])}  {thread}{r['action']:<13} {who:<10} "
            f"{_audit_summary(r)}\n".rstrip()
            + "\n"
        )
    return EXIT_OK


def _audit_summary(r: Mapping[str, Any]) -> str:
    d: Mapping[str, Any] = r.get("details") or {}
    action = r.get("action")
    if action == "send":
        return _one_line(d.get("input"), 80)
    if action == "tool_call":
        ran = f" as {d['ran_as']}" if d.get("ran_as") and d.get("ran_as") != d.get("tool") else ""
        extra = f" ({d['decision']})" if isinstance(d.get("decision"), str) else ""
        return f"{d.get('tool')}{ran} [{d.get('status')}]{extra}"
    if action in ("approve", "reject", "decide"):
        return ", ".join(
            f"{x.get('tool')}: {(x.get('decision') or {}).get('type')}"
            for x in d.get("decisions") or ()
        )
    if action in ("run_failed", "run_cancelled"):
        message = _one_line(d.get("message") or "", 100)
        return f"{d.get('error')}: {message}" if message else str(d.get("error") or "")
    if action == "rewind":
        return f"to {d.get('checkpoint_id')}"
    return ""


_THREAD_ACTIONS: dict[
    str,
    Callable[[argparse.Namespace, Any, Any, TextIO], Coroutine[Any, Any, int]],
] = {
    "list": _list,
    "show": _show,
    "history": _history,
    "pending": _pending,
    "approve": _answer,
    "reject": _answer,
    "decide": _answer,
    "retry": _answer,
    "audit": _audit,
}


# -- background runs: worker and runs ------------------------------------------------------

_WORKER_DESCRIPTION = """\
Run the background runs queued in a PostgreSQL storage (thread.submit(...)), until
SIGINT or SIGTERM (which let the running ones finish). Start as many as you like, on as
many machines as you like, all with the same --agent and --storage: each run goes to one
worker, the runs of one thread one at a time in order, and the runs of a worker that
died (silent for --stalled-after seconds) are continued by the others from their last
saved step."""


def _positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return number


def _add_background_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    worker = sub.add_parser(
        "worker",
        parents=[common],
        help="run queued background runs (PostgreSQL)",
        description=_WORKER_DESCRIPTION,
        epilog="example:\n  criogen-graph worker --agent support:agent "
        "--storage postgresql://app@db/app --concurrency 8",
        formatter_class=_formatter,
    )
    worker.add_argument(
        "--agent",
        metavar="MODULE:ATTR",
        action="append",
        required=True,
        help="an importable Agent whose threads it serves (repeat for several)",
    )
    worker.add_argument(
        "--storage",
        metavar="URL",
        help=f"the PostgreSQL storage (default: ${STORAGE_ENV}, else the agent's own)",
    )
    worker.add_argument(
        "--concurrency", type=_positive_int, default=4, help="runs at once (default 4)"
    )
    worker.add_argument(
        "--heartbeat",
        type=_positive_float,
        default=2.0,
        help="seconds between heartbeats (default 2)",
    )
    worker.add_argument(
        "--stalled-after",
        type=_positive_float,
        default=10.0,
        help="seconds without a heartbeat after which a worker is taken for dead (default 10)",
    )
    worker.set_defaults(handler=_cmd_worker)

    runs = sub.add_parser(
        "runs",
        parents=[common],
        help="list, show and cancel background runs (PostgreSQL)",
        description="The queue of background runs of a PostgreSQL storage.",
        epilog="examples:\n  criogen-graph runs list --status failed\n"
        "  criogen-graph runs show 3f2a...\n  criogen-graph runs cancel 3f2a...",
        formatter_class=_formatter,
    )
    runs.add_argument(
        "--storage", metavar="URL", help=f"the PostgreSQL storage (default: ${STORAGE_ENV})"
    )
    rsub = runs.add_subparsers(dest="runs_action", metavar="ACTION")
    runs.set_defaults(handler=_cmd_runs, runs_parser=runs)
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("--storage", metavar="URL", default=argparse.SUPPRESS)
    shared.add_argument("--json", action="store_true", help="print JSON")
    p = rsub.add_parser("list", parents=[shared], help="runs, newest first")
    p.add_argument("--status", choices=["queued", "running", "succeeded", "failed", "cancelled"])
    p.add_argument("--thread", metavar="ID", help="only this thread's runs")
    p.add_argument("--limit", type=_positive_int, default=50, help="at most N (default 50)")
    p = rsub.add_parser("show", parents=[shared], help="one run: status, attempts, worker, error")
    p.add_argument("run_id", metavar="RUN_ID")
    p = rsub.add_parser("cancel", parents=[shared], help="cancel a queued or running run")
    p.add_argument("run_id", metavar="RUN_ID")


def _pg_storage_url(option: str | None, agents: Sequence[Agent[Any]] = ()) -> str:
    url = option or os.environ.get(STORAGE_ENV)
    if url is None and agents and agents[0].storage.scheme == "postgres":
        url = agents[0].storage.url
    if url is None:
        raise CliError(f"pass --storage postgresql://... (or set ${STORAGE_ENV})")
    url = _storage_url(url)
    if not url.startswith(("postgresql://", "postgres://")):
        raise CliError(
            f"background runs are queued in PostgreSQL; {_safe_url(url)} is not (on memory:// "
            "and SQLite they run inside the process that submitted them)"
        )
    return url


def _cmd_worker(args: argparse.Namespace) -> int:
    import logging

    from criogen_graph.background import Worker
    from criogen_graph.storage import Storage

    agents = [_load_agent(spec) for spec in args.agent]
    storage = Storage(_pg_storage_url(args.storage, agents), on_busy="wait")
    if args.stalled_after <= args.heartbeat:
        raise CliError("--stalled-after must be longer than --heartbeat")
    worker = Worker(
        agents,
        storage=storage,
        concurrency=args.concurrency,
        heartbeat_secs=args.heartbeat,
        stalled_after_secs=args.stalled_after,
    )
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    print(
        f"worker {worker.name} serving {', '.join(sorted(worker.agents))} on "
        f"{_safe_url(storage.url)}",
        file=sys.stderr,
        flush=True,
    )

    async def serve() -> None:
        try:
            await worker.run(install_signal_handlers=True)
        finally:
            await storage.close()

    _run(serve())
    return EXIT_OK


def _cmd_runs(args: argparse.Namespace) -> int:
    if args.runs_action is None:
        args.runs_parser.print_help()
        return EXIT_USAGE
    from criogen_graph.storage import Storage

    storage = Storage(_pg_storage_url(getattr(args, "storage", None)))
    return _run(_runs(args, storage))


async def _runs(args: argparse.Namespace, storage: Storage) -> int:
    from criogen_graph import background

    try:
        if args.runs_action == "list":
            infos = await background.list_runs(
                storage, status=args.status, thread_id=args.thread, limit=args.limit
            )
            if args.json:
                print(json.dumps([i.to_dict() for i in infos], indent=2))
                return EXIT_OK
            if not infos:
                print("no background runs")
                return EXIT_OK
            for i in infos:
                error = f"  {i.error_code}: {i.error}" if i.error else ""
                print(
                    f"{i.id}  {i.status:<9}  {i.action:<7}  thread={i.thread_id}  "
                    f"attempts={i.attempts}  worker={i.worker or '-'}{error}"
                )
            return EXIT_OK
        info = await background.get_run(storage, args.run_id)
        if info is None:
            raise CliError(f"no background run {args.run_id!r} in {_safe_url(storage.url)}")
        if args.runs_action == "show":
            if args.json:
                print(json.dumps(info.to_dict(), indent=2))
            else:
                for key, value in info.to_dict().items():
                    if value is not None:
                        print(f"{key}: {value}")
            return EXIT_OK
        if await background.cancel_run(storage, args.run_id):
            print(f"cancelled {args.run_id}" if not args.json else json.dumps({"cancelled": True}))
            return EXIT_OK
        raise CliError(f"run {args.run_id} has ended ({info.status}); nothing to cancel")
    finally:
        await background.close_runs(storage)
        await storage.close()
