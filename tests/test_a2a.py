"""Agents over A2A, through real HTTP with the a2a-sdk's own client: the API app served by
uvicorn in this event loop (so a stream is a stream), the in-process executor, the
embedded PostgreSQL and a scripted model. What the A2A calls did is checked in the store,
through the runtime's own use cases.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
import socket
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn
from a2a.client import (
    A2ACardResolver,
    AgentCardResolutionError,
    Client,
    ClientConfig,
    ClientFactory,
)
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import (
    ContentTypeNotSupportedError,
    InternalError,
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
)

from cortex_ray import (
    AgentMode,
    Executor,
    InProcessExecutor,
    Principal,
    RunStatus,
    Runtime,
    Settings,
    TurnResult,
    UnavailableError,
)
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import ChatRequest, ChatResponse, HashEmbedder, ScriptedModelClient, ToolCall
from cortex_ray.storage import Database, TurnStatus
from serve import create_app

# --- the scripted model ---------------------------------------------------------------------


async def respond(request: ChatRequest) -> str | ChatResponse:
    """Autonomous: read the clock at step 1, then finish ("It is time."); a goal saying
    "never finish" searches its memory, slowly, step after step. Interactive: a message
    asking for the time calls ``current_time`` first (and "slowly" waits two seconds after it
    before replying)."""
    props = (request.response_schema or {}).get("properties", {})
    text = "\n".join(m.content or "" for m in request.messages)
    if "candidates" in props:
        if "never finish" in text:
            await asyncio.sleep(0.2)
            step = next((n for n in range(1, 65) if f"Step {n} of" in text), 0)
            search = {"tool": "memory_search", "args": {"query": f"q{step}"}, "rationale": "r"}
            return json.dumps({"candidates": [search]})
        if "Step 1 of" in text:
            clock = {"tool": "current_time", "args": {}, "rationale": "read the clock"}
            return json.dumps({"candidates": [clock]})
        return json.dumps(
            {"candidates": [{"finish": True, "message": "It is time.", "rationale": "done"}]}
        )
    if "scores" in props:
        return json.dumps({"scores": [9] * int(props["scores"].get("maxItems", 1))})
    if "best" in props:
        listed = props["best"]["enum"]
        return json.dumps({"assessments": ["ok"] * len(listed), "best": listed[0]})
    if "importance" in props:
        return json.dumps({"importance": 5})
    if "facts" in props:
        return json.dumps({"facts": []})
    users = [m.content or "" for m in request.messages if m.role == "user"]
    asked = next((u for u in reversed(users) if not u.startswith("Progress so far")), "")
    if request.tools and "time" in asked and "Progress so far" not in text:
        return ChatResponse(
            tool_calls=(ToolCall(id="call-1", name="current_time", arguments="{}"),)
        )
    if "slowly" in asked:
        await asyncio.sleep(2.0)
    return f"You said: {asked[:60]}"


ADA = "ada"


# --- the API over real HTTP --------------------------------------------------------------------


@dataclass
class Api:
    runtime: Runtime
    url: str
    org: str
    key: str
    other_org_key: str

    def agent_url(self, agent: str) -> str:
        return f"{self.url}/a2a/{self.org}/{agent}"

    def http(self, key: str | None = None) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {key or self.key}"}
        return httpx.AsyncClient(headers=headers, timeout=30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def a2a_settings(settings: Settings, **update: Any) -> Settings:
    """The test settings, K=1, the hash embedder; published: "helper" and "worker" (not
    "hidden")."""
    published = settings.api.model_copy(update={"a2a_agents": "helper, worker"})
    return settings.model_copy(
        update={"embedding_backend": "hash", "candidates": 1, "api": published, **update}
    )


async def open_runtime(settings: Settings, db: Database | None = None) -> Runtime:
    """The runtime of the app (with the test's database) and of each session actor."""
    return await Runtime.open(
        settings,
        model=ScriptedModelClient(responder=respond),
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
        db=db,
    )


async def populate(runtime: Runtime, org: str) -> tuple[str, str]:
    """The org's agents ("hidden" unpublished), ada's key and a key of another org."""
    await runtime.create_agent(
        org, "helper", persona="A helpful clerk who tells the time.",
        skills=["telling the time"], tools=["current_time"],
    )  # fmt: skip
    await runtime.create_agent(org, "worker", mode=AgentMode.AUTONOMOUS)
    await runtime.create_agent(org, "hidden")
    key = await runtime.create_api_key(org, ADA, admin=False, grant=["*"])
    other = await runtime.create_api_key(f"{org}-x", "eve", admin=True, grant=["*"])
    return key.key, other.key


@contextlib.asynccontextmanager
async def serving(runtime: Runtime, executor: Executor, org: str) -> AsyncIterator[Api]:
    """The app over real HTTP (uvicorn in this loop), with the org's agents and keys."""
    key, other = await populate(runtime, org)
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(runtime, executor), host="127.0.0.1", port=port,
            lifespan="off", log_level="warning",
        )
    )  # fmt: skip
    running = asyncio.create_task(server.serve())
    while not server.started:
        assert not running.done(), "uvicorn did not start"
        await asyncio.sleep(0.02)
    try:
        yield Api(runtime, f"http://127.0.0.1:{port}", org, key, other)
    finally:
        server.should_exit = True
        await running


