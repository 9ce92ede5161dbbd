"""The HTTP API through real HTTP: Ray Serve on a local Ray, the embedded PostgreSQL, a
scripted model.

One Serve application (``serve.build_api``) runs for the module, its replica opening its own
``Runtime`` on the test database with the scripted model below. Tests authenticate with API
keys written straight into the database, and check what was stored through the database
too. Schemathesis runs twice: in-process against the ASGI app (many examples, fast) and a
few examples per operation through the Serve HTTP proxy.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import socket
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
import hypothesis
import hypothesis.errors
import pytest
import schemathesis
from hypothesis import HealthCheck
from schemathesis import GenerationMode

from cortex_ray import AgentMode, Grant, Principal, Runtime, Settings
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import ChatRequest, ChatResponse, HashEmbedder, ScriptedModelClient, ToolCall
from cortex_ray.storage import Database, Store
from serve import ApiOptions, build_api, create_app

# tests/ is not importable in the Serve replica: ship this module's functions by value.
pytest.importorskip("ray.cloudpickle").register_pickle_by_value(sys.modules[__name__])

APP_NAME = "cortex-api-test"
MAX_BODY = 64 * 1024
OPTIONS = ApiOptions(max_body_bytes=MAX_BODY)
TABLES = (
    "agents",
    "task_runs",
    "run_steps",
    "sessions",
    "session_messages",
    "memories",
    "procedural_proposals",
    "audit_log",
    "principals",
    "api_keys",
    "step_intents",
    "eval_suites",
    "eval_runs",
    "eval_results",
    "workflows",
    "workflow_versions",
    "payloads",
)


# --- the scripted model (zero latency, deterministic) ---------------------------------------


def respond(request: ChatRequest) -> str | ChatResponse:
    """Answer by the schema asked for. Autonomous: read the clock at step 1 (two candidates,
    scored), then finish; a goal containing "never finish" searches its memory (a new query
    each step, so never a repeat) until the budget ends. Interactive: a message asking for
    the time calls ``current_time`` first."""
    props = (request.response_schema or {}).get("properties", {})
    text = "\n".join(m.content or "" for m in request.messages)
    if "candidates" in props:
        if "never finish" in text:
            step = next((n for n in range(1, 65) if f"Step {n} of" in text), 0)
            search = {"tool": "memory_search", "args": {"query": f"q{step}"}, "rationale": "r"}
            return json.dumps({"candidates": [search]})
        if "Step 1 of" in text:
            return json.dumps(
                {
                    "candidates": [
                        {"tool": "current_time", "args": {}, "rationale": "read the clock"},
                        {"finish": True, "message": "too early", "rationale": "a guess"},
                    ]
                }
            )
        return json.dumps(
            {"candidates": [{"finish": True, "message": "It is time.", "rationale": "done"}]}
        )
    if "scores" in props:
        n = int(props["scores"].get("maxItems", 1))
        return json.dumps({"scores": [9] + [2] * (n - 1)})
    if "best" in props:  # the evaluation in choice mode: the first listed
        listed = props["best"]["enum"]
        return json.dumps({"assessments": ["ok"] * len(listed), "best": listed[0]})
    if "importance" in props:
        return json.dumps({"importance": 5})
    if "facts" in props:
        facts = [{"subject": "name", "fact": "The user is called Ada"}] if "Ada" in text else []
        return json.dumps({"facts": facts})
    users = [m.content or "" for m in request.messages if m.role == "user"]
    asked = next((u for u in reversed(users) if not u.startswith("Progress so far")), "")
    if request.tools and "time" in asked and "Progress so far" not in text:
        return ChatResponse(
            tool_calls=(ToolCall(id="call-1", name="current_time", arguments="{}"),)
        )
    return f"You said: {asked[:60]}"


async def paced(request: ChatRequest) -> str | ChatResponse:
    """``respond``, but a turn whose message says "slowly" takes a second to reply after its
    tool round (so a test can look at the stream while the turn is still running)."""
    text = "\n".join(m.content or "" for m in request.messages[-2:])
    if "slowly" in text and "Progress so far" in text:
        await asyncio.sleep(1.0)
    return respond(request)


async def open_test_runtime(settings: Settings) -> Runtime:
    return await Runtime.open(
        settings,
        model=ScriptedModelClient(responder=paced),
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
    )


# --- fixtures ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def replica_settings(settings: Settings, db: Database) -> Settings:
    # The replica is another process: it reaches the embedded server by its DSN. K=3: the
    # step log's candidates, scores and note are part of what the API returns.
    return settings.model_copy(update={"database_url": db.dsn, "candidates": 3})


@pytest.fixture(scope="module")
def api_url(ray_cluster: Any, replica_settings: Settings) -> Iterator[str]:
    from ray import serve as ray_serve

    port = _free_port()
    ray_serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        factory = functools.partial(open_test_runtime, replica_settings)
        ray_serve.run(build_api(factory, options=OPTIONS), name=APP_NAME, route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        ray_serve.shutdown()


@pytest.fixture
async def client(api_url: str) -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(base_url=api_url, timeout=30) as c:
        yield c


@dataclass
class Tenant:
    org: str
    admin: str
    user: str
    limited: str
    revoked: str

    @staticmethod
    def auth(key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}


async def make_tenant(store: Store, org: str) -> Tenant:
    await store.ensure_org(org)
    everything = Grant(tools=frozenset({"*"}))

    async def key(pid: str, *, admin: bool = False, grant: Grant = everything) -> str:
        principal = Principal(id=pid, org_id=org, name=pid, is_admin=admin, grant=grant)
        return (await store.create_api_key(principal, f"{pid} key"))[0]

    revoked, revoked_id = await store.create_api_key(
        Principal(id="gone", org_id=org, is_admin=True, grant=everything), "revoked"
    )
    await store.revoke_api_key(org, revoked_id)
    return Tenant(
        org=org,
        admin=await key("admin", admin=True),
        user=await key("ada"),
        limited=await key("bob", grant=Grant(tools=frozenset({"current_time"}))),
        revoked=revoked,
    )


@pytest.fixture
async def tenant(store: Store, org: str) -> Tenant:
    return await make_tenant(store, org)


async def row_counts(db: Database, org: str) -> dict[str, int]:
    counts = {}
    async with db.connection() as conn:
        for table in TABLES:
            cur = await conn.execute(f"SELECT count(*) AS n FROM {table} WHERE org_id = %s", (org,))
            row = await cur.fetchone()
            assert row is not None
            counts[table] = row["n"]
    return counts


async def create_agent(
    client: httpx2.AsyncClient, t: Tenant, name: str, mode: str = "INTERACTIVE", **extra: Any
) -> dict[str, Any]:
    r = await client.post(
        f"/api/orgs/{t.org}/agents",
        headers=t.auth(t.admin),
        json={"name": name, "mode": mode, **extra},
    )
    assert r.status_code == 201, r.text
    return dict(r.json())


async def sse_events(
    client: httpx2.AsyncClient, url: str, headers: dict[str, str], message: str
) -> list[tuple[str, Any]]:
    async with client.stream("POST", url, headers=headers, json={"message": message}) as r:
        assert r.status_code == 200, await r.aread()
        assert r.headers["content-type"].startswith("text/event-stream")
        return [(e.event, e.json()) async for e in httpx2.EventSource(r)]


def assert_error(r: httpx2.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    error = r.json()["error"]
    assert error["message"]
    if code is not None:
        assert error["code"] == code, error
    return dict(error)


def test_serve_all_is_complete() -> None:
    import serve

    public = {
        name
        for name, value in vars(serve).items()
        if not name.startswith("_") and not isinstance(value, type(serve))
    }
    assert set(serve.__all__) == public  # (ruff's RUF022 keeps it sorted)


# --- health, whoami -----------------------------------------------------------------------------


async def test_health_routes_are_open(client: httpx2.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    assert (await client.get("/readyz")).json() == {"status": "ready"}


async def test_me_names_the_keys_principal(client: httpx2.AsyncClient, tenant: Tenant) -> None:
    r = await client.get("/api/me", headers=tenant.auth(tenant.limited))
    assert r.status_code == 200
    assert r.json() == {
        "id": "bob",
        "orgId": tenant.org,
        "kind": "USER",
        "name": "bob",
        "isAdmin": False,
        "grant": {"tools": ["current_time"], "actionTypes": []},
    }


async def test_keys_from_the_command_line_work_until_revoked(
    client: httpx2.AsyncClient, replica_settings: Settings, org: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORTEX_")}
    env |= {
        "CORTEX_DATABASE_URL": str(replica_settings.storage.database_url),
        "CORTEX_EMBEDDING_BACKEND": "hash",
    }

    async def cortex(*args: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "cortex_ray.cli",
            "--org",
            org,
            *args,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        return out.decode()

    out = await cortex("api-keys", "create", "carol", "--grant", "current_time", "--name", "ci")
    key = re.search(r"API key \(shown once\): (crx_\S+)", out)
    key_id = re.search(r"key id: (\S+)", out)
    assert key and key_id, out
    me = (await client.get("/api/me", headers=Tenant.auth(key[1]))).json()
    assert me["id"] == "carol" and me["orgId"] == org and me["isAdmin"] is False
    assert me["grant"] == {"tools": ["current_time"], "actionTypes": []}
    await cortex("api-keys", "revoke", key_id[1])
    assert_error(await client.get("/api/me", headers=Tenant.auth(key[1])), 401)


# --- tasks --------------------------------------------------------------------------------------


async def test_task_runs_to_completion_with_its_step_log(
    client: httpx2.AsyncClient, tenant: Tenant
) -> None:
    worker = await create_agent(client, tenant, "worker", "AUTONOMOUS")
    caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    r = await client.post(
        f"/api/orgs/{tenant.org}/tasks",
        headers={
            **tenant.auth(tenant.user),
            "traceparent": f"00-{caller_trace}-00f067aa0ba902b7-01",  # W3C's own example
        },
        json={
            "name": "clock",
            "agentId": worker["id"],
            "assigneeKind": "AGENT",
            "payload": {
                "goal": "  ",
                "objective": "",
                "instructions": "Tell me the time",
                "description": "not this one",
                "maxSteps": 4,
                "callerUserId": "user-42",
                "contactContext": {"name": "Ada", "channel": "email"},
            },
        },
    )
    assert r.status_code == 202, r.text
    accepted = r.json()
    assert accepted["status"] == "RUNNING" and accepted["maxSteps"] == 4
    assert r.headers["location"] == accepted["location"]
    assert accepted["location"] == f"/api/orgs/{tenant.org}/tasks/{accepted['id']}"

    r = await client.get(
        accepted["location"], headers=tenant.auth(tenant.user), params={"wait": 20}
    )
    task = r.json()
    assert r.status_code == 200 and task["status"] == "COMPLETED", task
    assert task["result"] == "It is time."
    assert task["goal"] == "Tell me the time"
    assert task["contactContext"] == {"name": "Ada", "channel": "email"}
    assert task["callerId"] == "user-42" and task["requestedBy"] == "ada"
    assert task["name"] == "clock"

    first, last = task["steps"]
    assert first["index"] == 0 and first["decision"] == "ACT"
    # The evaluation (a choice) picked the first: it scores 10, the other 0.
    assert [c["score"] for c in first["candidates"]] == [10.0, 0.0]
    assert [c["assessment"] for c in first["candidates"]] == ["ok", "ok"]
    assert first["selected"] == 0
    assert first["note"] == "chosen by the evaluation among 2"
    assert first["action"]["tool"] == "current_time"
    assert first["actionCategory"] == "GROUNDING"
    assert first["observation"]["status"] == "OK" and "utc" in first["observation"]["output"]
    assert last["index"] == 1 and last["decision"] == "FINISH"
    assert last["message"] == "It is time." and last["observation"] is None
    # The seed's name for the same log: a JSON string of exactly these steps.
    assert json.loads(task["stepsJson"]) == task["steps"]

    # Its trace: one tree, the agent's invocation at the root, the cycle's phases beneath.
    r = await client.get(f"{accepted['location']}/trace", headers=tenant.auth(tenant.user))
    assert r.status_code == 200, r.text
    traced = r.json()
    # The caller's trace: its traceparent → the request's span → the run's spans.
    assert traced["taskId"] == task["id"] and traced["traceIds"] == [caller_trace]
    request, root = traced["spans"][0], traced["spans"][1]
    assert request["name"] == "POST /api/orgs/{org}/tasks" and request["kind"] == "SERVER"
    assert request["parentSpanId"] == "00f067aa0ba902b7"  # the caller's span
    assert request["attributes"]["http.response.status_code"] == 202
    assert root["name"] == "invoke_agent worker" and root["depth"] == 1
    assert root["parentSpanId"] == request["spanId"]
    assert root["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    names = [s["name"] for s in traced["spans"]]
    for name in ["step 0", "perceive", "decide", "execute_tool current_time", "learn", "step 1"]:
        assert name in names, names
    r = await client.get(
        f"/api/orgs/{tenant.org}/tasks/{uuid.uuid4()}/trace", headers=tenant.auth(tenant.user)
    )
    assert r.status_code == 404
    # Its diagnostic timeline and what it cost.
    r = await client.get(f"{accepted['location']}/diagnostics", headers=tenant.auth(tenant.user))
    assert r.status_code == 200, r.text
    diagnosed = r.json()
    kinds = [e["kind"] for e in diagnosed["events"]]
    assert kinds[0] == "attempt" and kinds[-1] == "terminal" and "tool_call" in kinds
    assert diagnosed["id"] == task["id"] and diagnosed["stalled"] is False
    assert diagnosed["cost"]["attempts"] == 1 and diagnosed["cost"]["toolCalls"] == 1
    assert task["cost"] == diagnosed["cost"] and task["cost"]["wallS"] > 0

    # By the agent's name too; and the list shows both runs, newest first.
    r = await client.post(
        f"/api/orgs/{tenant.org}/tasks",
        headers=tenant.auth(tenant.user),
        json={"agentId": "worker", "payload": {"goal": "never finish", "maxSteps": 2}},
    )
    assert r.status_code == 202
    failed = (
        await client.get(
            r.json()["location"], headers=tenant.auth(tenant.user), params={"wait": 20}
        )
    ).json()
    assert failed["status"] == "FAILED" and "budget of 2" in failed["reason"]
    assert [s["index"] for s in failed["steps"]] == [0, 1]
    listed = (
        await client.get(
            f"/api/orgs/{tenant.org}/tasks",
            headers=tenant.auth(tenant.user),
            params={"agentId": "worker"},
        )
    ).json()["tasks"]
    assert [t["id"] for t in listed] == [failed["id"], task["id"]]
    assert "steps" not in listed[0]


async def test_a_polled_task_reaches_a_terminal_state(
    client: httpx2.AsyncClient, tenant: Tenant
) -> None:
    worker = await create_agent(client, tenant, "poller", "AUTONOMOUS")
    r = await client.post(
        f"/api/orgs/{tenant.org}/tasks",
        headers=tenant.auth(tenant.admin),
        json={"agentId": worker["id"], "payload": {"description": "What time is it?"}},
    )
    location = r.json()["location"]
    for _ in range(200):
        task = (await client.get(location, headers=tenant.auth(tenant.admin))).json()
        if task["status"] != "RUNNING":
            break
        await asyncio.sleep(0.05)
    assert task["status"] == "COMPLETED" and task["maxSteps"] == 8  # the default budget
    assert task["goal"] == "What time is it?"


# --- sessions (server-sent events) --------------------------------------------------------------


async def test_session_messages_stream_tool_observations_then_the_reply(
    client: httpx2.AsyncClient, tenant: Tenant
) -> None:
    chat = await create_agent(client, tenant, "helper")
    ada, bob, admin = (tenant.auth(k) for k in (tenant.user, tenant.limited, tenant.admin))
    r = await client.post(
        f"/api/orgs/{tenant.org}/sessions", headers=ada, json={"agentId": chat["id"]}
    )
    assert r.status_code == 201, r.text
    session = r.json()
    assert session["callerId"] == "ada" and session["status"] == "OPEN"
    base = f"/api/orgs/{tenant.org}/sessions/{session['id']}"

    events = await sse_events(client, f"{base}/messages", ada, "what time is it?")
    assert [name for name, _ in events] == ["started", "tool_call", "observation", "reply", "done"]
    assert events[1][1] == {"round": 0, "tool": "current_time", "args": {}}
    observation = events[2][1]
    assert observation["tool"] == "current_time" and observation["status"] == "OK"
    assert observation["actionType"] == "GROUNDING" and observation["round"] == 0
    assert events[3][1] == {"message": "You said: what time is it?"}
    assert events[4][1]["observations"] == 1 and events[4][1]["refused"] is None

    events = await sse_events(client, f"{base}/messages", ada, "my name is Ada")
    assert [name for name, _ in events] == ["started", "reply", "done"]

    history = (await client.get(f"{base}/messages", headers=ada)).json()["messages"]
    assert [(m["role"], m["tool"]) for m in history] == [
        ("user", None),
        ("tool", "current_time"),
        ("assistant", None),
        ("user", None),
        ("assistant", None),
    ]

    # Events arrive as they happen: the observation is on the wire while the turn still
    # decides its reply (the accepted message shows at once; the turn's other messages are
    # stored when it ends).
    seen: list[tuple[str, int]] = []
    url = f"{base}/messages"
    async with client.stream("POST", url, headers=ada, json={"message": "slowly: time?"}) as r:
        async for event in httpx2.EventSource(r):
            stored = (await client.get(url, headers=ada)).json()["messages"]
            seen.append((event.event, len(stored)))
    assert seen[:3] == [("started", 6), ("tool_call", 6), ("observation", 6)]
    assert [name for name, _ in seen[3:]] == ["reply", "done"]
    assert seen[-1][1] == 8
    # Another caller of the organisation may neither read nor talk; an admin may read.
    assert_error(await client.get(f"{base}/messages", headers=bob), 403, "forbidden")
    assert_error(await client.post(f"{base}/messages", headers=admin, json={"message": "x"}), 403)
    assert (await client.get(base, headers=admin)).json()["id"] == session["id"]

    r = await client.post(f"{base}/end", headers=ada)
    ended = r.json()
    assert r.status_code == 200 and ended["session"]["status"] == "ENDED"
    assert [f["content"] for f in ended["facts"]] == ["The user is called Ada"]
    assert_error(
        await client.post(f"{base}/messages", headers=ada, json={"message": "hi"}), 409, "conflict"
    )
    again = (await client.post(f"{base}/end", headers=ada)).json()
    assert again["facts"] == [] and again["session"]["status"] == "ENDED"


async def test_an_agent_with_only_current_time_answers_every_caller(
    client: httpx2.AsyncClient, tenant: Tenant, store: Store
) -> None:
    """Issue 30, point 3: dialogue is part of every interactive agent's action space, so an
    agent created with ``"tools": ["current_time"]`` answers; and a caller whose grant lacks
    ``reply`` (bob: ``current_time`` only) is answered too (the conversation admits him)."""
    chat = await create_agent(client, tenant, "d-chat", tools=["current_time"])
    assert chat["tools"] == ["current_time"]
    assert chat["grant"] == {"tools": ["current_time"], "actionTypes": []}
    org = tenant.org
    for key, who in ((tenant.limited, "bob"), (tenant.user, "ada")):
        auth = tenant.auth(key)
        listed = await client.get(
            f"/api/orgs/{org}/tools", headers=auth, params={"agentId": "d-chat"}
        )
        assert [t["name"] for t in listed.json()["tools"]] == ["current_time", "reply"]
        r = await client.post(
            f"/api/orgs/{org}/sessions", headers=auth, json={"agentId": chat["id"]}
        )
        assert r.status_code == 201, r.text
        base = f"/api/orgs/{org}/sessions/{r.json()['id']}"
        events = await sse_events(client, f"{base}/messages", auth, "what time is it?")
        names = [name for name, _ in events]
        assert names == ["started", "tool_call", "observation", "reply", "done"], events
        assert events[2][1]["status"] == "OK"
        assert events[3][1] == {"message": "You said: what time is it?"}
        assert events[4][1]["refused"] is None
        history = (await client.get(f"{base}/messages", headers=auth)).json()["messages"]
        assert history[-1]["role"] == "assistant"
        assert history[-1]["content"] == "You said: what time is it?"
        assert history[-1]["turnStatus"] == "DONE", history[-1]
        rows = [
            (a["tool"], a["decision"], a["principal_id"])
            for a in await store.audit_rows(org, gate_only=True)
            if a["session_id"] == uuid.UUID(base.rsplit("/", 1)[1])
        ]
        assert rows == [("current_time", "allowed", who), ("reply", "allowed", who)]


async def test_the_app_drives_runs_and_turns_through_session_actors(
    ray_cluster: Any, replica_settings: Settings, store: Store, org: str
) -> None:
    """The executor is injected: the same app in front of ``actors.SessionManager``."""
    actors = pytest.importorskip("actors")
    runtime = await open_test_runtime(replica_settings)
    policy = actors.SessionPolicy(namespace="cortex-api-test")
    manager = actors.SessionManager.for_runtime(runtime, factory=open_test_runtime, policy=policy)
    t = await make_tenant(store, org)
    transport = httpx2.ASGITransport(app=create_app(runtime, manager))
    try:
        async with httpx2.AsyncClient(transport=transport, base_url="http://api") as client:
            await create_agent(client, t, "actor-worker", "AUTONOMOUS")
            r = await client.post(
                f"/api/orgs/{org}/tasks",
                headers=t.auth(t.user),
                json={"agentId": "actor-worker", "payload": {"goal": "time"}},
            )
            task = (
                await client.get(r.json()["location"], headers=t.auth(t.user), params={"wait": 30})
            ).json()
            assert task["status"] == "COMPLETED" and len(task["steps"]) == 2
            # The actor's process kept the run's spans in the same database (its batch
            # exporter writes every 0.5 s), under the API request's span: the trace crossed
            # the hop to the actor through the run's row.
            spans: list[dict[str, Any]] = []
            for _ in range(40):
                traced = await client.get(f"{r.json()['location']}/trace", headers=t.auth(t.user))
                spans = traced.json()["spans"]
                if any(s["name"] == "execute_tool current_time" for s in spans):
                    break
                await asyncio.sleep(0.25)
            request, run_root = spans[0], spans[1]
            assert request["name"] == "POST /api/orgs/{org}/tasks", spans[:2]
            assert run_root["name"] == "invoke_agent actor-worker"
            assert run_root["parentSpanId"] == request["spanId"]  # made in the actor
            assert {s["traceId"] for s in spans} == {request["traceId"]}

            chat = await create_agent(client, t, "actor-chat")
            session = (
                await client.post(
                    f"/api/orgs/{org}/sessions",
                    headers=t.auth(t.user),
                    json={"agentId": chat["id"]},
                )
            ).json()
            url = f"/api/orgs/{org}/sessions/{session['id']}/messages"
            events = await sse_events(client, url, t.auth(t.user), "what time is it?")
            names = [name for name, _ in events]
            assert names == ["started", "tool_call", "observation", "reply", "done"]
            # The turn's trace crossed the hop to the actor through the turn's row too.
            turn_id = events[0][1]["turnId"]
            turn_url = f"/api/orgs/{org}/sessions/{session['id']}/turns/{turn_id}/trace"
            for _ in range(40):
                turn_spans = (await client.get(turn_url, headers=t.auth(t.user))).json()["spans"]
                if any(s["name"] == "execute_tool current_time" for s in turn_spans):
                    break
                await asyncio.sleep(0.25)
            request, turn_root = turn_spans[0], turn_spans[1]
            assert request["name"] == "POST /api/orgs/{org}/sessions/{session_id}/messages"
            assert turn_root["name"] == "invoke_agent actor-chat"
            assert turn_root["parentSpanId"] == request["spanId"]  # made in the actor
            assert "execute_tool current_time" in [s["name"] for s in turn_spans]
            r = await client.get(turn_url, headers=t.auth(t.limited))
            assert r.status_code == 403, r.text  # another caller's session
            r = await client.post(
                f"/api/orgs/{org}/sessions/{session['id']}/end", headers=t.auth(t.user)
            )
            assert r.json()["session"]["status"] == "ENDED"
    finally:
        await runtime.close()


# --- agents, tools, memory ----------------------------------------------------------------------


async def test_agents_are_created_read_listed_and_updated_by_admins(
    client: httpx2.AsyncClient, tenant: Tenant
) -> None:
    agents = f"/api/orgs/{tenant.org}/agents"
    admin, ada = tenant.auth(tenant.admin), tenant.auth(tenant.user)
    made = await create_agent(
        client,
        tenant,
        "scribe",
        persona="Writes things down.",
        tools=["current_time", "remember_fact"],
        skills=["notes"],
    )
    assert made["grant"] == {"tools": ["current_time", "remember_fact"], "actionTypes": []}
    assert (await client.get(f"{agents}/{made['id']}", headers=ada)).json() == made
    assert (await client.get(f"{agents}/scribe", headers=ada)).json() == made
    listed = (await client.get(agents, headers=ada)).json()["agents"]
    assert [a["name"] for a in listed] == ["scribe"]

    r = await client.patch(
        f"{agents}/scribe",
        headers=admin,
        json={
            "mode": "AUTONOMOUS",
            "persona": "Terse.",
            "tools": ["current_time"],
            "grant": {"tools": ["current_time"], "actionTypes": ["RETRIEVAL"]},
        },
    )
    changed = r.json()
    assert r.status_code == 200, r.text
    assert changed["mode"] == "AUTONOMOUS" and changed["persona"] == "Terse."
    assert changed["tools"] == ["current_time"] and changed["skills"] == ["notes"]
    assert changed["grant"] == {"tools": ["current_time"], "actionTypes": ["RETRIEVAL"]}
    r = await client.patch(f"{agents}/scribe", headers=admin, json={"grant": None})
    assert r.json()["grant"] is None

    assert_error(await client.post(agents, headers=ada, json={"name": "x"}), 403, "forbidden")
    assert_error(await client.patch(f"{agents}/scribe", headers=ada, json={"persona": "x"}), 403)
    assert_error(await client.patch(f"{agents}/scribe", headers=admin, json={}), 422)
    assert_error(
        await client.patch(f"{agents}/scribe", headers=admin, json={"tools": ["rm_rf"]}), 422
    )
    assert_error(await client.get(f"{agents}/nobody", headers=ada), 404, "not_found")


async def test_direct_tool_calls_and_memory_go_through_the_gate(
    client: httpx2.AsyncClient, tenant: Tenant
) -> None:
    chat = await create_agent(client, tenant, "memo")
    base = f"/api/orgs/{tenant.org}"
    admin, bob = tenant.auth(tenant.admin), tenant.auth(tenant.limited)

    r = await client.post(
        f"{base}/tools/remember_fact",
        headers=admin,
        json={"agentId": chat["id"], "args": {"subject": "Sky", "fact": "blue"}},
    )
    assert r.status_code == 200 and r.json()["status"] == "OK"
    assert r.json()["actionType"] == "LEARNING"
    hits = (
        await client.get(
            f"{base}/agents/memo/memory", headers=admin, params={"query": "sky", "kind": "SEMANTIC"}
        )
    ).json()
    assert [h["memory"]["content"] for h in hits["results"]] == ["blue"]
    facts = (await client.get(f"{base}/agents/memo/memory/facts", headers=admin)).json()
    assert [(f["subject"], f["content"]) for f in facts["facts"]] == [("sky", "blue")]

    # bob is granted current_time only: the gate refuses the rest, and memory is closed to him.
    r = await client.post(
        f"{base}/tools/remember_fact",
        headers=bob,
        json={"agentId": "memo", "args": {"subject": "x", "fact": "y"}},
    )
    assert r.status_code == 200 and r.json()["status"] == "REFUSED"
    assert "access denied" in r.json()["summary"]
    r = await client.post(f"{base}/tools/current_time", headers=bob, json={"agentId": "memo"})
    assert r.json()["status"] == "OK"
    assert_error(
        await client.get(f"{base}/agents/memo/memory", headers=bob, params={"query": "sky"}), 403
    )
    tools = (await client.get(f"{base}/tools", headers=bob, params={"agentId": "memo"})).json()
    # His grant and the agent's intersect in current_time; the reply is the conversation's.
    assert [t["name"] for t in tools["tools"]] == ["current_time", "reply"]
    everything = (await client.get(f"{base}/tools", headers=bob)).json()["tools"]
    assert {"current_time", "memory_search", "remember_fact"} <= {t["name"] for t in everything}


# --- auth and isolation ------------------------------------------------------------------------

PLACEHOLDERS = ("org", "agent_ref", "task_id", "session_id", "turn_id", "tool_name")


@dataclass
class Estate:
    """One tenant with one of everything, to attack."""

    tenant: Tenant
    worker: dict[str, Any]
    chat: dict[str, Any]
    task_id: str
    session_id: str
    turn_id: str
    eval_run_id: str


@pytest.fixture
async def estate(client: httpx2.AsyncClient, tenant: Tenant, db: Database) -> Estate:
    await publish_handbook(db, tenant.org, b"# Secret handbook\n\nThe secret door code is 4711.\n")
    worker = await create_agent(client, tenant, "victim-worker", "AUTONOMOUS")
    chat = await create_agent(client, tenant, "victim-chat", persona="Secret persona.")
    admin = tenant.auth(tenant.admin)
    r = await client.post(
        f"/api/orgs/{tenant.org}/tasks",
        headers=admin,
        json={"agentId": worker["id"], "payload": {"goal": "secret goal"}},
    )
    task_id = r.json()["id"]
    await client.get(r.json()["location"], headers=admin, params={"wait": 20})
    r = await client.post(
        f"/api/orgs/{tenant.org}/sessions", headers=admin, json={"agentId": chat["id"]}
    )
    session_id = r.json()["id"]
    events = await sse_events(
        client, f"/api/orgs/{tenant.org}/sessions/{session_id}/messages", admin, "a secret message"
    )
    turn_id = events[0][1]["turnId"]
    flows = f"/api/orgs/{tenant.org}/workflows"
    r = await client.post(flows, headers=admin, json={"name": "victim-flow"})
    assert r.status_code == 201, r.text
    r = await client.post(
        f"{flows}/victim-flow/versions",
        headers=admin,
        json={"instructions": "secret instructions", "tools": ["current_time"]},
    )
    assert r.status_code == 201, r.text
    evals = f"/api/orgs/{tenant.org}/evals"
    r = await client.post(
        f"{evals}/suites/victim-suite/cases", headers=admin, json={"runId": task_id}
    )
    assert r.status_code == 201, r.text
    r = await client.post(f"{evals}/runs", headers=admin, json={"suite": "victim-suite"})
    assert r.status_code == 201, r.text
    return Estate(tenant, worker, chat, task_id, session_id, turn_id, r.json()["id"])


def requests_for(estate: Estate, org: str) -> dict[str, tuple[str, str, dict[str, Any]]]:
    """operationId → (method, url, request kwargs) for every route under /api/orgs, aimed at
    ``org`` but naming ``estate``'s rows."""
    values = {
        "org": org,
        "agent_ref": estate.chat["id"],
        "task_id": estate.task_id,
        "session_id": estate.session_id,
        "turn_id": estate.turn_id,
        "tool_name": "current_time",
    }
    base = "/api/orgs/{org}"
    routes: dict[str, tuple[str, str, dict[str, Any]]] = {
        "list_agents": ("GET", f"{base}/agents", {}),
        "create_agent": ("POST", f"{base}/agents", {"json": {"name": "intruder"}}),
        "get_agent": ("GET", f"{base}/agents/{{agent_ref}}", {}),
        "update_agent": ("PATCH", f"{base}/agents/{{agent_ref}}", {"json": {"persona": "pwn"}}),
        "search_memory": (
            "GET",
            f"{base}/agents/{{agent_ref}}/memory",
            {"params": {"query": "secret"}},
        ),
        "list_facts": ("GET", f"{base}/agents/{{agent_ref}}/memory/facts", {}),
        "create_task": (
            "POST",
            f"{base}/tasks",
            {"json": {"agentId": estate.worker["id"], "payload": {"goal": "pwn"}}},
        ),
        "list_tasks": ("GET", f"{base}/tasks", {}),
        "get_task": ("GET", f"{base}/tasks/{{task_id}}", {}),
        "get_task_trace": ("GET", f"{base}/tasks/{{task_id}}/trace", {}),
        "get_task_diagnostics": ("GET", f"{base}/tasks/{{task_id}}/diagnostics", {}),
        "cancel_task": ("POST", f"{base}/tasks/{{task_id}}/cancel", {}),
        "create_session": ("POST", f"{base}/sessions", {"json": {"agentId": estate.chat["id"]}}),
        "get_session": ("GET", f"{base}/sessions/{{session_id}}", {}),
        "list_messages": ("GET", f"{base}/sessions/{{session_id}}/messages", {}),
        "post_message": (
            "POST",
            f"{base}/sessions/{{session_id}}/messages",
            {"json": {"message": "pwn"}},
        ),
        "end_session": ("POST", f"{base}/sessions/{{session_id}}/end", {}),
        "get_turn": ("GET", f"{base}/sessions/{{session_id}}/turns/{{turn_id}}", {}),
        "turn_events": ("GET", f"{base}/sessions/{{session_id}}/turns/{{turn_id}}/events", {}),
        "get_turn_trace": ("GET", f"{base}/sessions/{{session_id}}/turns/{{turn_id}}/trace", {}),
        "get_turn_diagnostics": (
            "GET",
            f"{base}/sessions/{{session_id}}/turns/{{turn_id}}/diagnostics",
            {},
        ),
        "list_tools": ("GET", f"{base}/tools", {"params": {"agentId": estate.chat["id"]}}),
        "call_tool": (
            "POST",
            f"{base}/tools/{{tool_name}}",
            {"json": {"agentId": estate.chat["id"], "args": {}}},
        ),
        "search_knowledge": ("GET", f"{base}/knowledge/search", {"params": {"query": "door"}}),
        "list_proposals": ("GET", f"{base}/agents/{{agent_ref}}/proposals", {}),
        "list_eval_suites": ("GET", f"{base}/evals/suites", {}),
        "create_eval_suite": (
            "POST",
            f"{base}/evals/suites",
            {"json": {"name": "intruder", "cases": []}},
        ),
        "get_eval_suite": ("GET", f"{base}/evals/suites/victim-suite", {}),
        "add_eval_case": (
            "POST",
            f"{base}/evals/suites/victim-suite/cases",
            {"json": {"runId": estate.task_id}},
        ),
        "run_eval_suite": ("POST", f"{base}/evals/runs", {"json": {"suite": "victim-suite"}}),
        "list_eval_runs": ("GET", f"{base}/evals/runs", {}),
        "get_eval_run": ("GET", f"{base}/evals/runs/{estate.eval_run_id}", {}),
        "compare_eval_runs": (
            "GET",
            f"{base}/evals/compare",
            {"params": {"a": estate.eval_run_id, "b": estate.eval_run_id}},
        ),
        "decide_proposal": (
            "POST",
            f"{base}/proposals/{uuid.UUID(int=7)}/decision",
            {"json": {"approve": True}},
        ),
        # governance (issue 18): this server registers no connector
        "list_connectors": ("GET", f"{base}/connectors", {}),
        "install_connector": ("PUT", f"{base}/connectors/crm", {"json": {}}),
        "check_connector": ("POST", f"{base}/connectors/crm/check", {}),
        "list_grants": ("GET", f"{base}/grants", {}),
        "create_grant": (
            "POST",
            f"{base}/grants",
            {"json": {"principalId": "*", "connector": "crm"}},
        ),
        "revoke_grant": ("DELETE", f"{base}/grants/{uuid.UUID(int=9)}", {}),
        "read_audit": ("GET", f"{base}/audit", {"params": {"runId": estate.task_id}}),
        "task_report": ("GET", f"{base}/tasks/{{task_id}}/report", {}),
        "label_task": ("POST", f"{base}/tasks/{{task_id}}/label", {"json": {"label": "accepted"}}),
        "shadow_acceptance": ("GET", f"{base}/shadow/acceptance", {}),
        "list_approvals": ("GET", f"{base}/approvals", {"params": {"runId": estate.task_id}}),
        "get_approval": ("GET", f"{base}/approvals/{uuid.UUID(int=11)}", {}),
        "decide_approval": (
            "POST",
            f"{base}/approvals/{uuid.UUID(int=11)}/decision",
            {"json": {"approve": True}},
        ),
        "list_secrets": ("GET", f"{base}/secrets", {}),
        "put_secret": ("PUT", f"{base}/secrets/intruder_key", {"json": {"value": "v"}}),
        "delete_secret": ("DELETE", f"{base}/secrets/victim_key", {}),
        # MCP servers as connectors (tests/test_mcp_connectors.py has their own route tests)
        "list_servers": ("GET", f"{base}/connectors/mcp", {}),
        "register_server": (
            "POST",
            f"{base}/connectors/mcp",
            {"json": {"name": "intruder_mcp", "server": {"transport": "stdio", "command": "sh"}}},
        ),
        "get_server": ("GET", f"{base}/connectors/mcp/victim_mcp", {}),
        "refresh_server": ("POST", f"{base}/connectors/mcp/victim_mcp/refresh", {}),
        "approve_tool": ("POST", f"{base}/connectors/mcp/victim_mcp/tools/t/approve", {"json": {}}),
        "set_tier": (
            "PUT",
            f"{base}/connectors/mcp/victim_mcp/tools/t/tier",
            {"json": {"tier": "read"}},
        ),
        "set_tools": ("PUT", f"{base}/connectors/mcp/victim_mcp/tools", {"json": {"tools": None}}),
        "remove_server": ("DELETE", f"{base}/connectors/mcp/victim_mcp", {}),
        "set_own_credential": (
            "PUT",
            f"{base}/connectors/mcp/victim_mcp/credentials/tok",
            {"json": {"value": "v"}},
        ),
        "delete_own_credential": (
            "DELETE",
            f"{base}/connectors/mcp/victim_mcp/credentials/tok",
            {},
        ),
        "list_schedules": ("GET", f"{base}/schedules", {}),
        "create_schedule": (
            "POST",
            f"{base}/schedules",
            {"json": {"agentId": estate.worker["id"], "goal": "pwn", "intervalS": 60}},
        ),
        "change_schedule": ("POST", f"{base}/schedules/{uuid.UUID(int=13)}/cancel", {}),
        # workflows (tests/test_workflows.py has their own route tests)
        "list_workflows": ("GET", f"{base}/workflows", {}),
        "create_workflow": ("POST", f"{base}/workflows", {"json": {"name": "intruder-flow"}}),
        "get_workflow": ("GET", f"{base}/workflows/victim-flow", {}),
        "publish_version": (
            "POST",
            f"{base}/workflows/victim-flow/versions",
            {"json": {"instructions": "pwn"}},
        ),
        "put_version": (
            "PUT",
            f"{base}/workflows/victim-flow/versions/1",
            {"json": {"instructions": "pwn"}},
        ),
        "start_workflow_run": (
            "POST",
            f"{base}/workflows/victim-flow/runs",
            {"json": {"agentId": estate.worker["id"]}},
        ),
        "list_workflow_runs": ("GET", f"{base}/workflows/victim-flow/runs", {}),
        "workflow_run_ledger": (
            "GET",
            f"{base}/workflows/victim-flow/runs/{{task_id}}",
            {"params": {"limit": 10}},
        ),
        "workflow_acceptance": ("GET", f"{base}/shadow/acceptance/workflows", {}),
        "get_payload": ("GET", f"{base}/payloads/{'0' * 64}", {}),
        # the context graph (tests/test_graph_search.py has its own route tests)
        "search_graph": ("GET", f"{base}/graph/search", {"params": {"term": "door"}}),
        "graph_path": (
            "GET",
            f"{base}/graph/path",
            {"params": {"from": str(uuid.UUID(int=1)), "to": str(uuid.UUID(int=2))}},
        ),
        "submit_triples": (
            "POST",
            f"{base}/graph/triples",
            {
                "json": {
                    "triples": [
                        {
                            "subjectType": "door",
                            "subject": "front",
                            "predicate": "opens",
                            "objectType": "room",
                            "object": "hall",
                        }
                    ]
                }
            },
        ),
        "set_readers": (
            "PUT",
            f"{base}/knowledge/collections/handbook/readers",
            {"json": {"principalIds": []}},
        ),
        "set_freshness": (
            "PUT",
            f"{base}/knowledge/collections/handbook/freshness",
            {"json": {"expectedIntervalS": 3600}},
        ),
        "check_health": ("POST", f"{base}/knowledge/collections/handbook/health", {}),
        "get_health": ("GET", f"{base}/knowledge/collections/handbook/health", {}),
    }
    return {op: (m, url.format(**values), kw) for op, (m, url, kw) in routes.items()}


