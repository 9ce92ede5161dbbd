"""The governance use cases (connectors, grants, the audit log, secrets, and, through the
services they delegate to, run reviews, approvals and schedules), reached as
``Runtime.governance``: each takes the calling principal and is decided and audited by the
``UseCaseGate``, like every use case. What they manage (policy, store, types, schedules,
secrets) is ``cortex_ray.governance``'s."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from uuid import UUID

from cortex_ray._exceptions import InvalidRequestError, NotFoundError
from cortex_ray._types import Principal, utcnow
from cortex_ray.access import UseCase
from cortex_ray.governance import (
    Connector,
    ConnectorGrant,
    ConnectorInstance,
    ConnectorPolicy,
    ConnectorView,
    GovernanceStore,
    GrantRequest,
    InputLimits,
    Rotation,
    ScheduleStore,
    SecretInfo,
    SecretStore,
    check_constraints,
    is_mcp_instance,
)
from cortex_ray.observability import scrub
from cortex_ray.runtime._delegate import delegate
from cortex_ray.runtime._gate import UseCaseGate
from cortex_ray.runtime._reviews import ReviewUseCases
from cortex_ray.runtime._schedules import ScheduleUseCases
from cortex_ray.storage import Store

__all__ = ["HEALTH_TIMEOUT_S", "Governance"]

HEALTH_TIMEOUT_S = 10.0


class Governance:
    """Connectors, grants, the audit log and secrets, as use cases (see the module
    docstring); run reports, labels and approvals delegate to ``reviews``, schedules to
    ``scheduling`` (one-line typed delegations, as on ``Runtime``)."""

    def __init__(
        self,
        *,
        gate: UseCaseGate,
        store: Store,
        governance: GovernanceStore,
        policy: ConnectorPolicy,
        tools_of: Callable[[str], Sequence[str]],
        excludes_requester: bool = False,
        secrets: SecretStore | None = None,
        input_limits: InputLimits | None = None,
        mcp_tools_of: Callable[[str, str], Awaitable[list[str] | None]] | None = None,
        mcp_health: Callable[[str, Principal, str], Awaitable[str | None]] | None = None,
    ) -> None:
        self._mcp_health = mcp_health
        """Probe an organisation's registered MCP server (``None``: no such server)."""
        self.gate = gate
        self._mcp_tools_of = mcp_tools_of
        """The tool names of an organisation's registered MCP server (``None``: no such
        server): its connector is defined by its registration, not in code."""
        self.excludes_requester = excludes_requester
        self.secrets = secrets
        self.input_limits = input_limits or InputLimits()
        self.schedules = ScheduleStore(store.db, self.input_limits)
        self.store = store
        self.gov = governance
        self.policy = policy
        self._tools_of = tools_of
        self.reviews = ReviewUseCases(
            gate, store, governance, excludes_requester=excludes_requester
        )
        self.scheduling = ScheduleUseCases(gate, store, self.schedules, self.input_limits)
        self.schedules_changed: asyncio.Event = self.scheduling.schedules_changed
        """Set when a schedule is made or resumed here: wakes this process's scheduler."""

    run_report = delegate("reviews", ReviewUseCases.run_report)
    label_run = delegate("reviews", ReviewUseCases.label_run)
    shadow_report = delegate("reviews", ReviewUseCases.shadow_report)
    list_approvals = delegate("reviews", ReviewUseCases.list_approvals)
    get_approval = delegate("reviews", ReviewUseCases.get_approval)
    decide_approval = delegate("reviews", ReviewUseCases.decide_approval)
    expire_approvals = delegate("reviews", ReviewUseCases.expire_approvals)
    create_schedule = delegate("scheduling", ScheduleUseCases.create_schedule)
    list_schedules = delegate("scheduling", ScheduleUseCases.list_schedules)
    change_schedule = delegate("scheduling", ScheduleUseCases.change_schedule)
    next_schedule_at = delegate("scheduling", ScheduleUseCases.next_schedule_at)
    fire_due_schedules = delegate("scheduling", ScheduleUseCases.fire_due_schedules)

    def _definition(self, name: str) -> Connector:
        connector = self.policy.connectors.get(name)
        if connector is None:
            raise NotFoundError(f"no connector {name!r} is registered")
        return connector

    async def _connector_tools(self, org_id: str, name: str) -> list[str]:
        """The tools of a connector in code, or of a registered MCP server of the
        organisation (``NotFoundError`` when neither)."""
        if name not in self.policy.connectors and self._mcp_tools_of is not None:
            found = await self._mcp_tools_of(org_id, name)
            if found is not None:
                return found
        self._definition(name)
        return list(self._tools_of(name))

    async def list_connectors(
        self, org_id: str, *, principal: Principal | None = None
    ) -> list[ConnectorView]:
        """Every registered connector with its tools and this organisation's instance."""
        await self.gate.authorize(principal, UseCase.CONNECTORS_LIST, org_id)
        installed = {i.connector: i for i in await self.gov.instances(org_id)}
        views = [
            ConnectorView(c, tuple(self._tools_of(name)), installed.get(name))
            for name, c in sorted(self.policy.connectors.items())
        ]
        for name, instance in sorted(installed.items()):
            if name in self.policy.connectors or not is_mcp_instance(instance):
                continue
            tools = await self._mcp_tools_of(org_id, name) if self._mcp_tools_of else None
            if tools is not None:  # a registered MCP server (a removed one is not listed)
                views.append(ConnectorView(Connector(name, "MCP server"), tuple(tools), instance))
        return views

    async def install_connector(
        self,
        org_id: str,
        name: str,
        *,
        config: dict[str, Any] | None = None,
        enabled: bool = True,
        principal: Principal | None = None,
    ) -> ConnectorInstance:
        """Install (or reconfigure, enable, disable) a connector in the organisation.

        Raises:
            NotFoundError: No connector of that name is registered.
            InvalidRequestError: The configuration holds what looks like a credential
                (credentials belong in the secret store), or ``redact_fields`` is not a
                list of names.
        """
        args = {"connector": name, "enabled": enabled}
        caller = await self.gate.authorize(principal, UseCase.CONNECTORS_INSTALL, org_id, args=args)
        self._definition(name)
        config = dict(config or {})
        if scrub(config) != config:
            raise InvalidRequestError(
                "the configuration holds a credential: keep secrets out of connector config"
            )
        fields = config.get("redact_fields", [])
        if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
            raise InvalidRequestError("redact_fields must be a list of field names")
        await self.store.ensure_org(org_id)
        instance = await self.gov.put_instance(
            ConnectorInstance(org_id=org_id, connector=name, config=config, enabled=enabled)
        )
        self.policy.invalidate(org_id)
        await self.gate.audited(caller, UseCase.CONNECTORS_INSTALL, org_id, args=args)
        return instance

    async def check_connector(
        self, org_id: str, name: str, *, principal: Principal | None = None
    ) -> ConnectorInstance:
        """Run the connector's health probe on this organisation's instance and record the
        answer (``ok``, or why not; ``unknown`` without a probe)."""
        args = {"connector": name}
        caller = await self.gate.authorize(principal, UseCase.CONNECTORS_CHECK, org_id, args=args)
        mcp = None
        if name not in self.policy.connectors and self._mcp_health is not None:
            mcp = await self._mcp_health(org_id, caller, name)
        definition = self._definition(name) if mcp is None else None
        instance = await self.gov.instance(org_id, name)
        if mcp is not None:
            health = mcp
        elif definition is None or definition.health is None:
            health = "unknown"
        else:
            try:
                async with asyncio.timeout(HEALTH_TIMEOUT_S):
                    problem = await definition.health(instance.config)
                health = "ok" if problem is None else f"failing: {problem}"
            except TimeoutError:
                health = f"failing: no answer in {HEALTH_TIMEOUT_S:g}s"
            except Exception as exc:  # a probe's failure is the health it reports
                health = f"failing: {type(exc).__name__}: {exc}"
        checked = await self.gov.set_health(org_id, name, scrub(health))
        await self.gate.audited(caller, UseCase.CONNECTORS_CHECK, org_id, args=args)
        return checked

    async def create_grant(
        self, org_id: str, request: GrantRequest, *, principal: Principal | None = None
    ) -> ConnectorGrant:
        """Grant a principal (or ``*``) calls of a connector's tools.

        Raises:
            NotFoundError: The connector is not registered or not installed here.
            InvalidRequestError: A named tool is not the connector's, a constraint is
                outside the supported subset, or the expiry has passed.
        """
        args = request.model_dump(mode="json")
        caller = await self.gate.authorize(principal, UseCase.GRANTS_CREATE, org_id, args=args)
        mine = set(await self._connector_tools(org_id, request.connector))
        strangers = sorted(set(request.tools) - mine)
        if strangers:
            raise InvalidRequestError(
                f"not tools of connector {request.connector!r}: {', '.join(strangers)}"
            )
        check_constraints(request.constraints, self.input_limits.max_pattern_chars)
        if request.expires_at is not None:
            if request.expires_at.tzinfo is None:
                raise InvalidRequestError("expires_at needs a time zone")
            if request.expires_at <= utcnow():
                raise InvalidRequestError("expires_at is in the past")
        grant = await self.gov.create_grant(
            ConnectorGrant(org_id=org_id, created_by=caller.id, **request.model_dump())
        )
        self.policy.invalidate(org_id)
        await self.gate.audited(caller, UseCase.GRANTS_CREATE, org_id, args=args)
        return grant

    async def list_grants(
        self,
        org_id: str,
        *,
        principal_id: str | None = None,
        include_revoked: bool = False,
        principal: Principal | None = None,
    ) -> list[ConnectorGrant]:
        await self.gate.authorize(principal, UseCase.GRANTS_LIST, org_id)
        return await self.gov.grants(
            org_id, principal_id=principal_id, include_revoked=include_revoked
        )

    async def revoke_grant(
        self, org_id: str, grant_id: UUID, *, principal: Principal | None = None
    ) -> ConnectorGrant:
        """Revoke a grant (at once: the gate reads grants on every call). Revoking a revoked
        grant keeps its first revocation time."""
        args = {"grant": str(grant_id)}
        caller = await self.gate.authorize(principal, UseCase.GRANTS_REVOKE, org_id, args=args)
        revoked = await self.gov.revoke_grant(org_id, grant_id)
        self.policy.invalidate(org_id)
        await self.gate.audited(caller, UseCase.GRANTS_REVOKE, org_id, args=args)
        return revoked

    async def audit(
        self,
        org_id: str,
        *,
        run_id: UUID | None = None,
        gate_only: bool = False,
        principal: Principal | None = None,
    ) -> list[dict[str, Any]]:
        """The organisation's audit rows, oldest first (see ``Store.audit_rows``)."""
        await self.gate.authorize(principal, UseCase.AUDIT_READ, org_id)
        return await self.store.audit_rows(org_id, run_id=run_id, gate_only=gate_only)

    def _secret_store(self) -> SecretStore:
        if self.secrets is None:
            raise InvalidRequestError("this runtime has no secret store")
        return self.secrets

    async def list_secrets(
        self, org_id: str, *, principal: Principal | None = None
    ) -> list[SecretInfo]:
        """The organisation's secrets: names, connectors and who set them; never values."""
        await self.gate.authorize(principal, UseCase.SECRETS_LIST, org_id)
        return await self._secret_store().list(org_id)

    async def put_secret(
        self,
        org_id: str,
        name: str,
        value: str,
        *,
        connector: str | None = None,
        principal: Principal | None = None,
    ) -> SecretInfo:
        """Set (or replace) a secret, sealed at rest; ``connector``: only that connector's
        tools may read it. The audit row names it, never its value.

        Raises:
            InvalidRequestError: A bad name, an empty or too long value.
            NotFoundError: ``connector`` is not registered.
        """
        args = {"name": name, "connector": connector}
        caller = await self.gate.authorize(principal, UseCase.SECRETS_PUT, org_id, args=args)
        if connector is not None:
            await self._connector_tools(org_id, connector)
        await self.store.ensure_org(org_id)
        info = await self._secret_store().put(
            org_id, name, value, connector=connector, by=caller.id
        )
        await self.gate.audited(caller, UseCase.SECRETS_PUT, org_id, args=args)
        return info

    async def delete_secret(
        self, org_id: str, name: str, *, principal: Principal | None = None
    ) -> None:
        args = {"name": name}
        caller = await self.gate.authorize(principal, UseCase.SECRETS_DELETE, org_id, args=args)
        await self._secret_store().delete(org_id, name)
        await self.gate.audited(caller, UseCase.SECRETS_DELETE, org_id, args=args)

    async def rotate_secret_key(self) -> Rotation:
        """Re-seal every organisation's secrets under the current key (``secret_key``) that
        only an older one (``secret_previous_keys``) opens. An installation's operation, not
        an organisation's: whoever runs it holds the database and the keys (``cortex-ray
        secrets rotate``), like the supervisor's sweeps; no principal, no audit row."""
        return await self._secret_store().rotate()