@pytest.fixture
async def api(db: Database, settings: Settings, org: str) -> AsyncIterator[Api]:
    runtime = await open_runtime(a2a_settings(settings), db)
    executor = InProcessExecutor(runtime)
    try:
        async with serving(runtime, executor, org) as served:
            yield served
    finally:
        await executor.aclose()
        await runtime.close(close_db=False)


async def card_of(api: Api, agent: str, http: httpx.AsyncClient) -> AgentCard:
    return await A2ACardResolver(http, api.agent_url(agent)).get_agent_card()


async def client_for(api: Api, agent: str, http: httpx.AsyncClient, *, streaming: bool) -> Client:
    card = await card_of(api, agent, http)
    return ClientFactory(ClientConfig(httpx_client=http, streaming=streaming)).create(card)


def user_message(text: str, *, context_id: str = "") -> SendMessageRequest:
    message = Message(
        message_id=str(uuid.uuid4()), role=Role.ROLE_USER, context_id=context_id,
        parts=[Part(text=text)],
    )  # fmt: skip
    return SendMessageRequest(message=message)


async def only_task(client: Client, request: SendMessageRequest) -> Task:
    [response] = [r async for r in client.send_message(request)]
    assert response.HasField("task")
    return response.task


def text(task: Task) -> str:
    return "".join(p.text for a in task.artifacts for p in a.parts)


def ada(api: Api) -> Principal:
    return Principal(id=ADA, org_id=api.org)


# --- the card ----------------------------------------------------------------------------------


async def test_the_card_describes_the_agent_its_skills_url_and_bearer_auth(api: Api) -> None:
    agent = await api.runtime.get_agent(api.org, "helper")
    async with api.http() as http:
        card = await card_of(api, "helper", http)
        assert card.name == "helper"
        assert card.description == "A helpful clerk who tells the time."
        skills = {s.id: s for s in card.skills}
        assert skills["skill-1"].description == "telling the time"
        assert "current_time" in skills and "tool" in skills["current_time"].tags
        urls = {(i.protocol_binding, i.protocol_version): i.url for i in card.supported_interfaces}
        rpc = f"{api.url}/a2a/{api.org}/{agent.id}"
        assert urls == {("JSONRPC", "1.0"): rpc, ("JSONRPC", "0.3"): rpc}
        assert card.capabilities.streaming and not card.capabilities.push_notifications
        scheme = card.security_schemes["bearer"].http_auth_security_scheme
        assert scheme.scheme == "bearer"
        assert "bearer" in card.security_requirements[0].schemes
        # The same card by the agent's id; an unpublished or unknown agent: 404, the API's body.
        assert (await card_of(api, str(agent.id), http)).name == "helper"
        for missing in ("hidden", "nobody"):
            r = await http.get(f"{api.agent_url(missing)}/.well-known/agent-card.json")
            assert r.status_code == 404, r.text
            assert r.json()["error"]["code"] == "not_found"


# --- an interactive agent: a message is a turn of a session -----------------------------------


