"""Replaying a cassette through the real planner, and checking what came out.

The replay drives ``AutonomousDriver.decide`` step by step on the working memory each
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

import re
import time
from collections import Counter
from typing import Any

from pydantic import ConfigDict, create_model

from cortex_ray._exceptions import CortexError, ModelError
from cortex_ray._types import (
    Decision,
    DecisionKind,
    ModelExchange,
    Observation,
    RunStatus,
    TaskRun,
)
from cortex_ray.decide import AutonomousDriver
from cortex_ray.decide._critic import Critic
from cortex_ray.evals._types import (
    Called,
    CaseMetrics,
    CaseResult,
    Cassette,
    Check,
    CheckVerdict,
    Divergence,
    EvalCase,
    EvalMode,
    Judge,
    MaxSteps,
    NoRepeats,
    NotCalled,
    RecordedStep,
    ReplayedStep,
    ReplayOutcome,
    ResultContains,
    ResultMatches,
    SameDecisions,
    StatusIs,
    call_key,
)
from cortex_ray.models import (
    ChatMessage,
    ChatRequest,
    ChatResponse,
    ModelClient,
    RecordingModelClient,
    ToolCall,
    Usage,
    recording,
    request_digest,
    structured_call,
)
from cortex_ray.perceive import PromptComposer
from cortex_ray.settings import DECIDE_SETTINGS, Settings, setting_field

__all__ = [
    "CassettePlayer",
    "ReplayDivergence",
    "cassette_from_run",
    "check_outcome",
    "decide_settings",
    "replay",
    "run_case",
]


class ReplayDivergence(CortexError):
    """The decision asked its model for a call the recording does not have."""

    def __init__(self, recorded: str, replayed: str) -> None:
        super().__init__(f"the recording has {recorded}; the replay asked for {replayed}")
        self.recorded = recorded
        self.replayed = replayed


class CassettePlayer:
    """A ``ModelClient`` answering one step's model calls from their recording, in order."""

    def __init__(self, calls: tuple[ModelExchange, ...]) -> None:
        self._calls = calls
        self._next = 0
        self.prompt_changes = 0

    @property
    def name(self) -> str:
        return self._calls[0].model if self._calls and self._calls[0].model else "cassette"

    @property
    def supports_json_schema(self) -> bool:
        return self._calls[0].constrained if self._calls else True

    @property
    def used(self) -> tuple[ModelExchange, ...]:
        """The recorded calls given so far."""
        return self._calls[: self._next]

    async def chat(self, request: ChatRequest) -> ChatResponse:
        kind = request.schema_name if request.response_schema is not None else "text"
        if self._next >= len(self._calls):
            raise ReplayDivergence(
                f"{len(self._calls)} model call(s) in this step", f"one more ({kind})"
            )
        recorded = self._calls[self._next]
        if recorded.schema_name != kind:
            raise ReplayDivergence(
                f"call {self._next + 1} as {recorded.schema_name}", f"{kind} instead"
            )
        self._next += 1
        if request_digest(request) != recorded.request_sha256:
            self.prompt_changes += 1
        return ChatResponse(
            content=recorded.content,
            tool_calls=tuple(
                ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in recorded.tool_calls
            ),
            finish_reason=recorded.finish_reason,
            usage=Usage(
                prompt_tokens=recorded.prompt_tokens,
                completion_tokens=recorded.completion_tokens,
            ),
        )

    async def aclose(self) -> None:
        return None


def cassette_from_run(run: TaskRun) -> Cassette:
    """The cassette of a run read with its recordings (``Store.get_run(..., recordings=True)``).

    Raises ``ValueError`` for a run that cannot be one: still running, or with a step that
    has no recording (``record_decisions`` was off, or the step predates migration 0008)."""
    if not run.status.ended:
        raise ValueError(f"run {run.id} is still {run.status.value}: a case is a run that ended")
    if not run.steps:
        raise ValueError(f"run {run.id} has no steps")
    steps: list[RecordedStep] = []
    for step in run.steps:
        if step.recording is None:
            raise ValueError(
                f"run {run.id}, step {step.step_index + 1} has no recording (made with "
                "record_decisions off, or before recordings were kept)"
            )
        failed = step.decision is DecisionKind.FINISH and run.status is RunStatus.FAILED
        steps.append(
            RecordedStep(
                step_index=step.step_index,
                wm=step.recording.wm,
                model_calls=step.recording.model_calls,
                decision=step.decision,
                tool=step.action.tool if step.action is not None else None,
                args=step.action.args if step.action is not None else {},
                message=step.message,
                failed=failed,
                observation=step.observation,
                decide_ms=step.recording.decide_ms,
            )
        )
    models = [c.model for s in steps for c in s.model_calls if c.model]
    first = run.steps[0].recording
    return Cassette(
        settings=dict(first.settings) if first is not None else {},
        source_run=run.id,
        source_org=run.org_id,
        agent_name=steps[0].wm.agent_name,
        objective=run.objective(),
        max_steps=run.max_steps,
        status=run.status,
        result=run.result,
        model=models[0] if models else "",
        steps=tuple(steps),
    )


