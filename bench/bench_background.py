"""Background runs at scale: 1, 2 and 4 `criogen-graph worker` processes on one
PostgreSQL, N submitted two-turn runs (model -> a tool sleeping 50 ms -> model), and a
round where one of the workers is SIGKILLed half-way.

Not part of the test suite (minutes, not seconds). Run from the repository root:

    .venv/bin/python bench/bench_background.py                 # 2,000 runs, 1/2/4 workers + kill
    .venv/bin/python bench/bench_background.py --runs 200 --workers 1 --no-kill

Reports per round: runs/s (first submit to last finish), p50 / p99 queue wait (submit to
first start), runs lost (not succeeded), tool executions duplicated, the workers' CPU
time per run, the database's transactions per run (each statement outside a transaction
is one: statements per run, the submitter's and the bench's polling included), and for
the kill round the time until the dead worker's runs were started
again and finished. Each round uses a fresh schema, dropped after.

The floor rows (`--floor`, on by default) run the same number of bare procrastinate jobs,
each sleeping the same 50 ms, with the same worker count and concurrency and a lock per
job (as each run has its thread's): what the queue alone costs, for the runs/s of the
criogen rows to be read against.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PG_URL = os.environ.get("CRIOGEN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (from /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


FLOOR_TASK = "criogen_bench.floor_nap"


def _floor_app(url: str) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name=FLOOR_TASK, queue="floor")
    async def floor_nap() -> None:
        await asyncio.sleep(0.05)  # the tool's 50 ms

    return app


def _floor_worker(url: str, concurrency: int) -> None:
    """A bare procrastinate worker (the floor rows' worker process)."""

    async def serve() -> None:
        app = _floor_app(url)
        async with app.open_async():
            await app.run_worker_async(
                queues=["floor"], concurrency=concurrency, install_signal_handlers=True
            )

    asyncio.run(serve())


class FloorRound:
    """N bare procrastinate jobs sleeping 50 ms, on `workers` worker processes."""

    def __init__(self, workers: int, runs: int, args: argparse.Namespace) -> None:
        self.workers = workers
        self.runs = runs
        self.args = args
        self.schema = f"criogen_floor_{uuid.uuid4().hex[:10]}"
        sep = "&" if "?" in PG_URL else "?"
        self.url = f"{PG_URL}{sep}options=-csearch_path%3D{self.schema}"
        self.procs: list[subprocess.Popen[bytes]] = []

    def start_workers(self) -> None:
        import psycopg

        command = [sys.executable, __file__, "--floor-worker", self.url]
        for _ in range(self.workers):
            self.procs.append(
                subprocess.Popen([*command, "--concurrency", str(self.args.concurrency)], cwd=ROOT)
            )
        with psycopg.connect(self.url, autocommit=True) as conn:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                row = conn.execute("SELECT count(*) FROM procrastinate_workers").fetchone()
                if row and row[0] >= self.workers:
                    return
                time.sleep(0.1)
        raise RuntimeError("floor workers did not start")

    async def run(self) -> dict[str, Any]:
        import psycopg
        from procrastinate.schema import SchemaManager

        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{self.schema}"')
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                conn.execute(SchemaManager.get_schema())
            self.start_workers()
            tx0 = _transactions(self.url)
            cpu0 = sum(_cpu_s(p.pid) for p in self.procs)
            app = _floor_app(self.url)
            async with app.open_async():
                gate = asyncio.Semaphore(16)

                async def submit(i: int) -> None:
                    async with gate:
                        await app.configure_task(FLOOR_TASK, lock=f"floor:{i}").defer_async()

                await asyncio.gather(*(submit(i) for i in range(self.runs)))
            with psycopg.connect(self.url, autocommit=True) as conn:
                while True:
                    row = conn.execute(
                        "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
                    ).fetchone()
                    if row and row[0] >= self.runs:
                        break
                    await asyncio.sleep(0.2)
                cpu = sum(_cpu_s(p.pid) for p in self.procs) - cpu0
                tx = _transactions(self.url) - tx0
                span = conn.execute(
                    "SELECT extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded')"
                    " - min(at) FILTER (WHERE type = 'deferred')) FROM procrastinate_events"
                ).fetchone()
            assert span is not None
            return {
                "floor": "bare procrastinate",
                "workers": self.workers,
                "runs": self.runs,
                "concurrency_per_worker": self.args.concurrency,
                "runs_per_s": round(self.runs / float(span[0]), 1),
                "worker_cpu_ms_per_run": round(cpu * 1000 / self.runs, 2),
                "db_transactions_per_run": round(tx / self.runs, 1),
            }
        finally:
            for proc in self.procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in self.procs:
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            with psycopg.connect(PG_URL, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{self.schema}" CASCADE')


def _transactions(url: str) -> int:
    """Transactions committed or rolled back in the database so far (every statement
    sent outside a transaction is one; a pipeline is one per sync). Read once the
    statistics are flushed: an idle backend flushes its own within 10 s (the heartbeats
    meanwhile add a few per worker, a small error over a round)."""
    import psycopg

    time.sleep(10.5)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database"
            " WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


def _machine() -> dict[str, Any]:
    import psycopg

    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    with psycopg.connect(PG_URL) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "postgres": row[0] if row else "?",
        "load_avg_at_start": os.getloadavg(),
    }


class Round:
    def __init__(self, workers: int, runs: int, args: argparse.Namespace) -> None:
        self.workers = workers
        self.runs = runs
        self.args = args
        self.schema = f"criogen_bench_{uuid.uuid4().hex[:10]}"
        sep = "&" if "?" in PG_URL else "?"
        self.url = f"{PG_URL}{sep}options=-csearch_path%3D{self.schema}"
        self.workdir = Path(tempfile.mkdtemp(prefix="criogen-bench-bg-"))
        self.procs: list[subprocess.Popen[bytes]] = []

    def start_worker(self) -> subprocess.Popen[bytes]:
        env = {**os.environ, "CRIOGEN_BG_WORKDIR": str(self.workdir), "PYTHONPATH": str(ROOT)}
        log = open(self.workdir / f"worker-{len(self.procs)}.log", "wb")  # noqa: SIM115
        profile: list[str] = []
        if self.args.profile:
            # cProfile writes its stats when the worker stops (SIGTERM: a graceful stop).
            out = Path(self.args.profile) / f"worker-{self.workers}w-{len(self.procs)}.prof"
            profile = ["-m", "cProfile", "-o", str(out)]
        proc = subprocess.Popen(
            [
                sys.executable,
                *profile,
                "-m",
                "criogen_graph",
                "worker",
                "--agent",
                "tests.reliability._background_agents:agent",
                "--storage",
                self.url,
                "--concurrency",
                str(self.args.concurrency),
                "--heartbeat",
                str(self.args.heartbeat),
                "--stalled-after",
                str(self.args.stalled_after),
            ],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def wait_registered(self) -> None:
        import psycopg

        deadline = time.monotonic() + 120
        with psycopg.connect(self.url, autocommit=True) as conn:
            while time.monotonic() < deadline:
                ready = conn.execute("SELECT to_regclass('procrastinate_workers')").fetchone()
                if ready and ready[0]:
                    row = conn.execute("SELECT count(*) FROM procrastinate_workers").fetchone()
                    if row and row[0] >= len(self.procs):
                        return
                time.sleep(0.1)
        raise RuntimeError("workers did not start")

    async def run(self, kill: bool) -> dict[str, Any]:
        import psycopg

        from criogen_graph import Storage, close_runs
        from tests.reliability import _background_agents as bg

        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{self.schema}"')
        try:
            for _ in range(self.workers):
                self.start_worker()
            self.wait_registered()
            async with Storage(self.url) as storage:
                agent = bg.make_agent(storage)
                gate = asyncio.Semaphore(16)

                async def submit(i: int) -> str:
                    async with gate:
                        return (await agent.thread(f"bench-{i}").submit("nap")).id

                tx0 = _transactions(self.url)
                cpu0 = sum(_cpu_s(p.pid) for p in self.procs)
                t0 = time.monotonic()
                ids = await asyncio.gather(*(submit(i) for i in range(self.runs)))
                submitted_s = time.monotonic() - t0
                kill_info: dict[str, Any] = {}
                with psycopg.connect(self.url, autocommit=True) as conn:
                    killed = False
                    while True:
                        counts = dict(
                            conn.execute(
                                "SELECT status, count(*) FROM criogen_runs GROUP BY status"
                            ).fetchall()
                        )
                        finished = sum(
                            counts.get(s, 0) for s in ("succeeded", "failed", "cancelled")
                        )
                        if kill and not killed and finished >= self.runs // 2:
                            victim = self.procs[0]
                            victim.send_signal(signal.SIGKILL)
                            victim.wait()
                            killed_at = time.time()
                            killed = True
                            in_flight = [
                                r[0]
                                for r in conn.execute(
                                    "SELECT id FROM criogen_runs WHERE status = 'running'"
                                    " AND worker LIKE %s",
                                    (f"%:{victim.pid}",),
                                ).fetchall()
                            ]
                            kill_info = {
                                "killed_pid": victim.pid,
                                "killed_after_finished": finished,
                                "in_flight_on_killed_worker": len(in_flight),
                                "_ids": in_flight,
                                "_at": killed_at,
                            }
                        if finished >= self.runs:
                            cpu = sum(_cpu_s(p.pid) for p in self.procs if p.poll() is None)
                            tx = _transactions(self.url) - tx0
                            break
                        await asyncio.sleep(0.2)
                    rows = conn.execute(
                        "SELECT id, status, attempts, worker,"
                        " extract(epoch FROM submitted_at), extract(epoch FROM first_started_at),"
                        " extract(epoch FROM started_at), extract(epoch FROM finished_at)"
                        " FROM criogen_runs"
                    ).fetchall()
                await close_runs(storage)
            by_id = {r[0]: r for r in rows}
            lost = sum(1 for i in ids if i not in by_id or by_id[i][1] != "succeeded")
            waits = [float(r[5] - r[4]) * 1000 for r in rows if r[5] is not None]
            first_submit = min(float(r[4]) for r in rows)
            last_finish = max(float(r[7]) for r in rows if r[7] is not None)
            ledger = bg.ledger(self.workdir)
            per_call = Counter((e[1], e[2]) for e in ledger if e[0] == "nap")
            duplicated = [k for k, n in per_call.items() if n > 1]
            result: dict[str, Any] = {
                "workers": self.workers,
                "runs": self.runs,
                "concurrency_per_worker": self.args.concurrency,
                "submit_s": round(submitted_s, 2),
                "runs_per_s": round(self.runs / (last_finish - first_submit), 1),
                "queue_wait_p50_ms": round(_pct(waits, 50), 1),
                "queue_wait_p99_ms": round(_pct(waits, 99), 1),
                "lost": lost,
                "tool_executions": sum(per_call.values()),
                "tools_run_twice": len(duplicated),
                "runs_taken_over": sum(1 for r in rows if r[2] > 1),
            }
            if not kill_info:
                result["worker_cpu_ms_per_run"] = round((cpu - cpu0) * 1000 / self.runs, 2)
                result["db_transactions_per_run"] = round(tx / self.runs, 1)
            if kill_info:
                again = [by_id[i] for i in kill_info.pop("_ids") if i in by_id]
                at = kill_info.pop("_at")
                restarts = [float(r[6]) for r in again if r[6] is not None]
                finishes = [float(r[7]) for r in again if r[7] is not None]
                kill_info["restarted_within_s"] = round(max(restarts) - at, 2) if restarts else None
                kill_info["finished_within_s"] = round(max(finishes) - at, 2) if finishes else None
                # A tool run twice must be one that was running on the killed worker.
                victim_calls = {
                    (e[1], e[2])
                    for e in ledger
                    if e[0] == "nap" and e[4] == str(kill_info["killed_pid"])
                }
                kill_info["tools_run_twice_not_in_flight"] = sum(
                    1 for k in duplicated if k not in victim_calls
                )
                result["kill"] = kill_info
            return result
        finally:
            for proc in self.procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in self.procs:
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            with psycopg.connect(PG_URL, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{self.schema}" CASCADE')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--workers", default="1,2,4", help="worker counts, comma-separated")
    parser.add_argument("--concurrency", type=int, default=8, help="runs at once per worker")
    parser.add_argument("--heartbeat", type=float, default=1.0)
    parser.add_argument("--stalled-after", type=float, default=5.0)
    parser.add_argument("--kill-workers", type=int, default=2, help="workers in the kill round")
    parser.add_argument("--no-kill", action="store_true")
    parser.add_argument("--json", metavar="FILE", help="also write the results here")
    parser.add_argument("--no-floor", action="store_true", help="skip the bare procrastinate rows")
    parser.add_argument(
        "--profile", metavar="DIR", help="run the criogen workers under cProfile, stats here"
    )
    parser.add_argument("--floor-worker", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_worker:
        _floor_worker(args.floor_worker, args.concurrency)
        return
    out: dict[str, Any] = {
        "machine": _machine(),
        "heartbeat_s": args.heartbeat,
        "stalled_after_s": args.stalled_after,
        "rounds": [],
    }
    plan = [(int(n), False) for n in args.workers.split(",")]
    if not args.no_kill:
        plan.append((args.kill_workers, True))
    for n, kill in plan:
        result = asyncio.run(Round(n, args.runs, args).run(kill))
        print(json.dumps(result), flush=True)
        out["rounds"].append(result)
        if not kill and not args.no_floor:
            floor = asyncio.run(FloorRound(n, args.runs, args).run())
            floor["criogen_over_floor"] = round(result["runs_per_s"] / floor["runs_per_s"], 2)
            print(json.dumps(floor), flush=True)
            out["rounds"].append(floor)
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
