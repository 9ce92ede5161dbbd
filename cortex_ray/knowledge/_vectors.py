"""Passage vectors computed outside the store: the writer's part that a backfill job uses.

``passages_to_embed`` lists a collection's published passages that have no vector, most used
first (``TO_EMBED_SQL``, the order ``KnowledgeService.backfill_passage_vectors`` follows
too); ``write_passage_vectors`` stores the vectors (``SET_VECTORS_SQL``, never overwriting
one). Section vectors are written with their sections (``write_sections``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from cortex_ray._exceptions import InvalidRequestError
from cortex_ray.knowledge._connection import WriterConnection
from cortex_ray.knowledge._sql import DIM, SET_VECTORS_SQL, TO_EMBED_SQL, vector_literal

__all__ = ["VectorWriter"]


class VectorWriter(WriterConnection):
    """Lists the passages a backfill should embed and stores the vectors it computed."""

    def passages_to_embed(self, org_id: str, collection: str, limit: int) -> list[tuple[int, str]]:
        """Published passages without a vector, most used first: ``(passage id, text)``."""
        rows = self.conn.execute(TO_EMBED_SQL, (org_id, collection, limit)).fetchall()
        return [(r["id"], r["text"]) for r in rows]

    def write_passage_vectors(
        self, org_id: str, passage_ids: Sequence[int], vectors: NDArray[np.float32]
    ) -> int:
        """Store passage vectors computed elsewhere; returns how many rows were updated."""
        if vectors.shape != (len(passage_ids), DIM):
            raise InvalidRequestError(f"vectors must have shape ({len(passage_ids)}, {DIM})")
        return self.conn.execute(
            SET_VECTORS_SQL,
            (list(passage_ids), [vector_literal(v) for v in vectors], org_id),
        ).rowcount
