"""A turn is durable once accepted: through real HTTP (uvicorn) in front of session actors on
a real local Ray, the embedded PostgreSQL, and a scripted model that takes a tool round.

The client closes its connection at each point of a turn (before ``started`` is read, right
after it, after the ``tool_call``) on a live and on a passivated session; the exchange is in
the history afterwards, and a reconnecting client reads exactly the events it missed. A
turn whose driver died (RUNNING, its lease expired) is driven again by ``recover_turn`` and
ends DONE once, its tool's effect applied once. The module is shipped to the Ray workers by
value (its factory, model and tool run in the actors).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx2
import pytest

ray = pytest.importorskip("ray")
uvicorn = pytest.importorskip("uvicorn")

from actors import SessionManager, SessionPolicy, SessionUnavailableError  # noqa: E402
from cortex_ray import (  # noqa: E402
    Grant,
    InProcessExecutor,
    Principal,
    RunSupervisor,
    Runtime,
    Settings,
)
from cortex_ray.act import BUILTIN_TOOL_NAMES, Tool, ToolContext  # noqa: E402
from cortex_ray.memory import HeuristicImportanceScorer  # noqa: E402
from cortex_ray.models import (  # noqa: E402
    ChatRequest,
    ChatResponse,
    HashEmbedder,
    ScriptedModelClient,
    ToolCall,
)
from cortex_ray.storage import Database, TurnStatus  # noqa: E402
from serve import create_app  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

TOOLS = [*BUILTIN_TOOL_NAMES, "apply_effect"]


# the model and the tool (shipped to the actors) ----------------------------------------------


def respond(request: ChatRequest) -> str | ChatResponse:
    """A message starting with "effect" applies an effect (one tool round), then replies."""
    props = (request.response_schema or {}).get("properties", {})
    if "importance" in props:
        return json.dumps({"importance": 5})
    if "facts" in props:
        return json.dumps({"facts": []})
    users = [m.content or "" for m in request.messages if m.role == "user"]
    asked = next((u for u in reversed(users) if not u.startswith("Progress so far")), "")
    tool_round_done = bool(users) and users[-1].startswith("Progress so far")
    if request.tools and asked.startswith("effect") and not tool_round_done:
        args = json.dumps({"name": asked})
        return ChatResponse(tool_calls=(ToolCall(id="c1", name="apply_effect", arguments=args),))
    return f"done: {asked}"


async def paced(request: ChatRequest) -> str | ChatResponse:
    """``respond``; a message saying "slow" takes a second to reply after its tool round, so
    the client can go away while the turn still runs ("linger": four seconds)."""
    users = [m.content or "" for m in request.messages if m.role == "user"]
    if users and users[-1].startswith("Progress so far"):
        said = "\n".join(users)
        if "linger" in said:
            await asyncio.sleep(4.0)
        elif "slow" in said:
            await asyncio.sleep(1.0)
    return respond(request)


async def apply_effect(holder: dict[str, Database], ctx: ToolContext, args: dict[str, Any]) -> Any:
    """A side effect with an idempotent receiver: every call is logged, the effect applied
    once per idempotency key."""
    db = holder["db"]
    key = ctx.idempotency_key
    async with db.transaction() as conn:
        await conn.execute(
            "INSERT INTO durable_test_invocations (idem_key, effect) VALUES (%s, %s)",
            (key, args["name"]),
        )
        cur = await conn.execute(
            "INSERT INTO durable_test_effects (idem_key, effect) VALUES (%s, %s) "
            "ON CONFLICT (idem_key) DO NOTHING",
            (key, args["name"]),
        )
        applied = cur.rowcount == 1
    return {"effect": args["name"], "applied": applied}


@dataclass(frozen=True)
class DurableRuntime:
    """The runtime factory of the actors (and of the test process): scripted model, hash
    embedder, the effect tool."""

    async def __call__(self, settings: Settings) -> Runtime:
        return await self.open(settings)

    async def open(
        self, settings: Settings, db: Database | None = None, model: Any = None
    ) -> Runtime:
        holder: dict[str, Database] = {}
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
        runtime = await Runtime.open(
            settings,
            model=model or ScriptedModelClient(responder=paced),
            embedder=HashEmbedder(384),
            importance=HeuristicImportanceScorer(),
            tools=[tool],
            db=db,
        )
        holder["db"] = runtime.db
        return runtime


# fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def effect_tables(db: Database) -> None:
    async with db.transaction() as conn:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS durable_test_effects "
            "(idem_key text PRIMARY KEY, effect text NOT NULL)"
        )
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS durable_test_invocations "
            "(id bigserial PRIMARY KEY, idem_key text, effect text NOT NULL)"
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Stack:
    url: str
    runtime: Runtime
    manager: SessionManager


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """``app`` on uvicorn on a free local port; its base URL."""
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    running = asyncio.create_task(server.serve())
    while not server.started:
        assert not running.done(), "uvicorn did not start"
        await asyncio.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await running


@pytest.fixture(scope="module")
async def stack(
    ray_cluster: Any, settings: Settings, db: Database, effect_tables: None
) -> AsyncIterator[Stack]:
    """The API on uvicorn (real sockets, so a client can really go away) in front of session
    actors; the test process's runtime shares the test database."""
    # A reconnect follows a turn until it is quiet this long (its tool rounds here are
    # at most four seconds apart). The supervisor of this API leaves alone the turns other
    # tests' managers drive (an actor may take over ten seconds to start on a busy
    # machine): only turns accepted long ago are orphans to it.
    sessions = settings.sessions.model_copy(
        update={"turn_replay_wait_s": 10.0, "turn_orphan_grace_s": 600.0}
    )
    app_settings = settings.model_copy(update={"database_url": db.dsn, "sessions": sessions})
    runtime = await DurableRuntime().open(app_settings, db=db)
    policy = SessionPolicy(namespace=f"test-durable-{uuid.uuid4().hex[:8]}", warm_actors=1)
    manager = SessionManager.for_runtime(runtime, factory=DurableRuntime(), policy=policy)
    try:
        async with serving(create_app(runtime, manager)) as url:
            yield Stack(url, runtime, manager)
    finally:
        await runtime.close(close_db=False)


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(base_url=stack.url, timeout=90) as c:
        yield c


