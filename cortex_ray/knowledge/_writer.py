"""The bulk writer that ingestion jobs use: synchronous (Ray Data UDFs are), one connection.

The publication protocol (docs/knowledge.md):

1. ``begin_generation`` opens a BUILDING generation of a collection.
2. For each source file: ``register_source`` (stable id per path, a version per content
   hash). An unchanged source is ``carry_forward``-ed: one membership row, no rewrite.
   A changed one gets ``write_sections`` / ``write_passages`` (any number of calls, from any
   number of processes; a retried batch writes nothing twice). Jobs use the bulk forms, which
   do per-batch work instead of per-file work: ``register_sources`` (one transaction for many
   files), ``carry_forward_sources``, and ``write_documents`` (the sections, passages,
   postings and health events of many documents in one transaction). ``write_documents`` is
   ``prepare_documents`` (the client-side work: tokens, COPY text under reserved passage ids)
   then ``write_prepared`` (the transaction), so a job can prepare one batch while another
   connection writes the previous one.
3. ``mark_disappeared`` records the sources that were not seen this run.
4. ``publish`` computes the generation's BM25 statistics from the previous publication's
   plus the difference in membership, and swaps the collection's pointer in one
   transaction. Until then searches serve the previous publication; a run that dies before
   publishing leaves it serving, and its rows are reused by a rerun (same content hash → same
   version → same passage keys) or removed by ``collect_garbage``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
from numpy.typing import NDArray
from psycopg import sql
from psycopg.rows import dict_row

from cortex_ray._exceptions import InvalidRequestError, NotFoundError, StorageError
from cortex_ray.knowledge._bm25 import length_norm, term_counts
from cortex_ray.knowledge._split import SplitPassage, SplitSection
from cortex_ray.knowledge._types import (
    GarbageReport,
    Generation,
    HealthEvent,
    PublishReport,
    SourceVersion,
)

__all__ = [
    "DIM",
    "Document",
    "HealthRecord",
    "KnowledgeWriter",
    "PreparedDocuments",
    "SourceFile",
    "vector_literal",
]

log = logging.getLogger("cortex_ray.knowledge")
SyncConn = psycopg.Connection[dict[str, Any]]
DIM = 384
_DEFAULT_AVGDL = 100.0
_HEALTH_EVENTS = ("READ_OK", "READ_FAILURE", "DISAPPEARED", "SKIPPED")
# Appended (with a random suffix) to the content hash of a version retired by
# ``keep_published``: the same content then registers as a fresh version, and publish never
# serves the retired one.
RETIRED_MARK = ":failed:"


SourceFile = tuple[str, str, int]
"""What ``register_sources`` takes per file: ``(path, content hash, size in bytes)``."""
HealthRecord = tuple[str, HealthEvent, str]
"""One health event: ``(path, event, detail)``."""
Document = tuple[SourceVersion, Sequence[SplitSection], Sequence[SplitPassage]]
"""One document version's records for ``write_documents``: ``(source, sections, passages)``."""


def vector_literal(vector: NDArray[np.float32] | Sequence[float]) -> str:
    """pgvector's text form of one vector (accepted by ``vector`` and ``halfvec``)."""
    return "[" + ",".join(f"{float(x):.6g}" for x in vector) + "]"


def _copy_escape(value: str) -> str:
    """``value`` as a field of COPY's text format."""
    return (
        value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    )


def _clean(text: str) -> str:
    # PostgreSQL text cannot hold NUL; a passage with one is from a binary file.
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


_PASSAGES_COPY = (
    "COPY kb_passages (org_id, id, source_id, version, collection, collection_id, ordinal, "
    "section_ordinal, text, line_start, line_end, byte_start, byte_end, length) FROM STDIN"
)


def partition_name(collection_id: int) -> str:
    """The ``kb_postings`` partition of a collection (migration 0005)."""
    return f"kb_postings_{int(collection_id)}"


def stage_name(collection_id: int) -> str:
    """The staging table of a collection that has no partition yet: no indexes, no foreign
    key; the first publish attaches it as the partition (``KnowledgeWriter.publish``)."""
    return f"kb_postings_stage_{int(collection_id)}"


def _postings_copy(table: str) -> sql.Composed:
    return sql.SQL(
        "COPY {} (org_id, collection_id, passage_id, term, tf, impact) FROM STDIN"
    ).format(sql.Identifier(table))


