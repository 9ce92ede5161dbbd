"""Lifecycle calls are idempotent: ending an ended session, cancelling a finished run and
revoking a revoked key answer with the current state and touch nothing (no executor, no
actor, no write). Also the seed's names: ``stepsJson`` beside ``steps``, and a key created
without a grant says so.

The HTTP API runs in-process (ASGI) on the real runtime and the embedded PostgreSQL, in
front of an ``InProcessExecutor`` that counts what it is asked to do; the CLI runs as a real
subprocess on the same database.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from uuid import UUID

import httpx2
import pytest

from cortex_ray import (
    AgentAction,
    AgentMode,
    Grant,
    InProcessExecutor,
    MemoryRecord,
    Principal,
    RunMode,
    RunStatus,
    Runtime,
    Settings,
)
from cortex_ray.evals import cassette_from_run
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import ChatRequest, HashEmbedder, ScriptedModelClient
from cortex_ray.observability import metrics
from cortex_ray.storage import Database

EVERYTHING = Grant(tools=frozenset({"*"}))


class Gate:
    """The scripted planner: reads the clock at every step; from step ``hold_at`` on it
    waits for ``release`` (so a test can act while a run is between two steps)."""

    def __init__(self, hold_at: int | None = None) -> None:
        self.hold_at = hold_at
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, request: ChatRequest) -> str:
        props = (request.response_schema or {}).get("properties", {})
        text = "\n".join(m.content or "" for m in request.messages)
        if "candidates" in props:
            if "finish now" in text:
                done = {"finish": True, "message": "Done.", "rationale": "asked to"}
                return json.dumps({"candidates": [done]})
            # The composer says which step this is ("Step 2 of 6.").
            step = next((n for n in range(1, 65) if f"Step {n} of" in text), 1)
            if self.hold_at is not None and step >= self.hold_at:
                self.holding.set()
                await self.release.wait()
            clock = {"tool": "current_time", "args": {}, "rationale": "read the clock"}
            return json.dumps({"candidates": [clock]})
        if "scores" in props:
            n = int(props["scores"].get("maxItems", 1))
            return json.dumps({"scores": [5] * n})
        if "best" in props:
            listed = props["best"]["enum"]
            return json.dumps({"assessments": ["ok"] * len(listed), "best": listed[0]})
        if "importance" in props:
            return json.dumps({"importance": 3})
        if "facts" in props:
            return json.dumps({"facts": []})
        return "ok"


class CountingExecutor(InProcessExecutor):
    """The in-process executor, counting the calls that would reach an actor."""

    def __init__(self, runtime: Runtime) -> None:
        super().__init__(runtime)
        self.calls: list[str] = []

    async def start_run(self, org_id: str, run_id: UUID) -> None:
        self.calls.append("start_run")
        await super().start_run(org_id, run_id)

    async def end_session(self, org_id: str, session_id: UUID) -> list[MemoryRecord]:
        self.calls.append("end_session")
        return await super().end_session(org_id, session_id)


@dataclass
class World:
    org: str
    runtime: Runtime
    gate: Gate
    executor: CountingExecutor
    http: httpx2.AsyncClient
    admin: Principal
    ada: Principal
    bob: Principal
    keys: dict[str, dict[str, str]]

    @property
    def base(self) -> str:
        return f"/api/orgs/{self.org}"


@pytest.fixture
async def world(settings: Settings, db: Database, org: str) -> AsyncIterator[World]:
    gate = Gate()
    runtime = await Runtime.open(
        settings,
        model=ScriptedModelClient(responder=gate),
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
        db=db,
    )
    from serve import create_app

    executor = CountingExecutor(runtime)
    admin = Principal(id="root", org_id=org, is_admin=True, grant=EVERYTHING)
    ada = Principal(id="ada", org_id=org, grant=EVERYTHING)
    bob = Principal(id="bob", org_id=org, grant=EVERYTHING)
    keys: dict[str, dict[str, str]] = {}
    for p in (admin, ada, bob):
        created = await runtime.create_api_key(org, p.id, admin=p.is_admin, grant=["*"])
        keys[p.id] = {"Authorization": f"Bearer {created.key}"}
    transport = httpx2.ASGITransport(app=create_app(runtime, executor))
    async with httpx2.AsyncClient(transport=transport, base_url="http://api") as http:
        yield World(org, runtime, gate, executor, http, admin, ada, bob, keys)
    await executor.aclose()
    await runtime.close()


async def audit_labels(w: World) -> list[tuple[str, str, str]]:
    rows = await w.runtime.store.audit_rows(w.org)
    return [(r["tool"], r["status"], r["principal_id"]) for r in rows]


async def intents(db: Database, org: str, run_id: UUID) -> int:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM step_intents WHERE org_id = %s AND run_id = %s",
            (org, run_id),
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


# --- sessions -----------------------------------------------------------------------------


async def test_ending_an_ended_session_answers_with_it_and_wakes_nothing(world: World) -> None:
    w = world
    await w.runtime.create_agent(w.org, "helper", principal=w.admin)
    r = await w.http.post(f"{w.base}/sessions", headers=w.keys["ada"], json={"agentId": "helper"})
    assert r.status_code == 201, r.text
    url = f"{w.base}/sessions/{r.json()['id']}/end"
    first = await w.http.post(url, headers=w.keys["ada"])
    assert first.status_code == 200, first.text
    assert first.json()["session"]["status"] == "ENDED"
    assert w.executor.calls == ["end_session"]
    audited = await audit_labels(w)
    assert audited[-1] == ("sessions.end", "OK", "ada")

    again = await w.http.post(url, headers=w.keys["ada"])
    assert again.status_code == 200, again.text
    assert again.json() == {"session": first.json()["session"], "facts": []}
    assert w.executor.calls == ["end_session"]  # the executor (an actor) was not asked
    assert await audit_labels(w) == audited  # nothing written
    # Still decided: another caller may not end it, ended or not.
    other = await w.http.post(url, headers=w.keys["bob"])
    assert other.status_code == 403 and other.json()["error"]["code"] == "forbidden"


# --- runs ---------------------------------------------------------------------------------


async def test_cancelling_a_run_ends_it_and_cancelling_again_changes_nothing(
    world: World, db: Database
) -> None:
    w = world
    worker = await w.runtime.create_agent(
        w.org, "worker", mode=AgentMode.AUTONOMOUS, tools=["current_time"]
    )
    run = await w.runtime.start_run(w.org, worker.id, "read the clock", caller_id="ada")
    await w.runtime.store.insert_intent(w.org, run.id, 0, AgentAction(tool="current_time"))
    assert await intents(db, w.org, run.id) == 1
    url = f"{w.base}/tasks/{run.id}/cancel"

    refused = await w.http.post(url, headers=w.keys["bob"])  # not the run's caller
    assert refused.status_code == 403, refused.text
    assert (await w.runtime.run_status(w.org, run.id)) is RunStatus.RUNNING

    first = await w.http.post(url, headers=w.keys["ada"], json={"reason": "wrong goal"})
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["status"] == "CANCELLED" and body["reason"] == "cancelled by ada: wrong goal"
    assert body["finishedAt"] is not None
    assert await intents(db, w.org, run.id) == 0  # removed with the status, one transaction
    rows = await w.runtime.store.audit_rows(w.org, run_id=run.id)
    assert [(r["tool"], r["status"], r["principal_id"]) for r in rows][-1] == (
        "tasks.cancel", "OK", "ada",
    )  # fmt: skip
    audited = await audit_labels(w)

    again = await w.http.post(url, headers=w.keys["root"])
    assert again.status_code == 200, again.text
    assert again.json() == body  # the current state, unchanged (same reason, same finish)
    assert await audit_labels(w) == audited  # nothing written
    assert w.executor.calls == []  # cancelling never asks an executor

    # A run that completed stays completed.
    done = await w.runtime.run_autonomous(w.org, worker.id, "finish now", caller_id="ada")
    assert done.status is RunStatus.COMPLETED
    r = await w.http.post(f"{w.base}/tasks/{done.id}/cancel", headers=w.keys["ada"])
    assert r.status_code == 200 and r.json()["status"] == "COMPLETED"
    assert r.json()["reason"] == done.reason and r.json()["finishedAt"] is not None
    # Unknown runs are not found.
    missing = await w.http.post(f"{w.base}/tasks/{UUID(int=3)}/cancel", headers=w.keys["root"])
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


async def test_a_cancelled_run_stops_its_driver_at_the_next_step(world: World) -> None:
    w = world
    w.gate.hold_at = 2
    worker = await w.runtime.create_agent(
        w.org, "clock", mode=AgentMode.AUTONOMOUS, tools=["current_time"]
    )
    run = await w.runtime.start_run(w.org, worker.id, "keep reading", max_steps=6)
    driving = asyncio.create_task(w.runtime.drive_run(w.org, run.id))
    await asyncio.wait_for(w.gate.holding.wait(), 30)  # step 1 committed, step 2 deciding
    cancelled = await w.runtime.cancel_run(w.org, run.id, principal=w.admin)
    assert cancelled.status is RunStatus.CANCELLED and cancelled.reason == "cancelled by root"
    steps_at_cancel = len(cancelled.steps)
    assert steps_at_cancel == 1
    w.gate.release.set()
    await asyncio.wait_for(driving, 30)
    final = await w.runtime.get_run(w.org, run.id)
    assert final.status is RunStatus.CANCELLED and final.reason == "cancelled by root"
    assert len(final.steps) == steps_at_cancel  # no step committed after the cancel


class Recorded:
    """A metrics sink that keeps what it was handed."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str]]] = []

    def record(self, spec: metrics.MetricSpec, value: float, labels: Mapping[str, str]) -> None:
        self.seen.append((spec.name, dict(labels)))


