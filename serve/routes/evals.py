"""Evaluation: suites and their versions, cases from ended runs, suite runs, comparisons.

Suites, cases and runs are the core's evaluation types as they are (snake_case; the JSON of
a suite file), inside the API's camelCase envelopes: see ``serve.schemas.evals``."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Path, Query

from cortex_ray.evals import EvalRun, EvalSuite, EvalSuiteSummary, RunComparison
from serve._deps import MemberDep, OrgPath, StateDep, org_router
from serve.schemas import ApiError
from serve.schemas.evals import (
    EvalCaseCreate,
    EvalRunCreate,
    EvalRunList,
    EvalSuiteCreate,
    EvalSuiteList,
    from_eval_suite,
)

__all__ = ["evals_router"]

SuiteName = Annotated[str, Path(pattern=r"^[^\x00]{1,200}$", description="the suite's name")]


def evals_router() -> APIRouter:
    """Evaluation suites and their runs."""
    router = org_router()

    @router.post("/evals/suites", response_model=EvalSuite, status_code=201, tags=["evals"])
    async def create_eval_suite(
        state: StateDep, org: OrgPath, principal: MemberDep, body: EvalSuiteCreate
    ) -> EvalSuite:
        """Save a suite's cases as its next version (1 for a new name) and return it with
        its version. The same cases as the latest version are that version: it is returned
        (also 201) and nothing new is written; compare ``version``."""
        return await state.runtime.save_eval_suite(org, body.to_suite(), principal=principal)

    @router.get("/evals/suites", response_model=EvalSuiteList, tags=["evals"])
    async def list_eval_suites(
        state: StateDep, org: OrgPath, principal: MemberDep
    ) -> EvalSuiteList:
        """The organisation's suites: each one's latest version, without its cases."""
        return EvalSuiteList(suites=await state.runtime.list_eval_suites(org, principal=principal))

    @router.get("/evals/suites/{name}", response_model=EvalSuite, tags=["evals"])
    async def get_eval_suite(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        name: SuiteName,
        version: Annotated[int | None, Query(ge=1, description="default: the latest")] = None,
    ) -> EvalSuite:
        """A suite's version with its cases (their cassettes and checks)."""
        return await state.runtime.get_eval_suite(org, name, version=version, principal=principal)

    @router.post(
        "/evals/suites/{name}/cases",
        response_model=EvalSuiteSummary,
        status_code=201,
        tags=["evals"],
        responses={
            404: {"model": ApiError, "description": "no such run in this organisation"},
            422: {
                "model": ApiError,
                "description": "invalid request, or a run that cannot be a case (still "
                "RUNNING, or a step without its recording)",
            },
        },
    )
    async def add_eval_case(
        state: StateDep, org: OrgPath, principal: MemberDep, name: SuiteName, body: EvalCaseCreate
    ) -> EvalSuiteSummary:
        """Turn an ended run into a regression case (its cassette: what each step's DECIDE
        saw, the model's outputs, the decisions and the results) and add it to the suite:
        its next version, with the latest version's cases and this one (replacing a case of
        the same name); a new suite starts at version 1."""
        case = await state.runtime.eval_case_from_run(
            org,
            body.run_id,
            name=body.case,
            description=body.description,
            checks=body.checks,
            principal=principal,
        )
        suite = await state.runtime.add_eval_case(org, name, case, principal=principal)
        return from_eval_suite(suite)

    @router.post(
        "/evals/runs",
        response_model=EvalRun,
        status_code=201,
        tags=["evals"],
        responses={
            422: {
                "model": ApiError,
                "description": "invalid request, an override that is not a DECIDE setting "
                "(or not valid), or live mode on a server without a model",
            }
        },
    )
    async def run_eval_suite(
        state: StateDep, org: OrgPath, principal: MemberDep, body: EvalRunCreate
    ) -> EvalRun:
        """Run a saved suite now and store the run with its per-case results and metrics.
        Each case replays under the DECIDE settings it was recorded with (K, the
        evaluation, ...); ``overrides`` changes them, which is how a planner setting is
        tried on recorded runs.

        Synchronous: the response is the finished run. A replay takes milliseconds per case
        (no model is called); a live run calls the server's model for every decision of
        every case, as long as the runs took, so keep live suites small or use the CLI."""
        return await state.runtime.run_eval_suite(
            org,
            body.suite,
            version=body.version,
            mode=body.mode,
            judge=body.judge,
            overrides=body.overrides,
            principal=principal,
        )

    @router.get("/evals/runs", response_model=EvalRunList, tags=["evals"])
    async def list_eval_runs(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        suite: Annotated[str | None, Query(pattern=r"^[^\x00]{1,200}$")] = None,
        limit: Annotated[int, Query(ge=1, le=200)] = 50,
    ) -> EvalRunList:
        """Suite runs, newest first, without their per-case results; only ``suite``'s when
        given."""
        runs = await state.runtime.list_eval_runs(
            org, suite=suite, limit=limit, principal=principal
        )
        return EvalRunList(runs=runs)

    @router.get("/evals/runs/{eval_run_id}", response_model=EvalRun, tags=["evals"])
    async def get_eval_run(
        state: StateDep, org: OrgPath, principal: MemberDep, eval_run_id: UUID
    ) -> EvalRun:
        """A suite run with its per-case results: each check's verdict, the replayed steps,
        where the replay left its recording (``divergence``) and the case's metrics."""
        return await state.runtime.get_eval_run(org, eval_run_id, principal=principal)

    @router.get("/evals/compare", response_model=RunComparison, tags=["evals"])
    async def compare_eval_runs(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        a: Annotated[UUID, Query(description="the earlier (baseline) suite run")],
        b: Annotated[UUID, Query(description="the suite run compared with it")],
    ) -> RunComparison:
        """Suite run ``b`` against ``a``, cases matched by name: those fixed (failed in
        ``a``, pass in ``b``) and broken (passed in ``a``, fail in ``b``), per-case changes,
        and each metric's delta (b − a)."""
        return await state.runtime.compare_eval_runs(org, a, b, principal=principal)

    return router
