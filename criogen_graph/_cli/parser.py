"""The `criogen-graph` argument parser: its commands, their options and help.

Building it imports no heavy module: a command's own modules load when it runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from criogen_graph._cli.background import cmd_runs, cmd_worker
from criogen_graph._cli.chat import cmd_chat
from criogen_graph._cli.common import (
    DEFAULT_STORAGE,
    ENCRYPTION_KEY_ENV,
    MODEL_ENV,
    STORAGE_ENV,
)
from criogen_graph._cli.demo import cmd_demo
from criogen_graph._cli.loading import model_choice
from criogen_graph._cli.serve import cmd_serve
from criogen_graph._cli.threads import Decisions, cmd_threads, parse_decisions
from criogen_graph._version import __version__

__all__ = ["build_parser"]

_MAIN_EPILOG = """\
examples:
  criogen-graph demo
  criogen-graph chat --model openai:gpt-5-mini --tools examples.support_agent:agent
  criogen-graph threads list
  criogen-graph threads pending ticket-42
  criogen-graph threads approve ticket-42 --agent examples.support_agent:agent

Run `criogen-graph COMMAND --help` for the options of a command.
"""

_CHAT_DESCRIPTION = """\
Chat with an agent in the terminal. The answer streams as the model writes it, tool
calls show as they run, and a call that needs approval is asked at the prompt (approve,
reject with a reason, edit its arguments as JSON). The conversation is a saved thread:
run the command again with the same --thread to continue it, from any process.
"""

_CHAT_EPILOG = f"""\
models (--model; without it the model of a --tools Agent, else ${MODEL_ENV}):
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
  criogen-graph chat --tools examples.support_agent:agent   # its own model: offline
  criogen-graph chat --model openai:gpt-5-mini
  criogen-graph chat --model anthropic:claude-sonnet-4-5 --tools examples.support_agent:agent \\
      --instructions "You are a support agent." --thread ticket-42
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
  criogen-graph threads approve ticket-42 --agent examples.support_agent:agent --actor ada
  criogen-graph threads reject ticket-42 --agent examples.support_agent:agent \\
      --reason "not eligible"
  criogen-graph threads decide ticket-42 --agent examples.support_agent:agent \\
      --json '{{"call_abc": {{"type": "edit", "args": {{"order_id": "A-2"}}}}}}'
  criogen-graph threads audit ticket-42 --json