async def spec_operations(client: httpx2.AsyncClient) -> dict[str, tuple[str, str]]:
    spec = (await client.get("/openapi.json")).json()
    return {
        op["operationId"]: (method.upper(), path)
        for path, item in spec["paths"].items()
        for method, op in item.items()
        if path.startswith("/api/")
    }


async def test_every_route_under_api_needs_a_valid_key(
    client: httpx2.AsyncClient, estate: Estate
) -> None:
    t = estate.tenant
    operations = await spec_operations(client)
    routes = requests_for(estate, t.org)
    routes["whoami"] = ("GET", "/api/me", {})
    assert set(routes) == set(operations), "a route is missing from this test"
    for op, (method, url, kwargs) in routes.items():
        assert method == operations[op][0]
        for headers in (
            {},
            {"Authorization": "Bearer crx_00000000_not-a-key"},
            {"Authorization": f"Basic {t.admin}"},
            t.auth(t.revoked),
        ):
            r = await client.request(method, url, headers=headers, **kwargs)
            assert_error(r, 401, "unauthenticated")
            assert r.headers["www-authenticate"].startswith("Bearer"), op


def leaked(secrets: list[str], r: httpx2.Response, url: str, kwargs: dict[str, Any]) -> list[str]:
    """The secrets in a response that its request did not itself contain. The error body's
    correlation id is a fresh random UUID, not data: it is left out (one with "4711" in it
    read as a leak of the victim's fact "4711")."""
    asked = url + json.dumps(kwargs, default=str)
    text = re.sub(r'"correlationId":\s*"[0-9a-f-]{36}"', "", r.text)
    return [s for s in secrets if s in text and s not in asked]