async def test_a_message_to_an_interactive_agent_is_a_turn_of_its_session(api: Api) -> None:
    async with api.http() as http:
        client = await client_for(api, "helper", http, streaming=False)
        task = await only_task(client, user_message("hello there"))
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        assert text(task) == "You said: hello there"
        assert task.status.message.parts[0].text == "You said: hello there"
        session_id = uuid.UUID(task.context_id)
        # The same context: the same session, the next turn.
        again = await only_task(client, user_message("and again", context_id=task.context_id))
        assert again.context_id == task.context_id and again.id != task.id
        assert text(again) == "You said: and again"
        # What the store holds: the session is ada's, with both turns and their replies.
        session = await api.runtime.get_session(api.org, session_id, principal=ada(api))
        assert session.caller_id == ADA
        assert session.agent_id == (await api.runtime.get_agent(api.org, "helper")).id
        turns = await api.runtime.conversation(api.org, session_id, principal=ada(api))
        said = [(t.role, t.content) for t in turns]
        assert said == [
            ("user", "hello there"),
            ("assistant", "You said: hello there"),
            ("user", "and again"),
            ("assistant", "You said: and again"),
        ]
        # tasks/get reads the turn back.
        got = await client.get_task(GetTaskRequest(id=task.id))
        assert got.status.state == TaskState.TASK_STATE_COMPLETED and text(got) == text(task)
        assert [m.parts[0].text for m in got.history] == ["hello there", "You said: hello there"]
        # A turn runs to its end: it cannot be canceled.
        with pytest.raises(TaskNotCancelableError, match="cannot be canceled"):
            await client.cancel_task(CancelTaskRequest(id=task.id))
        # Another agent's (or no) session as the context is refused.
        with pytest.raises(InvalidParamsError, match="no session"):
            await only_task(client, user_message("hi", context_id=str(uuid.uuid4())))


# --- an autonomous agent: a message is a task run ----------------------------------------------


async def test_a_task_on_an_autonomous_agent_runs_to_completion(api: Api) -> None:
    async with api.http() as http:
        client = await client_for(api, "worker", http, streaming=False)
        task = await only_task(client, user_message("What time is it?", context_id="ctx-1"))
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        assert text(task) == "It is time."
        assert task.context_id == "ctx-1"
        run = await api.runtime.get_run(api.org, uuid.UUID(task.id), principal=ada(api))
        assert run.status is RunStatus.COMPLETED and run.result == "It is time."
        assert run.goal == "What time is it?"
        assert run.caller_id == ADA and run.requested_by == ADA
        assert [s.action.tool for s in run.steps if s.action] == ["current_time"]
        got = await client.get_task(GetTaskRequest(id=task.id))
        assert got.status.state == TaskState.TASK_STATE_COMPLETED and got.context_id == "ctx-1"
        with pytest.raises(TaskNotCancelableError, match="has ended"):
            await client.cancel_task(CancelTaskRequest(id=task.id))
        with pytest.raises(TaskNotFoundError):
            await client.get_task(GetTaskRequest(id=str(uuid.uuid4())))


# --- streaming ----------------------------------------------------------------------------------


def states(events: list[StreamResponse]) -> list[str]:
    out = []
    for e in events:
        kind = e.WhichOneof("payload")
        if kind == "task":
            out.append(f"task:{TaskState.Name(e.task.status.state)}")
        elif kind == "status_update":
            out.append(TaskState.Name(e.status_update.status.state))
        else:
            out.append(kind or "?")
    return out


