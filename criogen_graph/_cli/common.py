"""What every command of the command line shares: exit codes, the storage and model
defaults, and the error a command explains in one line."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = [
    "DEFAULT_STORAGE",
    "ENCRYPTION_KEY_ENV",
    "EXIT_BROKEN_PIPE",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "MODEL_ENV",
    "STORAGE_ENV",
    "CliError",
    "run",
]

T = TypeVar("T")

#: The storage of `threads` and `chat` when neither `--storage` nor $CRIOGEN_STORAGE says.
DEFAULT_STORAGE = "sqlite:///criogen.db"
#: Environment variables that give `--storage` and `--model` a default.
STORAGE_ENV = "CRIOGEN_STORAGE"
MODEL_ENV = "CRIOGEN_MODEL"
#: The environment variable `worker --encryption-key-env` reads by default.
ENCRYPTION_KEY_ENV = "CRIOGEN_ENCRYPTION_KEY"

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
#: The reader of the output went away: 128 + SIGPIPE, as a shell reports such a tool.
EXIT_BROKEN_PIPE = 141


class CliError(Exception):
    """A runtime problem the command explains in one line (exit code 1)."""


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine on a new event loop."""
    return asyncio.run(coro)
