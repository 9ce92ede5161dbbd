"""No side effect twice: the built-in tools that write are idempotent by the call's key, and
importance scoring never runs inside a tool's timeout.

The first tests use the real PostgreSQL and a scripted model (test double) in this process.
The last one runs on the real local Ray (hold ``/tmp/cortex-ray.lock``): a run actor whose
``remember_fact`` is killed inside the tool, right after its write, is restarted by Ray and
resumes; every (run, step) still has exactly one fact. The actors get their runtime factory by
value (``ray.cloudpickle.register_pickle_by_value``), as in ``tests/test_actors.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from cortex_ray import (
    Agent,
    AgentMode,
    Grant,
    MemoryKind,
    ModelError,
    ObservationStatus,
    Principal,
    RunStatus,
    Runtime,
    Settings,
)
from cortex_ray.act import InvocationContext, Tool, ToolContext
from cortex_ray.memory import HeuristicImportanceScorer, ModelImportanceScorer
from cortex_ray.memory._importance import ImportanceRescorer
from cortex_ray.models import ChatRequest, ChatResponse, HashEmbedder, ScriptedModelClient
from cortex_ray.storage import Database

STEP = re.compile(r"Step (\d+) of (\d+)\.")
FACTS = 2  # the plan: remember fact 0, remember fact 1, finish


def plan(request: ChatRequest) -> str:
    """A stateless planner (actors restart): step N remembers fact N, then it finishes."""
    assert request.schema_name == "proposals", request.schema_name
    text = "\n".join(m.content or "" for m in request.messages)
    match = STEP.search(text)
    assert match is not None, text
    step = int(match.group(1)) - 1
    if step < FACTS:
        # In words: a memory write of a number that no result or goal holds is made up
        # (the planner's grounding check), and this plan only has to write something.
        word = ("zero", "one", "two", "three")[step]
        args = {"subject": f"topic {word}", "fact": f"fact number {word}"}
        action: dict[str, Any] = {"tool": "remember_fact", "args": args, "rationale": "r"}
    else:
        action = {"finish": True, "message": "remembered", "rationale": "r"}
    return json.dumps({"candidates": [action]})


class ImportanceModel(ScriptedModelClient):
    """Plans with ``plan``; rates importance ``rating`` after ``delay_s`` (or fails)."""

    def __init__(self, *, delay_s: float = 0.0, rating: int | None = 9) -> None:
        super().__init__(responder=plan)
        self.delay_s = delay_s
        self.rating = rating
        self.rated = 0
        self.entered = asyncio.Event()

    async def chat(self, request: ChatRequest) -> ChatResponse:
        if request.schema_name != "importance":
            return await super().chat(request)
        self.entered.set()
        await asyncio.sleep(self.delay_s)
        if self.rating is None:
            raise ModelError("the model is down")
        self.rated += 1
        return ChatResponse(content=json.dumps({"importance": self.rating}))


@pytest.fixture
async def make_runtime(db: Database, settings: Settings) -> AsyncIterator[Callable[..., Any]]:
    opened: list[Runtime] = []

    async def make(
        model: Any = None, *, importance: Any = "heuristic", **overrides: Any
    ) -> Runtime:
        rt_settings = settings.model_copy(update={"embedding_backend": "hash", **overrides})
        runtime = await Runtime.open(
            rt_settings,
            model=model,
            embedder=HashEmbedder(384),
            # "settings": what Runtime.open builds from the settings (importance_mode...)
            importance=None if importance == "settings" else HeuristicImportanceScorer(),
            db=db,
        )
        opened.append(runtime)
        return runtime

    yield make
    for runtime in opened:
        await runtime.close(close_db=False)


async def rows(db: Database, query: str, *params: Any) -> list[dict[str, Any]]:
    async with db.connection() as conn:
        cur = await conn.execute(query, params)
        return list(await cur.fetchall())


async def semantic(db: Database, org: str) -> list[dict[str, Any]]:
    return await rows(
        db,
        "SELECT id, subject, content, importance, run_id, step_index, session_id, "
        "idempotency_key, valid_to, superseded_by FROM memories "
        "WHERE org_id = %s AND kind = 'SEMANTIC' ORDER BY recorded_at",
        org,
    )


async def eventually(check: Callable[[], Any], within: float = 60.0) -> Any:
    """Poll ``check`` until truthy or ``within`` seconds passed (no timing is asserted)."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result or time.monotonic() > deadline:
            return result
        await asyncio.sleep(0.05)