async def test_no_route_reads_or_writes_another_organisation(
    client: httpx2.AsyncClient, estate: Estate, store: Store, db: Database
) -> None:
    victim = estate.tenant
    intruder = await make_tenant(store, f"org-{uuid.uuid4().hex[:12]}")
    before = await row_counts(db, victim.org)
    secrets = [
        estate.worker["id"],
        estate.chat["id"],
        estate.task_id,
        estate.session_id,
        "victim-",
        "secret",
        "Secret",
        "4711",
        estate.eval_run_id,
    ]
    operations = await spec_operations(client)

    # 1. The intruder's keys on the victim's organisation: nothing is there for them.
    routes = requests_for(estate, victim.org)
    assert set(routes) == {op for op, (_, path) in operations.items() if "{org}" in path}
    for key in (intruder.admin, intruder.user):
        for op, (method, url, kwargs) in routes.items():
            r = await client.request(method, url, headers=intruder.auth(key), **kwargs)
            assert_error(r, 404, "not_found")
            assert not leaked(secrets, r, url, kwargs), (op, r.text)

    # 2. The intruder's own organisation, naming the victim's rows: not found either.
    expected = {
        "list_agents": 200,
        "create_agent": 201,
        "list_tasks": 200,
        "search_knowledge": 200,
        "search_graph": 200,
        "submit_triples": 201,
        "list_eval_suites": 200,
        "list_eval_runs": 200,
        "create_eval_suite": 422,  # no cases
        "list_connectors": 200,
        "list_grants": 200,
        "read_audit": 200,
        "shadow_acceptance": 200,
        "list_approvals": 200,
        "list_secrets": 200,
        "put_secret": 200,  # its own organisation's secret
        "list_servers": 200,
        "register_server": 403,  # a stdio server: only the local operator registers one
        "list_schedules": 200,
        "list_workflows": 200,
        "create_workflow": 201,  # in its own organisation
        "workflow_acceptance": 200,
    }
    for op, (method, url, kwargs) in requests_for(estate, intruder.org).items():
        r = await client.request(method, url, headers=intruder.auth(intruder.admin), **kwargs)
        assert r.status_code == expected.get(op, 404), (op, r.status_code, r.text)
        assert not leaked(secrets, r, url, kwargs), (op, r.text)

    assert await row_counts(db, victim.org) == before
    chat = (
        await client.get(
            f"/api/orgs/{victim.org}/agents/{estate.chat['id']}", headers=victim.auth(victim.admin)
        )
    ).json()
    assert chat["persona"] == "Secret persona."
    session = (
        await client.get(
            f"/api/orgs/{victim.org}/sessions/{estate.session_id}",
            headers=victim.auth(victim.admin),
        )
    ).json()
    assert session["status"] == "OPEN"


