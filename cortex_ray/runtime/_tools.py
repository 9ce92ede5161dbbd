"""Tools as use cases: the action space, and a direct call through the invocation gate."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from cortex_ray._exceptions import InvalidRequestError, NotFoundError
from cortex_ray._types import AgentMode, Observation, Principal, ToolSpec
from cortex_ray.access import UseCase
from cortex_ray.act import InvocationContext, ToolDispatcher, ToolRegistry
from cortex_ray.runtime._gate import UseCaseGate
from cortex_ray.storage import Store

__all__ = ["ToolUseCases"]


class ToolUseCases:
    """The runtime's tools (``Runtime.list_tools``, ``invoke_tool``)."""

    def __init__(
        self,
        gate: UseCaseGate,
        store: Store,
        registry: ToolRegistry,
        dispatcher: ToolDispatcher,
    ) -> None:
        self.gate = gate
        self.store = store
        self.registry = registry
        self.dispatcher = dispatcher

    async def list_tools(
        self,
        org_id: str,
        *,
        agent_ref: UUID | str | None = None,
        principal: Principal | None = None,
    ) -> list[ToolSpec]:
        """Every tool of this runtime, or (with ``agent_ref``) what the caller may use with
        that agent: the agent's grant ∩ the caller's grant."""
        if agent_ref is None:
            await self.gate.authorize(principal, UseCase.TOOLS_LIST, org_id)
            await self.registry.load(org_id)
            names = self.registry.names(org_id)
            tools = (self.registry.get(name, org_id) for name in names)
            return [self.registry.spec(tool) for tool in tools if tool is not None]
        caller, agent = await self.gate.agent_for(principal, UseCase.TOOLS_LIST, org_id, agent_ref)
        await self.dispatcher.load_tools(org_id)
        return self.dispatcher.action_space(agent, caller, AgentMode.INTERACTIVE)

    async def invoke_tool(
        self,
        org_id: str,
        agent_ref: UUID | str,
        caller: Principal,
        tool: str,
        args: dict[str, Any],
        *,
        idempotency_key: str | None = None,
    ) -> Observation:
        """A direct call (not chosen by a model), as ``caller``, through the invocation gate,
        which decides it (agent grant ∩ caller grant) and audits it like any call.

        ``idempotency_key`` (the HTTP ``Idempotency-Key`` header) reaches the tool as
        ``ToolContext.idempotency_key``, namespaced by caller, agent and tool
        (``call:<caller>:<agent id>:<tool>:<key>``) so that no other caller's key can
        replay this one's result; a tool that writes returns its first result for a
        repeated key (docs/architecture.md, "Writing a tool").

        Raises:
            InvalidRequestError: The key is empty, longer than 200 characters or not
                printable ASCII.
            NotFoundError: No tool of that name here.
        """
        if caller.org_id != org_id:
            raise InvalidRequestError("the caller belongs to another organisation")
        if idempotency_key is not None and not (
            0 < len(idempotency_key) <= 200
            and idempotency_key.isascii()
            and idempotency_key.isprintable()
        ):
            raise InvalidRequestError("an idempotency key is 1 to 200 printable ASCII characters")
        await self.registry.load(org_id)
        if self.registry.get(tool, org_id) is None:
            raise NotFoundError(f"unknown tool {tool!r}")
        agent = await self.store.get_agent(org_id, agent_ref)
        key = (
            None
            if idempotency_key is None
            else f"call:{caller.id}:{agent.id}:{tool}:{idempotency_key}"
        )
        ctx = InvocationContext(
            agent=agent, caller=caller, mode=AgentMode.INTERACTIVE, idempotency_key=key
        )
        return await self.dispatcher.invoke(ctx, tool, args)