async def run_context(runtime: Runtime, org: str, step_index: int = 0) -> InvocationContext:
    agent = await runtime.create_agent(
        org, f"worker-{uuid.uuid4().hex[:6]}", mode=AgentMode.AUTONOMOUS
    )
    run = await runtime.start_run(org, agent.id, "remember things", max_steps=4)
    return InvocationContext(
        agent=agent,
        caller=None,
        mode=AgentMode.AUTONOMOUS,
        run_id=run.id,
        step_index=step_index,
    )


FACT = {"subject": "The Weather", "fact": "it rains on Tuesdays"}


# the key -----------------------------------------------------------------------------------


def test_the_key_of_a_run_step_a_turn_round_and_a_plain_call(org: str) -> None:
    agent_principal = Principal(id="p", org_id=org)
    agent = Agent(org_id=org, name="a")
    run_id = uuid.uuid4()
    base = ToolContext(
        org_id=org, agent=agent, principal=agent_principal, mode=AgentMode.AUTONOMOUS
    )
    assert base.idempotency_key is None  # a direct call without a key
    in_run = ToolContext(
        org_id=org,
        agent=agent,
        principal=agent_principal,
        mode=AgentMode.AUTONOMOUS,
        run_id=run_id,
        step_index=3,
    )
    assert in_run.idempotency_key == f"{run_id}:3"
    given = ToolContext(
        org_id=org,
        agent=agent,
        principal=agent_principal,
        mode=AgentMode.INTERACTIVE,
        call_key="turn:t:1",
    )
    assert given.idempotency_key == "turn:t:1"


# remember_fact -----------------------------------------------------------------------------


async def test_remember_fact_twice_with_one_key_writes_one_row(make_runtime, db, org) -> None:
    runtime = await make_runtime()
    ctx = await run_context(runtime, org, step_index=1)
    first = await runtime.dispatcher.execute(ctx, "remember_fact", FACT)
    again = await runtime.dispatcher.execute(ctx, "remember_fact", FACT)
    assert first.observation.status is ObservationStatus.OK
    assert again.observation.output == first.observation.output
    assert again.observation.summary == first.observation.summary
    (row,) = await semantic(db, org)
    assert str(row["id"]) == first.observation.output["id"]
    # The row carries its run, step and key; the retry did not supersede its own first write.
    assert (row["run_id"], row["step_index"]) == (ctx.run_id, 1)
    assert row["idempotency_key"] == f"{ctx.run_id}:1"
    assert row["valid_to"] is None and row["superseded_by"] is None
    # Both calls are audited under the same key (execute leaves the writing to its caller).
    assert first.audit.idempotency_key == again.audit.idempotency_key == f"{ctx.run_id}:1"

    # Another step's key is another write, which supersedes the fact about the same subject.
    other = await runtime.dispatcher.execute(
        InvocationContext(
            agent=ctx.agent, caller=None, mode=ctx.mode, run_id=ctx.run_id, step_index=2
        ),
        "remember_fact",
        {"subject": "the weather", "fact": "it rains on Wednesdays now"},
    )
    assert other.observation.output["id"] != first.observation.output["id"]
    old, new = await semantic(db, org)
    assert str(old["superseded_by"]) == other.observation.output["id"]
    assert new["valid_to"] is None and new["step_index"] == 2


async def test_concurrent_calls_with_one_key_write_one_row(make_runtime, db, org) -> None:
    runtime = await make_runtime()
    ctx = await run_context(runtime, org)
    results = await asyncio.gather(
        *(runtime.dispatcher.execute(ctx, "remember_fact", FACT) for _ in range(6))
    )
    assert all(r.observation.status is ObservationStatus.OK for r in results)
    assert len({json.dumps(r.observation.output, sort_keys=True) for r in results}) == 1
    (row,) = await semantic(db, org)
    assert str(row["id"]) == results[0].observation.output["id"]
    assert row["valid_to"] is None


