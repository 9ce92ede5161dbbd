"""Workflows (definitions, immutable versions, runs and their ledgers, acceptance, stored
payloads) and schedules."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from pydantic import Field, model_validator

from cortex_ray import CapabilityTier, RunMode, RunStatus
from cortex_ray.governance import (
    RiskLevel,
    RunLedger,
    Workflow,
    WorkflowVersion,
    WorkflowVersionSpec,
)
from serve.schemas._common import Int, JsonObject, _Body, _Out

ToolName = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[^\x00]+$")]


class WorkflowCreate(_Body):
    name: str = Field(
        min_length=1,
        max_length=100,
        pattern=r"^[a-z0-9][a-z0-9_.-]{0,99}$",
        description="unique in the organisation",
    )
    description: str = Field(default="", max_length=2000, pattern=r"^[^\x00]*$")


class EvidenceBody(_Body):
    min_sources: Int = Field(default=0, ge=0, le=1000, description="distinct cited source ids")
    sources: list[ToolName] = Field(
        default_factory=list, max_length=100, description="source ids that must be cited"
    )


class VersionCreate(_Body):
    instructions: str = Field(
        min_length=1, max_length=20_000, pattern=r"^[^\x00]+$", description="the run's goal"
    )
    input_schema: JsonObject = Field(
        default_factory=lambda: {"type": "object"},
        description="a JSON schema (2020-12) of an object: a run's inputs must satisfy it",
    )
    tools: list[ToolName] = Field(default_factory=list, max_length=200)
    connectors: list[ToolName] = Field(
        default_factory=list, max_length=100, description="every tool of these is allowed"
    )
    required_evidence: EvidenceBody = Field(default_factory=EvidenceBody)
    risk: RiskLevel = RiskLevel.LOW
    approval_tools: list[ToolName] = Field(default_factory=list, max_length=200)
    approval_tiers: list[CapabilityTier] = Field(default_factory=list, max_length=3)
    default_mode: RunMode = RunMode.EXECUTE

    def spec(self) -> WorkflowVersionSpec:
        return WorkflowVersionSpec.model_validate(self.model_dump())


class EvidenceOut(_Out):
    min_sources: int
    sources: list[str]


class VersionBody(_Out):
    id: UUID
    workflow: str
    workflow_id: UUID
    version: int
    instructions: str
    input_schema: dict[str, Any]
    tools: list[str]
    connectors: list[str]
    required_evidence: EvidenceOut
    risk: RiskLevel
    approval_tools: list[str]
    approval_tiers: list[CapabilityTier]
    default_mode: RunMode
    published_by: str
    published_at: datetime

    @classmethod
    def of(cls, v: WorkflowVersion) -> VersionBody:
        return cls.model_validate(v.model_dump(exclude={"org_id"}))


class WorkflowBody(_Out):
    id: UUID
    name: str
    description: str
    created_by: str
    created_at: datetime
    latest_version: int | None

    @classmethod
    def of(cls, w: Workflow) -> WorkflowBody:
        return cls.model_validate(w.model_dump(exclude={"org_id"}))


class WorkflowList(_Out):
    workflows: list[WorkflowBody]


class WorkflowDetail(WorkflowBody):
    versions: list[VersionBody]


class WorkflowRunCreate(_Body):
    agent_id: str = Field(min_length=1, max_length=200, pattern=r"^[^\x00]+$")
    inputs: JsonObject = Field(default_factory=dict)
    version: Int | None = Field(default=None, ge=1, description="default: the latest")
    run_mode: RunMode | None = Field(
        default=None, description="default: the version's; only a safer one may be asked"
    )
    max_steps: Int | None = Field(default=None, ge=1)
    name: str = Field(default="", max_length=200, pattern=r"^[^\x00]*$")
    caller_user_id: str | None = Field(default=None, max_length=200, pattern=r"^[^\x00]+$")


class WorkflowRunAccepted(_Out):
    id: UUID
    status: RunStatus
    agent_id: UUID
    workflow_version_id: UUID
    run_mode: RunMode
    location: str


class WorkflowRunSummary(_Out):
    id: UUID
    version: int
    agent_id: UUID
    run_mode: RunMode
    status: RunStatus
    requested_by: str | None
    created_at: datetime
    finished_at: datetime | None
    reason: str | None


class WorkflowRunList(_Out):
    runs: list[WorkflowRunSummary]


class EvidenceCheckBody(_Out):
    sources: list[str]
    versions: list[str]
    required: EvidenceOut
    missing: list[str]
    satisfied: bool


class LedgerEventBody(_Out):
    seq: int
    kind: str
    at: datetime | None
    step_index: int | None
    tool: str | None
    outcome: str | None
    summary: str
    data: dict[str, Any]
    payloads: list[str] = Field(description="sha256 of the stored payloads it references")


class LabelOut(_Out):
    label: str
    note: str
    labelled_by: str
    labelled_at: datetime


class LedgerBody(_Out):
    run_id: UUID
    agent_id: UUID
    workflow: str | None
    workflow_id: UUID | None
    version: int | None
    workflow_version_id: UUID | None
    risk: str | None
    requested_by: str | None
    caller_id: str | None
    run_mode: RunMode
    status: str
    reason: str | None
    inputs: dict[str, Any] | None
    evidence: EvidenceCheckBody | None
    label: LabelOut | None
    events: list[LedgerEventBody]
    payloads: dict[str, Any] = Field(
        description="with `payloads=true`: each payload this page's events reference, once, "
        "by sha256"
    )
    next_after: str | None = Field(
        description="the cursor of the next page (`after=`); null: this page is the last"
    )

    @classmethod
    def of(cls, ledger: RunLedger) -> LedgerBody:
        return cls.model_validate(ledger.model_dump(mode="json"))


class WorkflowAcceptanceBody(_Out):
    workflow_id: UUID
    workflow: str
    version: int
    runs: int
    labelled: int
    accepted: int
    rejected: int
    mixed: int
    proposals: int
    acceptance_rate: float | None


class WorkflowAcceptanceList(_Out):
    workflows: list[WorkflowAcceptanceBody]


class PayloadBody(_Out):
    sha256: str
    value: Any


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
    version: Int | None = Field(
        default=None, ge=1, description="the workflow's pinned version (default: the latest)"
    )
    inputs: JsonObject | None = Field(
        default=None,
        description="a workflow schedule's inputs, checked against the version's schema now "
        "and at every firing",
    )
    name: str = Field(default="", max_length=200, pattern=r"^[^\x00]*$")
    cron: str | None = Field(default=None, max_length=200, pattern=r"^[^\x00]*$")
    interval_s: Int | None = Field(default=None, ge=1, le=366 * 86400)
    run_at: datetime | None = Field(
        default=None, description="a one-off's time, or when an interval starts"
    )
    timezone: str = Field(default="UTC", max_length=100, pattern=r"^[^\x00]+$")
    max_steps: Int = Field(default=8, ge=1)
    max_seconds: Int | None = Field(
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


def schedule_body(s: Any) -> ScheduleBody:
    return ScheduleBody.model_validate(s.model_dump(exclude={"org_id"}))
