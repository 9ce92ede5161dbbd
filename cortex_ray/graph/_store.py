"""The context graph's asynchronous side: submitted triples, "as of" reads, graph search
(seeds → entities → neighbours within budgets) and path search, every fact filtered by
what the reader may read before anything leaves the store.

Visibility (``_VISIBLE``): a fact from a source is visible when the source's collection has
no readers listed (``kb_collection_readers``) or lists the reader; a submitted fact (no
source) is visible to every member; admins see everything. An entity is visible when at
least one visible fact touches it, so a name that only a denied source mentions never
appears, not even as a seed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any
from uuid import UUID

from cortex_ray._exceptions import InvalidRequestError, NotFoundError
from cortex_ray.graph._types import Entity, Evidence, Fact, GraphResult, SubmitReport, Triple
from cortex_ray.knowledge import denied_collections, warning_text
from cortex_ray.storage import Conn, Database

__all__ = ["GraphStore", "Reader"]

USER_METHOD = "user"
USER_METHOD_VERSION = "1"
MAX_DEPTH = 4
UNHEALTHY = frozenset({"READ_FAILURE", "DISAPPEARED", "SKIPPED"})


@dataclass(frozen=True, slots=True)
class Reader:
    """Who reads, and as of when: ``valid_at`` on the valid-time axis (what was true then),
    ``known_at`` on the record-time axis (what the graph had recorded then); ``None``: now."""

    principal_id: str
    is_admin: bool = False
    valid_at: datetime | None = None
    known_at: datetime | None = None
    denied: tuple[str, ...] | None = None
    """The collections it may not read, once resolved (``None``: not yet)."""

    def params(self) -> dict[str, Any]:
        return {"valid_at": self.valid_at, "known_at": self.known_at}


# A fact ``a`` the reader may see, as of both axes. ``a.collection`` is its source's
# collection (NULL for a submitted fact), so the check needs no join and an index scan in
# retrieval's order stops after the first visible rows.
_VISIBLE = """
    a.recorded_at <= coalesce(%(known_at)s, now())
    AND a.valid_from <= coalesce(%(valid_at)s, now())
    AND NOT (a.invalidated_at IS NOT NULL AND a.invalidated_at <= coalesce(%(known_at)s, now())
             AND a.valid_to <= coalesce(%(valid_at)s, now()))
    AND (a.collection IS NULL OR NOT (a.collection = ANY(%(denied)s::text[])))
"""

_FACT_COLUMNS = """
    a.id, a.predicate, a.confidence, a.method, a.method_version, a.source_id,
    a.source_version, a.byte_start, a.byte_end, a.line_start, a.line_end, a.submitted_by,
    a.valid_from, a.recorded_at,
    -- as recorded at known_at: a validity closed later was still open then
    CASE WHEN a.invalidated_at <= coalesce(%(known_at)s, now()) THEN a.valid_to END AS valid_to,
    CASE WHEN a.invalidated_at <= coalesce(%(known_at)s, now()) THEN a.invalidated_at END
        AS invalidated_at,
    a.collection, s.path, s.health, fh.kinds AS findings, fh.version AS findings_version,
    se.id AS s_id, se.type AS s_type, se.canonical_name AS s_name, se.recorded_at AS s_at,
    oe.id AS o_id, oe.type AS o_type, oe.canonical_name AS o_name, oe.recorded_at AS o_at
"""

_FACT_JOINS = """
    LEFT JOIN kb_sources s ON s.org_id = a.org_id AND s.id = a.source_id
    LEFT JOIN LATERAL (
        SELECT array_agg(f.kind ORDER BY f.kind) AS kinds, max(f.latest_version) AS version
        FROM kb_source_findings f
        WHERE f.org_id = a.org_id AND f.source_id = a.source_id
          AND f.kind <> 'UNKNOWN_FRESHNESS'
    ) fh ON a.source_id IS NOT NULL
    JOIN graph_entities se ON se.org_id = a.org_id AND se.id = a.subject_id
    JOIN graph_entities oe ON oe.org_id = a.org_id AND oe.id = a.object_id
