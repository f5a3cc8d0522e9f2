"""`criogen-graph worker` (run the queued background runs of a PostgreSQL storage) and
`criogen-graph runs` (list, show and cancel them)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from criogen_graph._cli.common import EXIT_OK, EXIT_USAGE, CliError, run
from criogen_graph._cli.loading import load_agent, pg_storage_url, safe_url

if TYPE_CHECKING:
    from criogen_graph.storage import Storage

__all__ = ["cmd_runs", "cmd_worker"]


def cmd_worker(args: argparse.Namespace) -> int:
    """`criogen-graph worker`: serve until SIGINT or SIGTERM."""
    import logging

    from criogen_graph.background import Worker
    from criogen_graph.storage import Storage

    agents = tuple(load_agent(spec) for spec in args.agent)
    storage = Storage(pg_storage_url(args.storage, agents), on_busy="wait")
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
        f"{safe_url(storage.url)}",
        file=sys.stderr,
        flush=True,
    )

    async def serve() -> None:
        try:
            await worker.run(install_signal_handlers=True)
        finally:
            await storage.close()

    run(serve())
    return EXIT_OK


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
    for i in infos:
        error = f"  {i.error_code}: {i.error}" if i.error else ""
        print(
            f"{i.id}  {i.status:<9}  {i.action:<7}  thread={i.thread_id}  "
            f"attempts={i.attempts}  worker={i.worker or '-'}{error}"
        )
    return EXIT_OK


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
