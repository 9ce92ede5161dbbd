"""A planner that uses what it sees (issue 14, point 3).

- the prompt tells the planner which calls it already made, with their arguments, and marks
  a repeated call; earlier results are cut so a run's prompt stays bounded;
- a candidate that repeats an earlier call is flagged, never chosen over a new one, and when
  every candidate repeats, the planner is asked once more;
- scores that carry no judgement (all equal, or numbered in proposal order) are not used,
  and the step log says so (``Step.note``);
- a run does not recall its own steps' memories (they are in its progress already), so
  recalled memories cannot nest earlier results into every prompt.

Unit tests drive the real ``AutonomousDriver`` with a scripted model; the run tests go
through ``Runtime.run_autonomous`` on the embedded PostgreSQL.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from cortex_ray import (
    ActionType,
    AgentMode,
    DecisionKind,
    Observation,
    ObservationStatus,
    Runtime,
    Settings,
    ToolSpec,
)
from cortex_ray._types import MemorySnapshot, WorkingMemory
from cortex_ray.decide import AutonomousDriver
from cortex_ray.decide._proposals import nothing_left, proposal_schema
from cortex_ray.decide._selecting import no_judgement
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import ChatRequest, HashEmbedder, ScriptedModelClient
from cortex_ray.perceive import PromptComposer
from cortex_ray.storage import Database

TIME = ToolSpec(
    name="current_time",
    description="Read the current date and time (UTC).",
    action_type=ActionType.GROUNDING,
)
SEARCH = ToolSpec(
    name="memory_search",
    description="Search your memory.",
    parameters={
        "type": "object",
        "properties": {"query": {"type": "string", "minLength": 1}},
        "required": ["query"],
        "additionalProperties": False,
    },
    action_type=ActionType.RETRIEVAL,
)
REMEMBER = ToolSpec(
    name="remember_fact",
    description="Store a fact.",
    parameters={
        "type": "object",
        "properties": {"fact": {"type": "string"}},
        "required": ["fact"],
        "additionalProperties": False,
    },
    action_type=ActionType.LEARNING,
)
NOW = datetime(2026, 12, 1, 15, 0, tzinfo=UTC)


def observed(tool: str, args: dict[str, Any], summary: str, step: int) -> Observation:
    return Observation(
        tool=tool,
        action_type=ActionType.GROUNDING,
        status=ObservationStatus.OK,
        summary=summary,
        args=args,
        step_index=step,
    )


def wm(*observations: Observation) -> WorkingMemory:
    return WorkingMemory(
        mode=AgentMode.AUTONOMOUS,
        agent_name="Ada",
        persona="",
        objective="Tell me the time.",
        snapshot=MemorySnapshot(query="time", recalled=(), taken_at=NOW),
        action_space=(TIME, SEARCH),
        observations=observations,
        step_index=len(observations),
        max_steps=6,
    )


def proposals(*candidates: dict[str, Any]) -> str:
    return json.dumps({"candidates": list(candidates)})


def call(tool: str, **args: Any) -> dict[str, Any]:
    return {"tool": tool, "args": args, "rationale": "r"}


def finish(message: str) -> dict[str, Any]:
    return {"finish": True, "message": message, "rationale": "r"}


def scores(*values: float) -> str:
    return json.dumps({"scores": list(values)})


def driver(model: ScriptedModelClient, **settings: Any) -> AutonomousDriver:
    """The driver with K=3 and 0-10 scores (the choice mode has tests of its own below)."""
    update = {"candidates": 3, "evaluation": "scores", **settings}
    tuned = Settings().model_copy(update=update)
    return AutonomousDriver(
        model,
        PromptComposer(),
        tuned.decide,
        structured_retries=tuned.models.structured_retries,
    )


TIME_SEEN = observed("current_time", {}, '{"utc": "2026-12-01T15:00:00+00:00"}', 0)


# --- scores without judgement ------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "why"),
    [
        ([1, 2, 3], "follow the proposal order (1, 2, 3)"),
        ([9, 8, 7], "follow the proposal order"),
        ([2, 4, 6, 8], "follow the proposal order"),
        ([5, 5], "every candidate scored 5"),
        ([7, 7, 7], "every candidate scored 7"),
    ],
)
def test_scores_that_only_number_the_list_carry_no_judgement(values: list[float], why: str) -> None:
    found = no_judgement([float(v) for v in values])
    assert found is not None and why in found


@pytest.mark.parametrize("values", [[3, 9], [9, 3], [1, 2, 4], [8, 9, 2], [10, 0, 5]])
def test_scores_that_might_judge_are_used(values: list[float]) -> None:
    assert no_judgement([float(v) for v in values]) is None


async def test_order_following_scores_are_not_used_and_the_reason_says_so() -> None:
    model = ScriptedModelClient(
        [
            proposals(call("memory_search", query="a"), call("current_time"), finish("later")),
            scores(1, 2, 3),  # would pick the finish by argmax
        ]
    )
    decision = await driver(model).decide(wm())
    assert decision.kind is DecisionKind.ACT and decision.action is not None
    assert decision.action.tool == "memory_search"  # the planner's first idea
    assert "scores follow the proposal order (1, 2, 3): not used" in decision.reason
    assert [c.score for c in decision.candidates] == [1.0, 2.0, 3.0]  # kept for the log


async def test_judged_scores_pick_the_argmax() -> None:
    model = ScriptedModelClient(
        [
            proposals(call("memory_search", query="a"), call("current_time"), finish("x")),
            scores(2, 9, 1),
        ]
    )
    decision = await driver(model).decide(wm())
    assert decision.action is not None and decision.action.tool == "current_time"
    assert decision.reason == "argmax score 9"


# --- repeated calls ----------------------------------------------------------------------


async def test_a_repeated_call_is_flagged_and_a_new_candidate_wins_without_scoring() -> None:
    model = ScriptedModelClient([proposals(call("current_time"), finish("It is 15:00 UTC."))])
    decision = await driver(model).decide(wm(TIME_SEEN))
    assert decision.kind is DecisionKind.FINISH and decision.message == "It is 15:00 UTC."
    repeated = decision.candidates[0]
    assert repeated.repeats == 1 and repeated.score is None
    assert decision.candidates[1].repeats is None
    assert len(model.requests) == 1  # one selectable candidate: no evaluation call


async def test_the_same_tool_with_other_arguments_is_not_a_repeat() -> None:
    seen = observed("memory_search", {"query": "a"}, "[]", 0)
    model = ScriptedModelClient([proposals(call("memory_search", query="b"))])
    decision = await driver(model).decide(wm(seen))
    assert decision.candidates[0].repeats is None
    assert decision.action is not None and decision.action.args == {"query": "b"}


def final(message: str) -> str:
    return json.dumps({"finish": True, "message": message, "rationale": "r"})


async def test_when_every_candidate_repeats_the_answer_is_asked_for() -> None:
    model = ScriptedModelClient([proposals(call("current_time")), final("It is 15:00 UTC.")])
    decision = await driver(model).decide(wm(TIME_SEEN))
    assert decision.kind is DecisionKind.FINISH and decision.message == "It is 15:00 UTC."
    assert "every candidate repeats an earlier call: asked for the answer" in decision.reason
    assert model.requests[1].schema_name == "final_answer"


async def test_with_no_usable_answer_the_planner_is_asked_for_other_calls() -> None:
    made_up = final("It is 09:41 UTC.")  # a time no result gave: refused, asked again
    rounds = iter([proposals(call("current_time")), proposals(call("memory_search", query="t"))])

    def respond(request: ChatRequest) -> str:
        return made_up if request.schema_name == "final_answer" else next(rounds)

    model = ScriptedModelClient(responder=respond)
    decision = await driver(model).decide(wm(TIME_SEEN))
    answers = [r for r in model.requests if r.schema_name == "final_answer"]
    assert len(answers) == Settings().models.structured_retries + 1
    assert "09, 41 appear in no result above" in (answers[1].messages[-1].content or "")
    assert decision.action is not None and decision.action.tool == "memory_search"
    assert "every candidate repeated an earlier call; asked again" in decision.reason
    retry = [r for r in model.requests if r.schema_name == "proposals"][1]
    note = retry.messages[-1].content or ""
    assert "current_time() (step 1)" in note and "will not change" in note
    # The repeated tool is left out of what may be proposed this time.
    schema = retry.response_schema
    assert schema is not None
    offered = {
        o["properties"]["tool"]["const"]
        for o in schema["properties"]["candidates"]["items"]["anyOf"]
        if "tool" in o["properties"]
    }
    assert offered == {"memory_search"}


async def test_a_repeat_is_chosen_only_when_nothing_new_comes() -> None:
    model = ScriptedModelClient(
        [
            proposals(call("current_time")),
            final("It is {{current_time}}."),  # a placeholder: refused, asked again ...
            final("It is [current_time]."),
            final("It is <current_time>."),  # ... until the retries run out
            proposals(call("current_time")),
        ]
    )
    decision = await driver(model).decide(wm(TIME_SEEN))
    assert decision.action is not None and decision.action.tool == "current_time"
    assert "every candidate repeats an earlier call" in decision.reason
    assert "repeats step 1" in decision.reason


# --- the planner says what remains; nothing left means finish -----------------------------


@pytest.mark.parametrize(
    "said", ["nothing", "Nothing.", "none", "N/A", "all parts are done", "nothing remains"]
)
def test_nothing_left_is_recognised(said: str) -> None:
    assert nothing_left(said)


@pytest.mark.parametrize(
    "said", ["", "remember the fact", "none of the parts is done", "nothingness", "current_time"]
)
def test_something_left_is_not_nothing(said: str) -> None:
    assert not nothing_left(said)


def test_remaining_is_asked_first_once_there_are_observations() -> None:
    assert "remaining" not in proposal_schema((TIME,), 2)["properties"]
    schema = proposal_schema((TIME,), 2, remaining=True)
    assert list(schema["properties"]) == ["remaining", "candidates"]  # decoding order
    assert schema["required"] == ["remaining", "candidates"]


async def test_nothing_remaining_without_a_finish_offers_one_to_the_evaluation() -> None:
    model = ScriptedModelClient(
        [
            json.dumps({"remaining": "nothing", "candidates": [call("memory_search", query="x")]}),
            json.dumps({"finish": True, "message": "It is 15:00 UTC.", "rationale": "r"}),
            json.dumps({"assessments": ["old notes", "the answer"], "best": 1}),
        ]
    )
    decision = await driver(model, evaluation="choice").decide(wm(TIME_SEEN))
    assert decision.kind is DecisionKind.FINISH and decision.message == "It is 15:00 UTC."
    assert decision.selected == 1 and decision.candidates[1].kind == "finish"
    assert "nothing remains: asked for the answer" in decision.reason
    final = model.requests[1]
    assert final.schema_name == "final_answer"
    assert "Objective: Tell me the time." in (final.messages[-1].content or "")
    assert model.requests[2].schema_name == "choice"  # the answer competes with the call


async def test_nothing_remaining_with_a_finish_asks_nothing_more() -> None:
    both = {
        "remaining": "nothing",
        "candidates": [call("memory_search", query="x"), finish("15:00")],
    }
    model = ScriptedModelClient(
        [json.dumps(both), json.dumps({"assessments": ["a", "b"], "best": 0})]
    )
    decision = await driver(model, evaluation="choice").decide(wm(TIME_SEEN))
    assert [r.schema_name for r in model.requests] == ["proposals", "choice"]
    # The evaluation may still prefer the call: "nothing remains" is the model's own word.
    assert decision.action is not None and decision.action.tool == "memory_search"


async def test_something_remaining_goes_on_with_the_candidates() -> None:
    model = ScriptedModelClient(
        [json.dumps({"remaining": "store it", "candidates": [call("memory_search", query="x")]})]
    )
    decision = await driver(model).decide(wm(TIME_SEEN))
    assert decision.kind is DecisionKind.ACT
    assert decision.reason.startswith("remaining: store it")


async def test_the_same_candidate_twice_is_one_candidate() -> None:
    model = ScriptedModelClient(
        [proposals(call("memory_search", query="a"), call("memory_search", query="a"))]
    )
    decision = await driver(model).decide(wm())
    assert [c.valid for c in decision.candidates] == [True, False]
    assert decision.candidates[1].invalid_reason == "the same as candidate 0"
    assert len(model.requests) == 1  # one distinct idea: not scored


# --- what the prompt shows ---------------------------------------------------------------


def test_progress_shows_each_call_with_its_arguments_and_marks_a_repeat() -> None:
    search = observed("memory_search", {"query": "time"}, "[]", 1)
    text = PromptComposer().progress_block(wm(TIME_SEEN, search, TIME_SEEN.model_copy()))
    assert '2. memory_search(query="time") [GROUNDING] OK: []' in text
    assert "3. current_time() [GROUNDING] OK:" in text
    assert text.rstrip().endswith("(the same call as step 1)")


def test_earlier_results_are_cut_and_the_latest_is_shown_whole() -> None:
    long = "x" * 2000
    first = observed("memory_search", {"query": "a"}, long, 0)
    last = observed("memory_search", {"query": "b"}, long, 1)
    text = PromptComposer(earlier_chars=100).progress_block(wm(first, last))
    one, two = text.splitlines()[1:]
    assert one.endswith("x…") and len(one) < 200
    assert two.endswith(long)


def test_the_proposal_asks_to_check_progress_and_finish_once_it_has_results() -> None:
    composer = PromptComposer()
    assert "check the progress" not in (composer.render_proposal(wm(), 3)[-1].content or "")
    ask = composer.render_proposal(wm(TIME_SEEN), 3)[-1].content or ""
    assert "check the progress above against each part of the objective" in ask


# --- through a run -----------------------------------------------------------------------


@pytest.fixture
async def runtime(db: Database, settings: Settings) -> AsyncIterator[Callable[..., Any]]:
    opened: list[Runtime] = []

    async def make(model: ScriptedModelClient) -> Runtime:
        rt = await Runtime.open(
            settings.model_copy(
                update={"embedding_backend": "hash", "evaluation": "scores", "candidates": 3}
            ),
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


def scripted(
    plan: Callable[[int], list[dict[str, Any]]], score: list[float]
) -> ScriptedModelClient:
    state = {"step": -1}

    def respond(request: ChatRequest) -> str:
        if request.schema_name == "proposals":
            state["step"] += 1
            return proposals(*plan(state["step"]))
        assert request.schema_name == "scores", request.schema_name
        assert request.response_schema is not None
        n = request.response_schema["properties"]["scores"]["minItems"]
        return scores(*score[:n])

    return ScriptedModelClient(responder=respond)


async def test_step_notes_are_kept_in_the_step_log(runtime, org) -> None:
    def plan(step: int) -> list[dict[str, Any]]:
        if step == 0:
            return [call("memory_search", query="time"), call("current_time"), finish("guess")]
        if step == 1:
            return [call("current_time"), finish("It is 15:00 UTC.")]
        return [finish("It is 15:00 UTC.")]

    rt = await runtime(scripted(plan, [3.0, 2.0, 1.0]))
    agent = await rt.create_agent(org, "noted", mode=AgentMode.AUTONOMOUS)
    run = await rt.run_autonomous(org, agent.id, "Tell me the time.")
    stored = await rt.get_run(org, run.id)
    assert (
        stored.steps[0].note
        == "scores follow the proposal order (3, 2, 1): not used, kept the planner's order"
    )
    assert stored.steps[0].action is not None and stored.steps[0].action.tool == "memory_search"
    # Step 2 repeats nothing (the search was step 1): the planner's own two ideas are scored.
    assert stored.steps[1].action is not None and stored.steps[1].action.tool == "current_time"
    assert stored.steps[1].observation is not None and stored.steps[1].observation.args == {}
    assert stored.status.value == "COMPLETED"


async def test_a_run_recalls_other_runs_memories_but_not_its_own_steps(runtime, org) -> None:
    def plan(step: int) -> list[dict[str, Any]]:
        if step in (0, 2):
            return [call("current_time")]
        return [finish("done")]

    model = scripted(plan, [5.0])
    rt = await runtime(model)
    agent = await rt.create_agent(org, "recaller", mode=AgentMode.AUTONOMOUS)
    await rt.run_autonomous(org, agent.id, "first run: check the clock")
    model.requests.clear()
    await rt.run_autonomous(org, agent.id, "second run: check the clock")
    prompts = [r.messages[0].content or "" for r in model.requests if r.schema_name == "proposals"]
    assert len(prompts) == 2
    # The first run's step is recalled in both of the second run's prompts ...
    assert all("Step 1: current_time()" in p for p in prompts)
    # ... and the second run's own step 1 (recorded before its step 2) is not recalled again
    # (only one "Step 1" line, the first run's).
    assert prompts[1].count("Step 1: current_time()") == 1


# --- interactive: a repeated call in a turn ------------------------------------------------


async def test_an_interactive_turn_does_not_call_the_same_tool_twice() -> None:
    from cortex_ray import Turn
    from cortex_ray.decide import InteractiveDriver
    from cortex_ray.models import ChatResponse, ToolCall

    again = ChatResponse(tool_calls=(ToolCall(id="c1", name="current_time", arguments="{}"),))
    model = ScriptedModelClient([again, "It is 15:00 UTC."])
    chat = wm(TIME_SEEN).model_copy(
        update={
            "mode": AgentMode.INTERACTIVE,
            "conversation": (Turn(role="user", content="What time is it?"),),
        }
    )
    decision = await InteractiveDriver(model, PromptComposer()).decide(chat)
    assert decision.kind is DecisionKind.REPLY and decision.message == "It is 15:00 UTC."
    assert "a repeated call of current_time() was not made" in decision.reason
    second = model.requests[1]
    assert second.tools == ()  # asked for the reply only
    assert "You already called current_time() (call 1)" in (second.messages[-1].content or "")


# --- the evaluation as a choice ------------------------------------------------------------


async def test_the_choice_evaluation_assesses_each_candidate_then_picks_one() -> None:
    model = ScriptedModelClient(
        [
            proposals(call("memory_search", query="time"), call("current_time"), finish("?")),
            json.dumps({"assessments": ["old notes", "the time itself", "a guess"], "best": 1}),
        ]
    )
    decision = await driver(model, evaluation="choice").decide(wm())
    assert decision.action is not None and decision.action.tool == "current_time"
    assert [c.score for c in decision.candidates] == [0.0, 10.0, 0.0]
    assert [c.assessment for c in decision.candidates] == [
        "old notes",
        "the time itself",
        "a guess",
    ]
    assert decision.reason == "chosen by the evaluation among 3"
    asked = model.requests[1]
    assert asked.schema_name == "choice"
    assert asked.response_schema is not None
    assert asked.response_schema["properties"]["best"] == {"enum": [0, 1, 2]}


async def test_the_choice_is_among_selectable_candidates_only() -> None:
    model = ScriptedModelClient(
        [
            proposals(call("current_time"), call("memory_search", query="a"), finish("x")),
            json.dumps({"assessments": ["a", "b"], "best": 0}),  # 0 is the repeat: refused
            json.dumps({"assessments": ["a", "b"], "best": 2}),
        ]
    )
    decision = await driver(model, evaluation="choice").decide(wm(TIME_SEEN))
    assert decision.kind is DecisionKind.FINISH and decision.selected == 2
    schema = model.requests[1].response_schema
    assert schema is not None and schema["properties"]["best"] == {"enum": [1, 2]}
    assert "best must be one of [1, 2]" in (model.requests[2].messages[-1].content or "")


def test_choice_is_the_default_evaluation() -> None:
    assert Settings().decide.evaluation == "choice"


# --- answers with made-up numbers ------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "evidence", "missing"),
    [
        ("(17 * 23) + 4 is 82.", ["Compute (17 * 23) + 4"], ["82"]),
        ("(17 * 23) + 4 is 395.", ["Compute (17 * 23) + 4", '{"value": 395}'], []),
        ("It is 15:02 on 2026-12-01.", ['{"utc": "2026-12-01T15:02:11+00:00"}'], []),
        ("42 km is 26.1 miles.", ["Convert 42 km", '{"value": 26.0976}'], []),  # rounded
        ("42 km is 26.2 miles.", ["Convert 42 km", '{"value": 26.0976}'], ["26.2"]),
        ("It costs 1,000.50 euros.", ['{"price": 1000.5}'], []),
        # Day and month names too; a date gives its own.
        (
            "Today is Wednesday.",
            ['{"utc": "2026-12-01T15:45:02", "weekday": "Tuesday"}'],
            ["Wednesday"],
        ),
        ("Tuesday, December 1, 2026.", ['{"utc": "2026-12-01T15:45:02"}'], []),
        ("It is 1 January.", ['{"utc": "2026-12-01T15:45:02"}'], ["January"]),
        # Proper names inside a sentence that no result gave; a sentence's first word is not one.
        ("It is in Las Vegas, Nevada.", ['{"hits": []}'], ["Las", "Vegas", "Nevada"]),
        ("The Veltran Observatory is in Marrowick.", ["Veltran Observatory: Marrowick"], []),
        ("Sure. Alice likes teal.", ["alice's favourite colour is teal"], []),
    ],
)
def test_numbers_an_answer_did_not_read_anywhere_are_unsupported(
    answer: str, evidence: list[str], missing: list[str]
) -> None:
    from cortex_ray.decide._answers import unsupported_values

    assert unsupported_values(answer, evidence) == missing


async def test_a_finish_with_a_made_up_number_loses_to_a_tool_call() -> None:
    sums = ToolSpec(name="calculate", description="Arithmetic.", action_type=ActionType.REASONING)
    objective = "Compute (17 * 23) + 4."
    memory = wm().model_copy(update={"objective": objective, "action_space": (TIME, sums)})
    model = ScriptedModelClient(
        [proposals(finish("It is 82."), call("calculate")), scores(10, 0)]  # no evaluation
    )
    decision = await driver(model).decide(memory)
    assert decision.action is not None and decision.action.tool == "calculate"
    assert decision.candidates[0].unsupported == ("82",)
    assert len(model.requests) == 1  # one selectable candidate: not scored

    # With the calculation done, the same answer with its result is the step.
    done = observed("calculate", {}, '{"value": 395}', 0)
    model = ScriptedModelClient(
        [json.dumps({"remaining": "nothing", "candidates": [finish("It is 395.")]})]
    )
    decision = await driver(model).decide(memory.model_copy(update={"observations": (done,)}))
    assert decision.kind is DecisionKind.FINISH and decision.message == "It is 395."
    assert decision.candidates[0].unsupported == ()


async def test_memory_search_in_a_run_does_not_find_the_runs_own_steps(runtime, org) -> None:
    def earlier(step: int) -> list[dict[str, Any]]:
        fact = call("remember_fact", subject="clock", fact="the clock is on the wall")
        return [fact] if step == 0 else [finish("done")]

    def plan(step: int) -> list[dict[str, Any]]:
        if step == 0:
            return [call("current_time")]
        if step == 1:
            return [call("memory_search", query="current_time clock")]
        return [finish("done")]

    rt = await runtime(scripted(earlier, [5.0]))
    agent = await rt.create_agent(org, "searcher", mode=AgentMode.AUTONOMOUS)
    await rt.run_autonomous(org, agent.id, "earlier run")
    rt.cycle.autonomous.model = scripted(plan, [5.0])
    run = await rt.run_autonomous(org, agent.id, "this run")
    found = run.steps[1].observation
    assert found is not None and isinstance(found.output, list)
    contents = [m["content"] for m in found.output]
    # The earlier run's step and fact are found; this run's own step 1 is not (it is in
    # the run's progress already), though it is in memory and matches the query.
    assert any(c.startswith("Step 1: remember_fact(") for c in contents)
    assert "the clock is on the wall" in contents
    assert not any(c.startswith("Step 1: current_time()") for c in contents)
    stored = await rt.memory.recall(org_id=org, agent_id=agent.id, query="current_time", k=20)
    assert any(h.memory.run_id == run.id and h.memory.step_index == 0 for h in stored)


# --- the objective as a checklist ------------------------------------------------------------


@pytest.mark.parametrize(
    ("objective", "parts"),
    [
        (
            "Find out the current date and time, remember it as a fact, and finish with a "
            "one-sentence answer.",
            [
                "Find out the current date and time",
                "remember it as a fact",
                "finish with a one-sentence answer",
            ],
        ),
        (
            "Compute 2 + 2 with calculate and finish with the result.",
            ["Compute 2 + 2 with calculate", "finish with the result"],
        ),
        ("1. Read the time\n2. Store it\n3. Answer", ["Read the time", "Store it", "Answer"]),
        ("What day is it? Finish with its name.", ["What day is it", "Finish with its name"]),
        ("Tell me the time.", []),  # one part: no checklist
        ("Find the date and time", []),  # "and" inside a part does not split it
    ],
)
def test_an_objective_is_split_into_its_parts(objective: str, parts: list[str]) -> None:
    from cortex_ray.perceive import objective_parts

    assert objective_parts(objective) == parts


def test_the_answer_parts_are_done_by_the_finish() -> None:
    from cortex_ray.perceive import is_answer_part

    assert is_answer_part("finish with the result") and is_answer_part("What is 2 + 2")
    assert is_answer_part("and tell me the time")
    assert not is_answer_part("remember it as a fact") and not is_answer_part("Check your memory")


def checklist_wm(*observations: Observation) -> WorkingMemory:
    objective = "Read the time, remember it as a fact, and finish with the time."
    return wm(*observations).model_copy(update={"objective": objective})


async def test_the_checklist_is_asked_first_and_an_undone_part_remains() -> None:
    model = ScriptedModelClient(
        [
            json.dumps(
                {"done": [True, False, False], "candidates": [call("memory_search", query="x")]}
            )
        ]
    )
    decision = await driver(model).decide(checklist_wm(TIME_SEEN))
    assert decision.reason.startswith("remaining: remember it as a fact")
    request = model.requests[0]
    assert request.response_schema is not None
    assert list(request.response_schema["properties"]) == ["done", "candidates"]
    assert request.response_schema["properties"]["done"]["minItems"] == 3
    ask = request.messages[-1].content or ""
    assert "1. Read the time\n2. remember it as a fact\n3. finish with the time" in ask


async def test_every_part_but_the_answer_done_offers_the_finish() -> None:
    model = ScriptedModelClient(
        [
            json.dumps(
                {"done": [True, True, False], "candidates": [call("memory_search", query="x")]}
            ),
            final("It is 15:00 UTC."),
            json.dumps({"assessments": ["more notes", "the answer"], "best": 1}),
        ]
    )
    decision = await driver(model, evaluation="choice").decide(checklist_wm(TIME_SEEN))
    assert decision.kind is DecisionKind.FINISH and decision.message == "It is 15:00 UTC."
    assert decision.reason.startswith("remaining: nothing; nothing remains: asked for the answer")


async def test_a_call_that_failed_is_a_repeat_too_but_an_interrupted_one_is_not() -> None:
    failed = observed("memory_search", {"query": "a"}, "error: no such thing", 0).model_copy(
        update={"status": ObservationStatus.ERROR}
    )
    model = ScriptedModelClient([proposals(call("memory_search", query="a"), call("current_time"))])
    decision = await driver(model).decide(wm(failed))
    assert decision.candidates[0].repeats == 1
    assert decision.action is not None and decision.action.tool == "current_time"

    cut = failed.model_copy(update={"summary": "interrupted: the process stopped while …"})
    model = ScriptedModelClient([proposals(call("memory_search", query="a"))])
    decision = await driver(model).decide(wm(cut))
    assert decision.candidates[0].repeats is None  # retried with the same idempotency key


async def test_with_parts_left_a_repeat_leads_to_other_calls_not_to_an_answer() -> None:
    memory = checklist_wm(TIME_SEEN).model_copy(update={"action_space": (TIME, SEARCH, REMEMBER)})
    model = ScriptedModelClient(
        [
            json.dumps({"done": [True, False, False], "candidates": [call("current_time")]}),
            proposals(call("remember_fact", fact="It is 15:00 UTC.")),
        ]
    )
    decision = await driver(model).decide(memory)
    # With a part left the new call is taken, no answer asked (offered one, the evaluation
    # chose it over the remember_fact the checklist still named).
    assert [r.schema_name for r in model.requests] == ["proposals", "proposals"]
    assert decision.action is not None and decision.action.tool == "remember_fact"


async def test_a_re_proposal_that_says_nothing_remains_leads_to_the_answer() -> None:
    """Pushed off calculate, a small model proposed current_time while saying nothing was
    left: its new call is not taken, the answer is."""
    memory = checklist_wm(TIME_SEEN).model_copy(update={"action_space": (TIME, SEARCH, REMEMBER)})
    model = ScriptedModelClient(
        [
            json.dumps({"done": [True, False, False], "candidates": [call("current_time")]}),
            json.dumps(
                {"done": [True, True, True], "candidates": [call("memory_search", query="x")]}
            ),
            final("It is 15:00 UTC."),
        ]
    )
    decision = await driver(model).decide(memory)
    assert decision.kind is DecisionKind.FINISH and decision.message == "It is 15:00 UTC."
    assert "that proposal said nothing remains: asked for the answer" in decision.reason


async def test_repeats_narrow_the_tools_step_by_step_until_something_new_comes() -> None:
    searched = observed("memory_search", {"query": "time"}, "[]", 0)
    memory = checklist_wm(searched, TIME_SEEN).model_copy(
        update={"action_space": (TIME, SEARCH, REMEMBER)}
    )
    model = ScriptedModelClient(
        [
            json.dumps(
                {"done": [True, False, False], "candidates": [call("memory_search", query="time")]}
            ),
            proposals(call("current_time")),  # without memory_search: another repeat
            proposals(call("remember_fact", fact="It is 15:00 UTC.")),  # without both
        ]
    )
    decision = await driver(model).decide(memory)
    assert decision.action is not None and decision.action.tool == "remember_fact"
    assert "asked again without current_time, memory_search" in decision.reason

    def offered(i: int) -> set[str]:
        schema = model.requests[i].response_schema
        assert schema is not None
        items = schema["properties"]["candidates"]["items"]["anyOf"]
        return {o["properties"]["tool"]["const"] for o in items if "tool" in o["properties"]}

    assert offered(1) == {"current_time", "remember_fact"}
    assert offered(2) == {"remember_fact"}


async def test_when_every_tool_was_called_again_the_answer_is_asked_whatever_the_checklist() -> (
    None
):
    stored = observed("remember_fact", {"fact": "It is 15:00 UTC."}, '{"remembered": true}', 1)
    memory = checklist_wm(TIME_SEEN, stored).model_copy(update={"action_space": (TIME, REMEMBER)})
    model = ScriptedModelClient(
        [
            json.dumps({"done": [False, False, False], "candidates": [call("current_time")]}),
            proposals(call("remember_fact", fact="It is 15:00 UTC.")),  # a repeat too
            final("It is 15:00 UTC."),
        ]
    )
    decision = await driver(model).decide(memory)
    assert decision.kind is DecisionKind.FINISH and decision.message == "It is 15:00 UTC."
    assert "every tool's call was made already: asked for the answer" in decision.reason


async def test_a_memory_write_of_values_nothing_gave_is_not_chosen_over_a_grounded_call() -> None:
    memory = checklist_wm(TIME_SEEN).model_copy(update={"action_space": (TIME, SEARCH, REMEMBER)})
    model = ScriptedModelClient(
        [
            json.dumps(
                {
                    "done": [True, False, False],
                    "candidates": [
                        call("remember_fact", fact="veltran observatory: city: Los Angeles"),
                        call("remember_fact", fact="It is 15:00 UTC on 2026-12-01."),
                    ],
                }
            )
        ]
    )
    decision = await driver(model).decide(memory)
    made_up, grounded = decision.candidates
    assert made_up.unsupported == ("Los", "Angeles") and grounded.unsupported == ()
    assert decision.action is not None and decision.action.args == grounded.args
    # One selectable candidate: no evaluation call was needed.
    assert [r.schema_name for r in model.requests] == ["proposals"]


async def test_a_narrowed_re_proposal_counts_only_with_a_grounded_new_call() -> None:
    """Pushed off the tools it had used, a small model stored a made-up fact: that
    re-proposal does not count, the write's tool is left out too, and with no tool left the
    answer is asked for."""
    memory = checklist_wm(TIME_SEEN).model_copy(update={"action_space": (TIME, REMEMBER)})
    model = ScriptedModelClient(
        [
            json.dumps({"done": [False, False, False], "candidates": [call("current_time")]}),
            proposals(call("remember_fact", fact="The observatory is in Los Angeles.")),
            final("It is 15:00 UTC."),
        ]
    )
    decision = await driver(model).decide(memory)
    assert [r.schema_name for r in model.requests] == ["proposals", "proposals", "final_answer"]
    assert decision.kind is DecisionKind.FINISH and decision.message == "It is 15:00 UTC."
    assert "every tool's call was made already: asked for the answer" in decision.reason
    retry = model.requests[1].messages[-1].content or ""
    assert "current_time() (step 1)" in retry


async def test_a_made_up_write_in_a_re_proposal_is_told_to_the_model() -> None:
    memory = checklist_wm(TIME_SEEN).model_copy(update={"action_space": (TIME, SEARCH, REMEMBER)})
    model = ScriptedModelClient(
        [
            json.dumps(
                {
                    "done": [True, False, False],
                    "candidates": [call("remember_fact", fact="The city is Los Angeles.")],
                }
            ),
            proposals(call("memory_search", query="time")),
        ]
    )
    decision = await driver(model).decide(memory)
    assert decision.action is not None and decision.action.tool == "memory_search"
    retry = model.requests[1].messages[-1].content or ""
    assert "would store values that no result, memory or the goal gave" in retry
    assert "Los, Angeles" in retry
    assert "asked again without remember_fact" in decision.reason


async def test_a_run_with_nothing_but_repeats_for_three_steps_ends_failed_saying_so() -> None:
    searched = observed("memory_search", {"query": "time"}, "[]", 1)
    again_time = observed("current_time", {}, '{"utc": "2026-12-01T15:00:00+00:00"}', 2)
    again_search = observed("memory_search", {"query": "time"}, "[]", 3)
    memory = wm(TIME_SEEN, searched, again_time, again_search)

    def script() -> ScriptedModelClient:
        return ScriptedModelClient(
            [
                proposals(call("current_time")),  # a repeat: the answer is asked for
                final("It is 09:45 on Friday."),  # made up: refused (no retries here)
                proposals(call("memory_search", query="time")),  # without current_time
                final("It is 09:45 on Friday."),  # every tool repeated: the answer, refused
            ]
        )

    decision = await driver(script(), structured_retries=0).decide(memory)
    assert decision.kind is DecisionKind.FINISH and decision.failed
    assert decision.reason.startswith("no progress: 3 steps in a row had nothing but a call")
    # One repeat fewer in a row, or the check off: the repeat is chosen as before.
    shorter = memory.model_copy(update={"observations": memory.observations[:-1]})
    decision = await driver(script(), structured_retries=0).decide(shorter)
    assert decision.action is not None and decision.action.tool == "current_time"
    decision = await driver(script(), structured_retries=0, stop_after_repeats=0).decide(memory)
    assert decision.action is not None and not decision.failed


# --- optional arguments nothing gave ------------------------------------------------------

FIND = ToolSpec(
    name="find_instrument",
    description="Search for a musical instrument within a budget.",
    parameters={
        "type": "object",
        "properties": {
            "budget": {"type": "integer"},
            "type": {"type": "string"},
            "make": {"type": "string", "description": "Maker. Default to not use."},
            "scale": {"enum": ["high", "medium", "low"], "default": "medium"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "limit": {"type": "integer"},
        },
        "required": ["budget", "type"],
        "additionalProperties": False,
    },
    action_type=ActionType.GROUNDING,
)


PLAIN = "Find me an acoustic guitar under $1000, the cheapest."
NAMED = "Find me an acoustic guitar under $1000 from Yamaha or the like."


@pytest.mark.parametrize(
    ("goal", "args", "dropped"),
    [
        # BFCL simple_python_280 and 229: values nobody named, in optional arguments.
        (PLAIN, {"budget": 1000, "type": "acoustic", "make": "Yamaha"}, ["make"]),
        (PLAIN, {"budget": 1000, "type": "acoustic", "scale": "high"}, ["scale"]),
        (PLAIN, {"budget": 1000, "type": "acoustic", "tags": ["vintage", "rare"]}, ["tags"]),
        # A word too common to say where a value came from is no evidence.
        (PLAIN, {"budget": 1000, "type": "acoustic", "make": "the best"}, ["make"]),
        # Given by the goal (any word of it, any case), or the declared default: kept.
        (NAMED, {"budget": 1000, "type": "acoustic", "make": "yamaha pianos"}, []),
        (PLAIN, {"budget": 1000, "type": "acoustic", "scale": "medium"}, []),
        (PLAIN, {"budget": 1000, "type": "acoustic", "tags": ["Guitar"]}, []),
        # Required arguments, numbers and empty strings are not judged here.
        (PLAIN, {"budget": 5, "type": "electric"}, []),
        (PLAIN, {"budget": 1000, "type": "acoustic", "limit": 7, "make": ""}, []),
    ],
)
def test_optional_arguments_nothing_gave_are_found(
    goal: str, args: dict[str, Any], dropped: list[str]
) -> None:
    from cortex_ray.decide._answers import made_up_optionals

    assert made_up_optionals(FIND.parameters, args, [goal]) == dropped


async def test_a_made_up_optional_argument_is_left_out_and_the_step_says_so() -> None:
    objective = "Find an acoustic instrument within my budget of $1000."
    memory = wm().model_copy(update={"objective": objective, "action_space": (FIND,)})
    proposal = call("find_instrument", budget=1000, type="acoustic", make="Yamaha")
    model = ScriptedModelClient([proposals(proposal)])
    decision = await driver(model, candidates=1).decide(memory)
    assert decision.action is not None
    assert decision.action.args == {"budget": 1000, "type": "acoustic"}
    assert decision.candidates[0].dropped == {"make": "Yamaha"}
    assert "left out make='Yamaha'" in decision.reason

    # Named in the goal, the same value is the person's, and it is sent.
    memory = memory.model_copy(update={"objective": f"{objective} A Yamaha, please."})
    model = ScriptedModelClient([proposals(proposal)])
    decision = await driver(model, candidates=1).decide(memory)
    assert decision.action is not None and decision.action.args["make"] == "Yamaha"
    assert decision.candidates[0].dropped == {}


async def test_an_interactive_call_leaves_out_an_optional_value_nobody_gave() -> None:
    from cortex_ray import Turn
    from cortex_ray.decide import InteractiveDriver
    from cortex_ray.models import ChatResponse, ToolCall

    args = '{"budget": 1000, "type": "acoustic", "make": "Yamaha"}'
    made = ChatResponse(tool_calls=(ToolCall(id="c1", name="find_instrument", arguments=args),))

    def turn(said: str) -> WorkingMemory:
        return wm().model_copy(
            update={
                "mode": AgentMode.INTERACTIVE,
                "action_space": (FIND,),
                "conversation": (Turn(role="user", content=said),),
            }
        )

    driver_ = InteractiveDriver(ScriptedModelClient([made]), PromptComposer())
    decision = await driver_.decide(turn("An acoustic instrument for $1000?"))
    assert decision.action is not None
    assert decision.action.args == {"budget": 1000, "type": "acoustic"}
    assert "left out make='Yamaha'" in decision.reason

    driver_ = InteractiveDriver(ScriptedModelClient([made]), PromptComposer())
    decision = await driver_.decide(turn("A Yamaha, acoustic, for $1000?"))
    assert decision.action is not None and decision.action.args["make"] == "Yamaha"