"""

# The best visible facts of one side of an entity (``{side}``: subject_id or object_id),
# read in the order of its index, so that a hub's facts are not all read and sorted.
_SIDE = f"""
    SELECT a.* FROM graph_assertions a
    WHERE a.org_id = %(org)s AND a.{{side}} = f.id
      AND (%(predicates)s::text[] IS NULL OR a.predicate = ANY(%(predicates)s::text[]))
      AND {_VISIBLE}
    ORDER BY a.confidence DESC, a.valid_from DESC, a.id
    LIMIT %(per_entity)s
"""

# The facts touching each frontier entity, best first, at most %(per_entity)s each; only
# the winners are joined to their entities and their sources' health.
_NEIGHBOURS = f"""
    SELECT {_FACT_COLUMNS} FROM (
        SELECT DISTINCT ON (x.id) x.* FROM unnest(%(frontier)s::uuid[]) AS f(id)
        CROSS JOIN LATERAL (
            SELECT * FROM (
                ({_SIDE.format(side="subject_id")})
                UNION ALL
                ({_SIDE.format(side="object_id")})
            ) both_sides
            ORDER BY confidence DESC, valid_from DESC, id
            LIMIT %(per_entity)s
        ) x
    ) a {_FACT_JOINS}
"""

_SEEDS = f"""
    WITH candidates AS (
        SELECT id FROM graph_entities WHERE org_id = %(org)s AND id = ANY(%(ids)s::uuid[])
        UNION
        SELECT id FROM graph_entities WHERE org_id = %(org)s AND key = ANY(%(keys)s::text[])
        UNION
        SELECT entity_id FROM graph_entity_aliases
        WHERE org_id = %(org)s AND key = ANY(%(keys)s::text[])
          AND recorded_at <= coalesce(%(known_at)s, now())
        UNION
        SELECT subject_id FROM graph_assertions
        WHERE org_id = %(org)s AND source_id = ANY(%(sources)s::uuid[])
    )
    SELECT e.id FROM candidates c
    JOIN graph_entities e ON e.org_id = %(org)s AND e.id = c.id
    WHERE e.recorded_at <= coalesce(%(known_at)s, now())
      AND (EXISTS (SELECT 1 FROM graph_assertions a
                   WHERE a.org_id = e.org_id AND a.subject_id = e.id AND {_VISIBLE})
           OR EXISTS (SELECT 1 FROM graph_assertions a
                      WHERE a.org_id = e.org_id AND a.object_id = e.id AND {_VISIBLE}))
    ORDER BY e.type, e.key
    LIMIT %(limit)s