def _driver(model: ModelClient, settings: Settings) -> AutonomousDriver:
    composer = PromptComposer(
        show_action_space=settings.decide.show_action_space,
        earlier_chars=settings.decide.progress_earlier_chars,
    )
    retries = settings.models.structured_retries
    critic = Critic(model, composer, structured_retries=retries, independent=False)
    return AutonomousDriver(
        model, composer, settings.decide, structured_retries=retries, critic=critic
    )


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
    live = RecordingModelClient(model) if model is not None else None
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
        client: ModelClient | None = player if mode is EvalMode.REPLAY else live
        assert client is not None
        started = time.perf_counter()
        with recording() as tape:
            try:
                decision = await _driver(client, settings).decide(wm)
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


# --- checks ------------------------------------------------------------------------------

JUDGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "reason": {"type": "string", "maxLength": 400},
        "meets": {"type": "boolean"},
    },
    "required": ["reason", "meets"],
    "additionalProperties": False,
}


def _subset(wanted: dict[str, Any], args: dict[str, Any]) -> bool:
    return all(k in args and args[k] == v for k, v in wanted.items())


async def _judge(
    check: Judge, case: EvalCase, outcome: ReplayOutcome, judge: ModelClient | None
) -> CheckVerdict:
    if judge is None:
        return CheckVerdict(kind=check.kind, passed=None, detail="skipped: no judge model")
    calls = "\n".join(
        f"{i}. {s.tool}({s.args}) -> {s.observation_status}"
        for i, s in enumerate(outcome.calls(), 1)
    )
    prompt = (
        f"Objective: {case.cassette.objective}\n\nCalls made:\n{calls or '(none)'}\n\n"
        f"Final result: {outcome.result if outcome.result is not None else '(none)'}\n\n"
        f"Criterion: {check.rubric}\n\nDoes the final result meet the criterion? Give a short "
        "reason, then true or false."
    )
    messages = (
        ChatMessage(role="system", content="You grade an agent's result against a criterion."),
        ChatMessage(role="user", content=prompt),
    )

    def parse(raw: Any) -> tuple[bool, str]:
        if not isinstance(raw, dict) or not isinstance(raw.get("meets"), bool):
            raise ValueError('expected {"reason": ..., "meets": true|false}')
        return raw["meets"], str(raw.get("reason", ""))[:400]

    try:
        meets, reason = await structured_call(
            judge,
            list(messages),
            schema=JUDGE_SCHEMA,
            validate=parse,
            schema_name="judgement",
            retries=2,
        )
    except ModelError as exc:
        return CheckVerdict(kind=check.kind, passed=False, detail=f"the judge failed: {exc}")
    return CheckVerdict(kind=check.kind, passed=meets, detail=f"{judge.name}: {reason}")


async def check_outcome(
    case: EvalCase, outcome: ReplayOutcome, *, judge: ModelClient | None = None
) -> list[CheckVerdict]:
    """Each of the case's checks against the replay's outcome."""
    verdicts: list[CheckVerdict] = []
    text = outcome.result or ""
    calls = outcome.calls()
    for check in case.checks:
        verdicts.append(await _verdict(check, case, outcome, text, calls, judge))
    return verdicts


async def _verdict(
    check: Check,
    case: EvalCase,
    outcome: ReplayOutcome,
    text: str,
    calls: list[ReplayedStep],
    judge: ModelClient | None,
) -> CheckVerdict:
    def verdict(passed: bool, detail: str) -> CheckVerdict:
        return CheckVerdict(kind=check.kind, passed=passed, detail=detail)

    got = outcome.status.value if outcome.status is not None else f"none ({outcome.stopped})"
    match check:
        case StatusIs():
            return verdict(outcome.status is check.equals, f"want {check.equals.value}, got {got}")
        case ResultContains():
            hay = text if check.case_sensitive else text.casefold()
            missing = [
                v for v in check.values if (v if check.case_sensitive else v.casefold()) not in hay
            ]
            return verdict(not missing, f"missing {missing}" if missing else "all present")
        case ResultMatches():
            found = re.search(check.pattern, text) is not None
            return verdict(found, "matches" if found else f"no match for {check.pattern!r}")
        case Called():
            hit = any(s.tool == check.tool and _subset(check.args, s.args) for s in calls)
            return verdict(hit, "called" if hit else f"no call of {check.tool} with {check.args}")
        case NotCalled():
            hit = any(s.tool == check.tool for s in calls)
            return verdict(not hit, f"{check.tool} was called" if hit else "not called")
        case MaxSteps():
            n = len(outcome.steps)
            return verdict(n <= check.value, f"{n} steps (at most {check.value})")
        case NoRepeats():
            keys = [call_key(s.tool or "", s.args) for s in calls]
            twice = sorted({k for k in keys if keys.count(k) > 1})
            return verdict(not twice, f"repeated {twice}" if twice else "no call made twice")
        case SameDecisions():
            d = outcome.divergence
            if d is None:
                return verdict(True, "every decision as recorded")
            return verdict(
                False,
                f"step {d.step_index + 1} ({d.what}): recorded {d.recorded}; now {d.replayed}",
            )
        case Judge():
            return await _judge(check, case, outcome, judge)
    raise AssertionError(f"unhandled check {check!r}")  # pragma: no cover


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
