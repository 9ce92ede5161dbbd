"""Preparing a memory, outside any transaction: its record, its importance and its embedding.

Model latency never holds a transaction open: a memory is prepared first (importance scored,
content embedded), then written inside the caller's transaction (``cortex_ray.memory._writes``).
With a deferred model scorer (``importance_mode="background"``) nothing here waits on the
model: the memory gets its fallback's score and is marked for rescoring after the write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import numpy as np
from numpy.typing import NDArray

from cortex_ray._exceptions import InvalidRequestError
from cortex_ray._types import MemoryKind, MemoryRecord, utcnow
from cortex_ray.memory._extraction import normalise_subject
from cortex_ray.memory._importance import (
    MAX_IMPORTANCE,
    MIN_IMPORTANCE,
    ImportanceRescorer,
    ImportanceScorer,
    ModelImportanceScorer,
)
from cortex_ray.models import Embedder, embed

__all__ = ["MemoryPreparer", "PreparedMemory"]


@dataclass(frozen=True, eq=False)  # eq=False: numpy arrays do not compare to one bool
class PreparedMemory:
    """A memory ready to insert: its record plus its embedding (float32, unit length).

    ``record.recorded_at`` is a placeholder until the row is written: the database stamps
    the real record time.
    """

    record: MemoryRecord
    embedding: NDArray[np.float32]
    idempotency_key: str | None = None
    """Written with the row; a row with this key already there is returned instead."""
    rescore: bool = False
    """Written with the fallback importance: the model rescores it after the write."""


class MemoryPreparer:
    """Embeds memories and scores their importance, outside any transaction.

    Args:
        embedder: Embeds the memories' content.
        importance: Scores a memory's importance when the writer gives none.
        rescorer: The background rescoring of a deferred model scorer, or None: with one,
            the model is not waited for (the fallback scores now, the model after the write).
    """

    def __init__(
        self,
        embedder: Embedder,
        importance: ImportanceScorer,
        rescorer: ImportanceRescorer | None,
    ) -> None:
        self.embedder = embedder
        self.importance = importance
        self.rescorer = rescorer

    async def _record(
        self,
        *,
        org_id: str,
        agent_id: UUID,
        kind: MemoryKind,
        content: str,
        subject: str | None = None,
        valid_from: datetime | None = None,
        importance: float | None = None,
        run_id: UUID | None = None,
        session_id: UUID | None = None,
        step_index: int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> tuple[MemoryRecord, bool]:
        """The record to write, and whether the model rescores it after the write."""
        if not content.strip():
            raise InvalidRequestError("a memory needs content")
        rescore = False
        if importance is None:
            scorer = self.importance
            if self.rescorer is not None and isinstance(scorer, ModelImportanceScorer):
                # Never wait on the model here: the fallback now, the model after the write.
                scorer, rescore = scorer.fallback, True
            scored = await scorer.score(kind, content)
            # A third-party scorer may stray outside the scale the table enforces.
            importance = min(MAX_IMPORTANCE, max(MIN_IMPORTANCE, float(scored)))
        elif not MIN_IMPORTANCE <= importance <= MAX_IMPORTANCE:
            raise InvalidRequestError(f"importance must be between 1 and 10, got {importance}")
        record = MemoryRecord(
            org_id=org_id,
            agent_id=agent_id,
            kind=kind,
            content=content,
            subject=normalise_subject(subject),
            importance=importance,
            valid_from=valid_from or utcnow(),
            run_id=run_id,
            session_id=session_id,
            step_index=step_index,
            metadata=dict(metadata or {}),
        )
        return record, rescore

    async def prepare(
        self,
        *,
        org_id: str,
        agent_id: UUID,
        kind: MemoryKind,
        content: str,
        subject: str | None = None,
        valid_from: datetime | None = None,
        importance: float | None = None,
        run_id: UUID | None = None,
        session_id: UUID | None = None,
        step_index: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> PreparedMemory:
        """Embed a memory and score its importance, outside any transaction.

        Args:
            org_id: The organisation.
            agent_id: The agent whose memory it is.
            kind: EPISODIC, SEMANTIC or PROCEDURAL.
            content: The text recalled later.
            subject: For SEMANTIC facts, what the fact is about: a newer fact with the same
                (normalised) subject supersedes the older one.
            valid_from: When it became true or happened (default: now).
            importance: 1..10; scored by the service's ``ImportanceScorer`` when None.
            run_id: The autonomous run that produced it.
            session_id: The interactive session that produced it.
            step_index: The run step that produced it (with ``run_id``: written once).
            metadata: Free-form JSON-serialisable details.
            idempotency_key: The writer's key (a tool's ``ToolContext.idempotency_key``):
                a row with this key already written is returned instead of a new one.

        Raises:
            InvalidRequestError: Empty content or importance outside 1..10.
        """
        (prepared,) = await self.prepare_many(
            [
                {
                    "org_id": org_id,
                    "agent_id": agent_id,
                    "kind": kind,
                    "content": content,
                    "subject": subject,
                    "valid_from": valid_from,
                    "importance": importance,
                    "run_id": run_id,
                    "session_id": session_id,
                    "step_index": step_index,
                    "metadata": metadata,
                    "idempotency_key": idempotency_key,
                }
            ]
        )
        return prepared

    async def prepare_many(self, items: Sequence[Mapping[str, Any]]) -> list[PreparedMemory]:
        """:meth:`prepare` for several memories, embedded in one batch.

        Args:
            items: Each a mapping of :meth:`prepare`'s keyword arguments.
        """
        # Importance first and one at a time: model calls are sequential anyway, and the
        # order stays deterministic for scripted models.
        records = []
        for item in items:
            fields = dict(item)
            key = fields.pop("idempotency_key", None)
            record, rescore = await self._record(**fields)
            records.append((record, key, rescore))
        if not records:
            return []
        vectors = await embed(self.embedder, [r.content for r, _, _ in records])
        out = []
        for (record, key, rescore), vector in zip(records, vectors, strict=True):
            embedding = np.array(vector, dtype=np.float32)
            embedding.setflags(write=False)
            out.append(
                PreparedMemory(
                    record=record, embedding=embedding, idempotency_key=key, rescore=rescore
                )
            )
        return out
