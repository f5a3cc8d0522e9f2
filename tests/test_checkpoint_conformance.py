"""LangGraph's own checkpointer conformance suite (`langgraph-checkpoint-conformance`) run
against every saver we ship — memory, SQLite, PostgreSQL, each with and without an
`encryption_key` — beside LangGraph's own saver for the same backend as the reference.

Ours must pass every check the reference passes on this machine, so a check that
LangGraph's saver fails too (an upstream change to the suite) is reported as such rather
than blamed on us, and a check that only ours fails is our bug."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from criogen_graph import Storage
from tests.conftest import PG_URL, require_postgres

conformance = pytest.importorskip(
    "langgraph.checkpoint.conformance",
    reason="langgraph-checkpoint-conformance is not installed (it is in the dev extra: "
    "pip install -e '.[dev]')",
)

Results = dict[str, tuple[bool, str | None]]


@contextlib.contextmanager
def pg_schema() -> Iterator[str]:
    """A PostgreSQL URL whose tables live in a schema of their own, dropped after (each
    storage decides its encryption once, so each run needs a fresh place)."""
    require_postgres()
    import psycopg

    schema = f"criogen_conf_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in PG_URL else "?"
    try:
        yield f"{PG_URL}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


#: What our savers refuse on purpose, with a `NotImplementedError` saying what to use
#: instead (tests/test_saver_methods.py): reported as not implemented, as LangGraph's own
#: savers' are.
NOT_OFFERED = {"copy_thread", "delete_for_runs"}


async def run_suite(
    name: str, factory: Callable[[], AsyncIterator[Any]], skip: set[str] | None = None
) -> Results:
    """Every check of the suite against savers made by `factory`: name -> (passed, error)."""
    results: Results = {}

    def on_result(capability: str, test: str, passed: bool, error: str | None) -> None:
        results[f"{capability}: {test}"] = (passed, error)

    registered = conformance.checkpointer_test(name=name, skip_capabilities=skip)(factory)
    progress = conformance.validate.__globals__["ProgressCallbacks"](on_test_result=on_result)
    report = await conformance.validate(registered, progress=progress)
    for capability, result in report.results.items():
        if not result.detected:
            results[f"{capability}: (not implemented)"] = (False, "capability not detected")
    return results


def reference_factory(backend: str, where: str) -> Callable[[], AsyncIterator[Any]]:
    """LangGraph's own saver for `backend`, on the same kind of place as ours."""

    async def factory() -> AsyncIterator[Any]:
        if backend == "memory":
            from langgraph.checkpoint.memory import InMemorySaver

            yield InMemorySaver()
        elif backend == "sqlite":
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            async with AsyncSqliteSaver.from_conn_string(where) as saver:
                yield saver
        else:
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

            async with AsyncPostgresSaver.from_conn_string(where) as saver:
                await saver.setup()
                yield saver

    return factory


def our_factory(url: str, key: str | None) -> Callable[[], AsyncIterator[Any]]:
    async def factory() -> AsyncIterator[Any]:
        storage = Storage(url, encryption_key=key)
        await storage.open()
        try:
            yield storage.checkpointer
        finally:
            await storage.close()

    return factory


def last_line(error: str | None) -> str:
    return (error or "").strip().splitlines()[-1:][0] if (error or "").strip() else ""


def compare(ours: Results, reference: Results) -> list[str]:
    """The checks the reference passes and ours does not (with ours' error)."""
    return [
        f"{check}: {last_line(ours.get(check, (False, 'not run'))[1])}"
        for check, (passed, _) in sorted(reference.items())
        if passed and not ours.get(check, (False, None))[0]
    ]


@pytest.mark.parametrize("key", [None, "conformance key"], ids=["plain", "encrypted"])
@pytest.mark.parametrize("backend", ["memory", "sqlite", "postgres"])
async def test_our_savers_pass_what_langgraphs_own_pass(
    backend: str, key: str | None, tmp_path: Path
) -> None:
    with contextlib.ExitStack() as stack:
        if backend == "memory":
            ours_url, ref_where = "memory://", ""
        elif backend == "sqlite":
            ours_url = f"sqlite:///{tmp_path}/ours.db"
            ref_where = str(tmp_path / "reference.db")
        else:
            ours_url = stack.enter_context(pg_schema())
            ref_where = stack.enter_context(pg_schema())
        reference = await run_suite(f"langgraph-{backend}", reference_factory(backend, ref_where))
        skip = NOT_OFFERED | ({"prune"} if backend != "postgres" else set())
        ours = await run_suite(f"criogen-{backend}", our_factory(ours_url, key), skip)

    passed_by_reference = [c for c, (ok, _) in reference.items() if ok]
    # The suite really ran: LangGraph's saver passes most of it on every backend.
    assert len(passed_by_reference) >= 50, reference
    missing = compare(ours, reference)
    assert not missing, "checks LangGraph's own saver passes and ours fails:\n" + "\n".join(missing)
    # What neither passes is an upstream matter; say which, so a reader sees it.
    both_fail = sorted(c for c, (ok, _) in reference.items() if not ok and not ours[c][0])
    if both_fail:
        print(f"checks LangGraph's own {backend} saver fails too: {both_fail}")
