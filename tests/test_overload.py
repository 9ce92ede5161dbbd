"""Overload never breaks an accepted turn or step (issue 30, point 2), on the real path: a
Ray Serve model app serving the packaged SmolLM2 with a tiny line (one generating, one
waiting), the API on Serve with session actors, the test database.

- A model call that meets a full line waits for its work's deadline instead of failing
  (through the handle, and in a turn through the API: the turn ends DONE).
- A turn whose deadline passes while the model is over capacity ends FAILED with that
  reason (the stream's ``error`` event is a 504 saying so), never a 502.
- Admission refuses a turn or a run at capacity with 503 ``overloaded`` and
  ``Retry-After`` before anything is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2
import pytest

from cortex_ray import DeadlineExceededError, Grant, ModelError, Principal
from cortex_ray.models import BACKGROUND_PRIORITY, ChatMessage, ChatRequest, waiting_until

ray_serve = pytest.importorskip("ray.serve")

from serve.models import (  # noqa: E402
    DeploymentOptions,
    HandleModelClient,
    IngressConfig,
    LlmConfig,
    ModelHandles,
    ModelServingConfig,
    build_models_app,
)

pytestmark = pytest.mark.timeout(600)

APP = "cortex-models-overload"
PREFIX = "/cortex-models-overload"
LLM_ID = "SmolLM2-135M-Instruct"
NO_CPU = DeploymentOptions(ray_actor_options={"num_cpus": 0})
TINY_LINE = ModelServingConfig(
    embedder=None,
    reranker=None,
    llm=LlmConfig(
        model_id=LLM_ID, n_ctx=1024, default_max_tokens=32, max_waiting=1, deployment=NO_CPU
    ),
    ingress=IngressConfig(deployment=NO_CPU),
)
LONG = ChatRequest(
    messages=(ChatMessage(role="user", content="Count from 1 to 400, one number a line."),),
    max_tokens=160,
    temperature=0.0,
)
DEADLINE_S = 15.0
"""The API's turn deadline: long enough for a turn to wait a few seconds and answer."""
SHORT = ChatRequest(messages=(ChatMessage(role="user", content="Say hi."),), max_tokens=4)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def serve_port(ray_cluster: Any) -> Iterator[int]:
    """Serve's HTTP port: the running instance's, or a fresh one shut down afterwards."""
    from ray.serve.context import _get_global_client

    client = _get_global_client(raise_if_no_controller_running=False)
    if client is not None:
        yield int(client.http_config.port)
        return
    port = _free_port()
    ray_serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield port
    finally:
        ray_serve.shutdown()


@pytest.fixture(scope="module")
def models_app(serve_port: int) -> Iterator[str]:
    ray_serve.run(build_models_app(TINY_LINE), name=APP, route_prefix=PREFIX)
    try:
        yield APP
    finally:
        ray_serve.delete(APP)


@pytest.fixture
async def client(models_app: str) -> HandleModelClient:
    handles = await ModelHandles.connect(models_app)
    assert handles.llm is not None
    return HandleModelClient(
        handles.llm, LLM_ID, app_name=models_app, overload_retries=0, overload_backoff_s=0.2,
        max_backoff_s=0.5, timeout_s=120,
    )  # fmt: skip


async def _load(client: HandleModelClient) -> dict[str, Any]:
    load = await client._backend.load()
    assert load is not None
    return load


@contextlib.asynccontextmanager
async def _full_line(client: HandleModelClient, callers: int = 3) -> AsyncIterator[None]:
    """Keep the model's line full: ``callers`` long generations, each sent again the moment
    it ends or is refused, until the block ends; entered once the line is full."""
    stop = asyncio.Event()

    async def hog() -> None:
        while not stop.is_set():
            with contextlib.suppress(ModelError):
                await client.chat(LONG)

    hogs = [asyncio.create_task(hog()) for _ in range(callers)]
    try:
        for _ in range(600):
            load = await _load(client)
            if load["generating"] and load["waiting"] >= 1:
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail(f"the line never filled: {load}")
        yield
    finally:
        stop.set()
        await asyncio.gather(*hogs, return_exceptions=True)


async def test_the_served_model_reports_its_capacity(client: HandleModelClient) -> None:
    capacity = await client.capacity()
    assert capacity is not None
    assert (capacity.replicas, capacity.slots) == (1, 2)  # 1 × (1 generating + 1 waiting)


