"""One autonomous step: the shared step, then its ledger row (LEARN), or the run's end, or
a pause for approval.

Each step is ONE transaction holding its ledger row (keyed by run id and step index, so it
can never be written twice), its audit row and its episodic memory. A side-effecting call's
intent is made durable before it acts, so a resumed run knows the step began.
"""

from __future__ import annotations

import time

from cortex_ray._types import (
    Agent,
    AgentAction,
    DecisionKind,
    Observation,
    RunMode,
    RunStatus,
    Step,
    TaskRun,
)
from cortex_ray.act import Dispatch, ToolRegistry
from cortex_ray.cycle._approvals import RunApprovals, replayed
from cortex_ray.cycle._events import StepCallback, notify
from cortex_ray.cycle._runs import (
    finish_run,
    run_context,
    shown_candidate,
    step_note,
    without_recording,
)
from cortex_ray.cycle._step import CycleStep, Decide, SharedStep, decided, phase_done
from cortex_ray.decide import AutonomousDriver
from cortex_ray.governance import Approval, WorkflowVersion, evidence_of
from cortex_ray.learn import Learner
from cortex_ray.observability import diagnostics, metrics, tracer
from cortex_ray.storage import RunLease, RunLeases, Store

__all__ = ["RunStep", "StepOutcome"]

StepOutcome = tuple[Step | None, TaskRun | None]
"""The step's ledger row, and the finished run when it reached a terminal state; no row and
the paused run when its call waits for approval."""


class _Intent:
    """Makes a side-effecting step's intent durable before it acts: if the process dies
    then, resume knows this step began and decides it again instead of blindly repeating
    it."""

    def __init__(
        self,
        registry: ToolRegistry,
        leases: RunLeases,
        store: Store,
        run: TaskRun,
        lease: RunLease,
        step_index: int,
    ) -> None:
        self._registry = registry
        self._leases = leases
        self._store = store
        self._run = run
        self._lease = lease
        self._step_index = step_index
        self.side_effects = False
        """Whether the step's call has side effects (its intent was recorded)."""

    async def record(self, action: AgentAction) -> None:
        tool = self._registry.get(action.tool, self._run.org_id)
        self.side_effects = tool is not None and not tool.idempotent
        if self.side_effects:
            # Fenced: a driver that lost the run neither acts nor leaves an intent.
            run = self._run
            async with self._leases.fenced(self._lease) as conn:
                await self._store.insert_intent(
                    run.org_id, run.id, self._step_index, action, conn=conn
                )


