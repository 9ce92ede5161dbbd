"""Task runs: start, list, read (with a long poll), diagnostics, trace, cancel; a run's
report, a person's label, shadow-run acceptance."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Annotated, Protocol, runtime_checkable
from uuid import UUID

from fastapi import APIRouter, Query, Response

from cortex_ray import Executor, InProcessExecutor, Principal, RunStatus, TaskRun
from serve._deps import MAX_WAIT_S, ApiState, MemberDep, OrgPath, StateDep, org_router, retrieve
from serve._errors import ApiProblem
from serve.schemas import ApiError, DiagnosticsBody, TaskTrace
from serve.schemas.runs import (
    AcceptanceBody,
    LabelBody,
    LabelCreate,
    ReportBody,
    ShadowAcceptanceList,
    TaskAccepted,
    TaskBody,
    TaskCancel,
    TaskCreate,
    TaskList,
    TaskSummary,
    from_run,
)

__all__ = ["runs_router"]


@runtime_checkable
class _RunWaiter(Protocol):
    """Executors that can wait for a run to end (``actors.SessionManager``); not part of
    the ``Executor`` protocol (yet)."""

    async def wait_run(self, org_id: str, run_id: UUID) -> object: ...


def _waiter(executor: Executor, org: str, run_id: UUID) -> Awaitable[object] | None:
    """Something to await until the run ends, if the executor offers it."""
    if isinstance(executor, _RunWaiter):
        return executor.wait_run(org, run_id)
    if isinstance(executor, InProcessExecutor):
        return executor.wait(run_id)
    return None


async def _wait_terminal(
    state: ApiState, org: str, principal: Principal, run: TaskRun, wait_s: float
) -> TaskRun:
    """Wait up to ``wait_s`` for a RUNNING run to end (long poll)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    waiter = _waiter(state.executor, org, run.id)
    if waiter is not None:
        # Shielded: a timeout here must never cancel the run itself.
        waiting = asyncio.ensure_future(waiter)
        waiting.add_done_callback(retrieve)
        try:
            async with asyncio.timeout(wait_s):
                await asyncio.shield(waiting)
        except TimeoutError:
            pass
        run = await state.runtime.get_run(org, run.id, principal=principal)
    delay = 0.01
    status = run.status
    # Driven elsewhere (another replica, a session actor): poll the status (one row) with
    # back-off, and read the ledger once at the end.
    while status is RunStatus.RUNNING and (left := deadline - loop.time()) > 0:
        await asyncio.sleep(min(delay, left))
        delay = min(delay * 2, 0.25)
        status = await state.runtime.run_status(org, run.id, principal=principal)
    if status is run.status:
        return run
    return await state.runtime.get_run(org, run.id, principal=principal)


def runs_router() -> APIRouter:
    """Task runs, their reports and labels."""
    router = org_router()

    @router.post("/tasks", response_model=TaskAccepted, status_code=202, tags=["tasks"])
    async def create_task(
        state: StateDep, org: OrgPath, principal: MemberDep, body: TaskCreate, response: Response
    ) -> TaskAccepted:
        """Start an autonomous run of an AUTONOMOUS agent; poll the returned location.

        The objective is the payload's first non-empty goal, objective, instructions or
        description; ``contactContext`` is kept with the run and shown to the agent with it.
        The run acts for ``callerUserId`` (default: the caller); ``requestedBy`` records the
        calling principal."""
        payload = body.payload
        goal = payload.objective_text()
        if goal is None:
            raise ApiProblem(
                422, "payload needs a non-empty goal, objective, instructions or description"
            )
        run = await state.runtime.start_run(
            org,
            body.agent_id,
            goal,
            max_steps=payload.max_steps,
            name=body.name,
            caller_id=payload.caller_user_id or principal.id,
            contact_context=payload.contact_context,
            principal=principal,
            run_mode=body.run_mode,
        )
        await state.executor.start_run(org, run.id)
        location = f"/api/orgs/{org}/tasks/{run.id}"
        response.headers["Location"] = location
        return TaskAccepted(
            id=run.id,
            status=run.status,
            agent_id=run.agent_id,
            max_steps=run.max_steps,
            location=location,
        )

    @router.get("/tasks", response_model=TaskList, tags=["tasks"])
    async def list_tasks(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        agent_id: Annotated[str | None, Query(alias="agentId", pattern=r"^[^\x00]{1,200}$")] = None,
        limit: Annotated[int, Query(ge=1, le=200)] = 50,
    ) -> TaskList:
        """Recent task runs, newest first (without their step logs)."""
        runs = await state.runtime.list_runs(
            org, agent_ref=agent_id, limit=limit, principal=principal
        )
        return TaskList(tasks=[from_run(r, with_steps=False) for r in runs])

    @router.get("/tasks/{task_id}", response_model=TaskBody, tags=["tasks"])
    async def get_task(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        task_id: UUID,
        wait: Annotated[
            float,
            Query(
                ge=0,
                le=MAX_WAIT_S,
                description="seconds to wait for a RUNNING run to end before answering",
            ),
        ] = 0,
    ) -> TaskSummary:
        """A task run: status (RUNNING, AWAITING_APPROVAL, COMPLETED, FAILED, CANCELLED), its
        step log and its result."""
        run = await state.runtime.get_run(org, task_id, principal=principal)
        if run.status is RunStatus.RUNNING and wait > 0:
            run = await _wait_terminal(state, org, principal, run, wait)
        return from_run(run)

    @router.get("/tasks/{task_id}/diagnostics", response_model=DiagnosticsBody, tags=["tasks"])
    async def get_task_diagnostics(
        state: StateDep, org: OrgPath, principal: MemberDep, task_id: UUID
    ) -> DiagnosticsBody:
        """A task run's diagnostic timeline over its attempts: model calls, decisions with
        their candidates and scores, tool calls with input and result (scrubbed), retrieval
        evidence, stalls, loops, the end, and what the run cost."""
        found = await state.runtime.run_diagnostics(org, task_id, principal=principal)
        return DiagnosticsBody.of(found)

    @router.get("/tasks/{task_id}/trace", response_model=TaskTrace, tags=["tasks"])
    async def get_task_trace(
        state: StateDep, org: OrgPath, principal: MemberDep, task_id: UUID
    ) -> TaskTrace:
        """A task run's trace: one span tree per attempt (``invoke_agent`` → steps →
        perceive / decide / ``execute_tool`` / learn, model and retrieval calls beneath),
        from the spans this deployment keeps locally (docs/operations.md, "Traces")."""
        return TaskTrace.of(await state.runtime.run_trace(org, task_id, principal=principal))

    @router.post(
        "/tasks/{task_id}/cancel",
        response_model=TaskBody,
        tags=["tasks"],
        responses={403: {"model": ApiError, "description": "not the run's caller nor an admin"}},
    )
    async def cancel_task(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        task_id: UUID,
        body: TaskCancel | None = None,
    ) -> TaskSummary:
        """Cancel a RUNNING run (the person it acts for, or an admin): it ends CANCELLED with
        the reason "cancelled by <principal>"; its driver stops at its next step. A run that
        already ended is returned as it is, at once: cancelling twice changes nothing."""
        run = await state.runtime.cancel_run(
            org, task_id, principal=principal, reason=None if body is None else body.reason
        )
        return from_run(run)

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

    return router