async def test_a_cancelled_run_is_terminal_everywhere(world: World, db: Database) -> None:
    """CANCELLED is an end like COMPLETED and FAILED: counted once as its outcome, never
    resumed, leased, swept as an orphan or shown stalled; a shadow run cancelled can be
    labelled; a case can be recorded from it."""
    w = world
    w.gate.hold_at = 2
    worker = await w.runtime.create_agent(
        w.org, "stopped", mode=AgentMode.AUTONOMOUS, tools=["current_time"]
    )
    run = await w.runtime.start_run(
        w.org, worker.id, "keep reading", max_steps=6, run_mode=RunMode.SHADOW, caller_id="ada"
    )
    sink = Recorded()
    metrics.install_metrics(sink)
    try:
        driving = asyncio.create_task(w.runtime.drive_run(w.org, run.id))
        await asyncio.wait_for(w.gate.holding.wait(), 30)
        await w.runtime.cancel_run(w.org, run.id, principal=w.ada)
        w.gate.release.set()
        assert (await asyncio.wait_for(driving, 30)).status is RunStatus.CANCELLED
    finally:
        metrics.uninstall_metrics(sink)
    outcomes = [labels["outcome"] for name, labels in sink.seen if name == "cortex_runs_finished"]
    assert outcomes == ["CANCELLED"]  # counted by the cancel; the driver that lost it: not

    assert (await w.runtime.resume_run(w.org, run.id)).status is RunStatus.CANCELLED
    assert run.id not in {r.id for r in await w.runtime.store.running_runs(w.org)}
    lease = await w.runtime.cycle.leases.acquire(w.org, run.id, "someone", w.runtime.settings.runs)
    assert lease is None  # nobody can take it to drive it
    diagnosis = await w.runtime.run_diagnostics(w.org, run.id)
    assert diagnosis.status == "CANCELLED" and not diagnosis.stalled
    labelled = await w.http.post(
        f"{w.base}/tasks/{run.id}/label", headers=w.keys["ada"], json={"label": "rejected"}
    )
    assert labelled.status_code in (200, 201), labelled.text
    task = (await w.http.get(f"{w.base}/tasks/{run.id}", headers=w.keys["ada"])).json()
    assert task["status"] == "CANCELLED" and task["reason"] == "cancelled by ada"
    full = await w.runtime.store.get_run(w.org, run.id, recordings=True)
    assert cassette_from_run(full).status is RunStatus.CANCELLED