"""

_DECIDE_EXAMPLE = (
    "criogen-graph threads decide ticket-42 --agent examples.support_agent:agent \\\n"
    '      --json \'{"call_abc": {"type": "edit", "args": {"order_id": "A-2"}}, '
    '"call_def": {"type": "reject", "message": "no"}}\'\n'
    "  criogen-graph threads decide ticket-42 --agent examples.support_agent:agent \\\n"
    "      --json '\"approve\"'\n"
    "  criogen-graph threads decide ticket-42 --agent examples.support_agent:agent \\\n"
    '      --json \'["approve", {"type": "respond", "message": "out of stock"}]\''
)

_DECIDE_HELP = (
    "{call_id: decision, ...}; or one decision for every pending call; or a list of "
    "decisions, one per pending call in the order `threads pending` lists them. A decision "
    'is "approve", "reject", {"type": "approve"}, {"type": "reject", "message": ...}, '
    '{"type": "edit", "args": {...}, "name"?: ...} or {"type": "respond", "message": ...}'
)

_WORKER_DESCRIPTION = """\
Run the background runs queued in a PostgreSQL storage (thread.submit(...)), until
SIGINT or SIGTERM (which let the running ones finish). Start as many as you like, on as
many machines as you like, all with the same --agent and --storage: each run goes to one
worker, the runs of one thread one at a time in order, and the runs of a worker that
died (silent for --stalled-after seconds) are continued by the others from their last
saved step."""

_JSON_HELP = "print JSON (for scripts)"


# -- argument types -------------------------------------------------------------------------


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


def _decisions(value: str) -> Decisions:
    """`threads decide --json`."""
    try:
        return parse_decisions(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return n


def _positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return number


# -- the parser -------------------------------------------------------------------------------

#: One option or positional argument: its names and the keywords of `add_argument`.
_Option = tuple[tuple[str, ...], dict[str, Any]]


def _opt(*names: str, **spec: Any) -> _Option:
    return names, spec


def _add_options(p: argparse.ArgumentParser, options: Sequence[_Option]) -> None:
    for names, spec in options:
        p.add_argument(*names, **spec)


def _options_parser(
    options: Sequence[_Option], parents: Sequence[argparse.ArgumentParser] = ()
) -> argparse.ArgumentParser:
    """A parser that only carries options, for other parsers to take as a parent."""
    p = argparse.ArgumentParser(add_help=False, parents=list(parents))
    _add_options(p, options)
    return p


def _storage(help: str, **spec: Any) -> _Option:
    return _opt("--storage", metavar="URL", help=help, **spec)


def _agent(help: str) -> _Option:
    return _opt("--agent", type=_module_attr, metavar="MODULE:ATTR", help=help)


def _debug(help: str) -> _Option:
    return _opt("--debug", action="store_true", default=argparse.SUPPRESS, help=help)


_THREAD_ID = _opt("thread_id", metavar="ID", help="the thread id")
_JSON = _opt("--json", action="store_true", help=_JSON_HELP)
_DEBUG_HELP = "show the traceback of an error"
_STORAGE_HELP = f"the storage (default: ${STORAGE_ENV} or {DEFAULT_STORAGE})"
_EXPECT = _opt(
    "--expect",
    type=_expected,
    metavar="VERSION",
    help="answer only if the thread still waits at this version (or checkpoint id), "
    "the one `threads pending` showed; else fail and change nothing. Without it, the "
    "answer applies to the calls this command reads and prints",
)
_REJECTED = {"default": "rejected", "metavar": "TEXT"}

_CHAT_OPTIONS = (
    _opt(
        "--model",
        type=model_choice,
        metavar="MODEL",
        help="provider:model, 'fake', or a FakeModel script file (default: the model of a "
        f"--tools Agent, else ${MODEL_ENV})",
    ),
    _storage(f"where the thread is kept (default: ${STORAGE_ENV} or {DEFAULT_STORAGE})"),
    _opt(
        "--thread",
        metavar="ID",
        help="the thread to continue or start (default: a new id, printed at the start)",
    ),
    _opt("--instructions", metavar="TEXT", help="the agent's instructions"),
    _opt(
        "--tools",
        type=_module_attr,
        action="append",
        default=[],
        metavar="MODULE:ATTR",
        help="tools to offer: a list of tools, one tool, or an Agent (its tools and approval "
        "rules), imported from your module (repeatable; the current directory is importable)",
    ),
    _opt(
        "--approve",
        nargs="+",
        action="extend",
        default=[],
        metavar="TOOL",
        help="tools whose calls wait for your approval at the prompt",
    ),
    _opt("--actor", metavar="NAME", help="who you are, for the audit trail (default: your login)"),
)

_WORKER_OPTIONS = (
    _opt(
        "--agent",
        metavar="MODULE:ATTR",
        action="append",
        required=True,
        help="an importable Agent whose threads it serves (repeat for several)",
    ),
    _storage(f"the PostgreSQL storage (default: ${STORAGE_ENV}, else the agent's own)"),
    _opt(
        "--encryption-key-env",
        metavar="NAME",
        default=ENCRYPTION_KEY_ENV,
        help="the environment variable holding the storage's encryption_key (default "
        f"${ENCRYPTION_KEY_ENV}); when it is unset, the first agent's storage's key, if any",
    ),
    _opt("--concurrency", type=_positive_int, default=4, help="runs at once (default 4)"),
    _opt(
        "--heartbeat",
        type=_positive_float,
        default=2.0,
        help="seconds between heartbeats (default 2)",
    ),
    _opt(
        "--stalled-after",
        type=_positive_float,
        default=10.0,
        help="seconds without a heartbeat after which a worker is taken for dead (default "
        "10); a silent worker whose session still holds its thread's lock (paused, or a tool "
        "blocking its event loop) keeps its run",
    ),
)


_SERVE_OPTIONS = (
    _opt(
        "--agent",
        metavar="MODULE:ATTR",
        action="append",
        required=True,
        help="an importable Agent to serve (repeat for several; assistant id = its name)",
    ),
    _storage(f"where the threads are kept (default: ${STORAGE_ENV}, else {DEFAULT_STORAGE})"),
    _opt(
        "--host",
        help="the interface to listen on (default 127.0.0.1 without --auth, else 0.0.0.0)",
    ),
    _opt("--port", type=_positive_int, default=2024, help="the port (default 2024)"),
    _opt(
        "--auth",
        type=_module_attr,
        metavar="MODULE:CALLABLE",
        help="request headers -> the caller's identity (None or raising refuses)",
    ),
    _opt(
        "--cors",
        metavar="ORIGIN",
        action="append",
        help="an origin browsers may call from (repeat for several)",
    ),
    _opt(
        "--workers",
        choices=["inline", "external"],
        default="inline",
        help="who executes the runs: this process (inline, the default) or the "
        "`criogen-graph worker` processes of the PostgreSQL storage (external)",
    ),
    _opt(
        "--heartbeat",
        type=_positive_float,
        default=15.0,
        help="seconds between heartbeat comments on a quiet SSE stream (default 15)",
    ),
    _opt(
        "--start-timeout",
        type=_positive_float,
        default=30.0,
        help="with --workers external: seconds a run may wait for a worker; still queued "
        "then, with no worker alive in that time, it ends in error (default 30)",
    ),
)

_SERVE_DESCRIPTION = """\
Serve agents over HTTP with the API LangGraph's clients speak (langgraph_sdk,
@langchain/langgraph-sdk and its React useStream, LangGraph Studio): assistants, threads,
state, history and runs (wait, stream over SSE, join, cancel). Every run is a thread call
of the agent, on the storage given. Without --auth it listens on 127.0.0.1 only.
"""


def build_parser() -> argparse.ArgumentParser:
    """The `criogen-graph` argument parser."""
    common = _options_parser([_debug(_DEBUG_HELP)])
    parser = argparse.ArgumentParser(
        prog="criogen-graph",
        description="Durable agents on LangGraph: a demo, a terminal chat on saved threads,\n"
        "and commands to read and answer threads (exit codes: 0 ok, 1 error, 2 usage).",
        epilog=_MAIN_EPILOG,
        formatter_class=_formatter,
    )
    parser.add_argument("--version", action="version", version=f"criogen-graph {__version__}")
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_demo(sub, common)
    _add_chat(sub, common)
    _add_threads(sub, common)
    _add_worker(sub, common)
    _add_runs(sub, common)
    _add_serve(sub, common)
    return parser


def _command(
    sub: Any,
    name: str,
    common: argparse.ArgumentParser,
    options: Sequence[_Option],
    handler: Callable[[argparse.Namespace], int],
    **texts: str,
) -> argparse.ArgumentParser:
    """The parser of command `name`, run by `handler`, with its help `texts` (help,
    description, epilog)."""
    p: argparse.ArgumentParser = sub.add_parser(
        name, parents=[common], formatter_class=_formatter, **texts
    )
    _add_options(p, options)
    p.set_defaults(handler=handler, command_parser=p)
    return p


def _add_demo(sub: Any, common: argparse.ArgumentParser) -> None:
    _command(
        sub,
        "demo",
        common,
        [
            _opt("--db", type=Path, default=Path("criogen-demo.db"), help="the SQLite file to use"),
            _opt("--resume", metavar="THREAD", help=argparse.SUPPRESS),
        ],
        cmd_demo,
        help="run the demo: a support agent on SQLite that stops for approval, answered "
        "after a restart",
        description="A support agent on SQLite with tools and an approval gate: the first "
        "process stops for approval, a second one answers it from the file. It uses a "
        "provider when a key is set (or CRIOGEN_DEMO_MODEL=provider:model), else a "
        "scripted model.",
        epilog="example:\n  criogen-graph demo --db /tmp/demo.db",
    )


def _add_chat(sub: Any, common: argparse.ArgumentParser) -> None:
    _command(
        sub,
        "chat",
        common,
        _CHAT_OPTIONS,
        cmd_chat,
        help="chat with an agent in the terminal (streamed, with approvals at the prompt)",
        description=_CHAT_DESCRIPTION,
        epilog=_CHAT_EPILOG,
    )


class _Actions:
    """Adds the actions of `threads`, each with its help, description and example."""

    def __init__(self, tsub: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
        self.tsub = tsub
        self.parents = list(parents)

    def add(self, name: str, help: str, ex: str, options: Sequence[_Option]) -> None:
        """Adds action `name`, with `options`."""
        p: argparse.ArgumentParser = self.tsub.add_parser(
            name,
            parents=self.parents,
            help=help,
            description=help[0].upper() + help[1:] + ".",
            epilog=("examples:\n  " if "\n" in ex else "example:\n  ") + ex,
            formatter_class=_formatter,
        )
        p.set_defaults(action_parser=p)
        _add_options(p, options)


def _add_threads(sub: Any, common: argparse.ArgumentParser) -> None:
    threads = _command(
        sub,
        "threads",
        common,
        [_storage(_STORAGE_HELP)],
        cmd_threads,
        help="list, read and answer saved threads",
        description=_THREADS_DESCRIPTION,
        epilog=_THREADS_EPILOG,
    )
    tsub = threads.add_subparsers(dest="action", metavar="ACTION")
    threads.set_defaults(threads_parser=threads)
    # Every `threads` action also takes --storage and --debug after its name.
    shared = _options_parser(
        [_storage(_STORAGE_HELP, default=argparse.SUPPRESS), _debug("show tracebacks")]
    )
    reading = _options_parser(
        [_agent("read through this Agent (e.g. for its storage or its encryption key)")],
        [shared],
    )
    answering = _options_parser(
        [
            _agent("the Agent whose model and tools continue the run (required)"),
            _opt(
                "--actor",
                metavar="NAME",
                help="who answers, for the audit trail (default: your login)",
            ),
        ],
        [shared],
    )
    _add_reading(_Actions(tsub, [reading]))
    _add_answering(_Actions(tsub, [answering]))
    _Actions(tsub, [reading]).add(
        "audit",
        "audit records (who did what, when), oldest first",
        "criogen-graph threads audit ticket-42 --limit 50",
        [
            _opt("thread_id", metavar="ID", nargs="?", help="one thread (default: all)"),
            _opt("--limit", type=_positive_int, help="only the newest N records"),
            _JSON,
        ],
    )


def _add_reading(actions: _Actions) -> None:
    actions.add("list", "the thread ids, with their status", "criogen-graph threads list", [_JSON])
    actions.add(
        "show",
        "a thread's messages",
        "criogen-graph threads show ticket-42 --json",
        [_THREAD_ID, _JSON],
    )
    actions.add(
        "history",
        "a thread's checkpoints (versions), newest first",
        "criogen-graph threads history ticket-42 --limit 5",
        [
            _THREAD_ID,
            _opt("--limit", type=_positive_int, default=20, help="how many (default 20)"),
            _JSON,
        ],
    )
    actions.add(
        "pending",
        "the calls of a thread waiting for approval (call ids, tools, args)",
        "criogen-graph threads pending ticket-42",
        [_THREAD_ID, _JSON],
    )


def _add_answering(actions: _Actions) -> None:
    actions.add(
        "approve",
        "approve the pending calls of a thread and continue its run",
        "criogen-graph threads approve ticket-42 --agent examples.support_agent:agent \\\n"
        "      --call call_abc",
        [
            _THREAD_ID,
            _opt(
                "--call",
                nargs="+",
                action="extend",
                default=[],
                metavar="CALL_ID",
                help="approve only these calls (every other pending call then needs "
                "--reject-others)",
            ),
            _opt(
                "--reject-others",
                action="store_true",
                help="with --call: reject the pending calls not listed",
            ),
            _opt("--reason", help="with --reject-others: what the model is told", **_REJECTED),
            _EXPECT,
        ],
    )
    actions.add(
        "reject",
        "reject every pending call of a thread and continue its run",
        "criogen-graph threads reject ticket-42 --agent examples.support_agent:agent \\\n"
        '      --reason "not eligible"',
        [_THREAD_ID, _opt("--reason", help="what the model is told", **_REJECTED), _EXPECT],
    )
    actions.add(
        "decide",
        "answer each pending call (approve, reject, edit, respond) and continue the run",
        _DECIDE_EXAMPLE,
        [
            _THREAD_ID,
            _opt(
                "--json",
                dest="decisions",
                required=True,
                type=_decisions,
                metavar="JSON",
                help=_DECIDE_HELP,
            ),
            _EXPECT,
        ],
    )
    actions.add(
        "retry",
        "continue a thread's run that failed or was cancelled",
        "criogen-graph threads retry ticket-42 --agent examples.support_agent:agent",
        [_THREAD_ID],
    )


def _add_worker(sub: Any, common: argparse.ArgumentParser) -> None:
    _command(
        sub,
        "worker",
        common,
        _WORKER_OPTIONS,
        cmd_worker,
        help="run queued background runs (PostgreSQL)",
        description=_WORKER_DESCRIPTION,
        epilog="example:\n  criogen-graph worker --agent examples.support_agent:agent \\\n"
        "      --storage postgresql://app@db/app --concurrency 8",
    )


def _add_serve(sub: Any, common: argparse.ArgumentParser) -> None:
    _command(
        sub,
        "serve",
        common,
        _SERVE_OPTIONS,
        cmd_serve,
        help="serve agents over HTTP (the LangGraph Platform API)",
        description=_SERVE_DESCRIPTION,
        epilog="example:\n  criogen-graph serve --agent examples.support_agent:agent \\\n"
        "      --storage sqlite:///support.db",
    )


def _add_runs(sub: Any, common: argparse.ArgumentParser) -> None:
    runs = _command(
        sub,
        "runs",
        common,
        [_storage(f"the PostgreSQL storage (default: ${STORAGE_ENV})")],
        cmd_runs,
        help="list, show and cancel background runs (PostgreSQL)",
        description="The queue of background runs of a PostgreSQL storage.",
        epilog="examples:\n  criogen-graph runs list --status failed\n"
        "  criogen-graph runs show 3f2a...\n  criogen-graph runs cancel 3f2a...",
    )
    rsub = runs.add_subparsers(dest="runs_action", metavar="ACTION")
    runs.set_defaults(runs_parser=runs)
    shared = [
        _options_parser(
            [
                _opt("--storage", metavar="URL", default=argparse.SUPPRESS),
                _opt("--json", action="store_true", help="print JSON"),
            ]
        )
    ]
    run_id = [_opt("run_id", metavar="RUN_ID")]
    p = rsub.add_parser("list", parents=shared, help="runs, newest first")
    _add_options(
        p,
        [
            _opt("--status", choices=["queued", "running", "succeeded", "failed", "cancelled"]),
            _opt("--thread", metavar="ID", help="only this thread's runs"),
            _opt("--limit", type=_positive_int, default=50, help="at most N (default 50)"),
        ],
    )
    p = rsub.add_parser("show", parents=shared, help="one run: status, attempts, worker, error")
    _add_options(p, run_id)
    p = rsub.add_parser("cancel", parents=shared, help="cancel a queued or running run")
    _add_options(p, run_id)