async def test_a_run_writes_its_facts_with_its_run_id_and_step(make_runtime, db, org) -> None:
    runtime = await make_runtime(ImportanceModel())
    agent = await runtime.create_agent(org, "rememberer", mode=AgentMode.AUTONOMOUS)
    run = await runtime.run_autonomous(org, agent.id, "remember two facts", max_steps=4)
    assert run.status is RunStatus.COMPLETED, run.reason
    facts = await semantic(db, org)
    assert [(f["run_id"], f["step_index"]) for f in facts] == [(run.id, 0), (run.id, 1)]
    assert [f["idempotency_key"] for f in facts] == [f"{run.id}:0", f"{run.id}:1"]
    # Each is the one its step observed.
    observed = [s.observation.output["id"] for s in run.steps if s.observation is not None]
    assert observed == [str(f["id"]) for f in facts]


async def test_turn_rounds_and_direct_calls_dedupe_by_their_own_keys(make_runtime, db, org) -> None:
    runtime = await make_runtime()
    agent = await runtime.create_agent(org, "chat", tools=["remember_fact"])
    alice = Principal(id="alice", org_id=org, grant=Grant(tools=frozenset({"*"})))
    bob = Principal(id="bob", org_id=org, grant=Grant(tools=frozenset({"*"})))

    # A turn's round: the key comes through the invocation context; rows carry the session.
    session = await runtime.open_session(org, agent.id, alice)
    turn = InvocationContext(
        agent=agent,
        caller=alice,
        mode=AgentMode.INTERACTIVE,
        session_id=session.id,
        idempotency_key=f"turn:{uuid.uuid4()}:0",
    )
    one = await runtime.dispatcher.execute(turn, "remember_fact", FACT)
    two = await runtime.dispatcher.execute(turn, "remember_fact", FACT)
    assert one.observation.output == two.observation.output
    (row,) = await semantic(db, org)
    assert row["session_id"] == session.id and row["idempotency_key"] == turn.idempotency_key
    assert row["run_id"] is None and row["step_index"] is None

    # Direct calls: a repeated Idempotency-Key is one write, per caller; no key, no dedupe.
    fact = {"subject": "lunch", "fact": "at noon"}
    first = await runtime.invoke_tool(
        org, agent.id, alice, "remember_fact", fact, idempotency_key="k1"
    )
    repeat = await runtime.invoke_tool(
        org, agent.id, alice, "remember_fact", fact, idempotency_key="k1"
    )
    assert repeat.output == first.output
    theirs = await runtime.invoke_tool(
        org, agent.id, bob, "remember_fact", fact, idempotency_key="k1"
    )
    assert theirs.output["id"] != first.output["id"]
    keyless = [
        await runtime.invoke_tool(org, agent.id, alice, "remember_fact", fact) for _ in range(2)
    ]
    assert keyless[0].output["id"] != keyless[1].output["id"]
    lunch = [r for r in await semantic(db, org) if r["subject"] == "lunch"]
    assert len(lunch) == 4
    assert lunch[0]["idempotency_key"] == f"call:alice:{agent.id}:remember_fact:k1"
    with pytest.raises(Exception, match="idempotency key"):
        await runtime.invoke_tool(
            org, agent.id, alice, "remember_fact", fact, idempotency_key="x" * 201
        )


# propose_procedural_edit ------------------------------------------------------------------