"""


class GraphStore:
    """Reads and user writes of one database's context graph."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # writes -------------------------------------------------------------------------------

    async def submit(
        self, org_id: str, triples: Sequence[Triple], *, principal_id: str
    ) -> SubmitReport:
        """Record ``triples`` as one extraction run of method ``user`` (no source: the
        citation names the principal). Idempotent per (triple, principal, valid_from)."""
        if not triples:
            raise InvalidRequestError("triples: at least one")
        rows = [
            {
                "s_type": t.subject_type,
                "s_name": t.subject,
                "s_aliases": list(t.subject_aliases),
                "p": t.predicate,
                "o_type": t.object_type,
                "o_name": t.object,
                "o_aliases": list(t.object_aliases),
                "functional": t.functional,
                "confidence": t.confidence,
                "method": USER_METHOD,
                "method_version": USER_METHOD_VERSION,
                "submitted_by": principal_id,
                "valid_from": None if t.valid_from is None else t.valid_from.isoformat(),
            }
            for t in triples
        ]
        async with self.db.transaction() as conn:
            await conn.execute(
                "INSERT INTO organisations (id) VALUES (%s) ON CONFLICT DO NOTHING", (org_id,)
            )
            run = await _one(
                conn,
                "INSERT INTO graph_extraction_runs (org_id, method, method_version, principal_id, "
                "status, finished_at) VALUES (%s, %s, %s, %s, 'DONE', now()) RETURNING id",
                (org_id, USER_METHOD, USER_METHOD_VERSION, principal_id),
            )
            got = await _one(
                conn,
                "SELECT graph_assert(%s, %s, %s::jsonb) AS r",
                (org_id, run["id"], json.dumps(rows)),
            )
            await conn.execute(
                "UPDATE graph_extraction_runs SET assertions = %s WHERE org_id = %s AND id = %s",
                (got["r"]["assertions"], org_id, run["id"]),
            )
        r = got["r"]
        return SubmitReport(
            run_id=run["id"], entities=r["entities"], assertions=r["assertions"], closed=r["closed"]
        )

    async def set_collection_readers(
        self, org_id: str, collection: str, principal_ids: Sequence[str]
    ) -> None:
        """Restrict ``collection`` to ``principal_ids`` (and admins); none: every member."""
        async with self.db.transaction() as conn:
            found = await conn.execute(
                "SELECT 1 FROM kb_collections WHERE org_id = %s AND name = %s", (org_id, collection)
            )
            if await found.fetchone() is None:
                raise NotFoundError(f"no collection {collection!r}")
            await conn.execute(
                "DELETE FROM kb_collection_readers WHERE org_id = %s AND collection = %s",
                (org_id, collection),
            )
            for pid in sorted(set(principal_ids)):
                await conn.execute(
                    "INSERT INTO kb_collection_readers (org_id, collection, principal_id) "
                    "VALUES (%s, %s, %s)",
                    (org_id, collection, pid),
                )

    # reads --------------------------------------------------------------------------------

    async def facts(
        self, org_id: str, reader: Reader, *, entity_id: UUID | None = None, limit: int = 100
    ) -> list[Fact]:
        """The facts the reader sees as of its two times (of one entity, or all), newest
        first."""
        sql = f"""
            SELECT {_FACT_COLUMNS} FROM graph_assertions a {_FACT_JOINS}
            WHERE a.org_id = %(org)s
              AND (%(entity)s::uuid IS NULL
                   OR a.subject_id = %(entity)s OR a.object_id = %(entity)s)
              AND {_VISIBLE}
            ORDER BY a.valid_from DESC, a.id DESC LIMIT %(limit)s
        """
        async with self.db.connection() as conn:
            params = {
                **await _reader_params(conn, org_id, reader),
                "org": org_id,
                "entity": entity_id,
                "limit": limit,
            }
            rows = await (await conn.execute(sql, params)).fetchall()
        return [_fact(r) for r in rows]

    async def search(
        self,
        org_id: str,
        reader: Reader,
        *,
        terms: Sequence[str] = (),
        entity_ids: Sequence[UUID] = (),
        source_ids: Sequence[UUID] = (),
        depth: int = 1,
        max_facts: int = 50,
        per_entity: int = 10,
        max_seeds: int = 10,
        predicates: Sequence[str] | None = None,
    ) -> GraphResult:
        """Seeds (terms matched to canonical names and aliases, entity ids, or the sources
        of knowledge hits) → entities → their neighbours, breadth first, up to ``depth``
        hops, at most ``per_entity`` facts per entity and ``max_facts`` in all."""
        _check_budgets(depth, max_facts, per_entity)
        if not (terms or entity_ids or source_ids):
            raise InvalidRequestError("give at least one seed: terms, entity ids or sources")
        async with self.db.connection() as conn:
            reader = await _resolved(conn, org_id, reader)
            seeds = await self._seeds(
                conn, org_id, reader, terms, entity_ids, source_ids, max_seeds
            )
            facts: dict[int, dict[str, Any]] = {}
            seen = set(seeds)
            frontier = list(seeds)
            truncated = False
            for _ in range(depth):
                if not frontier:
                    break
                rows = await self._neighbours(
                    conn, org_id, reader, frontier, per_entity, predicates
                )
                nxt: list[UUID] = []
                for row in rows:
                    if row["id"] in facts:
                        continue
                    if len(facts) >= max_facts:
                        truncated = True
                        break
                    facts[row["id"]] = row
                    for end in (row["s_id"], row["o_id"]):
                        if end not in seen:
                            seen.add(end)
                            nxt.append(end)
                if truncated:
                    break
                frontier = nxt
            result = [_fact(r) for r in facts.values()]
            entities = await self._entities(conn, org_id, reader, list(seen) if facts else seeds)
        by_id = {e.id: e for e in entities}
        return GraphResult(
            seeds=[by_id[s] for s in seeds if s in by_id],
            entities=entities,
            facts=result,
            truncated=truncated,
            warnings=sorted({f.warning for f in result if f.warning}),
        )

    async def path(
        self,
        org_id: str,
        reader: Reader,
        start: UUID,
        end: UUID,
        *,
        max_depth: int = 3,
        per_entity: int = 50,
        predicates: Sequence[str] | None = None,
    ) -> GraphResult:
        """A shortest chain of visible facts from ``start`` to ``end`` (either direction),
        at most ``max_depth`` facts long; ``path`` is ``None`` when there is none within
        the budgets."""
        _check_budgets(max_depth, 1, per_entity)
        async with self.db.connection() as conn:
            reader = await _resolved(conn, org_id, reader)
            ends = await self._seeds(conn, org_id, reader, (), (start, end), (), 2)
            if start not in ends or end not in ends:
                raise NotFoundError("no such entity (or none the caller may see)")
            parent: dict[UUID, tuple[UUID, dict[str, Any]] | None] = {start: None}
            frontier = [start]
            truncated = False
            for _ in range(max_depth):
                if end in parent or not frontier:
                    break
                rows = await self._neighbours(
                    conn, org_id, reader, frontier, per_entity, predicates
                )
                truncated = truncated or any(
                    sum(1 for r in rows if _touches(r, f)) >= per_entity for f in frontier
                )
                nxt: list[UUID] = []
                for row in rows:
                    for here, there in ((row["s_id"], row["o_id"]), (row["o_id"], row["s_id"])):
                        if here in parent and there not in parent and here in frontier:
                            parent[there] = (here, row)
                            nxt.append(there)
                frontier = nxt
            chain: list[dict[str, Any]] = []
            if end in parent:
                node = end
                while (step := parent[node]) is not None:
                    node, row = step
                    chain.append(row)
                chain.reverse()
            facts = [_fact(r) for r in chain]
            ids = {start, end} | {r["s_id"] for r in chain} | {r["o_id"] for r in chain}
            entities = await self._entities(conn, org_id, reader, list(ids))
        by_id = {e.id: e for e in entities}
        return GraphResult(
            seeds=[by_id[i] for i in (start, end) if i in by_id],
            entities=entities,
            facts=facts,
            path=facts if end in parent else None,
            truncated=truncated,
            warnings=sorted({f.warning for f in facts if f.warning}),
        )

    # helpers ------------------------------------------------------------------------------

    async def _seeds(
        self,
        conn: Conn,
        org_id: str,
        reader: Reader,
        terms: Sequence[str],
        entity_ids: Sequence[UUID],
        source_ids: Sequence[UUID],
        limit: int,
    ) -> list[UUID]:
        keys = [" ".join(t.lower().split()) for t in terms if t.strip()]
        params = {
            **await _reader_params(conn, org_id, reader),
            "org": org_id,
            "ids": list(entity_ids),
            "keys": keys,
            "sources": list(source_ids),
            "limit": limit,
        }
        rows = await (await conn.execute(_SEEDS, params)).fetchall()
        return [r["id"] for r in rows]

    async def _neighbours(
        self,
        conn: Conn,
        org_id: str,
        reader: Reader,
        frontier: list[UUID],
        per_entity: int,
        predicates: Sequence[str] | None,
    ) -> list[dict[str, Any]]:
        params = {
            **await _reader_params(conn, org_id, reader),
            "org": org_id,
            "frontier": frontier,
            "per_entity": per_entity,
            "predicates": None if predicates is None else list(predicates),
        }
        rows = await (await conn.execute(_NEIGHBOURS, params)).fetchall()
        rows.sort(key=lambda r: (-r["confidence"], r["id"]))
        return rows

    async def _entities(
        self, conn: Conn, org_id: str, reader: Reader, ids: list[UUID]
    ) -> list[Entity]:
        if not ids:
            return []
        rows = await (
            await conn.execute(
                """
                SELECT e.id, e.type, e.canonical_name, e.recorded_at,
                       coalesce(array_agg(al.alias ORDER BY al.key)
                                FILTER (WHERE al.alias IS NOT NULL
                                        AND al.alias <> e.canonical_name), '{}') AS aliases
                FROM graph_entities e
                LEFT JOIN graph_entity_aliases al
                  ON al.org_id = e.org_id AND al.entity_id = e.id
                 AND al.recorded_at <= coalesce(%(known_at)s, now())
                WHERE e.org_id = %(org)s AND e.id = ANY(%(ids)s::uuid[])
                GROUP BY e.org_id, e.id ORDER BY e.type, e.key
                """,
                {"org": org_id, "ids": ids, "known_at": reader.known_at},
            )
        ).fetchall()
        return [
            Entity(
                id=r["id"],
                type=r["type"],
                name=r["canonical_name"],
                aliases=tuple(r["aliases"]),
                recorded_at=r["recorded_at"],
            )
            for r in rows
        ]


