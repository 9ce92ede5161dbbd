"""The decision cycle end to end on the real PostgreSQL, with a scripted model (test double)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any
from uuid import uuid4

import psycopg
import pytest

from cortex_ray import (
    AccessDeniedError,
    ActionType,
    AgentMode,
    ConflictError,
    DecisionKind,
    Grant,
    InvalidRequestError,
    MemoryKind,
    NotFoundError,
    ObservationStatus,
    Principal,
    PrincipalKind,
    ProposalStatus,
    RunStatus,
    Runtime,
    SessionStatus,
    Settings,
    Step,
)
from cortex_ray.decide import NO_MODEL_REASON
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import ChatRequest, ChatResponse, HashEmbedder, ScriptedModelClient, ToolCall
from cortex_ray.storage import Database

Plan = Callable[[int], list[dict[str, Any]]]


def planner(
    plan: Plan, scores: Callable[[int], list[float]] | None = None
) -> Callable[[ChatRequest], str]:
    """A scripted planner: ``plan(step)`` gives the candidates, scores default to descending."""
    state = {"step": -1}

    def respond(request: ChatRequest) -> str:
        if request.schema_name == "proposals":
            state["step"] += 1
            return json.dumps({"candidates": plan(state["step"])})
        if request.schema_name == "scores":
            assert request.response_schema is not None
            n = request.response_schema["properties"]["scores"]["minItems"]
            values = scores(state["step"]) if scores else [float(10 - i) for i in range(n)]
            return json.dumps({"scores": values})
        if request.schema_name == "choice":  # the best by the same scores, first on ties
            assert request.response_schema is not None
            listed = request.response_schema["properties"]["best"]["enum"]
            n = len(listed)
            values = scores(state["step"]) if scores else [float(10 - i) for i in range(n)]
            best = listed[values.index(max(values))]
            return json.dumps({"assessments": ["ok"] * n, "best": best})
        raise AssertionError(f"unexpected structured call {request.schema_name}")

    return respond


def three_step_plan(step: int) -> list[dict[str, Any]]:
    if step == 0:
        return [
            {"tool": "current_time", "args": {}, "rationale": "need the time"},
            {"finish": True, "message": "too early", "rationale": "guess"},
        ]
    if step == 1:
        return [
            {
                "tool": "remember_fact",
                "args": {"subject": "Time Check", "fact": "checked the clock"},
                "rationale": "keep it",
            }
        ]
    return [{"finish": True, "message": "It is late.", "rationale": "done"}]


@pytest.fixture
async def make_runtime(db: Database, settings: Settings) -> AsyncIterator[Callable[..., Any]]:
    opened: list[Runtime] = []

    async def make(model: Any, **overrides: Any) -> Runtime:
        # K=3: these tests exercise propose → evaluate → select (the default K is 1).
        update = {"embedding_backend": "hash", "candidates": 3, **overrides}
        rt_settings = settings.model_copy(update=update)
        runtime = await Runtime.open(
            rt_settings,
            model=model,
            embedder=HashEmbedder(384),
            importance=HeuristicImportanceScorer(),
            db=db,
        )
        opened.append(runtime)
        return runtime

    yield make
    for runtime in opened:
        await runtime.close(close_db=False)


async def memories(db: Database, org: str) -> list[dict[str, Any]]:
    async with db.transaction() as conn:
        cur = await conn.execute(
            "SELECT kind, content, subject, run_id, step_index, metadata FROM memories "
            "WHERE org_id = %s ORDER BY recorded_at",
            (org,),
        )
        return list(await cur.fetchall())


async def test_autonomous_run_completes_with_a_full_ledger(make_runtime, db, org) -> None:
    model = ScriptedModelClient(responder=planner(three_step_plan))
    runtime = await make_runtime(model)
    agent = await runtime.create_agent(org, "worker", mode=AgentMode.AUTONOMOUS)
    seen: list[Step] = []
    run = await runtime.run_autonomous(
        org, agent.id, "check the time", max_steps=5, on_step=seen.append
    )

    assert run.status is RunStatus.COMPLETED
    assert run.result == "It is late."
    assert run == await runtime.store.get_run(org, run.id)  # what we return is what is stored
    assert [s.step_index for s in run.steps] == [0, 1, 2]
    assert [s.decision for s in run.steps] == [
        DecisionKind.ACT,
        DecisionKind.ACT,
        DecisionKind.FINISH,
    ]
    assert [s.step_index for s in seen] == [0, 1, 2]
    first = run.steps[0]
    assert first.action is not None and first.action.tool == "current_time"
    assert first.action_type is ActionType.GROUNDING
    # proposed, evaluated (choice: the chosen one scores 10), selected
    assert [c.score for c in first.candidates] == [10.0, 0.0]
    assert [c.assessment for c in first.candidates] == ["ok", "ok"]
    assert first.selected == 0
    assert first.observation is not None and first.observation.status is ObservationStatus.OK
    assert run.steps[1].action_type is ActionType.LEARNING

    audit = await runtime.store.audit_rows(org, run_id=run.id, gate_only=True)
    assert [(a["step_index"], a["tool"], a["action_type"]) for a in audit] == [
        (0, "current_time", "GROUNDING"),
        (1, "remember_fact", "LEARNING"),
    ]
    assert all(a["principal_id"] == f"agent:{agent.id}" for a in audit)

    rows = await memories(db, org)
    episodic_steps = [r for r in rows if r["kind"] == "EPISODIC" and r["step_index"] is not None]
    assert [r["step_index"] for r in episodic_steps] == [0, 1]
    assert any(r["kind"] == "EPISODIC" and r["metadata"].get("result") for r in rows)
    facts = [r for r in rows if r["kind"] == "SEMANTIC"]
    assert [(f["subject"], f["content"]) for f in facts] == [("time check", "checked the clock")]

    # Progress so far: the second proposal saw the first observation.
    proposal_prompts = [r for r in model.requests if r.schema_name == "proposals"]
    assert (
        "Progress so far (calls already made, with their results):\n"
        "1. current_time() [GROUNDING] OK" in proposal_prompts[1].messages[1].content
    )  # type: ignore[operator]


async def test_budget_exhausted_fails(make_runtime, org) -> None:
    def forever(step: int) -> list[dict[str, Any]]:  # a new search every step, never done
        return [{"tool": "memory_search", "args": {"query": f"q{step}"}, "rationale": "again"}]

    runtime = await make_runtime(ScriptedModelClient(responder=planner(forever)))
    agent = await runtime.create_agent(org, "looper", mode=AgentMode.AUTONOMOUS)
    run = await runtime.run_autonomous(org, agent.name, "never done", max_steps=3)
    assert run.status is RunStatus.FAILED
    assert "step budget of 3 exhausted" in (run.reason or "")
    assert run == await runtime.store.get_run(org, run.id)
    assert [s.step_index for s in run.steps] == [0, 1, 2]
    assert run.finished_at is not None


async def test_no_model_ends_the_run_at_once_with_a_reason(make_runtime, org) -> None:
    runtime = await make_runtime(None)
    agent = await runtime.create_agent(org, "idle", mode=AgentMode.AUTONOMOUS)
    run = await runtime.run_autonomous(org, agent.id, "anything")
    assert run.status is RunStatus.FAILED
    assert run.reason == NO_MODEL_REASON
    assert len(run.steps) == 1 and run.steps[0].decision is DecisionKind.FINISH


async def test_malformed_output_is_retried_then_fails_safely(make_runtime, org) -> None:
    good = json.dumps({"candidates": [{"finish": True, "message": "ok", "rationale": "r"}]})
    model = ScriptedModelClient(["not json", '{"candidates": []}', good])
    runtime = await make_runtime(model, structured_retries=2)
    agent = await runtime.create_agent(org, "flaky", mode=AgentMode.AUTONOMOUS)
    run = await runtime.run_autonomous(org, agent.id, "recover")
    assert run.status is RunStatus.COMPLETED and run.result == "ok"
    # The retry showed the model its error.
    assert "invalid" in (model.requests[1].messages[-1].content or "")

    broken = ScriptedModelClient(responder=lambda r: "{{{")
    runtime2 = await make_runtime(broken, structured_retries=1)
    run2 = await runtime2.run_autonomous(org, agent.id, "cannot recover")
    assert run2.status is RunStatus.FAILED
    assert "no valid candidate" in (run2.reason or "")
    assert len(broken.requests) == 2
    # nothing executed
    assert await runtime2.store.audit_rows(org, run_id=run2.id, gate_only=True) == []


async def test_invalid_candidates_are_recorded_never_selected(make_runtime, org) -> None:
    def plan(step: int) -> list[dict[str, Any]]:
        if step == 0:
            return [
                {"tool": "rm_rf", "args": {}, "rationale": "bad"},
                {"tool": "memory_search", "args": {"query": 3}, "rationale": "wrong type"},
                {"tool": "memory_search", "args": {"query": "time"}, "rationale": "fine"},
            ]
        return [{"finish": True, "message": "done", "rationale": "r"}]

    runtime = await make_runtime(ScriptedModelClient(responder=planner(plan)))
    agent = await runtime.create_agent(org, "careful", mode=AgentMode.AUTONOMOUS)
    run = await runtime.run_autonomous(org, agent.id, "search")
    step = run.steps[0]
    assert [c.valid for c in step.candidates] == [False, False, True]
    assert "unknown tool 'rm_rf'" in (step.candidates[0].invalid_reason or "")
    assert "invalid arguments" in (step.candidates[1].invalid_reason or "")
    assert step.selected == 2 and step.action is not None
    assert step.action_type is ActionType.RETRIEVAL
    assert run.status is RunStatus.COMPLETED


async def test_ties_go_to_the_earlier_proposal(make_runtime, org) -> None:
    def plan(step: int) -> list[dict[str, Any]]:
        if step == 0:
            return [
                {"tool": "memory_search", "args": {"query": "a"}, "rationale": "first"},
                {"tool": "current_time", "args": {}, "rationale": "second"},
            ]
        return [{"finish": True, "message": "done", "rationale": "r"}]

    runtime = await make_runtime(
        ScriptedModelClient(responder=planner(plan, scores=lambda step: [7.0, 7.0]))
    )
    agent = await runtime.create_agent(org, "tied", mode=AgentMode.AUTONOMOUS)
    run = await runtime.run_autonomous(org, agent.id, "tie")
    assert run.steps[0].selected == 0
    assert run.steps[0].action is not None and run.steps[0].action.tool == "memory_search"


async def test_unconstrained_backend_gets_the_schema_in_the_prompt(make_runtime, org) -> None:
    model = ScriptedModelClient(
        [json.dumps({"candidates": [{"finish": True, "message": "ok", "rationale": "r"}]})],
        supports_json_schema=False,
    )
    runtime = await make_runtime(model)
    agent = await runtime.create_agent(org, "plain", mode=AgentMode.AUTONOMOUS)
    await runtime.run_autonomous(org, agent.id, "go")
    assert "JSON schema" in (model.requests[0].messages[-1].content or "")


async def test_a_step_can_never_be_written_twice(make_runtime, org) -> None:
    runtime = await make_runtime(ScriptedModelClient(responder=planner(three_step_plan)))
    agent = await runtime.create_agent(org, "once", mode=AgentMode.AUTONOMOUS)
    run = await runtime.run_autonomous(org, agent.id, "check the time")
    with pytest.raises(psycopg.errors.UniqueViolation):
        async with runtime.db.transaction() as conn:
            await runtime.store.insert_step(conn, org, run.steps[0])


async def test_a_run_resumes_after_its_last_recorded_step(make_runtime, org) -> None:
    model = ScriptedModelClient(responder=planner(three_step_plan))
    runtime = await make_runtime(model)
    agent = await runtime.create_agent(org, "resumer", mode=AgentMode.AUTONOMOUS)
    run = await runtime.start_run(org, agent.id, "check the time", max_steps=5)

    def crash_after_first(step: Step) -> None:
        raise RuntimeError("process died")

    with pytest.raises(RuntimeError):
        await runtime.drive_run(org, run.id, on_step=crash_after_first)
    partial = await runtime.store.get_run(org, run.id)
    assert partial.status is RunStatus.RUNNING and len(partial.steps) == 1

    resumed = await runtime.drive_run(org, run.id)
    assert resumed.status is RunStatus.COMPLETED
    assert [s.step_index for s in resumed.steps] == [0, 1, 2]
    audit = await runtime.store.audit_rows(org, run_id=run.id, gate_only=True)
    assert [a["step_index"] for a in audit] == [0, 1]  # step 0 did not run again
    # The resumed step saw the observation recorded before the crash.
    last_prompt = [r for r in model.requests if r.schema_name == "proposals"][-1]
    assert "1. current_time() [GROUNDING] OK" in (last_prompt.messages[1].content or "")


async def test_a_run_keeps_its_requester_and_contact_context_apart_from_its_goal(
    make_runtime, org
) -> None:
    model = ScriptedModelClient(responder=planner(three_step_plan))
    runtime = await make_runtime(model)
    agent = await runtime.create_agent(org, "contact", mode=AgentMode.AUTONOMOUS)
    context = {"name": "Ada", "channel": "email"}
    run = await runtime.start_run(
        org,
        agent.id,
        "follow up",
        caller_id="user-42",
        contact_context=context,
        principal=Principal(id="ops-bot", org_id=org, kind=PrincipalKind.SERVICE),
    )
    await runtime.drive_run(org, run.id)
    stored = await runtime.store.get_run(org, run.id)
    assert (stored.goal, stored.caller_id, stored.requested_by) == (
        "follow up",
        "user-42",
        "ops-bot",
    )
    assert stored.contact_context == context
    first_prompt = next(r for r in model.requests if r.schema_name == "proposals")
    assert 'Contact context (JSON): {"channel": "email", "name": "Ada"}' in "\n".join(
        m.content or "" for m in first_prompt.messages
    )
    assert await runtime.store.run_status(org, run.id) is RunStatus.COMPLETED

    with pytest.raises(InvalidRequestError, match="at most 8192 bytes"):
        await runtime.start_run(org, agent.id, "x", contact_context={"k": "v" * 9000})
    assert [r.id for r in await runtime.store.list_runs(org)] == [run.id]


async def test_a_supervisor_can_give_up_on_a_run(make_runtime, org) -> None:
    runtime = await make_runtime(None)
    agent = await runtime.create_agent(org, "stuck", mode=AgentMode.AUTONOMOUS)
    run = await runtime.start_run(org, agent.id, "never driven")
    assert [r.id for r in await runtime.store.running_runs(org)] == [run.id]
    failed = await runtime.fail_run(org, run.id, "gave up after 5 attempts")
    assert failed.status is RunStatus.FAILED and failed.reason == "gave up after 5 attempts"
    assert await runtime.store.running_runs(org) == []
    # A terminal run stays as it ended.
    again = await runtime.fail_run(org, run.id, "another reason")
    assert again.reason == "gave up after 5 attempts"
    with pytest.raises(NotFoundError):
        await runtime.store.run_status(org, uuid4())


@pytest.mark.parametrize(
    ("goal", "max_steps", "message"),
    [
        ("", 3, "the goal is empty"),
        ("   ", 3, "the goal is empty"),
        ("go", 0, "between 1 and"),
        ("go", 10_000, "between 1 and"),
        ("go", "3", "must be an integer"),
        ("go", True, "must be an integer"),
    ],
)
async def test_bad_run_requests_are_rejected_and_store_nothing(
    make_runtime, org, goal, max_steps, message
) -> None:
    runtime = await make_runtime(None)
    agent = await runtime.create_agent(org, "strict", mode=AgentMode.AUTONOMOUS)
    with pytest.raises(InvalidRequestError, match=message):
        await runtime.run_autonomous(org, agent.id, goal, max_steps=max_steps)
    assert await runtime.store.list_runs(org) == []


async def test_unknown_agent_and_cross_org_reads(make_runtime, org) -> None:
    runtime = await make_runtime(None)
    with pytest.raises(NotFoundError):
        await runtime.run_autonomous(org, uuid.uuid4(), "go")
    agent = await runtime.create_agent(org, "mine", mode=AgentMode.AUTONOMOUS)
    run = await runtime.run_autonomous(org, agent.id, "go")
    with pytest.raises(NotFoundError):
        await runtime.store.get_agent("someone-else", agent.id)
    with pytest.raises(NotFoundError):
        await runtime.store.get_run("someone-else", run.id)


# interactive ----------------------------------------------------------------------------


def chat_script(*replies: ChatResponse | str) -> ScriptedModelClient:
    return ScriptedModelClient(list(replies))


def tool_call(name: str, **args: Any) -> ChatResponse:
    return ChatResponse(
        tool_calls=(ToolCall(id=f"c-{name}", name=name, arguments=json.dumps(args)),),
        finish_reason="tool_calls",
    )


def person(org: str, tools: set[str] | None = None) -> Principal:
    grant = Grant(tools=frozenset(tools if tools is not None else {"*"}))
    return Principal(id="alice", org_id=org, name="Alice", grant=grant)


async def test_interactive_turn_uses_the_same_gate_and_learns(make_runtime, db, org) -> None:
    model = chat_script(tool_call("current_time"), "It is Sunday.")
    runtime = await make_runtime(model)
    agent = await runtime.create_agent(org, "helper")
    alice = person(org)
    session = await runtime.open_session(org, agent.id, alice)
    result = await runtime.run_turn(session, alice, "What day is it?")

    assert result.reply == "It is Sunday."
    assert [o.tool for o in result.observations] == ["current_time"]
    assert model.requests[0].tools  # the chat model saw the action space as tools
    assert "reply" not in {t["function"]["name"] for t in model.requests[0].tools}
    turns = await runtime.store.conversation(org, session.id)
    assert [t.role for t in turns] == ["user", "tool", "assistant"]
    audit = await runtime.store.audit_rows(org, gate_only=True)
    assert [(a["tool"], a["action_type"], a["principal_id"]) for a in audit] == [
        ("current_time", "GROUNDING", "alice"),
        ("reply", "GROUNDING", "alice"),  # the reply is a dialogue action through the gate
    ]
    rows = await memories(db, org)
    assert [r["kind"] for r in rows] == ["EPISODIC"]
    assert "What day is it?" in rows[0]["content"] and "It is Sunday." in rows[0]["content"]


async def test_interactive_caller_cannot_use_what_only_the_agent_may(make_runtime, org) -> None:
    model = chat_script(tool_call("current_time"), "I can't check the clock for you.")
    runtime = await make_runtime(model)
    agent = await runtime.create_agent(org, "limited")
    bob = person(org, {"reply", "memory_search"})
    session = await runtime.open_session(org, agent.id, bob)
    result = await runtime.run_turn(session, bob, "Time?")
    names = {t["function"]["name"] for t in model.requests[0].tools}
    assert names == {"memory_search"}  # bob's action space is the intersection
    assert result.observations[0].status is ObservationStatus.REFUSED
    assert "access denied" in result.observations[0].summary
    assert result.reply == "I can't check the clock for you."


async def test_tool_rounds_are_bounded(make_runtime, org) -> None:
    asked = iter(range(100))

    def respond(request: ChatRequest) -> ChatResponse | str:
        # A new search each round (a repeated call would be refused before the bound).
        return (
            tool_call("memory_search", query=f"q{next(asked)}")
            if request.tools
            else "Enough tools."
        )

    model = ScriptedModelClient(responder=respond)
    runtime = await make_runtime(model, max_tool_rounds=2)
    agent = await runtime.create_agent(org, "busy")
    alice = person(org)
    session = await runtime.open_session(org, agent.id, alice)
    result = await runtime.run_turn(session, alice, "loop please")
    assert len(result.observations) == 2
    assert result.reply == "Enough tools."
    assert len(model.requests) == 3 and model.requests[-1].tools == ()


async def test_session_end_extracts_facts_with_supersession(make_runtime, org) -> None:
    model = chat_script(
        "Nice to meet you, Alice.",
        json.dumps({"facts": [{"subject": "Alice favourite colour", "fact": "Alice likes blue"}]}),
    )
    runtime = await make_runtime(model)
    agent = await runtime.create_agent(org, "listener")
    alice = person(org)
    session = await runtime.open_session(org, agent.id, alice)
    await runtime.run_turn(session, alice, "I'm Alice and my favourite colour is blue.")
    facts = await runtime.end_session(session)
    assert [(f.subject, f.content) for f in facts] == [
        ("alice favourite colour", "Alice likes blue")
    ]

    # A later session learns a newer fact about the same subject: latest wins.
    model.push(
        "Noted.",
        json.dumps(
            {"facts": [{"subject": "alice favourite colour", "fact": "Alice now likes green"}]}
        ),
    )
    session2 = await runtime.open_session(org, agent.id, alice)
    await runtime.run_turn(session2, alice, "Actually I prefer green now.")
    await runtime.end_session(session2)
    current = await runtime.memory.facts(org_id=org, agent_id=agent.id)
    assert [f.content for f in current] == ["Alice now likes green"]
    history = await runtime.memory.history(
        org_id=org, agent_id=agent.id, subject="alice favourite colour"
    )
    assert [h.content for h in history] == ["Alice likes blue", "Alice now likes green"]
    with pytest.raises(ConflictError, match="has ended"):
        await runtime.run_turn(session2, alice, "hello again")
    mallory = Principal(id="mallory", org_id=org, grant=Grant(tools=frozenset({"*"})))
    with pytest.raises(AccessDeniedError, match="own caller"):
        await runtime.run_turn(session2, mallory, "let me in")


async def test_a_session_end_retried_after_a_crash_stores_each_fact_once(
    make_runtime, db, org, monkeypatch
) -> None:
    """Issue 30, point 7: the facts commit, then the process dies before the session is
    marked ENDED; the retried end finds them (no second model call), ends the session and
    answers with the same facts: one copy of each."""
    facts = {"facts": [{"subject": "Alice favourite colour", "fact": "Alice likes blue"}]}
    model = chat_script("Nice to meet you, Alice.", json.dumps(facts))
    runtime = await make_runtime(model)
    agent = await runtime.create_agent(org, "listener", tools=["current_time"])
    alice = person(org, {"current_time"})
    session = await runtime.open_session(org, agent.id, alice)
    result = await runtime.run_turn(session, alice, "I'm Alice and my favourite colour is blue.")
    assert result.reply == "Nice to meet you, Alice."  # answered: `reply` is dialogue

    async def crash(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("the process died here")

    monkeypatch.setattr(runtime.store, "end_session", crash)
    with pytest.raises(ConnectionError):
        await runtime.end_session(session)
    monkeypatch.undo()
    assert (await runtime.store.get_session(org, session.id)).status is SessionStatus.OPEN
    model.push(json.dumps({"facts": [{"subject": "colour", "fact": "blue, says Alice"}]}))
    asked = len(model.requests)
    again = await runtime.end_session(session)
    assert len(model.requests) == asked  # the retry did not ask the model again
    assert [(f.subject, f.content) for f in again] == [
        ("alice favourite colour", "Alice likes blue")
    ]
    assert (await runtime.store.get_session(org, session.id)).status is SessionStatus.ENDED
    assert await runtime.end_session(session) == []  # ended: nothing more
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT subject, content, idempotency_key FROM memories "
            "WHERE org_id = %s AND session_id = %s AND kind = 'SEMANTIC'",
            (org, session.id),
        )
        rows = [(r["subject"], r["content"], r["idempotency_key"]) for r in await cur.fetchall()]
    assert rows == [("alice favourite colour", "Alice likes blue", f"session-end:{session.id}:0")]


async def test_procedural_edits_wait_for_a_person(make_runtime, org) -> None:
    model = chat_script(
        tool_call(
            "propose_procedural_edit",
            field="persona",
            value="A terse assistant.",
            rationale="users want short answers",
        ),
        "I have proposed it.",
    )
    runtime = await make_runtime(model)
    agent = await runtime.create_agent(org, "self-improver", persona="A chatty assistant.")
    alice = person(org)
    session = await runtime.open_session(org, agent.id, alice)
    result = await runtime.run_turn(session, alice, "Be terser from now on.")
    assert result.observations[0].action_type is ActionType.LEARNING
    pending = await runtime.memory.proposals(org_id=org, agent_id=agent.id)
    assert [p.status for p in pending] == [ProposalStatus.PENDING]
    assert (await runtime.store.get_agent(org, agent.id)).persona == "A chatty assistant."

    decided = await runtime.memory.decide_proposal(
        org_id=org, proposal_id=pending[0].id, approver=alice, approve=True
    )
    assert decided.status is ProposalStatus.APPROVED
    assert (await runtime.store.get_agent(org, agent.id)).persona == "A terse assistant."


async def test_direct_tool_calls_go_through_the_same_gate(make_runtime, db, org) -> None:
    runtime = await make_runtime(None)
    agent = await runtime.create_agent(org, "direct")
    alice = person(org, {"current_time"})
    ok = await runtime.invoke_tool(org, agent.id, alice, "current_time", {})
    assert ok.status is ObservationStatus.OK and "utc" in ok.output
    denied = await runtime.invoke_tool(
        org, agent.id, alice, "remember_fact", {"subject": "s", "fact": "f"}
    )
    assert denied.status is ObservationStatus.REFUSED
    bad = await runtime.invoke_tool(org, agent.id, alice, "current_time", {"x": 1})
    assert bad.status is ObservationStatus.REFUSED and "invalid arguments" in bad.summary
    rows = await runtime.store.audit_rows(org, gate_only=True)
    statuses = [(a["tool"], a["status"]) for a in rows]
    assert statuses == [
        ("current_time", "OK"),
        ("remember_fact", "REFUSED"),
        ("current_time", "REFUSED"),
    ]
    # The refused call never executed: nothing was remembered.
    assert [r for r in await memories(db, org) if r["kind"] == MemoryKind.SEMANTIC.value] == []


async def test_interactive_agents_do_not_run_tasks_and_bad_names_are_rejected(
    make_runtime, org
) -> None:
    runtime = await make_runtime(None)
    chatty = await runtime.create_agent(org, "chatty")  # INTERACTIVE by default
    with pytest.raises(InvalidRequestError, match="set its mode to AUTONOMOUS"):
        await runtime.run_autonomous(org, chatty.id, "go")
    loner = await runtime.create_agent(org, "loner", mode=AgentMode.AUTONOMOUS)
    with pytest.raises(InvalidRequestError, match="set its mode to INTERACTIVE"):
        await runtime.open_session(org, loner.id, person(org))
    with pytest.raises(InvalidRequestError, match="agent name '': 1 to 128 characters"):
        await runtime.create_agent(org, "   ")
    with pytest.raises(InvalidRequestError, match="unknown tools: nope"):
        await runtime.create_agent(org, "x", tools=["nope"])
    assert await runtime.store.list_runs(org) == []


async def test_output_cut_off_at_the_token_limit_is_retried_with_a_clear_reason(
    make_runtime, org
) -> None:
    cut = ChatResponse(
        content='{"candidates": [{"finish": true, "message": "aaaa', finish_reason="length"
    )
    model = ScriptedModelClient([cut, cut])
    runtime = await make_runtime(model, structured_retries=1)
    agent = await runtime.create_agent(org, "verbose", mode=AgentMode.AUTONOMOUS)
    run = await runtime.run_autonomous(org, agent.id, "say a lot")
    assert run.status is RunStatus.FAILED
    assert "cut off at the token limit" in (run.reason or "")


class ProcessDied(BaseException):
    """Stands for the process dying mid-tool: not an Exception, so nothing catches it."""


async def test_an_interrupted_side_effect_is_decided_again_not_repeated(db, settings, org) -> None:
    from cortex_ray.act import Tool

    charges: list[str] = []

    async def charge(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
        charges.append(ctx.idempotency_key)
        if len(charges) == 1:
            raise ProcessDied  # the effect happened, then the process died
        return {"charged": True}

    card = Tool(
        name="charge_card",
        description="Charge the card (not idempotent).",
        handler=charge,
        parameters={"type": "object", "properties": {}, "additionalProperties": False},
    )

    def plan(step: int) -> list[dict[str, Any]]:
        if step == 0:
            return [{"tool": "charge_card", "args": {}, "rationale": "pay"}]
        return [
            {
                "finish": True,
                "message": "stopping: the charge may already be done",
                "rationale": "r",
            }
        ]

    model = ScriptedModelClient(responder=planner(plan))
    runtime = await Runtime.open(
        settings.model_copy(update={"embedding_backend": "hash"}),
        model=model,
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
        tools=[card],
        db=db,
    )
    try:
        agent = await runtime.create_agent(
            org, "payer", mode=AgentMode.AUTONOMOUS, tools=["charge_card", "current_time"]
        )
        run = await runtime.start_run(org, agent.id, "pay once")
        with pytest.raises(ProcessDied):
            await runtime.drive_run(org, run.id)
        assert (await runtime.store.get_run(org, run.id)).steps == ()

        resumed = await runtime.drive_run(org, run.id)
        assert resumed.status is RunStatus.COMPLETED
        assert charges == [f"{run.id}:0"]  # decided again, not blindly re-executed
        last_prompt = [r for r in model.requests if r.schema_name == "proposals"][-1]
        assert "interrupted: the process stopped while charge_card was running" in (
            last_prompt.messages[1].content or ""
        )
        audit = await runtime.store.audit_rows(org, run_id=run.id, gate_only=True)
        assert [(a["tool"], a["status"], a["idempotency_key"]) for a in audit] == [
            ("charge_card", "INTERRUPTED", f"{run.id}:0")
        ]
        # The intent was consumed: a third drive finds nothing to recover.
        async with runtime.db.transaction() as conn:
            assert await runtime.store.take_intent(conn, org, run.id, 0) is None
    finally:
        await runtime.close(close_db=False)