async def ada_key(runtime: Runtime, org: str) -> dict[str, str]:
    await runtime.store.ensure_org(org)
    ada = Principal(id="ada", org_id=org, name="ada", grant=Grant(tools=frozenset({"*"})))
    key, _ = await runtime.store.create_api_key(ada, "ada's key")
    return {"Authorization": f"Bearer {key}"}


async def new_session(runtime: Runtime, client: httpx2.AsyncClient, org: str) -> tuple[str, Any]:
    """A chat session of ada's; its base URL and her auth headers."""
    headers = await ada_key(runtime, org)
    agent = await runtime.create_agent(org, f"chat-{uuid.uuid4().hex[:6]}", tools=TOOLS)
    r = await client.post(
        f"/api/orgs/{org}/sessions", headers=headers, json={"agentId": str(agent.id)}
    )
    assert r.status_code == 201, r.text
    return f"/api/orgs/{org}/sessions/{r.json()['id']}", headers


async def all_events(
    client: httpx2.AsyncClient, method: str, url: str, headers: dict[str, str], **kw: Any
) -> list[tuple[str, str, Any]]:
    """(event, id, data) of a whole stream."""
    async with client.stream(method, url, headers=headers, **kw) as r:
        assert r.status_code == 200, await r.aread()
        return [(e.event, e.id, e.json()) async for e in httpx2.EventSource(r)]


async def eventually(check: Callable[[], Awaitable[Any]], within: float = 30.0) -> Any:
    deadline = time.monotonic() + within
    while True:
        result = await check()
        if result or time.monotonic() > deadline:
            return result
        await asyncio.sleep(0.05)