# --- the seed's names ---------------------------------------------------------------------


async def test_task_bodies_carry_steps_json_beside_steps(world: World) -> None:
    w = world
    worker = await w.runtime.create_agent(
        w.org, "seed", mode=AgentMode.AUTONOMOUS, tools=["current_time"]
    )
    run = await w.runtime.run_autonomous(w.org, worker.id, "tick", max_steps=2, caller_id="ada")
    assert len(run.steps) == 2
    task = (await w.http.get(f"{w.base}/tasks/{run.id}", headers=w.keys["ada"])).json()
    assert isinstance(task["stepsJson"], str)
    assert json.loads(task["stepsJson"]) == task["steps"]
    assert [s["index"] for s in task["steps"]] == [0, 1]
    listed = (await w.http.get(f"{w.base}/tasks", headers=w.keys["ada"])).json()["tasks"]
    assert all("steps" not in t and "stepsJson" not in t for t in listed)


# --- API keys -----------------------------------------------------------------------------


async def test_revoking_a_revoked_key_answers_with_when_and_writes_nothing(world: World) -> None:
    w = world
    created = await w.runtime.create_api_key(w.org, "svc", grant=["current_time"])
    assert created.warnings == ()
    first = await w.runtime.revoke_api_key(w.org, created.key_id, principal=w.admin)
    assert first.revoked_now and first.key_id == created.key_id
    assert await w.runtime.authenticate(created.key) is None
    audited = await audit_labels(w)
    assert audited[-1] == ("api_keys.revoke", "OK", "root")
    again = await w.runtime.revoke_api_key(w.org, created.key_id, principal=w.admin)
    assert not again.revoked_now and again.revoked_at == first.revoked_at
    assert await audit_labels(w) == audited


