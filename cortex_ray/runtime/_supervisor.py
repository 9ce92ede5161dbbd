"""The supervisor: every interrupted run is resumed, with nobody polling it.

A run is driven by whoever holds its lease (``cortex_ray.storage.RunLeases``). When the
process driving it stops (Ctrl-C, SIGTERM, SIGKILL, a lost node), the run stays RUNNING in
PostgreSQL and its lease is released (a clean stop) or expires (a crash). The supervisor
looks for such runs when it starts and every ``RunPolicy.supervise_interval_s`` after, and
hands each to its executor, which drives it from its ledger. A run taken
``RunPolicy.max_attempts`` times without recording a step is ended FAILED with the reason
instead.

Schedules have their own loop here (``fire_schedules``): it sleeps until the earliest
schedule is due (at most ``RunPolicy.schedule_poll_s``, and woken at once when a schedule is
made or resumed through this process), fires what is due and starts each run, so a schedule
fires within about a second of its time, not a sweep interval later. Firing stays exactly
once across processes (``FOR UPDATE SKIP LOCKED`` and a compare and set on the due time,
``cortex_ray.governance._schedules``); the sweep fires due schedules too, as a backstop.

The HTTP API starts one in its lifespan (``serve.create_app``), so ``python -m serve``,
``serve:app_builder`` and the demo all resume interrupted runs on start-up. Several
supervisors (replicas, processes) may sweep at once: the lease makes a double start
harmless, and the executors already ignore a run they are driving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from cortex_ray._types import utcnow
from cortex_ray.runtime._executor import Executor
from cortex_ray.runtime._runtime import Runtime
from cortex_ray.settings import RunPolicy
from cortex_ray.storage import exhausted_reason

__all__ = ["RunSupervisor"]

log = logging.getLogger("cortex_ray.supervisor")


class RunSupervisor:
    """Resumes RUNNING runs that nobody drives, through ``executor``.

    Args:
        runtime: Finds the orphaned runs (``Runtime.orphaned_runs``) and gives up on those
            out of attempts.
        executor: Drives each orphan (``Executor.start_run``).
        policy: The sweep's interval and the attempt limit (default: ``runtime.settings.runs``).
    """

    def __init__(
        self,
        runtime: Runtime,
        executor: Executor,
        policy: RunPolicy | None = None,
        *,
        scheduler: bool = True,
    ) -> None:
        self.runtime = runtime
        self.executor = executor
        self.policy = policy or runtime.settings.runs
        self.scheduler = scheduler
        self._task: asyncio.Task[None] | None = None
        self._scheduling: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Sweep now and then every ``supervise_interval_s``, and (``scheduler``) fire
        schedules as they fall due, in the background (start-up is not held up by either):
        the schedules are re-armed from PostgreSQL whenever a process starts."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._loop(), name="run supervisor")
        if self.scheduler and (self._scheduling is None or self._scheduling.done()):
            self._scheduling = asyncio.create_task(self._schedule_loop(), name="scheduler")

    async def aclose(self) -> None:
        """Stop sweeping and scheduling (work under way is cancelled; what it started goes
        on)."""
        tasks = [t for t in (self._task, self._scheduling) if t is not None]
        self._task = self._scheduling = None
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def fire_schedules(self) -> int:
        """Fire every due schedule (each once, whichever process gets there) and start its
        run; returns how many runs were started here."""
        started = 0
        for org_id, run_id in await self.runtime.governance.fire_due_schedules():
            try:
                await self.executor.start_run(org_id, run_id)
                started += 1
            except Exception as exc:  # picked up as an orphan by a later sweep
                log.warning("run %s: could not be started now: %s", run_id, exc)
        return started

    async def _schedule_loop(self) -> None:
        governance = self.runtime.governance
        woken = governance.schedules_changed
        while True:
            woken.clear()  # before looking: a schedule made from now on wakes the sleep
            wait = self.policy.schedule_poll_s
            try:
                await self.fire_schedules()
                due = await governance.next_schedule_at()
                if due is not None:
                    # Not below a few milliseconds: a due schedule another process holds
                    # locked is fired there, and must not make this loop spin.
                    wait = min(wait, max((due - utcnow()).total_seconds(), 0.005))
            except Exception as exc:  # the database away for a moment: look again soon
                log.warning("the scheduler could not fire schedules: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), wait)

    async def sweep(self) -> int:
        """One pass: hand every orphaned run to the executor (or end it FAILED when out of
        attempts); returns how many runs were handed over."""
        started = 0
        # Approval requests out of time count as rejections: their runs continue at once.
        for expired in await self.runtime.governance.expire_approvals():
            if expired.run_id is None:  # a turn's: the turn waiting for it sees the expiry
                continue
            try:
                await self.executor.start_run(expired.org_id, expired.run_id)
                started += 1
            except Exception as exc:  # picked up as an orphan by a later sweep
                log.warning("run %s: could not be resumed now: %s", expired.run_id, exc)
        # Due schedules: each fired once, whichever process gets there (issue 18); the
        # scheduler loop fires them on time, this is the backstop.
        started += await self.fire_schedules()
        for orphan in await self.runtime.orphaned_runs():
            if orphan.attempts >= self.policy.max_attempts:
                reason = exhausted_reason(orphan.attempts)
                if await self.runtime.give_up_run(orphan.org_id, orphan.run_id, reason):
                    log.warning("run %s FAILED: %s", orphan.run_id, reason)
                continue
            try:
                await self.executor.start_run(orphan.org_id, orphan.run_id)
            except Exception as exc:  # the executor away for now: the next sweep tries again
                log.warning("run %s: could not be resumed now: %s", orphan.run_id, exc)
                continue
            # A WARNING: a driver was lost (a crash, a stop mid-run), which an operator
            # wants to see; and no entry point configures INFO for the API replica, where
            # this runs, so at INFO the line never reached `python -m serve`'s output.
            log.warning(
                "run %s (org %s): nobody was driving it; resumed (attempt %d)",
                orphan.run_id, orphan.org_id, orphan.attempts + 1,
            )  # fmt: skip
            started += 1
        await self.sweep_turns()
        return started

    async def sweep_turns(self) -> int:
        """Hand every orphaned turn (accepted, not ended, nobody holding its lease) to the
        executor, which drives it again (or ends it FAILED once out of attempts); returns
        how many were handed over."""
        recovered = 0
        for orphan in await self.runtime.orphaned_turns():
            try:
                await self.executor.recover_turn(orphan.org_id, orphan.session_id, orphan.turn_id)
            except Exception as exc:  # the executor away for now: the next sweep tries again
                log.warning("turn %s: could not be recovered now: %s", orphan.turn_id, exc)
                continue
            log.warning(  # as a run's (above)
                "turn %s (session %s, org %s): nobody was driving it; recovered",
                orphan.turn_id, orphan.session_id, orphan.org_id,
            )  # fmt: skip
            recovered += 1
        return recovered

    async def _loop(self) -> None:
        while True:
            try:
                await self.sweep()
            except Exception as exc:  # the database away for a moment: the next sweep
                log.warning("the run supervisor's sweep failed: %s", exc)
            await asyncio.sleep(self.policy.supervise_interval_s)
