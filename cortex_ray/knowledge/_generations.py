"""Generations and their publication: the writer's part that opens a generation, decides its
membership (which source version it serves) and publishes it.

- ``begin_generation`` opens a BUILDING generation and records its BM25 analyzer
  (``generation_analyzer`` reads it back).
- Membership: ``carry_forward_sources`` puts a source's published version into it (one
  row, no rewrite); ``include_member``/``include_members`` are the membership writes the
  passages part makes too; ``keep_published`` serves the published version of files that
  could not be read and retires a version that failed mid-split.
- ``publish`` merges the collection's postings stage (``_merge_stage``), computes the
  publication's BM25 statistics from the previous one's plus the membership difference, and
  moves the collection's pointer, in one transaction; ``collect_garbage`` deletes what no
  live generation uses.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

from psycopg import sql
from psycopg.types.json import Jsonb

from cortex_ray._exceptions import InvalidRequestError, NotFoundError
from cortex_ray.knowledge._bm25 import Analyzer
from cortex_ray.knowledge._connection import WriterConnection
from cortex_ray.knowledge._sql import (
    PUBLISHED_VERSIONS_SQL,
    SyncConn,
    ensure_stage,
    partition_name,
    stage_name,
)
from cortex_ray.knowledge._types import GarbageReport, Generation, PublishReport, SourceVersion
from cortex_ray.settings import load_settings

__all__ = [
    "RETIRED_MARK",
    "GenerationWriter",
    "generation_analyzer",
    "include_member",
    "include_members",
]

log = logging.getLogger("cortex_ray.knowledge")
# Appended (with a random suffix) to the content hash of a version retired by
# ``keep_published``: the same content then registers as a fresh version, and publish never
# serves the retired one.
RETIRED_MARK = ":failed:"


def generation_analyzer(conn: SyncConn, gen: Generation) -> Analyzer:
    """The analyzer ``gen``'s postings are written with (migration 0009)."""
    row = conn.execute(
        "SELECT analyzer FROM kb_generations WHERE org_id = %s AND id = %s", (gen.org_id, gen.id)
    ).fetchone()
    if row is None:
        raise NotFoundError(f"no generation {gen.id} in {gen.org_id}")
    return Analyzer.from_json(row["analyzer"])


def include_member(
    conn: SyncConn, gen: Generation, source_id: Any, version: int, carried: bool
) -> None:
    """Make ``version`` of ``source_id`` a member of ``gen`` (or switch it to this version)."""
    conn.execute(
        """
        INSERT INTO kb_generation_sources (org_id, generation, source_id, version, carried)
        VALUES (%s, %s, %s, %s, %s)
        ON CONFLICT (org_id, generation, source_id) DO UPDATE
           SET version = EXCLUDED.version, carried = EXCLUDED.carried
         WHERE kb_generation_sources.version <> EXCLUDED.version
        """,
        (gen.org_id, gen.id, source_id, version, carried),
    )


def include_members(
    conn: SyncConn, gen: Generation, members: dict[uuid.UUID, int], carried: bool
) -> None:
    """``include_member`` for many sources (``{source id: version}``), in source order."""
    if not members:
        return
    conn.execute(
        """
        INSERT INTO kb_generation_sources (org_id, generation, source_id, version, carried)
        SELECT %s, %s, t.source_id, t.version, %s
        FROM unnest(%s::uuid[], %s::int[]) AS t(source_id, version)
        ORDER BY t.source_id
        ON CONFLICT (org_id, generation, source_id) DO UPDATE
           SET version = EXCLUDED.version, carried = EXCLUDED.carried
         WHERE kb_generation_sources.version <> EXCLUDED.version
        """,
        (gen.org_id, gen.id, carried, list(members), list(members.values())),
    )


