"""A replay's outcome checked against its case's checks (``check_outcome``): exact checks
on the result, the calls and the steps, and a judge model's verdict for a rubric."""

from __future__ import annotations

import re
from typing import Any

from cortex_ray._exceptions import ModelError
from cortex_ray.evals._types import (
    Called,
    Check,
    CheckVerdict,
    EvalCase,
    Judge,
    MaxSteps,
    NoRepeats,
    NotCalled,
    ReplayedStep,
    ReplayOutcome,
    ResultContains,
    ResultMatches,
    SameDecisions,
    StatusIs,
    call_key,
)
from cortex_ray.models import ChatMessage, ModelClient, structured_call

__all__ = ["JUDGE_SCHEMA", "check_outcome"]


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
