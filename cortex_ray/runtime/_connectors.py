"""MCP servers as governed connectors (issue 31), as use cases, reached as
``Runtime.connectors``: register a server, list them and their pinned tools, refresh (list
the server's tools and pin them), approve a changed definition, override a tool's tier,
choose the offered subset, remove. Each is admin-only, decided and audited by the
``UseCaseGate``; each change of a pin is an audit row of its own.

**stdio is the local operator's.** A stdio server is a command this machine runs: only the
local operator (the CLI, Python code holding the database) may register one, and only by
saying so (``local_operator=True``), which no HTTP route can set. An HTTP server's URL
passes the URL guard (no credentials in it; the installation's allowed hosts).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from cortex_ray._exceptions import (
    AccessDeniedError,
    CortexError,
    InvalidRequestError,
    NotFoundError,
    UnavailableError,
)
from cortex_ray._names import check_name
from cortex_ray._types import CapabilityTier, Principal, PrincipalKind, utcnow
from cortex_ray.access import UseCase
from cortex_ray.governance import (
    ConnectorPolicy,
    GovernanceStore,
    McpConnectorStore,
    McpRegistration,
    PinChange,
    PinnedTool,
    SecretStore,
)
from cortex_ray.mcp import (
    McpClient,
    McpServerConfig,
    McpToolOverlay,
    connection_key,
    mcp_tool_name,
    resolve_credentials,
)
from cortex_ray.runtime._gate import UseCaseGate
from cortex_ray.runtime._mcp_config import UrlGuard, basic_url_guard, check_config
from cortex_ray.runtime._mcp_credentials import OwnCredentials
from cortex_ray.storage import Store

__all__ = ["SYSTEM_REFRESHER", "McpConnectors", "McpServerView"]

SYSTEM_REFRESHER = "system:mcp-refresh"
"""Who the refreshes nobody asked for act and are audited as."""


@dataclass(frozen=True, slots=True)
class McpServerView:
    """A registered server, its instance's health, and its pinned tools (``tools``: the
    cortex-ray tool name of each, by the server's tool name)."""

    registration: McpRegistration
    health: str
    pins: tuple[PinnedTool, ...]

    @property
    def tool_names(self) -> dict[str, str]:
        return {p.tool: mcp_tool_name(self.registration.name, p.tool) for p in self.pins}


