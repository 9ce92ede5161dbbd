"""Per-run and per-turn diagnostic timelines on PostgreSQL, what a run cost, loops and
stalls (a scripted model as the test double; the real model path is in test_model_serving
and the metrics path in test_metrics)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from cortex_ray import AgentMode, Grant, Principal, RunStatus
from cortex_ray.models import ChatRequest, ChatResponse, ScriptedModelClient, Usage
from cortex_ray.observability import REDACTED, metrics
from cortex_ray.observability.diagnostics import DiagnosticEvent
from cortex_ray.storage import Database

SECRET = "ghp_" + "Zz9Yy8Xx7Ww6Vv5Uu4Tt3Ss2Rr1Qq0Pp9Oo8"


def plan(steps: list[dict[str, Any]], delay_s: float = 0.0) -> Callable[..., Any]:
    state = {"step": -1}

    async def respond(request: ChatRequest) -> ChatResponse:
        state["step"] += 1
        if delay_s:
            await asyncio.sleep(delay_s)
        body = json.dumps({"candidates": [steps[min(state["step"], len(steps) - 1)]]})
        return ChatResponse(content=body, usage=Usage(prompt_tokens=120, completion_tokens=30))

    return respond


class Recorded:
    """A metrics sink that keeps what it was handed (the Ray sink is tested in
    test_metrics)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, float, dict[str, str]]] = []

    def record(self, spec: metrics.MetricSpec, value: float, labels: Mapping[str, str]) -> None:
        self.seen.append((spec.name, value, dict(labels)))


async def test_a_runs_timeline_says_what_happened_and_what_it_cost(
    scripted_runtime: Callable[..., Any], org: str
) -> None:
    model = ScriptedModelClient(
        responder=plan(
            [
                {
                    "tool": "memory_search",
                    "args": {"query": f"the deploy token {SECRET}"},
                    "rationale": "look it up",
                },
                {"finish": True, "message": "Noted.", "rationale": "done"},
            ]
        )
    )
    runtime = await scripted_runtime(model, diagnostics={"max_value_chars": 200})
    agent = await runtime.create_agent(org, "noter", mode=AgentMode.AUTONOMOUS)
    run = await runtime.run_autonomous(org, agent.id, "find the deploy token", max_steps=4)
    assert run.status is RunStatus.COMPLETED

    found = await runtime.run_diagnostics(org, run.id)
    kinds = [e.kind for e in found.events]
    assert kinds[0] == "attempt" and kinds[-1] == "terminal"
    assert kinds.count("decision") == 2 and kinds.count("tool_call") == 1
    assert kinds.count("model_call") == 2  # one proposal per step (K=1)
    attempt = found.events[0].data
    assert attempt["goal"] == "find the deploy token" and attempt["queue_s"] >= 0
    call = next(e for e in found.events if e.kind == "model_call")
    assert call.data["model"] == model.name and call.data["schema"] == "proposals"
    assert call.data["tokens_in"] == 120 and call.data["tokens_out"] == 30
    assert "messages" not in call.data  # never the prompt
    decision = next(e for e in found.events if e.kind == "decision")
    assert decision.step == 0 and decision.data["selected"] == 0
    assert decision.data["candidates"][0]["tool"] == "memory_search"
    tool = next(e for e in found.events if e.kind == "tool_call")
    assert tool.data["tool"] == "memory_search" and tool.data["access"] == "allowed"
    assert tool.data["category"] == "RETRIEVAL" and tool.data["status"] == "OK"
    assert tool.data["args"]["query"] == f"the deploy token {REDACTED}"
    # scrubbed before it was written: the secret is nowhere in the stored timeline
    stored = json.dumps([e.model_dump(mode="json") for e in found.events])
    assert SECRET not in stored and REDACTED in stored
    assert found.events[-1].data["status"] == "COMPLETED"
    assert not found.stalled and found.stalls == 0 and found.loops == 0

    # The cost, added up in the run's row and returned as stored.
    assert run.cost is not None and run.cost == (await runtime.get_run(org, run.id)).cost
    assert run.cost.attempts == 1 and run.cost.tokens_in == 240 and run.cost.tokens_out == 60
    assert run.cost.model_calls == 2 and run.cost.tool_calls == 1
    assert 0 < run.cost.model_s + run.cost.tool_s <= run.cost.wall_s
    assert found.cost is not None and found.cost["tokens_in"] == 240

    lines = found.lines()
    assert lines[0] == f"{run.id}: COMPLETED" and any("memory_search" in line for line in lines)


