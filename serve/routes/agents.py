"""Agents: list, create, read, change."""

from __future__ import annotations

from fastapi import APIRouter

from serve._deps import AgentRef, MemberDep, OrgPath, StateDep, org_router
from serve.schemas import ApiError
from serve.schemas.agents import AgentBody, AgentCreate, AgentList, AgentUpdate, from_agent

__all__ = ["agents_router"]


def agents_router() -> APIRouter:
    """The agents of an organisation."""
    router = org_router()

    @router.get("/agents", response_model=AgentList, tags=["agents"])
    async def list_agents(state: StateDep, org: OrgPath, principal: MemberDep) -> AgentList:
        """The organisation's agents."""
        agents = await state.runtime.list_agents(org, principal=principal)
        return AgentList(agents=[from_agent(a) for a in agents])

    @router.post(
        "/agents",
        response_model=AgentBody,
        status_code=201,
        tags=["agents"],
        responses={403: {"model": ApiError, "description": "not an admin"}},
    )
    async def create_agent(
        state: StateDep, org: OrgPath, principal: MemberDep, body: AgentCreate
    ) -> AgentBody:
        """Create an agent (admin only). Default tools: every built-in; default grant: its tools."""
        agent = await state.runtime.create_agent(
            org,
            body.name,
            persona=body.persona,
            mode=body.mode,
            tools=body.tools,
            skills=body.skills,
            grant=None if body.grant is None else body.grant.to_grant(),
            critic=body.critic,
            principal=principal,
        )
        return from_agent(agent)

    @router.get("/agents/{agent_ref}", response_model=AgentBody, tags=["agents"])
    async def get_agent(
        state: StateDep, org: OrgPath, principal: MemberDep, agent_ref: AgentRef
    ) -> AgentBody:
        """One agent, by id or name."""
        return from_agent(await state.runtime.get_agent(org, agent_ref, principal=principal))

    @router.patch(
        "/agents/{agent_ref}",
        response_model=AgentBody,
        tags=["agents"],
        responses={403: {"model": ApiError, "description": "not an admin"}},
    )
    async def update_agent(
        state: StateDep, org: OrgPath, principal: MemberDep, agent_ref: AgentRef, body: AgentUpdate
    ) -> AgentBody:
        """Change an agent's mode, persona, tools, skills, grant or critic (admin only)."""
        changed = await state.runtime.update_agent(
            org, agent_ref, body.to_changes(), principal=principal
        )
        return from_agent(changed)

    return router
