"""The knowledge store's SQL, shared by its two halves: the synchronous writer that ingestion
jobs use (``KnowledgeWriter`` and its parts) and the asynchronous ``KnowledgeService`` that
searches. Twins on one base: each takes its statements from here, neither from the other.

What lives here: the vector dimension and pgvector's text form; the names of a collection's
postings partition and stage, the DDL that creates the stage and the COPY statements; the
statements that more than one module runs (the published versions of sources, the
passage-vector backfill in its order); and every statement of a search (BM25, the dense
tiers and their exact fallbacks, lazy vectors, hits, usage). A statement that one method
alone runs stays next to that method, with its parameters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np
import psycopg
from numpy.typing import NDArray
from psycopg import sql

from cortex_ray._sync import SyncConn
from cortex_ray._types import EMBEDDING_DIM
from cortex_ray.knowledge._bm25 import BM25_B, BM25_K1

__all__ = [
    "BM25_EXACT_SQL",
    "BM25_SQL",
    "DIM",
    "HITS_SQL",
    "PASSAGES_COPY",
    "PASSAGE_DENSE_SQL",
    "PASSAGE_EXACT_SQL",
    "PUBLICATIONS_SQL",
    "PUBLISHED_VERSIONS_SQL",
    "SECTION_DENSE_SQL",
    "SECTION_EXACT_SQL",
    "SET_VECTORS_SQL",
    "TO_EMBED_SQL",
    "UNEMBEDDED_SQL",
    "USAGE_SQL",
    "SyncConn",
    "ensure_stage",
    "partition_name",
    "postings_copy",
    "stage_name",
    "vector_literal",
]

DIM = EMBEDDING_DIM
"""The schema's vector dimension (``cortex_ray._types.EMBEDDING_DIM``)."""


def vector_literal(vector: NDArray[np.float32] | Sequence[float]) -> str:
    """pgvector's text form of one vector (accepted by ``vector`` and ``halfvec``)."""
    return "[" + ",".join(f"{float(x):.6g}" for x in vector) + "]"


# -- postings: partitions, stages, COPY ------------------------------------------------


def partition_name(collection_id: int) -> str:
    """The ``kb_postings`` partition of a collection (migration 0005)."""
    return f"kb_postings_{int(collection_id)}"


def stage_name(collection_id: int) -> str:
    """The staging table of a collection that has no partition yet: no indexes, no foreign
    key; the first publish attaches it as the partition (``KnowledgeWriter.publish``)."""
    return f"kb_postings_stage_{int(collection_id)}"


def ensure_stage(conn: SyncConn, cid: int) -> None:
    """Create the collection's postings stage unless it exists (``stage_name``)."""
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


PASSAGES_COPY = (
    "COPY kb_passages (org_id, id, source_id, version, collection, collection_id, ordinal, "
    "section_ordinal, text, line_start, line_end, byte_start, byte_end, length) FROM STDIN"
)


def postings_copy(table: str) -> sql.Composed:
    """The COPY of postings into ``table`` (``kb_postings`` or a collection's stage)."""
    return sql.SQL(
        "COPY {} (org_id, collection_id, passage_id, term, tf, impact) FROM STDIN"
    ).format(sql.Identifier(table))


# -- sources ---------------------------------------------------------------------------

# The published version of each of these sources (register_sources marks a source
# unchanged with it, carry_forward_sources carries it).
PUBLISHED_VERSIONS_SQL = """
SELECT m.source_id, m.version FROM kb_collections c
JOIN kb_generation_sources m
  ON m.org_id = c.org_id AND m.generation = c.published_generation
WHERE c.org_id = %s AND c.name = %s AND m.source_id = ANY(%s::uuid[])
"""

# -- passage vectors: the backfill (writer and service) --------------------------------

# Published passages of one collection without a vector, most used first (hit count, then
# most recent use), then in document order.
TO_EMBED_SQL = """
SELECT p.id, p.text
FROM kb_collections c
JOIN kb_generation_sources m ON m.org_id = c.org_id AND m.generation = c.published_generation
JOIN kb_passages p ON p.org_id = m.org_id AND p.source_id = m.source_id AND p.version = m.version
LEFT JOIN kb_passage_usage u ON u.org_id = p.org_id AND u.passage_id = p.id
WHERE c.org_id = %s AND c.name = %s AND p.embedding IS NULL
ORDER BY u.hits DESC NULLS LAST, u.last_used_at DESC NULLS LAST, p.id
LIMIT %s
"""

