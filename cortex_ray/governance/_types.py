"""The governance vocabulary: connectors (definitions in code, instances per organisation),
grants per principal, and the gate's verdict on a connector call."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal
from uuid import UUID, uuid4

from pydantic import BaseModel, ConfigDict, Field

from cortex_ray._types import CapabilityTier, utcnow

__all__ = [
    "Approval",
    "ApprovalPolicy",
    "ApprovalStatus",
    "Connector",
    "ConnectorGrant",
    "ConnectorInstance",
    "ConnectorView",
    "GrantRequest",
    "HealthProbe",
    "ReportedCall",
    "RunLabel",
    "RunLabelRecord",
    "RunReport",
    "ShadowAcceptance",
    "Verdict",
]

HealthProbe = Callable[[Mapping[str, Any]], Awaitable[str | None]]
"""Checks a connector instance with its configuration: ``None`` when healthy, else why not."""

TIER_RANK = {CapabilityTier.READ: 0, CapabilityTier.WRITE: 1, CapabilityTier.ADMIN: 2}


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ApprovalPolicy(StrEnum):
    """When a call a grant allows still needs a person's approval."""

    NEVER = "never"
    WRITES = "writes"
    """Calls of a WRITE or ADMIN tool need approval; READ calls run."""
    ALWAYS = "always"


APPROVAL_RANK = {ApprovalPolicy.NEVER: 0, ApprovalPolicy.WRITES: 1, ApprovalPolicy.ALWAYS: 2}


@dataclass(frozen=True, slots=True)
class Connector:
    """A connector definition: a system the agent reaches through some tools.

    Attributes:
        name: The connector's name (an identifier); a tool belongs to it with
            ``Tool(connector=name)``.
        description: What it connects to.
        sensitive_fields: Result fields (keys, at any depth, compared without case) that are
            redacted from every result of its tools before the audit, the step log or a
            model sees them. An instance's ``config["redact_fields"]`` adds to them.
        health: An optional probe of an instance (see ``HealthProbe``).
    """

    name: str
    description: str = ""
    sensitive_fields: tuple[str, ...] = ()
    health: HealthProbe | None = field(default=None, compare=False)


class ConnectorInstance(_Model):
    """A connector installed in one organisation, with its (non-secret) configuration."""

    org_id: str
    connector: str
    config: dict[str, Any] = Field(default_factory=dict)
    enabled: bool = True
    health: str = "unknown"
    health_checked_at: datetime | None = None
    created_at: datetime = Field(default_factory=utcnow)


@dataclass(frozen=True, slots=True)
class ConnectorView:
    """A registered connector, its tools here, and its instance in the organisation (if
    installed)."""

    connector: Connector
    tools: tuple[str, ...]
    instance: ConnectorInstance | None


class GrantRequest(_Model):
    """What a new grant says (the caller's input).

    Attributes:
        principal_id: Whom it grants to: a user's or an agent's principal id
            (``agent:<uuid>``), or ``"*"`` for every principal of the organisation.
        connector: The connector (installed in the organisation).
        tools: The connector's tools it covers; empty covers them all.
        max_tier: The highest tier it allows.
        constraints: Per argument, a JSON-schema subset the value must satisfy (``enum``
            for an allow-list, ``const``, ``type``, ``pattern``, ``minLength``,
            ``maxLength``, ``minimum``, ``maximum``, ``maxItems``, ``items``); a
            constrained argument must be present.
        approval: When an allowed call still needs a person's approval.
        expires_at: After this the grant allows nothing.
    """

    principal_id: str = Field(min_length=1, max_length=200)
    connector: str = Field(min_length=1, max_length=100)
    tools: tuple[str, ...] = ()
    max_tier: CapabilityTier = CapabilityTier.READ
    constraints: dict[str, dict[str, Any]] = Field(default_factory=dict)
    approval: ApprovalPolicy = ApprovalPolicy.NEVER
    expires_at: datetime | None = None


