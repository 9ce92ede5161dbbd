"""Workflows (definitions, immutable versions, runs and their ledgers, acceptance per
workflow, stored payloads) and schedules.

The routes only parse, call ``Runtime.workflows`` / ``Runtime.governance`` and render: the
core decides and audits."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Path, Query, Response

from serve._deps import NOT_ADMIN, MemberDep, OrgPath, StateDep, org_router
from serve.schemas import ApiError
from serve.schemas.workflows import (
    LedgerBody,
    PayloadBody,
    ScheduleBody,
    ScheduleCreate,
    ScheduleList,
    VersionBody,
    VersionCreate,
    WorkflowAcceptanceBody,
    WorkflowAcceptanceList,
    WorkflowBody,
    WorkflowCreate,
    WorkflowDetail,
    WorkflowList,
    WorkflowRunAccepted,
    WorkflowRunCreate,
    WorkflowRunList,
    WorkflowRunSummary,
    schedule_body,
)

__all__ = ["workflows_router"]

WorkflowName = Annotated[str, Path(pattern=r"^[a-z0-9][a-z0-9_.-]{0,99}$")]
LEDGER_PAGE_DEFAULT = 200
LEDGER_PAGE_MAX = 1000


def workflows_router() -> APIRouter:
    """Workflows, their runs and ledgers, and schedules."""
    router = org_router()

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
        responses={**NOT_ADMIN, 409: {"model": ApiError, "description": "the name is taken"}},
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
        responses={**NOT_ADMIN, 409: {"model": ApiError, "description": "published meanwhile"}},
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
            **NOT_ADMIN,
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

    @router.get("/schedules", response_model=ScheduleList, tags=["schedules"])
    async def list_schedules(state: StateDep, org: OrgPath, principal: MemberDep) -> ScheduleList:
        """The organisation's schedules, oldest first."""
        found = await state.runtime.governance.list_schedules(org, principal=principal)
        return ScheduleList(schedules=[schedule_body(s) for s in found])

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
        return schedule_body(made)

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
        return schedule_body(changed)

    return router