async def test_propose_procedural_edit_is_one_proposal_per_key(make_runtime, db, org) -> None:
    runtime = await make_runtime()
    ctx = await run_context(runtime, org, step_index=2)
    args = {"field": "persona", "value": "a careful helper", "rationale": "fewer mistakes"}
    first = await runtime.dispatcher.execute(ctx, "propose_procedural_edit", args)
    twins = await asyncio.gather(
        *(runtime.dispatcher.execute(ctx, "propose_procedural_edit", args) for _ in range(4))
    )
    assert first.observation.status is ObservationStatus.OK
    assert all(t.observation.output == first.observation.output for t in twins)
    (proposal,) = await rows(
        db,
        "SELECT id, idempotency_key, run_id, step_index, session_id, status "
        "FROM procedural_proposals WHERE org_id = %s",
        org,
    )
    assert str(proposal["id"]) == first.observation.output["proposal_id"]
    assert proposal["idempotency_key"] == f"{ctx.run_id}:2"
    assert (proposal["run_id"], proposal["step_index"]) == (ctx.run_id, 2)
    assert proposal["status"] == "PENDING"

    # Concurrent first calls too: one of them writes, the others read its row.
    ctx2 = InvocationContext(
        agent=ctx.agent, caller=None, mode=ctx.mode, run_id=ctx.run_id, step_index=3
    )
    raced = await asyncio.gather(
        *(runtime.dispatcher.execute(ctx2, "propose_procedural_edit", args) for _ in range(5))
    )
    assert len({r.observation.output["proposal_id"] for r in raced}) == 1
    assert len(await rows(db, "SELECT 1 FROM procedural_proposals WHERE org_id = %s", org)) == 2


# importance ----------------------------------------------------------------------------------


async def test_a_slow_model_never_holds_up_a_fact(make_runtime, db, org) -> None:
    # The model takes longer to rate importance than the tool may run: the fact is still
    # written inside the tool's timeout, with the heuristic score, and rescored afterwards.
    model = ImportanceModel(delay_s=3.0, rating=9)
    runtime = await make_runtime(
        model,
        importance="settings",
        importance_scoring="model",
        importance_mode="background",
        tool_timeout_s=1.0,
    )
    agent = await runtime.create_agent(org, "chat", tools=["remember_fact"])
    alice = Principal(id="alice", org_id=org, grant=Grant(tools=frozenset({"*"})))
    observation = await runtime.invoke_tool(org, agent.id, alice, "remember_fact", FACT)
    assert observation.status is ObservationStatus.OK, observation.summary
    (row,) = await semantic(db, org)
    assert row["importance"] == 5.0  # the heuristic score of a fact
    assert str(row["id"]) == observation.output["id"]

    async def rescored() -> bool:
        (now,) = await semantic(db, org)
        return bool(now["importance"] == 9.0)

    assert await eventually(rescored), "the model's score never arrived"
    # Only that row's importance changed.
    (after,) = await semantic(db, org)
    assert {k: v for k, v in after.items() if k != "importance"} == {
        k: v for k, v in row.items() if k != "importance"
    }


async def test_every_write_path_is_rescored_after_its_commit(make_runtime, db, org) -> None:
    # The step memories and the run's result are written in the cycle's transactions (the
    # rescoring is queued before they commit), the facts by the tool.
    model = ImportanceModel(rating=8)
    runtime = await make_runtime(model, importance="settings", importance_scoring="model")
    assert runtime.memory.rescorer is not None
    agent = await runtime.create_agent(org, "rememberer", mode=AgentMode.AUTONOMOUS)
    run = await runtime.run_autonomous(org, agent.id, "remember two facts", max_steps=4)
    assert run.status is RunStatus.COMPLETED, run.reason
    await runtime.memory.rescored()
    written = await rows(db, "SELECT kind, importance FROM memories WHERE org_id = %s", org)
    assert len(written) == 5  # two facts, two step memories, the run's result
    assert {r["importance"] for r in written} == {8.0}
    assert model.rated == 5


async def test_a_failed_rescoring_keeps_the_fallback(make_runtime, db, org) -> None:
    model = ImportanceModel(rating=None)  # the model fails every rating
    runtime = await make_runtime(model, importance="settings", importance_scoring="model")
    agent = await runtime.create_agent(org, "chat", tools=["remember_fact"])
    alice = Principal(id="alice", org_id=org, grant=Grant(tools=frozenset({"*"})))
    observation = await runtime.invoke_tool(org, agent.id, alice, "remember_fact", FACT)
    assert observation.status is ObservationStatus.OK
    await runtime.memory.rescored()
    assert model.entered.is_set()  # it was asked
    (row,) = await semantic(db, org)
    assert row["importance"] == 5.0