@dataclass
class PreparedDocuments:
    """A ``write_documents`` batch after its client-side work (``prepare_documents``): the
    rows, and the COPY text of the passages and postings under reserved passage ids."""

    generation: Generation
    members: dict[uuid.UUID, int]
    sections: list[tuple[SourceVersion, SplitSection, None]]
    owners: list[SourceVersion]
    passages: list[SplitPassage]
    texts: list[str]
    lengths: list[int]
    counts: dict[tuple[uuid.UUID, int], Counter[str]]
    avgdl: float
    health: list[HealthRecord]
    collection_id: int = 0
    postings_table: str = "kb_postings"  # or the collection's stage (see ``stage_name``)
    passages_copy: str = ""
    postings_copy: str = ""


def _copy_texts(prepared: PreparedDocuments, ids: Sequence[int]) -> tuple[str, str]:
    """The COPY text of the passages and of their postings, under ``ids``.

    Built as text rather than row by row with ``write_row`` (~5 µs a row, ~70 postings a
    passage): terms are ``\\w+`` (no tab, newline or backslash) and numbers need no
    escaping; only names and passage texts are escaped.
    """
    gen = prepared.generation
    org = _copy_escape(gen.org_id)
    col = _copy_escape(gen.collection)
    cid = prepared.collection_id
    passages: list[str] = []
    postings: list[str] = []
    for pid, source, p, text, length in zip(
        ids, prepared.owners, prepared.passages, prepared.texts, prepared.lengths, strict=True
    ):
        span = p.span
        passages.append(
            f"{org}\t{pid}\t{source.source_id}\t{source.version}\t{col}\t{cid}\t{p.ordinal}\t"
            f"{p.section_ordinal}\t{_copy_escape(text)}\t{span.line_start}\t{span.line_end}\t"
            f"{span.byte_start}\t{span.byte_end}\t{length}\n"
        )
        postings.extend(
            _posting_lines(
                f"{org}\t{cid}\t{pid}\t",
                prepared.counts[(source.source_id, p.ordinal)],
                length_norm(length, prepared.avgdl),
            )
        )
    return "".join(passages), "".join(postings)


def _posting_lines(head: str, counts: Counter[str], norm: float) -> Iterator[str]:
    """COPY lines of one passage's postings: ``head`` is ``org\\tcollection_id\\tpassage_id\\t``
    (the organisation escaped), ``norm`` the passage's BM25 length normalisation. Terms are
    ``\\w+`` and numbers need no escaping."""
    return (f"{head}{term}\t{tf}\t{tf / (tf + norm)!r}\n" for term, tf in counts.items())


