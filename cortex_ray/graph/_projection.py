"""The projection of the record into Neo4j (or any Bolt server that speaks its Cypher),
through the official ``neo4j`` driver.

The outbox (``graph_outbox``) holds one row per changed entity or assertion, written in the
same transaction as the change. ``Projector.drain`` reads it in (txid, id) order, only
below the oldest running transaction (``pg_snapshot_xmin``: a row that commits late cannot
be skipped), loads the *current* state of the rows it names, and writes them in one managed
write transaction per batch (``session.execute_write``): uniqueness constraint first, nodes
then relationships, each an ``UNWIND ... MERGE`` keyed by the record's id. Only then does
the watermark move (``graph_projection_state``). A worker killed anywhere replays at most
its last batch, and replaying a MERGE by id changes nothing: no duplicates. One worker per
target at a time (a PostgreSQL advisory lock, released when its session ends).

Closed validity is written as properties (``valid_to``, ``invalidated_at``); nothing in the
projection is deleted by a drain. ``rebuild`` projects every entity and assertion again
from the tables (optionally after wiping the projection).

Graph model: ``(:Entity {id, org, type, name, key, aliases, recorded_at})`` and, per
assertion, ``(subject)-[:<PREDICATE upper-cased> {id, org, predicate, confidence, method,
method_version, source_id, source_version, collection, path, byte_start, byte_end,
line_start, line_end, submitted_by, valid_from, valid_to, recorded_at,
invalidated_at}]->(object)``.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

import psycopg
from psycopg.rows import dict_row

from cortex_ray._exceptions import ConfigurationError, ConflictError, StorageError

if TYPE_CHECKING:
    from neo4j import Driver, ManagedTransaction

__all__ = ["ProjectionReport", "Projector", "open_driver"]

log = logging.getLogger("cortex_ray.graph.projection")

CONSTRAINTS = (
    "CREATE CONSTRAINT cortex_entity_id IF NOT EXISTS FOR (e:Entity) REQUIRE e.id IS UNIQUE",
)

_MERGE_ENTITIES = """
UNWIND $rows AS r
MERGE (e:Entity {id: r.id})
SET e += r.props
"""

# The relationship type is the predicate (validated ^[a-z][a-z0-9_]{0,63}$ by the record),
# upper-cased: a type cannot be a query parameter in Cypher. The endpoints are MERGEd, not
# MATCHed, so an assertion never waits for its entities' outbox rows (their properties
# arrive with them).
_MERGE_FACTS = """
UNWIND $rows AS r
MERGE (s:Entity {{id: r.s}})
MERGE (o:Entity {{id: r.o}})
MERGE (s)-[x:{type} {{id: r.id}}]->(o)
SET x += r.props
"""

_OUTBOX = """
SELECT id, org_id, kind, ref, txid::text AS txid FROM graph_outbox
WHERE (txid, id) > (%(txid)s::xid8, %(id)s)
  AND txid < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY txid, id
LIMIT %(limit)s
"""

_ENTITIES = """
SELECT e.org_id, e.id::text AS id, e.type, e.canonical_name AS name, e.key, e.recorded_at,
       e.valid_from, e.valid_to,
       coalesce(array_agg(al.alias ORDER BY al.key) FILTER (WHERE al.alias IS NOT NULL), '{}')
           AS aliases
FROM graph_entities e
LEFT JOIN graph_entity_aliases al ON al.org_id = e.org_id AND al.entity_id = e.id
WHERE (e.org_id, e.id) IN (SELECT * FROM unnest(%(orgs)s::text[], %(ids)s::uuid[]))
GROUP BY e.org_id, e.id
"""

_FACTS = """
SELECT a.org_id, a.id, a.subject_id::text AS s, a.object_id::text AS o, a.predicate,
       a.confidence, a.method, a.method_version, a.source_id::text AS source_id,
       a.source_version, s.collection, s.path, a.byte_start, a.byte_end, a.line_start,
       a.line_end, a.submitted_by, a.valid_from, a.valid_to, a.recorded_at, a.invalidated_at