class ConnectorGrant(_Model):
    """A grant as stored (see ``GrantRequest`` for the fields it shares)."""

    id: UUID = Field(default_factory=uuid4)
    org_id: str
    principal_id: str
    connector: str
    tools: tuple[str, ...] = ()
    max_tier: CapabilityTier = CapabilityTier.READ
    constraints: dict[str, dict[str, Any]] = Field(default_factory=dict)
    approval: ApprovalPolicy = ApprovalPolicy.NEVER
    expires_at: datetime | None = None
    created_by: str = ""
    created_at: datetime = Field(default_factory=utcnow)
    revoked_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    """The connector policy's answer for one call."""

    decision: Literal["allow", "deny", "approval"]
    reason: str
    grant_ids: tuple[UUID, ...] = ()
    sensitive_fields: frozenset[str] = frozenset()


class RunLabel(StrEnum):
    """A person's verdict on a shadow run's proposals."""

    ACCEPTED = "accepted"
    REJECTED = "rejected"
    MIXED = "mixed"


class RunLabelRecord(_Model):
    run_id: UUID
    label: RunLabel
    note: str = ""
    labelled_by: str
    labelled_at: datetime


class ReportedCall(_Model):
    """One gate call of a run as its report lists it (from the audit log)."""

    step_index: int | None
    tool: str
    tier: str | None
    decision: str
    args: dict[str, Any]
    reason: str | None = None


class RunReport(_Model):
    """What a run did, and in a dry or shadow run what it would have done.

    ``executed``: calls that ran; ``simulated``: a dry run's WRITE/ADMIN calls; ``proposed``:
    a shadow run's; ``refused``: calls the gate refused or denied (approvals included)."""

    run_id: UUID
    run_mode: str
    status: str
    executed: tuple[ReportedCall, ...] = ()
    simulated: tuple[ReportedCall, ...] = ()
    proposed: tuple[ReportedCall, ...] = ()
    refused: tuple[ReportedCall, ...] = ()
    failed: tuple[ReportedCall, ...] = ()
    label: RunLabelRecord | None = None


class ShadowAcceptance(_Model):
    """One agent's shadow runs and how people labelled them. ``acceptance_rate`` is
    accepted / labelled (mixed counts as not accepted); ``None`` with nothing labelled."""

    agent_id: UUID
    agent_name: str
    runs: int
    labelled: int
    accepted: int
    rejected: int
    mixed: int
    proposals: int
    acceptance_rate: float | None


class ApprovalStatus(StrEnum):
    PENDING = "PENDING"
    APPROVED = "APPROVED"
    REJECTED = "REJECTED"
    EXPIRED = "EXPIRED"
    """Not decided in time: counts as a rejection."""
    CANCELLED = "CANCELLED"
    """Its run was cancelled while it waited: never decided."""


class Approval(_Model):
    """An approval request: a row, never a waiting thread. The run that made it is
    AWAITING_APPROVAL until a person decides it (or it expires); then the run continues
    from this very call, without deciding the step again. An interactive turn's request
    (``session_id``, ``turn_id``; ``step_index`` is the tool round, no ``run_id``) is waited
    for by the turn, which then continues the same way.

    Attributes:
        decision: The step's decision as DECIDE made it (candidates, scores, selection).
        evidence: What the run had observed before (the latest calls: tool, arguments,
            status, summary).
        approvers: Who may decide (principal ids); empty: any admin person.
    """

    id: UUID = Field(default_factory=uuid4)
    org_id: str
    run_id: UUID | None = None
    session_id: UUID | None = None
    turn_id: UUID | None = None
    step_index: int
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    tier: str
    decision: dict[str, Any] = Field(default_factory=dict)
    evidence: list[dict[str, Any]] = Field(default_factory=list)
    reason: str = ""
    requested_by: str
    approvers: tuple[str, ...] = ()
    status: ApprovalStatus = ApprovalStatus.PENDING
    expires_at: datetime
    decided_by: str | None = None
    decided_at: datetime | None = None
    note: str = ""
    created_at: datetime = Field(default_factory=utcnow)
    payloads: tuple[str, ...] = ()
    """The sha256 of the fields (``args``, ``decision``, ``evidence``) stored as payloads,
    larger than ``payload_inline_bytes``: the row references them; read here, the fields
    hold their values."""