async def effect_rows(db: Database, key: str) -> tuple[int, int]:
    """(invocations, effects applied) for an idempotency key."""
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT (SELECT count(*) FROM durable_test_invocations WHERE idem_key = %s) AS calls,"
            " (SELECT count(*) FROM durable_test_effects WHERE idem_key = %s) AS effects",
            (key, key),
        )
        row = await cur.fetchone()
    assert row is not None
    return row["calls"], row["effects"]


# closing the connection at each point --------------------------------------------------------


@pytest.mark.parametrize("where", ["live", "passivated"])
@pytest.mark.parametrize("point", ["before_started", "after_started", "after_tool_call"])
async def test_a_client_that_goes_away_loses_nothing(
    stack: Stack, client: httpx2.AsyncClient, org: str, where: str, point: str
) -> None:
    base, headers = await new_session(stack.runtime, client, org)
    session_id = uuid.UUID(base.rsplit("/", 1)[1])
    first = await all_events(client, "POST", f"{base}/messages", headers, json={"message": "hi"})
    assert [name for name, _, _ in first][-1] == "done"
    if where == "live":
        assert await stack.manager.session_actor(org, session_id) is not None
    else:
        assert await stack.manager.passivate(org, session_id)

        async def gone() -> bool:
            return await stack.manager.session_actor(org, session_id) is None

        assert await eventually(gone), "the session's actor did not passivate"

    message = f"effect slow {point}"
    turn_id: str | None = None
    async with client.stream(
        "POST", f"{base}/messages", headers=headers, json={"message": message}
    ) as r:
        assert r.status_code == 200
        if point != "before_started":
            events = httpx2.EventSource(r).__aiter__()
            started = await anext(events)
            assert started.event == "started"
            turn_id = started.json()["turnId"]
            assert started.id == f"{turn_id}:0"
            if point == "after_tool_call":
                call = await anext(events)
                assert (call.event, call.id) == ("tool_call", f"{turn_id}:1")
    # The connection is closed here, the turn still running (or queued).

    if turn_id is None:  # never read: the history names the accepted turn
        history = (await client.get(f"{base}/messages", headers=headers)).json()["messages"]
        assert history[-1]["role"] == "user" and history[-1]["content"] == message
        turn_id = history[-1]["turnId"]
        assert turn_id is not None
    turn = (
        await client.get(f"{base}/turns/{turn_id}", headers=headers, params={"wait": 60})
    ).json()
    assert turn["status"] == "DONE", turn
    assert turn["reply"] == f"done: {message}" and turn["attempts"] == 1
    assert turn["lastEventId"] == f"{turn_id}:4"

    history = (await client.get(f"{base}/messages", headers=headers)).json()["messages"]
    assert [(m["role"], m["content"], m["turnStatus"]) for m in history[-3:]] == [
        ("user", message, "DONE"),
        ("tool", history[-2]["content"], "DONE"),
        ("assistant", f"done: {message}", "DONE"),
    ]
    assert len(history) == 5 and {m["turnId"] for m in history[-3:]} == {turn_id}
    assert await effect_rows(stack.runtime.db, f"turn:{turn_id}:0") == (1, 1)
    audit = [
        row
        for row in await stack.runtime.store.audit_rows(org, gate_only=True)
        if row["tool"] == "apply_effect"
    ]
    assert [(a["status"], a["idempotency_key"]) for a in audit] == [("OK", f"turn:{turn_id}:0")]


