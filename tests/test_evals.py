"""The evaluation harness (issue 14, point 6): runs become cases, cases replay.

A run is recorded through ``Runtime.run_autonomous`` on the embedded PostgreSQL (each step
keeps its working memory and model calls); the case made from it replays through the real
planner with today's settings. The tests show a replay that matches, one that diverges
where a changed setting changes a model call or a decision, a changed prompt counted but
not fatal, a live model answered by the recorded tool results, suites versioned, runs
compared, bad input refused; and the real path with the packaged SmolLM2 (live replay and
a model-scored check).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from pydantic import ValidationError

from cortex_ray import AgentMode, Runtime, Settings
from cortex_ray._exceptions import InvalidRequestError, NotFoundError
from cortex_ray.evals import (
    Called,
    EvalCase,
    EvalMode,
    EvalSuite,
    Judge,
    NoRepeats,
    ResultContains,
    SameDecisions,
    StatusIs,
    replay,
    run_case,
)
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import ChatRequest, HashEmbedder, ScriptedModelClient
from cortex_ray.storage import Database

OBJECTIVE = "Read the clock."


def call(tool: str, **args: Any) -> dict[str, Any]:
    return {"tool": tool, "args": args, "rationale": "r"}


def finish(message: str) -> dict[str, Any]:
    return {"finish": True, "message": message, "rationale": "r"}


def planner(plan: Callable[[int], list[dict[str, Any]]], best: int = 1) -> ScriptedModelClient:
    """Proposals by step; a choice (when asked) picks candidate ``best``."""
    state = {"step": -1}

    def respond(request: ChatRequest) -> str:
        if request.schema_name == "proposals":
            state["step"] += 1
            return json.dumps({"candidates": plan(state["step"])})
        if request.schema_name == "choice":
            assert request.response_schema is not None
            n = request.response_schema["properties"]["assessments"]["minItems"]
            return json.dumps({"assessments": ["a"] * n, "best": best})
        raise AssertionError(f"unexpected call {request.schema_name}")

    return ScriptedModelClient(responder=respond)


def recorded_plan(step: int) -> list[dict[str, Any]]:
    if step == 0:  # two ideas; the choice takes the second (not the planner's first)
        return [call("memory_search", query="clock"), call("current_time")]
    if step == 1:
        return [call("remember_fact", subject="clock", fact="the clock was read")]
    return [finish("I read the clock and stored that I did.")]


@pytest.fixture
async def runtime(db: Database, settings: Settings) -> AsyncIterator[Callable[..., Any]]:
    opened: list[Runtime] = []

    async def make(model: ScriptedModelClient | None, **changes: Any) -> Runtime:
        update = {"embedding_backend": "hash", "evaluation": "choice", "candidates": 3, **changes}
        rt = await Runtime.open(
            settings.model_copy(update=update),
            model=model,
            embedder=HashEmbedder(384),
            importance=HeuristicImportanceScorer(),
            db=db,
        )
        opened.append(rt)
        return rt

    yield make
    for rt in opened:
        await rt.close(close_db=False)


async def recorded_case(rt: Runtime, org: str, **checks: Any) -> EvalCase:
    agent = await rt.create_agent(org, "clock", mode=AgentMode.AUTONOMOUS)
    run = await rt.run_autonomous(org, agent.id, OBJECTIVE)
    assert run.status.value == "COMPLETED", run.reason
    return await rt.eval_case_from_run(org, run.id, name="clock")


async def test_a_run_keeps_its_steps_recordings(runtime, org) -> None:
    rt = await runtime(planner(recorded_plan))
    agent = await rt.create_agent(org, "clock", mode=AgentMode.AUTONOMOUS)
    run = await rt.run_autonomous(org, agent.id, OBJECTIVE)
    # The step log a person reads is without the recordings ...
    assert all(s.recording is None for s in (await rt.get_run(org, run.id)).steps)
    assert "recording" not in run.steps[0].model_dump()
    # ... which are kept beside it.
    recorded = await rt.store.get_run(org, run.id, recordings=True)
    first, second, last = (s.recording for s in recorded.steps)
    assert first is not None and second is not None and last is not None
    assert [c.schema_name for c in first.model_calls] == ["proposals", "choice"]
    assert [c.schema_name for c in second.model_calls] == ["proposals"]
    assert first.wm.objective == OBJECTIVE and first.wm.observations == ()
    assert second.wm.step_index == 1 and first.model_calls[0].model == "scripted"
    assert len(first.model_calls[0].request_sha256) == 64


async def test_a_case_from_a_run_replays_as_recorded(runtime, org) -> None:
    rt = await runtime(planner(recorded_plan))
    case = await recorded_case(rt, org)
    assert [s.tool for s in case.cassette.steps] == ["current_time", "remember_fact", None]
    assert case.checks == (StatusIs(equals=case.cassette.status), SameDecisions())

    result = await run_case(case, rt.settings)
    assert result.passed, result.verdicts
    outcome = result.outcome
    assert outcome.divergence is None and outcome.status is not None
    assert outcome.result == "I read the clock and stored that I did."
    assert all(s.matched for s in outcome.steps)
    assert outcome.metrics.model_calls == 4 and outcome.metrics.prompt_changes == 0
    assert outcome.metrics.tool_correctness == 1.0


async def test_a_changed_evaluation_setting_diverges_at_the_model_call(runtime, org) -> None:
    rt = await runtime(planner(recorded_plan))
    case = await recorded_case(rt, org)
    # The case replays under the settings it was recorded with, unless told otherwise.
    assert case.cassette.settings["evaluation"] == "choice"
    assert (await run_case(case, rt.settings.model_copy(update={"evaluation": "scores"}))).passed
    result = await run_case(case, rt.settings, overrides={"evaluation": "scores"})
    assert not result.passed
    divergence = result.outcome.divergence
    assert divergence is not None and divergence.step_index == 0
    assert divergence.what == "model_call"
    assert "choice" in divergence.recorded and "scores" in divergence.replayed
    same = next(v for v in result.verdicts if v.kind == "same_decisions")
    assert same.passed is False and same.detail.startswith("step 1 (model_call)")


async def test_a_changed_planner_setting_diverges_at_the_decision(runtime, org) -> None:
    rt = await runtime(planner(recorded_plan))
    case = await recorded_case(rt, org)
    # K=1: the planner takes its first idea, memory_search, where the choice took current_time.
    result = await run_case(case, rt.settings, overrides={"candidates": 1})
    divergence = result.outcome.divergence
    assert divergence is not None and divergence.what == "decision"
    assert divergence.recorded.startswith("current_time:")
    assert divergence.replayed.startswith("memory_search:")
    assert result.outcome.stopped is not None and not result.passed
    assert [s.matched for s in result.outcome.steps] == [False]


async def test_a_changed_prompt_is_counted_and_the_recorded_answers_still_given(
    runtime, org
) -> None:
    rt = await runtime(planner(recorded_plan))
    case = await recorded_case(rt, org)
    result = await run_case(case, rt.settings, overrides={"show_action_space": False})
    assert result.passed  # same outputs, same decisions
    assert result.outcome.metrics.prompt_changes >= 3  # every proposal's prompt changed


async def test_a_live_model_is_answered_by_the_recorded_results(runtime, org) -> None:
    rt = await runtime(planner(recorded_plan))
    case = await recorded_case(rt, org)
    checks = (StatusIs(equals=case.cassette.status), SameDecisions(), Called(tool="remember_fact"))
    case = case.model_copy(update={"checks": checks})

    def skips_the_fact(step: int) -> list[dict[str, Any]]:
        return [call("current_time")] if step == 0 else [finish("It is now.")]

    new_model = planner(skips_the_fact)
    result = await run_case(case, rt.settings, mode=EvalMode.LIVE, model=new_model)
    outcome = result.outcome
    assert outcome.status is not None and outcome.status.value == "COMPLETED"
    assert outcome.result == "It is now."
    assert [s.matched for s in outcome.steps] == [True, False]
    assert outcome.divergence is not None and outcome.divergence.step_index == 1
    assert outcome.metrics.tool_correctness == 0.5  # current_time of the two recorded calls
    verdicts = {v.kind: v.passed for v in result.verdicts}
    assert verdicts == {"status": True, "same_decisions": False, "called": False}
    # No tool ran: the recorded result answered current_time (its output is the recording's).
    recorded_time = case.cassette.steps[0].observation
    assert recorded_time is not None
    prompt = new_model.requests[-1].messages
    assert any(str(recorded_time.summary)[:20] in (m.content or "") for m in prompt)


async def test_a_live_call_the_recording_never_made_ends_the_case(runtime, org) -> None:
    rt = await runtime(planner(recorded_plan))
    case = await recorded_case(rt, org)
    wanders = planner(lambda step: [call("memory_search", query="somewhere else")])
    outcome = await replay(case.cassette, rt.settings, mode=EvalMode.LIVE, model=wanders)
    assert outcome.status is None and outcome.stopped is not None
    assert "was never called in the recording" in outcome.stopped
    assert outcome.divergence is not None and outcome.divergence.step_index == 0
    with pytest.raises(ValueError, match="needs a model"):
        await replay(case.cassette, rt.settings, mode=EvalMode.LIVE)


async def test_suites_are_versioned_runs_stored_and_compared(runtime, org) -> None:
    rt = await runtime(planner(recorded_plan))
    case = await recorded_case(rt, org)
    extra = case.model_copy(
        update={
            "name": "clock-no-repeats",
            "checks": (NoRepeats(), ResultContains(values=("clock",))),
        }
    )
    first = await rt.save_eval_suite(org, EvalSuite(name="regress", cases=(case,)))
    assert first.version == 1
    again = await rt.save_eval_suite(org, EvalSuite(name="regress", cases=(case,)))
    assert again.version == 1  # the same cases are the same version
    second = await rt.add_eval_case(org, "regress", extra)
    assert second.version == 2 and [c.name for c in second.cases] == ["clock", "clock-no-repeats"]
    assert [c.name for c in (await rt.get_eval_suite(org, "regress", version=1)).cases] == ["clock"]
    (listed,) = await rt.list_eval_suites(org)
    assert (listed.name, listed.version, listed.cases) == ("regress", 2, 2)

    good = await rt.run_eval_suite(org, "regress")
    assert (good.passed, good.total, good.metrics.success_rate) == (2, 2, 1.0)
    stored = await rt.get_eval_run(org, good.id)
    assert stored.results == good.results and stored.suite_version == 2

    # The same suite against a changed planner (K=1): the recorded case breaks. A runtime
    # without a model replays it (nothing asks a model).
    changed = await runtime(None)
    bad = await changed.run_eval_suite(org, "regress", overrides={"candidates": 1})
    assert bad.passed < bad.total
    comparison = await rt.compare_eval_runs(org, good.id, bad.id)
    assert "clock" in comparison.broken and comparison.fixed == ()
    assert comparison.deltas["success_rate"] < 0
    assert [r.id for r in await rt.list_eval_runs(org, suite="regress")] == [bad.id, good.id]

    with pytest.raises(NotFoundError):
        await rt.get_eval_suite(org, "regress", version=9)
    with pytest.raises(InvalidRequestError, match="needs a model"):
        await changed.run_eval_suite(org, "regress", mode=EvalMode.LIVE)
    with pytest.raises(InvalidRequestError, match="not a setting a replay can change"):
        await changed.run_eval_suite(org, "regress", overrides={"model_name": "x"})
    with pytest.raises(InvalidRequestError, match="candidates"):
        await changed.run_eval_suite(org, "regress", overrides={"candidates": 0})
    assert len(await rt.list_eval_runs(org, suite="regress")) == 2  # nothing stored for those


async def test_bad_cases_and_suites_are_refused_with_the_reason(runtime, org) -> None:
    rt = await runtime(planner(recorded_plan))
    case = await recorded_case(rt, org)
    with pytest.raises(ValidationError, match="appears twice"):
        EvalSuite(name="dup", cases=(case, case))
    with pytest.raises(ValidationError, match="suite name"):
        EvalSuite(name="no spaces", cases=(case,))
    with pytest.raises(ValidationError, match="not a regular expression"):
        EvalCase.model_validate(
            {**case.model_dump(), "checks": [{"kind": "result_matches", "pattern": "("}]}
        )
    with pytest.raises(ValidationError):
        EvalCase.model_validate({**case.model_dump(), "checks": [{"kind": "no_such_check"}]})

    # A run recorded with record_decisions off cannot be a case, and says why.
    quiet = await runtime(planner(recorded_plan), record_decisions=False)
    agent = await quiet.create_agent(org, "quiet", mode=AgentMode.AUTONOMOUS)
    run = await quiet.run_autonomous(org, agent.id, OBJECTIVE)
    with pytest.raises(InvalidRequestError, match="has no recording"):
        await quiet.eval_case_from_run(org, run.id)
    # Nor can a run still running.
    started = await rt.start_run(org, agent.id, OBJECTIVE)
    with pytest.raises(InvalidRequestError, match="still RUNNING"):
        await rt.eval_case_from_run(org, started.id)


# --- the real path: the packaged model -----------------------------------------------------


async def test_a_live_replay_and_a_judge_with_the_packaged_model(runtime, org, smollm2) -> None:
    rt = await runtime(planner(recorded_plan))
    case = await recorded_case(rt, org)
    case = case.model_copy(
        update={"checks": (Judge(rubric="The answer says the clock was read."),)}
    )
    result = await run_case(case, rt.settings, mode=EvalMode.LIVE, model=smollm2, judge=smollm2)
    outcome = result.outcome
    # Whatever SmolLM2 decides, it decided: its calls were made and counted, each step
    # compared with the recording, and the judge gave a verdict with its reason.
    assert outcome.metrics.model_calls >= 1 and outcome.metrics.completion_tokens > 0
    assert outcome.steps and outcome.steps[0].step_index == 0
    (verdict,) = result.verdicts
    assert verdict.kind == "judge"
    if outcome.result is not None:
        assert isinstance(verdict.passed, bool) and verdict.detail.startswith(smollm2.name)
    skipped = await run_case(case, rt.settings)
    assert skipped.verdicts[0].passed is None and "no judge" in skipped.verdicts[0].detail


async def test_a_run_that_ran_out_of_budget_replays_to_the_same_end(runtime, org) -> None:
    def searches(step: int) -> list[dict[str, Any]]:
        return [call("memory_search", query=f"clock {'abc'[step]}")]

    rt = await runtime(planner(searches))
    agent = await rt.create_agent(org, "searcher", mode=AgentMode.AUTONOMOUS)
    run = await rt.run_autonomous(org, agent.id, OBJECTIVE, max_steps=2)
    assert run.status.value == "FAILED" and "budget" in (run.reason or "")
    case = await rt.eval_case_from_run(org, run.id)
    result = await run_case(case, rt.settings)
    assert result.passed, result.verdicts
    assert result.outcome.status is not None and result.outcome.status.value == "FAILED"
    assert [s.tool for s in result.outcome.steps] == ["memory_search", "memory_search"]
