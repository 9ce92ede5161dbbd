"""The inner voice (issue 14, point 4): a review of each final answer or reply, revised once.

Driven with scripted models through the real drivers and ``Runtime`` on the embedded
PostgreSQL: what the critic is asked, what happens on "ok" and "revise", who reviews (the
agent's own model, said plainly as same lineage, or another model), and what the step log
keeps. The critic's effect with a real model is measured by ``bench/agent_eval.py tasks
--variants planner,critic`` (docs/benchmarks.md), not asserted here.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from cortex_ray import AgentMode, Runtime, Settings
from cortex_ray._types import DecisionKind, Principal
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import ChatRequest, HashEmbedder, ScriptedModelClient
from cortex_ray.storage import Database


def agent_model(answer: str, revised: str = "It is 15:00 UTC.") -> ScriptedModelClient:
    """Calls current_time, then finishes with ``answer``; revises to ``revised``."""
    state = {"step": -1}

    def respond(request: ChatRequest) -> str:
        if request.schema_name == "proposals":
            state["step"] += 1
            if state["step"] == 0:
                cand = {"tool": "current_time", "args": {}, "rationale": "read the clock"}
            else:
                cand = {"finish": True, "message": answer, "rationale": "done"}
            return json.dumps({"candidates": [cand]})
        if request.schema_name == "revision":
            return json.dumps({"answer": revised})
        if request.schema_name == "critique":  # the same model reviewing
            return json.dumps({"problems": "the time is missing", "verdict": "revise"})
        raise AssertionError(request.schema_name)

    return ScriptedModelClient(responder=respond)


@pytest.fixture
async def runtime(db: Database, settings: Settings) -> AsyncIterator[Callable[..., Any]]:
    opened: list[Runtime] = []

    async def make(
        model: ScriptedModelClient, critic: ScriptedModelClient | None = None
    ) -> Runtime:
        rt = await Runtime.open(
            settings.model_copy(update={"embedding_backend": "hash", "candidates": 3}),
            model=model,
            embedder=HashEmbedder(384),
            importance=HeuristicImportanceScorer(),
            db=db,
            critic_model=critic,
        )
        opened.append(rt)
        return rt

    yield make
    for rt in opened:
        await rt.close(close_db=False)


async def test_the_critic_is_off_unless_the_agent_turns_it_on(runtime, org) -> None:
    model = agent_model("It is late.")
    rt = await runtime(model)
    agent = await rt.create_agent(org, "plain", mode=AgentMode.AUTONOMOUS)
    assert agent.critic is False
    run = await rt.run_autonomous(org, agent.id, "Tell me the time.")
    assert run.result == "It is late."
    assert "critique" not in [r.schema_name for r in model.requests]


async def test_a_revised_answer_is_final_and_both_drafts_are_in_the_log(runtime, org) -> None:
    model = agent_model("It is late.")
    rt = await runtime(model)
    agent = await rt.create_agent(org, "careful", mode=AgentMode.AUTONOMOUS, critic=True)
    run = await rt.run_autonomous(org, agent.id, "Tell me the time.")
    assert run.status.value == "COMPLETED" and run.result == "It is 15:00 UTC."
    stored = (await rt.get_run(org, run.id)).steps[-1]
    assert stored.decision is DecisionKind.FINISH
    assert [c.message for c in stored.candidates] == ["It is late.", "It is 15:00 UTC."]
    assert stored.selected == 1
    assert stored.note is not None
    assert "critic (same model, same lineage): revise: the time is missing" in stored.note
    assert "first draft: It is late." in stored.note
    critique = next(r for r in model.requests if r.schema_name == "critique")
    text = "\n".join(m.content or "" for m in critique.messages)
    assert "You did not write it" in text and "Draft answer: It is late." in text
    assert "current_time() → OK" in text  # the evidence: the results of the agent's calls
    # One round only: the revision is not reviewed again.
    assert [r.schema_name for r in model.requests].count("critique") == 1


async def test_an_ok_verdict_keeps_the_draft(runtime, org) -> None:
    critic = ScriptedModelClient([json.dumps({"problems": "none", "verdict": "ok"})])
    model = agent_model("It is 15:00 UTC.")
    rt = await runtime(model, critic)
    agent = await rt.create_agent(org, "fine", mode=AgentMode.AUTONOMOUS, critic=True)
    run = await rt.run_autonomous(org, agent.id, "Tell me the time.")
    assert run.result == "It is 15:00 UTC."
    note = (await rt.get_run(org, run.id)).steps[-1].note or ""
    assert note.endswith("critic (another model): ok")
    # The other model reviewed; the agent's own model never did.
    assert [r.schema_name for r in critic.requests] == ["critique"]
    assert "critique" not in [r.schema_name for r in model.requests]


async def test_an_independent_critic_asks_and_the_agents_model_revises(runtime, org) -> None:
    critic = ScriptedModelClient([json.dumps({"problems": "no time given", "verdict": "revise"})])
    model = agent_model("Soon.")
    rt = await runtime(model, critic)
    agent = await rt.create_agent(org, "reviewed", mode=AgentMode.AUTONOMOUS, critic=True)
    run = await rt.run_autonomous(org, agent.id, "Tell me the time.")
    assert run.result == "It is 15:00 UTC."
    assert "revision" in [r.schema_name for r in model.requests]
    note = (await rt.get_run(org, run.id)).steps[-1].note or ""
    assert "critic (another model): revise: no time given; first draft: Soon." in note


async def test_a_failing_critic_leaves_the_draft(runtime, org) -> None:
    critic = ScriptedModelClient(responder=lambda r: "not json")
    rt = await runtime(agent_model("It is 15:00 UTC."), critic)
    agent = await rt.create_agent(org, "robust", mode=AgentMode.AUTONOMOUS, critic=True)
    run = await rt.run_autonomous(org, agent.id, "Tell me the time.")
    assert run.status.value == "COMPLETED" and run.result == "It is 15:00 UTC."


async def test_an_interactive_reply_is_reviewed_and_revised(runtime, org) -> None:
    critic = ScriptedModelClient(
        [json.dumps({"problems": "it does not greet by name", "verdict": "revise"})]
    )
    model = ScriptedModelClient(["Hello.", json.dumps({"answer": "Hello, Ada."})])
    rt = await runtime(model, critic)
    agent = await rt.create_agent(org, "greeter", critic=True)
    session = await rt.open_session(org, agent.id, Principal.operator(org))
    result = await rt.run_turn(session, Principal.operator(org), "Hi, I am Ada.")
    assert result.reply == "Hello, Ada."
    asked = critic.requests[0].messages[-1].content or ""
    assert "Draft answer: Hello." in asked and "user: Hi, I am Ada." in asked


async def test_the_switch_is_kept_and_changed(runtime, org) -> None:
    from cortex_ray._types import AgentChanges

    rt = await runtime(agent_model("x"))
    agent = await rt.create_agent(org, "switch", critic=True)
    assert (await rt.get_agent(org, agent.id)).critic is True
    changed = await rt.update_agent(org, agent.id, AgentChanges(critic=False))
    assert changed.critic is False and (await rt.get_agent(org, agent.id)).critic is False


async def test_the_api_and_the_core_take_the_critic_switch() -> None:
    from serve.schemas import AgentCreate, AgentUpdate

    assert AgentCreate(name="a", critic=True).critic is True
    assert AgentUpdate(critic=False).to_changes().critic is False
    with pytest.raises(ValueError, match="critic cannot be null"):
        AgentUpdate(critic=None)


async def test_a_finish_the_critic_rejects_gives_way_to_the_proposed_call(runtime, org) -> None:
    verdicts = iter(["revise", "ok"])
    state = {"step": -1}

    def respond(request: ChatRequest) -> str:
        if request.schema_name == "proposals":
            state["step"] += 1
            if state["step"] == 0:
                early = {"finish": True, "message": "It is late.", "rationale": "guess"}
                clock = {"tool": "current_time", "args": {}, "rationale": "read it"}
                return json.dumps({"candidates": [early, clock]})
            done = {"finish": True, "message": "It is 15:00 UTC.", "rationale": "read"}
            return json.dumps({"candidates": [done]})
        if request.schema_name == "choice":  # the evaluation prefers the early finish
            return json.dumps({"assessments": ["an answer", "the clock"], "best": 0})
        if request.schema_name == "critique":
            verdict = next(verdicts)
            return json.dumps({"problems": "the time was never read", "verdict": verdict})
        raise AssertionError(request.schema_name)

    rt = await runtime(ScriptedModelClient(responder=respond))
    agent = await rt.create_agent(org, "checked", mode=AgentMode.AUTONOMOUS, critic=True)
    run = await rt.run_autonomous(org, agent.id, "Tell me the time.")
    steps = (await rt.get_run(org, run.id)).steps
    assert steps[0].action is not None and steps[0].action.tool == "current_time"
    assert "revise: the time was never read; acted instead of finishing" in (steps[0].note or "")
    assert run.result == "It is 15:00 UTC."
    assert (steps[1].note or "").endswith("critic (same model, same lineage): ok")
