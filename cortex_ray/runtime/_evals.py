"""Evaluation as use cases (issue 14, point 6; docs/evaluation.md): regression cases from
recorded runs, versioned suites, suite runs (replayed or live) and their comparison."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from pydantic import ValidationError

from cortex_ray._exceptions import InvalidRequestError, NotFoundError
from cortex_ray._types import Principal
from cortex_ray.access import UseCase
from cortex_ray.evals import (
    Check,
    EvalCase,
    EvalMode,
    EvalRun,
    EvalRunSummary,
    EvalStore,
    EvalSuite,
    EvalSuiteSummary,
    RunComparison,
    SameDecisions,
    StatusIs,
    cassette_from_run,
    compare_runs,
    decide_settings,
    run_suite,
)
from cortex_ray.models import ModelClient
from cortex_ray.runtime._gate import UseCaseGate, first_error
from cortex_ray.settings import Settings
from cortex_ray.storage import Store

__all__ = ["EvalUseCases"]


class EvalUseCases:
    """Eval cases, suites and runs (``Runtime.save_eval_suite``, ``run_eval_suite``, ...);
    ``model`` is the runtime's chat model (live runs and judging by default)."""

    def __init__(
        self,
        gate: UseCaseGate,
        store: Store,
        evals: EvalStore,
        settings: Settings,
        model: ModelClient | None,
    ) -> None:
        self.gate = gate
        self.store = store
        self.evals = evals
        self.settings = settings
        self.model = model

    async def eval_case_from_run(
        self,
        org_id: str,
        run_id: UUID,
        *,
        name: str | None = None,
        description: str = "",
        checks: Sequence[Check] | None = None,
        principal: Principal | None = None,
    ) -> EvalCase:
        """A regression case from an ended run: its cassette (each step's working memory,
        model outputs, decision and result) and ``checks`` (default: the run's recorded
        status, and every decision as recorded).

        Raises:
            InvalidRequestError: the run is still running, or a step has no recording.
        """
        await self.gate.authorize(principal, UseCase.TASKS_GET, org_id)
        run = await self.store.get_run(org_id, run_id, recordings=True)
        try:
            cassette = cassette_from_run(run)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from exc
        if checks is None:
            checks = (StatusIs(equals=run.status), SameDecisions())
        try:
            return EvalCase(
                name=name or f"run-{run.id}",
                description=description or run.goal[:200],
                cassette=cassette,
                checks=tuple(checks),
            )
        except ValidationError as exc:
            raise InvalidRequestError(f"case: {first_error(exc)}") from exc

    async def save_eval_suite(
        self, org_id: str, suite: EvalSuite, *, principal: Principal | None = None
    ) -> EvalSuite:
        """Save ``suite``'s cases as its next version (the same cases as the latest version
        are that version) and return it with its version number."""
        args = {"suite": suite.name, "cases": len(suite.cases)}
        caller = await self.gate.authorize(principal, UseCase.EVALS_WRITE, org_id, args=args)
        return await self._save_suite(caller, org_id, suite)

    async def _save_suite(self, caller: Principal, org_id: str, suite: EvalSuite) -> EvalSuite:
        await self.store.ensure_org(org_id)  # a suite file may be the first thing an org holds
        saved = await self.evals.save_suite(org_id, suite, caller.id)
        args = {"suite": suite.name, "cases": len(suite.cases), "version": saved.version}
        await self.gate.audited(caller, UseCase.EVALS_WRITE, org_id, args=args)
        return saved

    async def add_eval_case(
        self,
        org_id: str,
        suite_name: str,
        case: EvalCase,
        *,
        description: str | None = None,
        principal: Principal | None = None,
    ) -> EvalSuite:
        """The suite's next version: its latest cases with ``case`` added (replacing a case
        of the same name), or version 1 of a new suite."""
        args = {"suite": suite_name, "case": case.name}
        caller = await self.gate.authorize(principal, UseCase.EVALS_WRITE, org_id, args=args)
        try:
            latest = await self.evals.get_suite(org_id, suite_name)
            cases = (*(c for c in latest.cases if c.name != case.name), case)
            about = latest.description if description is None else description
        except NotFoundError:
            cases, about = (case,), description or ""
        try:
            suite = EvalSuite(name=suite_name, description=about, cases=cases)
        except ValidationError as exc:
            raise InvalidRequestError(f"suite: {first_error(exc)}") from exc
        return await self._save_suite(caller, org_id, suite)

    async def get_eval_suite(
        self,
        org_id: str,
        name: str,
        *,
        version: int | None = None,
        principal: Principal | None = None,
    ) -> EvalSuite:
        """A suite's version (default: the latest), with its cases."""
        await self.gate.authorize(principal, UseCase.EVALS_READ, org_id)
        return await self.evals.get_suite(org_id, name, version)

    async def list_eval_suites(
        self, org_id: str, *, principal: Principal | None = None
    ) -> list[EvalSuiteSummary]:
        await self.gate.authorize(principal, UseCase.EVALS_READ, org_id)
        return await self.evals.list_suites(org_id)

    async def run_eval_suite(
        self,
        org_id: str,
        name: str,
        *,
        version: int | None = None,
        mode: EvalMode = EvalMode.REPLAY,
        model: ModelClient | None = None,
        judge: bool | ModelClient = False,
        overrides: dict[str, Any] | None = None,
        principal: Principal | None = None,
    ) -> EvalRun:
        """Run a saved suite and store the run and its per-case results.

        ``replay`` (the default) answers the model calls from the recordings: no model is
        needed, and the run shows where today's prompts, planner and settings decide
        otherwise. ``live`` asks ``model`` (default: this runtime's chat model); the recorded
        results answer the tools, so nothing acts on the world. ``judge``: model-scored
        checks are asked of this model (``True``: the runtime's), else they are skipped.
        Each case replays under the DECIDE settings it was recorded with (K, the
        evaluation, ...); ``overrides`` changes them (``{"candidates": 3}``), which is how a
        planner setting is tried on recorded runs.

        Raises:
            InvalidRequestError: an override that is not a DECIDE setting or not valid.
        """
        args: dict[str, Any] = {
            "suite": name,
            "version": version,
            "mode": mode.value,
            "overrides": overrides or {},
        }
        caller = await self.gate.authorize(principal, UseCase.EVALS_RUN, org_id, args=args)
        try:
            decide_settings(self.settings, {}, overrides)
        except (ValueError, ValidationError) as exc:
            why = first_error(exc) if isinstance(exc, ValidationError) else str(exc)
            raise InvalidRequestError(f"overrides: {why}") from exc
        suite = await self.evals.get_suite(org_id, name, version)
        live = model or self.model
        if mode is EvalMode.LIVE and live is None:
            raise InvalidRequestError("a live eval run needs a model, and this runtime has none")
        grader: ModelClient | None = None
        if judge is True:
            grader = self.model
        elif judge is not False:
            grader = judge
        ran = await run_suite(
            suite,
            self.settings,
            org_id=org_id,
            mode=mode,
            model=live if mode is EvalMode.LIVE else None,
            judge=grader,
            created_by=caller.id,
            overrides=overrides,
        )
        await self.evals.save_run(org_id, ran)
        await self.gate.audited(
            caller,
            UseCase.EVALS_RUN,
            org_id,
            args={**args, "version": suite.version, "eval_run": str(ran.id), "passed": ran.passed},
        )
        return ran

    async def get_eval_run(
        self, org_id: str, eval_run_id: UUID, *, principal: Principal | None = None
    ) -> EvalRun:
        await self.gate.authorize(principal, UseCase.EVALS_READ, org_id)
        return await self.evals.get_run(org_id, eval_run_id)

    async def list_eval_runs(
        self,
        org_id: str,
        *,
        suite: str | None = None,
        limit: int = 50,
        principal: Principal | None = None,
    ) -> list[EvalRunSummary]:
        await self.gate.authorize(principal, UseCase.EVALS_READ, org_id)
        return await self.evals.list_runs(org_id, suite, limit)

    async def compare_eval_runs(
        self, org_id: str, a: UUID, b: UUID, *, principal: Principal | None = None
    ) -> RunComparison:
        """Suite run ``b`` against ``a``: cases fixed and broken, per-case changes, metric
        deltas (b − a)."""
        await self.gate.authorize(principal, UseCase.EVALS_READ, org_id)
        return compare_runs(
            await self.evals.get_run(org_id, a), await self.evals.get_run(org_id, b)
        )
