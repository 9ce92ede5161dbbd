"""Every interrupted run resumes, with nobody polling it.

- The whole stack restarted mid-run: the HTTP API app as a real subprocess (uvicorn, the
  in-process executor, the test's PostgreSQL, a model server on loopback that holds the
  run inside its third step). Stopped by SIGTERM (a clean stop releases the lease) or
  SIGKILL (the lease stays until it expires), then started again: its supervisor finds
  the run RUNNING with no live lease and resumes it. The test reads the database
  directly, never the API, so nothing but the supervisor can have resumed it.
- A run actor's process killed on real Ray: Ray restarts the actor (same name, so the
  same lease owner), which takes its own lease back at once, long before it expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest

from cortex_ray import (
    AgentMode,
    Grant,
    Principal,
    RunPolicy,
    RunStatus,
    Runtime,
    SessionPolicy,
    Settings,
)
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import ChatRequest, ChatResponse, HashEmbedder, ScriptedModelClient
from cortex_ray.storage import Database, Store

ROOT = Path(__file__).resolve().parents[1]
STEP = re.compile(r"Step (\d+) of (\d+)\.")
TOOL_STEPS = 3  # steps 1..3 (1-based) check the time, step 4 finishes
HOLD_AT = 3  # the model holds the third step's decision until released
TERMINAL = {"COMPLETED", "FAILED"}

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def plan(text: str) -> str:
    """The planner's answer for the step the prompt names (stateless)."""
    match = STEP.search(text)
    assert match is not None, text
    step = int(match.group(1))
    if step <= TOOL_STEPS:
        action: dict[str, Any] = {"tool": "current_time", "args": {}, "rationale": "r"}
    else:
        action = {"finish": True, "message": "done", "rationale": "r"}
    return json.dumps({"candidates": [action]})


class GatedModel:
    """OpenAI-compatible ``/v1/chat/completions`` on loopback: plans by the step number in
    the prompt, and holds every decision of step ``HOLD_AT`` of a run whose goal holds
    ``marker`` until :meth:`release` (other runs in the shared test database, which the
    API's supervisor may resume too, are answered at once)."""

    def __init__(self, marker: str) -> None:
        self.released = threading.Event()
        self.held = threading.Event()  # a request of the held step is waiting
        model = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                text = "\n".join(str(m.get("content") or "") for m in body["messages"])
                name = (body.get("response_format") or {}).get("json_schema", {}).get("name")
                match = STEP.search(text)
                held_step = match is not None and int(match.group(1)) == HOLD_AT
                if held_step and marker in text:
                    model.held.set()
                    model.released.wait(timeout=300)
                if name == "proposals":
                    content = plan(text)
                elif name == "scores":
                    content = json.dumps({"scores": [10]})
                else:
                    content = "ok"
                answer = json.dumps(
                    {
                        "id": "gated",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": body.get("model", "gated"),
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": content},
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    }
                ).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except OSError:  # the asking process was stopped meanwhile
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


# The API app as its own process: what `uvicorn serve:create_app --factory` would run, with
# the settings from the environment (the in-process executor: this process drives the run).
SERVE = """
import logging, sys, uvicorn
from serve import create_app
logging.basicConfig(level=logging.INFO)
uvicorn.run(create_app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="info")
"""


@dataclass
class Api:
    process: subprocess.Popen[bytes]
    url: str
    log: Path


def start_api(env: dict[str, str], port: int, log: Path) -> Api:
    out = log.open("ab")
    process = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(port)], cwd=ROOT, env=env, stdout=out, stderr=out
    )
    out.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the API exited with {process.returncode}: {log.read_text()[-3000:]}")
        try:
            if httpx2.get(f"{url}/healthz", timeout=2).status_code == 200:
                return Api(process, url, log)
        except httpx2.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    pytest.fail(f"the API did not come up: {log.read_text()[-3000:]}")


def stop_api(api: Api, how: signal.Signals) -> int:
    if api.process.poll() is None:
        api.process.send_signal(how)
    try:
        return api.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        api.process.kill()
        api.process.wait()
        pytest.fail(f"the API did not stop on {how.name}: {api.log.read_text()[-3000:]}")


async def run_row(db: Database, run_id: uuid.UUID) -> dict[str, Any]:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT r.status, r.lease_owner, r.lease_token, r.attempts, r.lease_expires_at, "
            "now() AS now, (SELECT count(*) FROM run_steps s WHERE s.org_id = r.org_id AND "
            "s.run_id = r.id) AS steps FROM task_runs r WHERE r.id = %s",
            (run_id,),
        )
        row = await cur.fetchone()
    assert row is not None
    return dict(row)


