"""The step's pipelined transaction stays one transaction: a failed statement writes nothing."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import psycopg
import pytest

from cortex_ray import AgentMode, MemoryKind, RunStatus, Runtime, Settings
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import HashEmbedder, ScriptedModelClient
from cortex_ray.storage import Database

ACT = json.dumps({"candidates": [{"tool": "current_time", "args": {}, "rationale": "clock"}]})


@pytest.fixture
async def runtime(db: Database, settings: Settings) -> AsyncIterator[Runtime]:
    opened = await Runtime.open(
        settings.model_copy(update={"embedding_backend": "hash"}),
        db=db,
        model=ScriptedModelClient([ACT, ACT]),
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
    )
    yield opened
    await opened.close(close_db=False)


async def test_a_failed_statement_in_a_step_rolls_back_its_ledger_and_audit_rows(
    runtime: Runtime, org: str
) -> None:
    agent = await runtime.create_agent(org, "atomic", mode=AgentMode.AUTONOMOUS)
    run = await runtime.start_run(org, agent.id, "check the time", max_steps=2)
    # Step 0's EPISODIC memory already exists, so the step's memory INSERT (its last
    # statement, sent in the same pipeline as the ledger and audit rows) fails.
    await runtime.memory.write(
        org_id=org,
        agent_id=agent.id,
        kind=MemoryKind.EPISODIC,
        content="already here",
        run_id=run.id,
        step_index=0,
    )
    with pytest.raises(psycopg.errors.UniqueViolation):
        await runtime.drive_run(org, run.id)
    stored = await runtime.store.get_run(org, run.id)
    assert stored.status is RunStatus.RUNNING and stored.steps == ()
    assert await runtime.store.audit_rows(org, run_id=run.id, gate_only=True) == []
    # The connection went back to the pool usable: the next read works.
    assert (await runtime.store.get_agent(org, agent.id)).id == agent.id


async def test_a_submitted_run_and_its_audit_row_are_written_together(
    runtime: Runtime, org: str
) -> None:
    agent = await runtime.create_agent(org, "submitted", mode=AgentMode.AUTONOMOUS)
    run = await runtime.start_run(org, agent.id, "check the time", max_steps=2)
    rows = await runtime.store.audit_rows(org, run_id=run.id)
    assert [(r["tool"], r["status"], r["run_id"]) for r in rows] == [("tasks.submit", "OK", run.id)]
