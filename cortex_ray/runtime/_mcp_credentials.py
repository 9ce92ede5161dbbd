"""A person's own credentials for a per-principal MCP server: each member sets (and removes)
their own copy of a secret the server's configuration names, never anybody else's, and never
reads one back. Part of ``Runtime.connectors`` (``McpConnectors``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cortex_ray._exceptions import InvalidRequestError, NotFoundError
from cortex_ray._types import Principal
from cortex_ray.access import UseCase
from cortex_ray.governance import McpConnectorStore, SecretInfo, SecretStore
from cortex_ray.mcp import McpServerConfig, principal_secret_name

if TYPE_CHECKING:
    from cortex_ray.runtime._gate import UseCaseGate

__all__ = ["OwnCredentials"]


class OwnCredentials:
    """The per-principal credential use cases (a mix-in of ``McpConnectors``)."""

    gate: UseCaseGate
    mcp: McpConnectorStore
    secrets: SecretStore | None

    async def set_own_credential(
        self, org_id: str, name: str, secret: str, value: str, *, principal: Principal | None = None
    ) -> SecretInfo:
        """Set the caller's own value of ``secret`` for the per-principal server ``name``
        (stored as ``principal_secret_name(secret, caller)``, bound to the server, sealed at
        rest). Any member may; the audit row names the secret, never its value.

        Raises:
            NotFoundError: No server of that name here.
            InvalidRequestError: The server does not take per-principal credentials, or
                its configuration names no such secret; an empty or too long value.
        """
        args = {"connector": name[:100], "secret": secret[:100]}
        caller = await self.gate.authorize(principal, UseCase.MCP_OWN_CREDENTIAL, org_id, args=args)
        own = await self._own_name(org_id, name, secret, caller)
        if self.secrets is None:
            raise InvalidRequestError("this runtime has no secret store")
        info = await self.secrets.put(org_id, own, value, connector=name, by=caller.id)
        await self.gate.audited(caller, UseCase.MCP_OWN_CREDENTIAL, org_id, args=args)
        return info

    async def delete_own_credential(
        self, org_id: str, name: str, secret: str, *, principal: Principal | None = None
    ) -> None:
        """Remove the caller's own value of ``secret`` for the server ``name``."""
        args = {"connector": name[:100], "secret": secret[:100], "delete": True}
        caller = await self.gate.authorize(principal, UseCase.MCP_OWN_CREDENTIAL, org_id, args=args)
        own = await self._own_name(org_id, name, secret, caller)
        if self.secrets is None:
            raise InvalidRequestError("this runtime has no secret store")
        await self.secrets.delete(org_id, own)
        await self.gate.audited(caller, UseCase.MCP_OWN_CREDENTIAL, org_id, args=args)

    async def _own_name(self, org_id: str, name: str, secret: str, caller: Principal) -> str:
        registration = await self.mcp.find(org_id, name)
        if registration is None:
            raise NotFoundError(f"no MCP server {name[:100]!r} in organisation {org_id!r}")
        config = McpServerConfig.model_validate(registration.config)
        if not config.per_principal:
            raise InvalidRequestError(
                f"MCP server {name!r} uses the organisation's credentials, not each person's "
                "(an admin sets them: PUT .../secrets/{name})"
            )
        named = {config.bearer_secret, *config.headers.values(), *config.env.values()} - {None}
        if secret not in named:
            raise InvalidRequestError(
                f"MCP server {name!r} names no secret {secret[:100]!r}; it names "
                f"{sorted(str(n) for n in named)}"
            )
        return principal_secret_name(secret, caller.id)