async def until(check: Any, within: float = 120.0, every: float = 0.1) -> Any:
    """Poll ``check`` (async) until truthy; a generous bound so a hang fails, not waits."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = await check()
        if found:
            return found
        await asyncio.sleep(every)
    return await check()


@pytest.fixture
def model(org: str) -> Iterator[GatedModel]:
    gated = GatedModel(goal(org))
    yield gated
    gated.close()


def goal(org: str) -> str:
    return f"check the time three times ({org})"


def api_env(db: Database, model: GatedModel) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORTEX_")}
    env.update(
        CORTEX_DATABASE_URL=db.dsn,
        CORTEX_MODEL_BACKEND="openai",
        CORTEX_MODEL_URL=model.url,
        CORTEX_EMBEDDING_BACKEND="hash",
        CORTEX_IMPORTANCE_SCORING="heuristic",
        CORTEX_CANDIDATES="1",
        # Small, so that a crashed driver's lease runs out soon and the sweep comes often.
        CORTEX_RUNS__LEASE_TTL_S="3",
        CORTEX_RUNS__LEASE_RENEW_S="1",
        CORTEX_RUNS__SUPERVISE_INTERVAL_S="0.5",
        CORTEX_RUNS__ORPHAN_GRACE_S="0",
        HF_HUB_OFFLINE="1",
    )
    return env


async def submit(url: str, store: Store, org: str) -> uuid.UUID:
    await store.ensure_org(org)
    admin = Principal(id="admin", org_id=org, is_admin=True, grant=Grant(tools=frozenset({"*"})))
    key, _ = await store.create_api_key(admin, "restart test")
    auth = {"Authorization": f"Bearer {key}"}
    async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
        agent = await client.post(
            f"/api/orgs/{org}/agents",
            json={"name": "clock", "mode": "AUTONOMOUS", "tools": ["current_time"]},
            headers=auth,
        )
        assert agent.status_code == 201, agent.text
        task = await client.post(
            f"/api/orgs/{org}/tasks",
            json={
                "name": "restart",
                "agentId": agent.json()["id"],
                "assigneeKind": "AGENT",
                "payload": {"goal": goal(org), "maxSteps": 8},
            },
            headers=auth,
        )
        assert task.status_code == 202, task.text
        return uuid.UUID(task.json()["id"])


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
async def test_a_run_interrupted_by_a_restart_finishes_with_nobody_polling(
    how: signal.Signals,
    db: Database,
    store: Store,
    org: str,
    model: GatedModel,
    tmp_path: Path,
) -> None:
    env = api_env(db, model)
    port = _free_port()
    log = tmp_path / "api.log"
    api = start_api(env, port, log)
    try:
        run_id = await submit(api.url, store, org)
        # Mid-run: two steps recorded, the third one's decision held by the model.
        assert await asyncio.to_thread(model.held.wait, 120), log.read_text()[-3000:]
        before = await run_row(db, run_id)
        assert (before["status"], before["steps"]) == ("RUNNING", HOLD_AT - 1)
        assert before["lease_owner"] is not None
        code = stop_api(api, how)
    except BaseException:
        stop_api(api, signal.SIGKILL)
        raise
    stopped = await run_row(db, run_id)
    assert (stopped["status"], stopped["steps"]) == ("RUNNING", HOLD_AT - 1)
    if how is signal.SIGTERM:
        # uvicorn shuts down gracefully (the app's lifespan ends), then re-raises the signal.
        assert code in (0, -signal.SIGTERM), log.read_text()[-3000:]
        assert "Application shutdown complete" in log.read_text()
        # A clean stop released the lease: the next start takes the run at once.
        assert stopped["lease_owner"] is None
    else:
        # Killed: the lease stays the dead process's until it expires.
        assert stopped["lease_owner"] == before["lease_owner"]
    model.release()

    api = start_api(env, port, log)  # nobody asks the API about the run from here on
    try:

        async def ended() -> dict[str, Any] | None:
            row = await run_row(db, run_id)
            return row if row["status"] in TERMINAL else None

        final = await until(ended)
        assert final is not None, f"the run did not end: {log.read_text()[-3000:]}"
    finally:
        stop_api(api, signal.SIGTERM)
    assert final["status"] == "COMPLETED", log.read_text()[-3000:]
    assert final["steps"] == TOOL_STEPS + 1
    assert final["lease_owner"] is None
    assert final["lease_token"] == 2  # taken twice: before the stop, and after
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT step_index FROM run_steps WHERE run_id = %s ORDER BY 1", (run_id,)
        )
        assert [r["step_index"] for r in await cur.fetchall()] == list(range(TOOL_STEPS + 1))
    assert f"run {run_id} (org {org}): nobody was driving it; resumed" in log.read_text()


# --- a run actor killed on real Ray ---------------------------------------------------------


class SlowPlanner(ScriptedModelClient):
    """Plans by step number; each decision takes a moment (so a kill lands mid-run)."""

    async def chat(self, request: ChatRequest) -> ChatResponse:
        await asyncio.sleep(0.3)
        return await super().chat(request)


def planner(request: ChatRequest) -> str:
    return plan("\n".join(m.content or "" for m in request.messages))


@dataclass(frozen=True)
class SlowRuntime:
    """The run actors' runtime factory (shipped to the workers by value)."""

    async def __call__(self, settings: Settings) -> Runtime:
        return await self.open(settings)

    async def open(self, settings: Settings, db: Database | None = None) -> Runtime:
        return await Runtime.open(
            settings,
            model=SlowPlanner(responder=planner),
            embedder=HashEmbedder(384),
            importance=HeuristicImportanceScorer(),
            db=db,
        )


