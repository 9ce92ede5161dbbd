"""The decision cycle: one PERCEIVE → DECIDE → ACT step shared by both kinds of agent, and the
two loops around it (LEARN at each loop's cadence, through ``cortex_ray.learn``).

``DecisionCycle.step`` is the whole cycle of CoALA's decision procedure once: the assembler
reads long-term memory once into working memory (PERCEIVE), the mode's driver turns it into
one ``Decision`` (DECIDE; the only part that differs by mode), and a chosen action passes the
one invocation gate (ACT). The autonomous loop (``drive``, ``resume``) runs steps against a
goal and a budget and learns after every step; the interactive loop (``turn``) runs tool
rounds for one message and learns once per turn.

Each autonomous step is ONE transaction holding its ledger row (keyed by run id and step
index, so it can never be written twice), its audit row and its episodic memory. A run can
therefore be resumed from its ledger: ``resume`` continues after the last recorded step.
One driver at a time: ``resume`` and ``drive`` hold the run's lease while they drive, and
every write of theirs is fenced by its token (``cortex_ray.storage.RunLeases``), so a driver
that lost the run writes nothing more and stops (``LeaseLost``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar
from uuid import UUID

from cortex_ray._exceptions import (
    AccessDeniedError,
    ConflictError,
    InvalidRequestError,
    LeaseLost,
)
from cortex_ray._tracing import (
    GEN_AI_AGENT_ID,
    GEN_AI_AGENT_NAME,
    GEN_AI_CONVERSATION_ID,
    GEN_AI_OPERATION_NAME,
    attempt_link,
    context_of,
    end_run_span,
    tracer,
)
from cortex_ray._types import (
    Agent,
    AgentAction,
    AgentMode,
    Candidate,
    Decision,
    DecisionKind,
    Observation,
    ObservationStatus,
    Principal,
    RunCost,
    RunLoop,
    RunMode,
    RunStatus,
    Session,
    SessionStatus,
    Step,
    StepRecording,
    TaskRun,
    ToolSpec,
    Turn,
    TurnEvent,
    TurnEventKind,
    TurnResult,
    WorkingMemory,
    utcnow,
)
from cortex_ray.act import Dispatch, InvocationContext, ToolDispatcher, ToolRegistry
from cortex_ray.decide import AutonomousDriver, InteractiveDriver
from cortex_ray.governance import (
    Approval,
    ApprovalStatus,
    GovernanceStore,
    WorkflowStore,
    WorkflowVersion,
    evidence_of,
)
from cortex_ray.learn import Learner
from cortex_ray.models import recording
from cortex_ray.observability import diagnostics, metrics
from cortex_ray.perceive import WorkingMemoryAssembler, shown_note
from cortex_ray.settings import DECIDE_SETTINGS, Settings, setting_value
from cortex_ray.storage import AuditEntry, Database, RunLease, RunLeases, Store, TurnLease

__all__ = [
    "CycleStep",
    "DecisionCycle",
    "StepCallback",
    "TurnEventRelay",
    "TurnEventSink",
    "events_until",
]

log = logging.getLogger("cortex_ray.cycle")

E = TypeVar("E")

StepCallback = Callable[[Step], Awaitable[None] | None]
TurnEventSink = Callable[[TurnEvent], Awaitable[None] | None]
"""Receives a turn's events as they happen. A sink that raises is dropped for the rest of
the turn (logged); the turn itself always runs to its end and is recorded."""

Decide = Callable[[WorkingMemory], Awaitable[Decision]]
BeforeAct = Callable[[AgentAction], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class CycleStep:
    """One pass of PERCEIVE → DECIDE → ACT: the decision, and the gate's dispatch when the
    decision was to act (``None`` for a finish or a reply, which the loop handles)."""

    decision: Decision
    dispatch: Dispatch | None = None
    recording: StepRecording | None = None
    """What DECIDE saw and its model said, when the caller asked (``record=True``)."""
    shown: str | None = None
    """Which tools the prompt showed, when tool retrieval chose them (``shown_note``): the
    step log keeps it in the step's note."""


