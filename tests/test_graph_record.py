"""The context graph's record in PostgreSQL: entities with aliases, assertions with two time
axes, a contradicting assertion closing (never deleting) the older one, "as of" reads on
both axes, extraction runs, the outbox written in the same transaction, organisations kept
apart."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from cortex_ray import InvalidRequestError
from cortex_ray.graph import GraphStore, Reader, Triple
from cortex_ray.storage import Database
from cortex_ray.storage._database import _alembic

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def owner(team: str, at: datetime, **kw: object) -> Triple:
    return Triple(
        subject_type="service",
        subject="billing-api",
        predicate="owned_by",
        object_type="team",
        object=team,
        functional=True,
        valid_from=at,
        **kw,  # type: ignore[arg-type]
    )


async def count(db: Database, sql: str, *params: object) -> int:
    async with db.connection() as conn:
        row = await (await conn.execute(sql, params)).fetchone()
    assert row is not None
    return int(next(iter(row.values())))


async def test_a_contradicting_assertion_closes_the_older_one_and_both_axes_read_as_of(
    db: Database, org: str
) -> None:
    graph = GraphStore(db)
    reader = Reader("alice")
    first = await graph.submit(
        org, [owner("payments", T0, subject_aliases=("Billing API",))], principal_id="alice"
    )
    assert (first.entities, first.assertions, first.closed) == (2, 1, 0)
    await asyncio.sleep(0.01)
    between = datetime.now(UTC)
    await asyncio.sleep(0.01)
    second = await graph.submit(
        org, [owner("platform", T0 + timedelta(days=30))], principal_id="bob"
    )
    assert (second.entities, second.assertions, second.closed) == (1, 1, 1)

    # Now: only the platform fact holds; the payments fact is still stored, closed.
    now = await graph.search(org, reader, terms=["billing api"])  # an alias finds it
    assert [f.object.name for f in now.facts] == ["platform"]
    assert [s.name for s in now.seeds] == ["billing-api"]
    assert now.seeds[0].aliases == ("Billing API",)
    history = await graph.facts(org, Reader("alice", valid_at=T0 + timedelta(days=60)))
    assert [f.object.name for f in history] == ["platform"]
    assert await count(db, "SELECT count(*) FROM graph_assertions WHERE org_id = %s", org) == 2
    closed = await count(
        db,
        "SELECT count(*) FROM graph_assertions WHERE org_id = %s AND valid_to = %s "
        "AND invalidated_at IS NOT NULL",
        org,
        T0 + timedelta(days=30),
    )
    assert closed == 1

    # Valid time: on day 10, payments owned it (as recorded now).
    then = await graph.facts(org, Reader("alice", valid_at=T0 + timedelta(days=10)))
    assert [f.object.name for f in then] == ["payments"]
    assert then[0].valid_to == T0 + timedelta(days=30)
    assert then[0].citation == "submitted by alice"

    # Record time: before the second submission the graph believed payments still owned it
    # on day 60, and had not recorded the platform fact at all.
    believed = await graph.facts(
        org, Reader("alice", valid_at=T0 + timedelta(days=60), known_at=between)
    )
    assert [(f.object.name, f.valid_to) for f in believed] == [("payments", None)]
    # ... and before anything was recorded, nothing.
    assert await graph.facts(org, Reader("alice", known_at=T0)) == []


async def test_a_late_fact_is_closed_by_the_later_one_already_known(db: Database, org: str) -> None:
    graph = GraphStore(db)
    await graph.submit(org, [owner("platform", T0 + timedelta(days=30))], principal_id="a")
    late = await graph.submit(org, [owner("payments", T0)], principal_id="a")
    assert late.closed == 1  # itself: it ended when platform took over
    facts = await graph.facts(org, Reader("a", valid_at=T0 + timedelta(days=1)))
    assert [(f.object.name, f.valid_to) for f in facts] == [("payments", T0 + timedelta(days=30))]
    now = await graph.facts(org, Reader("a"))
    assert [f.object.name for f in now] == ["platform"]


async def test_non_functional_predicates_accumulate_and_writes_are_idempotent(
    db: Database, org: str
) -> None:
    graph = GraphStore(db)
    triples = [
        Triple(subject_type="service", subject="api", predicate="depends_on",
               object_type="service", object=name, valid_from=T0)
        for name in ("db", "cache")
    ]  # fmt: skip
    assert (await graph.submit(org, triples, principal_id="a")).assertions == 2
    again = await graph.submit(org, triples, principal_id="a")
    assert (again.entities, again.assertions, again.closed) == (0, 0, 0)
    result = await graph.search(org, Reader("a"), terms=["API"])
    assert sorted(f.object.name for f in result.facts) == ["cache", "db"]
    runs = await count(
        db, "SELECT count(*) FROM graph_extraction_runs WHERE org_id = %s AND method = 'user'", org
    )
    assert runs == 2
    # Every new row queued its projection in the same transaction.
    queued = await count(db, "SELECT count(*) FROM graph_outbox WHERE org_id = %s", org)
    assert queued == 3 + 2  # three entities, two assertions


async def test_a_rolled_back_write_leaves_no_row_and_no_outbox_entry(
    db: Database, org: str
) -> None:
    await GraphStore(db).submit(
        org, [owner("payments", T0)], principal_id="a"
    )  # the organisation and a run exist
    with pytest.raises(RuntimeError):
        async with db.transaction() as conn:
            await conn.execute(
                "SELECT graph_assert(%s, (SELECT max(id) FROM graph_extraction_runs "
                "WHERE org_id = %s), %s::jsonb)",
                (org, org, '[{"s_type": "service", "s_name": "x", "p": "uses", '
                 '"o_type": "service", "o_name": "y", "method": "user", '
                 '"method_version": "1", "submitted_by": "a"}]'),
            )  # fmt: skip
            raise RuntimeError("the caller fails after the write")
    assert await count(db, "SELECT count(*) FROM graph_entities WHERE org_id = %s", org) == 2
    assert await count(db, "SELECT count(*) FROM graph_outbox WHERE org_id = %s", org) == 3


async def test_organisations_never_see_each_others_graph(db: Database, org: str) -> None:
    graph = GraphStore(db)
    await graph.submit(org, [owner("payments", T0)], principal_id="a")
    other = org + "-other"
    with pytest.raises(InvalidRequestError):
        await graph.search(other, Reader("a"), terms=[])
    assert (
        await graph.search(other, Reader("a", is_admin=True), terms=["billing-api"])
    ).facts == []
    assert await graph.facts(other, Reader("a", is_admin=True)) == []


async def test_bad_triples_are_refused_before_anything_is_stored() -> None:
    with pytest.raises(ValueError, match="predicate"):
        Triple(subject_type="service", subject="a", predicate="Owned By",
               object_type="team", object="b")  # fmt: skip
    with pytest.raises(ValueError, match="confidence"):
        Triple(subject_type="service", subject="a", predicate="owned_by",
               object_type="team", object="b", confidence=2)  # fmt: skip


async def test_the_migration_goes_both_ways(
    scratch_database: Callable[[str], AbstractAsyncContextManager[str]],
) -> None:
    async with scratch_database("graph_migration") as dsn:
        await asyncio.to_thread(_alembic, dsn, "upgrade", "0017")
        await asyncio.to_thread(_alembic, dsn, "downgrade", "0016")
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            gone = await (await conn.execute("SELECT to_regclass('graph_assertions')")).fetchone()
            assert gone == (None,)
        await asyncio.to_thread(_alembic, dsn, "upgrade", "0017")