async def test_a_killed_run_actor_takes_its_own_lease_back_at_once(
    ray_cluster: Any, db: Database, settings: Settings, org: str
) -> None:
    ray = pytest.importorskip("ray")
    from actors import DIRECTORY_NAME, ActorKey, SessionManager

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # A lease that would take ten minutes to expire: the restarted actor must not wait.
    runs = RunPolicy(lease_ttl_s=600, lease_renew_s=300)
    actor_settings = settings.model_copy(
        update={"database_url": db.dsn, "pool_max_size": 2, "runs": runs}
    )
    namespace = f"lease-{uuid.uuid4().hex[:8]}"
    sessions = SessionManager(
        actor_settings, factory=SlowRuntime(), policy=SessionPolicy(namespace=namespace)
    )
    local = await SlowRuntime().open(settings, db=db)
    try:
        agent = await local.create_agent(
            org, "killed", mode=AgentMode.AUTONOMOUS, tools=["current_time"]
        )
        run = await local.start_run(org, agent.id, "check the time three times", max_steps=8)
        name = ActorKey.run(org, run.id).name
        await sessions.start_run(org, run.id)

        async def first_step_done() -> dict[str, Any] | None:
            row = await run_row(db, run.id)
            return row if row["steps"] >= 1 and row["lease_owner"] == name else None

        before = await until(first_step_done, within=120)
        assert before is not None and before["status"] == "RUNNING"
        actor = ray.get_actor(name, namespace=namespace)
        os.kill(await actor.pid.remote(), signal.SIGKILL)

        async def taken_again() -> dict[str, Any] | None:
            row = await run_row(db, run.id)
            return row if row["lease_token"] > before["lease_token"] else None

        after = await until(taken_again, within=120)
        assert after is not None, "the restarted actor did not take its lease back"
        # Its own name, so its own lease: taken while the old one was still live.
        assert after["lease_owner"] in (name, None)  # None: it already finished
        assert after["now"] < before["lease_expires_at"]
        status = await sessions.wait_run(org, run.id)
        assert status is RunStatus.COMPLETED
        final = await local.store.get_run(org, run.id)
        assert [s.step_index for s in final.steps] == list(range(TOOL_STEPS + 1))
    finally:
        await local.close(close_db=False)
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(DIRECTORY_NAME, namespace=namespace))


class OneOrg:
    """The executor, for this test's organisation only: a sweep sees every organisation's
    runs in the shared test database, and other tests' leftovers are not this test's."""

    def __init__(self, inner: Any, org: str) -> None:
        self.inner = inner
        self.org = org
        self.handed = 0

    async def start_run(self, org_id: str, run_id: uuid.UUID) -> None:
        if org_id == self.org:
            self.handed += 1
            await self.inner.start_run(org_id, run_id)

    async def recover_turn(self, org_id: str, session_id: uuid.UUID, turn_id: uuid.UUID) -> None:
        return None  # turns are not this test's


