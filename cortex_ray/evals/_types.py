"""The evaluation vocabulary: cassettes, checks, cases, suites, and what a suite run keeps.

A **cassette** is what a recorded run's decisions saw and said, step by step: the working
memory each DECIDE got (without the observations, rebuilt from the earlier steps), the
model calls it made (a digest of each request and the response), the decision, and what
the chosen call returned. A **case** is a cassette with checks; a **suite** a versioned set
of cases. Everything here is a pydantic model: suites come in through the API and from
files, and a bad one is refused with the field that is wrong.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal
from uuid import UUID, uuid4

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cortex_ray._types import (
    DecisionKind,
    ModelExchange,
    Observation,
    RunStatus,
    WorkingMemory,
    utcnow,
)

__all__ = [
    "CASE_NAME",
    "SUITE_NAME",
    "Called",
    "CaseMetrics",
    "CaseResult",
    "Cassette",
    "Check",
    "CheckVerdict",
    "Divergence",
    "EvalCase",
    "EvalMode",
    "EvalRun",
    "EvalRunSummary",
    "EvalSuite",
    "EvalSuiteSummary",
    "Judge",
    "MaxSteps",
    "NoRepeats",
    "NotCalled",
    "RecordedStep",
    "ReplayOutcome",
    "ReplayedStep",
    "ResultContains",
    "ResultMatches",
    "RunComparison",
    "SameDecisions",
    "StatusIs",
    "SuiteMetrics",
    "call_key",
]

SUITE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
CASE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def call_key(tool: str, args: dict[str, Any]) -> str:
    """A call as one comparable string: the tool and its arguments as canonical JSON."""
    return f"{tool}:{json.dumps(args, sort_keys=True, ensure_ascii=False, separators=(',', ':'))}"


class EvalMode(StrEnum):
    """How a suite runs.

    ``replay``: the recorded model outputs answer the model calls (no model needed,
    deterministic): a changed prompt, planner or setting shows where its decisions leave the
    recording. ``live``: a model answers (the runtime's, or another); the recorded results
    answer the tools, so nothing acts on the world; a call the recording never made ends the
    case."""

    REPLAY = "replay"
    LIVE = "live"


class RecordedStep(_Model):
    """One step of a cassette."""

    step_index: int = Field(ge=0)
    wm: WorkingMemory
    model_calls: tuple[ModelExchange, ...] = ()
    decision: DecisionKind
    tool: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    message: str | None = None
    """The finish's answer (or, for a failed finish, why it failed)."""
    failed: bool = False
    observation: Observation | None = None
    decide_ms: float = 0.0

    @model_validator(mode="after")
    def _shape(self) -> RecordedStep:
        if self.decision is DecisionKind.ACT and (self.tool is None or self.observation is None):
            raise ValueError("an ACT step needs its tool and its observation")
        if self.decision is DecisionKind.REPLY:
            raise ValueError("a cassette holds autonomous steps (ACT or FINISH), not replies")
        return self


class Cassette(_Model):
    """A recorded run's decisions, replayable without its model or its tools."""

    source_run: UUID | None = None
    source_org: str | None = None
    agent_name: str = ""
    objective: str = Field(min_length=1)
    max_steps: int = Field(ge=1)
    status: RunStatus
    result: str | None = None
    model: str = ""
    settings: dict[str, Any] = Field(default_factory=dict)
    """The DECIDE settings the run was made with (K, the evaluation, ...): a replay uses them
    unless overridden, so that it asks what today's code decides under the same
    configuration."""
    recorded_at: datetime = Field(default_factory=utcnow)
    steps: tuple[RecordedStep, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _ordered(self) -> Cassette:
        if [s.step_index for s in self.steps] != list(range(len(self.steps))):
            raise ValueError("steps must be numbered 0, 1, 2, ... in order")
        if any(s.decision is DecisionKind.FINISH for s in self.steps[:-1]):
            raise ValueError("only the last step may finish")
        if len(self.steps) > self.max_steps:
            raise ValueError(f"{len(self.steps)} steps exceed the budget of {self.max_steps}")
        return self

    def recorded_calls(self) -> list[str]:
        return [call_key(s.tool, s.args) for s in self.steps if s.tool is not None]


# --- checks ------------------------------------------------------------------------------


class StatusIs(_Model):
    """The run ends with this status."""

    kind: Literal["status"] = "status"
    equals: RunStatus


class ResultContains(_Model):
    """The result holds each of these texts."""

    kind: Literal["result_contains"] = "result_contains"
    values: tuple[str, ...] = Field(min_length=1)
    case_sensitive: bool = False


class ResultMatches(_Model):
    """The result matches this regular expression (``re.search``)."""

    kind: Literal["result_matches"] = "result_matches"
    pattern: str = Field(min_length=1, max_length=1000)

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from exc
        return value


class Called(_Model):
    """The run called ``tool``, with arguments holding ``args`` (a subset; ``{}``: any)."""

    kind: Literal["called"] = "called"
    tool: str = Field(min_length=1)
    args: dict[str, Any] = Field(default_factory=dict)


class NotCalled(_Model):
    """The run never called ``tool``."""

    kind: Literal["not_called"] = "not_called"
    tool: str = Field(min_length=1)


class MaxSteps(_Model):
    """The run took at most this many steps."""

    kind: Literal["max_steps"] = "max_steps"
    value: int = Field(ge=1)


class NoRepeats(_Model):
    """No call was made twice with the same arguments."""

    kind: Literal["no_repeats"] = "no_repeats"


class SameDecisions(_Model):
    """Every decision is the recorded one (tool and arguments, or the same answer)."""

    kind: Literal["same_decisions"] = "same_decisions"


class Judge(_Model):
    """A model reads the objective, the calls and the result and says whether the result
    meets ``rubric`` (model-scored: skipped, not failed, when no judge model is given)."""

    kind: Literal["judge"] = "judge"
    rubric: str = Field(min_length=1, max_length=2000)


Check = Annotated[
    StatusIs
    | ResultContains
    | ResultMatches
    | Called
    | NotCalled
    | MaxSteps
    | NoRepeats
    | SameDecisions
    | Judge,
    Field(discriminator="kind"),
]


class CheckVerdict(_Model):
    kind: str
    passed: bool | None
    """``None``: skipped (a model-scored check without a judge model)."""
    detail: str = ""


# --- cases and suites --------------------------------------------------------------------


class EvalCase(_Model):
    name: str = Field(description="unique in its suite")
    description: str = ""
    cassette: Cassette
    checks: tuple[Check, ...] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not CASE_NAME.match(value):
            raise ValueError(
                "a case name is 1-200 letters, digits, '_', '.', ':' or '-', "
                f"starting with a letter or digit, got {value!r}"
            )
        return value


class EvalSuite(_Model):
    """A versioned set of cases. ``version`` is given by the store when a suite is saved
    (a saved version never changes; saving again makes the next one)."""

    name: str
    version: int | None = Field(default=None, ge=1)
    description: str = ""
    cases: tuple[EvalCase, ...] = Field(min_length=1)
    digest: str | None = None
    created_at: datetime | None = None
    created_by: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not SUITE_NAME.match(value):
            raise ValueError(
                "a suite name is 1-100 letters, digits, '_', '.' or '-', starting with a "
                f"letter or digit, got {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _unique(self) -> EvalSuite:
        seen: set[str] = set()
        for case in self.cases:
            if case.name in seen:
                raise ValueError(f"case name {case.name!r} appears twice")
            seen.add(case.name)
        return self


class EvalSuiteSummary(_Model):
    """A suite's latest version, without its cases."""

    name: str
    version: int
    description: str = ""
    cases: int
    digest: str
    created_at: datetime
    created_by: str | None = None


# --- what a replay gives -----------------------------------------------------------------


class Divergence(_Model):
    """Where a replay left its recording first."""

    step_index: int
    what: Literal["decision", "model_call", "recording_ended", "unrecorded_call"]
    recorded: str
    replayed: str


class ReplayedStep(_Model):
    step_index: int
    decision: DecisionKind
    tool: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    message: str | None = None
    note: str = ""
    matched: bool
    """The same decision as the recording's step (False past the recording's end)."""
    observation_status: str | None = None


class CaseMetrics(_Model):
    """Operating metrics of one case's replay."""

    steps: int = 0
    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    decide_ms: float = 0.0
    tool_correctness: float = 0.0
    """The recorded calls the replay also made (tool and arguments, counted once each),
    over the larger of the two counts: 1.0 when it made exactly the recorded calls."""
    prompt_changes: int = 0
    """Model calls whose request differed from the recorded one (another prompt)."""


class ReplayOutcome(_Model):
    status: RunStatus | None
    """COMPLETED or FAILED when the replay reached an end; ``None`` when it stopped first
    (see ``stopped``)."""
    result: str | None = None
    stopped: str | None = None
    divergence: Divergence | None = None
    steps: tuple[ReplayedStep, ...] = ()
    metrics: CaseMetrics = CaseMetrics()

    def calls(self) -> list[ReplayedStep]:
        return [s for s in self.steps if s.tool is not None]


class CaseResult(_Model):
    case: str
    passed: bool
    verdicts: tuple[CheckVerdict, ...]
    outcome: ReplayOutcome
    error: str | None = None


class SuiteMetrics(_Model):
    cases: int
    passed: int
    success_rate: float
    tool_correctness: float
    mean_steps: float
    model_calls: int
    prompt_tokens: int
    completion_tokens: int
    decide_ms_p50: float
    decide_ms_p95: float
    diverged: int
    prompt_changes: int


class EvalRunSummary(_Model):
    id: UUID
    org_id: str
    suite: str
    suite_version: int
    mode: EvalMode
    model: str | None
    overrides: dict[str, Any] = Field(default_factory=dict)
    """The DECIDE settings changed for this run (the cases' recorded ones otherwise)."""
    passed: int
    total: int
    metrics: SuiteMetrics
    created_by: str | None = None
    started_at: datetime
    finished_at: datetime


class EvalRun(EvalRunSummary):
    id: UUID = Field(default_factory=uuid4)
    results: tuple[CaseResult, ...] = ()


class RunComparison(_Model):
    """Two suite runs side by side, case by case."""

    a: EvalRunSummary
    b: EvalRunSummary
    fixed: tuple[str, ...]
    """Cases that failed in ``a`` and pass in ``b``."""
    broken: tuple[str, ...]
    """Cases that passed in ``a`` and fail in ``b``."""
    changed: tuple[dict[str, Any], ...]
    """Per case in both: pass/fail, steps and tool correctness in each, where either changed."""
    only_a: tuple[str, ...] = ()
    only_b: tuple[str, ...] = ()
    deltas: dict[str, float] = Field(default_factory=dict)
    """b − a for each suite metric."""
