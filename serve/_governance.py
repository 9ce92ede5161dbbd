"""Routes of the governance use cases (issue 18): connectors, grants, the audit log.

They only parse, call ``Runtime.governance`` and render: the core decides and audits."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Depends, Path, Query
from pydantic import Field, model_validator

from cortex_ray import CapabilityTier, RunMode
from cortex_ray.governance import (
    Approval,
    ApprovalPolicy,
    ApprovalStatus,
    ConnectorGrant,
    ConnectorInstance,
    ConnectorView,
    GrantRequest,
    RunLabel,
    RunReport,
)
from serve._app import _ERRORS, MemberDep, OrgPath, StateDep, _member
from serve._schemas import ApiError, JsonObject, _Body, _Out

__all__ = ["governance_router"]

ConnectorName = Annotated[str, Path(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")]
_ADMIN: dict[int | str, dict[str, Any]] = {403: {"model": ApiError, "description": "not an admin"}}


class ConnectorBody(_Out):
    name: str
    description: str
    tools: list[str]
    sensitive_fields: list[str]
    installed: bool
    enabled: bool
    config: dict[str, Any]
    health: str
    health_checked_at: datetime | None

    @classmethod
    def of(cls, view: ConnectorView) -> ConnectorBody:
        i = view.instance
        return cls(
            name=view.connector.name,
            description=view.connector.description,
            tools=list(view.tools),
            sensitive_fields=list(view.connector.sensitive_fields),
            installed=i is not None,
            enabled=i is not None and i.enabled,
            config={} if i is None else i.config,
            health="not installed" if i is None else i.health,
            health_checked_at=None if i is None else i.health_checked_at,
        )


class ConnectorList(_Out):
    connectors: list[ConnectorBody]


class InstanceBody(_Out):
    connector: str
    config: dict[str, Any]
    enabled: bool
    health: str
    health_checked_at: datetime | None
    created_at: datetime

    @classmethod
    def of(cls, i: ConnectorInstance) -> InstanceBody:
        return cls(
            connector=i.connector,
            config=i.config,
            enabled=i.enabled,
            health=i.health,
            health_checked_at=i.health_checked_at,
            created_at=i.created_at,
        )


class ConnectorInstall(_Body):
    config: JsonObject = Field(
        default_factory=dict,
        description="non-secret settings; `redact_fields` adds result fields to redact",
    )
    enabled: bool = True


class GrantCreate(_Body):
    principal_id: str = Field(
        min_length=1,
        max_length=200,
        pattern=r"^[^\x00]+$",
        description="a user's or agent's principal id (`agent:<uuid>`), or `*` for everyone",
    )
    connector: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    tools: list[Annotated[str, Field(min_length=1, max_length=100)]] = Field(
        default_factory=list, max_length=200, description="empty: all the connector's tools"
    )
    max_tier: CapabilityTier = CapabilityTier.READ
    constraints: dict[str, JsonObject] = Field(
        default_factory=dict,
        description="per argument, a JSON-schema subset (enum, const, type, pattern, "
        "minLength, maxLength, minimum, maximum, maxItems, items)",
    )
    approval: ApprovalPolicy = ApprovalPolicy.NEVER
    expires_at: datetime | None = None


class GrantBody(_Out):
    id: UUID
    principal_id: str
    connector: str
    tools: list[str]
    max_tier: CapabilityTier
    constraints: dict[str, Any]
    approval: ApprovalPolicy
    expires_at: datetime | None
    created_by: str
    created_at: datetime
    revoked_at: datetime | None

    @classmethod
    def of(cls, g: ConnectorGrant) -> GrantBody:
        return cls(
            id=g.id,
            principal_id=g.principal_id,
            connector=g.connector,
            tools=list(g.tools),
            max_tier=g.max_tier,
            constraints=g.constraints,
            approval=g.approval,
            expires_at=g.expires_at,
            created_by=g.created_by,
            created_at=g.created_at,
            revoked_at=g.revoked_at,
        )


class GrantList(_Out):
    grants: list[GrantBody]


class AuditRow(_Out):
    id: int
    at: datetime | None = None
    principal_id: str
    agent_id: UUID | None
    mode: str | None
    tool: str
    action_type: str
    tier: str | None
    status: str
    decision: str | None
    reason: str | None
    args: dict[str, Any]
    input_sha256: str | None
    result_sha256: str | None
    source_ids: list[str] | None
    connector: str | None
    grant_ids: list[UUID] | None
    run_id: UUID | None
    step_index: int | None
    session_id: UUID | None
    workflow_id: UUID | None
    run_mode: str | None
    idempotency_key: str | None

    @classmethod
    def of(cls, row: dict[str, Any]) -> AuditRow:
        fields = set(cls.model_fields)
        data = {k: v for k, v in row.items() if k in fields}
        data["at"] = row.get("at") or row.get("created_at")
        return cls(**data)


class AuditList(_Out):
    entries: list[AuditRow]


class LabelBody(_Out):
    run_id: UUID
    label: RunLabel
    note: str
    labelled_by: str
    labelled_at: datetime


class ReportedCallBody(_Out):
    step_index: int | None
    tool: str
    tier: str | None
    decision: str
    args: dict[str, Any]
    reason: str | None


class ReportBody(_Out):
    run_id: UUID
    run_mode: str
    status: str
    executed: list[ReportedCallBody]
    simulated: list[ReportedCallBody]
    proposed: list[ReportedCallBody]
    refused: list[ReportedCallBody]
    failed: list[ReportedCallBody]
    label: LabelBody | None

    @classmethod
    def of(cls, report: RunReport) -> ReportBody:
        return cls.model_validate(report.model_dump())


class AcceptanceBody(_Out):
    agent_id: UUID
    agent_name: str
    runs: int
    labelled: int
    accepted: int
    rejected: int
    mixed: int
    proposals: int
    acceptance_rate: float | None


class ApprovalBody(_Out):
    id: UUID
    run_id: UUID | None = Field(description="the paused run's; none for an interactive turn's")
    session_id: UUID | None = Field(description="an interactive turn's request: its session")
    turn_id: UUID | None = Field(description="an interactive turn's request: the turn")
    step_index: int = Field(description="the run's step, or the turn's tool round")
    tool: str
    args: dict[str, Any]
    tier: str
    decision: dict[str, Any] = Field(description="the step's decision: candidates, scores")
    evidence: list[dict[str, Any]] = Field(description="the run's latest calls before it")
    reason: str
    requested_by: str
    approvers: list[str] = Field(description="who may decide; empty: any admin person")
    status: ApprovalStatus
    expires_at: datetime
    decided_by: str | None
    decided_at: datetime | None
    note: str
    created_at: datetime
    payloads: list[str] = Field(
        description="the sha256 of the fields stored as payloads (over payload_inline_bytes); "
        "shown here resolved"
    )

    @classmethod
    def of(cls, a: Approval) -> ApprovalBody:
        return cls.model_validate(a.model_dump())


class ApprovalList(_Out):
    approvals: list[ApprovalBody]


class ApprovalDecision(_Body):
    approve: bool
    note: str = Field(default="", max_length=2000, pattern=r"^[^\x00]*$")


class SecretBody(_Out):
    name: str
    connector: str | None
    created_by: str
    created_at: datetime
    updated_at: datetime


class SecretList(_Out):
    secrets: list[SecretBody]


class SecretPut(_Body):
    value: str = Field(min_length=1, max_length=16_384, description="never returned")
    connector: str | None = Field(
        default=None,
        max_length=100,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="only this connector's tools may read it",
    )


SecretName = Annotated[str, Path(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,99}$")]


class ScheduleCreate(_Body):
    agent_id: str = Field(min_length=1, max_length=200, pattern=r"^[^\x00]+$")
    goal: str = Field(
        default="",
        max_length=20_000,
        pattern=r"^[^\x00]*$",
        description="the runs' goal; a workflow schedule has none (its version's instructions)",
    )
    workflow: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9_.-]{0,99}$",
        description="each run is a run of this workflow (instead of a goal)",
    )
    version: int | None = Field(
        default=None, ge=1, description="the workflow's pinned version (default: the latest)"
    )
    inputs: JsonObject | None = Field(
        default=None,
        description="a workflow schedule's inputs, checked against the version's schema now "
        "and at every firing",
    )
    name: str = Field(default="", max_length=200, pattern=r"^[^\x00]*$")
    cron: str | None = Field(default=None, max_length=200, pattern=r"^[^\x00]*$")
    interval_s: int | None = Field(default=None, ge=1, le=366 * 86400)
    run_at: datetime | None = Field(
        default=None, description="a one-off's time, or when an interval starts"
    )
    timezone: str = Field(default="UTC", max_length=100, pattern=r"^[^\x00]+$")
    max_steps: int = Field(default=8, ge=1)
    max_seconds: int | None = Field(
        default=3600,
        ge=1,
        le=7 * 86400,
        description="each run's wall-time cap from when it fires (null: none); past it the "
        "run ends FAILED at its next step",
    )
    run_mode: RunMode | None = Field(
        default=None,
        description="default: execute, or a workflow version's default (only a safer one "
        "may be asked of a workflow)",
    )

    @model_validator(mode="after")
    def _goal_or_workflow(self) -> ScheduleCreate:
        if (self.workflow is None) == (not self.goal.strip()):
            raise ValueError("give a goal or a workflow (with its inputs), one of the two")
        if self.workflow is None and (self.version is not None or self.inputs is not None):
            raise ValueError("version and inputs go with a workflow")
        return self


class ScheduleBody(_Out):
    id: UUID
    agent_id: UUID
    name: str
    goal: str
    workflow: str | None
    workflow_version: int | None
    inputs: dict[str, Any] | None
    cron: str | None
    interval_s: int | None
    timezone: str
    next_run_at: datetime | None
    max_steps: int
    max_seconds: int | None
    run_mode: RunMode | None
    status: str
    created_by: str
    created_at: datetime
    fired: int
    last_run_id: UUID | None
    last_fired_at: datetime | None
    last_error: str | None
    last_error_at: datetime | None


class ScheduleList(_Out):
    schedules: list[ScheduleBody]


def _schedule(s: Any) -> ScheduleBody:
    return ScheduleBody.model_validate(s.model_dump(exclude={"org_id"}))


class LabelCreate(_Body):
    label: RunLabel
    note: str = Field(default="", max_length=2000, pattern=r"^[^\x00]*$")


class ShadowAcceptanceList(_Out):
    agents: list[AcceptanceBody]


def governance_router() -> APIRouter:
    router = APIRouter(
        prefix="/api/orgs/{org}", dependencies=[Depends(_member)], responses=dict(_ERRORS)
    )

    @router.get("/connectors", response_model=ConnectorList, tags=["governance"])
    async def list_connectors(state: StateDep, org: OrgPath, principal: MemberDep) -> ConnectorList:
        """Every registered connector, its tools, and its instance here (health included)."""
        views = await state.runtime.governance.list_connectors(org, principal=principal)
        return ConnectorList(connectors=[ConnectorBody.of(v) for v in views])

    @router.put(
        "/connectors/{name}", response_model=InstanceBody, tags=["governance"], responses=_ADMIN
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
        responses=_ADMIN,
    )
    async def check_connector(
        state: StateDep, org: OrgPath, principal: MemberDep, name: ConnectorName
    ) -> InstanceBody:
        """Run the connector's health probe on this organisation's instance (admins)."""
        instance = await state.runtime.governance.check_connector(org, name, principal=principal)
        return InstanceBody.of(instance)

    @router.get("/grants", response_model=GrantList, tags=["governance"], responses=_ADMIN)
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
        responses=_ADMIN,
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
        "/grants/{grant_id}", response_model=GrantBody, tags=["governance"], responses=_ADMIN
    )
    async def revoke_grant(
        state: StateDep, org: OrgPath, principal: MemberDep, grant_id: UUID
    ) -> GrantBody:
        """Revoke a grant (admins); it stops allowing calls at once and keeps its row."""
        grant = await state.runtime.governance.revoke_grant(org, grant_id, principal=principal)
        return GrantBody.of(grant)

    @router.get("/audit", response_model=AuditList, tags=["governance"], responses=_ADMIN)
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

    @router.get("/tasks/{task_id}/report", response_model=ReportBody, tags=["tasks"])
    async def task_report(
        state: StateDep, org: OrgPath, principal: MemberDep, task_id: UUID
    ) -> ReportBody:
        """What the run did and, in a dry or shadow run, would have done: its executed,
        simulated, proposed and refused calls (from the audit log), and its label."""
        report = await state.runtime.governance.run_report(org, task_id, principal=principal)
        return ReportBody.of(report)

    @router.post(
        "/tasks/{task_id}/label",
        response_model=LabelBody,
        tags=["tasks"],
        responses={409: {"model": ApiError, "description": "the run has not ended"}},
    )
    async def label_task(
        state: StateDep, org: OrgPath, principal: MemberDep, task_id: UUID, body: LabelCreate
    ) -> LabelBody:
        """A person labels an ended shadow run: accepted, rejected or mixed. Labelling
        never executes a proposal."""
        record = await state.runtime.governance.label_run(
            org, task_id, body.label, note=body.note, principal=principal
        )
        return LabelBody.model_validate(record.model_dump())

    @router.get("/shadow/acceptance", response_model=ShadowAcceptanceList, tags=["tasks"])
    async def shadow_acceptance(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        agent_id: Annotated[str | None, Query(alias="agentId", pattern=r"^[^\x00]{1,200}$")] = None,
    ) -> ShadowAcceptanceList:
        """Per agent: shadow runs, how people labelled them, proposals, acceptance rate."""
        rows = await state.runtime.governance.shadow_report(
            org, agent_ref=agent_id, principal=principal
        )
        return ShadowAcceptanceList(
            agents=[AcceptanceBody.model_validate(r.model_dump()) for r in rows]
        )

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

    @router.get("/secrets", response_model=SecretList, tags=["governance"], responses=_ADMIN)
    async def list_secrets(state: StateDep, org: OrgPath, principal: MemberDep) -> SecretList:
        """The organisation's secrets (admins): names and who set them, never values."""
        found = await state.runtime.governance.list_secrets(org, principal=principal)
        return SecretList(secrets=[SecretBody.model_validate(vars_of(i)) for i in found])

    @router.put("/secrets/{name}", response_model=SecretBody, tags=["governance"], responses=_ADMIN)
    async def put_secret(
        state: StateDep, org: OrgPath, principal: MemberDep, name: SecretName, body: SecretPut
    ) -> SecretBody:
        """Set or replace a secret (admins); sealed at rest, its value never comes back."""
        info = await state.runtime.governance.put_secret(
            org, name, body.value, connector=body.connector, principal=principal
        )
        return SecretBody.model_validate(vars_of(info))

    @router.delete("/secrets/{name}", status_code=204, tags=["governance"], responses=_ADMIN)
    async def delete_secret(
        state: StateDep, org: OrgPath, principal: MemberDep, name: SecretName
    ) -> None:
        """Delete a secret (admins)."""
        await state.runtime.governance.delete_secret(org, name, principal=principal)

    @router.get("/schedules", response_model=ScheduleList, tags=["schedules"])
    async def list_schedules(state: StateDep, org: OrgPath, principal: MemberDep) -> ScheduleList:
        """The organisation's schedules, oldest first."""
        found = await state.runtime.governance.list_schedules(org, principal=principal)
        return ScheduleList(schedules=[_schedule(s) for s in found])

    @router.post("/schedules", response_model=ScheduleBody, status_code=201, tags=["schedules"])
    async def create_schedule(
        state: StateDep, org: OrgPath, principal: MemberDep, body: ScheduleCreate
    ) -> ScheduleBody:
        """A recurring (``cron`` in ``timezone``, or every ``intervalS``) or one-off
        (``runAt``) autonomous task, of a ``goal`` or of a ``workflow`` (its ``version``, or
        the latest, with ``inputs``: checked now and at every firing); fired once per due
        time by the API's scheduler."""
        made = await state.runtime.governance.create_schedule(
            org,
            body.agent_id,
            body.goal,
            cron=body.cron,
            interval_s=body.interval_s,
            run_at=body.run_at,
            timezone=body.timezone,
            max_steps=body.max_steps,
            max_seconds=body.max_seconds,
            run_mode=body.run_mode,
            name=body.name,
            workflow=body.workflow,
            workflow_version=body.version,
            inputs=body.inputs,
            max_steps_limit=state.runtime.settings.decide.max_steps_limit,
            principal=principal,
        )
        return _schedule(made)

    @router.post(
        "/schedules/{schedule_id}/{action}",
        response_model=ScheduleBody,
        tags=["schedules"],
        responses={409: {"model": ApiError, "description": "cancelled, done, not suspended"}},
    )
    async def change_schedule(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        schedule_id: UUID,
        action: Annotated[str, Path(pattern=r"^(suspend|resume|cancel)$")],
    ) -> ScheduleBody:
        """Suspend, resume or cancel a schedule (its creator or an admin)."""
        changed = await state.runtime.governance.change_schedule(
            org, schedule_id, action, principal=principal
        )
        return _schedule(changed)

    return router


def vars_of(info: Any) -> dict[str, Any]:
    """A slotted dataclass's fields as a dict."""
    return {name: getattr(info, name) for name in info.__slots__}
