"""Schedules as use cases: recurring or one-off autonomous tasks (or workflow runs), made,
listed and changed by people, fired by the scheduler (``RunSupervisor``)."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any
from uuid import UUID

from cortex_ray._exceptions import ConflictError, InvalidRequestError, NotFoundError
from cortex_ray._types import AgentMode, Principal, RunMode, utcnow
from cortex_ray.access import UseCase
from cortex_ray.governance import (
    DEFAULT_MAX_SECONDS,
    InputLimits,
    Schedule,
    ScheduleStatus,
    ScheduleStore,
    WorkflowStore,
    validate_schedule,
    workflow_run_of,
)
from cortex_ray.runtime._gate import UseCaseGate
from cortex_ray.storage import Store

__all__ = ["ScheduleUseCases"]


class ScheduleUseCases:
    """Schedules (reached as ``Runtime.governance``). ``schedules_changed`` is set when a
    schedule is made or resumed here: it wakes this process's scheduler."""

    def __init__(
        self,
        gate: UseCaseGate,
        store: Store,
        schedules: ScheduleStore,
        input_limits: InputLimits,
    ) -> None:
        self.gate = gate
        self.store = store
        self.schedules = schedules
        self.input_limits = input_limits
        self.schedules_changed = asyncio.Event()

    async def create_schedule(
        self,
        org_id: str,
        agent_ref: UUID | str,
        goal: str = "",
        *,
        cron: str | None = None,
        interval_s: int | None = None,
        run_at: Any = None,
        timezone: str = "UTC",
        max_steps: int = 8,
        max_seconds: int | None = DEFAULT_MAX_SECONDS,
        run_mode: RunMode | None = None,
        name: str = "",
        workflow: str | None = None,
        workflow_version: int | None = None,
        inputs: dict[str, Any] | None = None,
        max_steps_limit: int = 64,
        principal: Principal | None = None,
    ) -> Schedule:
        """A recurring (``cron`` in ``timezone``, or every ``interval_s`` from ``run_at`` or
        now) or one-off (``run_at``) autonomous task of an AUTONOMOUS agent; each run capped
        at ``max_steps`` and ``max_seconds`` of wall time from when it fires (``None``: no
        time cap). Its runs pursue ``goal`` in ``run_mode`` (default execute), or, with
        ``workflow``, are runs of that workflow's version (``workflow_version``, or the
        latest when each fires) with ``inputs``, in ``run_mode`` or the version's default:
        the inputs and the mode are checked now against the version they would run, and
        again at every firing.

        Raises:
            NotFoundError: No such agent here; no such workflow or version.
            InvalidRequestError: See ``validate_schedule``; a step budget out of range; an
                agent that is not AUTONOMOUS; inputs the version's schema refuses, or a mode
                less safe than its default.
        """
        args: dict[str, Any] = {"agent": str(agent_ref), "cron": cron, "interval_s": interval_s}
        if workflow is not None:
            args["workflow"] = workflow
            args["version"] = workflow_version
        caller = await self.gate.authorize(principal, UseCase.SCHEDULES_CREATE, org_id, args=args)
        agent = await self.store.get_agent(org_id, agent_ref)
        if agent.mode is not AgentMode.AUTONOMOUS:
            raise InvalidRequestError(f"agent {agent.name!r} is not AUTONOMOUS")
        if not 1 <= max_steps <= max_steps_limit:
            raise InvalidRequestError(f"max_steps must be between 1 and {max_steps_limit}")
        if workflow is None and run_mode is None:
            run_mode = RunMode.EXECUTE
        if workflow is None and inputs is not None:
            raise InvalidRequestError("inputs go with a workflow")
        schedule = validate_schedule(
            Schedule(
                org_id=org_id,
                agent_id=agent.id,
                name=name,
                workflow=workflow,
                workflow_version=workflow_version,
                inputs=None if workflow is None else dict(inputs or {}),
                goal=goal.strip(),
                cron=cron,
                interval_s=interval_s,
                timezone=timezone,
                next_run_at=run_at,
                max_steps=max_steps,
                max_seconds=max_seconds,
                run_mode=run_mode,
                created_by=caller.id,
            ),
            utcnow(),
        )
        if workflow is not None:
            # The checks every firing makes again, now: a schedule that could not start a
            # run is refused when it is made, not found out at its first due time.
            version = await WorkflowStore(self.store.db).version(org_id, workflow, workflow_version)
            workflow_run_of(schedule, version, self.input_limits)
        await self.schedules.create(schedule)
        self.schedules_changed.set()
        await self.gate.audited(caller, UseCase.SCHEDULES_CREATE, org_id, args=args)
        return schedule

    async def list_schedules(
        self, org_id: str, *, principal: Principal | None = None
    ) -> list[Schedule]:
        await self.gate.authorize(principal, UseCase.SCHEDULES_LIST, org_id)
        return await self.schedules.in_org(org_id)

    async def change_schedule(
        self,
        org_id: str,
        schedule_id: UUID,
        action: str,
        *,
        principal: Principal | None = None,
    ) -> Schedule:
        """``suspend`` (no firing until resumed), ``resume`` (an ACTIVE schedule again; what
        it missed while suspended coalesces into one run) or ``cancel`` (for good).

        Raises:
            NotFoundError: No such schedule here.
            InvalidRequestError: An unknown action.
            ConflictError: Cancelled or done already, or resuming one that is not suspended.
        """
        if action not in ("suspend", "resume", "cancel"):
            raise InvalidRequestError("action is suspend, resume or cancel")
        args = {"schedule": str(schedule_id), "action": action}
        caller = principal or Principal.operator(org_id)
        found = await self.schedules.get(org_id, schedule_id) if caller.org_id == org_id else None
        if found is None and caller.org_id == org_id:
            raise NotFoundError(f"no schedule {schedule_id} in this organisation")
        caller = await self.gate.authorize(
            principal,
            UseCase.SCHEDULES_CHANGE,
            org_id,
            args=args,
            owner_id=None if found is None else found.created_by,
        )
        if found is None:
            raise NotFoundError(f"no schedule {schedule_id} in this organisation")
        if found.status in (ScheduleStatus.CANCELLED, ScheduleStatus.DONE):
            raise ConflictError(f"schedule {schedule_id} is {found.status}")
        if action == "resume" and found.status != ScheduleStatus.SUSPENDED:
            raise ConflictError(f"schedule {schedule_id} is {found.status}, not SUSPENDED")
        status = {
            "suspend": ScheduleStatus.SUSPENDED,
            "resume": ScheduleStatus.ACTIVE,
            "cancel": ScheduleStatus.CANCELLED,
        }[action]
        changed = await self.schedules.set_status(org_id, schedule_id, status)
        assert changed is not None
        if status == ScheduleStatus.ACTIVE:
            self.schedules_changed.set()
        await self.gate.audited(caller, UseCase.SCHEDULES_CHANGE, org_id, args=args)
        return changed

    async def next_schedule_at(self) -> datetime | None:
        """When the earliest active schedule is due (the scheduler's sleep)."""
        return await self.schedules.next_due_at()

    async def fire_due_schedules(self, now: Any = None) -> list[tuple[str, UUID]]:
        """Fire every due schedule once (the scheduler's sweep, in every organisation): the
        (organisation, run id) of each run made here, for the executor to drive."""
        now = now or utcnow()
        made: list[tuple[str, UUID]] = []
        while True:
            batch, taken = await self.schedules.fire_due(now)
            made.extend(batch)
            if not taken:
                return made
