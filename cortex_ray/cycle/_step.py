"""The shared step: PERCEIVE → DECIDE → ACT once, for both kinds of agent.

The assembler reads long-term memory once into working memory (PERCEIVE), the mode's driver
turns it into one ``Decision`` (DECIDE; the only part that differs by mode, passed in as
``decide``), and a chosen action passes the one invocation gate (ACT). What the loops do
around it (recording, learning, approvals) is theirs.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from cortex_ray._types import (
    AgentAction,
    Decision,
    DecisionKind,
    Observation,
    StepRecording,
    ToolSpec,
    Turn,
    WorkingMemory,
)
from cortex_ray.act import Dispatch, InvocationContext, ToolDispatcher, ToolRegistry
from cortex_ray.models import recording
from cortex_ray.observability import metrics, tracer
from cortex_ray.perceive import WorkingMemoryAssembler, shown_note
from cortex_ray.settings import DECIDE_SETTINGS, Settings, setting_value

__all__ = ["BeforeAct", "CycleStep", "Decide", "SharedStep", "decided", "phase_done"]

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


class SharedStep:
    """PERCEIVE (one memory read) → DECIDE → ACT (the gate) once: the seams it joins."""

    def __init__(
        self,
        *,
        settings: Settings,
        registry: ToolRegistry,
        assembler: WorkingMemoryAssembler,
        dispatcher: ToolDispatcher,
    ) -> None:
        self._decide_settings: dict[str, Any] = {
            k: setting_value(settings, k) for k in DECIDE_SETTINGS
        }
        self._registry = registry
        self._assembler = assembler
        self._dispatcher = dispatcher

    async def __call__(
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
            registry = self._registry

            def allowed(spec: ToolSpec) -> bool:
                tool = registry.get(spec.name, ctx.agent.org_id)
                return workflow.allows(spec.name, None if tool is None else tool.connector)

        wm = await self._assembler.assemble(  # PERCEIVE
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
        started = phase_done("perceive", started, org, agent_name)
        kept: StepRecording | None = None
        with tracer.start_as_current_span("decide") as span:
            if record:
                with recording() as tape:
                    started = time.perf_counter()
                    decision = await decide(wm)  # DECIDE
                    took = (time.perf_counter() - started) * 1000
                seen = wm.model_copy(update={"observations": (), "conversation": ()})
                kept = StepRecording(
                    wm=seen,
                    model_calls=tuple(tape),
                    decide_ms=round(took, 3),
                    settings=dict(self._decide_settings),
                )
            else:
                decision = await decide(wm)  # DECIDE
            span.set_attribute("cortex.decision", decision.kind.value)
            if decision.action is not None:
                span.set_attribute("cortex.tool", decision.action.tool)
        phase_done("decide", started, org, agent_name)
        if decision.kind is not DecisionKind.ACT or decision.action is None:
            return CycleStep(decision, recording=kept, shown=shown)
        if before_act is not None:
            await before_act(decision.action)
        started = time.perf_counter()
        dispatch = await self._dispatcher.execute(  # ACT
            ctx, decision.action.tool, decision.action.args
        )
        phase_done("act", started, org, agent_name)
        return CycleStep(decision, dispatch, kept, shown)


def decided(decision: Decision) -> Decide:
    """DECIDE that returns a decision already made (not decided again)."""

    async def decide(wm: WorkingMemory) -> Decision:
        return decision

    return decide


def phase_done(phase: str, started: float, org: str, agent: str) -> float:
    """Record how long ``phase`` took since ``started``; returns now (the next one's start)."""
    now = time.perf_counter()
    metrics.record(metrics.PHASE_DURATION, now - started, org=org, agent=agent, phase=phase)
    return now
