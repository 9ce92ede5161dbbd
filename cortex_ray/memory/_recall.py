"""Recall: the candidate query and Generative Agents' retrieval score.

A recall reads candidates in ONE statement (the nearest rows by cosine distance, through
the HNSW index, plus the most recently recorded rows, so that a recent but dissimilar
memory can still win on recency) and ranks them in Python:

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

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import sql

from cortex_ray._types import MemoryKind, MemoryRecord, ScoredMemory

__all__ = [
    "AS_OF",
    "COLUMNS",
    "LATEST",
    "Candidate",
    "candidates_query",
    "memory_from_row",
    "rank",
    "visibility",
]

# Every column but the embedding: the ranking needs only the distance, not the vector.
COLUMNS = sql.SQL(
    "org_id, id, agent_id, kind, subject, content, importance, valid_from, valid_to, "
    "recorded_at, superseded_at, superseded_by, run_id, session_id, step_index, metadata"
)

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


def candidates_query(*, with_kinds: bool, visible: sql.Composable) -> sql.Composed:
    """Top-N by cosine distance UNION ALL the N most recent rows, in one statement.

    The nearest-neighbour branch orders by ``embedding <=> query`` directly so that the
    planner can use the HNSW index; the pool sets ``hnsw.iterative_scan`` so the org,
    agent and visibility filters do not shrink it below N.
    """
    kinds = sql.SQL(" AND kind = ANY(%(kinds)s)") if with_kinds else sql.SQL("")
    where = sql.SQL("org_id = %(org_id)s AND agent_id = %(agent_id)s AND {visible}{kinds}").format(
        visible=visible, kinds=kinds
    )
    return sql.SQL(
        "(SELECT {cols}, embedding <=> %(query)s AS distance FROM memories WHERE {where} "
        "ORDER BY embedding <=> %(query)s LIMIT %(n)s) "
        "UNION ALL "
        "(SELECT {cols}, embedding <=> %(query)s AS distance FROM memories WHERE {where} "
        "ORDER BY recorded_at DESC LIMIT %(n)s)"
    ).format(cols=COLUMNS, where=where)


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


@dataclass(frozen=True)
class Candidate:
    """A memory read for ranking, with its cosine distance to the query."""

    memory: MemoryRecord
    distance: float | None


def _normalise(values: Sequence[float], *, min_range: float = 0.0) -> list[float]:
    lo, hi = min(values), max(values)
    span = max(hi - lo, min_range)
    if span <= 1e-12:
        return [1.0] * len(values)
    return [1.0 - (hi - v) / span for v in values]


def _similarity(distance: float | None) -> float:
    # pgvector answers NaN for a zero vector (an empty query under the hashing embedder):
    # such a query says nothing about similarity.
    if distance is None or math.isnan(distance):
        return 0.0
    return 1.0 - distance


def rank(
    candidates: Sequence[Candidate],
    *,
    now: datetime,
    k: int,
    alpha: float,
    beta: float,
    gamma: float,
    decay_per_hour: float,
) -> list[ScoredMemory]:
    """Score, order (score desc, then most recently recorded) and cut to ``k``.

    Candidates are de-duplicated by id first, since a row may be both near and recent.
    """
    unique = list({c.memory.id: c for c in candidates}.values())
    if not unique or k <= 0:
        return []
    hours = [max(0.0, (now - c.memory.recorded_at).total_seconds() / 3600.0) for c in unique]
    similarity = _normalise([_similarity(c.distance) for c in unique])
    recency = _normalise([decay_per_hour**h for h in hours], min_range=1.0 - decay_per_hour)
    importance = _normalise([c.memory.importance for c in unique])
    scored = [
        ScoredMemory(
            memory=c.memory,
            similarity=s,
            recency=r,
            importance=i,
            score=alpha * s + beta * r + gamma * i,
        )
        for c, s, r, i in zip(unique, similarity, recency, importance, strict=True)
    ]
    scored.sort(key=lambda m: (-m.score, -m.memory.recorded_at.timestamp(), str(m.memory.id)))
    return scored[:k]