class RunStep:
    """One autonomous step of a run (PERCEIVE → DECIDE → ACT → LEARN), held by its lease."""

    def __init__(
        self,
        *,
        step: SharedStep,
        driver: AutonomousDriver,
        registry: ToolRegistry,
        leases: RunLeases,
        store: Store,
        learner: Learner,
        approvals: RunApprovals,
        record: bool,
    ) -> None:
        self._step = step
        self._driver = driver
        self._registry = registry
        self._leases = leases
        self._store = store
        self._learner = learner
        self._approvals = approvals
        self._record = record

    async def __call__(
        self,
        agent: Agent,
        run: TaskRun,
        lease: RunLease,
        step_index: int,
        observations: list[Observation],
        on_step: StepCallback | None,
        approved: Approval | None = None,
        workflow: WorkflowVersion | None = None,
    ) -> StepOutcome:
        """One cycle (see ``StepOutcome``). With ``approved`` the step carries out that
        request's decision instead of deciding."""
        with tracer.start_as_current_span(
            f"step {step_index}",
            attributes={
                "cortex.step": step_index,
                "cortex.org_id": run.org_id,
                "cortex.run_id": str(run.id),
            },
        ):
            intent = _Intent(self._registry, self._leases, self._store, run, lease, step_index)
            cycle = await self._step(
                run_context(agent, run, step_index, approved, workflow),
                self._decider(approved),
                objective=run.objective(),
                observations=observations,
                step_index=step_index,
                max_steps=run.max_steps,
                before_act=intent.record,
                record=self._record,
            )
            _noted(agent, run, cycle)
            if cycle.dispatch is None:
                step, final = await self._finished(agent, run, lease, step_index, cycle, workflow)
                await notify(on_step, step)
                return step, final
            if _needs_approval(run, cycle.dispatch, approved):
                paused = await self._approvals.pause(
                    run,
                    lease,
                    step_index,
                    cycle.decision,
                    cycle.dispatch,
                    observations,
                    clear_intent=intent.side_effects,
                )
                return None, paused
            return await self._acted(
                agent,
                run,
                lease,
                step_index,
                cycle,
                cycle.dispatch,
                observations,
                on_step,
                side_effects=intent.side_effects,
            )

    def _decider(self, approved: Approval | None) -> Decide:
        """DECIDE: the driver's, or the approved request's decision (not decided again)."""
        if approved is None:
            return self._driver.decide
        return decided(replayed(approved))

    async def _finished(
        self,
        agent: Agent,
        run: TaskRun,
        lease: RunLease,
        step_index: int,
        cycle: CycleStep,
        workflow: WorkflowVersion | None,
    ) -> tuple[Step, TaskRun]:
        """A finish (or a failure to decide): the run's last step and its end, recorded."""
        decision = cycle.decision
        step = Step(
            run_id=run.id,
            step_index=step_index,
            decision=DecisionKind.FINISH,
            candidates=decision.candidates,
            selected=decision.selected,
            message=decision.message or decision.reason,
            note=step_note(decision.reason, cycle.shown),
            recording=cycle.recording,
        )
        failed = decision.failed or decision.kind is not DecisionKind.FINISH
        status = RunStatus.FAILED if failed else RunStatus.COMPLETED
        reason = decision.reason
        if not failed and workflow is not None and workflow.required_evidence.required:
            # A workflow run completes only with the evidence its version requires;
            # without it the run FAILS saying what is missing (the answer is kept).
            rows = await self._store.audit_rows(run.org_id, run_id=run.id, gate_only=True)
            check = evidence_of(rows, workflow.required_evidence)
            if not check.satisfied:
                status, reason = RunStatus.FAILED, check.finding()
        final = await finish_run(
            self._learner,
            agent,
            run,
            lease,
            status,
            result=None if failed else decision.message,
            reason=reason,
            step=step,
        )
        return without_recording(step), final

    async def _acted(
        self,
        agent: Agent,
        run: TaskRun,
        lease: RunLease,
        step_index: int,
        cycle: CycleStep,
        dispatch: Dispatch,
        observations: list[Observation],
        on_step: StepCallback | None,
        *,
        side_effects: bool,
    ) -> StepOutcome:
        """A call made: OBSERVE, then LEARN the step (its ledger row); a call refused as
        invalid ends the run."""
        decision = cycle.decision
        observation = dispatch.observation  # OBSERVE
        observations.append(observation)
        step = Step(
            run_id=run.id,
            step_index=step_index,
            decision=DecisionKind.ACT,
            candidates=decision.candidates,
            selected=decision.selected,
            action=decision.action,
            action_type=observation.action_type,
            observation=observation,
            note=step_note(decision.reason, cycle.shown),
            recording=cycle.recording,
        )
        started = time.perf_counter()
        await self._learner.record_step(  # LEARN
            agent, run, step, decision, dispatch.audit, clear_intent=side_effects, lease=lease
        )
        phase_done("learn", started, run.org_id, agent.name)
        step = without_recording(step)
        await notify(on_step, step)
        if dispatch.refused_as_invalid:
            # Never executed; end the run safely rather than loop on a broken plan.
            final = await finish_run(
                self._learner,
                agent,
                run,
                lease,
                RunStatus.FAILED,
                reason=f"step {step_index + 1}: {observation.summary}",
            )
            return step, final
        return step, None


def _noted(agent: Agent, run: TaskRun, cycle: CycleStep) -> None:
    """Count the step, and keep its decision in the attempt's timeline (if one is kept)."""
    decision = cycle.decision
    metrics.record(metrics.STEPS, org=run.org_id, agent=agent.name, decision=decision.kind.value)
    if (timeline := diagnostics.current_timeline()) is not None:
        # built only when kept: the candidates' dumps are work on every step
        timeline.add(
            "decision",
            decision=decision.kind.value,
            candidates=[shown_candidate(c) for c in decision.candidates],
            selected=decision.selected,
            action=None if decision.action is None else decision.action.model_dump(),
            reason=decision.reason,
            shown_tools=cycle.shown,
        )


def _needs_approval(run: TaskRun, dispatch: Dispatch, approved: Approval | None) -> bool:
    """Whether the call waits for a person: its policy asks for approval, the run executes
    (a dry run does not pause), and it is not the approved request being carried out."""
    return (
        dispatch.audit.decision == "approval_required"
        and run.run_mode is RunMode.EXECUTE
        and approved is None
    )