class McpConnectors(OwnCredentials):
    """The MCP connector use cases (see the module docstring)."""

    def __init__(
        self,
        *,
        gate: UseCaseGate,
        store: Store,
        mcp: McpConnectorStore,
        governance: GovernanceStore,
        policy: ConnectorPolicy,
        overlay: McpToolOverlay,
        client: McpClient,
        secrets: SecretStore | None,
        url_guard: UrlGuard | None = None,
        list_timeout_s: float = 30.0,
    ) -> None:
        self.gate = gate
        self.store = store
        self.mcp = mcp
        self.gov = governance
        self.policy = policy
        self.overlay = overlay
        self.client = client
        self.secrets = secrets
        self.url_guard = url_guard or basic_url_guard
        self.list_timeout_s = list_timeout_s

    def _changed(self, org_id: str) -> None:
        self.overlay.invalidate(org_id)
        self.policy.invalidate(org_id)

    async def register_mcp(
        self,
        org_id: str,
        name: str,
        config: McpServerConfig,
        *,
        tier_overrides: dict[str, CapabilityTier] | None = None,
        enabled_tools: Sequence[str] | None = None,
        refresh: bool = True,
        local_operator: bool = False,
        principal: Principal | None = None,
    ) -> McpServerView:
        """Register an MCP server as a connector of the organisation and (``refresh``) list
        and pin its tools (a server that does not answer yet is registered all the same:
        its health says why, and ``refresh_mcp`` pins later; so is one whose secret is not
        set yet: a secret bound to the connector can be set once it is registered).

        Raises:
            AccessDeniedError: Not an admin; or a stdio server without ``local_operator``.
            InvalidRequestError: A bad name or configuration, a URL the guard refuses.
            ConflictError: The organisation has a connector of that name.
        """
        args = {"connector": name[:100], "transport": config.transport.value}
        caller = await self.gate.authorize(principal, UseCase.MCP_REGISTER, org_id, args=args)
        try:
            check_config(config, local_operator, self.url_guard)
        except AccessDeniedError as exc:
            await self._refused(caller, UseCase.MCP_REGISTER, org_id, str(exc), args)
            raise
        check_name("connector", name)
        if not name.isidentifier() or "__" in name:
            raise InvalidRequestError(
                f"connector name {name[:40]!r}: an identifier without '__' (it prefixes its "
                "tools' names, <connector>__<tool>)"
            )
        if name in self.policy.connectors:
            raise InvalidRequestError(f"{name!r} is the name of a connector in code")
        await self.store.ensure_org(org_id)
        registration = await self.mcp.register(
            McpRegistration(
                org_id=org_id,
                name=name,
                config=config.model_dump(mode="json"),
                tier_overrides=dict(tier_overrides or {}),
                enabled_tools=None if enabled_tools is None else tuple(enabled_tools),
                created_by=caller.id,
                created_at=utcnow(),
            )
        )
        self._changed(org_id)
        await self.gate.audited(caller, UseCase.MCP_REGISTER, org_id, args=args)
        if refresh:
            # A server not reachable yet, or a credential not set yet (a secret bound to
            # the connector is set once it exists): recorded as the instance's health.
            with contextlib.suppress(CortexError):
                await self._refresh(caller, org_id, registration)
        return await self._view(org_id, name)

    async def list_mcp(
        self, org_id: str, *, principal: Principal | None = None
    ) -> list[McpServerView]:
        """The organisation's MCP servers with their pinned tools."""
        await self.gate.authorize(principal, UseCase.MCP_LIST, org_id)
        return [await self._view(org_id, r.name) for r in await self.mcp.registrations(org_id)]

    async def get_mcp(
        self, org_id: str, name: str, *, principal: Principal | None = None
    ) -> McpServerView:
        await self.gate.authorize(principal, UseCase.MCP_LIST, org_id, args={"connector": name})
        return await self._view(org_id, name)

    async def refresh_mcp(
        self, org_id: str, name: str, *, principal: Principal | None = None
    ) -> list[PinChange]:
        """List the server's tools and pin them: the first listing approves every
        definition; later a new tool or a changed digest is pending (its tool disappears
        until approved) and a tool no longer listed is removed. One audit row per change.

        Raises:
            NotFoundError: No such server here.
            UnavailableError: The server could not be listed (the reason names it).
        """
        args = {"connector": name}
        caller = await self.gate.authorize(principal, UseCase.MCP_REFRESH, org_id, args=args)
        registration = await self.mcp.get(org_id, name)
        return await self._refresh(caller, org_id, registration)

    async def refresh_as_system(
        self, org_id: str, name: str, principal_id: str | None = None
    ) -> list[PinChange]:
        """The refresh nobody asked for (a server announced a change, or the periodic
        sweep: ``McpListRefresher``): the same listing and pinning rule as ``refresh_mcp``,
        acting and audited as ``SYSTEM_REFRESHER`` (no caller to authorize). A
        per-principal server is listed with ``principal_id``'s own credentials (whose
        session heard the change).

        Raises:
            NotFoundError: No such server here (removed meanwhile).
            UnavailableError: The server could not be listed (its health says why).
        """
        caller = Principal(
            id=SYSTEM_REFRESHER, org_id=org_id, kind=PrincipalKind.SERVICE,
            name="MCP list refresher", is_admin=True,
        )  # fmt: skip
        registration = await self.mcp.get(org_id, name)
        return await self._refresh(caller, org_id, registration, principal_id)

    async def _refresh(
        self,
        caller: Principal,
        org_id: str,
        registration: McpRegistration,
        principal_id: str | None = None,
    ) -> list[PinChange]:
        name = registration.name
        config = McpServerConfig.model_validate(registration.config)
        # A per-principal server is listed with the credentials of whoever refreshes it.
        who = (principal_id or caller.id) if config.per_principal else None
        try:
            credentials = await resolve_credentials(config, self._reveal(org_id, name), who)
            async with asyncio.timeout(self.list_timeout_s):
                definitions = await self.client.list_tools(
                    connection_key(org_id, name, who), config, credentials
                )
        except (NotFoundError, AccessDeniedError, InvalidRequestError) as exc:
            await self.gov.set_health(org_id, name, f"failing: {exc}")
            raise
        except Exception as exc:  # unreachable, refused, protocol error
            why = f"MCP server {name!r} could not be listed: {type(exc).__name__}: {exc}"
            await self.gov.set_health(org_id, name, f"failing: {why}"[:500])
            raise UnavailableError(why) from exc
        changes = await self.mcp.apply_listing(
            org_id,
            name,
            [(d.name, d.digest(), d.model_dump(mode="json")) for d in definitions],
            caller.id,
        )
        await self.gov.set_health(org_id, name, "ok")
        self._changed(org_id)
        for change in changes:
            await self.gate.audited(
                caller,
                UseCase.MCP_REFRESH,
                org_id,
                args={"connector": name, **change.model_dump(mode="json")},
            )
        return changes

    async def approve_mcp_tool(
        self,
        org_id: str,
        name: str,
        tool: str,
        *,
        digest: str | None = None,
        principal: Principal | None = None,
    ) -> PinnedTool:
        """Approve a pending definition (``tool`` is the server's name for it; ``digest``,
        if given, must be the pending one), so its tool is offered again.

        Raises:
            NotFoundError: No such server or tool.
            ConflictError: It is not pending, or its pending digest is not ``digest``.
        """
        args = {"connector": name, "tool": tool, "digest": digest}
        caller = await self.gate.authorize(principal, UseCase.MCP_APPROVE, org_id, args=args)
        approved = await self.mcp.approve(org_id, name, tool, digest, caller.id)
        self._changed(org_id)
        await self.gate.audited(
            caller, UseCase.MCP_APPROVE, org_id, args={**args, "digest": approved.digest}
        )
        return approved

    async def set_mcp_tier(
        self,
        org_id: str,
        name: str,
        tool: str,
        tier: CapabilityTier | None,
        *,
        principal: Principal | None = None,
    ) -> McpServerView:
        """Override the tier of one of the server's tools (``None``: back to its
        annotations' default)."""
        args = {"connector": name, "tool": tool, "tier": None if tier is None else tier.value}
        caller = await self.gate.authorize(principal, UseCase.MCP_CONFIGURE, org_id, args=args)
        await self.mcp.set_tier(org_id, name, tool, tier)
        self._changed(org_id)
        await self.gate.audited(caller, UseCase.MCP_CONFIGURE, org_id, args=args)
        return await self._view(org_id, name)

    async def set_mcp_tools(
        self,
        org_id: str,
        name: str,
        tools: Sequence[str] | None,
        *,
        principal: Principal | None = None,
    ) -> McpServerView:
        """Offer only these of the server's tools (server names; ``None``: every approved
        one)."""
        args = {"connector": name, "tools": None if tools is None else list(tools)}
        caller = await self.gate.authorize(principal, UseCase.MCP_CONFIGURE, org_id, args=args)
        await self.mcp.set_enabled_tools(org_id, name, tools)
        self._changed(org_id)
        await self.gate.audited(caller, UseCase.MCP_CONFIGURE, org_id, args=args)
        return await self._view(org_id, name)

    async def remove_mcp(
        self, org_id: str, name: str, *, principal: Principal | None = None
    ) -> None:
        """Remove the server: its tools disappear at once, its grants are revoked, its
        instance is disabled (audit rows and grants keep naming it)."""
        args = {"connector": name}
        caller = await self.gate.authorize(principal, UseCase.MCP_REMOVE, org_id, args=args)
        await self.mcp.remove(org_id, name)
        self._changed(org_id)
        await self.gate.audited(caller, UseCase.MCP_REMOVE, org_id, args=args)

    async def health_of(self, org_id: str, caller: Principal, name: str) -> str | None:
        """Ask a registered server whether it answers (``ok``, or ``failing: why``), with
        the caller's credentials for a per-principal server; ``None`` when no server of that
        name is registered here. The caller (``Governance.check_connector``) records and
        audits it."""
        registration = await self.mcp.find(org_id, name)
        if registration is None:
            return None
        config = McpServerConfig.model_validate(registration.config)
        who = caller.id if config.per_principal else None
        try:
            credentials = await resolve_credentials(config, self._reveal(org_id, name), who)
            async with asyncio.timeout(self.list_timeout_s):
                problem = await self.client.health(
                    connection_key(org_id, name, who), config, credentials
                )
        except TimeoutError:
            problem = f"no answer in {self.list_timeout_s:g}s"
        except Exception as exc:  # a probe's failure is the health it reports
            problem = f"{type(exc).__name__}: {exc}"
        return "ok" if problem is None else f"failing: {problem}"

    async def tool_names(self, org_id: str, name: str) -> list[str] | None:
        """The cortex-ray tool names of a registered server's pinned tools (any status), or
        ``None`` when no server of that name is registered here (for grants)."""
        if await self.mcp.find(org_id, name) is None:
            return None
        return [mcp_tool_name(name, p.tool) for p in await self.mcp.pins(org_id, name)]

    def _reveal(self, org_id: str, name: str) -> Callable[[str], Awaitable[str]]:
        """Read a secret of the organisation as the connector ``name`` may."""

        async def reveal(secret: str) -> str:
            if self.secrets is None:
                raise InvalidRequestError("this runtime has no secret store")
            return await self.secrets.reveal(org_id, secret, connector=name)

        return reveal

    async def _view(self, org_id: str, name: str) -> McpServerView:
        registration = await self.mcp.get(org_id, name)
        instance = await self.gov.instance(org_id, name)
        pins = await self.mcp.pins(org_id, name)
        return McpServerView(registration, instance.health, tuple(pins))

    async def _refused(
        self, caller: Principal, use_case: UseCase, org_id: str, reason: str, args: dict[str, str]
    ) -> None:
        entry = self.gate.entry(caller, use_case, org_id, "REFUSED", reason, None, args)
        async with self.store.db.transaction() as conn:
            await self.store.insert_audit(conn, entry)
        self.gate.log_audited(caller, use_case, "REFUSED")
