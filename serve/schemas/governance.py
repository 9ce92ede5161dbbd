"""Governance: connectors, connector grants, the audit log, approvals, secrets."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from pydantic import AfterValidator, Field

from cortex_ray import CapabilityTier
from cortex_ray.governance import (
    Approval,
    ApprovalPolicy,
    ApprovalStatus,
    ConnectorGrant,
    ConnectorInstance,
    ConnectorView,
)
from serve.schemas._common import JsonObject, _Body, _clean, _Out


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
    tools: list[Annotated[str, Field(min_length=1, max_length=100), AfterValidator(_clean)]] = (
        Field(default_factory=list, max_length=200, description="empty: all the connector's tools")
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
    value: Annotated[str, AfterValidator(_clean)] = Field(
        min_length=1, max_length=16_384, description="never returned; no NUL"
    )
    connector: str | None = Field(
        default=None,
        max_length=100,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="only this connector's tools may read it",
    )


def vars_of(info: Any) -> dict[str, Any]:
    """A slotted dataclass's fields as a dict."""
    return {name: getattr(info, name) for name in info.__slots__}
