"""Organisations, principals, agents and API keys, as ``Store`` keeps them."""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import datetime
from uuid import UUID, uuid4

from cortex_ray._exceptions import InvalidRequestError, NotFoundError
from cortex_ray._types import Agent, Principal, utcnow
from fakes._tables import ApiKeyRow, Tables

__all__ = ["Directory"]

# The CHECK on ``organisations.id`` (migration 0001).
_ORG_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


def _key_hash(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _as_uuid(ref: UUID | str) -> UUID | None:
    if isinstance(ref, UUID):
        return ref
    try:
        return UUID(str(ref))
    except ValueError:
        return None


class Directory(Tables):
    """``PrincipalStore``, ``AgentStore`` and ``ApiKeyStore``."""

    # organisations and principals ---------------------------------------------------------

    async def ensure_org(self, org_id: str, name: str = "") -> None:
        if not _ORG_ID.fullmatch(org_id):
            raise InvalidRequestError(
                f"invalid organisation id {org_id!r}: use letters, digits, '_', '.', '-'"
            )
        self.orgs.add(org_id)

    async def put_principal(self, principal: Principal) -> Principal:
        await self.ensure_org(principal.org_id)
        self.principals[principal.org_id, principal.id] = principal
        return principal

    async def get_principal(self, org_id: str, principal_id: str) -> Principal:
        try:
            return self.principals[org_id, principal_id]
        except KeyError:
            raise NotFoundError(
                f"principal {principal_id!r} not found in organisation {org_id!r}"
            ) from None

    # agents -------------------------------------------------------------------------------

    async def create_agent(self, agent: Agent) -> Agent:
        await self.ensure_org(agent.org_id)
        taken = any(
            org == agent.org_id and (key == agent.id or a.name == agent.name)
            for (org, key), a in self.agents.items()
        )
        if taken:
            raise InvalidRequestError(
                f"an agent named {agent.name!r} already exists in {agent.org_id!r}"
            )
        self.agents[agent.org_id, agent.id] = agent
        self._inserted[agent.org_id, agent.id] = next(self._order)
        return agent

    async def get_agent(self, org_id: str, agent_id: UUID | str) -> Agent:
        key = _as_uuid(agent_id)
        for (org, id_), agent in self.agents.items():
            if org == org_id and (id_ == key if key is not None else agent.name == agent_id):
                return agent
        raise NotFoundError(f"agent {agent_id!s} not found in organisation {org_id!r}")

    async def list_agents(self, org_id: str) -> list[Agent]:
        return sorted(
            (a for (org, _), a in self.agents.items() if org == org_id),
            key=lambda a: (a.created_at, a.name),
        )

    async def update_agent(self, agent: Agent) -> Agent:
        stored = self.agents.get((agent.org_id, agent.id))
        if stored is None:
            raise NotFoundError(f"agent {agent.id} not found in organisation {agent.org_id!r}")
        changed = stored.model_copy(
            update={
                "persona": agent.persona,
                "mode": agent.mode,
                "tools": agent.tools,
                "skills": agent.skills,
                "grant": agent.grant,
                "critic": agent.critic,
                "updated_at": utcnow(),
            }
        )
        self.agents[agent.org_id, agent.id] = changed
        return changed

    # API keys -----------------------------------------------------------------------------

    async def create_api_key(self, principal: Principal, name: str = "") -> tuple[str, UUID]:
        if (principal.org_id, principal.id) not in self.principals:
            await self.put_principal(principal)
        key_id = uuid4()
        key = f"crx_{secrets.token_hex(4)}_{secrets.token_urlsafe(32)}"
        self.api_keys[principal.org_id, key_id] = ApiKeyRow(
            principal.org_id, principal.id, _key_hash(key)
        )
        return key, key_id

    async def principal_for_api_key(self, key: str) -> Principal | None:
        if not key.startswith("crx_") or len(key) > 200:
            return None
        digest = _key_hash(key)
        for stored in self.api_keys.values():
            if stored.key_hash == digest and stored.revoked_at is None:
                return self.principals[stored.org_id, stored.principal_id]
        return None

    async def revoke_api_key(self, org_id: str, key_id: UUID) -> tuple[datetime, bool]:
        stored = self.api_keys.get((org_id, key_id))
        if stored is None:
            raise NotFoundError(f"no API key {key_id} in organisation {org_id!r}")
        if stored.revoked_at is not None:
            return stored.revoked_at, False
        stored.revoked_at = utcnow()
        return stored.revoked_at, True

    # audit --------------------------------------------------------------------------------
