"""Recall: the candidate query and Generative Agents' retrieval score.

A recall reads candidates in ONE statement (the nearest rows by cosine distance, through
the HNSW index, plus the most recently recorded rows, so that a recent but dissimilar
memory can still win on recency) and ranks them in the same statement, so only the ``k``
winners cross the wire and become Python objects:

    score = α·similarity + β·recency + γ·importance

- similarity = 1 - cosine distance between the query's and the memory's embeddings;
- recency = ``recency_decay_per_hour ** hours`` since the memory's ``recorded_at`` (when
  the agent formed the memory, not when the fact became true: an old fact learnt today is
  a fresh memory);
- importance = the stored 1..10 score.

Each term is min-max normalised to [0, 1] across the candidate set, so the weights
(``recall_alpha``, ``recall_beta``, ``recall_gamma``) compare like with like:
``1 - (max - v) / (max - min)``, the best candidate scoring 1. A term that is the same for
every candidate (a single candidate included) carries no ranking information and is 1.0
for all of them: nothing divides by zero, and a lone memory scores the sum of the weights.

One guard: the recency range is floored at one hour's decay (``1 - decay``). Pure min-max
would stretch memories written seconds apart, as one session writes them, to the full
[0, 1] and let the newest win on a difference that means nothing; with the floor,
candidates within an hour of each other are nearly equally recent, and whenever the
candidates span more than an hour the formula is exactly min-max.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg import sql

from cortex_ray._types import MemoryKind, MemoryRecord, ScoredMemory

__all__ = [
    "AS_OF",
    "COLUMNS",
    "LATEST",
    "memory_from_row",
    "recall_query",
    "recall_statement",
    "scored_from_row",
    "visibility",
]

# Every column but the embedding: the ranking needs only the distance, not the vector.
_COLUMN_NAMES = (
    "org_id",
    "id",
    "agent_id",
    "kind",
    "subject",
    "content",
    "importance",
    "valid_from",
    "valid_to",
    "recorded_at",
    "superseded_at",
    "superseded_by",
    "run_id",
    "session_id",
    "step_index",
    "metadata",
)
COLUMNS = sql.SQL(", ").join(sql.Identifier(c) for c in _COLUMN_NAMES)

LATEST = sql.SQL("valid_to IS NULL")

# What was believed at record time K about valid time T (see the package docstring).
# Unset times default to the database's clock, the one that stamped recorded_at.
AS_OF = sql.SQL(
    "recorded_at <= coalesce(%(known_at)s::timestamptz, statement_timestamp()) "
    "AND valid_from <= coalesce(%(valid_at)s::timestamptz, statement_timestamp()) "
    "AND (valid_to IS NULL "
    "OR superseded_at > coalesce(%(known_at)s::timestamptz, statement_timestamp()) "
    "OR valid_to > coalesce(%(valid_at)s::timestamptz, statement_timestamp()))"
)


def visibility(
    valid_at: datetime | None, known_at: datetime | None
) -> tuple[sql.Composable, dict[str, Any]]:
    """The row filter for a read: latest by default, as-of when either time is given."""
    if valid_at is None and known_at is None:
        return LATEST, {}
    return AS_OF, {"valid_at": valid_at, "known_at": known_at}


def recall_query(
    *, with_kinds: bool, visible: sql.Composable, without_run: bool = False
) -> sql.Composed:
    """Candidates (top-N by cosine distance ∪ the N most recent rows) ranked by the score.

    The nearest-neighbour branch orders by ``embedding <=> query`` directly so that the
    planner can use the HNSW index; the pool sets ``hnsw.iterative_scan`` so the org,
    agent and visibility filters do not shrink it below N. ``UNION`` de-duplicates a row
    that is both near and recent. Parameters: org_id, agent_id, query, n, k, now, decay,
    recency_floor, alpha, beta, gamma (and kinds, valid_at, known_at, exclude_run where
    used). ``without_run`` leaves out the memories of run ``exclude_run`` (a run's own steps
    are already in its working memory as observations; recalled again they would repeat
    them, and each would quote what earlier ones recalled).
    """
    kinds = sql.SQL(" AND kind = ANY(%(kinds)s)") if with_kinds else sql.SQL("")
    run = sql.SQL(" AND run_id IS DISTINCT FROM %(exclude_run)s") if without_run else sql.SQL("")
    where = sql.SQL(
        "org_id = %(org_id)s AND agent_id = %(agent_id)s AND {visible}{kinds}{run}"
    ).format(visible=visible, kinds=kinds, run=run)
    return sql.SQL(
        """
        WITH candidates AS (
            (SELECT id, recorded_at, importance, embedding <=> %(query)s AS distance
             FROM memories WHERE {where} ORDER BY embedding <=> %(query)s LIMIT %(n)s)
            UNION
            (SELECT id, recorded_at, importance, embedding <=> %(query)s AS distance
             FROM memories WHERE {where} ORDER BY recorded_at DESC LIMIT %(n)s)
        ), terms AS (
            SELECT id, recorded_at,
                   -- NaN for a zero query vector: it says nothing about similarity
                   CASE WHEN distance = 'NaN'::float8 THEN 0 ELSE 1 - distance END AS sim,
                   power(%(decay)s::float8, greatest(0, extract(epoch FROM
                         (%(now)s::timestamptz - recorded_at))::float8 / 3600.0)) AS rec,
                   importance::float8 AS imp
            FROM candidates
        ), spans AS MATERIALIZED (  -- once, not once per candidate
            SELECT max(sim) AS hi_s, max(sim) - min(sim) AS span_s,
                   max(rec) AS hi_r, greatest(max(rec) - min(rec), %(recency_floor)s) AS span_r,
                   max(imp) AS hi_i, max(imp) - min(imp) AS span_i
            FROM terms
        ), normalised AS (
            SELECT t.id, t.recorded_at,
                   CASE WHEN span_s <= 1e-12 THEN 1 ELSE 1 - (hi_s - sim) / span_s END AS n_sim,
                   CASE WHEN span_r <= 1e-12 THEN 1 ELSE 1 - (hi_r - rec) / span_r END AS n_rec,
                   CASE WHEN span_i <= 1e-12 THEN 1 ELSE 1 - (hi_i - imp) / span_i END AS n_imp
            FROM terms t CROSS JOIN spans
        ), top AS (  -- rank and cut before fetching whole rows: only k rows are read
            SELECT *, %(alpha)s * n_sim + %(beta)s * n_rec + %(gamma)s * n_imp AS score
            FROM normalised
            ORDER BY score DESC, recorded_at DESC, id::text
            LIMIT %(k)s
        )
        SELECT {cols}, top.n_sim, top.n_rec, top.n_imp, top.score
        FROM top JOIN memories m ON m.org_id = %(org_id)s AND m.id = top.id
        ORDER BY top.score DESC, top.recorded_at DESC, top.id::text
        """
    ).format(
        cols=sql.SQL(", ").join(sql.SQL("m.{}").format(sql.Identifier(c)) for c in _COLUMN_NAMES),
        where=where,
    )


_RECALL_STATEMENTS: dict[tuple[bool, bool, int], tuple[sql.Composable, bytes]] = {}


def recall_statement(
    *, with_kinds: bool, visible: sql.Composable, without_run: bool = False
) -> bytes:
    """:func:`recall_query` for this shape, composed once and kept as bytes.

    Every cycle recalls, and composing the statement (~40 µs) then rendering it (~17 µs)
    each time cost more than the rest of the read's Python. As bytes, psycopg also keeps
    its parsed form (it caches by query text). The statement is plain ASCII SQL with
    simple identifiers, so rendering it without a connection gives the same bytes any
    connection would. Keyed by the visibility clause's identity (``LATEST``, ``AS_OF``);
    the clause is kept with the bytes so that a reused id can never return another's.
    """
    key = (with_kinds, without_run, id(visible))
    cached = _RECALL_STATEMENTS.get(key)
    if cached is None or cached[0] is not visible:
        query = recall_query(with_kinds=with_kinds, visible=visible, without_run=without_run)
        cached = (visible, query.as_bytes(None))
        _RECALL_STATEMENTS[key] = cached
    return cached[1]


def memory_from_row(row: dict[str, Any]) -> MemoryRecord:
    """A ``memories`` row (without its embedding) as a ``MemoryRecord``."""
    return MemoryRecord(
        id=row["id"],
        org_id=row["org_id"],
        agent_id=row["agent_id"],
        kind=MemoryKind(row["kind"]),
        content=row["content"],
        subject=row["subject"],
        importance=float(row["importance"]),
        valid_from=row["valid_from"],
        valid_to=row["valid_to"],
        recorded_at=row["recorded_at"],
        superseded_at=row["superseded_at"],
        superseded_by=row["superseded_by"],
        run_id=row["run_id"],
        session_id=row["session_id"],
        step_index=row["step_index"],
        metadata=row["metadata"] or {},
    )


def scored_from_row(row: dict[str, Any]) -> ScoredMemory:
    """A ranked row of ``recall_query`` as a ``ScoredMemory``."""
    return ScoredMemory(
        memory=memory_from_row(row),
        similarity=float(row["n_sim"]),
        recency=float(row["n_rec"]),
        importance=float(row["n_imp"]),
        score=float(row["score"]),
    )
