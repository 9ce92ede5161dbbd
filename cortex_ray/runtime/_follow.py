"""Following a run to its end from a driver that is not the only one: resume it here, and
if another driver holds its lease, either give up (saying who holds it) or wait for the run
to end, taking it over whenever its lease falls free. The decisions live here, so that no
transport polls leases itself; the transport renders through the callbacks."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol
from uuid import UUID

from cortex_ray._types import Principal, RunStatus, TaskRun
from cortex_ray.storage import LeaseHolder

__all__ = ["Drive", "FollowedRuns", "OnBusy", "resume_or_wait"]

Drive = Callable[[TaskRun], Awaitable[TaskRun]]
"""Drives a RUNNING run here from its next step and returns it as it then stands (by
default :meth:`FollowedRuns.resume_run`; a transport wraps it to show each step)."""

OnBusy = Callable[[TaskRun, LeaseHolder, bool], None]
"""Told that another driver holds the run's lease: ``(run, holder, waiting)``; ``waiting``
False when the run is left to that driver (then returned RUNNING), True once when this
call starts waiting for the run to end."""


class FollowedRuns(Protocol):
    """The run use cases following a run needs (``RunUseCases`` has them)."""

    async def resume_run(
        self, org_id: str, run_id: UUID, *, principal: Principal | None = None
    ) -> TaskRun: ...

    async def run_lease(
        self, org_id: str, run_id: UUID, *, principal: Principal | None = None
    ) -> LeaseHolder: ...

    async def run_status(
        self, org_id: str, run_id: UUID, *, principal: Principal | None = None
    ) -> RunStatus: ...

    async def get_run(
        self, org_id: str, run_id: UUID, *, principal: Principal | None = None
    ) -> TaskRun: ...


async def resume_or_wait(
    runs: FollowedRuns,
    org_id: str,
    run: TaskRun,
    *,
    principal: Principal,
    wait: bool,
    on_busy: OnBusy,
    drive: Drive | None = None,
    poll_s: float = 1.0,
) -> TaskRun:
    """Drive the RUNNING ``run`` here; while another driver holds its lease, tell
    ``on_busy`` and either return the run (``wait`` False) or poll until the run ends,
    driving it again whenever its lease is free (its driver stopped). Returns the run as it
    ended, or still RUNNING when left to another driver.

    The lease is asked before ``drive`` is first called, so a run another driver holds is
    refused (or waited for) at once, before anything a drive needs is prepared (the CLI
    loads its models only inside ``drive``: seconds to tens of seconds)."""

    async def resume(current: TaskRun) -> TaskRun:
        return await runs.resume_run(org_id, current.id, principal=principal)

    step = drive or resume
    told = False
    while run.status is RunStatus.RUNNING:
        holder = await runs.run_lease(org_id, run.id, principal=principal)
        if not holder.live:  # nobody drives it (or its driver stopped): ours to drive
            run = await step(run)
            continue
        if not wait:
            on_busy(run, holder, False)
            return run
        if not told:
            on_busy(run, holder, True)
            told = True
        await asyncio.sleep(poll_s)
        status = await runs.run_status(org_id, run.id, principal=principal)
        if status is not RunStatus.RUNNING:
            run = await runs.get_run(org_id, run.id, principal=principal)
    return run
