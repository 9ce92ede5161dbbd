"""Evaluation: suites, cases from runs, suite runs and their comparison."""

from __future__ import annotations

import json
from typing import Annotated, Any
from uuid import UUID

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from cortex_ray import NAME_PATTERN, is_safe_name
from cortex_ray.evals import Check, EvalCase, EvalMode, EvalRunSummary, EvalSuite, EvalSuiteSummary
from serve.schemas._common import Int, JsonObject, Name, _Body, _clean, _Out, has_bad_text

# evaluation ------------------------------------------------------------------------------
# A suite's cases (their cassettes and checks) and what a suite run keeps are the core's
# evaluation types as they are (``cortex_ray.evals``, snake_case fields): one vocabulary
# with suite files and ``cortex-ray eval``, so a suite read here can be kept in a file or
# posted back. Only the envelopes below are the API's own (camelCase, as everywhere).

Description = Annotated[str, Field(max_length=2000), AfterValidator(_clean)]


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error.get("loc", ()))
    message = str(error.get("msg", "invalid"))
    return f"{where}: {message}" if where else message


def _as_json(adapter: TypeAdapter[Any]) -> Any:
    """A before-validator: the raw value as JSON is read (text storable: no NUL, no lone
    surrogate), numbers as JSON numbers ("3" refused, as in every body: strict JSON mode
    reads enums, ids and times from their JSON strings)."""

    def check(raw: Any) -> Any:
        if (reason := has_bad_text(raw)) is not None:
            raise ValueError(reason)
        try:
            return adapter.validate_json(json.dumps(raw), strict=True)
        except ValidationError as exc:
            raise ValueError(_first_error(exc)) from None

    return BeforeValidator(check)


def _suite_name(value: str) -> str:
    """The core's rule for a suite's name (``EvalSuite``: the safe set, at most 100), checked
    on the field so that the refusal names it."""
    if not is_safe_name(_clean(value)):
        raise ValueError(
            "a suite name is 1-100 letters, digits, '_', '.' or '-', starting with a letter "
            "or digit"
        )
    return value


JsonCase = Annotated[EvalCase, _as_json(TypeAdapter(EvalCase))]
JsonCheck = Annotated[Check, _as_json(TypeAdapter(Check))]


def _storable(what: str, items: list[BaseModel]) -> None:
    for i, item in enumerate(items):
        if (reason := has_bad_text(item.model_dump(mode="json"))) is not None:
            raise ValueError(f"{what}.{i}: {reason}")


class EvalSuiteCreate(_Body):
    """A suite's cases, saved as its next version (1 for a new name). The version, digest
    and author are the server's; the same cases as the latest version are that version
    (nothing new is written)."""

    name: Annotated[str, AfterValidator(_suite_name)] = Field(
        max_length=100,
        json_schema_extra={"pattern": NAME_PATTERN},
        description="1-100 letters, digits, '_', '.' or '-', starting with a letter or digit",
    )
    description: Description = ""
    cases: list[JsonCase] = Field(
        min_length=1, max_length=1000, description="case names are unique in a suite"
    )

    @model_validator(mode="after")
    def _valid_suite(self) -> EvalSuiteCreate:
        _storable("cases", list(self.cases))
        self.to_suite()
        return self

    def to_suite(self) -> EvalSuite:
        """The core's suite (its rules: the name, case names unique)."""
        try:
            return EvalSuite(name=self.name, description=self.description, cases=tuple(self.cases))
        except ValidationError as exc:
            raise ValueError(_first_error(exc)) from None


class EvalCaseCreate(_Body):
    """A regression case made from an ended run of this organisation, added to a suite."""

    run_id: UUID = Field(
        description="an ended task run whose steps were recorded (the runtime's "
        "record_decisions, on by default)"
    )
    case: Name | None = Field(
        default=None,
        description="the case's name (default: run-<runId>); a case of that name in the "
        "suite is replaced",
    )
    description: Description = Field(default="", description="default: the run's goal")
    checks: list[JsonCheck] | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="default: the run's recorded status, and every decision as recorded",
    )

    @model_validator(mode="after")
    def _valid_checks(self) -> EvalCaseCreate:
        _storable("checks", list(self.checks or ()))
        return self


class EvalRunCreate(_Body):
    suite: Name = Field(description="the suite's name")
    version: Int | None = Field(default=None, ge=1, description="default: the latest")
    mode: EvalMode = Field(
        default=EvalMode.REPLAY,
        description="replay: the recorded model outputs answer the model calls (no model, "
        "deterministic); live: the server's model answers. Either way the recorded results "
        "answer the tools: nothing acts on the world",
    )
    judge: bool = Field(
        default=False,
        description="ask the server's model the model-scored checks (judge); else they are "
        "skipped, not failed",
    )
    overrides: JsonObject | None = Field(
        default=None,
        description='DECIDE settings to change for this run, e.g. {"evaluation": "scores"} '
        'or {"candidates": 1}; each case otherwise replays under the settings it was '
        "recorded with",
    )


class EvalSuiteList(_Out):
    suites: list[EvalSuiteSummary] = Field(description="each suite's latest version, by name")


class EvalRunList(_Out):
    runs: list[EvalRunSummary] = Field(description="newest first, without per-case results")


def from_eval_suite(suite: EvalSuite) -> EvalSuiteSummary:
    """A saved suite's summary (its version without the cases)."""
    if suite.version is None or suite.digest is None or suite.created_at is None:
        raise ValueError(f"suite {suite.name!r} is not saved: it has no version yet")
    return EvalSuiteSummary(
        name=suite.name,
        version=suite.version,
        description=suite.description,
        cases=len(suite.cases),
        digest=suite.digest,
        created_at=suite.created_at,
        created_by=suite.created_by,
    )
