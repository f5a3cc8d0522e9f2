"""Disk flushes per `thread.send` on SQLite with `synchronous=full`, against `create_agent`
with `AsyncSqliteSaver` and `SqliteSaver` on the same setting: what a durable commit costs
is one `fsync` of the WAL, so on a real disk the flushes per send, not CPU, set the time
of a turn. Counted by `strace` (Debian's strace package) around a child process per side:
the flushes of N sends minus those of 0 sends (opening, setup and warm-up cancel out).
Deterministic, unlike timings on a busy machine.

    python bench/bench_fsync.py [--sends 40] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _common import lc_echo, machine, our_agent, scripted_chat_model  # noqa: E402

SIDES = {
    "ours": "criogen_graph thread.send (sqlite:///x.db?synchronous=full)",
    "async": "create_agent + AsyncSqliteSaver (PRAGMA synchronous=FULL)",
    "sync": "create_agent + SqliteSaver (PRAGMA synchronous=FULL)",
}


async def _child(side: str, sends: int) -> None:
    tmp = tempfile.mkdtemp()
    if side == "ours":
        from criogen_graph import Storage

        storage = Storage(f"sqlite:///{tmp}/ours.db?synchronous=full")
        await storage.open()
        agent = our_agent(storage)

        async def run() -> None:
            reply = await agent.thread(uuid.uuid4().hex).send("go")
            assert reply.text == "done"

    else:
        from langchain.agents import create_agent
        from langchain_core.messages import HumanMessage

        if side == "async":
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            acm = AsyncSqliteSaver.from_conn_string(f"{tmp}/lc.db")
            saver: Any = await acm.__aenter__()
            await saver.setup()
            async with saver.conn.execute("PRAGMA synchronous=FULL"):
                pass
        else:
            import sqlite3

            from langgraph.checkpoint.sqlite import SqliteSaver

            conn = sqlite3.connect(f"{tmp}/lc.db", check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            saver = SqliteSaver(conn)
            saver.setup()
            conn.execute("PRAGMA synchronous=FULL")
        graph = create_agent(scripted_chat_model(), [lc_echo()], checkpointer=saver)

        async def run() -> None:
            args = (
                {"messages": [HumanMessage("go")]},
                {"configurable": {"thread_id": uuid.uuid4().hex}},
            )
            out = await graph.ainvoke(*args) if side == "async" else graph.invoke(*args)
            assert out["messages"][-1].content == "done"

    for _ in range(3):  # warm-up: first-use work outside the count
        await run()
    for _ in range(sends):
        await run()


def _flushes(side: str, sends: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "trace")
        subprocess.run(
            ["strace", "-f", "-qq", "-e", "trace=fsync,fdatasync", "-o", out,
             sys.executable, __file__, "--child", side, "--sends", str(sends)],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        with open(out) as f:
            return sum(1 for line in f if "sync(" in line)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sends", type=int, default=40)
    ap.add_argument("--json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        asyncio.run(_child(args.child, args.sends))
        return
    if shutil.which("strace") is None:
        sys.exit("bench_fsync.py needs strace (apt-get install strace)")
    print(f"# machine: {json.dumps(machine())}")
    per_send = {}
    for side, label in SIDES.items():
        n = (_flushes(side, args.sends) - _flushes(side, 0)) / args.sends
        per_send[side] = n
        print(f"{label:62s} {n:5.2f} fsyncs per send")
    for side in ("async", "sync"):
        print(f"ratio ours / {side}: {per_send['ours'] / per_send[side]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sends": args.sends, "fsyncs_per_send": per_send}, f, indent=1)


if __name__ == "__main__":
    main()