async def test_a_full_line_waits_for_the_deadline_instead_of_failing(
    client: HandleModelClient,
) -> None:
    async with _full_line(client):
        # Without a deadline (and no retries) a full line is a model error: the old 502.
        with pytest.raises(ModelError, match="over capacity"):
            await client.chat(SHORT)
        refused = (await _load(client))["refused"]
        with waiting_until(time.monotonic() + 300, "the test's deadline"):
            answer = await client.chat(SHORT)
    assert answer.content is not None
    assert (await _load(client))["refused"] > refused  # it did meet a full line, and waited


async def test_background_work_with_a_deadline_waits_behind_the_line_too(
    client: HandleModelClient,
) -> None:
    """A corpus job's call (background priority, the graph extraction's) keeps its place or
    tries again until its deadline: a full line made such a job fail after one wait (a CI
    run's graph extraction failed so while the rest of the suite held the model)."""
    background = SHORT.model_copy(update={"priority": BACKGROUND_PRIORITY})
    async with _full_line(client):
        with pytest.raises(ModelError, match="over capacity"):
            await client.chat(background)  # no deadline: one try, as the rescorer wants
        refused = (await _load(client))["refused"]
        with waiting_until(time.monotonic() + 300, "the job's wait"):
            answer = await client.chat(background)
    assert answer.content is not None
    assert (await _load(client))["refused"] > refused


async def test_a_call_whose_deadline_passes_in_a_full_line_says_so(
    client: HandleModelClient,
) -> None:
    async with _full_line(client):
        started = time.monotonic()
        with (
            pytest.raises(DeadlineExceededError) as caught,
            waiting_until(started + 1.5, "the turn's deadline (1.5 s after it was accepted)"),
        ):
            await client.chat(SHORT)
        waited = time.monotonic() - started
    assert str(caught.value).startswith(
        "the turn's deadline (1.5 s after it was accepted) passed while waiting for the "
        f"model {LLM_ID}"
    )
    assert waited >= 1.4


# --- through the API ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def api_app(models_app: str, serve_port: int, settings: Any, db: Any) -> Iterator[str]:
    from serve import build_api

    served = settings.model_copy(
        update={
            "database_url": db.dsn,
            "model_backend": "served",
            "embedding_backend": "hash",
            "models_app": models_app,
            "model_max_tokens": 32,
            "pool_max_size": 2,
            "api": settings.api.model_copy(update={"num_cpus": 0}),
            # its own namespace: a session directory another test's API left in the default
            # one keeps warm actors made with that test's settings (a models app since
            # deleted), and a turn here handed one failed with "its actor failed to start"
            "sessions": settings.sessions.model_copy(
                update={
                    "turn_deadline_s": DEADLINE_S,
                    "namespace": f"overload-{uuid.uuid4().hex[:8]}",
                }
            ),
        }
    )
    app, prefix = "cortex-api-overload", f"/overload-{uuid.uuid4().hex[:6]}"
    ray_serve.run(build_api(served), name=app, route_prefix=prefix)
    try:
        yield f"http://127.0.0.1:{serve_port}{prefix}"
    finally:
        ray_serve.delete(app)


@pytest.fixture
async def api(api_app: str, store: Any, org: str) -> AsyncIterator[tuple[httpx2.AsyncClient, Any]]:
    """An HTTP client of the API, an admin key's headers and a member's, an interactive
    and an autonomous agent."""
    grant = Grant(tools=frozenset({"*"}))
    await store.ensure_org(org)
    member = Principal(id="ada", org_id=org, grant=grant)
    admin = Principal(id="root", org_id=org, is_admin=True, grant=grant)
    keys = {p.id: (await store.create_api_key(p, f"{p.id} key"))[0] for p in (member, admin)}
    async with httpx2.AsyncClient(base_url=api_app, timeout=180) as c:
        root = {"Authorization": f"Bearer {keys['root']}"}
        for body in ({"name": "talker"}, {"name": "worker", "mode": "AUTONOMOUS"}):
            r = await c.post(f"/api/orgs/{org}/agents", headers=root, json=body)
            assert r.status_code == 201, r.text
        yield c, {"Authorization": f"Bearer {keys['ada']}"}


async def _events(c: httpx2.AsyncClient, url: str, auth: dict[str, str]) -> list[tuple[str, Any]]:
    async with c.stream("POST", url, headers=auth, json={"message": "Say hello."}) as r:
        assert r.status_code == 200, await r.aread()
        return [(e.event, e.json()) async for e in httpx2.EventSource(r)]