async def test_a_key_without_a_grant_says_it_can_do_nothing_yet(world: World) -> None:
    w = world
    bare = await w.runtime.create_api_key(w.org, "nobody")
    assert bare.principal.grant is None
    assert len(bare.warnings) == 1 and "no grant" in bare.warnings[0]
    assert "--grant" in bare.warnings[0]
    empty = await w.runtime.create_api_key(w.org, "empty", grant=[])
    assert empty.warnings and "no grant" in empty.warnings[0]


def cli(db: Database, org: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORTEX_")}
    env |= {
        "CORTEX_DATABASE_URL": db.dsn,
        "CORTEX_EMBEDDING_BACKEND": "hash",
        "CORTEX_MODEL_BACKEND": "none",
        "HF_HUB_OFFLINE": "1",
        "COLUMNS": "200",
    }
    return subprocess.run(
        [sys.executable, "-m", "cortex_ray.cli", "--org", org, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_the_command_line_cancels_runs_revokes_twice_and_warns(
    world: World, db: Database
) -> None:
    w = world
    worker = await w.runtime.create_agent(
        w.org, "cli-worker", mode=AgentMode.AUTONOMOUS, tools=["current_time"]
    )
    run = await w.runtime.start_run(w.org, worker.id, "wait")

    def cancel() -> subprocess.CompletedProcess[str]:
        return cli(db, w.org, "runs", "cancel", str(run.id), "--reason", "not needed")

    first = await asyncio.to_thread(cancel)
    assert first.returncode == 0, first.stderr
    assert "status: CANCELLED" in first.stdout
    assert "cancelled by operator: not needed" in first.stdout
    again = await asyncio.to_thread(cancel)
    assert again.returncode == 0, again.stderr
    assert f"run {run.id} already ended: CANCELLED" in again.stderr
    assert "cancelled by operator: not needed" in again.stdout
    resumed = await asyncio.to_thread(cli, db, w.org, "runs", "resume", str(run.id))
    assert resumed.returncode == 5, resumed.stderr  # CANCELLED's own exit code, not resumed
    assert f"run {run.id} already ended: CANCELLED" in resumed.stderr

    made = await asyncio.to_thread(cli, db, w.org, "api-keys", "create", "dana")
    assert made.returncode == 0, made.stderr
    assert "warning: principal 'dana' has no grant" in made.stderr
    key_id = next(
        line.split(": ", 1)[1] for line in made.stdout.splitlines() if line.startswith("key id")
    )
    granted = await asyncio.to_thread(
        cli, db, w.org, "api-keys", "create", "erin", "--grant", "current_time"
    )
    assert granted.returncode == 0 and "warning" not in granted.stderr, granted.stderr
    revoked = await asyncio.to_thread(cli, db, w.org, "api-keys", "revoke", key_id)
    assert revoked.returncode == 0 and f"revoked key {key_id}" in revoked.stdout, revoked.stderr
    twice = await asyncio.to_thread(cli, db, w.org, "api-keys", "revoke", key_id)
    assert twice.returncode == 0, twice.stderr
    assert f"key already revoked: {key_id}" in twice.stdout
