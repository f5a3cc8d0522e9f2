"""`criogen-graph serve`: the agents over HTTP, the way LangGraph's clients expect
(`criogen_graph.serve`), with uvicorn."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from criogen_graph._cli.common import EXIT_OK, CliError
from criogen_graph._cli.loading import import_object, load_agent, safe_url, storage_url

__all__ = ["cmd_serve"]

LOOPBACK = "127.0.0.1"


def _auth(spec: str | None) -> Any:
    if spec is None:
        return None
    value = import_object(spec, "--auth")
    if not callable(value):
        raise CliError(f"--auth {spec}: expected a callable (headers -> identity)")
    return value


def cmd_serve(args: argparse.Namespace) -> int:
    """`criogen-graph serve`: serve until SIGINT or SIGTERM."""
    try:
        import uvicorn

        from criogen_graph.serve import create_app
    except ImportError as exc:
        raise CliError(
            f"serve needs the 'server' extra ({exc.name} is missing): "
            "pip install 'criogen-graph[server]'"
        ) from None
    from criogen_graph.storage import Storage

    agents = [load_agent(spec) for spec in args.agent]
    auth = _auth(args.auth)
    storage = Storage(storage_url(args.storage), on_busy="wait")
    host = args.host or (LOOPBACK if auth is None else "0.0.0.0")
    app = create_app(
        agents,
        storage=storage,
        auth=auth,
        cors=args.cors,
        workers=args.workers,
        heartbeat=args.heartbeat,
        start_timeout=args.start_timeout,
    )
    names = ", ".join(a.name for a in agents)
    where = f"http://{host}:{args.port}"
    note = ""
    if auth is None and args.host is None:
        note = " (loopback only: no --auth; pass --host to listen on other interfaces)"
    elif auth is None:
        note = " (no --auth: anyone who can reach it may use every thread)"
    if args.workers == "external":
        note += " (runs are executed by the criogen-graph worker processes of the storage)"
    print(
        f"criogen-graph serve: {names} on {safe_url(storage.url)} at {where}{note}",
        file=sys.stderr,
        flush=True,
    )
    config = uvicorn.Config(app, host=host, port=args.port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    try:
        server.run()
    finally:
        import asyncio

        asyncio.run(storage.close())
    return EXIT_OK