# --- knowledge ---------------------------------------------------------------------------------


async def publish_handbook(db: Database, org: str, text: bytes, path: str = "handbook.md") -> None:
    """Publish one markdown file in ``org``'s "handbook" collection, as an ingestion run does."""
    from knowledge_fixtures import ingest

    from cortex_ray.knowledge import KnowledgeWriter

    def run() -> None:
        with KnowledgeWriter(db.dsn) as writer:
            ingest(writer, org, "handbook", {path: text})

    await asyncio.to_thread(run)


async def test_knowledge_search_returns_cited_passages_to_granted_callers(
    client: httpx2.AsyncClient, tenant: Tenant, db: Database
) -> None:
    text = (
        b"# Guide\n\nIntro text.\n\n## Install\n\n"
        b"Run pip install cortex-ray to install the runtime.\n"
    )
    await publish_handbook(db, tenant.org, text, path="docs/guide.md")
    url = f"/api/orgs/{tenant.org}/knowledge/search"
    r = await client.get(url, headers=tenant.auth(tenant.user), params={"query": "install"})
    assert r.status_code == 200, r.text
    found = r.json()
    top = found["hits"][0]
    assert top["path"] == "docs/guide.md" and top["headingPath"] == ["Guide", "Install"]
    assert top["citation"].startswith("docs/guide.md:")
    assert text[top["byteStart"] : top["byteEnd"]].decode() == top["text"]
    assert "bm25" in found["tiers"] and found["reranked"] is False and found["reranker"] is None
    assert any("rerank" in reason for reason in found["skipped"])  # skipped visibly
    assert found["publications"] == {"handbook": found["publications"]["handbook"]}

    # bob's grant names current_time only: no knowledge search for him.
    denied = await client.get(url, headers=tenant.auth(tenant.limited), params={"query": "x"})
    assert_error(denied, 403, "forbidden")
    for params in ({"query": ""}, {"query": "x", "k": 0}, {"query": "x", "fusion": "max"}):
        assert_error(await client.get(url, headers=tenant.auth(tenant.user), params=params), 422)