async def test_a_reconnecting_client_reads_exactly_what_it_missed(
    stack: Stack, client: httpx2.AsyncClient, org: str
) -> None:
    base, headers = await new_session(stack.runtime, client, org)
    async with client.stream(
        "POST", f"{base}/messages", headers=headers, json={"message": "effect slow again"}
    ) as r:
        events = httpx2.EventSource(r).__aiter__()
        started = await anext(events)
        turn_id = started.json()["turnId"]
        assert (await anext(events)).id == f"{turn_id}:1"
    url = f"{base}/turns/{turn_id}/events"

    # Waits for the running turn, then replays what came after the tool call.
    rest = await all_events(client, "GET", url, {**headers, "Last-Event-ID": f"{turn_id}:1"})
    assert [(name, i) for name, i, _ in rest] == [
        ("observation", f"{turn_id}:2"),
        ("reply", f"{turn_id}:3"),
        ("done", f"{turn_id}:4"),
    ]
    assert rest[1][2] == {"message": "done: effect slow again"}
    assert rest[2][2]["reply"] == "done: effect slow again" and rest[2][2]["observations"] == 1

    # From the start: the same events, with the same ids, as a full first stream has.
    replay = await all_events(client, "GET", url, headers)
    fresh = await all_events(
        client, "POST", f"{base}/messages", headers, json={"message": "effect once more"}
    )
    assert [n for n, _, _ in replay] == [n for n, _, _ in fresh]
    assert [i for _, i, _ in replay] == [f"{turn_id}:{seq}" for seq in range(5)]
    assert replay[1][2] == {
        "round": 0,
        "tool": "apply_effect",
        "args": {"name": "effect slow again"},
    }

    assert [
        n for n, _, _ in await all_events(client, "GET", url, headers, params={"after": 3})
    ] == ["done"]
    assert await all_events(client, "GET", url, {**headers, "Last-Event-ID": f"{turn_id}:4"}) == []
    other = f"{uuid.uuid4()}:1"
    r = await client.get(url, headers={**headers, "Last-Event-ID": other})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"

    # Reading a turn is reading the session: not another caller's.
    bob = Principal(id="bob", org_id=org, name="bob", grant=Grant(tools=frozenset({"*"})))
    bob_key, _ = await stack.runtime.store.create_api_key(bob, "bob's key")
    r = await client.get(f"{base}/turns/{turn_id}", headers={"Authorization": f"Bearer {bob_key}"})
    assert r.status_code == 403


async def test_a_reconnect_follows_a_running_turn_live(
    stack: Stack, client: httpx2.AsyncClient, org: str
) -> None:
    base, headers = await new_session(stack.runtime, client, org)
    message = "effect linger live"
    async with client.stream(
        "POST", f"{base}/messages", headers=headers, json={"message": message}
    ) as r:
        started = await anext(httpx2.EventSource(r).__aiter__())
        turn_id = started.json()["turnId"]
    # Gone right after `started`; back once the turn is driven (an actor may take a few
    # seconds to start on a busy machine): the reconnect follows the turn as it runs.

    async def driven() -> bool:
        turn = (await client.get(f"{base}/turns/{turn_id}", headers=headers)).json()
        return bool(turn["status"] == "RUNNING")

    assert await eventually(driven), "the turn was never driven"
    seen: list[tuple[str, str, str]] = []  # (event, id, the turn's status when it came)
    async with client.stream(
        "GET",
        f"{base}/turns/{turn_id}/events",
        headers={**headers, "Last-Event-ID": f"{turn_id}:0"},
    ) as r:
        assert r.status_code == 200
        async for event in httpx2.EventSource(r):
            status = (await client.get(f"{base}/turns/{turn_id}", headers=headers)).json()
            seen.append((event.event, event.id, status["status"]))
    assert [(name, i) for name, i, _ in seen] == [
        ("tool_call", f"{turn_id}:1"),
        ("observation", f"{turn_id}:2"),
        ("reply", f"{turn_id}:3"),
        ("done", f"{turn_id}:4"),
    ]
    # The tool round came while the turn still ran (its reply is four seconds later).
    assert [status for _, _, status in seen[:2]] == ["RUNNING", "RUNNING"]
    turn = (await client.get(f"{base}/turns/{turn_id}", headers=headers)).json()
    assert turn["status"] == "DONE" and turn["reply"] == f"done: {message}"
    assert turn["lastEventId"] == f"{turn_id}:4" and turn["attempts"] == 1
    # What was followed is what is stored: a replay from the start gives the same ids.
    replay = await all_events(client, "GET", f"{base}/turns/{turn_id}/events", headers)
    assert [i for _, i, _ in replay] == [f"{turn_id}:{seq}" for seq in range(5)]


