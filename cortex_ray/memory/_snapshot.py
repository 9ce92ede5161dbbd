"""Long-term memory retrieval: ``recall`` and the decision cycle's one read, ``snapshot``.

The statement and its score (Generative Agents' α·similarity + β·recency + γ·importance,
normalised in SQL) are built in ``cortex_ray.memory._recall``; this module binds them to
the options, the query's embedding and the clock, and runs them in one round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

import numpy as np

from cortex_ray._types import MemoryKind, MemorySnapshot, ScoredMemory, utcnow
from cortex_ray.memory._recall import recall_statement, scored_from_row, visibility
from cortex_ray.models import Embedder, embed
from cortex_ray.settings import MemoryOptions
from cortex_ray.storage import Database

__all__ = ["MemoryRecall"]


class MemoryRecall:
    """Recalls the memories that best answer a query.

    Args:
        db: The database (one statement, outside a transaction).
        embedder: Embeds the query.
        options: ``Settings.memory``: recall weights, ``recall_k``, ``recall_candidates``,
            recency decay.
    """

    def __init__(self, db: Database, embedder: Embedder, options: MemoryOptions) -> None:
        self.db = db
        self.embedder = embedder
        self.options = options

    async def recall(
        self,
        *,
        org_id: str,
        agent_id: UUID,
        query: str,
        k: int | None = None,
        kinds: Sequence[MemoryKind] | None = None,
        valid_at: datetime | None = None,
        known_at: datetime | None = None,
        exclude_run: UUID | None = None,
    ) -> list[ScoredMemory]:
        """The ``k`` memories that best answer ``query``, by Generative Agents' score.

        Reads the latest memories, or those as of ``valid_at``/``known_at`` when either is
        given (see ``cortex_ray.memory._service``). One SQL statement.

        Args:
            org_id: The organisation.
            agent_id: The agent whose memories are searched.
            query: The text to recall for.
            k: How many to return (default ``options.recall_k``).
            kinds: Only these kinds (default: all).
            valid_at: Valid time of an as-of read.
            known_at: Record time of an as-of read.
            exclude_run: Leave out the memories this run wrote (its own steps).

        Returns:
            Scored memories, best first; ties go to the most recently recorded.
        """
        k = self.options.recall_k if k is None else k
        if k <= 0:
            return []
        embedding = (await embed(self.embedder, [query]))[0]
        visible, params = visibility(valid_at, known_at)
        statement = recall_statement(
            with_kinds=kinds is not None, visible=visible, without_run=exclude_run is not None
        )
        decay = self.options.recency_decay_per_hour
        params |= {
            "org_id": org_id,
            "agent_id": agent_id,
            "query": np.asarray(embedding, dtype=np.float32),
            "n": max(self.options.recall_candidates, k),
            "k": k,
            # Python's clock, not the database's: recency works in hours, where a little
            # skew between the two does not change the order.
            "now": utcnow(),
            "decay": decay,
            "recency_floor": 1.0 - decay,
            "alpha": self.options.recall_alpha,
            "beta": self.options.recall_beta,
            "gamma": self.options.recall_gamma,
        }
        if kinds is not None:
            params["kinds"] = [MemoryKind(kind).value for kind in kinds]
        if exclude_run is not None:
            params["exclude_run"] = exclude_run
        async with self.db.connection() as conn:  # one statement: one round trip
            cur = await conn.execute(statement, params)
            return [scored_from_row(row) for row in await cur.fetchall()]

    async def snapshot(
        self,
        *,
        org_id: str,
        agent_id: UUID,
        query: str,
        k: int | None = None,
        exclude_run: UUID | None = None,
    ) -> MemorySnapshot:
        """THE long-term-memory read of a decision cycle: the latest memories, recalled once.

        Exactly one SQL statement (nearest and most recent candidates together), scored
        in Python.

        Args:
            org_id: The organisation.
            agent_id: The agent.
            query: What the cycle is about (the objective or the person's message).
            k: How many memories (default ``options.recall_k``).
            exclude_run: The run this cycle belongs to: its own steps are already in
                working memory as observations, so its memories are not recalled.
        """
        taken_at = utcnow()
        recalled = await self.recall(
            org_id=org_id, agent_id=agent_id, query=query, k=k, exclude_run=exclude_run
        )
        return MemorySnapshot(query=query, recalled=tuple(recalled), taken_at=taken_at)