async def test_inline_scoring_is_bounded_by_its_timeout(make_runtime, db, org) -> None:
    model = ImportanceModel(delay_s=30.0, rating=9)
    runtime = await make_runtime(
        model,
        importance="settings",
        importance_scoring="model",
        importance_mode="inline",
        importance_timeout_s=0.2,
        tool_timeout_s=10.0,
    )
    assert runtime.memory.rescorer is None
    agent = await runtime.create_agent(org, "chat", tools=["remember_fact"])
    alice = Principal(id="alice", org_id=org, grant=Grant(tools=frozenset({"*"})))
    observation = await runtime.invoke_tool(org, agent.id, alice, "remember_fact", FACT)
    assert observation.status is ObservationStatus.OK, observation.summary
    (row,) = await semantic(db, org)
    assert row["importance"] == 5.0


def rescorer_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("importance-rescorer")]


async def test_closing_the_runtime_stops_the_rescoring(make_runtime, db, org) -> None:
    model = ImportanceModel(delay_s=3600.0)  # never answers
    runtime = await make_runtime(model, importance="settings", importance_scoring="model")
    agent = await runtime.create_agent(org, "chat", tools=["remember_fact"])
    alice = Principal(id="alice", org_id=org, grant=Grant(tools=frozenset({"*"})))
    await runtime.invoke_tool(org, agent.id, alice, "remember_fact", FACT)
    await model.entered.wait()
    assert rescorer_tasks()
    await runtime.close(close_db=False)
    assert not rescorer_tasks()
    (row,) = await semantic(db, org)
    assert row["importance"] == 5.0
    # A closed service still writes (with the fallback), it only stops rescoring.
    assert runtime.memory.rescorer is not None and runtime.memory.rescorer.pending == 0


async def test_the_rescoring_queue_is_bounded() -> None:
    model = ImportanceModel(delay_s=3600.0)
    applied: list[float] = []

    async def apply(org_id: str, memory_id: uuid.UUID, importance: float) -> bool:
        applied.append(importance)
        return True

    scorer = ModelImportanceScorer(model, 0, HeuristicImportanceScorer(), deferred=True)
    rescorer = ImportanceRescorer(scorer, apply, concurrency=1, queue_size=1)

    assert rescorer.submit("o", uuid.uuid4(), MemoryKind.SEMANTIC, "one")
    await model.entered.wait()  # the worker holds the first
    assert rescorer.submit("o", uuid.uuid4(), MemoryKind.SEMANTIC, "two")  # queued
    assert not rescorer.submit("o", uuid.uuid4(), MemoryKind.SEMANTIC, "three")  # full
    assert (rescorer.pending, rescorer.dropped) == (2, 1)
    await rescorer.aclose()
    assert not rescorer_tasks() and applied == []
    assert not rescorer.submit("o", uuid.uuid4(), MemoryKind.SEMANTIC, "late")


# the chaos test on Ray -----------------------------------------------------------------------


@dataclass
class KillAfterWrite:
    """After-hook: the first time ``remember_fact`` returns for a key, the process dies
    (``os._exit``), its row written and its step not yet recorded. A marker table makes it
    the first attempt only, across the restart."""

    holder: dict[str, Database]

    async def before(self, ctx: ToolContext, tool: Tool, args: dict[str, Any]) -> str | None:
        return None

    async def after(self, ctx: ToolContext, tool: Tool, observation: Any) -> Any:
        if tool.name != "remember_fact" or ctx.run_id is None:
            return observation
        async with self.holder["db"].transaction() as conn:
            cur = await conn.execute(
                "INSERT INTO idem_test_kills (idem_key, run_id) VALUES (%s, %s) "
                "ON CONFLICT DO NOTHING",
                (ctx.idempotency_key, ctx.run_id),
            )
            first = cur.rowcount == 1
        if first:
            os._exit(1)
        return observation


@dataclass(frozen=True)
class KillingRuntime:
    """The actors' runtime factory: the planner, the hash embedder, the kill hook."""

    async def __call__(self, settings: Settings) -> Runtime:
        holder: dict[str, Database] = {}
        runtime = await Runtime.open(
            settings,
            model=ScriptedModelClient(responder=plan),
            embedder=HashEmbedder(384),
            importance=HeuristicImportanceScorer(),
            hooks=[KillAfterWrite(holder)],
        )
        holder["db"] = runtime.db
        return runtime