async def test_a_quiet_turn_ends_the_follow_with_pending(
    stack: Stack, client: httpx2.AsyncClient, org: str
) -> None:
    """A turn whose driver says nothing (a live lease held elsewhere): no event for
    ``turn_replay_wait_s``, so the stream ends with its status; the client reconnects."""
    runtime = stack.runtime
    agent = await runtime.create_agent(org, f"quiet-{uuid.uuid4().hex[:6]}", tools=TOOLS)
    ada = Principal(id="ada", org_id=org, name="ada", grant=Grant(tools=frozenset({"*"})))
    session = await runtime.open_session(org, agent.id, ada)
    turn = await runtime.accept_turn(org, session.id, "effect held elsewhere", principal=ada)
    async with runtime.db.transaction() as conn:
        await conn.execute(
            "UPDATE session_turns SET status = 'RUNNING', attempts = 1, lease_token = 1, "
            "lease_owner = 'elsewhere', lease_expires_at = now() + interval '1 hour' "
            "WHERE org_id = %s AND id = %s",
            (org, turn.id),
        )
    headers = await ada_key(runtime, org)
    url = f"/api/orgs/{org}/sessions/{session.id}/turns/{turn.id}/events"
    wait = runtime.settings.sessions.turn_replay_wait_s
    began = time.monotonic()
    events = await all_events(client, "GET", url, {**headers, "Last-Event-ID": f"{turn.id}:0"})
    assert time.monotonic() - began >= wait
    assert [n for n, _, _ in events] == ["pending"]
    assert events[0][2]["status"] == "RUNNING"


# in-process: the pending bound, pending turns in the history, ordinal order --------------------


@pytest.fixture
async def inprocess(
    settings: Settings, db: Database, effect_tables: None
) -> AsyncIterator[tuple[Runtime, ScriptedModelClient]]:
    model = ScriptedModelClient(responder=respond)
    sessions = settings.sessions.model_copy(update={"max_pending_turns": 2})
    runtime = await DurableRuntime().open(
        settings.model_copy(update={"sessions": sessions}), db=db, model=model
    )
    yield runtime, model
    await runtime.close(close_db=False)


async def test_a_busy_session_is_refused_with_plain_json_before_any_stream(
    inprocess: tuple[Runtime, ScriptedModelClient], org: str
) -> None:
    runtime, _ = inprocess
    transport = httpx2.ASGITransport(app=create_app(runtime, InProcessExecutor(runtime)))
    async with httpx2.AsyncClient(transport=transport, base_url="http://api") as client:
        base, headers = await new_session(runtime, client, org)
        session_id = uuid.UUID(base.rsplit("/", 1)[1])
        ada = await runtime.store.get_principal(org, "ada")
        # Two turns accepted and not driven (their process died, say): the queue is full.
        queued = [
            await runtime.accept_turn(org, session_id, text, principal=ada)
            for text in ("first", "second")
        ]
        r = await client.post(f"{base}/messages", headers=headers, json={"message": "third"})
        assert r.status_code == 409
        assert r.headers["content-type"] == "application/json"
        error = r.json()["error"]
        assert error["code"] == "conflict" and "limit 2" in error["message"]

        history = (await client.get(f"{base}/messages", headers=headers)).json()["messages"]
        assert [(m["content"], m["turnStatus"], m["turnId"]) for m in history] == [
            ("first", "ACCEPTED", str(queued[0].id)),
            ("second", "ACCEPTED", str(queued[1].id)),
        ]
        r = await client.get(f"{base}/turns/{queued[0].id}", headers=headers)
        assert r.json()["status"] == "ACCEPTED" and r.json()["lastEventId"] is None