SET_VECTORS_SQL = """
UPDATE kb_passages p SET embedding = v.vec::halfvec(384)
FROM unnest(%s::bigint[], %s::text[]) AS v(id, vec)
WHERE p.org_id = %s AND p.id = v.id AND p.embedding IS NULL
"""


# -- search (KnowledgeService) ---------------------------------------------------------

# Each generation's analyzer (migration 0009) comes with it: a search tokenises its query
# the way that generation's postings were written.
PUBLICATIONS_SQL = """
SELECT c.name, c.id, c.published_generation AS generation, g.passages, g.total_length,
       g.analyzer
FROM kb_collections c
JOIN kb_generations g ON g.org_id = c.org_id AND g.id = c.published_generation
WHERE c.org_id = %(org)s AND (%(names)s::text[] IS NULL OR c.name = ANY(%(names)s::text[]))
"""

# Impact-ordered candidates, then an exact rescore. Each query term reads at most
# ``per_term`` postings per collection from the (collection_id, term, impact DESC) index of
# the collection's partition
# (NULL: all of them, which makes the result exact); the best ``pool`` by
# Σ idf · impact are checked against the publication and rescored with its statistics.
# MATERIALIZED and ``= ANY(ARRAY(...))`` keep the planner from joining all postings.
_BM25_TEMPLATE = """
WITH q AS MATERIALIZED (
    SELECT ts.term,
           ln(1 + (%(n)s::float8 - sum(ts.df)::float8 + 0.5) / (sum(ts.df)::float8 + 0.5)) AS idf
    FROM kb_term_stats ts
    WHERE ts.org_id = %(org)s AND ts.generation = ANY(%(gens)s::bigint[])
      AND ts.term = ANY(%(terms)s::text[])
    GROUP BY ts.term
),
top AS MATERIALIZED (
    SELECT c.passage_id, sum(q.idf * c.impact) AS approx
    FROM q CROSS JOIN unnest(%(cids)s::bigint[]) AS col(id)
    CROSS JOIN LATERAL (
        SELECT po.passage_id, po.impact FROM kb_postings po
        WHERE po.collection_id = col.id AND po.term = q.term
        ORDER BY po.impact DESC
        LIMIT %(per_term)s
    ) c
    GROUP BY c.passage_id
    ORDER BY approx DESC
    LIMIT %(pool)s
),
live AS MATERIALIZED (
    SELECT p.id, p.length, p.collection_id FROM kb_passages p
    WHERE p.org_id = %(org)s AND p.id = ANY(ARRAY(SELECT passage_id FROM top))
      AND EXISTS (
          SELECT 1 FROM kb_generation_sources m
          WHERE m.org_id = p.org_id AND m.generation = ANY(%(gens)s::bigint[])
            AND m.source_id = p.source_id AND m.version = p.version)
)
SELECT l.id, sum(
    q.idf * po.tf / (po.tf + {k1} * (1 - {b} + {b} * l.length / %(avgdl)s))
) AS score
FROM live l
{rescore}
JOIN q ON q.term = po.term
GROUP BY l.id
ORDER BY score DESC, l.id
LIMIT %(k)s
"""

# The rescore of a bounded pool looks up each candidate's postings of the query terms by
# primary key. OFFSET 0 keeps the subquery from being flattened into a join: the planner
# estimates a term's postings from the average (it cannot see which term), and for a common
# term ("static": 270k postings at 1M passages) it would otherwise read and sort them all
# to merge-join 200 candidates (0.5-1 s instead of ~20 ms).
BM25_SQL = _BM25_TEMPLATE.format(
    k1=BM25_K1,
    b=BM25_B,
    rescore="""CROSS JOIN LATERAL (
    SELECT p.term, p.tf FROM kb_postings p
    WHERE p.collection_id = l.collection_id AND p.passage_id = l.id
      AND p.term = ANY(%(terms)s::text[])
    OFFSET 0
) po""",
)

# Exact BM25 (every posting of the terms is a candidate): a join, which the planner runs
# as one pass over the terms' postings.
BM25_EXACT_SQL = _BM25_TEMPLATE.format(
    k1=BM25_K1,
    b=BM25_B,
    rescore="""JOIN kb_postings po ON po.collection_id = l.collection_id AND po.passage_id = l.id
                   AND po.term = ANY(%(terms)s::text[])""",
)

