"""Replaying a cassette through the real planner, and running a case (replay, then
``check_outcome``).

The replay drives ``AutonomousDriver.decide`` (built by ``cortex_ray.cycle.build_drivers``,
as the runtime builds it) step by step on the working memory each
recorded step saw, with the observations rebuilt from the replay's own steps: the prompt
composer, the planner and the settings are today's, so a change to any of them shows in
the replay. In ``replay`` mode a ``CassettePlayer`` answers the model calls with the
recorded outputs, in order; a call the recording does not have (another kind, or one more)
ends the case at that step, and so does a decision that differs from the recorded one (the
outputs after it would answer questions nobody asked). A request that differs from the
recorded one (another prompt) is counted, not fatal: the recorded answer is still given.
In ``live`` mode a model answers; the recorded results answer the tools (looked up by tool
and arguments); a call the recording never made ends the case.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from pydantic import ConfigDict, create_model

from cortex_ray._exceptions import ModelError
from cortex_ray._types import Decision, DecisionKind, Observation, RunStatus
from cortex_ray.cycle import build_drivers
from cortex_ray.evals._cassette import CassettePlayer, ReplayDivergence
from cortex_ray.evals._checks import check_outcome
from cortex_ray.evals._types import (
    CaseMetrics,
    CaseResult,
    Cassette,
    Divergence,
    EvalCase,
    EvalMode,
    RecordedStep,
    ReplayedStep,
    ReplayOutcome,
    call_key,
)
from cortex_ray.models import ModelClient, recording
from cortex_ray.settings import DECIDE_SETTINGS, Settings, setting_field

__all__ = ["decide_settings", "replay", "run_case"]


def _said(decision: Decision) -> str:
    if decision.kind is DecisionKind.ACT and decision.action is not None:
        return call_key(decision.action.tool, decision.action.args)
    return f"finish{' (failed)' if decision.failed else ''}: {decision.message or decision.reason}"


def _recorded_said(step: RecordedStep) -> str:
    if step.decision is DecisionKind.ACT and step.tool is not None:
        return call_key(step.tool, step.args)
    return f"finish{' (failed)' if step.failed else ''}: {step.message or ''}"


def _same(decision: Decision, step: RecordedStep) -> bool:
    if decision.kind is not step.decision:
        return False
    if decision.kind is DecisionKind.ACT:
        return decision.action is not None and (
            call_key(decision.action.tool, decision.action.args)
            == call_key(step.tool or "", step.args)
        )
    return decision.failed == step.failed and (decision.failed or decision.message == step.message)


def _tool_correctness(recorded: list[str], made: list[str]) -> float:
    if not recorded and not made:
        return 1.0
    both = sum((Counter(recorded) & Counter(made)).values())
    return both / max(len(recorded), len(made))


_DecideSettings = create_model(  # the DECIDE settings' own types and bounds, for overrides
    "DecideSettings",
    __config__=ConfigDict(extra="forbid"),
    **{k: (setting_field(k).annotation, setting_field(k)) for k in DECIDE_SETTINGS},  # type: ignore[call-overload]
)


def decide_settings(
    settings: Settings, recorded: dict[str, Any], overrides: dict[str, Any] | None = None
) -> Settings:
    """``settings`` with the recorded DECIDE settings, then ``overrides`` (validated: only
    ``DECIDE_SETTINGS``, each of its type), on top."""
    unknown = sorted(set(overrides or {}) - set(DECIDE_SETTINGS))
    if unknown:
        raise ValueError(
            f"not a setting a replay can change: {', '.join(unknown)} "
            f"(these can: {', '.join(DECIDE_SETTINGS)})"
        )
    update = {k: v for k, v in recorded.items() if k in DECIDE_SETTINGS}
    # Each of its type and within the bounds the settings define (K >= 1, ...).
    update |= _DecideSettings.model_validate(overrides or {}).model_dump(exclude_unset=True)
    return settings.model_copy(update=update)


async def replay(
    cassette: Cassette,
    settings: Settings,
    *,
    mode: EvalMode = EvalMode.REPLAY,
    model: ModelClient | None = None,
    overrides: dict[str, Any] | None = None,
) -> ReplayOutcome:
    """Replay ``cassette``'s decisions (see the module docstring) under the settings it was
    recorded with, ``overrides`` on top."""
    if mode is EvalMode.LIVE and model is None:
        raise ValueError("a live replay needs a model")
    settings = decide_settings(settings, cassette.settings, overrides)
    recorded = cassette.steps
    results = {
        call_key(s.tool, s.args): s.observation
        for s in recorded
        if s.tool is not None and s.observation is not None
    }
    observations: list[Observation] = []
    replayed: list[ReplayedStep] = []
    divergence: Divergence | None = None
    stopped: str | None = None
    status: RunStatus | None = None
    result: str | None = None
    metrics: dict[str, Any] = {
        "model_calls": 0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "decide_ms": 0.0,
        "prompt_changes": 0,
    }
    for index in range(cassette.max_steps):
        step = recorded[index] if index < len(recorded) else None
        if step is None and mode is EvalMode.REPLAY:
            divergence = divergence or Divergence(
                step_index=index,
                what="recording_ended",
                recorded=f"{len(recorded)} steps",
                replayed="another step",
            )
            stopped = f"step {index + 1}: the recording ends at step {len(recorded)}"
            break
        base = (step or recorded[-1]).wm
        wm = base.model_copy(update={"observations": tuple(observations), "step_index": index})
        player = CassettePlayer(step.model_calls) if step is not None else None
        # The drivers production builds (``build_drivers``): in replay mode the cassette's
        # player answers, unrecorded (its calls are the recording's own); live, the model
        # answers through the recorder, as in a run.
        if mode is EvalMode.REPLAY:
            assert player is not None
            driver = build_drivers(settings, player, recorded=False).autonomous
        else:
            driver = build_drivers(settings, model).autonomous
        started = time.perf_counter()
        with recording() as tape:
            try:
                decision = await driver.decide(wm)
            except ReplayDivergence as exc:
                divergence = Divergence(
                    step_index=index,
                    what="model_call",
                    recorded=exc.recorded,
                    replayed=exc.replayed,
                )
                stopped = f"step {index + 1}: {exc}"
                break
        metrics["decide_ms"] += (time.perf_counter() - started) * 1000
        calls = list(tape)
        if player is not None and mode is EvalMode.REPLAY:
            calls = list(player.used)
            metrics["prompt_changes"] += player.prompt_changes
        metrics["model_calls"] += len(calls)
        metrics["prompt_tokens"] += sum(c.prompt_tokens for c in calls)
        metrics["completion_tokens"] += sum(c.completion_tokens for c in calls)
        matched = step is not None and _same(decision, step)
        if not matched and divergence is None:
            divergence = Divergence(
                step_index=index,
                what="decision",
                recorded=_recorded_said(step) if step is not None else "(no step)",
                replayed=_said(decision),
            )
        action = decision.action if decision.kind is DecisionKind.ACT else None
        observation: Observation | None = None
        if action is not None:
            found = step.observation if matched and step is not None else None
            found = found or results.get(call_key(action.tool, action.args))
            if found is not None:
                observation = found.model_copy(update={"step_index": index})
        replayed.append(
            ReplayedStep(
                step_index=index,
                decision=decision.kind,
                tool=action.tool if action is not None else None,
                args=action.args if action is not None else {},
                message=decision.message if action is None else None,
                note=decision.reason,
                matched=matched,
                observation_status=observation.status.value if observation is not None else None,
            )
        )
        if not matched and mode is EvalMode.REPLAY:
            stopped = f"step {index + 1}: the decision differs from the recording"
            break
        if action is None:
            status = RunStatus.FAILED if decision.failed else RunStatus.COMPLETED
            result = None if decision.failed else decision.message
            break
        if observation is None:
            divergence = divergence or Divergence(
                step_index=index,
                what="unrecorded_call",
                recorded="no such call",
                replayed=call_key(action.tool, action.args),
            )
            stopped = (
                f"step {index + 1}: {call_key(action.tool, action.args)} was never called in "
                "the recording, so it has no result to give"
            )
            break
        observations.append(observation)
        ended = index == len(recorded) - 1 < cassette.max_steps - 1
        if matched and ended and cassette.status in (RunStatus.FAILED, RunStatus.CANCELLED):
            # The run ended after this call before its budget did (a call refused as
            # invalid, a cancel): the same call ends the replay the same way.
            status = cassette.status
            break
    else:
        status = RunStatus.FAILED  # the budget ran out, as the run itself would end
    made = [call_key(s.tool, s.args) for s in replayed if s.tool is not None]
    return ReplayOutcome(
        status=status,
        result=result,
        stopped=stopped,
        divergence=divergence,
        steps=tuple(replayed),
        metrics=CaseMetrics(
            steps=len(replayed),
            model_calls=metrics["model_calls"],
            prompt_tokens=metrics["prompt_tokens"],
            completion_tokens=metrics["completion_tokens"],
            decide_ms=round(metrics["decide_ms"], 3),
            tool_correctness=round(_tool_correctness(cassette.recorded_calls(), made), 4),
            prompt_changes=metrics["prompt_changes"],
        ),
    )


async def run_case(
    case: EvalCase,
    settings: Settings,
    *,
    mode: EvalMode = EvalMode.REPLAY,
    model: ModelClient | None = None,
    judge: ModelClient | None = None,
    overrides: dict[str, Any] | None = None,
) -> CaseResult:
    """Replay one case and check it; a model error ends the case failed, with the error."""
    try:
        outcome = await replay(case.cassette, settings, mode=mode, model=model, overrides=overrides)
    except ModelError as exc:
        outcome = ReplayOutcome(status=None, stopped=f"the model failed: {exc}")
        return CaseResult(
            case=case.name, passed=False, verdicts=(), outcome=outcome, error=str(exc)
        )
    verdicts = await check_outcome(case, outcome, judge=judge)
    passed = all(v.passed is not False for v in verdicts)
    return CaseResult(case=case.name, passed=passed, verdicts=tuple(verdicts), outcome=outcome)