async def test_turns_run_in_the_order_they_were_accepted_and_see_their_message_once(
    inprocess: tuple[Runtime, ScriptedModelClient], org: str
) -> None:
    runtime, model = inprocess
    agent = await runtime.create_agent(org, "orderly", tools=TOOLS)
    ada = Principal(id="ada", org_id=org, name="ada", grant=Grant(tools=frozenset({"*"})))
    session = await runtime.open_session(org, agent.id, ada)
    first = await runtime.accept_turn(org, session.id, "first", principal=ada)
    second = await runtime.accept_turn(org, session.id, "second", principal=ada)
    executor = InProcessExecutor(runtime)
    try:
        # The later turn is handed over first: it waits for the earlier one.
        later = asyncio.create_task(
            executor.turn(org, session.id, ada, second.message, turn_id=second.id)
        )
        await asyncio.sleep(0.2)
        assert not later.done()
        assert (await runtime.turns.get(org, session.id, second.id)).status is TurnStatus.ACCEPTED
        earlier = await executor.turn(org, session.id, ada, first.message, turn_id=first.id)
        assert earlier.reply == "done: first" and (await later).reply == "done: second"
    finally:
        await executor.aclose()
    history = await runtime.conversation(org, session.id, principal=ada)
    assert [m.content for m in history] == ["first", "done: first", "second", "done: second"]
    for request in model.requests:
        said = [m.content for m in request.messages if m.role == "user"]
        assert said.count("first") + said.count("second") <= 2
        assert said.count(said[-1]) == 1, said


# recovery --------------------------------------------------------------------------------------


async def crashed_turn(runtime: Runtime, org: str, message: str, *, attempts: int) -> Any:
    """A turn whose driver died after applying its round-0 effect: RUNNING, lease expired."""
    agent = await runtime.create_agent(org, f"crashy-{uuid.uuid4().hex[:6]}", tools=TOOLS)
    ada = Principal(id="ada", org_id=org, name="ada", grant=Grant(tools=frozenset({"*"})))
    session = await runtime.open_session(org, agent.id, ada)
    turn = await runtime.accept_turn(org, session.id, message, principal=ada)
    key = f"turn:{turn.id}:0"
    async with runtime.db.transaction() as conn:
        await conn.execute(
            """
            UPDATE session_turns SET status = 'RUNNING', attempts = %s, lease_owner = 'dead',
                lease_token = 1, lease_expires_at = now() - interval '1 second',
                accepted_at = now() - interval '1 hour'
            WHERE org_id = %s AND id = %s
            """,
            (attempts, org, turn.id),
        )
        await conn.execute(
            "INSERT INTO durable_test_invocations (idem_key, effect) VALUES (%s, %s)",
            (key, message),
        )
        await conn.execute(
            "INSERT INTO durable_test_effects (idem_key, effect) VALUES (%s, %s)", (key, message)
        )
    return session, turn


@pytest.mark.parametrize("executor_kind", ["actors", "in_process"])
async def test_an_orphaned_turn_is_recovered_once_its_effect_applied_once(
    stack: Stack, org: str, executor_kind: str
) -> None:
    runtime = stack.runtime
    session, turn = await crashed_turn(runtime, org, "effect after a crash", attempts=1)
    orphans = await runtime.orphaned_turns()
    assert (org, session.id, turn.id) in {(o.org_id, o.session_id, o.turn_id) for o in orphans}

    in_process = InProcessExecutor(runtime)
    executor = stack.manager if executor_kind == "actors" else in_process
    try:
        # Twice: the second finds the turn in flight (or ended) and leaves it alone.
        await executor.recover_turn(org, session.id, turn.id)
        await executor.recover_turn(org, session.id, turn.id)
        ended = await runtime.wait_turn(org, session.id, turn.id, 60)
    finally:
        await in_process.aclose()
    assert ended.status is TurnStatus.DONE and ended.attempts == 2, ended
    assert ended.reply == "done: effect after a crash"
    assert await effect_rows(runtime.db, f"turn:{turn.id}:0") == (2, 1)  # called again, once
    history = await runtime.conversation(org, session.id)
    assert [(m.role, m.turn_status) for m in history] == [
        ("user", TurnStatus.DONE),
        ("tool", TurnStatus.DONE),
        ("assistant", TurnStatus.DONE),
    ]
    assert turn.id not in {o.turn_id for o in await runtime.orphaned_turns()}
    # Driven again after it ended: nothing changes.
    again = await runtime.recover_turn(org, session.id, turn.id)
    assert again.reply == ended.reply
    assert len(await runtime.conversation(org, session.id)) == 3


