"""The whole benchmark suite in one command, summed up in one table.

Runs every script of `bench/` in turn (each measures our runtime and its baseline side by
side in one process, in interleaved blocks), collects their `--json` results and prints
one table: measure, criogen_graph, baseline, ratio, target. Each script's own detailed
output is kept in the log directory.

    python bench/run.py                 # full settings (about 35 minutes on 2 cores)
    python bench/run.py --quick         # smaller samples (about 12 minutes)
    python bench/run.py --no-pg         # skip PostgreSQL
    python bench/run.py --markdown out.md --only peers,storage

Baselines: LangChain's `create_agent` with LangGraph's own savers everywhere; the OpenAI
Agents SDK and Pydantic AI too when installed (`pip install -e ".[dev,bench]"`).
PostgreSQL comes from `CRIOGEN_TEST_POSTGRES_URL` (default the local test server).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

# script: (full settings, quick settings)
SCRIPTS: dict[str, tuple[list[str], list[str]]] = {
    "peers": ([], ["--quick"]),
    "storage": ([], ["--blocks", "3", "--runs", "12", "--warmup", "10"]),
    "scale": ([], ["--rounds", "1"]),
    "fresh": ([], ["--samples", "3"]),
    "cold": ([], ["--threads", "2", "--blocks", "2", "--runs", "3"]),
    # Its per-turn figures repeat bench_peers'; the table takes its import times.
    "core": (
        ["--blocks", "4", "--runs", "20"],
        ["--blocks", "2", "--runs", "10", "--imports", "5"],
    ),
    "observe": ([], ["--blocks", "4", "--runs", "40", "--warmup", "40"]),
    "providers": ([], ["--blocks", "4", "--runs", "40", "--warmup", "20"]),
    # Issue 21's measures: PostgreSQL a hop away, equal durability, many workers.
    "pg_latency": ([], ["--blocks", "3", "--runs", "10", "--count", "20"]),
    "storage_full": (
        ["--synchronous", "full", "--no-pg", "--growth", "0"],
        ["--synchronous", "full", "--no-pg", "--growth", "0", "--blocks", "3", "--runs", "12"],
    ),
    "fsync": ([], ["--sends", "20"]),
    "scale_workers": (
        ["--workers", "2", "--threads", "10000"],
        ["--workers", "2", "--threads", "2000"],
    ),
    "search": ([], ["--docs", "20000", "--queries", "100"]),
    "search_vectors": (["--vectors"], ["--vectors", "--docs", "5000", "--queries", "100"]),
    # Issue 34: a thread of 2,000 user messages under a ContextPolicy.
    "context": ([], ["--turns", "500"]),
}
#: Entries of `SCRIPTS` that run another entry's script with other settings.
SCRIPT_OF = {"storage_full": "storage", "scale_workers": "scale", "search_vectors": "search"}
USES_PG = {"storage", "scale", "cold"}
#: Entries that measure PostgreSQL only (left out by --no-pg).
PG_ONLY = {"pg_latency", "scale_workers", "search_vectors"}
USES_PG = USES_PG | {"search"}


@dataclass
class Row:
    measure: str
    ours: str
    baseline: str
    ratio: float | None
    target: str = ""
    ok: bool | None = None


def ms(v: float) -> str:
    return f"{v:.2f} ms"


def ratio_row(
    measure: str, ours: float, base: float, fmt: Callable[[float], str], target: float | None
) -> Row:
    r = ours / base
    return Row(
        measure,
        fmt(ours),
        fmt(base),
        r,
        f"<= {target:.2f}" if target is not None else "",
        (r <= target) if target is not None else None,
    )


def rows_peers(d: dict[str, Any]) -> list[Row]:
    t = d["ms_per_turn"]
    out: list[Row] = []
    pairs = [
        ("per turn, no storage: `agent.run` vs `create_agent`", "criogen_graph agent.run",
         "langchain create_agent", 0.70),
        ("per turn, in memory: `thread.send` memory:// vs `create_agent` + `InMemorySaver`",
         "criogen_graph thread.send memory://", "langchain create_agent + InMemorySaver", 0.70),
        ("per turn, streamed: `thread.stream` memory:// vs `create_agent` `astream(messages)`",
         "criogen_graph thread.stream memory://",
         "langchain create_agent astream(messages) + InMemorySaver", None),
        ("per turn: `agent.run` vs OpenAI Agents SDK `Runner.run`", "criogen_graph agent.run",
         "openai-agents Runner.run", None),
        ("per turn, streamed: `thread.stream` vs OpenAI Agents SDK `run_streamed`",
         "criogen_graph thread.stream memory://", "openai-agents run_streamed (drained)", None),
        ("per turn: `agent.run` vs Pydantic AI `agent.run`", "criogen_graph agent.run",
         "pydantic-ai agent.run", None),
        ("per turn, streamed: `thread.stream` vs Pydantic AI `run_stream_events`",
         "criogen_graph thread.stream memory://", "pydantic-ai run_stream_events (drained)", None),
    ]  # fmt: skip
    for measure, ours, base, target in pairs:
        if ours in t and base in t:
            out.append(ratio_row(measure, t[ours], t[base], ms, target))
        else:
            out.append(Row(measure, "", "not installed", None))
    return out


def rows_storage(d: dict[str, Any]) -> list[Row]:
    t = d["ms_per_turn"]
    ours = t["ours sqlite (thread.send)"]
    out = [
        ratio_row("per turn, SQLite: `thread.send` vs `create_agent` + `SqliteSaver`", ours,
                  t["create_agent SqliteSaver (invoke)"], ms, 0.60),
        ratio_row("per turn, SQLite: `thread.send` vs `create_agent` + `AsyncSqliteSaver`", ours,
                  t["create_agent AsyncSqliteSaver (ainvoke)"], ms, 0.60),
    ]  # fmt: skip
    if "ours postgres (thread.send)" in t:
        out.append(
            ratio_row(
                "per turn, PostgreSQL: `thread.send` vs `create_agent` + `AsyncPostgresSaver`",
                t["ours postgres (thread.send)"],
                t["create_agent AsyncPostgresSaver"],
                ms,
                0.70,
            )
        )
    out.append(
        ratio_row("per turn, SQLite: `thread.stream` vs `thread.send` (ours both)",
                  t["ours sqlite (thread.stream)"], ours, ms, 1.30)
    )  # fmt: skip
    g = d.get("growth")
    if g:
        mb = g["db_mb"]
        out.append(
            Row(
                f"checkpoint growth: SQLite file after {g['user_messages']} user messages "
                f"({g['transcript_messages']} transcript messages)",
                f"{mb:.1f} MB",
                "",
                None,
                "<= 5 MB",
                mb <= 5,
            )
        )
        out.append(
            ratio_row("checkpoint growth: last 10 vs first 10 turns of that thread (ours)",
                      g["last10_ms_per_turn"], g["first10_ms_per_turn"], ms, 1.5)
        )  # fmt: skip
    return out


def rows_storage_full(d: dict[str, Any]) -> list[Row]:
    t = d["ms_per_turn"]
    ours = t["ours sqlite (thread.send)"]
    return [
        ratio_row("per turn, SQLite WAL + FULL (both): `thread.send` vs `create_agent` + "
                  "`SqliteSaver`", ours, t["create_agent SqliteSaver (invoke)"], ms, 0.60),
        ratio_row("per turn, SQLite WAL + FULL (both): `thread.send` vs `create_agent` + "
                  "`AsyncSqliteSaver`", ours, t["create_agent AsyncSqliteSaver (ainvoke)"], ms,
                  0.60),
    ]  # fmt: skip


def rows_fsync(d: dict[str, Any]) -> list[Row]:
    n = d["fsyncs_per_send"]
    return [
        ratio_row("disk flushes per send (two turns), SQLite `synchronous=full`, counted by "
                  "strace: vs `create_agent` + `AsyncSqliteSaver`", n["ours"], n["async"],
                  lambda v: f"{v:.2f}", None),
    ]  # fmt: skip


def rows_pg_latency(d: dict[str, Any]) -> list[Row]:
    ours_name, base_name = "criogen_graph thread.send", "create_agent + AsyncPostgresSaver"
    counted = d["round_trips_per_send_counted"]
    out = [
        Row(
            "PostgreSQL round trips per send (two turns), counted by a proxy",
            f"{counted[ours_name]:.2f}",
            f"{counted[base_name]:.2f}",
            counted[ours_name] / counted[base_name],
            "<= 6",
            counted[ours_name] <= 6,
        )
    ]
    for delay, v in d["per_delay"].items():
        per = v["ms_per_send"]
        target = 0.40 if float(delay) == 1.0 else None
        out.append(
            ratio_row(
                f"per turn, PostgreSQL {float(delay):g} ms away each way: `thread.send` vs "
                "`create_agent` + `AsyncPostgresSaver`",
                per[ours_name] / 2,
                per[base_name] / 2,
                ms,
                target,
            )
        )
    return out


def rows_scale_workers(d: dict[str, Any]) -> list[Row]:
    ours = d["criogen_graph thread.send"]
    base = d["create_agent + AsyncPostgresSaver"]
    label = f"{d['threads']:,} threads, one send each, {d['workers']} workers on one PostgreSQL"
    return [
        ratio_row(f"{label}: wall time", ours["wall_s"], base["wall_s"],
                  lambda v: f"{v:.1f} s", None),
        Row(f"{label}: errors", str(ours["errors"]), str(base["errors"]), None, "0",
            ours["errors"] == 0),
        ratio_row(f"{label}: p99 per send", ours["send_p99_ms"], base["send_p99_ms"],
                  lambda v: f"{v:.0f} ms", None),
    ]  # fmt: skip


def rows_search(d: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    for key, name in (("sqlite", "SQLite FTS5"), ("postgres", "PostgreSQL full text")):
        if key not in d:
            continue
        v = d[key]
        ok = v["query_p50_ms"] <= 20 and v["query_p99_ms"] <= 100
        out.append(
            Row(f"keyword search, {v['docs']:,} documents, {name}: query p50 / p99",
                f"{v['query_p50_ms']:.1f} / {v['query_p99_ms']:.1f} ms", "", None,
                "<= 20 / 100 ms", ok)
        )  # fmt: skip
        for load, label, target in (
            ("20_searches_per_s", "20 searches arriving per second", 1.1),
            ("1_in_flight", "one search always in flight", None),
            ("2_in_flight", "two searches always in flight", None),
        ):
            r = v[f"agent_turn_ratio_{load}"]
            out.append(
                Row(f"an agent turn with {label} ({name}, same process) vs alone",
                    f"{v['agent_ms_per_turn_alone'] * r:.2f} ms",
                    f"{v['agent_ms_per_turn_alone']:.2f} ms", r,
                    f"<= {target:.2f}" if target else "", (r <= target) if target else None)
            )  # fmt: skip
    return out


def rows_search_vectors(d: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    for key, v in d["vectors"].items():
        if not isinstance(v, dict) or "query_p50_ms" not in v:
            continue
        what = "random unit vectors" if key.startswith("random") else "MiniLM embeddings"
        ok = v["query_p50_ms"] <= 20 and v["query_p99_ms"] <= 100
        out.append(
            Row(f"vector search (pgvector), {v['docs']:,} documents, {what}: query p50 / p99 "
                f"(recall@5 {v['recall_at_5']:.2f})",
                f"{v['query_p50_ms']:.1f} / {v['query_p99_ms']:.1f} ms", "", None,
                "<= 20 / 100 ms", ok)
        )  # fmt: skip
    return out


def rows_scale(d: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    n = d.get("n", 1000)
    for key, label, ours, base, target in (
        ("concurrent_runs", f"{n:,} concurrent `agent.run` vs `create_agent.ainvoke`",
         "criogen_graph agent.run", "create_agent ainvoke", 0.70),
        ("concurrent_threads_sqlite", f"{n:,} concurrent threads, SQLite",
         "criogen_graph thread.send (SQLite)", "create_agent + AsyncSqliteSaver", None),
        ("concurrent_threads_postgres", f"{n:,} concurrent threads, PostgreSQL",
         "criogen_graph thread.send (PostgreSQL)", "create_agent + AsyncPostgresSaver", None),
    ):  # fmt: skip
        if key not in d:
            continue
        s = d[key]
        out.append(
            ratio_row(f"{label}: wall time", s[ours]["wall_s"], s[base]["wall_s"],
                      lambda v: f"{v:.2f} s", target)
        )  # fmt: skip
        out.append(
            ratio_row(f"{label}: peak memory", s[ours]["peak_mb"], s[base]["peak_mb"],
                      lambda v: f"{v:.0f} MB", None)
        )  # fmt: skip
    idle = d["idle_mb_per_1000_threads"]
    for label, ours, base in (
        ("SQLite", "criogen_graph SQLite", "create_agent + AsyncSqliteSaver"),
        ("in memory", "criogen_graph memory://", "create_agent + InMemorySaver"),
    ):
        if ours in idle and base in idle:
            for key, what in (("first", "first 1,000"), ("further", "each further 1,000")):
                out.append(
                    Row(
                        f"memory held by idle threads, {label}: {what}",
                        f"{idle[ours][key]:.1f} MB",
                        f"{idle[base][key]:.1f} MB",
                        None,
                    )
                )
    return out


def rows_fresh(d: dict[str, Any]) -> list[Row]:
    m = d["median_ms"]

    def fmt(v: float) -> str:
        return f"{v:.0f} ms"

    return [
        ratio_row("fresh process: import", m["ours"]["import_ms"],
                  m["create_agent"]["import_ms"], fmt, None),
        ratio_row("fresh process: import + first answer, no storage", m["ours"]["total_ms"],
                  m["create_agent"]["total_ms"], fmt, None),
        ratio_row("fresh process: import + first answer, SQLite", m["ours SQLite"]["total_ms"],
                  m["create_agent SQLite"]["total_ms"], fmt, None),
    ]  # fmt: skip


def rows_cold(d: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    for backend, label, saver in (
        ("sqlite", "SQLite", "AsyncSqliteSaver"),
        ("postgres", "PostgreSQL", "AsyncPostgresSaver"),
    ):
        if backend not in d:
            continue
        r = d[backend]
        t = r["ms_per_turn"]
        n = r["long_thread_user_messages"][0]
        # Targets: picking up a long thread costs at most twice a new one (its transcript,
        # ~1 MB here, is read back: the latest snapshot and the writes since; replaying
        # every write since the thread began costs 2.5-4x on SQLite); PostgreSQL reads it
        # over the socket, 1.1-1.8x measured on a shared server, so 2.5 there. Our turn
        # keeps the baseline margins of the warm per-turn rows. PostgreSQL with a fresh
        # `Storage` per message has no target: opening one (a pool, the lock session, the
        # tables checked) costs several times `AsyncPostgresSaver.from_conn_string` and
        # swamps the rest; see docs/benchmarks.md.
        first_target = {"sqlite": 2.00, "postgres": None}[backend]
        fresh_target = {"sqlite": 0.60, "postgres": None}[backend]
        workers_first_target = {"sqlite": 2.00, "postgres": 2.50}[backend]
        out += [
            ratio_row(f"cold long thread ({n} user messages), fresh `Storage` per message, "
                      f"{label}: vs its first turns (ours)",
                      t["ours long, fresh storage"], t["ours first turns, fresh storage"],
                      ms, first_target),
            ratio_row(f"cold long thread, fresh `Storage` per message, {label}: vs "
                      f"`create_agent` + `{saver}` (fresh per message)",
                      t["ours long, fresh storage"], t["baseline long, fresh saver"],
                      ms, fresh_target),
            ratio_row(f"cold long thread, two workers in turn, {label}: vs its first turns "
                      "(ours)",
                      t["ours long, two workers"], t["ours first turns, two workers"], ms,
                      workers_first_target),
            ratio_row(f"cold long thread, two workers in turn, {label}: vs `create_agent` + "
                      f"`{saver}`",
                      t["ours long, two workers"], t["baseline long, two workers"], ms,
                      {"sqlite": 0.60, "postgres": 0.70}[backend]),
        ]  # fmt: skip
    return out


def rows_core(d: dict[str, Any]) -> list[Row]:
    imp = d["import_ms"]

    def fmt(v: float) -> str:
        return f"{v:.0f} ms"

    return [
        ratio_row("import `criogen_graph` vs `from langgraph.graph import StateGraph`",
                  imp["criogen_graph"], imp["langgraph (graph API)"], fmt, 1.10),
        ratio_row("import `criogen_graph` vs `import langchain.agents`",
                  imp["criogen_graph"], imp["langchain.agents"], fmt, None),
    ]  # fmt: skip


def rows_observe(d: dict[str, Any]) -> list[Row]:
    t = d["ms_per_turn"]
    return [
        ratio_row("per turn with telemetry (OTLP to loopback) vs without (ours both)",
                  t["telemetry"], t["off"], ms, 1.20),
        ratio_row("per turn with `Redactor.pii()` vs without (ours both)",
                  t["redactor (pii built-ins)"], t["off"], ms, 1.15),
    ]  # fmt: skip


def rows_providers(d: dict[str, Any]) -> list[Row]:
    t = d["ms_per_call"]
    return [
        ratio_row("per call, OpenAI adapter vs `openai` SDK, non-streamed (loopback)",
                  t["ours non-streamed"], t["openai SDK non-streamed"], ms, 1.00),
        ratio_row("per call, OpenAI adapter vs `openai` SDK, streamed (loopback)",
                  t["ours streamed"], t["openai SDK streamed"], ms, 1.00),
    ]  # fmt: skip


def rows_context(d: dict[str, Any]) -> list[Row]:
    ours, lc = d["criogen_graph"], d["langchain"]
    n, budget, keep = d["turns"], d["budget"], d["keep_last"]
    tok, lc_tok = ours["tokens_per_turn"], lc["tokens_per_turn"]
    side, lc_side = ours["interleaved_ms_per_turn"], lc["interleaved_ms_per_turn"]
    count = lambda v: f"{v:,.0f}"  # noqa: E731
    return [
        Row(f"long thread ({n:,} user messages of ~2 KB, SQLite, budget {budget:,} tokens): "
            "tokens sent per turn after the first summary, max / median, vs `create_agent` + "
            "`SummarizationMiddleware`",
            f"{tok['max_after_first_compaction']:,} / {tok['median_after_first_compaction']:,}",
            f"{lc_tok['max_after_first_compaction']:,} / "
            f"{lc_tok['median_after_first_compaction']:,}",
            tok["max_after_first_compaction"] / lc_tok["max_after_first_compaction"],
            f"<= {budget:,}", tok["over_budget_after_first_compaction"] == 0),
        Row(f"long thread: summary calls (keep_last {keep})", count(ours["summary_calls"]),
            count(lc["summary_calls"]), ours["summary_calls"] / max(1, lc["summary_calls"]),
            f"<= {2 * n // keep:,}", ours["summary_calls"] <= 2 * n // keep),
        Row(f"long thread: per turn at message {n:,} vs at message 100 (ours, interleaved)",
            ms(side["at_end"]), ms(side["at_100"]), side["ratio"], "<= 1.30",
            side["ratio"] <= 1.30),
        ratio_row(f"long thread: per turn at message {n:,} vs `create_agent` + "
                  "`SummarizationMiddleware` + `AsyncSqliteSaver` (interleaved)",
                  side["at_end"], lc_side["at_end"], ms, None),
    ]  # fmt: skip


ROWS: dict[str, Callable[[dict[str, Any]], list[Row]]] = {
    "peers": rows_peers,
    "storage": rows_storage,
    "scale": rows_scale,
    "fresh": rows_fresh,
    "cold": rows_cold,
    "core": rows_core,
    "observe": rows_observe,
    "providers": rows_providers,
    "pg_latency": rows_pg_latency,
    "storage_full": rows_storage_full,
    "fsync": rows_fsync,
    "scale_workers": rows_scale_workers,
    "search": rows_search,
    "search_vectors": rows_search_vectors,
    "context": rows_context,
}


def run_script(name: str, extra: list[str], logs: str) -> dict[str, Any]:
    out_json = os.path.join(logs, f"{name}.json")
    script = f"bench_{SCRIPT_OF.get(name, name)}.py"
    cmd = [sys.executable, os.path.join(HERE, script), *extra, "--json", out_json]
    t0 = time.perf_counter()
    print(f"[run] {' '.join(cmd[1:])}", flush=True)
    with open(os.path.join(logs, f"{name}.log"), "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False)
    took = time.perf_counter() - t0
    if proc.returncode:
        with open(os.path.join(logs, f"{name}.log")) as log:
            tail = log.read()[-3000:]
        raise SystemExit(f"{script} failed (exit {proc.returncode}):\n{tail}")
    print(f"[ok]  {script} {' '.join(extra)} in {took:.0f} s", flush=True)
    with open(out_json) as f:
        data: dict[str, Any] = json.load(f)
    return data


def verdict(row: Row) -> str:
    return "" if row.ok is None else ("yes" if row.ok else "NO")


def print_table(rows: list[Row]) -> None:
    w = max(len(r.measure) for r in rows)
    head = f"{'measure':{w}s} {'ours':>10s} {'baseline':>14s} {'ratio':>6s} {'target':>8s} met"
    print("\n" + head + "\n" + "-" * len(head))
    for r in rows:
        ratio = f"{r.ratio:.2f}" if r.ratio is not None else ""
        print(
            f"{r.measure:{w}s} {r.ours:>10s} {r.baseline:>14s} {ratio:>6s} {r.target:>8s} "
            f"{verdict(r)}"
        )


def markdown(rows: list[Row], machine: dict[str, Any]) -> str:
    lines = [
        f"Machine: {machine.get('cpus')} CPUs, {machine.get('platform')}, Python "
        f"{machine.get('python')}, langgraph {machine.get('langgraph')}, langchain "
        f"{machine.get('langchain')}.",
        "",
        "| measure | criogen_graph | baseline | ratio | target |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        ratio = f"{r.ratio:.2f}" if r.ratio is not None else ""
        target = r.target.replace("<=", "≤")
        lines.append(f"| {r.measure} | {r.ours} | {r.baseline} | {ratio} | {target} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="smaller samples, for a first look")
    ap.add_argument("--no-pg", action="store_true", help="skip the PostgreSQL measures")
    ap.add_argument("--only", default=None, help=f"comma-separated subset of {','.join(SCRIPTS)}")
    ap.add_argument("--logs", default=None, help="where each script's output goes")
    ap.add_argument("--markdown", default=None, help="also write the table as markdown here")
    ap.add_argument("--json", default=None, help="also write every script's numbers here")
    args = ap.parse_args()
    only = args.only.split(",") if args.only else list(SCRIPTS)
    unknown = set(only) - set(SCRIPTS)
    if unknown:
        ap.error(f"unknown script(s) {sorted(unknown)}; choose from {list(SCRIPTS)}")
    logs = args.logs or tempfile.mkdtemp(prefix="criogen-bench-")
    os.makedirs(logs, exist_ok=True)
    print(f"# logs: {logs}", flush=True)

    results: dict[str, Any] = {}
    rows: list[Row] = []
    for name in only:
        full, quick = SCRIPTS[name]
        extra = list(quick if args.quick else full)
        if args.no_pg and name in PG_ONLY:
            continue
        if args.no_pg and name in USES_PG:
            extra.append("--no-pg")
        results[name] = run_script(name, extra, logs)
        rows.extend(ROWS[name](results[name]))

    machine = next((r["machine"] for r in results.values() if "machine" in r), {})
    print("\n# machine:", json.dumps(machine))
    print_table(rows)
    missed = [r.measure for r in rows if r.ok is False]
    print(
        f"\ntargets met: {sum(r.ok is True for r in rows)} of {sum(r.ok is not None for r in rows)}"
    )
    for m in missed:
        print(f"  missed: {m}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(rows, machine))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
