"""Who may invoke what. One rule, fail closed.

- AUTONOMOUS: the agent's own grant, acting as the agent's non-admin principal.
- INTERACTIVE: the agent's grant ∩ the caller's grant. A person can never make an agent do
  what the person may not do, nor what the agent may not do.
- A missing grant (no policy) denies. Being an admin does not widen an agent's grant.
- Principals of another organisation are always denied.
"""

from __future__ import annotations

from dataclasses import dataclass

from cortex_ray._types import ActionType, Agent, AgentMode, Principal, PrincipalKind

__all__ = ["AccessControlService", "AccessDecision"]


@dataclass(frozen=True, slots=True)
class AccessDecision:
    allowed: bool
    reason: str


class AccessControlService:
    """Decides every tool call; the invocation gate asks it before anything runs."""

    def decide(
        self,
        agent: Agent,
        caller: Principal | None,
        tool: str,
        action_type: ActionType,
        *,
        mode: AgentMode | None = None,
    ) -> AccessDecision:
        mode = mode or agent.mode
        if tool not in agent.tools:
            return AccessDecision(False, f"tool {tool!r} is not in agent {agent.name!r}'s tool set")
        if agent.grant is None:
            return AccessDecision(False, f"agent {agent.name!r} has no access policy (deny)")
        if not agent.grant.allows(tool, action_type):
            return AccessDecision(False, f"agent {agent.name!r} is not granted {tool!r}")
        if mode is AgentMode.AUTONOMOUS:
            return AccessDecision(True, "agent grant")
        if caller is None:
            return AccessDecision(False, "an interactive call needs a caller principal (deny)")
        if caller.org_id != agent.org_id:
            return AccessDecision(False, "caller belongs to another organisation")
        if caller.kind is PrincipalKind.AGENT and caller.id != agent.principal().id:
            return AccessDecision(False, "another agent cannot drive this agent interactively")
        if caller.grant is None:
            return AccessDecision(False, f"caller {caller.id!r} has no access policy (deny)")
        if not caller.grant.allows(tool, action_type):
            return AccessDecision(False, f"caller {caller.id!r} is not granted {tool!r}")
        return AccessDecision(True, "agent grant ∩ caller grant")

    def principal_for(self, agent: Agent, caller: Principal | None, mode: AgentMode) -> Principal:
        """The principal a call runs as: the agent's own for autonomous runs, else the caller."""
        if mode is AgentMode.AUTONOMOUS or caller is None:
            return agent.principal()
        return caller