class KnowledgeWriter:
    """Writes generations of a collection. Not thread-safe: one per worker process."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: SyncConn | None = None
        self._generations: dict[int, Generation] = {}
        self._avgdl: dict[tuple[str, str], float] = {}
        self._seen: dict[tuple[str, str], list[int]] = {}  # [passages, total length]
        self._ensured: set[tuple[str, str]] = set()  # collections known to exist
        self._passage_ids: str | None = None  # the sequence of kb_passages.id
        self._collection_ids: dict[tuple[str, str], int] = {}
        self._postings_tables: dict[int, str] = {}  # generation → where its postings go

    # -- connection --------------------------------------------------------------------

    @property
    def conn(self) -> SyncConn:
        if self._conn is None or self._conn.closed:
            try:
                self._conn = psycopg.connect(self.dsn, row_factory=dict_row, autocommit=True)
            except psycopg.OperationalError as exc:
                raise StorageError(f"cannot reach the database: {exc}") from exc
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> KnowledgeWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _one(self, sql: str, params: Any = None) -> dict[str, Any] | None:
        return self.conn.execute(sql, params).fetchone()

    # -- generations -------------------------------------------------------------------

    def _ensure_collection(self, org_id: str, collection: str) -> None:
        # Once per writer: collections are never deleted while a job writes into them.
        if (org_id, collection) in self._ensured:
            return
        try:
            self.conn.execute(
                "INSERT INTO organisations (id) VALUES (%s) ON CONFLICT DO NOTHING", (org_id,)
            )
            self.conn.execute(
                "INSERT INTO kb_collections (org_id, name) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                (org_id, collection),
            )
        except psycopg.errors.CheckViolation as exc:
            raise InvalidRequestError(
                f"invalid organisation or collection name: {org_id!r}, {collection!r}"
            ) from exc
        self._ensured.add((org_id, collection))

    def begin_generation(self, org_id: str, collection: str) -> Generation:
        """Open a new BUILDING generation of ``collection`` (created on first use)."""
        self._ensure_collection(org_id, collection)
        row = self._one(
            "INSERT INTO kb_generations (org_id, collection, status) VALUES (%s, %s, 'BUILDING') "
            "RETURNING id",
            (org_id, collection),
        )
        assert row is not None
        generation = Generation(org_id=org_id, collection=collection, id=row["id"])
        self._generations[generation.id] = generation
        return generation

    def _generation(self, generation: Generation | int) -> Generation:
        if isinstance(generation, Generation):
            return generation
        known = self._generations.get(generation)
        if known is None:
            row = self._one(
                "SELECT org_id, collection FROM kb_generations WHERE id = %s", (generation,)
            )
            if row is None:
                raise NotFoundError(f"no generation {generation}")
            known = Generation(org_id=row["org_id"], collection=row["collection"], id=generation)
            self._generations[generation] = known
        return known

    def _collection_id(self, org_id: str, collection: str) -> int:
        key = (org_id, collection)
        cid = self._collection_ids.get(key)
        if cid is None:
            row = self._one("SELECT id FROM kb_collections WHERE org_id = %s AND name = %s", key)
            if row is None:
                raise NotFoundError(f"no collection {collection!r} in {org_id}")
            cid = self._collection_ids[key] = int(row["id"])
        return cid

    def _postings_table(self, gen: Generation) -> str:
        """Where this writer COPYs the generation's postings, decided at its first write: the
        partitioned ``kb_postings`` when the collection has its partition (each posting then
        updates two indexes and is checked against its passage), otherwise the collection's
        stage, a table without indexes or foreign key that publishing attaches as the
        partition (the indexes then built by sorting, the key checked by one join)."""
        table = self._postings_tables.get(gen.id)
        if table is None:
            cid = self._collection_id(gen.org_id, gen.collection)
            row = self._one(
                "SELECT to_regclass(%s) IS NOT NULL AS attached", (partition_name(cid),)
            )
            if row is not None and row["attached"]:
                table = "kb_postings"
            else:
                self._ensure_stage(self.conn, cid)
                table = stage_name(cid)
            self._postings_tables[gen.id] = table
        return table

    @staticmethod
    def _ensure_stage(conn: SyncConn, cid: int) -> None:
        # The CHECK lets ATTACH PARTITION skip its scan of the rows.
        statement = sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (LIKE kb_postings INCLUDING DEFAULTS "
            "INCLUDING CONSTRAINTS, CHECK (collection_id = {}))"
        ).format(sql.Identifier(stage_name(cid)), sql.Literal(cid))
        # Another writer may create it at the same moment (a savepoint when in a transaction).
        with (
            contextlib.suppress(psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable),
            conn.transaction(),
        ):
            conn.execute(statement)

    def _lock_building(self, conn: SyncConn, gen: Generation) -> None:
        # FOR SHARE: writers proceed together; publish (FOR UPDATE) waits for them.
        row = conn.execute(
            "SELECT status FROM kb_generations WHERE org_id = %s AND id = %s FOR SHARE",
            (gen.org_id, gen.id),
        ).fetchone()
        if row is None:
            raise NotFoundError(f"no generation {gen.id} in {gen.org_id}")
        if row["status"] != "BUILDING":
            raise InvalidRequestError(f"generation {gen.id} is {row['status']}, not BUILDING")

    # -- sources -----------------------------------------------------------------------

    def _upsert_sources(
        self, conn: SyncConn, org_id: str, collection: str, paths: Sequence[str]
    ) -> dict[str, dict[str, Any]]:
        """Create (or find) the sources of ``paths`` and row-lock them, in path order (so
        concurrent writers cannot deadlock); ``{path: {"id", "next_version"}}``."""
        ordered = sorted(set(paths))
        rows = conn.execute(
            """
            INSERT INTO kb_sources (org_id, id, collection, path)
            SELECT %s, t.id, %s, t.path FROM unnest(%s::uuid[], %s::text[]) AS t(id, path)
            ORDER BY t.path
            ON CONFLICT (org_id, collection, path) DO UPDATE SET path = EXCLUDED.path
            RETURNING id, path, next_version
            """,
            (org_id, collection, [uuid.uuid4() for _ in ordered], ordered),
        ).fetchall()
        return {r["path"]: r for r in rows}

    def register_source(
        self, org_id: str, collection: str, path: str, content_hash: str, size_bytes: int
    ) -> SourceVersion:
        """The stable id of ``path`` and the version of this content (a new one per new hash).

        ``unchanged`` is true when the collection's published generation already serves
        exactly this version: carry it forward instead of rewriting it.
        """
        return self.register_sources(org_id, collection, [(path, content_hash, size_bytes)])[0]

    def register_sources(
        self, org_id: str, collection: str, files: Sequence[SourceFile]
    ) -> list[SourceVersion]:
        """``register_source`` for many files in one transaction; results in input order.

        A path listed twice must have the same content hash both times.
        """
        wanted: dict[str, tuple[str, int]] = {}
        for path, content_hash, size_bytes in files:
            if not path or not content_hash:
                raise InvalidRequestError("a source needs a path and a content hash")
            if wanted.setdefault(path, (content_hash, size_bytes))[0] != content_hash:
                raise InvalidRequestError(f"{path!r} is listed twice with different content")
        if not wanted:
            return []
        self._ensure_collection(org_id, collection)
        with self.conn.transaction():
            conn = self.conn
            sources = self._upsert_sources(conn, org_id, collection, list(wanted))  # locked now
            paths = sorted(wanted)
            ids = [sources[path]["id"] for path in paths]
            existing: dict[uuid.UUID, int] = {
                r["source_id"]: int(r["version"])
                for r in conn.execute(
                    """
                    UPDATE kb_source_versions v SET touched_at = now()
                    FROM unnest(%s::uuid[], %s::text[]) AS t(source_id, content_hash)
                    WHERE v.org_id = %s AND v.source_id = t.source_id
                      AND v.content_hash = t.content_hash
                    RETURNING v.source_id, v.version
                    """,
                    (ids, [wanted[path][0] for path in paths], org_id),
                ).fetchall()
            }
            new = [path for path in paths if sources[path]["id"] not in existing]
            if new:
                new_ids = [sources[path]["id"] for path in new]
                conn.execute(
                    """
                    INSERT INTO kb_source_versions
                        (org_id, source_id, version, content_hash, size_bytes)
                    SELECT %s, t.* FROM unnest(%s::uuid[], %s::int[], %s::text[], %s::bigint[])
                        AS t(source_id, version, content_hash, size_bytes)
                    """,
                    (
                        org_id,
                        new_ids,
                        [sources[path]["next_version"] for path in new],
                        [wanted[path][0] for path in new],
                        [wanted[path][1] for path in new],
                    ),
                )
                conn.execute(
                    "UPDATE kb_sources SET next_version = next_version + 1 "
                    "WHERE org_id = %s AND id = ANY(%s::uuid[])",
                    (org_id, new_ids),
                )
                existing.update(
                    (sources[path]["id"], int(sources[path]["next_version"])) for path in new
                )
            published: dict[uuid.UUID, int] = {
                r["source_id"]: int(r["version"])
                for r in conn.execute(
                    """
                    SELECT m.source_id, m.version FROM kb_collections c
                    JOIN kb_generation_sources m
                      ON m.org_id = c.org_id AND m.generation = c.published_generation
                    WHERE c.org_id = %s AND c.name = %s AND m.source_id = ANY(%s::uuid[])
                    """,
                    (org_id, collection, ids),
                ).fetchall()
            }
        result = []
        for path, _, _ in files:
            source_id = sources[path]["id"]
            version = existing[source_id]
            result.append(
                SourceVersion(
                    org_id=org_id,
                    collection=collection,
                    path=path,
                    source_id=source_id,
                    version=version,
                    unchanged=published.get(source_id) == version,
                )
            )
        return result

    def record_health(
        self, org_id: str, collection: str, path: str, event: HealthEvent, detail: str = ""
    ) -> None:
        """Record what happened when the source at ``path`` was last looked at."""
        self.record_health_events(org_id, collection, [(path, event, detail)])

    def record_health_events(
        self, org_id: str, collection: str, events: Sequence[HealthRecord]
    ) -> None:
        """``record_health`` for many paths in one transaction (a path's last event wins)."""
        self._check_events(events)
        if not events:
            return
        self._ensure_collection(org_id, collection)
        with self.conn.transaction():
            self._record_events(self.conn, org_id, collection, events)

    @staticmethod
    def _check_events(events: Sequence[HealthRecord]) -> None:
        for _, event, _ in events:
            if event not in _HEALTH_EVENTS:
                raise InvalidRequestError(f"unknown health event {event!r}")

    def _record_events(
        self, conn: SyncConn, org_id: str, collection: str, events: Sequence[HealthRecord]
    ) -> None:
        sources = self._upsert_sources(conn, org_id, collection, [e[0] for e in events])
        ids = [sources[path]["id"] for path, _, _ in events]
        self._health_many(conn, org_id, ids, [e[1] for e in events], [e[2][:2000] for e in events])

    @staticmethod
    def _health_many(
        conn: SyncConn, org_id: str, ids: list[Any], events: list[str], details: list[str]
    ) -> None:
        if not ids:
            return
        conn.execute(
            "INSERT INTO kb_source_events (org_id, source_id, event, detail) "
            "SELECT %s, t.* FROM unnest(%s::uuid[], %s::text[], %s::text[]) "
            "AS t(source_id, event, detail)",
            (org_id, ids, events, details),
        )
        last = {source_id: i for i, source_id in enumerate(ids)}  # one update per source
        conn.execute(
            """
            UPDATE kb_sources s SET health = t.event, health_detail = t.detail, health_at = now()
            FROM unnest(%s::uuid[], %s::text[], %s::text[]) AS t(id, event, detail)
            WHERE s.org_id = %s AND s.id = t.id
            """,
            (
                list(last),
                [events[i] for i in last.values()],
                [details[i] for i in last.values()],
                org_id,
            ),
        )

    def _include(
        self, conn: SyncConn, gen: Generation, source_id: Any, version: int, carried: bool
    ) -> None:
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

    @staticmethod
    def _include_many(
        conn: SyncConn, gen: Generation, members: dict[uuid.UUID, int], carried: bool
    ) -> None:
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
                    """
                    SELECT m.source_id, m.version FROM kb_collections c
                    JOIN kb_generation_sources m
                      ON m.org_id = c.org_id AND m.generation = c.published_generation
                    WHERE c.org_id = %s AND c.name = %s AND m.source_id = ANY(%s::uuid[])
                    """,
                    (gen.org_id, gen.collection, list(wanted)),
                ).fetchall()
            }
            missing = wanted - published.keys()
            if missing:
                raise InvalidRequestError(
                    f"source {sorted(missing)[0]} is not in the published generation of "
                    f"{gen.collection!r}: write it instead"
                )
            self._include_many(conn, gen, published, carried=True)
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
            self._include_many(conn, gen, dict(kept.values()), carried=True)
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

    def _check_source(self, gen: Generation, source: SourceVersion) -> None:
        if (source.org_id, source.collection) != (gen.org_id, gen.collection):
            raise InvalidRequestError(
                f"source {source.path!r} belongs to {source.org_id}/{source.collection}, "
                f"not to generation {gen.id} of {gen.org_id}/{gen.collection}"
            )

    # -- content -----------------------------------------------------------------------

    def write_sections(
        self,
        generation: Generation | int,
        source: SourceVersion,
        sections: Sequence[SplitSection],
        section_vectors: NDArray[np.float32] | None = None,
    ) -> int:
        """Store a document's sections (and their eager vectors); returns the rows written.

        Idempotent per (source version, ordinal); writing a section again with a vector fills
        in a vector that was missing.
        """
        gen = self._generation(generation)
        self._check_source(gen, source)
        if section_vectors is not None and section_vectors.shape != (len(sections), DIM):
            raise InvalidRequestError(
                f"section_vectors must have shape ({len(sections)}, {DIM}), "
                f"not {section_vectors.shape}"
            )
        vectors: list[str | None] = (
            [vector_literal(v) for v in section_vectors]
            if section_vectors is not None
            else [None] * len(sections)
        )
        with self.conn.transaction():
            self._lock_building(self.conn, gen)
            self._include(self.conn, gen, source.source_id, source.version, carried=False)
            return self._insert_sections(
                self.conn, gen, [(source, s, v) for s, v in zip(sections, vectors, strict=True)]
            )

    @staticmethod
    def _insert_sections(
        conn: SyncConn,
        gen: Generation,
        rows: Sequence[tuple[SourceVersion, SplitSection, str | None]],
    ) -> int:
        # One row per (source version, ordinal): a merged retry may repeat one, and ON
        # CONFLICT DO UPDATE cannot touch a row twice in one statement.
        firsts: dict[tuple[uuid.UUID, int, int], tuple[SourceVersion, SplitSection, str | None]]
        firsts = {}
        for src, s, v in rows:
            firsts.setdefault((src.source_id, src.version, s.ordinal), (src, s, v))
        if not firsts:
            return 0
        kept = list(firsts.values())
        cur = conn.execute(
            """
            INSERT INTO kb_sections (org_id, source_id, version, collection, ordinal,
                heading_path, line_start, line_end, byte_start, byte_end, summary_text,
                embedding)
            SELECT %(org)s, t.src, t.ver, %(col)s, t.ordinal,
                   ARRAY(SELECT jsonb_array_elements_text(t.heading::jsonb)),
                   t.ls, t.le, t.bs, t.be, t.summary, t.vec::halfvec(384)
            FROM unnest(%(src)s::uuid[], %(ver)s::int[], %(ordinal)s::int[],
                        %(heading)s::text[], %(ls)s::int[], %(le)s::int[], %(bs)s::bigint[],
                        %(be)s::bigint[], %(summary)s::text[], %(vec)s::text[])
                 AS t(src, ver, ordinal, heading, ls, le, bs, be, summary, vec)
            ON CONFLICT (org_id, source_id, version, ordinal) DO UPDATE
               SET embedding = EXCLUDED.embedding
             WHERE kb_sections.embedding IS NULL AND EXCLUDED.embedding IS NOT NULL
            """,
            {
                "org": gen.org_id,
                "col": gen.collection,
                "src": [src.source_id for src, _, _ in kept],
                "ver": [src.version for src, _, _ in kept],
                "ordinal": [s.ordinal for _, s, _ in kept],
                "heading": [json.dumps(list(s.heading_path)) for _, s, _ in kept],
                "ls": [s.span.line_start for _, s, _ in kept],
                "le": [s.span.line_end for _, s, _ in kept],
                "bs": [s.span.byte_start for _, s, _ in kept],
                "be": [s.span.byte_end for _, s, _ in kept],
                "summary": [_clean(s.summary_text) for _, s, _ in kept],
                "vec": [v for _, _, v in kept],
            },
        )
        return cur.rowcount

    def _avgdl_estimate(self, gen: Generation, lengths: Sequence[int]) -> float:
        """The average passage length the impacts are computed with.

        The published generation's when there is one; before the first publication, the mean
        of the lengths this writer has seen (batches are thousands of passages, so workers
        agree closely). Impacts only order the candidates; scores use the exact statistics.
        """
        key = (gen.org_id, gen.collection)
        if key not in self._avgdl:
            row = self._one(
                """
                SELECT g.total_length::float8 / nullif(g.passages, 0) AS avgdl
                FROM kb_collections c JOIN kb_generations g
                  ON g.org_id = c.org_id AND g.id = c.published_generation
                WHERE c.org_id = %s AND c.name = %s
                """,
                key,
            )
            if row and row["avgdl"]:
                self._avgdl[key] = float(row["avgdl"])
            else:
                self._seen.setdefault(key, [0, 0])
        seen = self._seen.get(key)
        if seen is not None:
            seen[0] += len(lengths)
            seen[1] += sum(lengths)
            return seen[1] / seen[0] if seen[0] and seen[1] else _DEFAULT_AVGDL
        return self._avgdl[key]

    def write_passages(
        self, generation: Generation | int, source: SourceVersion, passages: Sequence[SplitPassage]
    ) -> int:
        """Store passages and their postings; returns how many were new.

        Idempotent per (source version, passage ordinal): a retried batch inserts nothing twice,
        and postings are written only for the passages this call inserted, in the same
        transaction.
        """
        return self.write_documents(generation, [(source, (), passages)])

    def write_documents(
        self,
        generation: Generation | int,
        documents: Sequence[Document],
        health: Sequence[HealthRecord] = (),
    ) -> int:
        """The sections (without vectors), passages and postings of many documents, and health
        events, in one transaction; returns how many passages were new.

        Every document's source becomes a member of ``generation`` (also one with no records).
        Idempotent like ``write_sections`` and ``write_passages``: a retried call inserts no
        passage or posting twice (health events, a log, are recorded again).
        ``prepare_documents`` + ``write_prepared`` are the same in two steps.
        """
        return self.write_prepared(self.prepare_documents(generation, documents, health))

    def prepare_documents(
        self,
        generation: Generation | int,
        documents: Sequence[Document],
        health: Sequence[HealthRecord] = (),
    ) -> PreparedDocuments:
        """The client-side work of ``write_documents``: tokenise the passages and build the
        COPY text of passages and postings, under passage ids reserved from the table's
        sequence. Only the reservation touches the database (one small query), so a job can
        prepare the next batch while another connection writes this one (``write_prepared``).
        """
        gen = self._generation(generation)
        self._check_events(health)
        members: dict[uuid.UUID, int] = {}
        for source, _, _ in documents:
            self._check_source(gen, source)
            if members.setdefault(source.source_id, source.version) != source.version:
                raise InvalidRequestError(f"two versions of {source.path!r} in one call")
        counts: dict[tuple[uuid.UUID, int], Counter[str]] = {}
        owners: list[SourceVersion] = []
        flat: list[SplitPassage] = []
        lengths: list[int] = []
        texts: list[str] = []
        for source, _, passages in documents:
            for p in passages:
                text = _clean(p.text)
                frequencies, length = term_counts(text)
                counts[(source.source_id, p.ordinal)] = frequencies
                owners.append(source)
                flat.append(p)
                lengths.append(length)
                texts.append(text)
        avgdl = self._avgdl_estimate(gen, lengths) if flat else _DEFAULT_AVGDL
        prepared = PreparedDocuments(
            generation=gen,
            members=members,
            sections=[(source, s, None) for source, sections, _ in documents for s in sections],
            owners=owners,
            passages=flat,
            texts=texts,
            lengths=lengths,
            counts=counts,
            avgdl=avgdl,
            health=list(health),
        )
        if flat:
            prepared.collection_id = self._collection_id(gen.org_id, gen.collection)
            prepared.postings_table = self._postings_table(gen)
            ids = self._reserve_passage_ids(len(flat))
            prepared.passages_copy, prepared.postings_copy = _copy_texts(prepared, ids)
        return prepared

    def _reserve_passage_ids(self, n: int) -> list[int]:
        # Identity values taken ahead: unique whatever else inserts (gaps are harmless).
        if self._passage_ids is None:
            row = self._one("SELECT pg_get_serial_sequence('kb_passages', 'id') AS seq")
            assert row is not None
            self._passage_ids = str(row["seq"])
        rows = self.conn.execute(
            "SELECT nextval(%s::regclass) AS id FROM generate_series(1, %s)",
            (self._passage_ids, n),
        ).fetchall()
        return [r["id"] for r in rows]

    def write_prepared(self, prepared: PreparedDocuments) -> int:
        """Write what ``prepare_documents`` built, in one transaction; returns how many
        passages were new. Any writer may write it (e.g. one on another thread).

        The passages and their postings are COPYed under the reserved ids. If some of these
        passages exist already (a retried batch, or another task writing the same version),
        the COPY fails on the unique key and the batch is written again the careful way:
        ``INSERT ... ON CONFLICT DO NOTHING``, postings only for the passages inserted.
        """
        gen = prepared.generation
        if prepared.health:
            self._ensure_collection(gen.org_id, gen.collection)
        if prepared.passages:
            try:
                return self._write_prepared(prepared, fast=True)
            except psycopg.errors.UniqueViolation:
                log.info("generation %s: passages written before; inserting the new ones", gen.id)
        return self._write_prepared(prepared, fast=False)

    def _write_prepared(self, prepared: PreparedDocuments, *, fast: bool) -> int:
        gen = prepared.generation
        with self.conn.transaction():
            conn = self.conn
            self._lock_building(conn, gen)
            self._include_many(conn, gen, prepared.members, carried=False)
            self._insert_sections(conn, gen, prepared.sections)
            inserted = 0
            if prepared.passages and fast:
                with conn.cursor().copy(_PASSAGES_COPY) as copy:
                    copy.write(prepared.passages_copy)
                with conn.cursor().copy(_postings_copy(prepared.postings_table)) as copy:
                    copy.write(prepared.postings_copy)
                inserted = len(prepared.passages)
            elif prepared.passages:
                inserted = self._insert_passages(conn, prepared)
            if prepared.health:
                self._record_events(conn, gen.org_id, gen.collection, prepared.health)
        return inserted

    @staticmethod
    def _insert_passages(conn: SyncConn, prepared: PreparedDocuments) -> int:
        # Postings go only to the passages this statement inserted (a retry inserts none).
        gen, owners, passages = prepared.generation, prepared.owners, prepared.passages
        inserted = conn.execute(
            """
            INSERT INTO kb_passages (org_id, source_id, version, collection, collection_id,
                ordinal, section_ordinal, text, line_start, line_end, byte_start, byte_end,
                length)
            SELECT %(org)s, t.src, t.ver, %(col)s, %(cid)s, t.ordinal, t.section, t.text, t.ls,
                   t.le, t.bs, t.be, t.length
            FROM unnest(%(src)s::uuid[], %(ver)s::int[], %(ordinal)s::int[], %(section)s::int[],
                        %(text)s::text[], %(ls)s::int[], %(le)s::int[], %(bs)s::bigint[],
                        %(be)s::bigint[], %(length)s::int[])
                 AS t(src, ver, ordinal, section, text, ls, le, bs, be, length)
            ON CONFLICT (org_id, source_id, version, ordinal) DO NOTHING
            RETURNING id, source_id, ordinal, length
            """,
            {
                "org": gen.org_id,
                "col": gen.collection,
                "cid": prepared.collection_id,
                "src": [s.source_id for s in owners],
                "ver": [s.version for s in owners],
                "ordinal": [p.ordinal for p in passages],
                "section": [p.section_ordinal for p in passages],
                "text": prepared.texts,
                "ls": [p.span.line_start for p in passages],
                "le": [p.span.line_end for p in passages],
                "bs": [p.span.byte_start for p in passages],
                "be": [p.span.byte_end for p in passages],
                "length": prepared.lengths,
            },
        ).fetchall()
        if inserted:
            # The COPY text is built here rather than row by row with ``write_row`` (~5 µs a
            # row, ~70 rows a passage): terms are ``\w+`` (no tab, newline or backslash)
            # and ints and floats need no escaping; only the names are escaped.
            head = f"{_copy_escape(gen.org_id)}\t{prepared.collection_id}\t"
            with conn.cursor().copy(_postings_copy(prepared.postings_table)) as copy:
                lines: list[str] = []
                for row in inserted:
                    lines.extend(
                        _posting_lines(
                            f"{head}{row['id']}\t",
                            prepared.counts[(row["source_id"], row["ordinal"])],
                            length_norm(row["length"], prepared.avgdl),
                        )
                    )
                    if len(lines) >= 20_000:
                        copy.write("".join(lines))
                        lines = []
                copy.write("".join(lines))
        return len(inserted)

    def mark_disappeared(
        self, generation: Generation | int, paths_seen: Iterable[str]
    ) -> list[str]:
        """Record DISAPPEARED for the published sources whose paths this run did not see.

        They are not members of the new generation (nothing carried them), so they stop being
        served when it is published. Returns their paths.
        """
        gen = self._generation(generation)
        with self.conn.transaction():
            conn = self.conn
            conn.execute("CREATE TEMP TABLE kb_seen (path text) ON COMMIT DROP")
            with conn.cursor().copy("COPY kb_seen (path) FROM STDIN") as copy:
                for path in paths_seen:
                    copy.write_row((path,))
            rows = conn.execute(
                """
                SELECT s.id, s.path FROM kb_collections c
                JOIN kb_generation_sources m
                  ON m.org_id = c.org_id AND m.generation = c.published_generation
                JOIN kb_sources s ON s.org_id = m.org_id AND s.id = m.source_id
                WHERE c.org_id = %s AND c.name = %s
                  AND NOT EXISTS (SELECT 1 FROM kb_seen k WHERE k.path = s.path)
                ORDER BY s.path
                """,
                (gen.org_id, gen.collection),
            ).fetchall()
            self._health_many(
                conn,
                gen.org_id,
                [r["id"] for r in rows],
                ["DISAPPEARED"] * len(rows),
                ["not seen by the run"] * len(rows),
            )
        return [r["path"] for r in rows]

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
                "SELECT status, passages, total_length, publish_ms FROM kb_generations "
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
                self._ensure_stage(conn, cid)
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

    # -- backfill (for jobs that embed with a remote model) ----------------------------

    def passages_to_embed(self, org_id: str, collection: str, limit: int) -> list[tuple[int, str]]:
        """Published passages without a vector, most used first: ``(passage id, text)``."""
        rows = self.conn.execute(_TO_EMBED_SQL, (org_id, collection, limit)).fetchall()
        return [(r["id"], r["text"]) for r in rows]

    def write_passage_vectors(
        self, org_id: str, passage_ids: Sequence[int], vectors: NDArray[np.float32]
    ) -> int:
        """Store passage vectors computed elsewhere; returns how many rows were updated."""
        if vectors.shape != (len(passage_ids), DIM):
            raise InvalidRequestError(f"vectors must have shape ({len(passage_ids)}, {DIM})")
        return self.conn.execute(
            _SET_VECTORS_SQL,
            (list(passage_ids), [vector_literal(v) for v in vectors], org_id),
        ).rowcount


# Published passages of one collection without a vector, most used first (hit count, then
# most recent use), then in document order.
_TO_EMBED_SQL = """
SELECT p.id, p.text
FROM kb_collections c
JOIN kb_generation_sources m ON m.org_id = c.org_id AND m.generation = c.published_generation
JOIN kb_passages p ON p.org_id = m.org_id AND p.source_id = m.source_id AND p.version = m.version
LEFT JOIN kb_passage_usage u ON u.org_id = p.org_id AND u.passage_id = p.id
WHERE c.org_id = %s AND c.name = %s AND p.embedding IS NULL
ORDER BY u.hits DESC NULLS LAST, u.last_used_at DESC NULLS LAST, p.id
LIMIT %s
"""

_SET_VECTORS_SQL = """
UPDATE kb_passages p SET embedding = v.vec::halfvec(384)
FROM unnest(%s::bigint[], %s::text[]) AS v(id, vec)
WHERE p.org_id = %s AND p.id = v.id AND p.embedding IS NULL
"""
