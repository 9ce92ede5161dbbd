"""Running a suite case by case, its operating metrics, and comparing two suite runs."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from cortex_ray._types import utcnow
from cortex_ray.evals._replay import decide_settings, run_case
from cortex_ray.evals._types import (
    CaseResult,
    EvalMode,
    EvalRun,
    EvalRunSummary,
    EvalSuite,
    RunComparison,
    SuiteMetrics,
)
from cortex_ray.models import ModelClient
from cortex_ray.settings import Settings

__all__ = ["compare_runs", "run_suite", "suite_metrics"]


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))
    return round(ordered[rank], 3)


def suite_metrics(results: Sequence[CaseResult]) -> SuiteMetrics:
    """Success, tool correctness, steps, model calls, tokens and decide latency of a run."""
    n = len(results)
    metrics = [r.outcome.metrics for r in results]
    decide = [m.decide_ms for m in metrics]
    return SuiteMetrics(
        cases=n,
        passed=sum(r.passed for r in results),
        success_rate=round(sum(r.passed for r in results) / n, 4) if n else 0.0,
        tool_correctness=round(statistics.fmean(m.tool_correctness for m in metrics), 4)
        if n
        else 0.0,
        mean_steps=round(statistics.fmean(m.steps for m in metrics), 3) if n else 0.0,
        model_calls=sum(m.model_calls for m in metrics),
        prompt_tokens=sum(m.prompt_tokens for m in metrics),
        completion_tokens=sum(m.completion_tokens for m in metrics),
        decide_ms_p50=_percentile(decide, 0.5),
        decide_ms_p95=_percentile(decide, 0.95),
        diverged=sum(r.outcome.divergence is not None for r in results),
        prompt_changes=sum(m.prompt_changes for m in metrics),
    )


async def run_suite(
    suite: EvalSuite,
    settings: Settings,
    *,
    org_id: str,
    mode: EvalMode = EvalMode.REPLAY,
    model: ModelClient | None = None,
    judge: ModelClient | None = None,
    created_by: str | None = None,
    overrides: dict[str, Any] | None = None,
) -> EvalRun:
    """Every case of ``suite``, one after the other (a live model is one line on a small
    machine); the run is returned, not stored."""
    if suite.version is None:
        raise ValueError("run a saved suite (it has no version yet)")
    decide_settings(settings, {}, overrides)  # a bad override is refused before any case
    started = utcnow()
    results = [
        await run_case(case, settings, mode=mode, model=model, judge=judge, overrides=overrides)
        for case in suite.cases
    ]
    metrics = suite_metrics(results)
    return EvalRun(
        org_id=org_id,
        suite=suite.name,
        suite_version=suite.version,
        mode=mode,
        model=model.name if model is not None else None,
        overrides=dict(overrides or {}),
        passed=metrics.passed,
        total=metrics.cases,
        metrics=metrics,
        created_by=created_by,
        started_at=started,
        finished_at=utcnow(),
        results=tuple(results),
    )


def compare_runs(a: EvalRun, b: EvalRun) -> RunComparison:
    """``b`` against ``a``, case by case (cases matched by name)."""
    in_a = {r.case: r for r in a.results}
    in_b = {r.case: r for r in b.results}
    both = [name for name in in_a if name in in_b]
    changed = []
    for name in both:
        ra, rb = in_a[name], in_b[name]
        ma, mb = ra.outcome.metrics, rb.outcome.metrics
        if (ra.passed, ma.steps, ma.tool_correctness) != (rb.passed, mb.steps, mb.tool_correctness):
            changed.append(
                {
                    "case": name,
                    "passed": [ra.passed, rb.passed],
                    "steps": [ma.steps, mb.steps],
                    "tool_correctness": [ma.tool_correctness, mb.tool_correctness],
                    "divergence": [
                        None if ra.outcome.divergence is None else ra.outcome.divergence.step_index,
                        None if rb.outcome.divergence is None else rb.outcome.divergence.step_index,
                    ],
                }
            )
    numeric = ("success_rate", "tool_correctness", "mean_steps", "model_calls", "prompt_tokens",
               "completion_tokens", "decide_ms_p50", "decide_ms_p95", "diverged")  # fmt: skip
    deltas = {
        k: round(float(getattr(b.metrics, k)) - float(getattr(a.metrics, k)), 4) for k in numeric
    }
    return RunComparison(
        a=EvalRunSummary(**a.model_dump(exclude={"results"})),
        b=EvalRunSummary(**b.model_dump(exclude={"results"})),
        fixed=tuple(n for n in both if not in_a[n].passed and in_b[n].passed),
        broken=tuple(n for n in both if in_a[n].passed and not in_b[n].passed),
        changed=tuple(changed),
        only_a=tuple(n for n in in_a if n not in in_b),
        only_b=tuple(n for n in in_b if n not in in_a),
        deltas=deltas,
    )
