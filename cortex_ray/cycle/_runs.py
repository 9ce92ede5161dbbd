"""What both loops share around the step: a run's invocation context and its observations,
the notes its steps keep, its end (LEARN's record of the result), and the diagnostic
timelines of run attempts and turns."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from cortex_ray._types import (
    Agent,
    AgentAction,
    AgentMode,
    Candidate,
    Observation,
    ObservationStatus,
    RunStatus,
    Step,
    TaskRun,
)
from cortex_ray.act import InvocationContext
from cortex_ray.governance import Approval, WorkflowVersion
from cortex_ray.learn import Learner
from cortex_ray.observability import diagnostics, metrics
from cortex_ray.settings import DiagnosticsOptions
from cortex_ray.storage import RunLease, Store

__all__ = [
    "Timelines",
    "finish_run",
    "interrupted",
    "observed",
    "run_context",
    "run_done",
    "shown_candidate",
    "step_note",
    "without_recording",
]

log = logging.getLogger("cortex_ray.cycle")


class Timelines:
    """Opens the diagnostic timeline of a run attempt or a turn, written to the store (or
    none when diagnostics are switched off)."""

    def __init__(self, store: Store, options: DiagnosticsOptions) -> None:
        self._store = store
        self._options = options

    def open(
        self,
        org_id: str,
        *,
        run_id: UUID | None = None,
        session_id: UUID | None = None,
        turn_id: UUID | None = None,
    ) -> diagnostics.Timeline | None:
        """A diagnostic timeline for a run attempt or a turn (``None`` when switched off)."""
        options = self._options
        if not options.enabled:
            return None
        store = self._store

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
            run_id=run_id,
            session_id=session_id,
            turn_id=turn_id,
            max_events=options.max_events,
            max_value_chars=options.max_value_chars,
            stall_after_s=options.stall_after_s,
        )


async def finish_run(
    learner: Learner,
    agent: Agent,
    run: TaskRun,
    lease: RunLease,
    status: RunStatus,
    *,
    result: str | None = None,
    reason: str | None = None,
    step: Step | None = None,
) -> TaskRun:
    """LEARN the run's end (fenced by ``lease``); returns the run as it now is."""
    finished_at = await learner.record_result(
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


def run_done(agent: Agent, run: TaskRun) -> None:
    """Count a run that reached a terminal state."""
    metrics.record(
        metrics.RUNS_FINISHED, org=run.org_id, agent=agent.name, outcome=run.status.value
    )


def run_context(
    agent: Agent,
    run: TaskRun,
    step_index: int,
    approved: Approval | None = None,
    workflow: WorkflowVersion | None = None,
) -> InvocationContext:
    """The gate's context for a step of ``run`` (carrying out ``approved``, if given)."""
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


def observed(steps: Sequence[Step]) -> list[Observation]:
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


def interrupted(run: TaskRun, step_index: int, action: AgentAction) -> Observation:
    """What the model is told of a side-effecting step whose process died while acting."""
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


def step_note(reason: str, shown: str | None) -> str | None:
    """A step's note: why the planner chose so, then which tools it was shown (when tool
    retrieval chose them)."""
    return "; ".join(part for part in (reason, shown) if part) or None


def without_recording(step: Step) -> Step:
    """The step as its log shows it: the recording is stored, and read only for replay."""
    return step if step.recording is None else step.model_copy(update={"recording": None})


def shown_candidate(c: Candidate) -> dict[str, Any]:
    """A candidate as the timeline keeps it (what it proposed, how it scored)."""
    return c.model_dump(
        include={"index", "kind", "tool", "args", "message", "score", "valid", "invalid_reason",
                 "repeats", "assessment", "unsupported"},
        exclude_none=True,
    )  # fmt: skip