@pytest.mark.parametrize("how", ["ray.kill", "SIGKILL"])
async def test_a_turn_whose_actor_dies_is_driven_again_at_once(
    ray_cluster: Any, settings: Settings, db: Database, effect_tables: None, org: str, how: str
) -> None:
    """The session actor dies mid-turn (``ray.kill``: gone for good; SIGKILL of its process:
    Ray restarts it): the turn is driven again at once, by its successor, not after its
    lease expires: the lease here lasts ten minutes, the test waits at most a minute."""
    ttl = 600.0
    sessions = settings.sessions.model_copy(update={"turn_lease_ttl_s": ttl})
    app_settings = settings.model_copy(update={"database_url": db.dsn, "sessions": sessions})
    runtime = await DurableRuntime().open(app_settings, db=db)
    # warm_actors=0: the session gets an actor named after it, which Ray restarts after a
    # SIGKILL (an adopted warm actor is replaced instead, as after ray.kill).
    policy = sessions.model_copy(
        update={"namespace": f"test-crash-{uuid.uuid4().hex[:8]}", "warm_actors": 0}
    )
    manager = SessionManager.for_runtime(runtime, factory=DurableRuntime(), policy=policy)
    try:
        agent = await runtime.create_agent(org, f"crash-{uuid.uuid4().hex[:6]}", tools=TOOLS)
        ada = Principal(id="ada", org_id=org, name="ada", grant=Grant(tools=frozenset({"*"})))
        session = await runtime.open_session(org, agent.id, ada)
        message = f"effect linger until {how}"
        turn = await runtime.accept_turn(org, session.id, message, principal=ada)
        heard: list[str] = []
        first = asyncio.create_task(
            manager.turn(
                org, session.id, ada, message, turn_id=turn.id,
                on_event=lambda e: heard.append(e.kind.value),
            )
        )  # fmt: skip

        async def applied() -> bool:
            return (await effect_rows(db, f"turn:{turn.id}:0"))[0] > 0

        assert await eventually(applied, 90), "the turn's tool round did not run"
        assert await effect_rows(db, f"turn:{turn.id}:0") == (1, 1)
        running = await runtime.turns.get(org, session.id, turn.id)
        assert running.status is TurnStatus.RUNNING and running.attempts == 1
        assert running.lease_expires_at is not None
        actor = await manager.session_actor(org, session.id)
        assert actor is not None
        killed_at = time.monotonic()
        if how == "ray.kill":
            ray.kill(actor)
        else:
            os.kill(await actor.pid.remote(), signal.SIGKILL)
        with pytest.raises(SessionUnavailableError):
            await first  # the first driver's caller hears that it died
        assert heard[:2] == ["tool_call", "observation"]

        ended = await runtime.wait_turn(org, session.id, turn.id, 60)
        took = time.monotonic() - killed_at
        assert ended.status is TurnStatus.DONE, ended
        assert ended.reply == f"done: {message}" and ended.attempts == 2
        # Driven again because the actor died, not because the lease expired: well before.
        assert took < 60 < ttl
        assert ended.finished_at is not None and ended.finished_at < running.lease_expires_at
        # The second attempt's events, stored; its tool call made again with the same key,
        # the effect applied once.
        assert [e.event.kind.value for e in ended.events] == ["tool_call", "observation", "reply"]
        assert [e.seq for e in ended.events] == [1, 2, 3]
        assert await effect_rows(db, f"turn:{turn.id}:0") == (2, 1)
        history = await runtime.conversation(org, session.id)
        assert [(m.role, m.turn_status) for m in history] == [
            ("user", TurnStatus.DONE),
            ("tool", TurnStatus.DONE),
            ("assistant", TurnStatus.DONE),
        ]
    finally:
        with contextlib.suppress(Exception):
            ray.kill(manager.directory())
        await runtime.close(close_db=False)


