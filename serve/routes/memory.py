"""Long-term memory: recall, semantic facts, proposed procedural edits and their
decision."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Query
from pydantic import AwareDatetime

from cortex_ray import MemoryKind, ProposalStatus
from serve._deps import AgentRef, MemberDep, OrgPath, StateDep, org_router
from serve.schemas import ApiError
from serve.schemas.memory import (
    FactList,
    MemoryBody,
    MemoryHit,
    MemorySearch,
    ProposalBody,
    ProposalDecision,
    ProposalList,
)

__all__ = ["memory_router"]


def memory_router() -> APIRouter:
    """An agent's long-term memory and its proposed procedural edits."""
    router = org_router()

    @router.get(
        "/agents/{agent_ref}/memory",
        response_model=MemorySearch,
        tags=["memory"],
        responses={403: {"model": ApiError, "description": "memory_search not granted"}},
    )
    async def search_memory(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        agent_ref: AgentRef,
        query: Annotated[str, Query(pattern=r"^[^\x00]{1,2000}$")],
        k: Annotated[int, Query(ge=1, le=50)] = 5,
        kind: Annotated[list[MemoryKind] | None, Query(max_length=3)] = None,
        valid_at: Annotated[AwareDatetime | None, Query(alias="validAt")] = None,
        known_at: Annotated[AwareDatetime | None, Query(alias="knownAt")] = None,
    ) -> MemorySearch:
        """Recall an agent's long-term memory: α·similarity + β·recency + γ·importance.

        Allowed to admins and to callers granted ``memory_search`` (with this agent).
        ``validAt``/``knownAt`` read as of a time (valid time, record time)."""
        agent, hits = await state.runtime.search_memory(
            org,
            agent_ref,
            query,
            k=k,
            kinds=kind or None,
            valid_at=valid_at,
            known_at=known_at,
            principal=principal,
        )
        return MemorySearch(agent_id=agent.id, query=query, results=[MemoryHit.of(h) for h in hits])

    @router.get(
        "/agents/{agent_ref}/memory/facts",
        response_model=FactList,
        tags=["memory"],
        responses={403: {"model": ApiError, "description": "memory_search not granted"}},
    )
    async def list_facts(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        agent_ref: AgentRef,
        valid_at: Annotated[AwareDatetime | None, Query(alias="validAt")] = None,
        known_at: Annotated[AwareDatetime | None, Query(alias="knownAt")] = None,
    ) -> FactList:
        """The agent's semantic facts (latest per subject, or as of a time)."""
        agent, facts = await state.runtime.list_facts(
            org, agent_ref, valid_at=valid_at, known_at=known_at, principal=principal
        )
        return FactList(agent_id=agent.id, facts=[MemoryBody.of(f) for f in facts])

    @router.get(
        "/agents/{agent_ref}/proposals",
        response_model=ProposalList,
        tags=["memory"],
    )
    async def list_proposals(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        agent_ref: AgentRef,
        status: ProposalStatus | None = None,
    ) -> ProposalList:
        """The agent's proposed edits of its procedural memory (persona, skills), oldest
        first; only ``status`` when given. An edit takes effect only when approved."""
        agent, proposals = await state.runtime.list_proposals(
            org, agent_ref, status=status, principal=principal
        )
        return ProposalList(agent_id=agent.id, proposals=[ProposalBody.of(p) for p in proposals])

    @router.post(
        "/proposals/{proposal_id}/decision",
        response_model=ProposalBody,
        tags=["memory"],
        responses={
            403: {"model": ApiError, "description": "not an admin person"},
            422: {"model": ApiError, "description": "already decided"},
        },
    )
    async def decide_proposal(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        proposal_id: UUID,
        body: ProposalDecision,
    ) -> ProposalBody:
        """Approve (the edit is applied and recorded as PROCEDURAL memory, in one
        transaction) or reject a proposed edit. Admin persons only."""
        decided = await state.runtime.decide_proposal(
            org, proposal_id, approve=body.approve, principal=principal
        )
        return ProposalBody.of(decided)

    return router