async def test_streaming_a_turn_relays_its_events_as_they_happen(api: Api) -> None:
    async with api.http() as http:
        client = await client_for(api, "helper", http, streaming=True)
        events: list[StreamResponse] = []
        running_when_told: list[TurnStatus] = []
        async for event in client.send_message(user_message("what time is it, slowly")):
            events.append(event)
            if event.HasField("status_update") and "current_time →" in (
                event.status_update.status.message.parts[0].text
                if event.status_update.status.message.parts
                else ""
            ):
                session_id, turn_id = event.status_update.task_id.split(":")
                turn = await api.runtime.get_turn(
                    api.org, uuid.UUID(session_id), uuid.UUID(turn_id), principal=ada(api)
                )
                running_when_told.append(turn.status)
        assert states(events) == [
            "task:TASK_STATE_SUBMITTED",
            "TASK_STATE_WORKING",
            "TASK_STATE_WORKING",  # calling current_time
            "TASK_STATE_WORKING",  # its observation
            "artifact_update",
            "TASK_STATE_COMPLETED",
        ]
        said = [
            e.status_update.status.message.parts[0].text
            for e in events
            if e.HasField("status_update") and e.status_update.status.message.parts
        ]
        assert said[0] == "calling current_time" and said[1].startswith("current_time → OK")
        assert said[-1] == "You said: what time is it, slowly"
        # The observation came while the turn was still running: streamed, not replayed.
        assert running_when_told == [TurnStatus.RUNNING]


async def test_streaming_a_run_reports_each_step_then_the_result(api: Api) -> None:
    async with api.http() as http:
        client = await client_for(api, "worker", http, streaming=True)
        events = [e async for e in client.send_message(user_message("What time is it?"))]
        assert states(events)[0] == "task:TASK_STATE_SUBMITTED"
        assert states(events)[-2:] == ["artifact_update", "TASK_STATE_COMPLETED"]
        steps = [
            e.status_update.status.message.parts[0].text
            for e in events[1:-2]
            if e.HasField("status_update")
        ]
        assert steps[0].startswith("step 0: current_time → OK") and steps[-1] == "step 1: finish"
        assert events[-2].artifact_update.artifact.parts[0].text == "It is time."
        run_id = uuid.UUID(events[0].task.id)
        run = await api.runtime.get_run(api.org, run_id, principal=ada(api))
        assert run.status is RunStatus.COMPLETED and len(run.steps) == len(steps)


# --- cancel -------------------------------------------------------------------------------------


async def test_canceling_a_task_cancels_its_run_and_ends_its_subscription(api: Api) -> None:
    async with api.http() as http:
        client = await client_for(api, "worker", http, streaming=True)
        sender = await client_for(api, "worker", http, streaming=False)
        request = user_message("never finish, please")
        request.configuration.CopyFrom(SendMessageConfiguration(return_immediately=True))
        task = await only_task(sender, request)
        assert task.status.state == TaskState.TASK_STATE_SUBMITTED
        # Subscribe, and cancel once the first step is reported.
        events: list[StreamResponse] = []
        stepped = asyncio.Event()

        async def follow() -> None:
            async for event in client.subscribe(SubscribeToTaskRequest(id=task.id)):
                events.append(event)
                if event.HasField("status_update"):
                    stepped.set()

        following = asyncio.create_task(follow())
        await asyncio.wait_for(stepped.wait(), 30)
        canceled = await client.cancel_task(CancelTaskRequest(id=task.id))
        assert canceled.status.state == TaskState.TASK_STATE_CANCELED
        await asyncio.wait_for(following, 30)  # the stream ends with the run
        # The subscription starts from the run as it stands (a step may be recorded already).
        assert states(events)[0] in ("task:TASK_STATE_SUBMITTED", "task:TASK_STATE_WORKING")
        assert states(events)[-1] == "TASK_STATE_CANCELED"
        told = events[1].status_update.status.message.parts[0].text
        assert re.fullmatch(r"step \d+: memory_search → OK: .*", told, flags=re.S), told
        run = await api.runtime.get_run(api.org, uuid.UUID(task.id), principal=ada(api))
        assert run.status is RunStatus.CANCELLED
        assert run.reason == "cancelled by ada: canceled over A2A"
        got = await client.get_task(GetTaskRequest(id=task.id))
        assert got.status.state == TaskState.TASK_STATE_CANCELED
        assert got.status.message.parts[0].text == run.reason
        listed = await client.list_tasks(ListTasksRequest())
        assert [t.id for t in listed.tasks] == [task.id]


# --- auth and errors ----------------------------------------------------------------------------