async def test_a_turn_past_its_attempts_ends_failed_with_the_reason(
    stack: Stack, client: httpx2.AsyncClient, org: str
) -> None:
    runtime = stack.runtime
    limit = runtime.settings.sessions.turn_max_attempts
    session, turn = await crashed_turn(runtime, org, "effect that keeps crashing", attempts=limit)
    result = await runtime.recover_turn(org, session.id, turn.id)
    assert result.reply is None and result.refused is not None and "interrupted" in result.refused
    ended = await runtime.turns.get(org, session.id, turn.id)
    assert ended.status is TurnStatus.FAILED and ended.attempts == limit
    history = await runtime.conversation(org, session.id)
    assert [(m.role, m.content, m.turn_status) for m in history] == [
        ("user", "effect that keeps crashing", TurnStatus.FAILED)
    ]
    assert history[0].refused == ended.reason
    # A reconnecting client hears how it ended.
    headers = await ada_key(runtime, org)
    url = f"/api/orgs/{org}/sessions/{session.id}/turns/{turn.id}/events"
    events = await all_events(client, "GET", url, headers)
    assert [n for n, _, _ in events] == ["started", "error"]
    assert events[-1][2]["status"] == 409 and "interrupted" in events[-1][2]["message"]


async def test_the_supervisor_recovers_orphaned_turns(
    inprocess: tuple[Runtime, ScriptedModelClient], org: str
) -> None:
    runtime, _ = inprocess
    session, turn = await crashed_turn(runtime, org, "effect swept up", attempts=1)
    executor = InProcessExecutor(runtime)
    try:
        assert await RunSupervisor(runtime, executor).sweep_turns() >= 1
        ended = await runtime.wait_turn(org, session.id, turn.id, 60)
    finally:
        await executor.aclose()
    assert ended.status is TurnStatus.DONE and ended.reply == "done: effect swept up"
    assert await effect_rows(runtime.db, f"turn:{turn.id}:0") == (2, 1)


# the real packaged model, in process -----------------------------------------------------------


@pytest.mark.integration
async def test_a_turn_of_the_packaged_model_survives_its_client_going_away(
    settings: Settings, db: Database, smollm2: Any, minilm: Any, org: str
) -> None:
    runtime = await Runtime.open(
        settings.model_copy(update={"model_max_tokens": 64}),
        model=smollm2,
        embedder=minilm,
        importance=HeuristicImportanceScorer(),
        db=db,
    )
    executor = InProcessExecutor(runtime)
    try:
        async with (
            serving(create_app(runtime, executor)) as url,
            httpx2.AsyncClient(base_url=url, timeout=300) as client,
        ):
            headers = await ada_key(runtime, org)
            agent = await runtime.create_agent(org, "terse", tools=["reply"])
            r = await client.post(
                f"/api/orgs/{org}/sessions", headers=headers, json={"agentId": str(agent.id)}
            )
            base = f"/api/orgs/{org}/sessions/{r.json()['id']}"
            message = "Say hello in three words."
            async with client.stream(
                "POST", f"{base}/messages", headers=headers, json={"message": message}
            ) as r:
                started = await anext(httpx2.EventSource(r).__aiter__())
                turn_id = started.json()["turnId"]
            # Gone before the model answered; the turn runs on.
            turn = (
                await client.get(f"{base}/turns/{turn_id}", headers=headers, params={"wait": 60})
            ).json()
            assert turn["status"] == "DONE", turn
            history = (await client.get(f"{base}/messages", headers=headers)).json()["messages"]
            assert history[0]["content"] == message and history[0]["turnStatus"] == "DONE"
            if turn["reply"] is not None:
                assert [m["role"] for m in history] == ["user", "assistant"]
                assert history[1]["content"] == turn["reply"]
            else:
                assert [m["role"] for m in history] == ["user"] and history[0]["refused"]
            replay = await all_events(client, "GET", f"{base}/turns/{turn_id}/events", headers)
            assert replay[0][0] == "started" and replay[-1][0] == "done"
            assert replay[-1][2]["reply"] == turn["reply"]
    finally:
        await executor.aclose()
        await runtime.close(close_db=False)
