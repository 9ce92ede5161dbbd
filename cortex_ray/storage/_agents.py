"""Agents: a persona, a mode, tools, skills and a grant, one row each."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import psycopg

from cortex_ray._exceptions import InvalidRequestError, NotFoundError
from cortex_ray._types import Agent, AgentMode
from cortex_ray.storage._database import Conn
from cortex_ray.storage._principals import PrincipalRows
from cortex_ray.storage._rows import grant_json, grant_of

__all__ = ["AgentRows"]


def _agent(row: dict[str, Any]) -> Agent:
    return Agent(
        id=row["id"],
        org_id=row["org_id"],
        name=row["name"],
        persona=row["persona"],
        mode=AgentMode(row["mode"]),
        tools=tuple(row["tools"]),
        skills=tuple(row["skills"]),
        grant=grant_of(row["grant_policy"]),
        critic=row["critic"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


class AgentRows(PrincipalRows):
    """Agents of an organisation (creating one creates its organisation on first use)."""

    async def create_agent(self, agent: Agent) -> Agent:
        await self.ensure_org(agent.org_id)
        try:
            async with self.db.transaction() as conn:
                cur = await conn.execute(
                    """
                    INSERT INTO agents (org_id, id, name, persona, mode, tools, skills,
                                        grant_policy, critic, created_at, updated_at)
                    VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING *
                    """,
                    (
                        agent.org_id,
                        agent.id,
                        agent.name,
                        agent.persona,
                        agent.mode.value,
                        list(agent.tools),
                        list(agent.skills),
                        grant_json(agent.grant),
                        agent.critic,
                        agent.created_at,
                        agent.updated_at,
                    ),
                )
                row = await cur.fetchone()
        except psycopg.errors.UniqueViolation as exc:
            raise InvalidRequestError(
                f"an agent named {agent.name!r} already exists in {agent.org_id!r}"
            ) from exc
        assert row is not None
        return _agent(row)

    async def get_agent(self, org_id: str, agent_id: UUID | str) -> Agent:
        # One statement: outside a transaction it is one round trip, not three.
        async with self.db.connection() as conn:
            return await self.get_agent_in(conn, org_id, agent_id)

    async def get_agent_in(self, conn: Conn, org_id: str, agent_id: UUID | str) -> Agent:
        try:
            key = agent_id if isinstance(agent_id, UUID) else UUID(str(agent_id))
        except ValueError:
            key = None
        if key is not None:
            cur = await conn.execute(
                "SELECT * FROM agents WHERE org_id = %s AND id = %s", (org_id, key)
            )
        else:
            cur = await conn.execute(
                "SELECT * FROM agents WHERE org_id = %s AND name = %s", (org_id, str(agent_id))
            )
        row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"agent {agent_id!s} not found in organisation {org_id!r}")
        return _agent(row)

    async def list_agents(self, org_id: str) -> list[Agent]:
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                "SELECT * FROM agents WHERE org_id = %s ORDER BY created_at, name", (org_id,)
            )
            return [_agent(r) for r in await cur.fetchall()]

    async def update_agent(self, agent: Agent) -> Agent:
        async with self.db.transaction() as conn:
            return await self.update_agent_in(conn, agent)

    async def update_agent_in(self, conn: Conn, agent: Agent) -> Agent:
        cur = await conn.execute(
            """
            UPDATE agents SET persona = %s, mode = %s, tools = %s, skills = %s,
                   grant_policy = %s, critic = %s, updated_at = now()
            WHERE org_id = %s AND id = %s RETURNING *
            """,
            (
                agent.persona,
                agent.mode.value,
                list(agent.tools),
                list(agent.skills),
                grant_json(agent.grant),
                agent.critic,
                agent.org_id,
                agent.id,
            ),
        )
        row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"agent {agent.id} not found in organisation {agent.org_id!r}")
        return _agent(row)