async def test_a_run_repeating_one_call_is_flagged_as_a_loop(
    scripted_runtime: Callable[..., Any], org: str
) -> None:
    same = {"tool": "memory_search", "args": {"query": "where is it"}, "rationale": "look"}
    runtime = await scripted_runtime(
        ScriptedModelClient(responder=plan([same])), diagnostics={"loop_repeats": 3}
    )
    agent = await runtime.create_agent(org, "looper", mode=AgentMode.AUTONOMOUS)
    sink = Recorded()
    metrics.install_metrics(sink)
    try:
        run = await runtime.run_autonomous(org, agent.id, "find it", max_steps=4)
    finally:
        metrics.uninstall_metrics(sink)
    # the planner's own guard ends it after three steps without progress; the loop is
    # flagged at the third identical call
    assert run.status is RunStatus.FAILED and "no progress" in (run.reason or "")
    assert run.cost is not None
    (loop,) = run.cost.loops
    assert loop.tool == "memory_search" and loop.repeats == 3
    assert (loop.first_step, loop.last_step) == (0, 2)
    found = await runtime.run_diagnostics(org, run.id)
    (event,) = [e for e in found.events if e.kind == "loop"]
    assert event.step == 2 and event.data["repeats"] == 3  # flagged at the third
    assert found.loops == 1
    looped = [s for s in sink.seen if s[0] == "cortex_loops_detected"]
    assert looped == [
        ("cortex_loops_detected", 1.0, {"org": org, "agent": "looper", "tool": "memory_search"})
    ]
    steps = [s[2]["decision"] for s in sink.seen if s[0] == "cortex_steps"]
    assert steps == ["ACT", "ACT", "ACT", "FINISH"]


async def test_a_model_call_past_the_threshold_is_a_stall(
    scripted_runtime: Callable[..., Any], org: str
) -> None:
    slow = plan([{"finish": True, "message": "late", "rationale": "done"}], delay_s=1.5)
    runtime = await scripted_runtime(
        ScriptedModelClient(responder=slow), diagnostics={"stall_after_s": 0.3}
    )
    agent = await runtime.create_agent(org, "sleepy", mode=AgentMode.AUTONOMOUS)
    run = await runtime.start_run(org, agent.id, "take your time", max_steps=2)
    driving = asyncio.create_task(runtime.drive_run(org, run.id))
    for _ in range(60):  # the stall is written the moment it is seen
        now = await runtime.run_diagnostics(org, run.id)
        if now.stalled:
            break
        await asyncio.sleep(0.05)
    assert now.stalled and now.status == "RUNNING"
    (stall,) = [e for e in now.events if e.kind == "stall"]
    assert stall.data["model"] == "scripted" and stall.data["threshold_s"] == 0.3
    assert (await driving).status is RunStatus.COMPLETED
    done = await runtime.run_diagnostics(org, run.id)
    assert not done.stalled and done.stalls == 1  # it answered after all
    call = next(e for e in done.events if e.kind == "model_call")
    assert call.data["ms"] >= 1500


async def test_a_turns_timeline_and_the_retention(
    scripted_runtime: Callable[..., Any], org: str, db: Database
) -> None:
    runtime = await scripted_runtime(ScriptedModelClient(responder=lambda r: "Hello there."))
    agent = await runtime.create_agent(org, "greeter")
    ada = Principal(id="ada", org_id=org, grant=Grant(tools=frozenset({"*"})))
    session = await runtime.open_session(org, agent.id, ada)
    turn = await runtime.accept_turn(org, session.id, "hi", principal=ada)
    result = await runtime.run_turn(session, ada, "hi", turn_id=turn.id)
    assert result.reply == "Hello there."
    found = await runtime.turn_diagnostics(org, session.id, turn.id, principal=ada)
    kinds = [e.kind for e in found.events]
    assert kinds[0] == "request" and kinds[-1] == "terminal" and "model_call" in kinds
    assert found.events[0].data["message"] == "hi"
    assert found.events[-1].data["reply"] == "Hello there."
    assert found.events[-1].data["cost"]["model_calls"] >= 1

    # Events past the retention are deleted by the writer (about hourly; first write now).
    old = DiagnosticEvent(seq=1, at=datetime.now(UTC) - timedelta(days=8), kind="request")
    fresh = DiagnosticEvent(seq=2, at=datetime.now(UTC), kind="request")
    store = type(runtime.store)(db)  # a writer that has not pruned yet
    await store.append_diagnostics(org, [old], session_id=session.id)
    await store.append_diagnostics(org, [fresh], session_id=session.id, retention_days=7)
    kept = await store.diagnostics(org, session_id=session.id)
    assert [e.at for e in kept if e.kind == "request" and e.seq in (1, 2)][-1] == fresh.at
    assert old.at not in [e.at for e in kept]