# --- bad input ---------------------------------------------------------------------------------


async def test_bad_input_is_refused_with_a_reason_and_nothing_changes(
    client: httpx2.AsyncClient, tenant: Tenant, db: Database
) -> None:
    worker = await create_agent(client, tenant, "strict", "AUTONOMOUS")
    chat = await create_agent(client, tenant, "talker")
    session = (
        await client.post(
            f"/api/orgs/{tenant.org}/sessions",
            headers=tenant.auth(tenant.admin),
            json={"agentId": chat["id"]},
        )
    ).json()
    before = await row_counts(db, tenant.org)
    base = f"/api/orgs/{tenant.org}"
    headers = {**tenant.auth(tenant.admin), "content-type": "application/json"}

    def task(payload: dict[str, Any], **top: Any) -> dict[str, Any]:
        return {"json": {"agentId": worker["id"], "payload": payload, **top}}

    too_big = b'{"agentId": "strict", "payload": {"goal": "' + b"x" * MAX_BODY + b'"}}'

    async def chunks() -> AsyncIterator[bytes]:
        yield too_big[: MAX_BODY // 2]
        yield too_big[MAX_BODY // 2 :]

    cases: list[tuple[str, str, dict[str, Any], int, str]] = [
        (
            "POST",
            f"{base}/tasks",
            {"content": b'{"agentId": "strict", "payload": {'},
            400,
            "malformed_json",
        ),
        ("POST", f"{base}/tasks", {"content": b"\xff\xfe"}, 400, "malformed_json"),
        (
            "POST",
            f"{base}/tasks",
            {"json": {"agentId": str(uuid.uuid4()), "payload": {"goal": "x"}}},
            404,
            "not_found",
        ),
        (
            "POST",
            f"{base}/tasks",
            {"json": {"agentId": "nobody", "payload": {"goal": "x"}}},
            404,
            "not_found",
        ),
        ("POST", f"{base}/tasks", task({"goal": "x", "maxSteps": 0}), 422, "invalid_request"),
        ("POST", f"{base}/tasks", task({"goal": "x", "maxSteps": -3}), 422, "invalid_request"),
        ("POST", f"{base}/tasks", task({"goal": "x", "maxSteps": 65}), 422, "invalid_request"),
        ("POST", f"{base}/tasks", task({"goal": "x", "maxSteps": 10**30}), 422, "invalid_request"),
        ("POST", f"{base}/tasks", task({"goal": "x", "maxSteps": "3"}), 422, "invalid_request"),
        ("POST", f"{base}/tasks", task({"goal": "x", "maxSteps": 2.5}), 422, "invalid_request"),
        ("POST", f"{base}/tasks", task({"goal": "x", "maxSteps": True}), 422, "invalid_request"),
        ("POST", f"{base}/tasks", task({"goal": "x", "priority": 1}), 422, "invalid_request"),
        ("POST", f"{base}/tasks", task({"goal": "x"}, owner="me"), 422, "invalid_request"),
        ("POST", f"{base}/tasks", task({"goal": "x"}, assigneeKind="USER"), 422, "invalid_request"),
        ("POST", f"{base}/tasks", {"json": {"agentId": worker["id"]}}, 422, "invalid_request"),
        ("POST", f"{base}/tasks", task({"goal": " ", "description": ""}), 422, "invalid_request"),
        ("POST", f"{base}/tasks", task({"goal": "nul \x00 byte"}), 422, "invalid_request"),
        (
            "POST",
            f"{base}/tasks",
            task({"goal": "x", "contactContext": {"k": "\x00"}}),
            422,
            "invalid_request",
        ),
        (
            "POST",
            f"{base}/tasks",
            task({"goal": "x", "contactContext": {"k": "v" * 9000}}),
            422,
            "invalid_request",
        ),
        (
            "POST",
            f"{base}/tasks",
            {"json": {"agentId": chat["id"], "payload": {"goal": "x"}}},
            422,
            "invalid_request",
        ),  # an INTERACTIVE agent does not run tasks
        ("POST", f"{base}/tasks", {"json": [1, 2]}, 422, "invalid_request"),
        ("POST", f"{base}/tasks", {"content": too_big}, 413, "payload_too_large"),
        ("POST", f"{base}/tasks", {"content": chunks()}, 413, "payload_too_large"),
        ("GET", f"{base}/tasks/not-a-uuid", {}, 422, "invalid_request"),
        ("GET", f"{base}/tasks/{uuid.uuid4()}", {}, 404, "not_found"),
        ("GET", f"{base}/tasks", {"params": {"limit": 0}}, 422, "invalid_request"),
        (
            "POST",
            f"{base}/agents",
            {"json": {"name": "m", "mode": "SOMETIMES"}},
            422,
            "invalid_request",
        ),
        (
            "POST",
            f"{base}/agents",
            {"json": {"name": "m", "tools": ["rm_rf"]}},
            422,
            "invalid_request",
        ),
        ("POST", f"{base}/agents", {"json": {"name": "strict"}}, 422, "invalid_request"),
        ("POST", f"{base}/agents", {"json": {"name": ""}}, 422, "invalid_request"),
        ("PATCH", f"{base}/agents/strict", {"json": {"mode": None}}, 422, "invalid_request"),
        (
            "POST",
            f"{base}/sessions",
            {"json": {"agentId": worker["id"]}},
            422,
            "invalid_request",
        ),  # an AUTONOMOUS agent does not chat
        (
            "POST",
            f"{base}/sessions/{session['id']}/messages",
            {"json": {"message": ""}},
            422,
            "invalid_request",
        ),
        (
            "POST",
            f"{base}/sessions/{uuid.uuid4()}/messages",
            {"json": {"message": "hi"}},
            404,
            "not_found",
        ),
        ("POST", f"{base}/tools/rm_rf", {"json": {"agentId": chat["id"]}}, 404, "not_found"),
        (
            "POST",
            f"{base}/tools/current_time",
            {"json": {"agentId": chat["id"], "args": [1]}},
            422,
            "invalid_request",
        ),
        (
            "POST",
            f"{base}/tools/remember_fact",
            {"json": {"agentId": chat["id"], "args": {"subject": "\x00", "fact": "f"}}},
            422,
            "invalid_request",
        ),
        ("GET", f"{base}/agents/talker/memory", {}, 422, "invalid_request"),  # no query
        (
            "GET",
            f"{base}/agents/talker/memory",
            {"params": {"query": "q", "validAt": "2026-01-01T00:00:00"}},
            422,
            "invalid_request",
        ),  # a time without its zone
        ("GET", "/api/orgs/not a valid org!/agents", {}, 422, "invalid_request"),
        ("DELETE", f"{base}/agents/strict", {}, 405, "method_not_allowed"),
    ]
    for method, url, kwargs, status, code in cases:
        r = await client.request(method, url, headers=headers, **kwargs)
        error = assert_error(r, status, code)
        assert "Traceback" not in error["message"]
    assert await row_counts(db, tenant.org) == before


# --- schemathesis --------------------------------------------------------------------------------

FUZZ_SETTINGS = hypothesis.settings(
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
    phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
)


def fuzz(
    schema: Any,
    key: str,
    ids: dict[str, str],
    modes: tuple[GenerationMode, ...],
    examples: int,
    **call: Any,
) -> tuple[int, list[str]]:
    """Every operation, ``examples`` cases per mode; returns (calls, 5xx responses). The
    organisation and row ids are pinned to real ones so requests reach past the checks."""
    server_errors: list[str] = []
    calls = 0

    def send(case: Any, mode: GenerationMode, where: str) -> None:
        nonlocal calls
        if case.path_parameters:
            for name in ("org", "session_id", "workflow"):
                if name in case.path_parameters:
                    case.path_parameters[name] = ids[name]
        body = case.body
        if mode is GenerationMode.POSITIVE and isinstance(body, dict) and "agentId" in body:
            body["agentId"] = ids["worker" if where.endswith(("/tasks", "/runs")) else "chat"]
        response = case.call(headers={"Authorization": f"Bearer {key}"}, **call)
        calls += 1
        if response.status_code >= 500:
            server_errors.append(
                f"{where} {mode.value}: {response.status_code} {response.text[:200]} "
                f"<- {case.body!r}"
            )

    def sender(mode: GenerationMode, where: str) -> Any:
        def check(case: Any) -> None:
            send(case, mode, where)

        return check

    for result in schema.get_all_operations():
        operation = result.ok()
        where = f"{operation.method.upper()} {operation.path}"
        for mode in modes:
            test = hypothesis.given(case=operation.as_strategy(generation_mode=mode))(
                sender(mode, where)
            )
            try:
                hypothesis.settings(FUZZ_SETTINGS, max_examples=examples)(test)()
            except hypothesis.errors.Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE  # nothing to get wrong (/healthz)
    return calls, server_errors


async def fuzz_estate(settings: Settings, store: Store, org: str) -> tuple[str, dict[str, str]]:
    """An admin key and the ids the fuzzer aims at, created through the runtime."""
    tenant = await make_tenant(store, org)
    runtime = await Runtime.open(settings, model=None, embedder=HashEmbedder(384), db=store.db)
    try:
        worker = await runtime.create_agent(org, "fuzz-worker", mode=AgentMode.AUTONOMOUS)
        chat = await runtime.create_agent(org, "fuzz-chat")
        admin = await store.get_principal(org, "admin")
        session = await runtime.open_session(org, chat.id, admin)
        # A workflow with a version: its routes' requests reach past the lookups.
        from cortex_ray.governance import WorkflowVersionSpec

        await runtime.workflows.create(org, "fuzz-flow")
        await runtime.workflows.publish(
            org, "fuzz-flow", WorkflowVersionSpec(instructions="read the clock")
        )
    finally:
        await runtime.close(close_db=False)
    ids = {
        "org": org,
        "worker": str(worker.id),
        "chat": str(chat.id),
        "session_id": str(session.id),
        "workflow": "fuzz-flow",
    }
    return tenant.admin, ids


@pytest.fixture
def inprocess_app(replica_settings: Settings) -> Iterator[Any]:
    from schemathesis.python import asgi

    # The app opens its own runtime in schemathesis' event-loop thread (its lifespan).
    factory = functools.partial(open_test_runtime, replica_settings)
    yield create_app(factory, options=OPTIONS)
    asgi.shutdown_lifespans()


async def test_schemathesis_in_process_finds_no_server_error(
    inprocess_app: Any, replica_settings: Settings, store: Store, org: str
) -> None:
    key, ids = await fuzz_estate(replica_settings, store, org)
    schema = schemathesis.openapi.from_asgi("/openapi.json", inprocess_app)
    modes = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    calls, errors = await asyncio.to_thread(fuzz, schema, key, ids, modes, 12)
    assert errors == []
    assert calls > 300


async def test_schemathesis_through_ray_serve_finds_no_server_error(
    api_url: str, replica_settings: Settings, store: Store, org: str
) -> None:
    key, ids = await fuzz_estate(replica_settings, store, org)
    schema = await asyncio.to_thread(schemathesis.openapi.from_url, f"{api_url}/openapi.json")
    calls, errors = await asyncio.to_thread(
        fuzz, schema, key, ids, (GenerationMode.POSITIVE,), 3, base_url=api_url
    )
    assert errors == []
    assert calls > 30
