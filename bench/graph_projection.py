"""Context graph projection throughput (issue 19, point 6): relationships per second that the
outbox projector (``cortex_ray.graph.Projector``: outbox read, current state loaded from
PostgreSQL, UNWIND MERGE in managed write transactions, watermark) writes into a Bolt
server, against a plain driver ``UNWIND ... MERGE`` of the same rows (already in memory)
in the same run, on the same server. Target: the projector ≥ 0.8× the plain driver.

Each round wipes the graph, runs the plain writer, wipes again, resets the watermark and
drains the outbox; the report gives every round and the medians. The Bolt server is
ArcadeDB with its Bolt plugin started here (tests/bolt_server.py; heap 512 MB, two
processors) unless ``--uri`` names one (e.g. a Neo4j 5: ``--uri bolt://h:7687 --user neo4j
--password ...``).

Run: ``.venv/bin/python bench/graph_projection.py --relationships 20000 --rounds 3``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))

from _scratch import scratch_data_dir  # noqa: E402

from cortex_ray import run_main  # noqa: E402
from cortex_ray.graph import GraphWriter, Projector, open_driver  # noqa: E402
from cortex_ray.graph._writer import assert_rows  # noqa: E402
from cortex_ray.storage import EmbeddedPostgres, migrate  # noqa: E402

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def rows_for(n: int, entities: int) -> list[dict[str, Any]]:
    return [
        {
            "s_type": "service",
            "s_name": f"svc-{i % entities}",
            "p": "calls",
            "o_type": "service",
            "o_name": f"svc-{(i * 7 + 1) % entities}",
            "method": "user",
            "method_version": "1",
            "submitted_by": "bench",
            "valid_from": (T0 + timedelta(seconds=i)).isoformat(),  # distinct facts
        }
        for i in range(n)
    ]


def plain_rows(dsn: str, org: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The same nodes and relationships the projector writes, as plain dicts."""
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        nodes = [
            {"id": r["id"], "props": {"org": org, "type": r["type"], "name": r["name"],
                                      "key": r["key"], "recorded_at": r["recorded_at"]}}
            for r in conn.execute(
                "SELECT id::text AS id, type, canonical_name AS name, key, recorded_at "
                "FROM graph_entities WHERE org_id = %s ORDER BY id", (org,))
        ]  # fmt: skip
        rels = [
            {"id": r["id"], "s": r["s"], "o": r["o"],
             "props": {"org": org, "predicate": r["predicate"], "confidence": r["confidence"],
                       "method": r["method"], "valid_from": r["valid_from"],
                       "recorded_at": r["recorded_at"]}}
            for r in conn.execute(
                "SELECT id, subject_id::text AS s, object_id::text AS o, predicate, confidence, "
                "method, valid_from, recorded_at FROM graph_assertions WHERE org_id = %s "
                "ORDER BY id", (org,))
        ]  # fmt: skip
    return nodes, rels


def plain_write(
    driver: Any, nodes: list[dict[str, Any]], rels: list[dict[str, Any]], batch: int
) -> float:
    started = time.perf_counter()
    with driver.session() as session:
        for i in range(0, len(nodes), batch):
            part = nodes[i : i + batch]
            session.execute_write(
                lambda tx, part=part: tx.run(
                    "UNWIND $rows AS r MERGE (e:Entity {id: r.id}) SET e += r.props", rows=part
                ).consume()
            )
        for i in range(0, len(rels), batch):
            part = rels[i : i + batch]
            session.execute_write(
                lambda tx, part=part: tx.run(
                    "UNWIND $rows AS r MERGE (s:Entity {id: r.s}) MERGE (o:Entity {id: r.o}) "
                    "MERGE (s)-[x:CALLS {id: r.id}]->(o) SET x += r.props",
                    rows=part,
                ).consume()
            )
    return time.perf_counter() - started


def wipe(driver: Any) -> None:
    with driver.session() as session:
        while session.execute_write(
            lambda tx: tx.run(
                "MATCH (e:Entity) WITH e LIMIT 5000 DETACH DELETE e RETURN count(*) AS n"
            ).single()["n"]
        ):
            pass


def count(driver: Any) -> int:
    with driver.session() as session:
        return int(session.run("MATCH ()-[r:CALLS]->() RETURN count(r) AS n").single()["n"])


@contextlib.contextmanager
def bolt(args: argparse.Namespace) -> Iterator[tuple[str, str, str]]:
    if args.uri:
        yield args.uri, args.user, args.password
        return
    from bolt_server import bolt_server

    with bolt_server() as server:
        yield server.uri, server.user, server.password


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--relationships", type=int, default=20_000)
    parser.add_argument("--entities", type=int, default=0, help="default: relationships / 4")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--uri")
    parser.add_argument("--user", default="neo4j")
    parser.add_argument("--password", default="")
    parser.add_argument("--data-dir", type=Path)
    args = parser.parse_args()
    n = args.relationships
    entities = args.entities or max(2, n // 4)
    org = f"bench-{uuid.uuid4().hex[:8]}"
    with scratch_data_dir(args.data_dir) as data_dir:
        pg = EmbeddedPostgres(data_dir / "pg")
        try:
            migrate(pg.dsn)
            started = time.perf_counter()
            with GraphWriter(pg.dsn) as gw:
                run = gw.begin_run(org, method="user", method_version="1")
                rows = rows_for(n, entities)
                for i in range(0, n, 5000):
                    with gw.conn.transaction():
                        assert_rows(gw.conn, org, run, rows[i : i + 5000])
            record_s = time.perf_counter() - started
            nodes, rels = plain_rows(pg.dsn, org)
            print(f"{len(rels)} relationships among {len(nodes)} entities; recorded in "
                  f"{record_s:.1f} s ({len(rels) / record_s:.0f} assertions/s)")  # fmt: skip
            with bolt(args) as (uri, user, password):
                driver = open_driver(uri, user, password)
                plain: list[float] = []
                projected: list[float] = []
                try:
                    with Projector(pg.dsn, driver, batch=args.batch) as projector:
                        for r in range(args.rounds):
                            wipe(driver)
                            seconds = plain_write(driver, nodes, rels, args.batch)
                            assert count(driver) == len(rels)
                            plain.append(len(rels) / seconds)
                            wipe(driver)
                            projector.conn.execute(
                                "UPDATE graph_projection_state SET txid = '0', last_id = 0"
                            )
                            report = projector.drain()
                            assert count(driver) == len(rels), count(driver)
                            projected.append(len(rels) / report.seconds)
                            print(f"round {r + 1}: plain {plain[-1]:.0f} rel/s, projector "
                                  f"{projected[-1]:.0f} rel/s ({report.batches} batches, "
                                  f"{report.retries} retries)", flush=True)  # fmt: skip
                finally:
                    driver.close()
        finally:
            pg.stop()
    result = {
        "relationships": len(rels),
        "entities": len(nodes),
        "batch": args.batch,
        "server": args.uri or "ArcadeDB 26.10.2 (Bolt plugin, 512 MB heap, 2 processors)",
        "record_assertions_per_s": round(len(rels) / record_s),
        "plain_rel_per_s": [round(x) for x in plain],
        "projector_rel_per_s": [round(x) for x in projected],
        "median_plain": round(statistics.median(plain)),
        "median_projector": round(statistics.median(projected)),
        "ratio": round(statistics.median(projected) / statistics.median(plain), 3),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
