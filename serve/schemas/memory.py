"""Long-term memory: recall, facts, proposed procedural edits."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import Field

from cortex_ray import MemoryKind, MemoryRecord, ProceduralProposal, ProposalStatus, ScoredMemory
from serve.schemas._common import _Body, _Out

# memory ----------------------------------------------------------------------------------


class MemoryBody(_Out):
    id: UUID
    kind: MemoryKind
    content: str
    subject: str | None
    importance: float
    valid_from: datetime
    valid_to: datetime | None
    recorded_at: datetime
    superseded_at: datetime | None
    run_id: UUID | None
    session_id: UUID | None
    step_index: int | None
    metadata: dict[str, Any]

    @classmethod
    def of(cls, m: MemoryRecord) -> MemoryBody:
        return cls(
            id=m.id,
            kind=m.kind,
            content=m.content,
            subject=m.subject,
            importance=m.importance,
            valid_from=m.valid_from,
            valid_to=m.valid_to,
            recorded_at=m.recorded_at,
            superseded_at=m.superseded_at,
            run_id=m.run_id,
            session_id=m.session_id,
            step_index=m.step_index,
            metadata=m.metadata,
        )


class MemoryHit(_Out):
    memory: MemoryBody
    similarity: float
    recency: float
    importance: float
    score: float = Field(description="α·similarity + β·recency + γ·importance")

    @classmethod
    def of(cls, hit: ScoredMemory) -> MemoryHit:
        return cls(
            memory=MemoryBody.of(hit.memory),
            similarity=hit.similarity,
            recency=hit.recency,
            importance=hit.importance,
            score=hit.score,
        )


class MemorySearch(_Out):
    agent_id: UUID
    query: str
    results: list[MemoryHit]


class FactList(_Out):
    agent_id: UUID
    facts: list[MemoryBody]


class ProposalBody(_Out):
    """A proposed edit of an agent's procedural memory, waiting for (or past) a decision."""

    id: UUID
    agent_id: UUID
    field: str
    value: str | list[str]
    rationale: str
    status: ProposalStatus
    proposed_by: str
    decided_by: str | None
    proposed_at: datetime
    decided_at: datetime | None

    @classmethod
    def of(cls, p: ProceduralProposal) -> ProposalBody:
        return cls(
            id=p.id,
            agent_id=p.agent_id,
            field=p.field,
            value=p.value if isinstance(p.value, str) else list(p.value),
            rationale=p.rationale,
            status=p.status,
            proposed_by=p.proposed_by,
            decided_by=p.decided_by,
            proposed_at=p.proposed_at,
            decided_at=p.decided_at,
        )


class ProposalList(_Out):
    agent_id: UUID
    proposals: list[ProposalBody]


class ProposalDecision(_Body):
    approve: bool = Field(description="true applies the edit; false rejects it")
