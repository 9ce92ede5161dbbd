"""MCP servers as connectors: register, list, refresh (pin), approve, tiers, remove.

The routes only parse, call ``Runtime.connectors`` and render: the core decides and audits.
None of them can register a stdio server: ``local_operator`` is never set here."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from fastapi import APIRouter, Path, Response

from serve._deps import NOT_ADMIN, MemberDep, OrgPath, StateDep, org_router
from serve.schemas.connectors import (
    McpRegister,
    McpServerList,
    McpServerOut,
    OwnCredentialOut,
    OwnCredentialPut,
    PinApprove,
    PinBody,
    PinChangeBody,
    PinChanges,
    TierSet,
    ToolsSet,
)
from serve.schemas.governance import vars_of

__all__ = ["connectors_router"]

ServerName = Annotated[str, Path(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")]
ToolPath = Annotated[str, Path(min_length=1, max_length=200)]
SecretPath = Annotated[str, Path(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,99}$")]
TAGS: list[str | Enum] = ["connectors"]


def connectors_router() -> APIRouter:
    """MCP servers registered as connectors (admins)."""
    router = org_router()

    @router.get("/connectors/mcp", response_model=McpServerList, tags=TAGS, responses=NOT_ADMIN)
    async def list_servers(state: StateDep, org: OrgPath, principal: MemberDep) -> McpServerList:
        """The organisation's MCP servers and their pinned tool definitions (admins)."""
        views = await state.runtime.connectors.list_mcp(org, principal=principal)
        return McpServerList(servers=[McpServerOut.of(v) for v in views])

    @router.post(
        "/connectors/mcp",
        response_model=McpServerOut,
        status_code=201,
        tags=TAGS,
        responses=NOT_ADMIN,
    )
    async def register_server(
        state: StateDep, org: OrgPath, principal: MemberDep, body: McpRegister
    ) -> McpServerOut:
        """Register an MCP server reached over HTTP (admins) and pin its tools; a stdio
        server is refused (403): only the local operator may register one."""
        view = await state.runtime.connectors.register_mcp(
            org,
            body.name,
            body.server.config(),
            tier_overrides=dict(body.tier_overrides),
            enabled_tools=body.enabled_tools,
            refresh=body.refresh,
            principal=principal,
        )
        return McpServerOut.of(view)

    @router.get(
        "/connectors/mcp/{name}", response_model=McpServerOut, tags=TAGS, responses=NOT_ADMIN
    )
    async def get_server(
        state: StateDep, org: OrgPath, principal: MemberDep, name: ServerName
    ) -> McpServerOut:
        """One MCP server and its pinned tool definitions (admins)."""
        view = await state.runtime.connectors.get_mcp(org, name, principal=principal)
        return McpServerOut.of(view)

    @router.post(
        "/connectors/mcp/{name}/refresh", response_model=PinChanges, tags=TAGS, responses=NOT_ADMIN
    )
    async def refresh_server(
        state: StateDep, org: OrgPath, principal: MemberDep, name: ServerName
    ) -> PinChanges:
        """List the server's tools and pin them (admins): a new or changed definition is
        pending, its tool withdrawn until approved; 503 when the server cannot be listed."""
        changes = await state.runtime.connectors.refresh_mcp(org, name, principal=principal)
        return PinChanges(changes=[PinChangeBody.of(c) for c in changes])

    @router.post(
        "/connectors/mcp/{name}/tools/{tool}/approve",
        response_model=PinBody,
        tags=TAGS,
        responses=NOT_ADMIN,
    )
    async def approve_tool(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        name: ServerName,
        tool: ToolPath,
        body: PinApprove,
    ) -> PinBody:
        """Approve a pending tool definition (admins); 409 if it is not pending or its
        digest is not the one given."""
        pin = await state.runtime.connectors.approve_mcp_tool(
            org, name, tool, digest=body.digest, principal=principal
        )
        return PinBody.of(pin)

    @router.put(
        "/connectors/mcp/{name}/tools/{tool}/tier",
        response_model=McpServerOut,
        tags=TAGS,
        responses=NOT_ADMIN,
    )
    async def set_tier(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        name: ServerName,
        tool: ToolPath,
        body: TierSet,
    ) -> McpServerOut:
        """Override the tier of one of the server's tools (admins; null: the default)."""
        view = await state.runtime.connectors.set_mcp_tier(
            org, name, tool, body.tier, principal=principal
        )
        return McpServerOut.of(view)

    @router.put(
        "/connectors/mcp/{name}/tools", response_model=McpServerOut, tags=TAGS, responses=NOT_ADMIN
    )
    async def set_tools(
        state: StateDep, org: OrgPath, principal: MemberDep, name: ServerName, body: ToolsSet
    ) -> McpServerOut:
        """Offer only these of the server's tools (admins; null: every approved one)."""
        view = await state.runtime.connectors.set_mcp_tools(
            org, name, body.tools, principal=principal
        )
        return McpServerOut.of(view)

    @router.delete("/connectors/mcp/{name}", status_code=204, tags=TAGS, responses=NOT_ADMIN)
    async def remove_server(
        state: StateDep, org: OrgPath, principal: MemberDep, name: ServerName
    ) -> Response:
        """Remove the server (admins): its tools go at once, its grants are revoked."""
        await state.runtime.connectors.remove_mcp(org, name, principal=principal)
        return Response(status_code=204)

    @router.put(
        "/connectors/mcp/{name}/credentials/{secret}",
        response_model=OwnCredentialOut,
        tags=TAGS,
    )
    async def set_own_credential(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        name: ServerName,
        secret: SecretPath,
        body: OwnCredentialPut,
    ) -> OwnCredentialOut:
        """Set the caller's own value of a secret the per-principal server names (any
        member, for themselves); sealed at rest, never returned."""
        info = await state.runtime.connectors.set_own_credential(
            org, name, secret, body.value, principal=principal
        )
        return OwnCredentialOut.model_validate(vars_of(info))

    @router.delete("/connectors/mcp/{name}/credentials/{secret}", status_code=204, tags=TAGS)
    async def delete_own_credential(
        state: StateDep, org: OrgPath, principal: MemberDep, name: ServerName, secret: SecretPath
    ) -> Response:
        """Remove the caller's own value of the secret."""
        await state.runtime.connectors.delete_own_credential(org, name, secret, principal=principal)
        return Response(status_code=204)

    return router
