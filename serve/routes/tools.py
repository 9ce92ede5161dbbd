"""Tools: the list, and direct calls through the invocation gate."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path, Query

from serve._deps import MemberDep, OrgPath, StateDep, org_router
from serve.schemas import ObservationBody, from_observation
from serve.schemas.tools import ToolBody, ToolCall, ToolList

__all__ = ["tools_router"]

ToolName = Annotated[str, Path(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")]


def tools_router() -> APIRouter:
    """The tools, and direct calls."""
    router = org_router()

    @router.get("/tools", response_model=ToolList, tags=["tools"])
    async def list_tools(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        agent_id: Annotated[str | None, Query(alias="agentId", pattern=r"^[^\x00]{1,200}$")] = None,
    ) -> ToolList:
        """Every tool of this server, or (with ``agentId``) what the caller may use with
        that agent: the agent's grant ∩ the caller's grant."""
        specs = await state.runtime.list_tools(org, agent_ref=agent_id, principal=principal)
        return ToolList(tools=[ToolBody.of(s) for s in specs])

    @router.post(
        "/tools/{tool_name}",
        response_model=ObservationBody,
        tags=["tools"],
    )
    async def call_tool(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        tool_name: ToolName,
        body: ToolCall,
        idempotency_key: Annotated[
            str | None,
            Header(
                alias="Idempotency-Key",
                min_length=1,
                max_length=200,
                pattern=r"^[\x20-\x7e]+$",
                description="repeat a call safely: a tool that writes returns the result "
                "of the first call with this key (per caller, agent and tool) and writes "
                "nothing",
            ),
        ] = None,
    ) -> ObservationBody:
        """Call a tool directly, as the caller, through the invocation gate (schema check,
        agent grant ∩ caller grant, hooks, limits, audit). The gate's verdict is the
        observation's ``status``: OK, REFUSED (with the reason), ERROR or TIMEOUT."""
        observation = await state.runtime.invoke_tool(
            org, body.agent_id, principal, tool_name, body.args, idempotency_key=idempotency_key
        )
        return from_observation(observation)

    return router
