"""The cycle's deadlines on PostgreSQL (issue 30, point 2): every model call of a turn or a
run step is made inside that work's own deadline, and work whose deadline passes while its
model is over capacity ends with that reason (a turn FAILED, a run FAILED), never as a
model error. The model here never frees its line: each call waits for the deadline it is
given, as the served client does, then says so."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from cortex_ray import AgentMode, DeadlineExceededError, Principal, RunStatus, Runtime, Settings
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import ChatRequest, ChatResponse, HashEmbedder, current_deadline
from cortex_ray.storage import Database, TurnStatus


class _NeverFree:
    """A model whose line never frees: a call waits until its work's deadline, then raises
    what the served client raises."""

    name = "never-free"
    supports_json_schema = True

    def __init__(self) -> None:
        self.deadlines: list[str] = []

    async def chat(self, request: ChatRequest) -> ChatResponse:
        deadline = current_deadline()
        assert deadline is not None, "a model call made outside its work's deadline"
        self.deadlines.append(deadline.what)
        await asyncio.sleep(max(deadline.left(), 0.0))
        raise deadline.exceeded(f"the model {self.name}, over capacity")


@pytest.fixture
async def runtime(db: Database, settings: Settings) -> AsyncIterator[Callable[..., Any]]:
    opened: list[Runtime] = []

    async def make(model: Any) -> Runtime:
        tuned = settings.model_copy(
            update={
                "embedding_backend": "hash",
                "sessions": settings.sessions.model_copy(update={"turn_deadline_s": 1.0}),
                "runs": settings.runs.model_copy(update={"step_deadline_s": 1.0}),
            }
        )
        rt = await Runtime.open(
            tuned, model=model, embedder=HashEmbedder(384),
            importance=HeuristicImportanceScorer(), db=db,
        )  # fmt: skip
        opened.append(rt)
        return rt

    yield make
    for rt in opened:
        await rt.close(close_db=False)


async def test_a_run_step_past_its_deadline_ends_the_run_with_the_reason(
    runtime: Callable[..., Any], org: str
) -> None:
    model = _NeverFree()
    rt = await runtime(model)
    await rt.create_agent(org, "worker", mode=AgentMode.AUTONOMOUS)
    run = await rt.run_autonomous(org, "worker", "report the time", max_steps=3)
    assert run.status is RunStatus.FAILED
    assert run.reason == (
        "step 1: the step's deadline (1 s) passed while waiting for the model never-free, "
        "over capacity"
    )
    assert model.deadlines == ["the step's deadline (1 s)"]  # one call, then the run ended
    assert run.steps == ()


async def test_a_turn_past_its_deadline_ends_failed_with_the_reason(
    runtime: Callable[..., Any], org: str
) -> None:
    model = _NeverFree()
    rt = await runtime(model)
    agent = await rt.create_agent(org, "helper")
    alice = Principal(id="alice", org_id=org)
    session = await rt.open_session(org, agent.id, alice)
    with pytest.raises(DeadlineExceededError, match="the turn's deadline"):
        await rt.run_turn(session, alice, "What time is it?")
    history = await rt.conversation(org, session.id, principal=alice)
    assert [(m.turn_status, m.refused) for m in history] == [
        (
            TurnStatus.FAILED,
            "the turn failed: the turn's deadline (1 s after it was accepted) passed while "
            "waiting for the model never-free, over capacity",
        )
    ]
