"""Routes of the workflow use cases (issue 18, point 5): definitions, immutable versions,
runs and their ledgers, acceptance per workflow, stored payloads.

They only parse, call ``Runtime.workflows`` and render: the core decides and audits."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Depends, Path, Query, Response
from pydantic import Field

from cortex_ray import CapabilityTier, RunMode, RunStatus
from cortex_ray.governance import (
    RiskLevel,
    RunLedger,
    Workflow,
    WorkflowVersion,
    WorkflowVersionSpec,
)
from serve._app import _ERRORS, MemberDep, OrgPath, StateDep, _member
from serve._schemas import ApiError, JsonObject, _Body, _Out

__all__ = ["workflows_router"]

WorkflowName = Annotated[str, Path(pattern=r"^[a-z0-9][a-z0-9_.-]{0,99}$")]
LEDGER_PAGE_DEFAULT = 200
LEDGER_PAGE_MAX = 1000
ToolName = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[^\x00]+$")]
_ADMIN: dict[int | str, dict[str, Any]] = {403: {"model": ApiError, "description": "not an admin"}}


class WorkflowCreate(_Body):
    name: str = Field(
        min_length=1,
        max_length=100,
        pattern=r"^[a-z0-9][a-z0-9_.-]{0,99}$",
        description="unique in the organisation",
    )
    description: str = Field(default="", max_length=2000, pattern=r"^[^\x00]*$")


class EvidenceBody(_Body):
    min_sources: int = Field(default=0, ge=0, le=1000, description="distinct cited source ids")
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
    version: int | None = Field(default=None, ge=1, description="default: the latest")
    run_mode: RunMode | None = Field(
        default=None, description="default: the version's; only a safer one may be asked"
    )
    max_steps: int | None = Field(default=None, ge=1)
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


def workflows_router() -> APIRouter:
    router = APIRouter(
        prefix="/api/orgs/{org}", dependencies=[Depends(_member)], responses=dict(_ERRORS)
    )

    @router.get("/workflows", response_model=WorkflowList, tags=["workflows"])
    async def list_workflows(state: StateDep, org: OrgPath, principal: MemberDep) -> WorkflowList:
        """The organisation's workflows, by name, with their latest version."""
        found = await state.runtime.workflows.list_workflows(org, principal=principal)
        return WorkflowList(workflows=[WorkflowBody.of(w) for w in found])

    @router.post(
        "/workflows",
        response_model=WorkflowBody,
        status_code=201,
        tags=["workflows"],
        responses={**_ADMIN, 409: {"model": ApiError, "description": "the name is taken"}},
    )
    async def create_workflow(
        state: StateDep, org: OrgPath, principal: MemberDep, body: WorkflowCreate
    ) -> WorkflowBody:
        """Define a workflow (admins); publish a version to run it."""
        made = await state.runtime.workflows.create(
            org, body.name, description=body.description, principal=principal
        )
        return WorkflowBody.of(made)

    @router.get("/workflows/{workflow}", response_model=WorkflowDetail, tags=["workflows"])
    async def get_workflow(
        state: StateDep, org: OrgPath, principal: MemberDep, workflow: WorkflowName
    ) -> WorkflowDetail:
        """A workflow and every version, oldest first."""
        found, versions = await state.runtime.workflows.get(org, workflow, principal=principal)
        return WorkflowDetail(
            **WorkflowBody.of(found).model_dump(), versions=[VersionBody.of(v) for v in versions]
        )

    @router.post(
        "/workflows/{workflow}/versions",
        response_model=VersionBody,
        status_code=201,
        tags=["workflows"],
        responses={**_ADMIN, 409: {"model": ApiError, "description": "published meanwhile"}},
    )
    async def publish_version(
        state: StateDep, org: OrgPath, principal: MemberDep, workflow: WorkflowName,
        body: VersionCreate,
    ) -> VersionBody:  # fmt: skip
        """Publish the next version (admins): immutable from now on. The input schema must
        be a JSON schema of an object; tools and connectors must be registered."""
        made, _ = await state.runtime.workflows.publish(
            org, workflow, body.spec(), principal=principal
        )
        return VersionBody.of(made)

    @router.put(
        "/workflows/{workflow}/versions/{version}",
        response_model=VersionBody,
        tags=["workflows"],
        responses={
            **_ADMIN,
            201: {"model": VersionBody, "description": "published now"},
            409: {"model": ApiError, "description": "published with another spec: immutable"},
        },
    )
    async def put_version(
        state: StateDep, org: OrgPath, principal: MemberDep, workflow: WorkflowName,
        version: Annotated[int, Path(ge=1, le=1_000_000)], body: VersionCreate,
        response: Response,
    ) -> VersionBody:  # fmt: skip
        """Publish exactly this version (admins): 201 when made now, 200 when it exists with
        this very spec, 409 when it exists with another (a version is never edited)."""
        made, fresh = await state.runtime.workflows.publish(
            org, workflow, body.spec(), version=version, principal=principal
        )
        response.status_code = 201 if fresh else 200
        return VersionBody.of(made)

    @router.post(
        "/workflows/{workflow}/runs",
        response_model=WorkflowRunAccepted,
        status_code=202,
        tags=["workflows"],
    )
    async def start_workflow_run(
        state: StateDep, org: OrgPath, principal: MemberDep, workflow: WorkflowName,
        body: WorkflowRunCreate, response: Response,
    ) -> WorkflowRunAccepted:  # fmt: skip
        """Start a run of the workflow's latest (or a pinned) version by an AUTONOMOUS agent:
        inputs checked against the version's schema (422 names the failing path), the mode
        the version's or a safer one. Poll the returned location for its ledger."""
        run = await state.runtime.workflows.start_run(
            org,
            workflow,
            body.agent_id,
            body.inputs,
            version=body.version,
            run_mode=body.run_mode,
            max_steps=body.max_steps,
            run_name=body.name,
            caller_id=body.caller_user_id or principal.id,
            principal=principal,
        )
        await state.executor.start_run(org, run.id)
        location = f"/api/orgs/{org}/workflows/{workflow}/runs/{run.id}"
        response.headers["Location"] = location
        assert run.workflow_version_id is not None
        return WorkflowRunAccepted(
            id=run.id,
            status=run.status,
            agent_id=run.agent_id,
            workflow_version_id=run.workflow_version_id,
            run_mode=run.run_mode,
            location=location,
        )

    @router.get("/workflows/{workflow}/runs", response_model=WorkflowRunList, tags=["workflows"])
    async def list_workflow_runs(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        workflow: WorkflowName,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
    ) -> WorkflowRunList:
        """The workflow's runs, newest first."""
        rows = await state.runtime.workflows.runs(org, workflow, limit=limit, principal=principal)
        return WorkflowRunList(runs=[WorkflowRunSummary.model_validate(r) for r in rows])

    @router.get(
        "/workflows/{workflow}/runs/{run_id}", response_model=LedgerBody, tags=["workflows"]
    )
    async def workflow_run_ledger(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        workflow: WorkflowName,
        run_id: UUID,
        payloads: bool = False,
        limit: Annotated[
            int, Query(ge=1, le=LEDGER_PAGE_MAX, description="events in this page, at most")
        ] = LEDGER_PAGE_DEFAULT,
        after: Annotated[
            str | None,
            Query(
                max_length=60,
                description="the cursor of the page to read: the previous page's `nextAfter`",
            ),
        ] = None,
    ) -> LedgerBody:
        """The run's ledger: version, principal, mode, inputs, evidence, and one ordered
        timeline of proposals, gate decisions, approvals, the end and the label, a page of
        events at a time (``limit``, then ``after=nextAfter`` until ``nextAfter`` is null).
        Large arguments and results are referenced by sha256 (``payloads=true``: each one
        the page references, once)."""
        ledger = await state.runtime.workflows.ledger(
            org,
            run_id,
            workflow=workflow,
            payloads=payloads,
            limit=limit,
            after=after,
            principal=principal,
        )
        return LedgerBody.of(ledger)

    @router.get(
        "/shadow/acceptance/workflows", response_model=WorkflowAcceptanceList, tags=["workflows"]
    )
    async def workflow_acceptance(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        workflow: Annotated[str | None, Query(pattern=r"^[a-z0-9][a-z0-9_.-]{0,99}$")] = None,
    ) -> WorkflowAcceptanceList:
        """Per workflow version: shadow runs, their labels, proposals, acceptance rate."""
        rows = await state.runtime.workflows.acceptance(org, name=workflow, principal=principal)
        return WorkflowAcceptanceList(
            workflows=[WorkflowAcceptanceBody.model_validate(r.model_dump()) for r in rows]
        )

    @router.get("/payloads/{sha256}", response_model=PayloadBody, tags=["workflows"])
    async def get_payload(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        sha256: Annotated[str, Path(max_length=64)],
    ) -> PayloadBody:
        """A stored payload (a run's large argument or result) by its sha256."""
        value = await state.runtime.workflows.payload(org, sha256, principal=principal)
        return PayloadBody(sha256=sha256, value=value)

    return router
