"""The projection into Neo4j, against a real Bolt server started here (ArcadeDB with its Bolt
plugin) through the official ``neo4j`` driver: the outbox drained in batches, replays that
change nothing, closed validity as properties, a worker killed mid-run converging with no
duplicate node or relationship, one projector per target, and a rebuild from PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from cortex_ray import ConflictError
from cortex_ray.graph import GraphWriter, Projector, open_driver
from cortex_ray.graph._writer import assert_rows
from cortex_ray.storage import migrate

neo4j = pytest.importorskip("neo4j")
pytest.importorskip("arcadedb_embedded")

from bolt_server import BoltServer, bolt_server  # noqa: E402

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def bolt() -> Iterator[BoltServer]:
    with bolt_server() as server:
        yield server


@pytest.fixture
def driver(bolt: BoltServer) -> Iterator[Any]:
    d = open_driver(bolt.uri, bolt.user, bolt.password)
    yield d
    d.close()


@pytest.fixture
async def record(
    scratch_database: Callable[[str], AbstractAsyncContextManager[str]],
) -> AsyncIterator[str]:
    """A migrated database of its own: its outbox holds only this test's rows."""
    async with scratch_database("graph_projection") as dsn:
        await asyncio.to_thread(migrate, dsn)
        yield dsn


def write_facts(dsn: str, org: str, rows: list[dict[str, Any]]) -> None:
    with GraphWriter(dsn) as gw:
        run = gw.begin_run(org, method="user", method_version="1")
        with gw.conn.transaction():
            assert_rows(gw.conn, org, run, rows)


def triple(s: str, p: str, o: str, **extra: Any) -> dict[str, Any]:
    return {
        "s_type": "service", "s_name": s, "p": p, "o_type": "service", "o_name": o,
        "method": "user", "method_version": "1", "submitted_by": "tester", **extra,
    }  # fmt: skip


def projected(driver: Any, org: str) -> dict[str, int]:
    with driver.session() as s:
        nodes = s.run("MATCH (e:Entity) WHERE e.org = $org RETURN count(e) AS n", org=org).single()
        rels = s.run("MATCH ()-[r]->() WHERE r.org = $org RETURN count(r) AS n", org=org).single()
        dup_nodes = s.run(
            "MATCH (e:Entity) WHERE e.org = $org WITH e.id AS id, count(*) AS c WHERE c > 1 "
            "RETURN count(*) AS n",
            org=org,
        ).single()
        dup_rels = s.run(
            "MATCH ()-[r]->() WHERE r.org = $org WITH r.id AS id, count(*) AS c WHERE c > 1 "
            "RETURN count(*) AS n",
            org=org,
        ).single()
    return {
        "nodes": nodes["n"],
        "relationships": rels["n"],
        "duplicate_nodes": dup_nodes["n"],
        "duplicate_relationships": dup_rels["n"],
    }


def recorded(dsn: str, org: str) -> dict[str, int]:
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM graph_entities WHERE org_id = %s) AS nodes, "
            "(SELECT count(*) FROM graph_assertions WHERE org_id = %s) AS relationships",
            (org, org),
        ).fetchone()
    assert row is not None
    return {**row, "duplicate_nodes": 0, "duplicate_relationships": 0}


