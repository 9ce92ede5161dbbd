"""The real path: embedded PostgreSQL + the packaged SmolLM2 (llama.cpp) + the packaged MiniLM.

The model is tiny, so these tests check what must hold whatever it decides: the run reaches
a terminal state, the ledger is contiguous and consistent with the audit log, every step
wrote its episodic memory, and structured output was valid (or the run ended safely). An
interactive turn granted only `reply` must reply, and what the turn and the end of the
session return is exactly what they stored.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from cortex_ray import (
    AgentMode,
    ConflictError,
    DecisionKind,
    Grant,
    MemoryKind,
    Principal,
    RunStatus,
    Runtime,
    SessionStatus,
    Settings,
)
from cortex_ray.memory import HeuristicImportanceScorer, ModelImportanceScorer
from cortex_ray.storage import Database

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def real_runtime(
    db: Database, settings: Settings, smollm2: Any, minilm: Any
) -> AsyncIterator[Runtime]:
    runtime = await Runtime.open(
        settings.model_copy(update={"candidates": 2, "model_max_tokens": 256}),
        model=smollm2,
        embedder=minilm,
        importance=ModelImportanceScorer(smollm2, 1, HeuristicImportanceScorer()),
        db=db,
    )
    yield runtime
    # The session fixtures own the model and the database.


async def test_autonomous_task_reaches_a_terminal_state(
    real_runtime: Runtime, db: Database, org: str
) -> None:
    agent = await real_runtime.create_agent(
        org, "clock-reader", persona="You answer precisely.", mode=AgentMode.AUTONOMOUS
    )
    run = await real_runtime.run_autonomous(
        org, agent.id, "Find out the current time and finish with it.", max_steps=3
    )
    assert run.status in (RunStatus.COMPLETED, RunStatus.FAILED)
    assert run.finished_at is not None
    assert [s.step_index for s in run.steps] == list(range(len(run.steps)))
    assert 1 <= len(run.steps) <= 3
    acts = [s for s in run.steps if s.decision is DecisionKind.ACT]
    for step in acts:
        assert step.action is not None and step.observation is not None
        assert step.selected is not None and step.candidates[step.selected].valid
        assert step.action.tool in agent.tools
    if run.status is RunStatus.COMPLETED:
        assert run.steps[-1].decision is DecisionKind.FINISH and run.result
    else:
        assert run.reason  # a failed run says why
    audit = await real_runtime.store.audit_rows(org, run_id=run.id, gate_only=True)
    assert [a["step_index"] for a in audit] == [s.step_index for s in acts]
    async with db.transaction() as conn:
        cur = await conn.execute(
            "SELECT step_index, importance, metadata FROM memories "
            "WHERE org_id = %s AND run_id = %s AND kind = 'EPISODIC' ORDER BY recorded_at",
            (org, run.id),
        )
        rows = await cur.fetchall()
    assert [r["step_index"] for r in rows if r["step_index"] is not None] == [
        s.step_index for s in acts
    ]
    assert rows[-1]["metadata"].get("result") is True  # the run's result is remembered
    assert all(1 <= r["importance"] <= 10 for r in rows)


async def test_interactive_turn_with_the_real_model(
    real_runtime: Runtime, db: Database, org: str
) -> None:
    # A grant of `reply` alone leaves the model no tool to call: the turn must end in a
    # reply that the gate passed, whatever SmolLM2 would otherwise have chosen.
    agent = await real_runtime.create_agent(org, "greeter", persona="You are friendly and brief.")
    alice = Principal(id="alice", org_id=org, name="Alice", grant=Grant(tools=frozenset({"reply"})))
    session = await real_runtime.open_session(org, agent.id, alice)
    message = "Hello! My name is Alice and I work at Acme Corp in Lisbon. Please greet me."
    result = await real_runtime.run_turn(session, alice, message)

    assert result.refused is None
    assert result.reply is not None and result.reply.strip()
    assert result.observations == ()
    turns = await real_runtime.store.conversation(org, session.id)
    assert [(t.role, t.content) for t in turns] == [
        ("user", message),
        ("assistant", result.reply),
    ]
    rows = await real_runtime.store.audit_rows(org, gate_only=True)
    audit = [a for a in rows if a["session_id"] == session.id]
    assert [(a["tool"], a["status"], a["principal_id"]) for a in audit] == [
        ("reply", "OK", "alice")
    ]
    assert audit[0]["args"] == {"message": result.reply}
    async with db.transaction() as conn:
        cur = await conn.execute(
            "SELECT kind, content, metadata FROM memories "
            "WHERE org_id = %s AND session_id = %s ORDER BY recorded_at",
            (org, session.id),
        )
        episodic = await cur.fetchall()
    assert len(episodic) == 1 and episodic[0]["kind"] == "EPISODIC"
    assert episodic[0]["metadata"] == {"turn": True, "caller": "alice"}
    assert message in episodic[0]["content"] and result.reply[:1000] in episodic[0]["content"]

    facts = await real_runtime.end_session(session)  # the extraction pass on the real model

    ended = await real_runtime.store.get_session(org, session.id)
    assert ended.status is SessionStatus.ENDED and ended.ended_at is not None
    # A failed extraction is logged and returns []; this conversation states facts, and at
    # temperature 0 SmolLM2 extracts some (two on 2026-12-01), so [] means the pass broke.
    assert facts
    assert all(
        f.kind is MemoryKind.SEMANTIC and f.session_id == session.id and f.subject for f in facts
    )
    async with db.transaction() as conn:
        cur = await conn.execute(
            "SELECT id, subject, content, metadata FROM memories "
            "WHERE org_id = %s AND session_id = %s AND kind = 'SEMANTIC'",
            (org, session.id),
        )
        stored = await cur.fetchall()
    # What end_session returned is exactly what it stored, each marked as extracted.
    assert sorted((r["id"], r["subject"], r["content"]) for r in stored) == sorted(
        (f.id, f.subject, f.content) for f in facts
    )
    assert all(r["metadata"] == {"source": "extraction"} for r in stored)
    # Ending twice extracts nothing more; the ended session takes no more turns.
    assert await real_runtime.end_session(session) == []
    with pytest.raises(ConflictError):
        await real_runtime.run_turn(session, alice, "Are you still there?")


async def test_recall_with_the_real_embedder(real_runtime: Runtime, org: str) -> None:
    agent = await real_runtime.create_agent(org, "rememberer")
    for subject, fact in [
        ("office wifi", "The office wifi password is on the fridge."),
        ("ceo", "The CEO of the company is Dana."),
        ("parking", "Visitors park in lot B."),
    ]:
        await real_runtime.memory.write(
            org_id=org,
            agent_id=agent.id,
            kind=MemoryKind.SEMANTIC,
            content=fact,
            subject=subject,
            importance=5,
        )
    hits = await real_runtime.memory.recall(
        org_id=org, agent_id=agent.id, query="Who runs the company?", k=1
    )
    assert hits[0].memory.subject == "ceo"