# The live filter sits inside the scan's query, so pgvector's iterative index scan
# (hnsw.iterative_scan = relaxed_order, set on every pooled connection) keeps scanning
# until k rows pass it; the outer ORDER BY restores exact order.
PASSAGE_DENSE_SQL = """
WITH hits AS MATERIALIZED (
    SELECT p.id, p.embedding <=> %(q)s::halfvec(384) AS distance
    FROM kb_passages p
    WHERE p.org_id = %(org)s AND p.collection = ANY(%(cols)s::text[])
      AND p.embedding IS NOT NULL
      AND EXISTS (
          SELECT 1 FROM kb_generation_sources m
          WHERE m.org_id = p.org_id AND m.generation = ANY(%(gens)s::bigint[])
            AND m.source_id = p.source_id AND m.version = p.version)
    ORDER BY distance
    LIMIT %(k)s
)
SELECT id, 1 - distance AS score FROM hits ORDER BY distance, id
"""

SECTION_DENSE_SQL = """
WITH hits AS MATERIALIZED (
    SELECT s.source_id, s.version, s.ordinal, s.embedding <=> %(q)s::halfvec(384) AS distance
    FROM kb_sections s
    WHERE s.org_id = %(org)s AND s.collection = ANY(%(cols)s::text[])
      AND s.embedding IS NOT NULL
      AND EXISTS (
          SELECT 1 FROM kb_generation_sources m
          WHERE m.org_id = s.org_id AND m.generation = ANY(%(gens)s::bigint[])
            AND m.source_id = s.source_id AND m.version = s.version)
    ORDER BY distance
    LIMIT %(k)s
)
SELECT source_id, version, ordinal, 1 - distance AS score FROM hits ORDER BY distance
"""

# Exact fallbacks: every vector of the publication, scored (the ORDER BY expression is not
# the index's operator, so no HNSW); reached through the membership and the
# (source, version) indexes, so their cost is the publication's size.
PASSAGE_EXACT_SQL = """
SELECT p.id, 1 - (p.embedding <=> %(q)s::halfvec(384)) AS score
FROM kb_generation_sources m
JOIN kb_passages p ON p.org_id = m.org_id AND p.source_id = m.source_id
                  AND p.version = m.version
WHERE m.org_id = %(org)s AND m.generation = ANY(%(gens)s::bigint[])
  AND p.embedding IS NOT NULL
ORDER BY score DESC, p.id
LIMIT %(k)s
"""

SECTION_EXACT_SQL = """
SELECT s.source_id, s.version, s.ordinal, 1 - (s.embedding <=> %(q)s::halfvec(384)) AS score
FROM kb_generation_sources m
JOIN kb_sections s ON s.org_id = m.org_id AND s.source_id = m.source_id
                  AND s.version = m.version
WHERE m.org_id = %(org)s AND m.generation = ANY(%(gens)s::bigint[])
  AND s.embedding IS NOT NULL
ORDER BY score DESC, s.source_id, s.ordinal
LIMIT %(k)s
"""

# Passages of the surfaced sections that have no vector yet, best section first.
UNEMBEDDED_SQL = """
SELECT p.id, p.text
FROM unnest(%(src)s::uuid[], %(ver)s::int[], %(sec)s::int[], %(rank)s::int[])
     AS s(source_id, version, ordinal, rank)
JOIN kb_passages p ON p.org_id = %(org)s AND p.source_id = s.source_id
                  AND p.version = s.version AND p.section_ordinal = s.ordinal
WHERE p.embedding IS NULL
ORDER BY s.rank, p.ordinal
LIMIT %(limit)s
"""

HITS_SQL = """
SELECT p.id, p.collection, p.source_id, p.version, src.path, p.text, p.section_ordinal,
       p.line_start,
       p.line_end, p.byte_start, p.byte_end, coalesce(sec.heading_path, '{}') AS heading_path
FROM kb_passages p
JOIN kb_sources src ON src.org_id = p.org_id AND src.id = p.source_id
LEFT JOIN kb_sections sec ON sec.org_id = p.org_id AND sec.source_id = p.source_id
                         AND sec.version = p.version AND sec.ordinal = p.section_ordinal
WHERE p.org_id = %(org)s AND p.id = ANY(%(ids)s::bigint[])
"""

USAGE_SQL = """
INSERT INTO kb_passage_usage (org_id, passage_id, hits, last_used_at)
SELECT %(org)s, id, 1, now() FROM unnest(%(ids)s::bigint[]) AS id ORDER BY id
ON CONFLICT (org_id, passage_id) DO UPDATE
   SET hits = kb_passage_usage.hits + 1, last_used_at = now()
"""
