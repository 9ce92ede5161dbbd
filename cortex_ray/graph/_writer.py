"""The synchronous graph writer jobs use: extraction runs, a source version's facts, the
extractors' ledger, and the published versions and passages they read. Every write goes
through ``graph_assert`` (migration 0017): entities, aliases, assertions, the closing of
contradicted ones and their outbox rows, in one transaction."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import Any
from uuid import UUID

from cortex_ray._sync import SyncConn, SyncConnection
from cortex_ray.graph._extract import EXTRACTOR_VERSION, extract_mentions, facts_from_mentions
from cortex_ray.graph._model_extract import Passage, PublishedVersion

__all__ = ["DETERMINISTIC", "GraphWriter", "SourceExtraction", "assert_rows"]

DETERMINISTIC = "deterministic"
"""The extraction method of the rule-based extractor."""

_BATCH = 2000  # assertions per graph_assert call


def assert_rows(
    conn: SyncConn, org_id: str, run_id: int, rows: Sequence[dict[str, Any]]
) -> dict[str, int]:
    """Write ``rows`` (``graph_assert``'s JSON objects) in the connection's transaction."""
    totals = {"entities": 0, "assertions": 0, "closed": 0}
    for i in range(0, len(rows), _BATCH):
        got = conn.execute(
            "SELECT graph_assert(%s, %s, %s::jsonb) AS r",
            (org_id, run_id, json.dumps(rows[i : i + _BATCH])),
        ).fetchone()
        assert got is not None
        for key in totals:
            totals[key] += int(got["r"][key])
    return totals


class SourceExtraction:
    """The outcome of extracting one source version."""

    def __init__(self, status: str, assertions: int = 0, closed: int = 0, detail: str = "") -> None:
        self.status = status  # extracted | changed | missing
        self.assertions = assertions
        self.closed = closed
        self.detail = detail


class GraphWriter(SyncConnection):
    """One connection (autocommit; each write is its own transaction). Not thread-safe."""

    def begin_run(
        self,
        org_id: str,
        *,
        method: str = DETERMINISTIC,
        method_version: str = EXTRACTOR_VERSION,
        collection: str | None = None,
        generation: int | None = None,
        principal_id: str | None = None,
    ) -> int:
        """Record a RUNNING extraction run; returns its id."""
        self.conn.execute(
            "INSERT INTO organisations (id) VALUES (%s) ON CONFLICT DO NOTHING", (org_id,)
        )
        row = self.conn.execute(
            "INSERT INTO graph_extraction_runs (org_id, method, method_version, collection, "
            "generation, principal_id) VALUES (%s, %s, %s, %s, %s, %s) RETURNING id",
            (org_id, method, method_version, collection, generation, principal_id),
        ).fetchone()
        assert row is not None
        return int(row["id"])

    def finish_run(
        self, org_id: str, run_id: int, *, failed: str | None = None, detail: str = ""
    ) -> None:
        """DONE (or FAILED with the reason); the counts are the run's assertions. ``detail``
        (what a DONE run reports beyond them) is kept after the failure's reason."""
        self.conn.execute(
            """
            UPDATE graph_extraction_runs r SET status = %s, detail = %s, finished_at = now(),
                   assertions = (SELECT count(*) FROM graph_assertions a
                                 WHERE a.org_id = r.org_id AND a.run_id = r.id),
                   sources = (SELECT count(DISTINCT (source_id, source_version))
                              FROM graph_assertions a WHERE a.org_id = r.org_id AND a.run_id = r.id)
            WHERE org_id = %s AND id = %s
            """,
            (
                "FAILED" if failed else "DONE",
                " ".join(part for part in (failed, detail) if part),
                org_id,
                run_id,
            ),
        )

    def extract_sources(
        self, org_id: str, run_id: int, versions: Sequence[tuple[UUID | str, int, str]]
    ) -> list[SourceExtraction]:
        """For each ``(source id, version, file path)``: read the file again (streamed by
        line), check that it is the content registered under the version, and find its
        facts with the rule-based extractor. Then one transaction writes every version's
        facts and closes what older versions of each source asserted by the same method.

        Nothing is written for a file that changed since (``changed``) or is gone
        (``missing``). ``assertions`` of an outcome counts the facts found in the file.
        """
        known = {
            (str(r["source_id"]), r["version"]): r
            for r in self.conn.execute(
                """
                SELECT v.source_id, v.version, s.path AS key, v.content_hash, v.created_at
                FROM kb_source_versions v JOIN kb_sources s
                  ON s.org_id = v.org_id AND s.id = v.source_id
                WHERE v.org_id = %s
                  AND (v.source_id, v.version) IN (SELECT * FROM unnest(%s::uuid[], %s::int[]))
                """,
                (org_id, [str(v[0]) for v in versions], [v[1] for v in versions]),
            )
        }
        outcomes: list[SourceExtraction] = []
        rows: list[dict[str, Any]] = []
        extracted: list[tuple[tuple[str, int, Any], int]] = []
        for source_id, version, path in versions:
            row = known.get((str(source_id), version))
            if row is None:
                outcomes.append(SourceExtraction("missing", detail="no such source version"))
                continue
            found = _facts(path, row)
            if isinstance(found, SourceExtraction):
                outcomes.append(found)
                continue
            base = {
                "source_id": str(source_id),
                "source_version": version,
                "method": DETERMINISTIC,
                "method_version": EXTRACTOR_VERSION,
                "valid_from": row["created_at"].isoformat(),
            }
            rows += [{**base, **fact} for fact in found]
            extracted.append(((str(source_id), version, row["created_at"]), len(found)))
            outcomes.append(SourceExtraction("extracted", len(found)))
        if extracted:
            with self.conn.transaction():
                assert_rows(self.conn, org_id, run_id, rows)
                for (source_id, version, at), facts in extracted:
                    self.conn.execute(
                        "SELECT graph_close_superseded(%s, %s, %s, %s, %s)",
                        (org_id, source_id, version, DETERMINISTIC, at),
                    )
                    self.conn.execute(
                        _LEDGER,
                        (org_id, source_id, version, DETERMINISTIC, EXTRACTOR_VERSION, run_id,
                         0, facts),
                    )  # fmt: skip
        return outcomes

    def published_versions(
        self,
        org_id: str,
        *,
        collection: str | None = None,
        source_ids: Sequence[UUID | str] = (),
        since_version: int | None = None,
        method: str,
        method_version: str,
    ) -> list[PublishedVersion]:
        """The source versions published generations serve (of ``collection``, of
        ``source_ids``, numbered ``since_version`` or later) that ``method`` at
        ``method_version`` has not extracted yet, in collection and path order."""
        rows = self.conn.execute(
            """
            SELECT gs.source_id, gs.version, s.path AS key, s.collection, v.created_at
            FROM kb_collections c
            JOIN kb_generation_sources gs
              ON gs.org_id = c.org_id AND gs.generation = c.published_generation
            JOIN kb_sources s ON s.org_id = gs.org_id AND s.id = gs.source_id
            JOIN kb_source_versions v
              ON v.org_id = gs.org_id AND v.source_id = gs.source_id AND v.version = gs.version
            WHERE c.org_id = %(org)s
              AND (%(collection)s::text IS NULL OR c.name = %(collection)s)
              AND (cardinality(%(sources)s::uuid[]) = 0 OR gs.source_id = ANY(%(sources)s))
              AND (%(since)s::int IS NULL OR gs.version >= %(since)s)
              AND NOT EXISTS (
                  SELECT 1 FROM graph_extracted_versions x
                  WHERE x.org_id = gs.org_id AND x.source_id = gs.source_id
                    AND x.version = gs.version AND x.method = %(method)s
                    AND x.method_version = %(method_version)s)
            ORDER BY s.collection, s.path
            """,
            {
                "org": org_id,
                "collection": collection,
                "sources": [str(s) for s in source_ids],
                "since": since_version,
                "method": method,
                "method_version": method_version,
            },
        ).fetchall()
        return [
            PublishedVersion(
                str(r["source_id"]), r["version"], r["key"], r["collection"], r["created_at"]
            )
            for r in rows
        ]

    def passages(self, org_id: str, source_id: UUID | str, version: int) -> list[Passage]:
        """A version's passages in order (their text is the file's exact bytes)."""
        return [
            Passage(str(source_id), version, r["ordinal"], r["text"], r["byte_start"],
                    r["line_start"])
            for r in self.conn.execute(
                "SELECT ordinal, text, byte_start, line_start FROM kb_passages "
                "WHERE org_id = %s AND source_id = %s AND version = %s ORDER BY ordinal",
                (org_id, str(source_id), version),
            )
        ]  # fmt: skip

    def write_version(
        self,
        org_id: str,
        run_id: int,
        version: PublishedVersion,
        rows: Sequence[dict[str, Any]],
        *,
        method: str,
        method_version: str,
        passages: int,
    ) -> dict[str, int]:
        """One transaction: the version's facts (``rows``, ``graph_assert``'s objects
        without method, version and valid time), the closing of what older versions of the
        source asserted by ``method``, and the ledger row that marks the version extracted
        by ``method`` at ``method_version`` (also when ``rows`` is empty)."""
        base = {
            "method": method,
            "method_version": method_version,
            "valid_from": version.created_at.isoformat(),
        }
        with self.conn.transaction():
            totals = assert_rows(self.conn, org_id, run_id, [{**r, **base} for r in rows])
            self.conn.execute(
                "SELECT graph_close_superseded(%s, %s, %s, %s, %s)",
                (org_id, version.source_id, version.version, method, version.created_at),
            )
            self.conn.execute(
                _LEDGER,
                (org_id, version.source_id, version.version, method, method_version, run_id,
                 passages, totals["assertions"]),
            )  # fmt: skip
        return totals


def _facts(path: str, version: dict[str, Any]) -> list[dict[str, Any]] | SourceExtraction:
    """The facts of one file as ``graph_assert`` rows (without the source's fields), or the
    reason there are none to write."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            facts = list(facts_from_mentions(version["key"], extract_mentions(_hashed(f, digest))))
    except OSError as exc:
        return SourceExtraction("missing", detail=str(exc))
    if digest.hexdigest() != version["content_hash"]:
        return SourceExtraction("changed", detail="the file changed since it was written")
    return [
        {
            "s_type": s_type,
            "s_name": s_name,
            "p": predicate,
            "o_type": m.type,
            "o_name": m.name,
            "confidence": m.confidence,
            "byte_start": m.byte_start,
            "byte_end": m.byte_end,
            "line_start": m.line,
            "line_end": m.line,
        }
        for s_type, s_name, predicate, m in facts
    ]


def _hashed(f: Any, digest: Any) -> Iterator[bytes]:
    for line in f:
        digest.update(line)
        yield line


_LEDGER = """
INSERT INTO graph_extracted_versions
    (org_id, source_id, version, method, method_version, run_id, passages, assertions)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING
"""