async def test_admission_refuses_at_capacity_before_anything_is_stored(
    api: tuple[httpx2.AsyncClient, Any], store: Any, db: Any, org: str
) -> None:
    c, auth = api
    r = await c.post(f"/api/orgs/{org}/sessions", headers=auth, json={"agentId": "talker"})
    assert r.status_code == 201, r.text
    session = r.json()["id"]
    # Two runs just recorded fill the model's two places (1 generating + 1 waiting).
    worker = await store.get_agent(org, "worker")
    from cortex_ray import TaskRun

    held = [
        await store.create_run(TaskRun(org_id=org, agent_id=worker.id, goal="hold", max_steps=1))
        for _ in range(2)
    ]
    try:
        refusals = [
            await c.post(
                f"/api/orgs/{org}/sessions/{session}/messages",
                headers=auth,
                json={"message": "hello?"},
            ),
            await c.post(
                f"/api/orgs/{org}/tasks",
                headers=auth,
                json={"agentId": "worker", "payload": {"goal": "x", "maxSteps": 1}},
            ),
        ]
        for r in refusals:
            assert r.status_code == 503, r.text
            assert r.headers["content-type"].startswith("application/json")
            error = r.json()["error"]
            assert error["code"] == "overloaded" and error["correlationId"]
            assert "at capacity" in error["message"] and "try again in" in error["message"]
            assert int(r.headers["Retry-After"]) >= 1
        async with db.connection() as conn:
            cur = await conn.execute(
                "SELECT (SELECT count(*) FROM session_turns WHERE org_id = %s) AS turns, "
                "(SELECT count(*) FROM task_runs WHERE org_id = %s) AS runs",
                (org, org),
            )
            assert await cur.fetchone() == {"turns": 0, "runs": 2}  # only the two held
    finally:
        for run in held:
            await store.fail_run(org, run.id, "held for the test")


async def test_a_turn_whose_deadline_passes_while_the_model_is_over_capacity_ends_with_why(
    api: tuple[httpx2.AsyncClient, Any], client: HandleModelClient, org: str
) -> None:
    c, auth = api
    r = await c.post(f"/api/orgs/{org}/sessions", headers=auth, json={"agentId": "talker"})
    session = r.json()["id"]
    async with _full_line(client):
        events = await _events(c, f"/api/orgs/{org}/sessions/{session}/messages", auth)
    kinds = [k for k, _ in events]
    assert kinds[0] == "started" and kinds[-1] == "error", events
    error = events[-1][1]
    assert (error["status"], error["code"]) == (504, "timeout"), error
    assert "the turn's deadline (15 s after it was accepted) passed" in error["message"]
    assert "model_error" not in str(events)
    turn_id = events[0][1]["turnId"]
    turn = (await c.get(f"/api/orgs/{org}/sessions/{session}/turns/{turn_id}", headers=auth)).json()
    assert turn["status"] == "FAILED"
    assert "the turn's deadline (15 s after it was accepted) passed while waiting" in turn["reason"]


async def test_a_turn_that_meets_a_full_line_waits_and_answers(
    api: tuple[httpx2.AsyncClient, Any], client: HandleModelClient, org: str
) -> None:
    c, auth = api
    r = await c.post(f"/api/orgs/{org}/sessions", headers=auth, json={"agentId": "talker"})
    session = r.json()["id"]
    before = (await _load(client))["refused_by_kind"]
    async with _full_line(client):
        turn = asyncio.create_task(_events(c, f"/api/orgs/{org}/sessions/{session}/messages", auth))
        await asyncio.sleep(DEADLINE_S / 3)  # the turn's calls meet the full line meanwhile
    events = await turn
    kinds = [k for k, _ in events]
    assert kinds[0] == "started" and kinds[-1] == "done", events
    assert "error" not in kinds
    after = (await _load(client))["refused_by_kind"]
    # The turn's own calls (tools or a schema, not the hogs' text) were refused at least
    # once: it met a full line, waited and answered.
    assert any(after.get(k, 0) > before.get(k, 0) for k in after if k != "text"), (before, after)


def test_the_error_map_gives_503_overloaded_with_retry_after_and_504_with_the_reason() -> None:
    """What the API answers for the two errors, also when Ray wraps them (raised in a
    session actor)."""
    from ray.exceptions import RayTaskError

    from cortex_ray import OverloadedError
    from serve._errors import headers_of, status_of

    over = OverloadedError("at capacity: 17 turns and runs are in progress", retry_after_s=6.2)
    late = DeadlineExceededError("the turn's deadline (900 s after it was accepted) passed")
    for cause, status, code, headers in (
        (over, 503, "overloaded", {"Retry-After": "7"}),
        (late, 504, "timeout", {}),
    ):
        wrapped = RayTaskError("f", "tb", cause, proctitle="ray::AgentSession.turn")  # type: ignore[no-untyped-call]
        for exc in (cause, wrapped.as_instanceof_cause()):  # type: ignore[no-untyped-call]
            assert status_of(exc) == (status, code, str(cause))
            assert headers_of(exc) == headers
