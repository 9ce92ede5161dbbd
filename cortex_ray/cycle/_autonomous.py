"""The autonomous loop: steps against a goal and a budget, one driver at a time.

``drive`` and ``resume`` hold the run's lease while they drive, and every write of theirs
is fenced by its token (``cortex_ray.storage.RunLeases``), so a driver that lost the run
writes nothing more and stops (``LeaseLost``). A run can be resumed from its ledger:
``resume`` continues after the last recorded step. Each attempt has its diagnostic
timeline, its span (one trace for every attempt of a run) and its cost, added to the
run's.

Each step has a deadline, ``runs.step_deadline_s`` from its start or the run's own
``deadline_at`` if sooner: its model calls wait for a model over capacity until then
(``cortex_ray.models.waiting_until``), and past it the run ends FAILED saying so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any
from uuid import UUID

from cortex_ray._exceptions import DeadlineExceededError, LeaseLost
from cortex_ray._types import Agent, Observation, RunCost, RunStatus, Step, TaskRun, utcnow
from cortex_ray.act import ToolDispatcher
from cortex_ray.cycle._approvals import RunApprovals
from cortex_ray.cycle._events import StepCallback
from cortex_ray.cycle._run_step import RunStep
from cortex_ray.cycle._runs import (
    Timelines,
    finish_run,
    interrupted,
    observed,
    run_context,
    run_done,
)
from cortex_ray.cycle._watch import LoopWatch, report_loop
from cortex_ray.governance import Approval, WorkflowStore, WorkflowVersion
from cortex_ray.learn import Learner
from cortex_ray.models import Deadline, waiting_until
from cortex_ray.observability import (
    GEN_AI_AGENT_ID,
    GEN_AI_AGENT_NAME,
    GEN_AI_OPERATION_NAME,
    attempt_link,
    context_of,
    diagnostics,
    end_run_span,
    tracer,
)
from cortex_ray.settings import RunPolicy
from cortex_ray.storage import RunLease, RunLeases, Store

__all__ = ["AutonomousLoop"]

log = logging.getLogger("cortex_ray.cycle")


class AutonomousLoop:
    """Drives runs: their lease, their attempts, their steps."""

    def __init__(
        self,
        *,
        policy: RunPolicy,
        loop_repeats: int,
        leases: RunLeases,
        store: Store,
        workflows: WorkflowStore,
        dispatcher: ToolDispatcher,
        learner: Learner,
        approvals: RunApprovals,
        run_step: RunStep,
        timelines: Timelines,
    ) -> None:
        self._policy = policy
        self._loop_repeats = loop_repeats
        self._leases = leases
        self._store = store
        self._workflows = workflows
        self._dispatcher = dispatcher
        self._learner = learner
        self._approvals = approvals
        self._run_step = run_step
        self._timelines = timelines

    # the lease ----------------------------------------------------------------------------

    async def resume(
        self, org_id: str, run_id: UUID, *, on_step: StepCallback | None = None, owner: str
    ) -> TaskRun:
        """Drive a RUNNING run to a terminal state, continuing after its last recorded step,
        as ``owner``, the holder of the run's lease while it drives.

        A run whose lease another owner holds (live) is returned as it is, still RUNNING,
        and so is one whose lease is lost while driving (``LeaseLost``): the other driver
        goes on. Raises ``NotFoundError`` for an unknown run."""
        lease = await self._leases.acquire(org_id, run_id, owner, self._policy)
        if lease is None:
            return await self._store.get_run(org_id, run_id)
        async with self._leases.hold(lease, self._policy) as holding:
            try:
                run = await self._resume(lease, on_step)
            except LeaseLost as lost:
                # Expected when a stalled driver's lease expired and another took the run:
                # nothing of this attempt was written, the new holder goes on.
                log.info("run %s: stopped driving: %s", run_id, lost)
            else:
                if run.status is not RunStatus.RUNNING:
                    holding.ended()
                return run
        return await self._store.get_run(org_id, run_id)

    async def drive(
        self,
        agent: Agent,
        run: TaskRun,
        on_step: StepCallback | None,
        observations: list[Observation] | None = None,
        *,
        owner: str,
    ) -> TaskRun:
        """Run steps from the run's next one until it finishes or the budget ends, holding
        the run's lease as ``owner`` (see :meth:`resume`; a run just recorded has no
        intent to consume)."""
        lease = await self._leases.acquire(run.org_id, run.id, owner, self._policy)
        if lease is None:
            return await self._store.get_run(run.org_id, run.id)
        async with self._leases.hold(lease, self._policy) as holding:
            try:
                final = await self._attempt(agent, run, lease, on_step, observations)
            except LeaseLost as lost:
                log.info("run %s: stopped driving: %s", run.id, lost)
            else:
                if final.status is not RunStatus.RUNNING:
                    holding.ended()
                return final
        return await self._store.get_run(run.org_id, run.id)

    async def _resume(self, lease: RunLease, on_step: StepCallback | None) -> TaskRun:
        run = await self._store.get_run(lease.org_id, lease.run_id)
        agent = await self._store.get_agent(run.org_id, run.agent_id)
        workflow = await self._workflow_of(run)
        observations = observed(run.steps)
        step_index = len(run.steps)
        # A side-effecting step whose process died after it began acting is decided again,
        # not re-executed, and the model is told its effect is unknown. The intent is
        # consumed in the same (fenced) transaction as the audit row that keeps the
        # evidence; a retried call carries the same idempotency key.
        async with self._leases.fenced(lease) as conn:
            intent = await self._store.take_intent(conn, run.org_id, run.id, step_index)
            if intent is not None:
                note = interrupted(run, step_index, intent)
                audit = self._dispatcher.audit_entry(
                    run_context(agent, run, step_index, workflow=workflow),
                    intent,
                    status="INTERRUPTED",
                    reason=note.summary,
                )
                await self._store.insert_audit(conn, audit)
                observations.append(note)
        # A decided approval request for the next step: carried out, or recorded as refused.
        run, approved = await self._approvals.settle(
            run_context(agent, run, len(run.steps), workflow=workflow), run, lease, observations
        )
        return await self._attempt(agent, run, lease, on_step, observations, approved)

    async def _workflow_of(self, run: TaskRun) -> WorkflowVersion | None:
        """The workflow version a run follows (read once per process: versions never
        change), or ``None``."""
        if run.workflow_version_id is None:
            return None
        return await self._workflows.version_by_id(run.org_id, run.workflow_version_id)

    # an attempt ---------------------------------------------------------------------------

    async def _attempt(
        self,
        agent: Agent,
        run: TaskRun,
        lease: RunLease,
        on_step: StepCallback | None,
        observations: list[Observation] | None = None,
        approved: Approval | None = None,
    ) -> TaskRun:
        """One attempt at the run, with its diagnostic timeline and its cost: the tokens
        and seconds it spent are added to the run's, and the loops it showed. ``approved``:
        the approved request the next step carries out without deciding again."""
        timeline = self._timelines.open(run.org_id, run_id=run.id)
        workflow = await self._workflow_of(run)
        first = not run.steps
        queue_s = max((utcnow() - run.created_at).total_seconds(), 0.0) if first else 0.0
        watch = LoopWatch(self._loop_repeats, run.steps)
        started = time.perf_counter()
        with diagnostics.timeline(timeline):
            diagnostics.note(
                "attempt",
                goal=run.objective(),
                max_steps=run.max_steps,
                resumed_at_step=len(run.steps),
                queue_s=round(queue_s, 3) if first else None,
            )
            try:
                final = await self._steps(
                    agent, run, lease, on_step, observations, watch, approved, workflow
                )
            except BaseException as exc:
                diagnostics.note("failure", error=f"{type(exc).__name__}: {exc}")
                await asyncio.shield(self._end_attempt(run, timeline, watch, queue_s, started))
                raise
            total = await asyncio.shield(
                self._end_attempt(run, timeline, watch, queue_s, started, final)
            )
        return final if total is None else final.model_copy(update={"cost": total})  # as stored

    async def _end_attempt(
        self,
        run: TaskRun,
        timeline: diagnostics.Timeline | None,
        watch: LoopWatch,
        queue_s: float,
        started: float,
        final: TaskRun | None = None,
    ) -> RunCost | None:
        """Write the attempt's last events and add its cost to the run's (the sum, or
        ``None`` when it could not be written: the run's outcome stands regardless)."""
        meter = timeline.meter if timeline is not None else diagnostics.Meter()
        cost = RunCost(
            attempts=1,
            queue_s=round(queue_s, 4),
            wall_s=round(time.perf_counter() - started, 4),
            loops=tuple(watch.loops),
            **meter.as_dict(),
        )
        if final is not None:
            diagnostics.note(
                "terminal",
                status=final.status.value,
                reason=final.reason,
                result=final.result,
                cost=cost.model_dump(mode="json", exclude={"loops"}),
            )
        if timeline is not None:
            await timeline.close()
        try:
            return await self._store.add_run_cost(run.org_id, run.id, cost)
        except Exception:
            log.warning("run %s: could not record its cost", run.id, exc_info=True)
            return None

    # the steps ----------------------------------------------------------------------------

    async def _steps(
        self,
        agent: Agent,
        run: TaskRun,
        lease: RunLease,
        on_step: StepCallback | None,
        observations: list[Observation] | None,
        watch: LoopWatch,
        approved: Approval | None = None,
        workflow: WorkflowVersion | None = None,
    ) -> TaskRun:
        """The attempt's steps under its span, until the run ends, pauses, reaches its time
        cap or spends its step budget."""
        steps = list(run.steps)
        if observations is None:
            observations = observed(steps)
        with tracer.start_as_current_span(
            f"invoke_agent {agent.name}",
            attributes={
                GEN_AI_OPERATION_NAME: "invoke_agent",
                GEN_AI_AGENT_NAME: agent.name,
                GEN_AI_AGENT_ID: str(agent.id),
                "cortex.org_id": run.org_id,
                "cortex.run_id": str(run.id),
                "cortex.mode": "autonomous",
                "cortex.resumed_at_step": len(steps),
            },
            context=context_of(run.trace_parent),  # one trace for every attempt
            links=attempt_link(run.trace_parent, run.trace_attempt),
        ) as span:
            run = await self._attempt_traced(run, span)
            timeline = diagnostics.current_timeline()
            for step_index in range(len(steps), run.max_steps):
                if run.deadline_at is not None and utcnow() >= run.deadline_at:
                    return _ended(span, agent, await self._capped(agent, run, lease, steps), steps)
                if timeline is not None:
                    timeline.step = step_index
                try:
                    with self._step_deadline(run):
                        step, final = await self._run_step(
                            agent, run, lease, step_index, observations, on_step, approved,
                            workflow,
                        )  # fmt: skip
                except DeadlineExceededError as exc:
                    ended = await finish_run(
                        self._learner, agent, run, lease, RunStatus.FAILED,
                        reason=f"step {step_index + 1}: {exc}",
                    )  # fmt: skip
                    return _ended(span, agent, ended, steps)
                approved = None
                if step is None:  # paused on an approval request: no step recorded yet
                    assert final is not None
                    end_run_span(span, final)
                    return final.model_copy(update={"steps": tuple(steps)})
                steps.append(step)
                if (loop := watch.see(step)) is not None:
                    report_loop(agent, run, span, loop)
                if timeline is not None:
                    await timeline.flush_if_due()
                if final is not None:
                    return _ended(span, agent, final, steps)
            final = await finish_run(
                self._learner,
                agent,
                run,
                lease,
                RunStatus.FAILED,
                reason=f"step budget of {run.max_steps} exhausted before the goal was met",
            )
            end_run_span(span, final)
            run_done(agent, final)
        return final.model_copy(update={"steps": tuple(steps)})

    def _step_deadline(self, run: TaskRun) -> AbstractContextManager[Deadline]:
        """The step's deadline for its model calls: ``step_deadline_s`` from now, or the
        run's own if sooner."""
        limit = self._policy.step_deadline_s
        step_end = utcnow() + timedelta(seconds=limit)
        if run.deadline_at is not None and run.deadline_at < step_end:
            at = run.deadline_at.isoformat(timespec="seconds")
            return waiting_until(run.deadline_at, f"the run's deadline {at}")
        return waiting_until(step_end, f"the step's deadline ({limit:g} s)")

    async def _attempt_traced(self, run: TaskRun, span: Any) -> TaskRun:
        """Keep the attempt's span id on the run (a later attempt links to it), when the
        run has a trace and the span records."""
        if run.trace_parent is None or not span.is_recording():
            return run
        attempt = format(span.get_span_context().span_id, "016x")
        await self._store.set_trace_attempt(run.org_id, run.id, attempt)
        return run.model_copy(update={"trace_attempt": attempt})  # as stored

    async def _capped(
        self, agent: Agent, run: TaskRun, lease: RunLease, steps: list[Step]
    ) -> TaskRun:
        """The wall-time cap: checked between steps (a step under way is bounded by the
        gate's tool timeout and the model's own)."""
        assert run.deadline_at is not None
        return await finish_run(
            self._learner,
            agent,
            run,
            lease,
            RunStatus.FAILED,
            reason="time cap reached: the run was still going at its deadline "
            f"{run.deadline_at.isoformat(timespec='seconds')} after "
            f"{len(steps)} step(s)",
        )


def _ended(span: Any, agent: Agent, final: TaskRun, steps: list[Step]) -> TaskRun:
    """A run that reached a terminal state: its span ended, counted, with its steps."""
    end_run_span(span, final)
    run_done(agent, final)
    return final.model_copy(update={"steps": tuple(steps)})
