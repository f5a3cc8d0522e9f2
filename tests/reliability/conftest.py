"""What the reliability tests share: a forkserver whose children start with the workers
module already imported (milliseconds each, not an interpreter's import time)."""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest


@pytest.fixture(scope="module")
def forkserver() -> Any:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["tests.reliability._workers"])
    return ctx


def run_child(ctx: Any, target: Any, *args: Any) -> Any:
    """Start `target(*args)` in a child of the forkserver `ctx`."""
    proc = ctx.Process(target=target, args=args)
    proc.start()
    return proc