FROM graph_assertions a
LEFT JOIN kb_sources s ON s.org_id = a.org_id AND s.id = a.source_id
WHERE a.id = ANY(%(ids)s::bigint[])
"""


def open_driver(uri: str, user: str, password: str) -> Driver:
    """The official driver (the ``graph`` extra), connected and checked."""
    try:
        from neo4j import GraphDatabase
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ConfigurationError(
            "the Neo4j projection needs the neo4j driver: pip install 'cortex-ray[graph]'"
        ) from exc
    driver = GraphDatabase.driver(uri, auth=(user, password))
    driver.verify_connectivity()
    return driver


@dataclass
class ProjectionReport:
    """What one ``drain`` or ``rebuild`` did."""

    batches: int = 0
    outbox_rows: int = 0
    entities: int = 0
    facts: int = 0
    retries: int = 0
    seconds: float = 0.0


class Projector:
    """Drains the outbox of one database into one Bolt target.

    Args:
        dsn: the PostgreSQL record.
        driver: a ``neo4j.Driver`` (``open_driver``); the caller closes it.
        database: the graph database on the server (``None``: the server's default).
        target: the watermark's name (one per projected server).
        batch: outbox rows per write transaction.
        max_attempts: tries of one batch on transient and constraint errors.
    """

    def __init__(
        self,
        dsn: str,
        driver: Driver,
        *,
        database: str | None = None,
        target: str = "neo4j",
        batch: int = 1000,
        max_attempts: int = 6,
    ) -> None:
        self.dsn = dsn
        self.driver = driver
        self.database = database
        self.target = target
        self.batch = batch
        self.max_attempts = max_attempts
        self._conn: psycopg.Connection[dict[str, Any]] | None = None

    # lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> Self:
        try:
            self._conn = psycopg.connect(self.dsn, row_factory=dict_row, autocommit=True)
        except psycopg.OperationalError as exc:
            raise StorageError(f"cannot reach the database: {exc}") from exc
        got = self._conn.execute(
            "SELECT pg_try_advisory_lock(hashtext('cortex_graph_projection'), hashtext(%s)) AS ok",
            (self.target,),
        ).fetchone()
        if not got or not got["ok"]:
            self._conn.close()
            raise ConflictError(f"another projector is draining into {self.target!r}")
        self._conn.execute(
            "INSERT INTO graph_projection_state (target) VALUES (%s) ON CONFLICT DO NOTHING",
            (self.target,),
        )
        self.ensure_constraints()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._conn is not None:
            self._conn.close()  # also releases the advisory lock
            self._conn = None

    @property
    def conn(self) -> psycopg.Connection[dict[str, Any]]:
        if self._conn is None:
            raise RuntimeError("use the projector as a context manager")
        return self._conn

    def ensure_constraints(self) -> None:
        """Uniqueness first: without it, concurrent MERGEs may create the same node twice."""
        with self.driver.session(database=self.database) as session:
            for statement in CONSTRAINTS:
                session.run(statement).consume()

    # drain --------------------------------------------------------------------------------

    def watermark(self) -> tuple[str, int]:
        row = self.conn.execute(
            "SELECT txid::text AS txid, last_id FROM graph_projection_state WHERE target = %s",
            (self.target,),
        ).fetchone()
        assert row is not None
        return row["txid"], int(row["last_id"])

    def drain(
        self, *, max_batches: int | None = None, on_batch: Callable[[int], None] | None = None
    ) -> ProjectionReport:
        """Project what the outbox holds above the watermark (what committed before the
        oldest running transaction began), batch by batch, until nothing is left."""
        report = ProjectionReport()
        started = time.perf_counter()
        while max_batches is None or report.batches < max_batches:
            txid, last = self.watermark()
            rows = self.conn.execute(
                _OUTBOX, {"txid": txid, "id": last, "limit": self.batch}
            ).fetchall()
            if not rows:
                break
            entities = [(r["org_id"], r["ref"]) for r in rows if r["kind"] == "entity"]
            facts = sorted({int(r["ref"]) for r in rows if r["kind"] == "assertion"})
            n_entities, n_facts = self._project(entities, facts, report)
            end = rows[-1]
            self.conn.execute(
                "UPDATE graph_projection_state SET txid = %s::xid8, last_id = %s, "
                "projected = projected + %s, updated_at = now() WHERE target = %s",
                (end["txid"], end["id"], len(rows), self.target),
            )
            report.batches += 1
            report.outbox_rows += len(rows)
            report.entities += n_entities
            report.facts += n_facts
            if on_batch is not None:
                on_batch(report.batches)
        report.seconds = round(time.perf_counter() - started, 3)
        return report

    def rebuild(self, *, wipe: bool = False) -> ProjectionReport:
        """Project every entity and assertion again from the tables (``wipe``: delete the
        projected ``Entity`` nodes and their relationships first). The watermark moves to
        where the outbox stood when the rebuild began: later changes are drained after."""
        report = ProjectionReport()
        started = time.perf_counter()
        mark = self.conn.execute(
            "SELECT coalesce(max(txid), '0')::text AS txid, coalesce(max(id), 0) AS id "
            "FROM graph_outbox WHERE txid < pg_snapshot_xmin(pg_current_snapshot())"
        ).fetchone()
        assert mark is not None
        if wipe:
            with self.driver.session(database=self.database) as session:
                while True:
                    gone = session.execute_write(_wipe_some)
                    if not gone:
                        break
        for keys in _pages(
            self.conn,
            "SELECT org_id, id::text AS id FROM graph_entities WHERE (org_id, id::text) > (%s, %s) "
            "ORDER BY org_id, id::text LIMIT %s",
            ("", ""),
            self.batch,
            lambda r: (r["org_id"], r["id"]),
        ):
            n, _ = self._project([(org, ident) for org, ident in keys], [], report)
            report.entities += n
            report.batches += 1
        for ids in _pages(
            self.conn,
            "SELECT id FROM graph_assertions WHERE id > %s ORDER BY id LIMIT %s",
            (0,),
            self.batch,
            lambda r: (r["id"],),
        ):
            _, n = self._project([], [i for (i,) in ids], report)
            report.facts += n
            report.batches += 1
        self.conn.execute(
            "UPDATE graph_projection_state SET txid = %s::xid8, last_id = %s, updated_at = now() "
            "WHERE target = %s AND (txid, last_id) < (%s::xid8, %s)",
            (mark["txid"], mark["id"], self.target, mark["txid"], mark["id"]),
        )
        report.seconds = round(time.perf_counter() - started, 3)
        return report

    # one batch ----------------------------------------------------------------------------

    def _project(
        self, entities: Sequence[tuple[str, str]], facts: Sequence[int], report: ProjectionReport
    ) -> tuple[int, int]:
        nodes: list[dict[str, Any]] = []
        if entities:
            orgs, ids = zip(*sorted(set(entities)), strict=True)
            for r in self.conn.execute(_ENTITIES, {"orgs": list(orgs), "ids": list(ids)}):
                nodes.append(
                    {
                        "id": r["id"],
                        "props": {
                            "org": r["org_id"],
                            "type": r["type"],
                            "name": r["name"],
                            "key": r["key"],
                            "aliases": list(r["aliases"]),
                            "recorded_at": r["recorded_at"],
                            "valid_from": r["valid_from"],
                            "valid_to": r["valid_to"],
                        },
                    }
                )
        by_type: dict[str, list[dict[str, Any]]] = defaultdict(list)
        if facts:
            for r in self.conn.execute(_FACTS, {"ids": list(facts)}):
                props = {k: v for k, v in r.items() if k not in ("id", "s", "o", "org_id")}
                props["org"] = r["org_id"]
                by_type[r["predicate"].upper()].append(
                    {"id": r["id"], "s": r["s"], "o": r["o"], "props": props}
                )
        n_facts = sum(len(rows) for rows in by_type.values())
        if not nodes and not n_facts:
            return 0, 0

        def write(tx: ManagedTransaction) -> None:
            if nodes:
                tx.run(_MERGE_ENTITIES, rows=nodes).consume()
            for rel_type, rows in sorted(by_type.items()):
                tx.run(_MERGE_FACTS.format(type=rel_type), rows=rows).consume()

        self._write(write, report)
        return len(nodes), n_facts

    def _write(self, work: Callable[[ManagedTransaction], None], report: ProjectionReport) -> None:
        """One managed write transaction. The driver retries transient errors itself; a
        ``ConstraintError`` is retried here too: ArcadeDB raises it when two transactions
        create the same key at once (Neo4j would not), and the MERGE is safe to repeat."""
        from neo4j.exceptions import ConstraintError, ServiceUnavailable, TransientError

        for attempt in range(1, self.max_attempts + 1):
            try:
                with self.driver.session(database=self.database) as session:
                    session.execute_write(work)
                return
            except (ConstraintError, TransientError, ServiceUnavailable) as exc:
                if attempt == self.max_attempts:
                    raise
                report.retries += 1
                log.warning("projection batch retried (%s): %s", type(exc).__name__, exc)
                time.sleep(min(2.0, 0.05 * 2**attempt))


def _wipe_some(tx: ManagedTransaction) -> int:
    record = tx.run(
        "MATCH (e:Entity) WITH e LIMIT 5000 DETACH DELETE e RETURN count(*) AS n"
    ).single()
    return int(record["n"]) if record else 0


def _pages(
    conn: psycopg.Connection[dict[str, Any]],
    sql: str,
    start: tuple[Any, ...],
    size: int,
    key: Callable[[dict[str, Any]], tuple[Any, ...]],
) -> Iterator[list[tuple[Any, ...]]]:
    """Keyset pagination: ``sql`` takes the last key's parts and the page size."""
    after = start
    while True:
        rows = conn.execute(sql, (*after, size)).fetchall()
        if not rows:
            return
        keys = [key(r) for r in rows]
        yield keys
        after = keys[-1]
