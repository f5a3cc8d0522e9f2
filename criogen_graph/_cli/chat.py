"""`criogen-graph chat`: a terminal chat on a saved thread, streamed, with approvals
asked at the prompt."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from criogen_graph._cli.common import EXIT_OK, MODEL_ENV, CliError
from criogen_graph._cli.loading import (
    close,
    default_actor,
    echo_model,
    model_choice,
    safe_url,
    storage_url,
    tools_from,
)
from criogen_graph._cli.rendering import Printer, args_json, message_lines, one_line

if TYPE_CHECKING:
    from types import FrameType

    from criogen_graph import Model
    from criogen_graph.agent import Agent
    from criogen_graph.results import ApprovalRequest, Decision, Reply
    from criogen_graph.stream import Stream
    from criogen_graph.thread import Thread

__all__ = ["Chat", "EventLoop", "cmd_chat"]

T = TypeVar("T")

CHAT_HELP = """\
  /help      this help
  /history   the conversation so far
  /pending   answer the calls waiting for approval
  /retry     continue the last run if it failed or was cancelled
  /quit      leave (also Ctrl-D); the thread stays saved
  Ctrl-C while an answer streams cancels the run (saved; /retry continues it)."""

#: How each answer to an approval is offered at the prompt, and its one-letter key.
_LABELS = {
    "approve": "[a]pprove",
    "reject": "[r]eject",
    "edit": "[e]dit args",
    "respond": "[s]kip with an answer",
}
_KEYS = {"approve": "a", "reject": "r", "edit": "e", "respond": "s"}


def _choice(answer: str, allowed: Sequence[str]) -> str | None:
    """The decision type a typed answer picks among `allowed` (None: not understood)."""
    choice = next((a for a in allowed if answer in (a, _KEYS.get(a))), None)
    if choice is None and answer in ("y", "yes") and "approve" in allowed:
        return "approve"
    if choice is None and answer in ("n", "no") and "reject" in allowed:
        return "reject"
    return choice


class EventLoop:
    """One event loop for the whole chat (connections belong to it), run a coroutine at
    a time from the synchronous prompt loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.task: asyncio.Task[Any] | None = None

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` to its end (Ctrl-C cancels it through `task`)."""
        task: asyncio.Task[T] = self.loop.create_task(coro)
        self.task = task
        try:
            return self.loop.run_until_complete(task)
        finally:
            self.task = None

    def close(self) -> None:
        """Cancel what still runs and close the loop."""
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


class Chat:
    """One chat session on `thread`: the prompt loop, its /commands and the approvals."""

    def __init__(
        self,
        agent: Agent[Any],
        thread: Thread[Any],
        loop: EventLoop,
        out: TextIO,
        err: TextIO,
    ) -> None:
        self.agent = agent
        self.thread = thread
        self.loop = loop
        self.printer = Printer(out)
        self.err = err
        self.active: Stream[Any] | None = None
        self.tty = sys.stdin.isatty()

    # -- Ctrl-C ----------------------------------------------------------------------

    def on_sigint(self, signum: int, frame: FrameType | None) -> None:
        """Ctrl-C: cancel the streaming run, else the running call, else leave the prompt."""
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
        """A line to the user."""
        self.printer.line(text)

    def error(self, text: str) -> None:
        """An error line, on stderr."""
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
        """Run a streamed call; its reply, or None when it failed or was cancelled (said).
        With `deciding`, a `ValidationError` about the answer itself is raised (to ask
        again)."""
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
        self.until_done(self.stream(make))

    def until_done(self, reply: Reply[Any] | None) -> None:
        """Ask for the approvals `reply` (and each reply after it) stops for."""
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
        """A decision for each request, asked at the prompt."""
        n = len(requests)
        self.say(f"approval needed ({n} call{'s' if n != 1 else ''}):")
        return {r.call_id: self.ask_one(r) for r in requests}

    def ask_one(self, r: ApprovalRequest) -> Decision:
        """The decision on one request, asked until the answer is one of those allowed."""
        self.say(f"  {r.tool}({args_json(r.args)})  [{r.call_id}]")
        if r.description:
            self.say(f"    {r.description}")
        allowed = r.allowed or ["approve", "reject", "edit", "respond"]
        prompt = "  " + " / ".join(_LABELS[a] for a in allowed if a in _LABELS) + "? "
        while True:
            choice = _choice(self.ask(prompt).strip().lower(), allowed)
            if choice is None:
                self.say(f"  please answer {', '.join(_KEYS[a] for a in allowed if a in _KEYS)}")
                continue
            decision = self.ask_details(choice)
            if decision is not None:
                return decision

    def ask_details(self, choice: str) -> Decision | None:
        """The decision of type `choice`, with what it needs asked (None: asked wrongly,
        said; the request is asked again)."""
        from criogen_graph.results import Decision

        if choice == "reject":
            reason = self.ask("  reason (the model is told; empty for none)> ").strip()
            return Decision.reject(reason or None)
        if choice == "edit":
            raw = self.ask("  new args as JSON> ").strip()
            try:
                args = json.loads(raw)
            except json.JSONDecodeError as exc:
                self.error(f"invalid JSON: {exc.msg}")
                return None
            if not isinstance(args, dict):
                self.error("the args must be a JSON object")
                return None
            return Decision.edit(args)
        if choice == "respond":
            message = self.ask("  answer for the model (the tool is skipped)> ").strip()
            if not message:
                self.error("the answer must not be empty")
                return None
            return Decision.respond(message)
        return Decision.approve()

    def answer_pending(self) -> None:
        """/pending: answer what the thread waits for, if anything."""
        pending = self.loop.run(self.thread.pending_approvals())
        if not pending:
            self.say("(nothing waits for approval)")
            return
        self.until_done(self.decide(pending))

    def show_history(self) -> None:
        """/history: the messages so far."""
        messages = self.loop.run(self.thread.messages())
        if not messages:
            self.say("(no messages yet)")
        for m in messages:
            for line in message_lines(m):
                self.say(line)

    # -- the session -----------------------------------------------------------------------

    async def _status(self) -> tuple[bool, list[dict[str, Any]], list[ApprovalRequest], str]:
        """Whether the thread exists; its messages, pending calls and status."""
        head = await self.thread.history(limit=1)
        if not head:
            return False, [], [], "new"
        messages = await self.thread.messages()
        pending = await self.thread.pending_approvals()
        return True, messages, pending, str(head[0]["status"])

    def greet(self, storage_url: str, model: str) -> list[ApprovalRequest]:
        """Say where the chat is and how the thread stands; the calls it waits for."""
        exists, messages, pending, status = self.loop.run(self._status())
        tid = self.thread.id
        state = f"{len(messages)} messages" if exists else "new"
        self.say(f"criogen-graph chat: thread {tid} ({state}) on {storage_url}, model {model}")
        self.say(f"Continue it later with --thread {tid}. /help lists the commands, /quit leaves.")
        if exists:
            last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
            if last is not None and last.get("content"):
                self.say(f"last answer: {one_line(last['content'], 300)}")
            if status in ("failed", "cancelled", "pending") and not pending:
                self.say(f"(the last run did not finish ({status}): /retry continues it)")
        return pending

    def session(self, storage_url: str, model: str) -> int:
        """The whole chat: the greeting, what the thread waits for, then the prompt."""
        pending = self.greet(storage_url, model)
        try:
            if pending:
                self.say("this thread waits for approval:")
                try:
                    self.until_done(self.decide(pending))
                except (KeyboardInterrupt, asyncio.CancelledError):
                    self.interrupted()
            self.loop_prompt()
        except EOFError:
            self.leave_note()
        return EXIT_OK

    def interrupted(self) -> None:
        """Say that Ctrl-C stopped what ran, and whether the thread now waits."""
        self.say()
        self.say("(interrupted)")
        try:
            waiting = bool(self.loop.run(self.thread.pending_approvals()))
        except BaseException:
            waiting = False
        if waiting:
            self.say("(the thread waits for approval: /pending asks again)")

    def leave_note(self, *, newline: bool = True) -> None:
        """On leaving: how to answer what the thread still waits for."""
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
        """Read lines until /quit or end of input: a /command, else a message to send."""
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
                self.send(line)
            except (KeyboardInterrupt, asyncio.CancelledError):
                self.interrupted()

    def send(self, line: str) -> None:
        """Send a message, once what the thread waits for is answered."""
        if self.loop.run(self.thread.pending_approvals()):
            self.say("(the thread waits for approval first)")
            self.answer_pending()
            if self.loop.run(self.thread.pending_approvals()):
                return
        self.turn(partial(self.thread.stream, line))

    def command(self, line: str) -> bool:
        """Run a /command; False to leave."""
        from criogen_graph.errors import CriogenError

        name = line.split()[0].lower()
        try:
            if name in ("/quit", "/exit", "/q"):
                self.leave_note(newline=False)
                return False
            if name in ("/help", "/?"):
                self.say(CHAT_HELP)
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


def _chat_model(args: argparse.Namespace, agents_model: Model | None) -> Any:
    """The model of `--model`, else the one of the first `--tools` Agent (so its own
    model, a scripted one included, runs the chat), else $CRIOGEN_MODEL; with its
    provider's key in the environment."""
    model: Any = args.model
    if model is None and agents_model is not None:
        return agents_model
    if model is None:
        env = os.environ.get(MODEL_ENV)
        if not env:
            parser: argparse.ArgumentParser = args.command_parser
            parser.error(
                "chat needs --model (provider:model, 'fake' or a script file), an Agent as "
                f"--tools (its model), or ${MODEL_ENV}"
            )
        try:
            model = model_choice(env)
        except argparse.ArgumentTypeError as exc:
            raise CliError(f"${MODEL_ENV}: {exc}") from None
    if model == "fake":
        return echo_model()
    if isinstance(model, str):
        from criogen_graph.models import PROVIDER_KEYS, parse_model_string

        missing = [v for v in PROVIDER_KEYS[parse_model_string(model)[0]] if not os.environ.get(v)]
        if missing:
            raise CliError(
                f"--model {model} needs {' and '.join(missing)}: set it in the environment or "
                "in a .env file in the current directory"
            )
    return model


def _chat_tools(args: argparse.Namespace) -> tuple[list[Any], list[Any], Model | None]:
    """The tools of `--tools`, the approval rules of `--tools` agents and `--approve`
    (the first rule for a tool wins), and the model of the first `--tools` agent."""
    tools: list[Any] = []
    rules: dict[str, Any] = {}
    agents_model: Model | None = None
    for spec in args.tools:
        found, approvals, model = tools_from(spec)
        tools.extend(found)
        agents_model = agents_model or model
        for rule in approvals:
            rules.setdefault(rule.tool, rule)
    for name in args.approve:
        rules.setdefault(name, name)
    return tools, list(rules.values()), agents_model


def _own_sigint(chat: Chat) -> bool:
    """Route Ctrl-C to `chat` when nobody else handles it; whether it did."""
    import signal
    import threading

    own = (
        signal.getsignal(signal.SIGINT) is signal.default_int_handler
        and threading.current_thread() is threading.main_thread()
    )
    if own:
        signal.signal(signal.SIGINT, chat.on_sigint)
    return own


def cmd_chat(args: argparse.Namespace) -> int:
    """`criogen-graph chat`."""
    import signal

    from criogen_graph.agent import Agent
    from criogen_graph.env import load_env
    from criogen_graph.storage import Storage

    load_env()
    tools, rules, agents_model = _chat_tools(args)
    model = _chat_model(args, agents_model)
    url = storage_url(args.storage)
    storage = Storage(url)
    try:
        agent: Agent[Any] = Agent(
            model,
            instructions=args.instructions,
            tools=tools,
            approve=rules,
            storage=storage,
            name="chat",
        )
    except (TypeError, ValueError) as exc:
        raise CliError(str(exc)) from exc
    thread_id = args.thread or f"chat-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    loop = EventLoop()
    actor = args.actor or default_actor()
    chat = Chat(agent, agent.thread(thread_id, actor=actor), loop, sys.stdout, sys.stderr)
    if sys.stdin.isatty():
        try:
            import readline  # noqa: F401  (line editing for input())
        except ImportError:
            pass
    own_handler = _own_sigint(chat)
    m = agent.model
    shown = "fake (echoes you)" if args.model == "fake" else f"{m.provider}:{m.name}"
    try:
        return chat.session(safe_url(url), shown)
    finally:
        if own_handler:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            loop.run(close(agent, storage))
        finally:
            loop.close()
