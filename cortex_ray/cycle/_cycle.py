"""``DecisionCycle``: the cycle's parts wired together (the composition root of
``cortex_ray.cycle``), and the three entry points the runtime calls through it."""

from __future__ import annotations

from uuid import UUID

from cortex_ray._types import (
    Agent,
    Observation,
    Principal,
    Session,
    TaskRun,
    Turn,
    TurnResult,
)
from cortex_ray.act import InvocationContext, ToolDispatcher, ToolRegistry
from cortex_ray.cycle._approvals import RunApprovals, TurnApprovals
from cortex_ray.cycle._autonomous import AutonomousLoop
from cortex_ray.cycle._events import StepCallback, TurnEventSink
from cortex_ray.cycle._run_step import RunStep
from cortex_ray.cycle._runs import Timelines
from cortex_ray.cycle._step import BeforeAct, CycleStep, Decide, SharedStep
from cortex_ray.cycle._turn import InteractiveTurn
from cortex_ray.decide import AutonomousDriver, InteractiveDriver
from cortex_ray.governance import GovernanceStore, WorkflowStore
from cortex_ray.learn import Learner
from cortex_ray.perceive import WorkingMemoryAssembler
from cortex_ray.settings import Settings
from cortex_ray.storage import Database, RunLeases, Store, TurnLease

__all__ = ["DecisionCycle"]


class DecisionCycle:
    """The cycle's seams wired together, and the two loops that run them: the shared step
    (``step``), the autonomous loop (``drive``, ``resume``: LEARN after every step) and the
    interactive turn (``turn``: LEARN once per turn)."""

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
        self._step = SharedStep(
            settings=settings, registry=registry, assembler=assembler, dispatcher=dispatcher
        )
        timelines = Timelines(store, settings.diagnostics)
        run_approvals = RunApprovals(
            leases=self.leases,
            store=store,
            approvals=self.approvals,
            dispatcher=dispatcher,
            learner=learner,
            ttl_s=settings.governance.approval_ttl_s,
        )
        self._runs = AutonomousLoop(
            policy=settings.runs,
            loop_repeats=settings.diagnostics.loop_repeats,
            leases=self.leases,
            store=store,
            workflows=self.workflows,
            dispatcher=dispatcher,
            learner=learner,
            approvals=run_approvals,
            run_step=RunStep(
                step=self._step,
                driver=autonomous,
                registry=registry,
                leases=self.leases,
                store=store,
                learner=learner,
                approvals=run_approvals,
                record=settings.decide.record_decisions,
            ),
            timelines=timelines,
        )
        self._turns = InteractiveTurn(
            max_tool_rounds=settings.decide.max_tool_rounds,
            conversation_window=settings.decide.conversation_window,
            store=store,
            dispatcher=dispatcher,
            driver=interactive,
            learner=learner,
            approvals=TurnApprovals(
                approvals=self.approvals,
                dispatcher=dispatcher,
                ttl_s=settings.governance.approval_ttl_s,
                poll_s=settings.governance.approval_poll_s,
            ),
            step=self._step,
            timelines=timelines,
            deadline_s=settings.sessions.turn_deadline_s,
        )

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
        """PERCEIVE → DECIDE (``decide``) → ACT once (``cortex_ray.cycle.SharedStep``)."""
        return await self._step(
            ctx,
            decide,
            objective=objective,
            observations=observations,
            conversation=conversation,
            step_index=step_index,
            max_steps=max_steps,
            before_act=before_act,
            record=record,
        )

    async def resume(
        self, org_id: str, run_id: UUID, *, on_step: StepCallback | None = None, owner: str
    ) -> TaskRun:
        """Drive a RUNNING run to a terminal state as ``owner`` (``AutonomousLoop.resume``)."""
        return await self._runs.resume(org_id, run_id, on_step=on_step, owner=owner)

    async def drive(
        self,
        agent: Agent,
        run: TaskRun,
        on_step: StepCallback | None,
        observations: list[Observation] | None = None,
        *,
        owner: str,
    ) -> TaskRun:
        """Run steps from the run's next one as ``owner`` (``AutonomousLoop.drive``)."""
        return await self._runs.drive(agent, run, on_step, observations, owner=owner)

    async def turn(
        self,
        session: Session,
        caller: Principal,
        message: str,
        *,
        lease: TurnLease | None = None,
        on_event: TurnEventSink | None = None,
    ) -> TurnResult:
        """One interactive turn (``InteractiveTurn.turn``)."""
        return await self._turns.turn(session, caller, message, lease=lease, on_event=on_event)