class DecisionCycle:
    """The cycle's seams wired together, and the two loops that run them."""

    def __init__(
        self,
        *,
        settings: Settings,
        db: Database,
        store: Store,
        registry: ToolRegistry,
        assembler: WorkingMemoryAssembler,
        dispatcher: ToolDispatcher,
        autonomous: AutonomousDriver,
        interactive: InteractiveDriver,
        learner: Learner,
    ) -> None:
        self.settings = settings
        self.db = db
        self.store = store
        self.registry = registry
        self.assembler = assembler
        self.dispatcher = dispatcher
        self.autonomous = autonomous
        self.interactive = interactive
        self.learner = learner
        self.leases = RunLeases(db)  # one driver per run: held, renewed, fenced writes
        self.approvals = GovernanceStore(
            db, payload_inline_bytes=settings.tools.payload_inline_bytes
        )
        self.workflows = WorkflowStore(db)  # a workflow run's allow-list and evidence

    # the shared step ----------------------------------------------------------------------

    async def step(
        self,
        ctx: InvocationContext,
        decide: Decide,
        *,
        objective: str,
        observations: list[Observation],
        conversation: list[Turn] | None = None,
        step_index: int = 0,
        max_steps: int | None = None,
        before_act: BeforeAct | None = None,
        record: bool = False,
    ) -> CycleStep:
        """PERCEIVE (one memory read) → DECIDE (``decide``) → ACT (the gate) once.

        ``before_act`` runs between the decision and the call (the autonomous loop makes the
        step's intent durable there; the interactive loop reports the tool call). With
        ``record`` the step's recording (working memory, model calls) comes back with it.
        """
        org, agent_name = ctx.agent.org_id, ctx.agent.name
        started = time.perf_counter()
        allowed = None
        if (workflow := ctx.workflow) is not None:

            def allowed(spec: ToolSpec) -> bool:
                tool = self.registry.get(spec.name)
                return workflow.allows(spec.name, None if tool is None else tool.connector)

        wm = await self.assembler.assemble(  # PERCEIVE
            agent=ctx.agent,
            mode=ctx.mode,
            objective=objective,
            caller=ctx.caller,
            observations=observations,
            conversation=conversation or (),
            step_index=step_index,
            max_steps=max_steps,
            run_id=ctx.run_id,
            allowed=allowed,
        )
        shown = shown_note(wm.action_space, wm.hidden_tools)
        started = _phase_done("perceive", started, org, agent_name)
        kept: StepRecording | None = None
        with tracer.start_as_current_span("decide") as span:
            if record:
                with recording() as tape:
                    started = time.perf_counter()
                    decision = await decide(wm)  # DECIDE
                    took = (time.perf_counter() - started) * 1000
                seen = wm.model_copy(update={"observations": (), "conversation": ()})
                used = {k: setting_value(self.settings, k) for k in DECIDE_SETTINGS}
                kept = StepRecording(
                    wm=seen, model_calls=tuple(tape), decide_ms=round(took, 3), settings=used
                )
            else:
                decision = await decide(wm)  # DECIDE
            span.set_attribute("cortex.decision", decision.kind.value)
            if decision.action is not None:
                span.set_attribute("cortex.tool", decision.action.tool)
        _phase_done("decide", started, org, agent_name)
        if decision.kind is not DecisionKind.ACT or decision.action is None:
            return CycleStep(decision, recording=kept, shown=shown)
        if before_act is not None:
            await before_act(decision.action)
        started = time.perf_counter()
        dispatch = await self.dispatcher.execute(  # ACT
            ctx, decision.action.tool, decision.action.args
        )
        _phase_done("act", started, org, agent_name)
        return CycleStep(decision, dispatch, kept, shown)

    # autonomous ---------------------------------------------------------------------------

    async def resume(
        self,
        org_id: str,
        run_id: UUID,
        *,
        on_step: StepCallback | None = None,
        owner: str,
    ) -> TaskRun:
        """Drive a RUNNING run to a terminal state, continuing after its last recorded step,
        as ``owner``, the holder of the run's lease while it drives.

        A run whose lease another owner holds (live) is returned as it is, still RUNNING,
        and so is one whose lease is lost while driving (``LeaseLost``): the other driver
        goes on. Raises ``NotFoundError`` for an unknown run."""
        lease = await self.leases.acquire(org_id, run_id, owner, self.settings.runs)
        if lease is None:
            return await self.store.get_run(org_id, run_id)
        async with self.leases.hold(lease, self.settings.runs) as holding:
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
        return await self.store.get_run(org_id, run_id)

    async def _resume(self, lease: RunLease, on_step: StepCallback | None) -> TaskRun:
        run = await self.store.get_run(lease.org_id, lease.run_id)
        agent = await self.store.get_agent(run.org_id, run.agent_id)
        workflow = await self._workflow_of(run)
        observations = _observed(run.steps)
        step_index = len(run.steps)
        # A side-effecting step whose process died after it began acting is decided again,
        # not re-executed, and the model is told its effect is unknown. The intent is
        # consumed in the same (fenced) transaction as the audit row that keeps the
        # evidence; a retried call carries the same idempotency key.
        async with self.leases.fenced(lease) as conn:
            interrupted = await self.store.take_intent(conn, run.org_id, run.id, step_index)
            if interrupted is not None:
                note = _interrupted(run, step_index, interrupted)
                audit = self.dispatcher.audit_entry(
                    _run_context(agent, run, step_index, workflow=workflow),
                    interrupted,
                    status="INTERRUPTED",
                    reason=note.summary,
                )
                await self.store.insert_audit(conn, audit)
                observations.append(note)
        # A decided approval request for the next step: carried out, or recorded as refused.
        from cortex_ray._approvals import settle_approval

        run, approved = await settle_approval(
            self,
            self.approvals,
            _run_context(agent, run, len(run.steps), workflow=workflow),
            run,
            lease,
            observations,
        )
        return await self._drive(agent, run, lease, on_step, observations, approved)

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
        lease = await self.leases.acquire(run.org_id, run.id, owner, self.settings.runs)
        if lease is None:
            return await self.store.get_run(run.org_id, run.id)
        async with self.leases.hold(lease, self.settings.runs) as holding:
            try:
                final = await self._drive(agent, run, lease, on_step, observations)
            except LeaseLost as lost:
                log.info("run %s: stopped driving: %s", run.id, lost)
            else:
                if final.status is not RunStatus.RUNNING:
                    holding.ended()
                return final
        return await self.store.get_run(run.org_id, run.id)

    async def _workflow_of(self, run: TaskRun) -> WorkflowVersion | None:
        """The workflow version a run follows (read once per process: versions never
        change), or ``None``."""
        if run.workflow_version_id is None:
            return None
        return await self.workflows.version_by_id(run.org_id, run.workflow_version_id)

    def _timeline(self, org_id: str, **ids: UUID | None) -> diagnostics.Timeline | None:
        """A diagnostic timeline for a run attempt or a turn (``None`` when switched off)."""
        options = self.settings.diagnostics
        if not options.enabled:
            return None
        store = self.store

        async def write(
            tl: diagnostics.Timeline, events: list[diagnostics.DiagnosticEvent]
        ) -> None:
            await store.append_diagnostics(
                tl.org_id,
                events,
                run_id=tl.run_id,
                session_id=tl.session_id,
                turn_id=tl.turn_id,
                retention_days=options.retention_days,
            )

        return diagnostics.Timeline(
            org_id=org_id,
            writer=write,
            max_events=options.max_events,
            max_value_chars=options.max_value_chars,
            stall_after_s=options.stall_after_s,
            **ids,  # type: ignore[arg-type]
        )

    async def _drive(
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
        timeline = self._timeline(run.org_id, run_id=run.id)
        workflow = await self._workflow_of(run)
        first = not run.steps
        queue_s = max((utcnow() - run.created_at).total_seconds(), 0.0) if first else 0.0
        watch = _LoopWatch(self.settings.diagnostics.loop_repeats, run.steps)
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
                final = await self._drive_traced(
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

    @staticmethod
    def _looped(agent: Agent, run: TaskRun, span: Any, loop: RunLoop) -> None:
        """Say that the run proposes the same call again and again (it is not stopped: the
        step budget bounds it, and an operator decides)."""
        log.warning(
            "run %s: %s called %d times with the same arguments (steps %d-%d): a loop",
            run.id,
            loop.tool,
            loop.repeats,
            loop.first_step,
            loop.last_step,
        )
        metrics.record(metrics.LOOPS_DETECTED, org=run.org_id, agent=agent.name, tool=loop.tool)
        diagnostics.note("loop", **loop.model_dump(mode="json"))
        if span.is_recording():
            span.add_event("loop", {"cortex.tool": loop.tool, "cortex.repeats": loop.repeats})

    async def _end_attempt(
        self,
        run: TaskRun,
        timeline: diagnostics.Timeline | None,
        watch: _LoopWatch,
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
            return await self.store.add_run_cost(run.org_id, run.id, cost)
        except Exception:
            log.warning("run %s: could not record its cost", run.id, exc_info=True)
            return None

    async def _drive_traced(
        self,
        agent: Agent,
        run: TaskRun,
        lease: RunLease,
        on_step: StepCallback | None,
        observations: list[Observation] | None,
        watch: _LoopWatch,
        approved: Approval | None = None,
        workflow: WorkflowVersion | None = None,
    ) -> TaskRun:
        steps = list(run.steps)
        if observations is None:
            observations = _observed(steps)
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
            if run.trace_parent is not None and span.is_recording():
                attempt = format(span.get_span_context().span_id, "016x")
                await self.store.set_trace_attempt(run.org_id, run.id, attempt)
                run = run.model_copy(update={"trace_attempt": attempt})  # as stored
            timeline = diagnostics.current_timeline()
            for step_index in range(len(steps), run.max_steps):
                if run.deadline_at is not None and utcnow() >= run.deadline_at:
                    # The wall-time cap: checked between steps (a step under way is bounded
                    # by the gate's tool timeout and the model's own).
                    capped = await self._finish(
                        agent,
                        run,
                        lease,
                        RunStatus.FAILED,
                        reason="time cap reached: the run was still going at its deadline "
                        f"{run.deadline_at.isoformat(timespec='seconds')} after "
                        f"{len(steps)} step(s)",
                    )
                    end_run_span(span, capped)
                    _run_done(agent, capped)
                    return capped.model_copy(update={"steps": tuple(steps)})
                if timeline is not None:
                    timeline.step = step_index
                step, final = await self._autonomous_step(
                    agent, run, lease, step_index, observations, on_step, approved, workflow
                )
                approved = None
                if step is None:  # paused on an approval request: no step recorded yet
                    assert final is not None
                    end_run_span(span, final)
                    return final.model_copy(update={"steps": tuple(steps)})
                steps.append(step)
                if (loop := watch.see(step)) is not None:
                    self._looped(agent, run, span, loop)
                if timeline is not None:
                    await timeline.flush_if_due()
                if final is not None:
                    end_run_span(span, final)
                    _run_done(agent, final)
                    return final.model_copy(update={"steps": tuple(steps)})
            final = await self._finish(
                agent,
                run,
                lease,
                RunStatus.FAILED,
                reason=f"step budget of {run.max_steps} exhausted before the goal was met",
            )
            end_run_span(span, final)
            _run_done(agent, final)
        return final.model_copy(update={"steps": tuple(steps)})

    async def _autonomous_step(
        self,
        agent: Agent,
        run: TaskRun,
        lease: RunLease,
        step_index: int,
        observations: list[Observation],
        on_step: StepCallback | None,
        approved: Approval | None = None,
        workflow: WorkflowVersion | None = None,
    ) -> tuple[Step | None, TaskRun | None]:
        """One cycle: its ledger row, and the finished run when it reached a terminal state;
        no row and the paused run when its call waits for approval. With ``approved`` the
        step carries out that request's decision instead of deciding."""
        with tracer.start_as_current_span(
            f"step {step_index}",
            attributes={
                "cortex.step": step_index,
                "cortex.org_id": run.org_id,
                "cortex.run_id": str(run.id),
            },
        ):
            side_effects = False

            async def make_intent_durable(action: AgentAction) -> None:
                # Durable before acting: if the process dies now, resume knows this step
                # began and decides it again instead of blindly repeating it.
                nonlocal side_effects
                tool = self.registry.get(action.tool)
                side_effects = tool is not None and not tool.idempotent
                if side_effects:
                    # Fenced: a driver that lost the run neither acts nor leaves an intent.
                    async with self.leases.fenced(lease) as conn:
                        await self.store.insert_intent(
                            run.org_id, run.id, step_index, action, conn=conn
                        )

            decide: Decide = self.autonomous.decide
            if approved is not None:
                from cortex_ray._approvals import replayed

                decided = replayed(approved)

                async def decide(wm: WorkingMemory) -> Decision:  # not decided again
                    return decided

            cycle = await self.step(
                _run_context(agent, run, step_index, approved, workflow),
                decide,
                objective=run.objective(),
                observations=observations,
                step_index=step_index,
                max_steps=run.max_steps,
                before_act=make_intent_durable,
                record=self.settings.decide.record_decisions,
            )
            decision = cycle.decision
            metrics.record(
                metrics.STEPS, org=run.org_id, agent=agent.name, decision=decision.kind.value
            )
            if (timeline := diagnostics.current_timeline()) is not None:
                # built only when kept: the candidates' dumps are work on every step
                timeline.add(
                    "decision",
                    decision=decision.kind.value,
                    candidates=[_shown_candidate(c) for c in decision.candidates],
                    selected=decision.selected,
                    action=None if decision.action is None else decision.action.model_dump(),
                    reason=decision.reason,
                    shown_tools=cycle.shown,
                )
            if cycle.dispatch is None:
                step = Step(
                    run_id=run.id,
                    step_index=step_index,
                    decision=DecisionKind.FINISH,
                    candidates=decision.candidates,
                    selected=decision.selected,
                    message=decision.message or decision.reason,
                    note=_note(decision.reason, cycle.shown),
                    recording=cycle.recording,
                )
                failed = decision.failed or decision.kind is not DecisionKind.FINISH
                status = RunStatus.FAILED if failed else RunStatus.COMPLETED
                reason = decision.reason
                if not failed and workflow is not None and workflow.required_evidence.required:
                    # A workflow run completes only with the evidence its version requires;
                    # without it the run FAILS saying what is missing (the answer is kept).
                    rows = await self.store.audit_rows(run.org_id, run_id=run.id, gate_only=True)
                    check = evidence_of(rows, workflow.required_evidence)
                    if not check.satisfied:
                        status, reason = RunStatus.FAILED, check.finding()
                final = await self._finish(
                    agent,
                    run,
                    lease,
                    status,
                    result=None if failed else decision.message,
                    reason=reason,
                    step=step,
                )
                step = _without_recording(step)
                await _notify(on_step, step)
                return step, final

            dispatch = cycle.dispatch
            if (
                dispatch.audit.decision == "approval_required"
                and run.run_mode is RunMode.EXECUTE
                and approved is None
            ):
                from cortex_ray._approvals import pause_for_approval

                paused = await pause_for_approval(
                    self,
                    self.approvals,
                    run,
                    lease,
                    step_index,
                    decision,
                    dispatch,
                    observations,
                    clear_intent=side_effects,
                )
                return None, paused
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
                note=_note(decision.reason, cycle.shown),
                recording=cycle.recording,
            )
            started = time.perf_counter()
            await self.learner.record_step(  # LEARN
                agent, run, step, decision, dispatch.audit, clear_intent=side_effects, lease=lease
            )
            _phase_done("learn", started, run.org_id, agent.name)
            step = _without_recording(step)
            await _notify(on_step, step)
            if dispatch.refused_as_invalid:
                # Never executed; end the run safely rather than loop on a broken plan.
                final = await self._finish(
                    agent,
                    run,
                    lease,
                    RunStatus.FAILED,
                    reason=f"step {step_index + 1}: {observation.summary}",
                )
                return step, final
            return step, None

    async def _finish(
        self,
        agent: Agent,
        run: TaskRun,
        lease: RunLease,
        status: RunStatus,
        *,
        result: str | None = None,
        reason: str | None = None,
        step: Step | None = None,
    ) -> TaskRun:
        finished_at = await self.learner.record_result(
            agent, run, status, result=result, reason=reason, step=step, lease=lease
        )
        return run.model_copy(
            update={
                "status": status,
                "result": result,
                "reason": reason,
                "finished_at": finished_at,
            }
        )

    # interactive --------------------------------------------------------------------------

    async def turn(
        self,
        session: Session,
        caller: Principal,
        message: str,
        *,
        lease: TurnLease | None = None,
        on_event: TurnEventSink | None = None,
    ) -> TurnResult:
        """One interactive turn (see :meth:`_turn`), with its diagnostic timeline."""
        timeline = self._timeline(
            session.org_id,
            session_id=session.id,
            turn_id=lease.turn.id if lease is not None else None,
        )
        with diagnostics.timeline(timeline):
            diagnostics.note("request", message=message, caller=caller.id)
            try:
                result = await self._turn(session, caller, message, lease=lease, on_event=on_event)
            except BaseException as exc:
                diagnostics.note("failure", error=f"{type(exc).__name__}: {exc}")
                if timeline is not None:
                    await asyncio.shield(timeline.close())
                raise
            diagnostics.note(
                "terminal",
                reply=result.reply,
                refused=result.refused,
                cost=None if timeline is None else timeline.meter.as_dict(),
            )
            if timeline is not None:
                await asyncio.shield(timeline.close())
        return result

    async def _turn(
        self,
        session: Session,
        caller: Principal,
        message: str,
        *,
        lease: TurnLease | None = None,
        on_event: TurnEventSink | None = None,
    ) -> TurnResult:
        """One interactive turn: tool rounds through the gate, then a reply (a dialogue action).

        ``on_event`` hears each tool call, its observation, and the reply or refusal as they
        happen (the HTTP API streams them as server-sent events). With the ``lease`` of an
        accepted turn, each round's tool call carries the idempotency key
        ``f"turn:{turn_id}:{round}"`` (the same on a retried attempt), and the turn's row ends
        DONE, with its events, in the transaction that records the turn."""
        if not message.strip():
            raise InvalidRequestError("the message is empty")
        session = await self.store.get_session(session.org_id, session.id)
        if caller.id != session.caller_id or caller.org_id != session.org_id:
            raise AccessDeniedError("only the session's own caller may talk in it")
        if session.status is not SessionStatus.OPEN:
            raise ConflictError(f"session {session.id} has ended")
        relay = TurnEventRelay(on_event, f"session {session.id}")
        emitted: list[TurnEvent] = []

        async def emit(event: TurnEvent) -> None:
            emitted.append(event)
            await relay(event)

        agent = await self.store.get_agent(session.org_id, session.agent_id)
        history = await self.store.conversation(
            session.org_id, session.id, limit=self.settings.decide.conversation_window
        )
        user_turn = Turn(role="user", content=message)
        ctx = InvocationContext(
            agent=agent, caller=caller, mode=AgentMode.INTERACTIVE, session_id=session.id
        )
        observations: list[Observation] = []
        new_turns: list[Turn] = [user_turn]
        audits: list[AuditEntry] = []
        reply: str | None = None
        refused: str | None = None
        round_index = 0
        with tracer.start_as_current_span(
            f"invoke_agent {agent.name}",
            attributes={
                GEN_AI_OPERATION_NAME: "invoke_agent",
                GEN_AI_AGENT_NAME: agent.name,
                GEN_AI_AGENT_ID: str(agent.id),
                GEN_AI_CONVERSATION_ID: str(session.id),
                "cortex.org_id": session.org_id,
                "cortex.session_id": str(session.id),
                "cortex.mode": "interactive",
            },
            # the request's trace, wherever the turn is driven (a session actor, a recovery)
            context=context_of(lease.turn.trace_parent if lease is not None else None),
        ):
            for round_index in range(self.settings.decide.max_tool_rounds + 1):
                # The last round may only reply: the bound on tool rounds.
                last = round_index == self.settings.decide.max_tool_rounds

                async def decide_now(wm: WorkingMemory, allow_tools: bool = not last) -> Decision:
                    return await self.interactive.decide(wm, allow_tools=allow_tools)

                decide: Decide = decide_now
                if lease is not None and lease.turn.attempts > 1:
                    # A recovered turn: a round that already asked for approval carries out
                    # the call the person saw (or sees), not a new decision.
                    asked = await self.approvals.approval_for_round(
                        session.org_id, lease.turn.id, round_index
                    )
                    if asked is not None:
                        from cortex_ray._approvals import replayed

                        decide = _decided(replayed(asked))

                async def tool_call(action: AgentAction, index: int = round_index) -> None:
                    await emit(
                        TurnEvent(
                            kind=TurnEventKind.TOOL_CALL,
                            round=index,
                            tool=action.tool,
                            args=action.args,
                        )
                    )

                if lease is not None:
                    ctx = replace(ctx, idempotency_key=lease.idempotency_key(round_index))
                cycle = await self.step(
                    ctx,
                    decide,
                    objective=message,
                    observations=observations,
                    conversation=[*history, user_turn],
                    before_act=tool_call,
                )
                decision = cycle.decision
                if cycle.dispatch is not None and decision.action is not None:
                    dispatch = cycle.dispatch
                    if dispatch.audit.decision == "approval_required" and lease is not None:
                        # A person is in the loop: the turn waits for the decision.
                        audits.append(dispatch.audit)
                        dispatch = await self._approved_call(
                            ctx, lease, round_index, decision, dispatch, observations, emit
                        )
                    await emit(
                        TurnEvent(
                            kind=TurnEventKind.OBSERVATION,
                            round=round_index,
                            tool=decision.action.tool,
                            observation=dispatch.observation,
                        )
                    )
                    observations.append(dispatch.observation)
                    audits.append(dispatch.audit)
                    new_turns.append(
                        Turn(
                            role="tool",
                            content=dispatch.observation.summary,
                            tool=decision.action.tool,
                        )
                    )
                    continue
                if decision.failed or not decision.message:
                    refused = decision.reason
                    break
                # The reply is a dialogue action: it passes the gate like any other.
                dispatch = await self.dispatcher.execute(
                    ctx, "reply", {"message": decision.message}
                )
                audits.append(dispatch.audit)
                if dispatch.observation.status is ObservationStatus.OK:
                    reply = decision.message
                    new_turns.append(Turn(role="assistant", content=reply))
                else:
                    refused = dispatch.observation.summary
                break
            if reply is not None:
                await emit(TurnEvent(kind=TurnEventKind.REPLY, round=round_index, text=reply))
            else:
                await emit(
                    TurnEvent(
                        kind=TurnEventKind.REFUSED, round=round_index, text=refused or "no reply"
                    )
                )
        await self.learner.record_turn(  # LEARN: one EPISODIC record per turn
            session,
            agent,
            caller,
            message,
            reply or refused or "",
            new_turns,
            audits,
            observations,
            lease=lease,
            reply=reply,
            refused=None if reply is not None else refused or "no reply",
            events=emitted,
        )
        outcome = "replied" if reply is not None else "refused"
        metrics.record(
            metrics.TURNS_FINISHED, org=session.org_id, agent=agent.name, outcome=outcome
        )
        return TurnResult(
            session_id=session.id, reply=reply, observations=tuple(observations), refused=refused
        )

    async def _approved_call(
        self,
        ctx: InvocationContext,
        lease: TurnLease,
        round_index: int,
        decision: Decision,
        asked: Dispatch,
        observations: list[Observation],
        emit: Callable[[TurnEvent], Awaitable[None]],
    ) -> Dispatch:
        """A turn's call that needs approval: the request recorded and streamed, the
        decision waited for; approved, the call goes through the gate again (the policy
        evaluated again, no second request); otherwise a refused call, not executed."""
        from cortex_ray._approvals import await_turn_approval, refusal_reason

        action = decision.action
        assert action is not None
        approval = await await_turn_approval(
            self, self.approvals, lease, round_index, decision, asked, observations, emit
        )
        if approval.status is ApprovalStatus.APPROVED:
            return await self.dispatcher.execute(
                replace(ctx, approval_id=approval.id), action.tool, action.args
            )
        why = refusal_reason(approval)
        observation = Observation(
            tool=action.tool,
            action_type=action.action_type,
            status=ObservationStatus.REFUSED,
            summary=f"refused: {why} (not executed)",
            args=action.args,
        )
        return Dispatch(
            observation, self.dispatcher.audit_entry(ctx, action, status="REFUSED", reason=why)
        )


def _decided(decision: Decision) -> Decide:
    """DECIDE that returns a decision already made (not decided again)."""

    async def decide(wm: WorkingMemory) -> Decision:
        return decision

    return decide


def _note(reason: str, shown: str | None) -> str | None:
    """A step's note: why the planner chose so, then which tools it was shown (when tool
    retrieval chose them)."""
    return "; ".join(part for part in (reason, shown) if part) or None


def _without_recording(step: Step) -> Step:
    """The step as its log shows it: the recording is stored, and read only for replay."""
    return step if step.recording is None else step.model_copy(update={"recording": None})


def _shown_candidate(c: Candidate) -> dict[str, Any]:
    """A candidate as the timeline keeps it (what it proposed, how it scored)."""
    return c.model_dump(
        include={"index", "kind", "tool", "args", "message", "score", "valid", "invalid_reason",
                 "repeats", "assessment", "unsupported"},
        exclude_none=True,
    )  # fmt: skip


class _LoopWatch:
    """Counts the calls of a run by (tool, arguments); the ``repeats``-th identical one is a
    loop (reported once per call, then its count kept up to date)."""

    def __init__(self, repeats: int, steps: Sequence[Step]) -> None:
        self._repeats = repeats
        self._seen: dict[tuple[str, str], RunLoop] = {}
        self.loops: list[RunLoop] = []
        for step in steps:
            self.see(step, report=False)

    def see(self, step: Step, *, report: bool = True) -> RunLoop | None:
        action = step.action
        if step.decision is not DecisionKind.ACT or action is None:
            return None
        canonical = json.dumps(action.args, sort_keys=True, default=str)
        key = (action.tool, hashlib.sha256(canonical.encode()).hexdigest()[:16])
        known = self._seen.get(key)
        if known is None:
            self._seen[key] = RunLoop(
                tool=action.tool,
                args_sha=key[1],
                repeats=1,
                first_step=step.step_index,
                last_step=step.step_index,
            )
            return None
        seen = known.model_copy(update={"repeats": known.repeats + 1, "last_step": step.step_index})
        self._seen[key] = seen
        if seen.repeats < self._repeats:
            return None
        self.loops = [lp for lp in self.loops if (lp.tool, lp.args_sha) != key] + [seen]
        return seen if seen.repeats == self._repeats and report else None


def _phase_done(phase: str, started: float, org: str, agent: str) -> float:
    """Record how long ``phase`` took since ``started``; returns now (the next one's start)."""
    now = time.perf_counter()
    metrics.record(metrics.PHASE_DURATION, now - started, org=org, agent=agent, phase=phase)
    return now


def _run_done(agent: Agent, run: TaskRun) -> None:
    metrics.record(
        metrics.RUNS_FINISHED, org=run.org_id, agent=agent.name, outcome=run.status.value
    )


def _run_context(
    agent: Agent,
    run: TaskRun,
    step_index: int,
    approved: Approval | None = None,
    workflow: WorkflowVersion | None = None,
) -> InvocationContext:
    return InvocationContext(
        workflow=workflow,
        approval_id=None if approved is None else approved.id,
        agent=agent,
        caller=None,
        mode=AgentMode.AUTONOMOUS,
        run_id=run.id,
        step_index=step_index,
        run_mode=run.run_mode,
    )


def _observed(steps: Sequence[Step]) -> list[Observation]:
    """The observations of recorded steps, each with the arguments of its call (rows
    written before observations carried them have them in the step's action)."""
    out = []
    for step in steps:
        if step.observation is None:
            continue
        obs = step.observation
        if not obs.args and step.action is not None and step.action.args:
            obs = obs.model_copy(update={"args": step.action.args})
        out.append(obs)
    return out


def _interrupted(run: TaskRun, step_index: int, action: AgentAction) -> Observation:
    summary = (
        f"interrupted: the process stopped while {action.tool} was running; it may or may "
        f"not have taken effect (idempotency key {run.id}:{step_index})"
    )
    log.warning("run %s step %d: %s", run.id, step_index, summary)
    return Observation(
        tool=action.tool,
        action_type=action.action_type,
        status=ObservationStatus.ERROR,
        summary=summary,
        step_index=step_index,
        args=action.args,
    )


async def _notify(callback: StepCallback | None, step: Step) -> None:
    if callback is None:
        return
    result = callback(step)
    if result is not None:
        await result


async def events_until(running: asyncio.Future[Any], events: asyncio.Queue[E]) -> AsyncIterator[E]:
    """Yield what is put on ``events`` as it arrives, until ``running`` ends, then what is
    left: how a turn's events cross from the task running it to a stream (the actor's
    generator, the API's server-sent events). ``running`` is never cancelled here."""
    while not running.done():
        waiting = asyncio.ensure_future(events.get())
        try:
            await asyncio.wait({waiting, running}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not waiting.done():
                waiting.cancel()
        if waiting.done() and not waiting.cancelled():
            yield waiting.result()
    while not events.empty():
        yield events.get_nowait()


class TurnEventRelay:
    """Delivers turn events to a sink until the sink fails once (then drops them, logged):
    a caller that stopped listening never stops the turn."""

    def __init__(self, sink: TurnEventSink | None, label: str) -> None:
        self._sink = sink
        self._label = label

    async def __call__(self, event: TurnEvent) -> None:
        if self._sink is None:
            return
        try:
            result = self._sink(event)
            if result is not None:
                await result
        except Exception:
            log.warning(
                "%s: the turn-event sink failed; the turn goes on without it",
                self._label,
                exc_info=True,
            )
            self._sink = None
