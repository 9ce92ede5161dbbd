"""One driver per run: the run lease, its fencing token, and the supervisor's sweep.

Two ``Runtime`` objects on the one embedded PostgreSQL stand for two processes (the API's
executor and a ``cortex-ray runs resume``): each has its own driver id. The model is
scripted and stateless (it reads the step number from the prompt), and the side-effecting
tool writes to an idempotent receiver keyed by the step's idempotency key, logging every
call, so the tests can count effects and calls per step.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any
from uuid import UUID

import pytest

from cortex_ray import (
    AgentMode,
    InProcessExecutor,
    LeaseLost,
    RunPolicy,
    RunStatus,
    RunSupervisor,
    Runtime,
    Settings,
)
from cortex_ray.act import Tool, ToolContext
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import ChatRequest, HashEmbedder, ScriptedModelClient
from cortex_ray.storage import Database, RunLease, fenced

STEP = re.compile(r"Step (\d+) of (\d+)\.")
EFFECTS = 3  # steps 0..2 apply e0..e2, step 3 finishes


def plan(request: ChatRequest) -> str:
    """Stateless: the step number comes from the prompt."""
    assert request.schema_name == "proposals", request.schema_name
    match = STEP.search("\n".join(m.content or "" for m in request.messages))
    assert match is not None
    step = int(match.group(1))  # 1-based
    if step <= EFFECTS:
        action: dict[str, Any] = {
            "tool": "apply_effect",
            "args": {"name": f"e{step - 1}"},
            "rationale": "r",
        }
    else:
        action = {"finish": True, "message": "all applied", "rationale": "r"}
    return json.dumps({"candidates": [action]})


Gate = Callable[[ToolContext], Awaitable[None]]


async def no_gate(ctx: ToolContext) -> None:
    return None


async def apply_effect(
    holder: dict[str, Any], ctx: ToolContext, args: dict[str, Any]
) -> dict[str, Any]:
    """An effect applied once per idempotency key (as a payment API would), every call
    logged; ``holder["gate"]`` may hold the call after the effect (a stalled driver)."""
    db: Database = holder["db"]
    async with db.connection() as conn:
        await conn.execute(
            "INSERT INTO lease_test_calls (idem_key, run_id, driver) VALUES (%s, %s, %s)",
            (ctx.idempotency_key, ctx.run_id, holder["name"]),
        )
        cur = await conn.execute(
            "INSERT INTO lease_test_effects (idem_key, run_id, effect) VALUES (%s, %s, %s) "
            "ON CONFLICT (idem_key) DO NOTHING",
            (ctx.idempotency_key, ctx.run_id, args["name"]),
        )
        applied = cur.rowcount == 1
    gate: Gate = holder.get("gate", no_gate)
    await gate(ctx)
    return {"effect": args["name"], "applied": applied}


async def open_runtime(
    settings: Settings, db: Database, name: str, runs: RunPolicy | None = None
) -> Runtime:
    holder: dict[str, Any] = {"name": name}
    tool = Tool(
        name="apply_effect",
        description="Apply a named effect to the outside world (not idempotent).",
        handler=partial(apply_effect, holder),
        parameters={
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
            "additionalProperties": False,
        },
    )
    update: dict[str, Any] = {"embedding_backend": "hash", "candidates": 1}
    if runs is not None:
        update["runs"] = runs
    runtime = await Runtime.open(
        settings.model_copy(update=update),
        db=db,
        model=ScriptedModelClient(responder=plan),
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
        tools=[tool],
    )
    holder["db"] = runtime.db
    runtime.test_holder = holder  # type: ignore[attr-defined]
    return runtime


@pytest.fixture(scope="module")
async def effect_tables(db: Database) -> None:
    async with db.transaction() as conn:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS lease_test_effects (idem_key text PRIMARY KEY, "
            "run_id uuid NOT NULL, effect text NOT NULL)"
        )
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS lease_test_calls (id bigserial PRIMARY KEY, "
            "idem_key text NOT NULL, run_id uuid NOT NULL, driver text NOT NULL)"
        )


@pytest.fixture
async def pair(
    db: Database, settings: Settings, effect_tables: None
) -> AsyncIterator[tuple[Runtime, Runtime]]:
    """Two drivers (think: the API's executor and a CLI's ``runs resume``)."""
    a = await open_runtime(settings, db, "a")
    b = await open_runtime(settings, db, "b")
    yield a, b
    await a.close(close_db=False)
    await b.close(close_db=False)


async def rows(db: Database, sql: str, *params: Any) -> list[dict[str, Any]]:
    async with db.connection() as conn:
        cur = await conn.execute(sql, params)
        return list(await cur.fetchall())


async def check_one_of_everything(db: Database, org: str, run_id: UUID, steps: int) -> None:
    """The run's invariants after any race: contiguous steps, one effect and one EPISODIC
    memory per acting step, no intent left, the lease released."""
    ledger = await rows(
        db,
        "SELECT step_index FROM run_steps WHERE org_id = %s AND run_id = %s ORDER BY 1",
        org,
        run_id,
    )
    assert [r["step_index"] for r in ledger] == list(range(steps))
    effects = await rows(
        db, "SELECT idem_key, effect FROM lease_test_effects WHERE run_id = %s", run_id
    )
    assert sorted((r["idem_key"], r["effect"]) for r in effects) == [
        (f"{run_id}:{i}", f"e{i}") for i in range(EFFECTS)
    ]
    memories = await rows(
        db,
        "SELECT step_index, count(*) AS n FROM memories WHERE org_id = %s AND run_id = %s "
        "AND kind = 'EPISODIC' GROUP BY step_index ORDER BY step_index NULLS LAST",
        org,
        run_id,
    )
    # One per acting step, and the run's result (step_index NULL) once.
    assert [(r["step_index"], r["n"]) for r in memories] == [
        *((i, 1) for i in range(EFFECTS)),
        (None, 1),
    ]
    ok = await rows(
        db,
        "SELECT step_index, count(*) AS n FROM audit_log WHERE org_id = %s AND run_id = %s "
        "AND mode IS NOT NULL AND status = 'OK' GROUP BY step_index ORDER BY 1",
        org,
        run_id,
    )
    assert [(r["step_index"], r["n"]) for r in ok] == [(i, 1) for i in range(EFFECTS)]
    assert await rows(db, "SELECT 1 FROM step_intents WHERE run_id = %s", run_id) == []
    (run,) = await rows(
        db, "SELECT status, lease_owner, lease_expires_at FROM task_runs WHERE id = %s", run_id
    )
    assert (run["status"], run["lease_owner"], run["lease_expires_at"]) == ("COMPLETED", None, None)


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]


async def test_two_drivers_racing_on_one_run_never_both_drive_it(
    pair: tuple[Runtime, Runtime], org: str, db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's race, 30 times: the API's executor drives a run while a second driver
    resumes it (at the same moment, or a little later, mid-run). One takes the lease, the
    other returns the run as it is: no step twice, no UniqueViolation, no orphan intent."""
    caplog.set_level(logging.INFO)
    a, b = pair
    agent = await a.create_agent(
        org, "racer", mode=AgentMode.AUTONOMOUS, tools=["apply_effect", "current_time"]
    )
    rng = random.Random(13)
    refused = 0
    for _ in range(30):
        run = await a.start_run(org, agent.id, "apply three effects", max_steps=6)
        delay = rng.choice([0.0, 0.0, 0.001, 0.005, 0.02])

        async def second(delay: float = delay, run_id: UUID = run.id) -> Any:
            await asyncio.sleep(delay)
            return await b.resume_run(org, run_id)

        first, other = await asyncio.gather(a.drive_run(org, run.id), second())
        finals = {first.status, other.status}
        # The driver that was refused returned the run as it was (RUNNING, or ended).
        refused += RunStatus.RUNNING in finals
        assert RunStatus.COMPLETED in finals or (
            await a.store.run_status(org, run.id) is RunStatus.COMPLETED
        )
        await check_one_of_everything(db, org, run.id, EFFECTS + 1)
        calls = await rows(
            db, "SELECT idem_key, count(*) AS n FROM lease_test_calls WHERE run_id = %s "
            "GROUP BY idem_key", run.id,
        )  # fmt: skip
        assert all(r["n"] == 1 for r in calls), calls  # nobody acted twice
    assert refused, "the second driver never met the first one's lease"
    assert errors(caplog) == []
    assert "UniqueViolation" not in caplog.text