class GenerationWriter(WriterConnection):
    """Opens, fills the membership of, publishes and collects generations of a collection."""

    def begin_generation(
        self, org_id: str, collection: str, *, analyzer: Analyzer | None = None
    ) -> Generation:
        """Open a new BUILDING generation of ``collection`` (created on first use).

        Its BM25 analyzer is the one the collection's generations have: a run reuses the
        source versions earlier runs wrote (unchanged sources are carried forward, a killed
        run's rows are taken up again) with their postings, and publish updates the previous
        publication's statistics, so a collection keeps the analyzer of its first generation.
        A new collection takes ``analyzer``, by default the settings'
        (``RetrievalConfig.bm25_stem`` and ``bm25_identifiers``).

        Raises:
            InvalidRequestError: ``analyzer`` is not the collection's (write into a new
                collection to change it).
        """
        self._ensure_collection(org_id, collection)
        latest = self._one(
            "SELECT analyzer FROM kb_generations WHERE org_id = %s AND collection = %s "
            "ORDER BY id DESC LIMIT 1",
            (org_id, collection),
        )
        if latest is not None:
            kept = Analyzer.from_json(latest["analyzer"])
            if analyzer is not None and analyzer != kept:
                raise InvalidRequestError(
                    f"{collection!r} is written with the {kept.name} analyzer, not "
                    f"{analyzer.name}: its sources keep their postings from run to run, so a "
                    "new analyzer needs a new collection"
                )
            analyzer = kept
        elif analyzer is None:
            analyzer = Analyzer.configured(load_settings().knowledge)
        row = self._one(
            "INSERT INTO kb_generations (org_id, collection, status, analyzer) "
            "VALUES (%s, %s, 'BUILDING', %s) RETURNING id",
            (org_id, collection, Jsonb(analyzer.to_json())),
        )
        assert row is not None
        generation = Generation(org_id=org_id, collection=collection, id=row["id"])
        self._generations[generation.id] = generation
        return generation

    def carry_forward(self, generation: Generation | int, source_id: uuid.UUID) -> None:
        """Put the published version of an unchanged source into ``generation`` (no rewrite)."""
        self.carry_forward_sources(generation, [source_id])

    def carry_forward_sources(
        self, generation: Generation | int, source_ids: Sequence[uuid.UUID]
    ) -> None:
        """``carry_forward`` for many sources in one transaction."""
        if not source_ids:
            return
        gen = self._generation(generation)
        wanted = set(source_ids)
        with self.conn.transaction():
            conn = self.conn
            self._lock_building(conn, gen)
            published: dict[uuid.UUID, int] = {
                r["source_id"]: int(r["version"])
                for r in conn.execute(
                    PUBLISHED_VERSIONS_SQL, (gen.org_id, gen.collection, list(wanted))
                ).fetchall()
            }
            missing = wanted - published.keys()
            if missing:
                raise InvalidRequestError(
                    f"source {sorted(missing)[0]} is not in the published generation of "
                    f"{gen.collection!r}: write it instead"
                )
            include_members(conn, gen, published, carried=True)
            conn.execute(
                """
                UPDATE kb_source_versions v SET touched_at = now()
                FROM unnest(%s::uuid[], %s::int[]) AS t(source_id, version)
                WHERE v.org_id = %s AND v.source_id = t.source_id AND v.version = t.version
                """,
                (list(published), list(published.values()), gen.org_id),
            )

    def keep_published(
        self,
        generation: Generation | int,
        paths: Sequence[str],
        failed: Sequence[SourceVersion] = (),
    ) -> dict[str, int]:
        """After read failures: ``generation`` serves the published version of each of
        ``paths`` (a file that could not be read this time is not a deleted file); returns
        ``{path: version kept}`` for those that have one.

        ``failed`` are versions registered for files that then failed while being split:
        their membership rows (a big file's earlier batches add one) leave ``generation``, and
        each such version is retired (its content hash is tombstoned, so a later run with
        the same content gets a fresh version instead of reusing partial, possibly mixed,
        rows; ``collect_garbage`` removes it). A version that another generation also holds
        (a concurrent run finished it) is left alone.
        """
        gen = self._generation(generation)
        if not paths and not failed:
            return {}
        for source in failed:
            self._check_source(gen, source)
        with self.conn.transaction():
            conn = self.conn
            self._lock_building(conn, gen)
            if failed:
                ids = [s.source_id for s in failed]
                versions = [s.version for s in failed]
                conn.execute(
                    """
                    DELETE FROM kb_generation_sources m
                    USING unnest(%s::uuid[], %s::int[]) AS t(source_id, version)
                    WHERE m.org_id = %s AND m.generation = %s
                      AND m.source_id = t.source_id AND m.version = t.version
                    """,
                    (ids, versions, gen.org_id, gen.id),
                )
                conn.execute(
                    """
                    UPDATE kb_source_versions v
                    SET content_hash = v.content_hash || %s || gen_random_uuid()
                    FROM unnest(%s::uuid[], %s::int[]) AS t(source_id, version)
                    WHERE v.org_id = %s AND v.source_id = t.source_id AND v.version = t.version
                      AND NOT EXISTS (
                          SELECT 1 FROM kb_generation_sources m
                          WHERE m.org_id = v.org_id AND m.source_id = v.source_id
                            AND m.version = v.version)
                    """,
                    (RETIRED_MARK, ids, versions, gen.org_id),
                )
            wanted = sorted(set(paths) | {s.path for s in failed})
            kept = {
                r["path"]: (r["source_id"], int(r["version"]))
                for r in conn.execute(
                    """
                    SELECT s.path, m.source_id, m.version FROM kb_collections c
                    JOIN kb_generation_sources m
                      ON m.org_id = c.org_id AND m.generation = c.published_generation
                    JOIN kb_sources s ON s.org_id = m.org_id AND s.id = m.source_id
                    WHERE c.org_id = %s AND c.name = %s AND s.path = ANY(%s::text[])
                      AND NOT EXISTS (
                          SELECT 1 FROM kb_generation_sources g
                          WHERE g.org_id = m.org_id AND g.generation = %s
                            AND g.source_id = m.source_id)
                    """,
                    (gen.org_id, gen.collection, wanted, gen.id),
                ).fetchall()
            }
            include_members(conn, gen, dict(kept.values()), carried=True)
        return {path: version for path, (_, version) in kept.items()}

    @staticmethod
    def _drop_retired(conn: SyncConn, gen: Generation, previous: int | None) -> None:
        """At publish (no writer can still add to ``gen``): a retired version that a late
        write made a member again (sections reach their embedder after the file failed) is
        replaced by the published version, as ``keep_published`` did."""
        dropped = [
            r["source_id"]
            for r in conn.execute(
                """
                DELETE FROM kb_generation_sources m USING kb_source_versions v
                WHERE m.org_id = %s AND m.generation = %s
                  AND v.org_id = m.org_id AND v.source_id = m.source_id
                  AND v.version = m.version AND strpos(v.content_hash, %s) > 0
                RETURNING m.source_id
                """,
                (gen.org_id, gen.id, RETIRED_MARK),
            ).fetchall()
        ]
        if dropped and previous is not None:
            conn.execute(
                """
                INSERT INTO kb_generation_sources (org_id, generation, source_id, version, carried)
                SELECT org_id, %s, source_id, version, true FROM kb_generation_sources
                WHERE org_id = %s AND generation = %s AND source_id = ANY(%s::uuid[])
                """,
                (gen.id, gen.org_id, previous, dropped),
            )

    # -- publish and collect -----------------------------------------------------------

    def publish(self, generation: Generation | int) -> PublishReport:
        """Make ``generation`` the one searches serve, atomically; idempotent.

        Computes the publication's BM25 statistics incrementally: N, total length and each
        term's document frequency are the previous publication's plus those of the source
        versions that entered and minus those that left, so the cost follows the change, not
        the size of the collection (the vocabulary itself is copied once per publication).
        """
        gen = self._generation(generation)
        started = time.perf_counter()
        cid = self._collection_id(gen.org_id, gen.collection)
        self._merge_stage(gen.org_id, gen.collection, cid)
        with self.conn.transaction():
            conn = self.conn
            coll = conn.execute(
                "SELECT published_generation FROM kb_collections "
                "WHERE org_id = %s AND name = %s FOR UPDATE",
                (gen.org_id, gen.collection),
            ).fetchone()
            row = conn.execute(
                "SELECT status, passages, total_length, publish_ms, analyzer FROM kb_generations "
                "WHERE org_id = %s AND id = %s FOR UPDATE",
                (gen.org_id, gen.id),
            ).fetchone()
            if coll is None or row is None:
                raise NotFoundError(f"no generation {gen.id} in {gen.org_id}/{gen.collection}")
            previous: int | None = coll["published_generation"]
            if row["status"] == "PUBLISHED":
                return PublishReport(
                    generation=gen.id,
                    previous=None,
                    passages=row["passages"],
                    avgdl=row["total_length"] / max(row["passages"], 1),
                    terms=0,
                    added_sources=0,
                    removed_sources=0,
                    publish_ms=row["publish_ms"],
                    already_published=True,
                )
            if row["status"] != "BUILDING":
                raise InvalidRequestError(f"generation {gen.id} is {row['status']}")
            if previous is not None and previous > gen.id:
                raise InvalidRequestError(
                    f"a newer generation ({previous}) of {gen.collection!r} is already published"
                )
            if previous is not None:
                # The statistics below are the previous publication's plus a difference: one
                # vocabulary. begin_generation took the collection's analyzer; a run that
                # began the collection at the same time with another setting may differ.
                before = conn.execute(
                    "SELECT analyzer FROM kb_generations WHERE org_id = %s AND id = %s",
                    (gen.org_id, previous),
                ).fetchone()
                ours = Analyzer.from_json(row["analyzer"])
                theirs = Analyzer.from_json(before["analyzer"] if before else None)
                if before is not None and ours != theirs:
                    raise InvalidRequestError(
                        f"generation {gen.id} was written with the {ours.name} analyzer, but "
                        f"{gen.collection!r} is published with the {theirs.name} one"
                    )
            params = {"org": gen.org_id, "new": gen.id, "prev": previous, "cid": cid}
            self._drop_retired(conn, gen, previous)
            conn.execute(
                "CREATE TEMP TABLE kb_delta (source_id uuid, version int, sign int) ON COMMIT DROP"
            )
            conn.execute(
                "CREATE TEMP TABLE kb_delta_passages (id bigint, length int, sign int) "
                "ON COMMIT DROP"
            )
            conn.execute(
                """
                INSERT INTO kb_delta
                SELECT source_id, version, sum(sign)::int AS sign FROM (
                    SELECT source_id, version, 1 AS sign FROM kb_generation_sources
                     WHERE org_id = %(org)s AND generation = %(new)s
                    UNION ALL
                    SELECT source_id, version, -1 FROM kb_generation_sources
                     WHERE org_id = %(org)s AND generation = %(prev)s
                ) m GROUP BY source_id, version HAVING sum(sign) <> 0
                """,
                params,
            )
            conn.execute(
                """
                INSERT INTO kb_delta_passages
                SELECT p.id, p.length, d.sign FROM kb_delta d
                JOIN kb_passages p ON p.org_id = %(org)s AND p.source_id = d.source_id
                                  AND p.version = d.version
                """,
                params,
            )
            # Its size decides the plan below: an index probe per passage for a few, one hash
            # join over the partition for a whole first load.
            conn.execute("ANALYZE kb_delta_passages")
            totals = conn.execute(
                """
                SELECT coalesce(g.passages, 0) + coalesce(d.n, 0) AS passages,
                       coalesce(g.total_length, 0) + coalesce(d.len, 0) AS total_length
                FROM (SELECT sum(sign) AS n, sum(sign * length) AS len FROM kb_delta_passages) d
                LEFT JOIN kb_generations g ON g.org_id = %(org)s AND g.id = %(prev)s
                """,
                params,
            ).fetchone()
            assert totals is not None
            terms = conn.execute(
                """
                INSERT INTO kb_term_stats (org_id, generation, term, df)
                SELECT %(org)s, %(new)s, term, sum(df) FROM (
                    SELECT term, df FROM kb_term_stats
                     WHERE org_id = %(org)s AND generation = %(prev)s
                    UNION ALL
                    SELECT po.term, sum(d.sign)::int FROM kb_delta_passages d
                    JOIN kb_postings po ON po.collection_id = %(cid)s AND po.passage_id = d.id
                    GROUP BY po.term
                ) s GROUP BY term HAVING sum(df) > 0
                """,
                params,
            ).rowcount
            delta = conn.execute(
                "SELECT count(*) FILTER (WHERE sign > 0) AS added, "
                "count(*) FILTER (WHERE sign < 0) AS removed FROM kb_delta"
            ).fetchone()
            assert delta is not None
            elapsed_ms = (time.perf_counter() - started) * 1000
            conn.execute(
                "UPDATE kb_generations SET status = 'RETIRED' WHERE org_id = %(org)s "
                "AND id = %(prev)s",
                params,
            )
            conn.execute(
                """
                UPDATE kb_generations SET status = 'PUBLISHED', published_at = now(),
                       passages = %(n)s, total_length = %(len)s, publish_ms = %(ms)s
                WHERE org_id = %(org)s AND id = %(new)s
                """,
                {
                    **params,
                    "n": totals["passages"],
                    "len": totals["total_length"],
                    "ms": elapsed_ms,
                },
            )
            conn.execute(
                "UPDATE kb_collections SET published_generation = %(new)s, published_at = now() "
                "WHERE org_id = %(org)s AND name = %(col)s",
                {**params, "col": gen.collection},
            )
        passages = int(totals["passages"])
        report = PublishReport(
            generation=gen.id,
            previous=previous,
            passages=passages,
            avgdl=float(totals["total_length"]) / max(passages, 1),
            terms=terms,
            added_sources=int(delta["added"]),
            removed_sources=int(delta["removed"]),
            publish_ms=elapsed_ms,
        )
        self._avgdl.pop((gen.org_id, gen.collection), None)
        self._seen.pop((gen.org_id, gen.collection), None)
        log.info("published %s/%s generation %s: %s", gen.org_id, gen.collection, gen.id, report)
        return report

    def _merge_stage(self, org_id: str, collection: str, cid: int) -> None:
        """Move the collection's staged postings into its partition, in a transaction of
        their own (they belong to unpublished versions, so searches do not see them either
        way).

        The first time, the stage *becomes* the partition: ``ATTACH PARTITION`` builds its
        indexes by sorting and checks the foreign key with one join, about half the database
        work of maintaining both per posting (docs/benchmarks.md). It holds a SHARE ROW
        EXCLUSIVE lock on ``kb_passages`` until it commits, so other runs' passage writes
        wait for it; searches do not. Later, whatever a run left in the stage (it began
        before the partition existed) is inserted into the partition. An empty stage is
        created again in the same transaction, so a writer that chose it keeps a table to
        COPY into.
        """
        stage, part = stage_name(cid), partition_name(cid)
        with self.conn.transaction():
            conn = self.conn
            # Publishes of one collection take turns (publish locks the same row).
            conn.execute(
                "SELECT 1 FROM kb_collections WHERE org_id = %s AND name = %s FOR UPDATE",
                (org_id, collection),
            )
            row = conn.execute(
                "SELECT to_regclass(%s) IS NOT NULL AS staged, "
                "to_regclass(%s) IS NOT NULL AS attached",
                (stage, part),
            ).fetchone()
            assert row is not None
            if not row["staged"]:
                return
            # Waits for the writers COPYing into the stage to commit; new ones wait for us.
            conn.execute(
                sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(stage))
            )
            if not row["attached"]:
                conn.execute(
                    sql.SQL("ALTER TABLE {} RENAME TO {}").format(
                        sql.Identifier(stage), sql.Identifier(part)
                    )
                )
                conn.execute(
                    sql.SQL(
                        "ALTER TABLE kb_postings ATTACH PARTITION {} FOR VALUES IN ({})"
                    ).format(sql.Identifier(part), sql.Literal(cid))
                )
                conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(part)))
                ensure_stage(conn, cid)
            else:
                conn.execute(
                    sql.SQL("INSERT INTO kb_postings SELECT * FROM {} ORDER BY term").format(
                        sql.Identifier(stage)
                    )
                )
                conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(stage)))

    def collect_garbage(self, org_id: str, collection: str) -> GarbageReport:
        """Delete retired and abandoned generations and the source versions no live one uses.

        A BUILDING generation older than the published one is abandoned (a later run
        published). Source versions registered or carried since the oldest generation still
        building began are kept, so collecting while an ingest runs is safe.
        """
        with self.conn.transaction():
            conn = self.conn
            coll = conn.execute(
                "SELECT published_generation FROM kb_collections "
                "WHERE org_id = %s AND name = %s FOR UPDATE",
                (org_id, collection),
            ).fetchone()
            if coll is None:
                raise NotFoundError(f"no collection {collection!r} in {org_id}")
            params = {"org": org_id, "col": collection, "pub": coll["published_generation"]}
            conn.execute(
                "UPDATE kb_generations SET status = 'ABANDONED' WHERE org_id = %(org)s "
                "AND collection = %(col)s AND status = 'BUILDING' AND id < %(pub)s",
                params,
            )
            generations = conn.execute(
                "DELETE FROM kb_generations WHERE org_id = %(org)s AND collection = %(col)s "
                "AND status IN ('RETIRED', 'ABANDONED')",
                params,
            ).rowcount
            versions = conn.execute(
                """
                DELETE FROM kb_source_versions v USING kb_sources s
                WHERE s.org_id = %(org)s AND s.collection = %(col)s
                  AND v.org_id = s.org_id AND v.source_id = s.id
                  AND NOT EXISTS (
                      SELECT 1 FROM kb_generation_sources m
                      WHERE m.org_id = v.org_id AND m.source_id = v.source_id
                        AND m.version = v.version)
                  AND v.touched_at < coalesce(
                      (SELECT min(created_at) FROM kb_generations
                        WHERE org_id = %(org)s AND collection = %(col)s
                          AND status = 'BUILDING'),
                      'infinity')
                """,
                params,
            ).rowcount
            if versions:
                # Their passages' postings went with them (the foreign key cascades), except
                # those still in the stage, which has no foreign key.
                stage = stage_name(self._collection_id(org_id, collection))
                staged = conn.execute("SELECT to_regclass(%s) AS t", (stage,)).fetchone()
                if staged is not None and staged["t"] is not None:
                    conn.execute(
                        sql.SQL(
                            "DELETE FROM {} po WHERE NOT EXISTS (SELECT 1 FROM kb_passages p "
                            "WHERE p.org_id = po.org_id AND p.id = po.passage_id)"
                        ).format(sql.Identifier(stage))
                    )
        return GarbageReport(generations=generations, source_versions=versions)
