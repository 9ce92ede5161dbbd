"""Task runs: start, read, cancel; their report and a person's label (shadow runs)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import AfterValidator, Field

from cortex_ray import RunMode, RunStatus, TaskRun
from cortex_ray.governance import RunLabel, RunReport
from serve.schemas._common import Int, JsonObject, LongText, Name, _Body, _clean, _Out
from serve.schemas._steps import StepBody, _step

# tasks -----------------------------------------------------------------------------------


class TaskPayload(_Body):
    """The task itself. The objective is the first non-empty of goal, objective,
    instructions, description."""

    goal: LongText | None = None
    objective: LongText | None = None
    instructions: LongText | None = None
    description: LongText | None = None
    max_steps: Int | None = Field(
        default=None,
        ge=1,
        description="step budget: an integer from 1 to the server's max_steps_limit "
        "(64 unless configured); default: the server's default_max_steps (8)",
    )
    caller_user_id: Name | None = Field(
        default=None,
        description="the user the task is run for; recorded as the run's caller "
        "(default: the authenticated principal)",
    )
    contact_context: JsonObject | None = Field(
        default=None,
        description="context about the contact the task concerns; given to the agent "
        "with the objective (at most 8 KiB as JSON)",
    )

    def objective_text(self) -> str | None:
        for text in (self.goal, self.objective, self.instructions, self.description):
            if text is not None and text.strip():
                return text.strip()
        return None


class TaskCreate(_Body):
    name: Annotated[str, Field(max_length=200), AfterValidator(_clean)] = ""
    agent_id: Name = Field(description="the agent's id (or its name)")
    assignee_kind: Literal["AGENT"] = "AGENT"
    payload: TaskPayload
    run_mode: RunMode = Field(
        default=RunMode.EXECUTE,
        description="execute; dry_run (only READ tools run, the rest is simulated); shadow "
        "(WRITE and ADMIN calls are recorded as proposals, never executed)",
    )


class TaskAccepted(_Out):
    id: UUID
    status: RunStatus
    agent_id: UUID
    max_steps: int
    location: str = Field(description="where to read the run: GET this path")


class TaskSummary(_Out):
    id: UUID
    name: str
    agent_id: UUID
    goal: str
    status: RunStatus
    max_steps: int
    caller_id: str | None = Field(description="the person the run acts for")
    requested_by: str | None = Field(description="the principal that started the run")
    contact_context: JsonObject | None
    result: str | None
    reason: str | None
    created_at: datetime
    finished_at: datetime | None
    run_mode: RunMode = RunMode.EXECUTE


class RunLoopBody(_Out):
    tool: str
    args_sha: str = Field(description="digest of the canonical JSON of the arguments")
    repeats: int
    first_step: int
    last_step: int


class RunCostBody(_Out):
    """What a run spent over its attempts (seconds and tokens), and the loops it showed."""

    attempts: int
    queue_s: float = Field(description="submitted → first step")
    wall_s: float = Field(description="the attempts' own time")
    tokens_in: int
    tokens_out: int
    model_calls: int
    model_s: float
    embed_calls: int
    embed_s: float
    tool_calls: int
    tool_s: float
    loops: list[RunLoopBody]


class TaskBody(TaskSummary):
    cost: RunCostBody | None = Field(
        default=None, description="tokens and seconds spent so far (null before any attempt)"
    )
    steps: list[StepBody]
    steps_json: str = Field(
        description="the same step log as `steps`, serialised as a JSON string (the seed's "
        "TaskRun.stepsJson: `JSON.parse(stepsJson)` equals `steps`)"
    )


def _summary_fields(run: TaskRun) -> dict[str, Any]:
    return {
        "id": run.id,
        "name": run.name,
        "agent_id": run.agent_id,
        "goal": run.goal,
        "status": run.status,
        "max_steps": run.max_steps,
        "caller_id": run.caller_id,
        "requested_by": run.requested_by,
        "contact_context": run.contact_context,
        "result": run.result,
        "reason": run.reason,
        "created_at": run.created_at,
        "finished_at": run.finished_at,
        "run_mode": run.run_mode,
    }


def from_run(run: TaskRun, *, with_steps: bool = True) -> TaskBody | TaskSummary:
    if with_steps:
        steps = [_step(s) for s in run.steps]
        serialised = json.dumps(
            [s.model_dump(mode="json", by_alias=True) for s in steps], ensure_ascii=False
        )
        cost = None if run.cost is None else RunCostBody.model_validate(run.cost.model_dump())
        return TaskBody(**_summary_fields(run), cost=cost, steps=steps, steps_json=serialised)
    return TaskSummary(**_summary_fields(run))


class TaskList(_Out):
    tasks: list[TaskSummary]


class TaskCancel(_Body):
    reason: Annotated[str, Field(max_length=500), AfterValidator(_clean)] | None = Field(
        default=None, description="why, recorded after 'cancelled by <principal>'"
    )


class LabelBody(_Out):
    run_id: UUID
    label: RunLabel
    note: str
    labelled_by: str
    labelled_at: datetime


class ReportedCallBody(_Out):
    step_index: int | None
    tool: str
    tier: str | None
    decision: str
    args: dict[str, Any]
    reason: str | None


class ReportBody(_Out):
    run_id: UUID
    run_mode: str
    status: str
    executed: list[ReportedCallBody]
    simulated: list[ReportedCallBody]
    proposed: list[ReportedCallBody]
    refused: list[ReportedCallBody]
    failed: list[ReportedCallBody]
    label: LabelBody | None

    @classmethod
    def of(cls, report: RunReport) -> ReportBody:
        return cls.model_validate(report.model_dump())


class AcceptanceBody(_Out):
    agent_id: UUID
    agent_name: str
    runs: int
    labelled: int
    accepted: int
    rejected: int
    mixed: int
    proposals: int
    acceptance_rate: float | None


class LabelCreate(_Body):
    label: RunLabel
    note: str = Field(default="", max_length=2000, pattern=r"^[^\x00]*$")


class ShadowAcceptanceList(_Out):
    agents: list[AcceptanceBody]
