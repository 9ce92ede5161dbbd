"""The real path: embedded PostgreSQL + the packaged SmolLM2 (llama.cpp) + the packaged MiniLM.

The model is tiny, so these tests check what must hold whatever it decides: the run reaches
a terminal state, the ledger is contiguous and consistent with the audit log, every step
wrote its episodic memory, and structured output was valid (or the run ended safely).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from cortex_ray import (
    AgentMode,
    DecisionKind,
    Grant,
    Principal,
    RunStatus,
    Runtime,
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
    audit = await real_runtime.store.audit_rows(org, run_id=run.id)
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


async def test_interactive_turn_with_the_real_model(real_runtime: Runtime, org: str) -> None:
    agent = await real_runtime.create_agent(org, "greeter", persona="You are friendly and brief.")
    alice = Principal(id="alice", org_id=org, name="Alice", grant=Grant(tools=frozenset({"*"})))
    session = await real_runtime.open_session(org, agent.id, alice)
    result = await real_runtime.run_turn(session, alice, "Hello! Please greet me.")
    assert result.reply or result.refused
    turns = await real_runtime.store.conversation(org, session.id)
    assert turns[0].content == "Hello! Please greet me."
    if result.reply:
        assert turns[-1].role == "assistant" and turns[-1].content == result.reply
    await real_runtime.end_session(session)  # the extraction pass runs on the real model


async def test_recall_with_the_real_embedder(real_runtime: Runtime, org: str) -> None:
    from cortex_ray import MemoryKind

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
