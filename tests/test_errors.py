"""Errors say what a client needs, nothing more: through real HTTP on Ray Serve, with the
failures raised inside real session actors on a local Ray.

The API runs as a Serve application in front of ``actors.SessionManager``; its replica and
the session actors open their runtimes with the scripted model below, which is where the
failures come from (a turn that waits for the test, a timeout, an unexpected exception), or
fail to start at all while a flag file exists. Every refusal must reach the client as the
one error body (or the SSE ``error`` event) with a code, a message and a correlation id,
and none of Ray's text: no traceback, source line, pid, IP address, actor id, colour code
or Python repr. The replica writes its ``serve.api`` log to a file, where the correlation id
must lead to the full detail.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import re
import socket
import sys
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import psycopg
import pytest

from cortex_ray import (
    AgentMode,
    ConflictError,
    Grant,
    NotFoundError,
    Principal,
    Runtime,
    SessionPolicy,
    Settings,
    StorageError,
)
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import ChatRequest, ChatResponse, HashEmbedder, ScriptedModelClient, ToolCall
from cortex_ray.storage import Database, Store

ray = pytest.importorskip("ray")
# tests/ is not importable in the Serve replica nor in the actors: ship this module by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

from ray.exceptions import (  # noqa: E402
    ActorDiedError,
    ActorUnavailableError,
    GetTimeoutError,
    RayTaskError,
)
from ray.serve.exceptions import BackPressureError  # noqa: E402

from actors import SessionBusyError, SessionUnavailableError  # noqa: E402
from serve import ApiOptions, build_api  # noqa: E402
from serve._errors import root_cause, status_of  # noqa: E402

APP_NAME = "cortex-errors-test"
NAMESPACE = f"cortex-errors-{uuid.uuid4().hex[:8]}"

# What must never reach a client.
LEAKS = {
    "traceback": re.compile(r"Traceback|most recent call last"),
    "source line": re.compile(r'File "'),
    "pid": re.compile(r"\bpid\b", re.IGNORECASE),
    "IP address": re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b"),
    "actor id": re.compile(r"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])"),
    "ANSI escape": re.compile(r"\x1b|\\u001b"),
    "class repr": re.compile(r"<[\w.]+ object at 0x[0-9a-f]+>|\bRayTaskError\b|\w+Error\("),
    "Ray's words": re.compile(r"\bactor_id\b|\bray\.|AgentSession|proctitle"),
}

FAKE_INTERNALS = "at 10.1.2.3 pid=4242 actor_id=" + "ab" * 16 + " <x.Y object at 0xdeadbeef>"


# --- the scripted model, in the replica and in the actors -------------------------------------


@dataclass(frozen=True)
class Scripted:
    """Interactive answers by the message: "hold" calls ``current_time``, then replies once
    the ``release`` file exists; "time out" raises TimeoutError; "crash" an unexpected
    RuntimeError (both with internals in their text, which must not reach the client)."""

    release: str

    async def __call__(self, request: ChatRequest) -> str | ChatResponse:
        props = (request.response_schema or {}).get("properties", {})
        if "facts" in props:
            return json.dumps({"facts": []})
        if "importance" in props:
            return json.dumps({"importance": 5})
        users = [m.content or "" for m in request.messages if m.role == "user"]
        text = "\n".join(m.content or "" for m in request.messages)
        asked = next((u for u in reversed(users) if not u.startswith("Progress so far")), "")
        if "time out" in asked:
            raise TimeoutError(f"the model did not answer within 30 s {FAKE_INTERNALS}")
        if "crash" in asked:
            raise RuntimeError(f"boom {FAKE_INTERNALS}")
        if "hold" in asked:
            if request.tools and "Progress so far" not in text:
                return ChatResponse(
                    tool_calls=(ToolCall(id="call-1", name="current_time", arguments="{}"),)
                )
            # The test is another process: it says "go on" by creating a file.
            deadline = time.monotonic() + 120
            while not os.path.exists(self.release) and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        return f"You said: {asked[:60]}"


def _log_to(path: str) -> None:
    """The replica's ``serve.api`` log, also to ``path`` (one record per ``@@`` line)."""
    logger = logging.getLogger("serve.api")
    target = os.path.abspath(path)
    if any(getattr(h, "baseFilename", None) == target for h in logger.handlers):
        return
    handler = logging.FileHandler(target)
    handler.setFormatter(logging.Formatter("@@ %(levelname)s %(name)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


async def open_scripted(settings: Settings, *, release: str, log_path: str) -> Runtime:
    _log_to(log_path)
    return await Runtime.open(
        settings,
        model=ScriptedModelClient(responder=Scripted(release)),
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
    )


@dataclass(frozen=True)
class ActorRuntime:
    """The session actors' runtime factory: refuses to start while ``flag`` exists."""

    release: str
    log_path: str
    flag: str

    async def __call__(self, settings: Settings) -> Runtime:
        if os.path.exists(self.flag):
            raise RuntimeError(f"refusing to start {FAKE_INTERNALS}")
        return await open_scripted(settings, release=self.release, log_path=self.log_path)


@dataclass(frozen=True)
class SessionActors:
    """The replica's executor factory: session actors, one turn at a time per session."""

    actor_runtime: ActorRuntime

    def __call__(self, runtime: Runtime) -> Any:
        from actors import SessionManager

        # The policy is the settings' (sessions_policy below), as the core's bound is.
        return SessionManager.for_runtime(runtime, factory=self.actor_runtime)


def sessions_policy(base: SessionPolicy) -> SessionPolicy:
    wanted = {
        "namespace": NAMESPACE,
        "max_pending_turns": 1,
        "warm_actors": 0,  # a new session starts its own actor (so the flag can stop it)
        "turn_max_attempts": 1,  # a failed turn is not driven again behind the test's back
    }
    return base.model_copy(update={k: v for k, v in wanted.items() if k in type(base).model_fields})


# --- fixtures ---------------------------------------------------------------------------------


@dataclass
class Stack:
    url: str
    files: Path
    log: Path

    @property
    def flag(self) -> Path:
        return self.files / "no-actors"

    @property
    def release(self) -> Path:
        return self.files / "release"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def stack(ray_cluster: Any, settings: Settings, db: Database) -> Iterator[Stack]:
    from ray import serve as ray_serve

    files = Path(f"/tmp/cortex-errors-{uuid.uuid4().hex[:8]}")
    files.mkdir()
    log = files / "serve-api.log"
    replica_settings = settings.model_copy(
        update={"database_url": db.dsn, "sessions": sessions_policy(settings.sessions)}
    )
    actor_runtime = ActorRuntime(str(files / "release"), str(log), str(files / "no-actors"))
    factory = functools.partial(
        open_scripted, replica_settings, release=actor_runtime.release, log_path=str(log)
    )
    port = _free_port()
    ray_serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        app = build_api(factory, SessionActors(actor_runtime), options=ApiOptions())
        ray_serve.run(app, name=APP_NAME, route_prefix="/")
        yield Stack(f"http://127.0.0.1:{port}", files, log)
    finally:
        ray_serve.shutdown()
        for name in ray.util.list_named_actors(all_namespaces=True):
            if name["namespace"] == NAMESPACE:
                ray.kill(ray.get_actor(name["name"], namespace=NAMESPACE))


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(base_url=stack.url, timeout=120) as c:
        yield c


@dataclass
class Chat:
    messages: str  # the session's messages URL
    user: dict[str, str]


@pytest.fixture
async def chat(client: httpx2.AsyncClient, store: Store, org: str) -> Chat:
    await store.ensure_org(org)
    everything = Grant(tools=frozenset({"*"}))
    admin, _ = await store.create_api_key(
        Principal(id="admin", org_id=org, is_admin=True, grant=everything), "admin"
    )
    user, _ = await store.create_api_key(Principal(id="ada", org_id=org, grant=everything), "ada")
    r = await client.post(
        f"/api/orgs/{org}/agents",
        headers=bearer(admin),
        json={"name": "helper", "mode": AgentMode.INTERACTIVE.value},
    )
    assert r.status_code == 201, r.text
    r = await client.post(
        f"/api/orgs/{org}/sessions", headers=bearer(user), json={"agentId": "helper"}
    )
    assert r.status_code == 201, r.text
    return Chat(f"/api/orgs/{org}/sessions/{r.json()['id']}/messages", bearer(user))


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# --- what a refusal looks like ----------------------------------------------------------------


@dataclass
class Refusal:
    status: int
    error: dict[str, Any]
    header: str | None
    text: str  # everything the client received


async def refused_message(
    client: httpx2.AsyncClient, chat: Chat, message: str, headers: dict[str, str] | None = None
) -> Refusal:
    """Send a message that fails: the JSON error body when it is refused before the stream
    starts, else the stream's ``error`` event (its ``status`` is the HTTP status it maps to)."""
    sent = {**chat.user, **(headers or {})}
    async with client.stream("POST", chat.messages, headers=sent, json={"message": message}) as r:
        header = r.headers.get("x-correlation-id")
        if r.status_code != 200:
            raw = (await r.aread()).decode()
            return Refusal(r.status_code, json.loads(raw)["error"], header, raw)
        events = [(e.event, e.data) async for e in httpx2.EventSource(r)]
    text = "\n".join(f"{name}: {data}" for name, data in events)
    assert events and events[-1][0] == "error", text
    error = json.loads(events[-1][1])
    return Refusal(int(error["status"]), error, header, text)


def assert_clean(refusal: Refusal, status: int, code: str) -> str:
    """The refusal is the one error body, says nothing internal; returns its correlation id."""
    error = refusal.error
    assert (refusal.status, error["code"]) == (status, code), refusal.text
    assert isinstance(error["message"], str) and error["message"], refusal.text
    cid = error["correlationId"]
    assert isinstance(cid, str) and cid and refusal.header == cid, refusal.text
    found = {what: m[0] for what, p in LEAKS.items() if (m := p.search(refusal.text))}
    assert not found, (found, refusal.text)
    return str(cid)


def logged(stack: Stack, cid: str) -> str:
    """The replica's log records that name ``cid`` (each with its traceback, if any)."""
    text = stack.log.read_text() if stack.log.exists() else ""
    return "\n".join(r for r in text.split("@@ ") if cid in r)


async def eventually_logged(stack: Stack, cid: str, *needles: str) -> str:
    # The log line is written by the replica as it answers: read it once it has landed.
    for _ in range(200):
        records = logged(stack, cid)
        if records and all(n in records for n in needles):
            return records
        await asyncio.sleep(0.05)
    return logged(stack, cid)


# --- through HTTP, from inside the actors -----------------------------------------------------


async def test_a_busy_session_is_409_conflict_without_internals(
    client: httpx2.AsyncClient, chat: Chat, stack: Stack
) -> None:
    stack.release.unlink(missing_ok=True)
    running = asyncio.Event()
    first: list[str] = []

    async def hold() -> None:
        sent = {"message": "hold on, what time is it?"}
        async with client.stream("POST", chat.messages, headers=chat.user, json=sent) as r:
            assert r.status_code == 200, await r.aread()
            async for event in httpx2.EventSource(r):
                first.append(event.event)
                if event.event == "observation":
                    running.set()  # the turn runs in the actor: the session holds 1 of 1

    holding = asyncio.create_task(hold())
    try:
        await asyncio.wait_for(running.wait(), 120)
        refusal = await refused_message(client, chat, "are you there?")
        cid = assert_clean(refusal, 409, "conflict")
        assert "try again" in refusal.error["message"] or "limit" in refusal.error["message"]
    finally:
        stack.release.touch()
        await asyncio.wait_for(holding, 120)
    assert first[-1] == "done", first
    records = await eventually_logged(stack, cid, "409")
    assert "409 conflict" in records and "limit 1" in records, records


async def test_a_session_actor_that_cannot_start_is_503_unavailable(
    client: httpx2.AsyncClient, chat: Chat, stack: Stack
) -> None:
    stack.flag.touch()
    try:
        refusal = await refused_message(client, chat, "hello?")
    finally:
        stack.flag.unlink()
    cid = assert_clean(refusal, 503, "unavailable")
    assert "try again" in refusal.error["message"], refusal.error
    # The log has what happened, under the id the client got.
    records = await eventually_logged(stack, cid, "refusing to start")
    assert "503 unavailable" in records and "refusing to start" in records, records


async def test_a_timeout_inside_the_actor_is_504_timeout(
    client: httpx2.AsyncClient, chat: Chat, stack: Stack
) -> None:
    refusal = await refused_message(client, chat, "please time out")
    cid = assert_clean(refusal, 504, "timeout")
    assert refusal.error["message"] == "the request did not finish in time; try again later"
    records = await eventually_logged(stack, cid, "the model did not answer within 30 s")
    assert "504 timeout" in records and "Traceback" in records, records


async def test_an_unexpected_exception_inside_the_actor_is_500_internal_error(
    client: httpx2.AsyncClient, chat: Chat, stack: Stack
) -> None:
    mine = f"client-{uuid.uuid4()}"
    refusal = await refused_message(client, chat, "crash now", {"X-Request-Id": mine})
    cid = assert_clean(refusal, 500, "internal_error")
    assert refusal.error["message"] == "internal error"
    assert cid == mine  # a well-formed id the client sent is the one used
    records = await eventually_logged(stack, cid, "boom")
    assert "500 internal_error" in records and "RuntimeError" in records, records
    assert "Traceback" in records and "boom" in records, records


async def test_plain_refusals_carry_a_correlation_id_and_ill_formed_ids_are_replaced(
    client: httpx2.AsyncClient, chat: Chat
) -> None:
    r = await client.get(chat.messages.replace("/messages", "x"), headers=chat.user)
    assert r.status_code in (404, 422), r.text
    assert r.json()["error"]["correlationId"] == r.headers["x-correlation-id"]
    odd = "bad id\twith spaces"
    r = await client.get(
        "/api/me", headers={"X-Correlation-Id": "ok-but-unused", "X-Request-Id": odd}
    )
    assert r.status_code == 401 and r.json()["error"]["correlationId"] == "ok-but-unused"
    r = await client.get("/api/me", headers={"X-Correlation-Id": "x" * 129})
    cid = r.json()["error"]["correlationId"]
    assert cid != "x" * 129 and uuid.UUID(cid) and r.headers["x-correlation-id"] == cid
    ok = await client.get("/healthz")
    assert ok.status_code == 200 and uuid.UUID(ok.headers["x-correlation-id"])


# --- the mapping itself, on Ray's real exception types ----------------------------------------


def _task_error(cause: BaseException) -> BaseException:
    """What Ray raises in the caller for an exception raised in an actor."""
    try:
        raise cause
    except BaseException as exc:  # Ray wraps it with the traceback of where it was raised
        wrapped = RayTaskError(
            "AgentSession.turn",
            traceback.format_exc(),
            exc,
            proctitle="ray::AgentSession.turn",
            pid=4242,
            ip="10.1.2.3",
            actor_repr="<actors._session.AgentSession object at 0xdeadbeef>",
            actor_id="ab" * 16,
        )
    return wrapped.as_instanceof_cause()


@pytest.mark.parametrize(
    ("cause", "status", "code"),
    [
        (SessionBusyError("session s: 1 turn(s) running or queued (limit 1)"), 409, "conflict"),
        (ConflictError("session s has ended"), 409, "conflict"),
        (NotFoundError("task run r not found"), 404, "not_found"),
        (SessionUnavailableError("session s: its actor died"), 503, "unavailable"),
        (StorageError("cannot reach the database: host 10.0.0.9 port 5432"), 503, "unavailable"),
        (TimeoutError("slow"), 504, "timeout"),
        (GetTimeoutError("get timed out"), 504, "timeout"),
        (ActorDiedError(), 503, "unavailable"),
        (ActorUnavailableError("gone", None), 503, "unavailable"),
        (BackPressureError(5, 5), 503, "unavailable"),
        (psycopg.OperationalError("connection to 10.0.0.9 refused"), 503, "unavailable"),
        (RuntimeError(f"boom {FAKE_INTERNALS}"), 500, "internal_error"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_ray_wrapped_errors_map_to_their_cause_and_leak_nothing(
    cause: BaseException, status: int, code: str
) -> None:
    wrapped = _task_error(cause)
    assert "10.1.2.3" in str(wrapped) and "4242" in str(wrapped)  # what Ray would have shown
    assert root_cause(wrapped) is cause
    for exc in (cause, wrapped):
        got_status, got_code, message = status_of(exc)
        assert (got_status, got_code) == (status, code), (exc, message)
        text = json.dumps({"message": message})
        assert not [w for w, p in LEAKS.items() if p.search(text)], message