async def test_bad_auth_is_401_in_the_apis_error_shape(api: Api) -> None:
    rpc = api.agent_url("helper")
    message = {"role": "user", "messageId": "m", "parts": [{"kind": "text", "text": "hi"}]}
    body = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": message}}
    async with httpx.AsyncClient(timeout=30) as anonymous:
        for headers in ({}, {"Authorization": "Bearer crx_nonsense"}):
            for method, url in (("POST", rpc), ("GET", f"{rpc}/.well-known/agent-card.json")):
                r = await anonymous.request(method, url, headers=headers, json=body)
                assert r.status_code == 401, r.text
                error = r.json()["error"]
                assert error["code"] == "unauthenticated" and error["correlationId"]
                assert r.headers["WWW-Authenticate"].startswith("Bearer")
    # The SDK's client is told so too.
    async with api.http("crx_nonsense") as http:
        with pytest.raises(AgentCardResolutionError, match="401"):
            await card_of(api, "helper", http)
    # Another organisation's key: nothing exists there.
    async with api.http(api.other_org_key) as http:
        r = await http.post(rpc, json=body)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


async def test_an_unpublished_agent_is_an_a2a_error_and_0_3_clients_are_served(api: Api) -> None:
    message = {"role": "user", "messageId": "m", "parts": [{"kind": "text", "text": "hi"}]}
    body = {"jsonrpc": "2.0", "id": 7, "method": "message/send", "params": {"message": message}}
    async with api.http() as http:
        for agent in ("hidden", "nobody"):
            r = await http.post(api.agent_url(agent), json=body)
            assert r.status_code == 200
            error = r.json()["error"]
            assert error["code"] == -32600 and "no published agent" in error["message"]
        # A2A 0.3's method names and shapes (no A2A-Version header) reach the same turn.
        r = await http.post(api.agent_url("helper"), json=body)
        result = r.json()["result"]
        assert result["kind"] == "task" and result["status"]["state"] == "completed"
        assert result["artifacts"][0]["parts"][0]["text"] == "You said: hi"
        session_id = uuid.UUID(result["contextId"])
        turns = await api.runtime.conversation(api.org, session_id, principal=ada(api))
        assert [t.content for t in turns] == ["hi", "You said: hi"]


async def test_a_file_part_is_refused_and_nothing_is_recorded(api: Api) -> None:
    async with api.http() as http:
        client = await client_for(api, "worker", http, streaming=False)
        request = user_message("x")
        request.message.parts.append(Part(url="https://example.com/a.pdf"))
        with pytest.raises(ContentTypeNotSupportedError, match="text and data parts only"):
            await only_task(client, request)
        assert await api.runtime.list_runs(api.org, principal=ada(api)) == []


# --- through the session actors on Ray ---------------------------------------------------------


async def test_turns_and_runs_through_session_actors(
    ray_cluster: Any, db: Database, settings: Settings, org: str
) -> None:
    """The same A2A calls with ``actors.SessionManager`` as the executor: the turn streams
    back from its session actor, the run is driven in its actor and followed in the store."""
    actors = pytest.importorskip("actors")
    # tests/ is not importable in the actors: ship this module's functions by value.
    pytest.importorskip("ray.cloudpickle").register_pickle_by_value(sys.modules[__name__])
    runtime = await open_runtime(a2a_settings(settings), db)
    policy = actors.SessionPolicy(namespace=f"test-a2a-{uuid.uuid4().hex[:8]}")
    manager = actors.SessionManager.for_runtime(runtime, factory=open_runtime, policy=policy)
    try:
        async with serving(runtime, manager, org) as api, api.http() as http:
            client = await client_for(api, "helper", http, streaming=True)
            events = [e async for e in client.send_message(user_message("what time is it?"))]
            assert states(events)[-2:] == ["artifact_update", "TASK_STATE_COMPLETED"]
            assert "TASK_STATE_WORKING" in states(events)  # the tool round, relayed
            assert events[-1].status_update.status.message.parts[0].text == (
                "You said: what time is it?"
            )
            session_id = uuid.UUID(events[0].task.context_id)
            turns = await runtime.conversation(org, session_id, principal=ada(api))
            assert [t.content for t in turns][-1] == "You said: what time is it?"
            worker = await client_for(api, "worker", http, streaming=False)
            task = await only_task(worker, user_message("What time is it?"))
            assert task.status.state == TaskState.TASK_STATE_COMPLETED
            run = await runtime.get_run(org, uuid.UUID(task.id), principal=ada(api))
            assert run.status is RunStatus.COMPLETED and run.result == "It is time."
    finally:
        await runtime.close(close_db=False)