async def test_a_run_killed_inside_remember_fact_after_its_write_has_one_fact_per_step(
    ray_cluster, make_runtime, settings, db, org
) -> None:
    ray = pytest.importorskip("ray")
    from actors import SessionManager, SessionPolicy

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    async with db.transaction() as conn:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS idem_test_kills (idem_key text PRIMARY KEY, "
            "run_id uuid NOT NULL)"
        )
    local = await make_runtime()
    sessions = SessionManager(
        settings.model_copy(update={"database_url": db.dsn, "pool_max_size": 2}),
        factory=KillingRuntime(),
        policy=SessionPolicy(namespace=f"test-idem-{uuid.uuid4().hex[:8]}"),
    )
    agent = await local.create_agent(
        org, "rememberer", mode=AgentMode.AUTONOMOUS, tools=["remember_fact"]
    )
    runs = [
        (await local.start_run(org, agent.id, f"remember two facts #{i}", max_steps=5)).id
        for i in range(2)
    ]
    for run_id in runs:
        await sessions.start_run(org, run_id)
    statuses = await asyncio.wait_for(
        asyncio.gather(*(sessions.wait_run(org, r) for r in runs)), timeout=240
    )
    assert statuses == [RunStatus.COMPLETED] * len(runs)

    kills = await rows(db, "SELECT idem_key FROM idem_test_kills WHERE run_id = ANY(%s)", runs)
    assert {k["idem_key"] for k in kills} == {f"{r}:{s}" for r in runs for s in range(FACTS)}
    facts = await rows(
        db,
        "SELECT id, run_id, step_index, idempotency_key FROM memories "
        "WHERE org_id = %s AND kind = 'SEMANTIC'",
        org,
    )
    for run_id in runs:
        run = await local.store.get_run(org, run_id)
        assert [s.step_index for s in run.steps] == list(range(FACTS + 1))
        mine = [f for f in facts if f["run_id"] == run_id]
        # Exactly one fact per (run, step), though each step's write ran twice...
        assert sorted(f["step_index"] for f in mine) == list(range(FACTS)), mine
        assert all(f["idempotency_key"] == f"{run_id}:{f['step_index']}" for f in mine)
        # ...and each is the one its step observed.
        observed = {
            s.step_index: s.observation.output["id"] for s in run.steps if s.observation is not None
        }
        assert observed == {f["step_index"]: str(f["id"]) for f in mine}
        audit = await local.store.audit_rows(org, run_id=run_id)
        for step in range(FACTS):
            seen = [a["status"] for a in audit if a["step_index"] == step]
            assert seen == ["INTERRUPTED", "OK"], (run_id, step, seen)
    assert not [f for f in facts if f["run_id"] is None]


async def test_the_http_idempotency_key_header_reaches_the_tool(make_runtime, db, org) -> None:
    httpx2 = pytest.importorskip("httpx2")
    from serve import create_app

    runtime = await make_runtime()
    await runtime.store.ensure_org(org)
    ada = Principal(id="ada", org_id=org, is_admin=True, grant=Grant(tools=frozenset({"*"})))
    key, _ = await runtime.store.create_api_key(ada, "ada's key")
    agent = await runtime.create_agent(org, "memo")
    transport = httpx2.ASGITransport(app=create_app(runtime))
    url = f"/api/orgs/{org}/tools/remember_fact"
    body = {"agentId": str(agent.id), "args": FACT}
    auth = {"Authorization": f"Bearer {key}"}
    async with httpx2.AsyncClient(transport=transport, base_url="http://api") as client:
        keyed = {**auth, "Idempotency-Key": "order-42"}
        first = await client.post(url, headers=keyed, json=body)
        again = await client.post(url, headers=keyed, json=body)
        assert first.status_code == again.status_code == 200
        assert first.json()["status"] == "OK" and again.json()["output"] == first.json()["output"]
        plain = await client.post(url, headers=auth, json=body)
        assert plain.json()["output"]["id"] != first.json()["output"]["id"]
        bad = await client.post(url, headers={**auth, "Idempotency-Key": "x" * 201}, json=body)
        assert bad.status_code == 422
    stored = await semantic(db, org)
    assert len(stored) == 2
    assert stored[0]["idempotency_key"] == f"call:ada:{agent.id}:remember_fact:order-42"