async def test_the_outbox_is_drained_and_replays_change_nothing(
    record: str, driver: Any, org: str
) -> None:
    owner = {"functional": True}
    write_facts(record, org, [
        triple("billing", "owned_by", "payments", valid_from=T0.isoformat(), **owner),
        triple("billing", "calls", "ledger"),
    ])  # fmt: skip
    write_facts(record, org, [
        triple("billing", "owned_by", "platform", valid_from=(T0 + timedelta(days=9)).isoformat(),
               **owner),
    ])  # fmt: skip
    with Projector(record, driver, batch=2) as projector:
        first = projector.drain()
        assert first.batches >= 3 and first.facts >= 3
        assert projected(driver, org) == recorded(record, org) == {
            "nodes": 4, "relationships": 3, "duplicate_nodes": 0, "duplicate_relationships": 0,
        }  # fmt: skip
        assert projector.drain().outbox_rows == 0  # nothing new
        # Replaying everything (the watermark reset) changes nothing.
        projector.conn.execute(
            "UPDATE graph_projection_state SET txid = '0', last_id = 0 WHERE target = 'neo4j'"
        )
        assert projector.drain().outbox_rows == first.outbox_rows
        assert projected(driver, org) == recorded(record, org)
    with driver.session() as s:
        rows = s.run(
            "MATCH (:Entity {name: 'billing'})-[r:OWNED_BY]->(t:Entity) WHERE r.org = $org "
            "RETURN t.name AS team, r.valid_to AS valid_to, r.invalidated_at AS closed_at, "
            "r.predicate AS predicate, r.submitted_by AS who ORDER BY team",
            org=org,
        ).data()
    assert [(r["team"], r["valid_to"] is None, r["closed_at"] is None) for r in rows] == [
        ("payments", False, False),  # closed, as properties: nothing deleted
        ("platform", True, True),
    ]
    closed_at = rows[0]["valid_to"].to_native()
    assert closed_at.replace(tzinfo=closed_at.tzinfo or UTC) == T0 + timedelta(days=9)
    assert {r["predicate"] for r in rows} == {"owned_by"} and rows[0]["who"] == "tester"
    with driver.session() as s:
        constraints = s.run("SHOW CONSTRAINTS").data()
    assert any(c["labelsOrTypes"] == ["Entity"] and c["properties"] == ["id"] for c in constraints)


async def test_only_one_projector_drains_a_target(record: str, driver: Any) -> None:
    with Projector(record, driver), pytest.raises(ConflictError):
        Projector(record, driver).__enter__()
    with Projector(record, driver, target="another"):
        pass  # another target has its own watermark and lock


async def test_a_worker_killed_mid_run_converges_with_no_duplicates(
    record: str, bolt: BoltServer, driver: Any, org: str
) -> None:
    hubs = 30
    rows = [triple(f"svc-{h}", "calls", f"dep-{h}-{i}") for h in range(hubs) for i in range(60)]
    write_facts(record, org, rows)
    total = recorded(record, org)
    outbox = len(rows) + total["nodes"]
    env = {
        **os.environ,
        "CORTEX_GRAPH__URI": bolt.uri,
        "CORTEX_GRAPH__USER": bolt.user,
        "CORTEX_GRAPH__PASSWORD": bolt.password,
        "CORTEX_GRAPH__BATCH": "40",
    }
    command = [sys.executable, "-m", "jobs.graph_project", "--database-url", record]
    done = await asyncio.to_thread(kill_when_started, command, env, record)
    assert 0 < done < outbox, "the worker was not killed in the middle of its run"
    partial = projected(driver, org)
    assert partial["relationships"] < total["relationships"]

    again = await asyncio.to_thread(
        subprocess.run, command, cwd=ROOT, env=env, capture_output=True, timeout=600
    )
    assert again.returncode == 0, again.stderr.decode()[-2000:]
    report = json.loads(again.stdout.splitlines()[-1])
    assert 0 < report["outbox_rows"] <= outbox - done + 40  # resumed at the watermark
    assert projected(driver, org) == total


def kill_when_started(command: list[str], env: dict[str, str], dsn: str) -> int:
    """Run the projection job, SIGKILL it once its first batches are committed (it is then
    in the middle of another), and return how many outbox rows it had projected."""
    worker = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        done = 0
        while done == 0 and time.monotonic() < deadline and worker.poll() is None:
            time.sleep(0.05)
            done = watermark(dsn)
        worker.send_signal(signal.SIGKILL)  # no clean-up, no rollback by the worker itself
    finally:
        worker.wait()
    return watermark(dsn)


async def test_a_rebuild_projects_everything_again(record: str, driver: Any, org: str) -> None:
    write_facts(record, org, [triple("a", "calls", "b"), triple("b", "calls", "c")])
    with Projector(record, driver) as projector:
        projector.drain()
        with driver.session() as s:  # the projection is damaged
            s.run("MATCH (e:Entity {name: 'b'}) WHERE e.org = $org DETACH DELETE e", org=org)
        assert projected(driver, org)["relationships"] == 0
        report = projector.rebuild(wipe=True)
        assert (report.entities, report.facts) == (3, 2)
        assert projected(driver, org) == recorded(record, org)
        write_facts(record, org, [triple("c", "calls", "d")])  # after the rebuild: drained
        assert projector.drain().facts == 1
    assert projected(driver, org)["relationships"] == 3


def watermark(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT coalesce(max(projected), 0) FROM graph_projection_state"
        ).fetchone()
    return int(row[0]) if row else 0