# --- through Ray Serve's HTTP proxy -------------------------------------------------------------


async def test_through_ray_serve(
    ray_cluster: Any, db: Database, settings: Settings, org: str
) -> None:
    """The API as a Serve application (its replica another process, behind Serve's HTTP
    proxy): the card names the proxy's URL, a turn streams through the proxy, a run
    completes."""
    from ray import serve as ray_serve

    from serve import build_api

    pytest.importorskip("ray.cloudpickle").register_pickle_by_value(sys.modules[__name__])
    runtime = await open_runtime(a2a_settings(settings), db)
    port = _free_port()
    ray_serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        replica = a2a_settings(settings, database_url=db.dsn)
        factory = functools.partial(open_runtime, replica)
        ray_serve.run(build_api(factory), name="cortex-a2a-test", route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        api = Api(runtime, url, org, *await populate(runtime, org))
        async with api.http() as http:
            helper = await runtime.get_agent(org, "helper")
            card = await card_of(api, "helper", http)
            assert card.supported_interfaces[0].url == f"{url}/a2a/{org}/{helper.id}"
            client = await client_for(api, "helper", http, streaming=True)
            events = [e async for e in client.send_message(user_message("what time is it?"))]
            assert states(events)[-2:] == ["artifact_update", "TASK_STATE_COMPLETED"]
            assert "TASK_STATE_WORKING" in states(events)
            worker = await client_for(api, "worker", http, streaming=False)
            task = await only_task(worker, user_message("What time is it?"))
            assert task.status.state == TaskState.TASK_STATE_COMPLETED
            run = await runtime.get_run(org, uuid.UUID(task.id), principal=ada(api))
            assert run.result == "It is time." and run.requested_by == ADA
            r = await http.post(f"{url}/a2a/{org}/worker", headers={"Authorization": "x"})
            assert r.status_code == 401 and r.json()["error"]["correlationId"]
    finally:
        ray_serve.shutdown()  # type: ignore[no-untyped-call]
        await runtime.close(close_db=False)


class _Unreachable(InProcessExecutor):
    """An executor whose turns and runs never reach a driver (actors that cannot be
    reached)."""

    async def turn(self, *args: Any, **kwargs: Any) -> TurnResult:
        raise UnavailableError("the session actor cannot be reached")

    async def start_run(self, org_id: str, run_id: uuid.UUID) -> None:
        raise UnavailableError("the session directory cannot be reached")


async def test_a_driver_that_fails_is_an_a2a_error_not_a_hang(
    db: Database, settings: Settings, org: str
) -> None:
    runtime = await open_runtime(a2a_settings(settings), db)
    executor = _Unreachable(runtime)
    try:
        async with serving(runtime, executor, org) as api, api.http() as http:
            for streaming in (False, True):
                client = await client_for(api, "helper", http, streaming=streaming)
                seen: list[StreamResponse] = []
                with pytest.raises(InternalError, match="session actor cannot be reached"):
                    async for event in client.send_message(user_message("hello")):
                        seen.append(event)
                if streaming:  # the task came first: it is followed with tasks/get
                    task_id = seen[0].task.id
                    got = await client.get_task(GetTaskRequest(id=task_id))
                    assert got.status.state == TaskState.TASK_STATE_SUBMITTED
                    assert got.history[0].parts[0].text == "hello"
            worker = await client_for(api, "worker", http, streaming=False)
            with pytest.raises(InternalError, match="session directory cannot be reached"):
                await only_task(worker, user_message("What time is it?"))
            # Recorded before the executor was asked: RUNNING, for the supervisor to resume.
            [run] = await runtime.list_runs(org, principal=ada(api))
            assert run.status is RunStatus.RUNNING and run.goal == "What time is it?"
            await runtime.cancel_run(org, run.id, principal=ada(api))
    finally:
        await executor.aclose()
        await runtime.close(close_db=False)
