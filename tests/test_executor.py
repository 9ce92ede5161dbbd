"""The in-process executor: runs driven as tasks, turns of one session serialised."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from cortex_ray import AgentMode, Grant, InProcessExecutor, Principal, RunStatus, Runtime
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import ChatRequest, HashEmbedder, ScriptedModelClient


async def test_runs_are_driven_in_the_background_and_turns_queue(db, settings, org) -> None:
    def respond(request: ChatRequest) -> str:
        if request.schema_name == "proposals":
            return json.dumps(
                {"candidates": [{"finish": True, "message": "done", "rationale": "r"}]}
            )
        last = request.messages[-1].content or ""
        return f"echo: {last}"

    runtime = await Runtime.open(
        settings, model=ScriptedModelClient(responder=respond), embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(), db=db,
    )  # fmt: skip
    executor = InProcessExecutor(runtime)
    try:
        worker = await runtime.create_agent(org, "bg", mode=AgentMode.AUTONOMOUS)
        run = await runtime.start_run(org, worker.id, "finish at once")
        await executor.start_run(org, run.id)
        await executor.start_run(org, run.id)  # already running: not started twice
        await executor.wait(run.id)
        done = await runtime.store.get_run(org, run.id)
        assert done.status is RunStatus.COMPLETED and len(done.steps) == 1

        helper = await runtime.create_agent(org, "chat")
        alice = Principal(id="alice", org_id=org, grant=Grant(tools=frozenset({"*"})))
        session = await runtime.open_session(org, helper.id, alice)
        replies: list[Any] = await asyncio.gather(
            *(executor.turn(org, session.id, alice, f"message {i}") for i in range(3))
        )
        assert [r.reply for r in replies] == [f"echo: message {i}" for i in range(3)]
        turns = await runtime.store.conversation(org, session.id)
        # Serialised: each user message is directly followed by its own reply.
        assert [t.content for t in turns] == [
            text for i in range(3) for text in (f"message {i}", f"echo: message {i}")
        ]
        await executor.end_session(org, session.id)
    finally:
        await executor.aclose()
        await runtime.close(close_db=False)
