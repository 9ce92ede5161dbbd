"""Long-term memory as use cases: recall, facts, and procedural-edit proposals."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

from cortex_ray._types import (
    Agent,
    MemoryKind,
    MemoryRecord,
    Principal,
    ProceduralProposal,
    ProposalStatus,
    ScoredMemory,
)
from cortex_ray.access import UseCase
from cortex_ray.memory import MemoryService
from cortex_ray.runtime._gate import UseCaseGate

__all__ = ["MemoryUseCases"]


class MemoryUseCases:
    """An agent's memory (``Runtime.search_memory``, ``list_facts``, proposals)."""

    def __init__(self, gate: UseCaseGate, memory: MemoryService) -> None:
        self.gate = gate
        self.memory = memory

    async def search_memory(
        self,
        org_id: str,
        agent_ref: UUID | str,
        query: str,
        *,
        k: int = 5,
        kinds: Sequence[MemoryKind] | None = None,
        valid_at: datetime | None = None,
        known_at: datetime | None = None,
        principal: Principal | None = None,
    ) -> tuple[Agent, list[ScoredMemory]]:
        """Recall an agent's long-term memory (α·similarity + β·recency + γ·importance), as
        of a time if asked. Admins, or a caller who may use ``memory_search`` with it."""
        args = {"query": query[:200], "k": k}
        caller, agent = await self.gate.agent_for(
            principal, UseCase.MEMORY_SEARCH, org_id, agent_ref, args=args
        )
        hits = await self.memory.recall(
            org_id=org_id,
            agent_id=agent.id,
            query=query,
            k=k,
            kinds=list(kinds) if kinds else None,
            valid_at=valid_at,
            known_at=known_at,
        )
        await self.gate.audited(caller, UseCase.MEMORY_SEARCH, org_id, agent=agent, args=args)
        return agent, hits

    async def list_facts(
        self,
        org_id: str,
        agent_ref: UUID | str,
        *,
        valid_at: datetime | None = None,
        known_at: datetime | None = None,
        principal: Principal | None = None,
    ) -> tuple[Agent, list[MemoryRecord]]:
        """The agent's semantic facts (latest per subject, or as of a time); the same right
        as memory search."""
        args = {"facts": True}
        caller, agent = await self.gate.agent_for(
            principal, UseCase.MEMORY_SEARCH, org_id, agent_ref, args=args
        )
        facts = await self.memory.facts(
            org_id=org_id, agent_id=agent.id, valid_at=valid_at, known_at=known_at
        )
        await self.gate.audited(caller, UseCase.MEMORY_SEARCH, org_id, agent=agent, args=args)
        return agent, facts

    async def list_proposals(
        self,
        org_id: str,
        agent_ref: UUID | str,
        *,
        status: ProposalStatus | None = None,
        principal: Principal | None = None,
    ) -> tuple[Agent, list[ProceduralProposal]]:
        """An agent (by id or name) and its proposed procedural edits (persona, skills),
        oldest first."""
        _, agent = await self.gate.agent_for(principal, UseCase.PROPOSALS_LIST, org_id, agent_ref)
        return agent, await self.memory.proposals(org_id=org_id, agent_id=agent.id, status=status)

    async def decide_proposal(
        self,
        org_id: str,
        proposal_id: UUID,
        *,
        approve: bool,
        principal: Principal | None = None,
    ) -> ProceduralProposal:
        """Approve or reject a proposed procedural edit (an admin person): approval changes
        the agent and records a PROCEDURAL memory, in one transaction."""
        args = {"proposal": str(proposal_id), "approve": approve}
        caller = await self.gate.authorize(principal, UseCase.PROPOSALS_DECIDE, org_id, args=args)
        decided = await self.memory.decide_proposal(
            org_id=org_id, proposal_id=proposal_id, approver=caller, approve=approve
        )
        await self.gate.audited(caller, UseCase.PROPOSALS_DECIDE, org_id, args=args)
        return decided
