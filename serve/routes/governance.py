"""Governance: connectors, connector grants, the audit log, approvals, secrets.

The routes only parse, call ``Runtime.governance`` and render: the core decides and audits."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Path, Query

from cortex_ray.governance import ApprovalStatus, GrantRequest
from serve._deps import NOT_ADMIN, MemberDep, OrgPath, StateDep, org_router
from serve.schemas import ApiError
from serve.schemas.governance import (
    ApprovalBody,
    ApprovalDecision,
    ApprovalList,
    AuditList,
    AuditRow,
    ConnectorBody,
    ConnectorInstall,
    ConnectorList,
    GrantBody,
    GrantCreate,
    GrantList,
    InstanceBody,
    SecretBody,
    SecretList,
    SecretPut,
    vars_of,
)

__all__ = ["governance_router"]

ConnectorName = Annotated[str, Path(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")]
SecretName = Annotated[str, Path(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,99}$")]


def governance_router() -> APIRouter:
    """Connectors, grants, the audit log, approvals, secrets."""
    router = org_router()

    @router.get("/connectors", response_model=ConnectorList, tags=["governance"])
    async def list_connectors(state: StateDep, org: OrgPath, principal: MemberDep) -> ConnectorList:
        """Every registered connector, its tools, and its instance here (health included)."""
        views = await state.runtime.governance.list_connectors(org, principal=principal)
        return ConnectorList(connectors=[ConnectorBody.of(v) for v in views])

    @router.put(
        "/connectors/{name}", response_model=InstanceBody, tags=["governance"], responses=NOT_ADMIN
    )
    async def install_connector(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        name: ConnectorName,
        body: ConnectorInstall,
    ) -> InstanceBody:
        """Install a registered connector here, or change its configuration or enable it
        (admins). Credentials never go in the configuration (422)."""
        instance = await state.runtime.governance.install_connector(
            org, name, config=body.config, enabled=body.enabled, principal=principal
        )
        return InstanceBody.of(instance)

    @router.post(
        "/connectors/{name}/check",
        response_model=InstanceBody,
        tags=["governance"],
        responses=NOT_ADMIN,
    )
    async def check_connector(
        state: StateDep, org: OrgPath, principal: MemberDep, name: ConnectorName
    ) -> InstanceBody:
        """Run the connector's health probe on this organisation's instance (admins)."""
        instance = await state.runtime.governance.check_connector(org, name, principal=principal)
        return InstanceBody.of(instance)

    @router.get("/grants", response_model=GrantList, tags=["governance"], responses=NOT_ADMIN)
    async def list_grants(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        principal_id: Annotated[
            str | None, Query(alias="principalId", min_length=1, max_length=200)
        ] = None,
        include_revoked: Annotated[bool, Query(alias="includeRevoked")] = False,
    ) -> GrantList:
        """The organisation's connector grants (admins), oldest first."""
        grants = await state.runtime.governance.list_grants(
            org, principal_id=principal_id, include_revoked=include_revoked, principal=principal
        )
        return GrantList(grants=[GrantBody.of(g) for g in grants])

    @router.post(
        "/grants",
        response_model=GrantBody,
        status_code=201,
        tags=["governance"],
        responses=NOT_ADMIN,
    )
    async def create_grant(
        state: StateDep, org: OrgPath, principal: MemberDep, body: GrantCreate
    ) -> GrantBody:
        """Grant a principal (or `*`) calls of a connector's tools (admins); the gate
        checks it before every call of those tools."""
        request = GrantRequest(
            principal_id=body.principal_id,
            connector=body.connector,
            tools=tuple(body.tools),
            max_tier=body.max_tier,
            constraints=body.constraints,
            approval=body.approval,
            expires_at=body.expires_at,
        )
        grant = await state.runtime.governance.create_grant(org, request, principal=principal)
        return GrantBody.of(grant)

    @router.delete(
        "/grants/{grant_id}", response_model=GrantBody, tags=["governance"], responses=NOT_ADMIN
    )
    async def revoke_grant(
        state: StateDep, org: OrgPath, principal: MemberDep, grant_id: UUID
    ) -> GrantBody:
        """Revoke a grant (admins); it stops allowing calls at once and keeps its row."""
        grant = await state.runtime.governance.revoke_grant(org, grant_id, principal=principal)
        return GrantBody.of(grant)

    @router.get("/audit", response_model=AuditList, tags=["governance"], responses=NOT_ADMIN)
    async def read_audit(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        run_id: Annotated[UUID | None, Query(alias="runId")] = None,
        gate_only: Annotated[bool, Query(alias="gateOnly")] = False,
    ) -> AuditList:
        """The organisation's audit log, oldest first (admins): every gate decision with
        its tier, hashes, source ids and grants; with ``gateOnly`` no use-case rows."""
        rows = await state.runtime.governance.audit(
            org, run_id=run_id, gate_only=gate_only, principal=principal
        )
        return AuditList(entries=[AuditRow.of(r) for r in rows])

    @router.get("/approvals", response_model=ApprovalList, tags=["approvals"])
    async def list_approvals(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        status: ApprovalStatus | None = None,
        run_id: Annotated[UUID | None, Query(alias="runId")] = None,
    ) -> ApprovalList:
        """Approval requests of paused runs and waiting interactive turns, oldest first
        (``status=PENDING``: waiting)."""
        found = await state.runtime.governance.list_approvals(
            org, status=status, run_id=run_id, principal=principal
        )
        return ApprovalList(approvals=[ApprovalBody.of(a) for a in found])

    @router.get("/approvals/{approval_id}", response_model=ApprovalBody, tags=["approvals"])
    async def get_approval(
        state: StateDep, org: OrgPath, principal: MemberDep, approval_id: UUID
    ) -> ApprovalBody:
        """One approval request: the call, the decision that chose it, the evidence."""
        found = await state.runtime.governance.get_approval(org, approval_id, principal=principal)
        return ApprovalBody.of(found)

    @router.post(
        "/approvals/{approval_id}/decision",
        response_model=ApprovalBody,
        tags=["approvals"],
        responses={
            403: {"model": ApiError, "description": "not an admin person who may decide it"},
            409: {"model": ApiError, "description": "already decided, or expired"},
        },
    )
    async def decide_approval(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        approval_id: UUID,
        body: ApprovalDecision,
    ) -> ApprovalBody:
        """Approve or reject a pending request (an admin person); the run (or the
        interactive turn waiting for it) continues at once: approved, from that very
        call (its policy checked again); rejected, the agent observes the rejection and
        decides its next step."""
        decided = await state.runtime.governance.decide_approval(
            org, approval_id, approve=body.approve, note=body.note, principal=principal
        )
        if decided.run_id is not None:  # a turn's request: the waiting turn goes on itself
            await state.executor.start_run(org, decided.run_id)
        return ApprovalBody.of(decided)

    @router.get("/secrets", response_model=SecretList, tags=["governance"], responses=NOT_ADMIN)
    async def list_secrets(state: StateDep, org: OrgPath, principal: MemberDep) -> SecretList:
        """The organisation's secrets (admins): names and who set them, never values."""
        found = await state.runtime.governance.list_secrets(org, principal=principal)
        return SecretList(secrets=[SecretBody.model_validate(vars_of(i)) for i in found])

    @router.put(
        "/secrets/{name}", response_model=SecretBody, tags=["governance"], responses=NOT_ADMIN
    )
    async def put_secret(
        state: StateDep, org: OrgPath, principal: MemberDep, name: SecretName, body: SecretPut
    ) -> SecretBody:
        """Set or replace a secret (admins); sealed at rest, its value never comes back."""
        info = await state.runtime.governance.put_secret(
            org, name, body.value, connector=body.connector, principal=principal
        )
        return SecretBody.model_validate(vars_of(info))

    @router.delete("/secrets/{name}", status_code=204, tags=["governance"], responses=NOT_ADMIN)
    async def delete_secret(
        state: StateDep, org: OrgPath, principal: MemberDep, name: SecretName
    ) -> None:
        """Delete a secret (admins)."""
        await state.runtime.governance.delete_secret(org, name, principal=principal)

    return router
