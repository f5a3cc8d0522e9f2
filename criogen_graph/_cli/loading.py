"""Loading what a command is pointed at: agents and tools named `module:attr`, models
named on the command line, and storages named by URL."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from criogen_graph._cli.common import DEFAULT_STORAGE, STORAGE_ENV, CliError

if TYPE_CHECKING:
    from types import ModuleType

    from criogen_graph import Model
    from criogen_graph.agent import Agent
    from criogen_graph.storage import Storage

__all__ = [
    "bare_agent",
    "close",
    "default_actor",
    "echo_model",
    "import_object",
    "load_agent",
    "model_choice",
    "pg_storage_url",
    "safe_url",
    "script_model",
    "storage_url",
    "threads_storage",
    "tools_from",
]

#: The keys a reply of a FakeModel script may have.
_REPLY_KEYS = frozenset({"text", "content", "tool_calls", "chunks", "delay", "usage"})


def safe_url(url: str) -> str:
    """`url` without its password, for messages."""
    from criogen_graph._urls import mask_url

    return mask_url(url)


def default_actor() -> str | None:
    """The login name, for the audit trail (None when the system cannot tell)."""
    import getpass

    try:
        return getpass.getuser()
    except Exception:
        return None


def storage_url(value: str | None) -> str:
    """The storage URL of `--storage` (or $CRIOGEN_STORAGE, or the default); a plain
    path is a SQLite file."""
    url = value or os.environ.get(STORAGE_ENV) or DEFAULT_STORAGE
    if "://" not in url:
        url = f"sqlite:///{url}"
    return url


def _import_module(module_name: str, spec: str, option: str) -> ModuleType:
    """The module of `module:attr`: a dotted name, or the path of a .py file."""
    import importlib
    import importlib.util

    if not module_name.endswith(".py"):
        return importlib.import_module(module_name)
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
    return module


def import_object(spec: str, option: str) -> Any:
    """`module:attr` (or `path/to/file.py:attr`), with the current directory importable;
    `option` names the option that gave it, for the error."""
    module_name, _, attr = spec.rpartition(":")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        value: Any = _import_module(module_name, spec, option)
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
    for part in attr.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise CliError(f"{option} {spec}: {module_name!r} has no attribute {attr!r}") from None
    return value


def load_agent(spec: str) -> Agent[Any]:
    """The Agent named by `--agent module:attr`."""
    from criogen_graph.agent import Agent

    value = import_object(spec, "--agent")
    if not isinstance(value, Agent):
        raise CliError(f"--agent {spec}: expected an Agent, got {type(value).__name__}")
    return value


def bare_agent(storage: Storage) -> Agent[Any]:
    """An agent that only reads the threads of `storage` (its model is never called)."""
    from criogen_graph.agent import Agent
    from criogen_graph.models.testing import FunctionModel

    def never(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        raise CliError("this command reads threads; it runs no model")

    return Agent(FunctionModel(never, name="reader"), storage=storage, name="criogen-graph")


def _fake_reply(i: int, entry: Any) -> Any:
    """Reply `i` of a FakeModel script: a string, or an object (see `script_model`)."""
    from criogen_graph.models.testing import FakeReply

    if isinstance(entry, str):
        return entry
    if not isinstance(entry, dict):
        raise ValueError(f"reply {i} must be a string or an object")
    if "error" in entry:
        return FakeReply.error(str(entry["error"]), entry.get("message"))
    unknown = set(entry) - _REPLY_KEYS
    if unknown:
        raise ValueError(f"reply {i} has unknown keys {sorted(unknown)}")
    return FakeReply(
        entry.get("text", entry.get("content")),
        entry.get("tool_calls") or (),
        chunks=entry.get("chunks"),
        delay=float(entry.get("delay") or 0),
        usage=entry.get("usage"),
    )


def script_model(path: Path) -> Any:
    """A `FakeModel` from a script file: a `RecordingModel` recording, or a JSON list of
    replies (a string is a final answer; an object has `text`, `tool_calls` (`[{"name",
    "args", "id"?}]`), `chunks`, `delay` (seconds) or `error` (a `ModelError` kind)).
    Raises `ValueError` naming what is wrong with the file."""
    from criogen_graph.models.testing import FakeModel

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
    return FakeModel([_fake_reply(i, entry) for i, entry in enumerate(data)], name=path.stem)


def echo_model() -> Any:
    """The `fake` model: it answers with what the user said."""
    from criogen_graph.models.testing import FunctionModel

    def echo(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        said = next((m.get("content") for m in reversed(messages) if m.get("role") == "user"), "")
        return f"You said: {said}"

    return FunctionModel(echo, name="echo")


def model_choice(value: str) -> Any:
    """`--model`: "fake", a FakeModel script file (loaded), or "provider:model" (checked
    here; its key is checked when the agent is built). Raises
    `argparse.ArgumentTypeError` for anything else."""
    value = value.strip()
    if value == "fake":
        return value
    path = Path(value)
    if path.is_file():
        try:
            return script_model(path)
        except (ValueError, TypeError) as exc:
            raise argparse.ArgumentTypeError(f"bad FakeModel script {value}: {exc}") from None
    if value.endswith(".json") or (":" not in value and ("/" in value or os.sep in value)):
        raise argparse.ArgumentTypeError(f"no FakeModel script file at {value}")
    if ":" not in value:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a model: use provider:model (e.g. openai:gpt-5-mini), 'fake', "
            "or the path of a FakeModel script (.json)"
        )
    from criogen_graph.models import parse_model_string

    try:
        parse_model_string(value)
    except TypeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _agent_tools(agent: Agent[Any]) -> tuple[list[Any], list[Any]]:
    """An agent's tools and approval rules, without the tools of its own memory (the chat
    agent makes those itself)."""
    spec = agent.spec
    own_memory: set[str] = set()
    if spec.memory is not None:
        own_memory = {t.name for t in spec.memory.make_tools()}
    tools: list[Any] = [t for n, t in spec.tools.items() if n not in own_memory]
    return [*tools, *spec.sources], list(spec.approvals.values())


def tools_from(spec: str) -> tuple[list[Any], list[Any], Model | None]:
    """The tools of `--tools module:attr`, and for an Agent its approval rules and its
    model (what `chat` runs without `--model`)."""
    from criogen_graph.agent import Agent
    from criogen_graph.tools import Tool, ToolSource

    value = import_object(spec, "--tools")
    if isinstance(value, Agent):
        return (*_agent_tools(value), value.model)
    if isinstance(value, Tool | ToolSource):
        return [value], [], None
    if isinstance(value, list | tuple | set | frozenset):
        bad = [v for v in value if not isinstance(v, Tool | ToolSource)]
        if bad:
            raise CliError(
                f"--tools {spec}: {bad[0]!r} is not a tool (decorate functions with @tool)"
            )
        return list(value), [], None
    raise CliError(
        f"--tools {spec}: expected a list of tools, a tool or an Agent, got {type(value).__name__}"
    )


def threads_storage(option: str | None, agent: Agent[Any] | None) -> Storage:
    """The storage of `threads`: `--storage`; with `--agent` and no `--storage`, the
    agent's own (unless in memory). A SQLite file must exist: reading creates none."""
    from criogen_graph.storage import Storage

    if option is None and agent is not None and agent.storage.scheme != "memory":
        return agent.storage
    url = storage_url(option)
    if agent is not None and agent.storage.url == url:
        return agent.storage
    storage = Storage(url)
    if storage.scheme == "sqlite":
        from criogen_graph.storage.sqlite import parse_sqlite_url

        path = parse_sqlite_url(storage.url)
        if path != ":memory:" and not Path(path).exists():
            raise CliError(f"no database at {path}; pass --storage URL (see --help)")
    return storage


def pg_storage_url(option: str | None, agents: tuple[Agent[Any], ...] = ()) -> str:
    """The PostgreSQL URL of `worker` and `runs`: `--storage`, $CRIOGEN_STORAGE, else the
    first agent's own storage."""
    url = option or os.environ.get(STORAGE_ENV)
    if url is None and agents and agents[0].storage.scheme == "postgres":
        url = agents[0].storage.url
    if url is None:
        raise CliError(f"pass --storage postgresql://... (or set ${STORAGE_ENV})")
    url = storage_url(url)
    if not url.startswith(("postgresql://", "postgres://")):
        raise CliError(
            f"background runs are queued in PostgreSQL; {safe_url(url)} is not (on memory:// "
            "and SQLite they run inside the process that submitted them)"
        )
    return url


async def close(agent: Agent[Any] | None, storage: Storage) -> None:
    """Close what a command opened: the agent (its model clients), then the storage."""
    try:
        if agent is not None:
            await agent.aclose()
    finally:
        await storage.close()
