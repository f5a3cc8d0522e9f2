"""`criogen-graph worker` (run the queued background runs of a PostgreSQL storage) and
`criogen-graph runs` (list, show and cancel them)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

from criogen_graph._cli.common import EXIT_OK, EXIT_USAGE, CliError, run
from criogen_graph._cli.loading import load_agent, pg_storage_url, safe_url

if TYPE_CHECKING:
    from criogen_graph.storage import Storage

__all__ = ["cmd_runs", "cmd_worker"]


def cmd_worker(args: argparse.Namespace) -> int:
    """`criogen-graph worker`: serve until SIGINT or SIGTERM."""
    import logging

    from criogen_graph.background import Worker

    agents = tuple(load_agent(spec) for spec in args.agent)
    storage = _worker_storage(args, agents)
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
    sealed = ", encrypted" if storage.encrypted else ""
    _say(
        f"worker {worker.name} serving {', '.join(sorted(worker.agents))} on "
        f"{safe_url(storage.url)}{sealed}"
    )

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        stopping = False

        def stop(signum: int) -> None:
            nonlocal stopping
            stopping = True
            _say(
                f"worker {worker.name} stopping ({signal.Signals(signum).name}): it takes "
                "no new run; the running ones finish first (send it again to stop at once)"
            )
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            task.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop, sig)
        try:
            await worker.run()
        except asyncio.CancelledError:
            if not stopping:
                raise
        finally:
            await storage.close()
        _say(f"worker {worker.name} stopped")

    run(serve())
    return EXIT_OK


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _worker_storage(args: argparse.Namespace, agents: tuple[Any, ...]) -> Storage:
    """The worker's storage: waiting for busy threads, sealed with the key in
    `--encryption-key-env`'s variable, else with the first agent's storage's key."""
    from criogen_graph.storage import Storage

    url = pg_storage_url(args.storage, agents)
    key = os.environ.get(args.encryption_key_env) if args.encryption_key_env else None
    if key:
        return Storage(url, on_busy="wait", encryption_key=key)
    if agents and agents[0].storage.encrypted:
        keyed: Storage = agents[0].storage.keyed_like(url, on_busy="wait")
        return keyed
    return Storage(url, on_busy="wait")


def cmd_runs(args: argparse.Namespace) -> int:
    """`criogen-graph runs ACTION`."""
    if args.runs_action is None:
        args.runs_parser.print_help()
        return EXIT_USAGE
    from criogen_graph.storage import Storage

    storage = Storage(pg_storage_url(getattr(args, "storage", None)))
    return run(_runs(args, storage))


async def _runs(args: argparse.Namespace, storage: Storage) -> int:
    from criogen_graph import background

    try:
        if args.runs_action == "list":
            return await _list_runs(args, storage)
        return await _one_run(args, storage)
    finally:
        await background.close_runs(storage)
        await storage.close()


async def _list_runs(args: argparse.Namespace, storage: Storage) -> int:
    from criogen_graph import background

    infos = await background.list_runs(
        storage, status=args.status, thread_id=args.thread, limit=args.limit
    )
    if args.json:
        print(json.dumps([i.to_dict() for i in infos], indent=2))
        return EXIT_OK
    if not infos:
        print("no background runs")
        return EXIT_OK
    id_w = max(3, *(len(i.id) for i in infos))
    thread_w = max(6, *(len(i.thread_id) for i in infos))
    worker_w = max(6, *(len(i.worker or "-") for i in infos))
    print(
        f"{'RUN':<{id_w}}  {'STATUS':<9}  {'ACTION':<7}  {'THREAD':<{thread_w}}  ATTEMPTS  "
        f"{'WORKER':<{worker_w}}  HEARTBEAT  ERROR"
    )
    for i in infos:
        error = f"{i.error_code}: {i.error}" if i.error else ""
        print(
            f"{i.id:<{id_w}}  {i.status:<9}  {i.action:<7}  {i.thread_id:<{thread_w}}  "
            f"{i.attempts:>8}  {i.worker or '-':<{worker_w}}  {_age(i.heartbeat_age_ms):>9}  "
            f"{error}".rstrip()
        )
    return EXIT_OK


def _age(ms: int | None) -> str:
    """A heartbeat's age (`-` when the run is not running on a worker)."""
    if ms is None:
        return "-"
    return f"{ms / 1000:.1f}s ago"


async def _one_run(args: argparse.Namespace, storage: Storage) -> int:
    """`runs show` and `runs cancel`."""
    from criogen_graph import background

    info = await background.get_run(storage, args.run_id)
    if info is None:
        raise CliError(f"no background run {args.run_id!r} in {safe_url(storage.url)}")
    if args.runs_action == "show":
        if args.json:
            print(json.dumps(info.to_dict(), indent=2))
            return EXIT_OK
        for key, value in info.to_dict().items():
            if value is not None:
                print(f"{key}: {value}")
        return EXIT_OK
    if await background.cancel_run(storage, args.run_id):
        print(f"cancelled {args.run_id}" if not args.json else json.dumps({"cancelled": True}))
        return EXIT_OK
    raise CliError(f"run {args.run_id} has ended ({info.status}); nothing to cancel")