async def _resolved(conn: Conn, org_id: str, reader: Reader) -> Reader:
    """The reader with the collections it may not read (none for an admin): read once per
    search, so that all its statements apply the same rule."""
    if reader.denied is not None:
        return reader
    denied = await denied_collections(conn, org_id, reader.principal_id, is_admin=reader.is_admin)
    return replace(reader, denied=tuple(denied))


async def _reader_params(conn: Conn, org_id: str, reader: Reader) -> dict[str, Any]:
    """The reader's times and the collections it may not read."""
    reader = await _resolved(conn, org_id, reader)
    return {**reader.params(), "denied": list(reader.denied or ())}


def _touches(row: dict[str, Any], entity: UUID) -> bool:
    return bool(row["s_id"] == entity or row["o_id"] == entity)


def _check_budgets(depth: int, max_facts: int, per_entity: int) -> None:
    if not 1 <= depth <= MAX_DEPTH:
        raise InvalidRequestError(f"depth: 1 to {MAX_DEPTH}")
    if not 1 <= max_facts <= 500:
        raise InvalidRequestError("max_facts: 1 to 500")
    if not 1 <= per_entity <= 200:
        raise InvalidRequestError("per_entity: 1 to 200")


def _fact(r: dict[str, Any]) -> Fact:
    evidence = None
    if r["byte_start"] is not None:
        evidence = Evidence(
            byte_start=r["byte_start"],
            byte_end=r["byte_end"],
            line_start=r["line_start"],
            line_end=r["line_end"],
        )
    if r["source_id"] is not None:
        cite = f"{r['path']}:{r['line_start']}-{r['line_end']} @v{r['source_version']}"
    else:
        cite = f"submitted by {r['submitted_by']}"
    health = r["health"]
    findings = tuple(r["findings"] or ())
    warning = None
    if findings:  # the latest health report's findings (cortex_ray.knowledge._health)
        warning = warning_text(r["path"], findings, r["findings_version"])
    elif health in UNHEALTHY:  # no report yet: the last health event
        warning = warning_text(r["path"], [health], r["source_version"])
    return Fact(
        id=r["id"],
        subject=Entity(id=r["s_id"], type=r["s_type"], name=r["s_name"], recorded_at=r["s_at"]),
        predicate=r["predicate"],
        object=Entity(id=r["o_id"], type=r["o_type"], name=r["o_name"], recorded_at=r["o_at"]),
        confidence=round(float(r["confidence"]), 4),
        method=r["method"],
        method_version=r["method_version"],
        source_id=r["source_id"],
        source_version=r["source_version"],
        collection=r["collection"],
        path=r["path"],
        evidence=evidence,
        citation=cite,
        submitted_by=r["submitted_by"],
        valid_from=r["valid_from"],
        valid_to=r["valid_to"],
        recorded_at=r["recorded_at"],
        invalidated_at=r["invalidated_at"],
        source_health=health,
        findings=findings,
        warning=warning,
    )


async def _one(conn: Conn, sql: str, params: Sequence[Any]) -> dict[str, Any]:
    row = await (await conn.execute(sql, params)).fetchone()
    assert row is not None
    return row
