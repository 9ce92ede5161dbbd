"""Agents as use cases: list, read, create and change an organisation's agents."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any
from uuid import UUID

from pydantic import ValidationError

from cortex_ray._exceptions import InvalidRequestError
from cortex_ray._names import check_name
from cortex_ray._types import Agent, AgentChanges, AgentMode, Grant, Principal
from cortex_ray.access import UseCase
from cortex_ray.act import BUILTIN_TOOL_NAMES, ToolRegistry
from cortex_ray.runtime._gate import UseCaseGate, first_error
from cortex_ray.storage import AgentStore

__all__ = ["AgentUseCases"]


class AgentUseCases:
    """The organisation's agents (``Runtime.list_agents``, ``create_agent``, ...)."""

    def __init__(self, gate: UseCaseGate, store: AgentStore, registry: ToolRegistry) -> None:
        self.gate = gate
        self.store = store
        self.registry = registry

    async def list_agents(self, org_id: str, *, principal: Principal | None = None) -> list[Agent]:
        """The organisation's agents."""
        await self.gate.authorize(principal, UseCase.AGENTS_LIST, org_id)
        return await self.store.list_agents(org_id)

    async def get_agent(
        self, org_id: str, agent_ref: UUID | str, *, principal: Principal | None = None
    ) -> Agent:
        """One agent, by id or name."""
        _, agent = await self.gate.agent_for(principal, UseCase.AGENTS_GET, org_id, agent_ref)
        return agent

    async def create_agent(
        self,
        org_id: str,
        name: str,
        *,
        persona: str = "",
        mode: AgentMode = AgentMode.INTERACTIVE,
        tools: Sequence[str] | None = None,
        skills: Sequence[str] = (),
        grant: Grant | None = None,
        critic: bool = False,
        principal: Principal | None = None,
    ) -> Agent:
        """Create an agent (admin only). By default it has every built-in tool and a grant
        for them; ``critic`` turns on its inner voice (a review of each final answer).

        ``tools`` need not name ``reply``: an INTERACTIVE agent always answers the person it
        talks with, whatever its tool set and grant (``cortex_ray.access``: dialogue is the
        conversation's, not a grant's), so ``tools=["current_time"]`` is a working chat."""
        args = {"name": name[:200], "mode": mode.value}
        caller = await self.gate.authorize(principal, UseCase.AGENTS_CREATE, org_id, args=args)
        name = check_name("agent", name.strip())  # addressable in a path as it is
        tool_names = tuple(tools) if tools is not None else BUILTIN_TOOL_NAMES
        await self._check_tools(org_id, tool_names)
        try:
            agent = Agent(
                org_id=org_id,
                name=name.strip(),
                persona=persona,
                mode=mode,
                tools=tool_names,
                skills=tuple(skills),
                grant=grant if grant is not None else Grant(tools=frozenset(tool_names)),
                critic=critic,
            )
        except ValidationError as exc:
            raise InvalidRequestError(f"invalid agent: {first_error(exc)}") from exc
        created = await self.store.create_agent(agent)
        await self.gate.audited(caller, UseCase.AGENTS_CREATE, org_id, agent=created, args=args)
        return created

    async def update_agent(
        self,
        org_id: str,
        agent_ref: UUID | str,
        changes: AgentChanges,
        *,
        principal: Principal | None = None,
    ) -> Agent:
        """Change an agent's mode, persona, tools, skills, grant or critic (admin only): the
        fields set on ``changes``."""
        given = changes.model_fields_set
        args = {"fields": sorted(given)}
        caller, agent = await self.gate.agent_for(
            principal, UseCase.AGENTS_UPDATE, org_id, agent_ref, args=args
        )
        update: dict[str, Any] = {}
        if "tools" in given and changes.tools is not None:
            await self._check_tools(org_id, changes.tools)
            update["tools"] = tuple(changes.tools)
        if "persona" in given and changes.persona is not None:
            update["persona"] = changes.persona
        if "mode" in given and changes.mode is not None:
            update["mode"] = changes.mode
        if "skills" in given and changes.skills is not None:
            update["skills"] = tuple(changes.skills)
        if "grant" in given:
            update["grant"] = changes.grant
        if "critic" in given and changes.critic is not None:
            update["critic"] = changes.critic
        changed = await self.store.update_agent(agent.model_copy(update=update))
        await self.gate.audited(caller, UseCase.AGENTS_UPDATE, org_id, agent=changed, args=args)
        return changed

    async def _check_tools(self, org_id: str, names: Iterable[str]) -> None:
        """Every name a tool here: of this runtime, or the organisation's own (an approved
        tool of one of its MCP servers: an agent may hold any subset of a server's tools)."""
        await self.registry.load(org_id)
        unknown = [t for t in names if self.registry.get(t, org_id) is None]
        if unknown:
            raise InvalidRequestError(f"unknown tools: {', '.join(unknown)}")