async def test_the_supervisor_hands_orphans_to_run_actors_and_a_second_sweep_is_harmless(
    ray_cluster: Any,
    db: Database,
    settings: Settings,
    org: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ray = pytest.importorskip("ray")
    from actors import DIRECTORY_NAME, SessionManager
    from cortex_ray import RunSupervisor

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    actor_settings = settings.model_copy(update={"database_url": db.dsn, "pool_max_size": 2})
    namespace = f"sweep-{uuid.uuid4().hex[:8]}"
    sessions = SessionManager(
        actor_settings, factory=SlowRuntime(), policy=SessionPolicy(namespace=namespace)
    )
    local = await SlowRuntime().open(
        settings.model_copy(update={"runs": RunPolicy(orphan_grace_s=0)}), db=db
    )
    executor = OneOrg(sessions, org)
    supervisor = RunSupervisor(local, executor)  # type: ignore[arg-type]
    try:
        agent = await local.create_agent(
            org, "orphan", mode=AgentMode.AUTONOMOUS, tools=["current_time"]
        )
        # Recorded, never handed to an executor (its API process died at once).
        run = await local.start_run(org, agent.id, "check the time three times", max_steps=8)
        await supervisor.sweep()
        assert executor.handed == 1
        # Sweeping again at once: the run's actor holds its lease by now, or is about to
        # (the directory already watches it): never a second driver.
        await supervisor.sweep()
        assert await sessions.wait_run(org, run.id) is RunStatus.COMPLETED
        row = await run_row(db, run.id)
        assert (row["steps"], row["lease_token"], row["lease_owner"]) == (TOOL_STEPS + 1, 1, None)
    finally:
        await local.close(close_db=False)
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(DIRECTORY_NAME, namespace=namespace))
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


# --- `python -m serve`: Ray Serve and session actors, the demo's stack ----------------------


def start_serve(env: dict[str, str], port: int, log: Path) -> Api:
    """``python -m serve`` with its own local Ray (a temp dir of its own: it never joins the
    test run's cluster), the models in the replica."""
    out = log.open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "serve", "--port", str(port), "--in-process-models"],
        cwd=ROOT, env=env, stdout=out, stderr=out,
    )  # fmt: skip
    out.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"serve exited with {process.returncode}: {log.read_text()[-3000:]}")
        try:
            if httpx2.get(f"{url}/readyz", timeout=2).status_code == 200:
                return Api(process, url, log)
        except httpx2.HTTPError:
            pass
        time.sleep(0.5)
    process.kill()
    pytest.fail(f"serve did not come up: {log.read_text()[-3000:]}")


async def test_python_m_serve_stopped_mid_run_resumes_the_run_when_started_again(
    db: Database, store: Store, org: str, model: GatedModel, tmp_path: Path
) -> None:
    """The demo's stack (Ray Serve, the run in its session actor) stopped with SIGTERM
    mid-run and started again: the run finishes with nobody polling it."""
    env = api_env(db, model)
    env.pop("RAY_ADDRESS", None)
    ray_dir = tempfile.mkdtemp(prefix="crx-", dir="/tmp")  # short: Ray's socket paths
    env.update(
        RAY_TMPDIR=ray_dir,
        CORTEX_SESSIONS__NAMESPACE=f"restart-{uuid.uuid4().hex[:8]}",
        CORTEX_SESSIONS__WARM_ACTORS="0",
    )
    try:
        await _restart_serve(env, db, store, org, model, tmp_path)
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)


async def _restart_serve(
    env: dict[str, str], db: Database, store: Store, org: str, model: GatedModel, tmp_path: Path
) -> None:
    port = _free_port()
    log = tmp_path / "serve.log"
    api = start_serve(env, port, log)
    try:
        run_id = await submit(api.url, store, org)
        assert await asyncio.to_thread(model.held.wait, 120), log.read_text()[-3000:]
        before = await run_row(db, run_id)
        assert (before["status"], before["steps"]) == ("RUNNING", HOLD_AT - 1)
        code = stop_api(api, signal.SIGTERM)
    except BaseException:
        stop_api(api, signal.SIGKILL)
        raise
    assert code == 0, log.read_text()[-3000:]
    stopped = await run_row(db, run_id)
    assert (stopped["status"], stopped["steps"]) == ("RUNNING", HOLD_AT - 1)
    model.release()

    api = start_serve(env, port, log)
    try:

        async def ended() -> dict[str, Any] | None:
            row = await run_row(db, run_id)
            return row if row["status"] in TERMINAL else None

        final = await until(ended, within=240)
        assert final is not None, f"the run did not end: {log.read_text()[-3000:]}"
    finally:
        stop_api(api, signal.SIGTERM)
    assert final["status"] == "COMPLETED", log.read_text()[-3000:]
    assert final["steps"] == TOOL_STEPS + 1
    assert final["lease_owner"] is None
    # Taken a second time, by the new stack's run actor (the first stack's went with it).
    assert final["lease_token"] == 2
