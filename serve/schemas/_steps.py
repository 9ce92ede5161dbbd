"""What a step, a turn and a direct tool call render: candidates, actions, observations."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from cortex_ray import (
    ActionType,
    AgentAction,
    Candidate,
    DecisionKind,
    Observation,
    ObservationStatus,
    Step,
)
from serve.schemas._common import _Out


class CandidateBody(_Out):
    index: int
    kind: Literal["tool", "finish"]
    tool: str | None
    args: dict[str, Any]
    message: str | None
    rationale: str
    score: float | None
    valid: bool
    invalid_reason: str | None
    repeats: int | None = Field(
        default=None, description="the step (1-based) that already made this exact call"
    )
    assessment: str | None = Field(
        default=None, description="what the evaluation said it gives toward the objective"
    )
    unsupported: list[str] = Field(
        default_factory=list,
        description="numbers in a finish's answer that no result, memory or the goal gives",
    )


class ActionBody(_Out):
    tool: str
    args: dict[str, Any]
    action_type: ActionType
    rationale: str


class ObservationBody(_Out):
    tool: str
    action_type: ActionType
    status: ObservationStatus
    summary: str
    output: Any = None
    truncated: bool
    duration_ms: float
    step_index: int | None


def from_observation(observation: Observation) -> ObservationBody:
    return ObservationBody(
        tool=observation.tool,
        action_type=observation.action_type,
        status=observation.status,
        summary=observation.summary,
        output=observation.output,
        truncated=observation.truncated,
        duration_ms=observation.duration_ms,
        step_index=observation.step_index,
    )


def _action(action: AgentAction) -> ActionBody:
    return ActionBody(
        tool=action.tool,
        args=action.args,
        action_type=action.action_type,
        rationale=action.rationale,
    )


def _candidate(c: Candidate) -> CandidateBody:
    return CandidateBody(
        index=c.index,
        kind=c.kind,
        tool=c.tool,
        args=c.args,
        message=c.message,
        rationale=c.rationale,
        score=c.score,
        valid=c.valid,
        invalid_reason=c.invalid_reason,
        repeats=c.repeats,
        assessment=c.assessment,
        unsupported=list(c.unsupported),
    )


class StepBody(_Out):
    """One propose → evaluate → select → act → observe cycle."""

    index: int
    decision: DecisionKind
    candidates: list[CandidateBody] = Field(description="proposals with their scores")
    selected: int | None = Field(description="index of the chosen candidate")
    action: ActionBody | None = Field(description="the chosen action (ACT steps)")
    action_category: ActionType | None
    observation: ObservationBody | None
    message: str | None = Field(description="the finish message or reason (FINISH steps)")
    note: str | None = Field(
        default=None,
        description="why the planner chose this candidate when it was not a plain argmax "
        "(what it said remains, repeats, scores without judgement)",
    )
    created_at: datetime


def _step(step: Step) -> StepBody:
    return StepBody(
        index=step.step_index,
        decision=step.decision,
        candidates=[_candidate(c) for c in step.candidates],
        selected=step.selected,
        action=None if step.action is None else _action(step.action),
        action_category=step.action_type,
        observation=None if step.observation is None else from_observation(step.observation),
        message=step.message,
        note=step.note,
        created_at=step.created_at,
    )