async def test_a_stalled_driver_whose_lease_was_taken_writes_nothing_more(
    db: Database, settings: Settings, effect_tables: None, org: str,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """A driver stalls inside a tool (after its effect) past its lease; another takes the
    run over. The new holder sees the step's intent (effect unknown), decides the step again
    with the same idempotency key (the effect is not applied twice), and finishes. The
    stalled one wakes up: its step is refused by the fence (LeaseLost, rolled back: no
    ledger row, audit row or memory of its own), and it stops quietly."""
    caplog.set_level(logging.INFO)
    # Renewed rarely: the stall is not covered by a heartbeat (as in a frozen process).
    slow = RunPolicy(lease_ttl_s=600, lease_renew_s=300)
    a = await open_runtime(settings, db, "a", slow)
    b = await open_runtime(settings, db, "b", slow)
    stalled = asyncio.Event()
    wake = asyncio.Event()

    async def stall_at_step_1(ctx: ToolContext) -> None:
        if ctx.step_index == 1:
            stalled.set()
            await wake.wait()

    a.test_holder["gate"] = stall_at_step_1  # type: ignore[attr-defined]
    try:
        agent = await a.create_agent(
            org, "staller", mode=AgentMode.AUTONOMOUS, tools=["apply_effect"]
        )
        run = await a.start_run(org, agent.id, "apply three effects", max_steps=6)
        first = asyncio.create_task(a.drive_run(org, run.id))
        await asyncio.wait_for(stalled.wait(), 60)
        # While A holds a live lease, B is refused.
        refused = await b.drive_run(org, run.id)
        assert refused.status is RunStatus.RUNNING and len(refused.steps) == 1
        holder = await b.run_lease(org, run.id)
        assert holder.owner == a.driver_id and holder.live
        # A's lease runs out (a frozen process): B takes the run and finishes it.
        async with db.transaction() as conn:
            await conn.execute(
                "UPDATE task_runs SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
                (run.id,),
            )
        taken = await b.drive_run(org, run.id)
        assert taken.status is RunStatus.COMPLETED
        wake.set()
        late = await asyncio.wait_for(first, 60)
        assert late.status is RunStatus.COMPLETED  # the run as it is now, B's work
    finally:
        wake.set()
        await a.close(close_db=False)
        await b.close(close_db=False)
    await check_one_of_everything(db, org, run.id, EFFECTS + 1)
    calls = await rows(
        db, "SELECT idem_key, driver FROM lease_test_calls WHERE run_id = %s ORDER BY id", run.id
    )
    key = f"{run.id}:1"
    # Step 1 was called by both (A stalled in it, B decided it again), with the same key.
    assert [(c["idem_key"], c["driver"]) for c in calls] == [
        (f"{run.id}:0", "a"), (key, "a"), (key, "b"), (f"{run.id}:2", "b"),
    ]  # fmt: skip
    audit = await rows(
        db, "SELECT step_index, status FROM audit_log WHERE run_id = %s AND mode IS NOT NULL "
        "ORDER BY id", run.id,
    )  # fmt: skip
    assert [(r["step_index"], r["status"]) for r in audit] == [
        (0, "OK"), (1, "INTERRUPTED"), (1, "OK"), (2, "OK"),
    ]  # fmt: skip
    assert errors(caplog) == []
    assert any("stopped driving" in r.getMessage() for r in caplog.records)


async def test_a_fenced_write_with_an_old_token_raises_lease_lost(
    pair: tuple[Runtime, Runtime], org: str, db: Database
) -> None:
    a, b = pair
    agent = await a.create_agent(org, "fence", mode=AgentMode.AUTONOMOUS, tools=["apply_effect"])
    run = await a.start_run(org, agent.id, "apply", max_steps=6)
    policy = a.settings.runs
    first = await a.cycle.leases.acquire(org, run.id, a.driver_id, policy)
    assert first is not None
    # The same owner takes its own live lease again at once (a restarted run actor): a
    # new token, and the old one is fenced off.
    again = await a.cycle.leases.acquire(org, run.id, a.driver_id, policy)
    assert again is not None and again.token == first.token + 1
    assert await b.cycle.leases.acquire(org, run.id, b.driver_id, policy) is None
    with pytest.raises(LeaseLost):
        async with fenced(db, first) as conn:
            await conn.execute("SELECT 1")
    async with fenced(db, again) as conn:
        await conn.execute("SELECT 1")
    # A cancelled (ended) run fences off its holder too.
    await a.store.fail_run(org, run.id, "cancelled by test")
    with pytest.raises(LeaseLost):
        async with fenced(db, again):
            pass
    stale = RunLease(org, run.id, "nobody", again.token)
    with pytest.raises(LeaseLost):
        async with fenced(db, stale):
            pass


async def test_a_dead_owners_lease_is_taken_after_it_expires_and_not_before(
    pair: tuple[Runtime, Runtime], org: str, db: Database
) -> None:
    a, _ = pair
    agent = await a.create_agent(org, "heir", mode=AgentMode.AUTONOMOUS, tools=["apply_effect"])
    run = await a.start_run(org, agent.id, "apply three effects", max_steps=6)
    dead = "gone-host:4242:deadbeef"
    async with db.transaction() as conn:
        await conn.execute(
            "UPDATE task_runs SET lease_owner = %s, lease_token = lease_token + 1, "
            "lease_expires_at = now() + interval '1 hour', attempts = 1, "
            "created_at = now() - interval '1 hour' WHERE id = %s",
            (dead, run.id),
        )
    untouched = await a.drive_run(org, run.id)
    assert untouched.status is RunStatus.RUNNING and untouched.steps == ()
    holder = await a.run_lease(org, run.id)
    assert (holder.owner, holder.live) == (dead, True)
    assert run.id not in {o.run_id for o in await a.orphaned_runs()}

    async with db.transaction() as conn:
        await conn.execute(
            "UPDATE task_runs SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
            (run.id,),
        )
    orphan = next(o for o in await a.orphaned_runs() if o.run_id == run.id)
    assert (orphan.org_id, orphan.attempts) == (org, 1)
    done = await a.drive_run(org, run.id)
    assert done.status is RunStatus.COMPLETED
    await check_one_of_everything(db, org, run.id, EFFECTS + 1)
    (row,) = await rows(db, "SELECT attempts, lease_token FROM task_runs WHERE id = %s", run.id)
    # Taken once more (attempts count takes since the last recorded step: 1 after progress).
    assert row["attempts"] == 1 and row["lease_token"] >= 2


class OrgExecutor:
    """Forwards only this test's organisation to the in-process executor: the sweep sees
    every organisation's runs in the shared test database, and other tests' leftovers are
    none of this test's business."""

    def __init__(self, runtime: Runtime, org: str) -> None:
        self.inner = InProcessExecutor(runtime)
        self.org = org
        self.started: list[UUID] = []
        self.handed = asyncio.Event()

    async def start_run(self, org_id: str, run_id: UUID) -> None:
        if org_id == self.org:
            self.started.append(run_id)
            self.handed.set()
            await self.inner.start_run(org_id, run_id)

    async def recover_turn(self, org_id: str, session_id: UUID, turn_id: UUID) -> None:
        return None  # turns are not this test's

    async def turn(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - unused
        raise NotImplementedError

    async def end_session(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover
        raise NotImplementedError


async def test_the_supervisor_resumes_orphans_and_fails_runs_out_of_attempts(
    db: Database,
    settings: Settings,
    effect_tables: None,
    org: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy = RunPolicy(max_attempts=3, orphan_grace_s=0.0, supervise_interval_s=3600)
    runtime = await open_runtime(settings, db, "sup", policy)
    executor = OrgExecutor(runtime, org)
    supervisor = RunSupervisor(runtime, executor)  # type: ignore[arg-type]
    try:
        agent = await runtime.create_agent(
            org, "orphans", mode=AgentMode.AUTONOMOUS, tools=["apply_effect"]
        )
        interrupted = await runtime.start_run(org, agent.id, "apply three effects", max_steps=6)
        hopeless = await runtime.start_run(org, agent.id, "apply three effects", max_steps=6)
        # Its driver died after the third take without recording a step.
        async with db.transaction() as conn:
            await conn.execute(
                "UPDATE task_runs SET attempts = 3, lease_owner = 'x', lease_token = 3, "
                "lease_expires_at = now() - interval '1 second' WHERE id = %s",
                (hopeless.id,),
            )
        # A run being driven (a live lease) is left alone.
        held = await runtime.start_run(org, agent.id, "apply three effects", max_steps=6)
        lease = await runtime.cycle.leases.acquire(org, held.id, "elsewhere", policy)
        assert lease is not None

        await supervisor.start()  # the first sweep runs at once
        await asyncio.wait_for(executor.handed.wait(), 30)
        assert executor.started == [interrupted.id]
        await executor.inner.wait(interrupted.id)
        done = await runtime.store.get_run(org, interrupted.id)
        assert done.status is RunStatus.COMPLETED
        await check_one_of_everything(db, org, interrupted.id, EFFECTS + 1)

        failed = await runtime.store.get_run(org, hopeless.id)
        assert failed.status is RunStatus.FAILED and failed.reason is not None
        assert "gave up after 3 attempts" in failed.reason
        assert hopeless.id not in executor.started
        assert (await runtime.store.run_status(org, held.id)) is RunStatus.RUNNING
        assert held.id not in executor.started
        # The resume is said, at WARNING (seen with no logging configured, as in the API
        # replica), once, naming the run and the attempt (docs/operations.md).
        said = [
            r
            for r in caplog.records
            if r.name == "cortex_ray.supervisor" and "nobody was driving it" in r.getMessage()
        ]
        mine = [r for r in said if f"org {org})" in r.getMessage()]
        assert [(r.levelno, r.getMessage()) for r in mine] == [
            (
                logging.WARNING,
                f"run {interrupted.id} (org {org}): nobody was driving it; resumed (attempt 1)",
            )
        ]
    finally:
        await supervisor.aclose()
        await executor.inner.aclose()
        await runtime.close(close_db=False)
    # close() released the lease this runtime still held.
    (row,) = await rows(db, "SELECT lease_owner FROM task_runs WHERE id = %s", held.id)
    assert row["lease_owner"] is None


async def test_a_run_taken_too_often_without_progress_ends_failed_when_taken(
    pair: tuple[Runtime, Runtime], org: str, db: Database
) -> None:
    """A driver that keeps dying before its first step (a run actor Ray restarts again and
    again) takes its own lease each time: after ``max_attempts`` the next take ends it."""
    a, _ = pair
    agent = await a.create_agent(org, "crashy", mode=AgentMode.AUTONOMOUS, tools=["apply_effect"])
    run = await a.start_run(org, agent.id, "apply", max_steps=6)
    limit = a.settings.runs.max_attempts
    for _ in range(limit):
        assert await a.cycle.leases.acquire(org, run.id, "actor", a.settings.runs) is not None
    assert await a.cycle.leases.acquire(org, run.id, "actor", a.settings.runs) is None
    ended = await a.store.get_run(org, run.id)
    assert ended.status is RunStatus.FAILED
    assert ended.reason is not None and f"gave up after {limit} attempts" in ended.reason


def test_the_run_policy_refuses_a_renewal_slower_than_the_lease() -> None:
    with pytest.raises(ValueError, match="lease_renew_s"):
        RunPolicy(lease_ttl_s=5, lease_renew_s=5)
    assert Settings().runs == RunPolicy()


CLI = [sys.executable, "-m", "cortex_ray.cli"]


async def test_runs_resume_on_a_held_run_says_who_holds_it_and_can_wait_for_it(
    pair: tuple[Runtime, Runtime], org: str, db: Database
) -> None:
    """`cortex-ray runs resume` while the API drives the run: it says who holds the run
    and leaves it alone, at once (before it loads a model) and as its one error line;
    with --wait it waits, and takes the run over once the holder lets go."""
    a, _ = pair
    agent = await a.create_agent(org, "held", mode=AgentMode.AUTONOMOUS, tools=["current_time"])
    run = await a.start_run(org, agent.id, "check the time", max_steps=2)
    api = "api-host:4242:cafe0001"
    lease = await a.cycle.leases.acquire(org, run.id, api, a.settings.runs)
    assert lease is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORTEX_")}
    env |= {
        "CORTEX_DATABASE_URL": db.dsn,
        "CORTEX_EMBEDDING_BACKEND": "hash",
        "CORTEX_MODEL_BACKEND": "none",  # the run ends FAILED at once when driven here
        "HF_HUB_OFFLINE": "1",
        "COLUMNS": "200",
    }
    args = [*CLI, "--org", org, "runs", "resume", str(run.id)]
    # A model that cannot load: the refusal comes before any model is opened (it took
    # 38.8 s with the main job's models loaded first), so this never fails on it.
    unloadable = {"CORTEX_MODEL_BACKEND": "local", "CORTEX_MODELS__LOCAL_PATH": "/nowhere.gguf"}
    refused = await asyncio.to_thread(
        subprocess.run, args, env=env | unloadable, capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    (line,) = refused.stderr.strip().splitlines()  # the refusal, first and alone
    assert line.startswith(f"error: run {run.id} is being driven by {api}")
    assert "not resumed here" in line and f"runs show {run.id}" in line
    assert "model file not found" not in refused.stderr
    assert refused.stdout == ""  # no step table before or after it
    assert (await a.store.get_run(org, run.id)).steps == ()

    waiting = await asyncio.create_subprocess_exec(
        *args, "--wait", env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert waiting.stderr is not None
    said = b""
    while b"waiting for it to end" not in said:
        line = await asyncio.wait_for(waiting.stderr.readline(), 120)
        assert line, said.decode()
        said += line
    await a.cycle.leases.release(lease)  # the API stopped driving it
    out, err = await asyncio.wait_for(waiting.communicate(), 120)
    assert waiting.returncode == 3, (out.decode(), said.decode() + err.decode())
    assert "status: FAILED" in out.decode()
    assert "reason: no model configured" in out.decode()
