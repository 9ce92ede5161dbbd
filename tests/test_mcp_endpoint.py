"""cortex-ray as an MCP server: the API's ``/mcp/{org}`` endpoint through real HTTP (uvicorn),
the embedded PostgreSQL, the in-process executor and a scripted model, with two clients:
the official SDK's (``mcp.Client`` over streamable HTTP, both protocol eras) and the OpenAI
Agents SDK's (``agents.mcp.MCPServerStreamableHttp``).

What each tool answered is checked against what the store holds (the run, the turn, the
ingested source), and the audit log against the key's principal.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import socket
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from cortex_ray import AgentMode, Grant, Principal, Runtime, Settings
from cortex_ray.knowledge import KnowledgeWriter
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import ChatRequest, HashEmbedder, ScriptedModelClient
from cortex_ray.storage import Database

uvicorn = pytest.importorskip("uvicorn")
httpx2 = pytest.importorskip("httpx2")
mcp_client = pytest.importorskip("mcp.client")
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from serve import build_api, create_app  # noqa: E402
from serve.mcp import TOOL_NAMES  # noqa: E402

# tests/ is not importable in a Serve replica: ship this module's functions by value.
pytest.importorskip("ray.cloudpickle").register_pickle_by_value(sys.modules[__name__])

DOC = b"# Zebras\n\nThe zebra timetable runs on Tuesdays.\n\nNothing else here.\n"


def respond(request: ChatRequest) -> str:
    """Autonomous: read the clock at step 1, then finish. Interactive: echo."""
    props = (request.response_schema or {}).get("properties", {})
    text = "\n".join(m.content or "" for m in request.messages)
    if "candidates" in props:
        if "Step 1 of" in text:
            clock = {"tool": "current_time", "args": {}, "rationale": "read the clock"}
            return json.dumps({"candidates": [clock]})
        return json.dumps(
            {"candidates": [{"finish": True, "message": "It is time.", "rationale": "done"}]}
        )
    if "scores" in props:
        return json.dumps({"scores": [9] * int(props["scores"].get("maxItems", 1))})
    if "importance" in props:
        return json.dumps({"importance": 5})
    if "facts" in props:
        return json.dumps({"facts": []})
    users = [m.content or "" for m in request.messages if m.role == "user"]
    return f"You said: {users[-1][:60] if users else ''}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """``app`` on uvicorn on a free local port (its lifespan runs); its base URL."""
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


@dataclass
class Api:
    base: str
    org: str
    runtime: Runtime
    keys: dict[str, str]
    source_id: str

    def url(self, org: str | None = None) -> str:
        return f"{self.base}/mcp/{org or self.org}"

    @contextlib.asynccontextmanager
    async def client(self, who: str, **options: Any) -> AsyncIterator[Any]:
        """The SDK's client for ``who``'s key (``mode``: "auto" probes the 2026-07-28
        revision; "legacy" is the ``initialize`` handshake)."""
        headers = {"Authorization": f"Bearer {self.keys[who]}"}
        async with httpx2.AsyncClient(headers=headers) as http:
            transport = streamable_http_client(self.url(), http_client=http)
            async with mcp_client.Client(transport, **options) as client:
                yield client


def _member(org: str, name: str, *tools: str) -> Principal:
    return Principal(id=name, org_id=org, grant=Grant(tools=frozenset(tools)))


@pytest.fixture
async def api(scripted_runtime: Callable[..., Any], db: Database, org: str) -> AsyncIterator[Api]:
    """The API app on uvicorn: an AUTONOMOUS and an INTERACTIVE agent, one published
    document, and keys for an admin, a member with the search tools, a member with nothing,
    and an admin of another organisation."""
    from knowledge_fixtures import ingest

    runtime: Runtime = await scripted_runtime(ScriptedModelClient(responder=respond))
    await runtime.store.ensure_org(org)
    await runtime.create_agent(org, "worker", mode=AgentMode.AUTONOMOUS, tools=["current_time"])
    await runtime.create_agent(org, "chat", mode=AgentMode.INTERACTIVE, tools=["current_time"])

    def publish() -> str:
        with KnowledgeWriter(db.dsn) as writer:
            done = ingest(writer, org, "docs", {"zebra.md": DOC})
        return str(done.sources["zebra.md"].source_id)

    source_id = await asyncio.to_thread(publish)
    other = f"{org}-other"
    await runtime.store.ensure_org(other)
    admin = Principal(id="ada", org_id=org, is_admin=True, grant=Grant(tools=frozenset({"*"})))
    people = {
        "ada": admin,
        "mia": _member(org, "mia", "knowledge_search", "graph_search", "memory_search"),
        "eve": _member(org, "eve"),
        "oscar": Principal(id="oscar", org_id=other, is_admin=True),
    }
    keys = {who: (await runtime.store.create_api_key(p, who))[0] for who, p in people.items()}
    async with serving(create_app(runtime)) as base:
        yield Api(base, org, runtime, keys, source_id)


def _text(result: Any) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content)


@pytest.mark.unit
async def test_the_tools_refuse_to_run_without_the_endpoints_principal() -> None:
    """In process, with no authenticated request behind the call, a tool answers an error
    and calls nothing (it has no principal to act as)."""
    from serve.mcp import build_server

    async with mcp_client.Client(build_server()) as client:
        listed = await client.list_tools()
        result = await client.call_tool("knowledge_search", {"query": "zebra"})
    assert [t.name for t in listed.tools] == list(TOOL_NAMES)
    assert result.is_error and "/mcp/{org}" in _text(result)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_lists_the_tools_and_searches_knowledge_with_citations(api: Api, mode: str) -> None:
    async with api.client("mia", mode=mode) as client:
        listed = await client.list_tools()
        assert {t.name for t in listed.tools} == set(TOOL_NAMES)
        reads = {t.name for t in listed.tools if t.annotations and t.annotations.read_only_hint}
        assert reads == {"get_run", "knowledge_search", "graph_search", "memory_search"}
        schema = next(t for t in listed.tools if t.name == "run_task").input_schema
        assert set(schema["required"]) == {"agent", "goal"}

        result = await client.call_tool("knowledge_search", {"query": "zebra timetable"})
    assert not result.is_error, _text(result)
    hits = result.structured_content["hits"]
    assert hits, result.structured_content
    top = hits[0]
    assert top["sourceId"] == api.source_id
    assert top["citation"].startswith("zebra.md:3")  # the passage's line in the document
    assert "zebra timetable" in top["text"]
    # What the API's HTTP route answers for the same search, byte for byte.
    async with httpx2.AsyncClient(base_url=api.base) as http:
        route = await http.get(
            f"/api/orgs/{api.org}/knowledge/search",
            params={"query": "zebra timetable"},
            headers={"Authorization": f"Bearer {api.keys['mia']}"},
        )
    assert route.status_code == 200
    assert [h["citation"] for h in route.json()["hits"]] == [h["citation"] for h in hits]
    # The audit log names the MCP caller.
    rows = await api.runtime.store.audit_rows(api.org)
    searched = [r for r in rows if r["tool"] == "knowledge.search" and r["status"] == "OK"]
    assert {r["principal_id"] for r in searched} == {"mia"}


async def test_run_task_reports_progress_and_returns_the_stored_result(api: Api) -> None:
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total, message))

    async with api.client("ada") as client:
        result = await client.call_tool(
            "run_task",
            {"agent": "worker", "goal": "tell me the time", "max_steps": 4, "wait_s": 30},
            progress_callback=on_progress,
        )
        assert not result.is_error, _text(result)
        body = result.structured_content
        assert body["status"] == "COMPLETED" and body["done"] is True
        stored = await api.runtime.store.get_run(api.org, body["id"])
        assert stored.result == body["result"] == "It is time."
        assert [s["index"] for s in body["steps"]] == [s.step_index for s in stored.steps]
        assert progress[0] == (1, 4, "step 1: current_time")
        assert len(progress) == len(stored.steps)

        again = await client.call_tool("get_run", {"run_id": body["id"]})
        assert again.structured_content["result"] == "It is time."

    rows = await api.runtime.store.audit_rows(api.org, run_id=stored.id)
    started = [r for r in rows if r["tool"] == "tasks.submit"]
    assert [r["principal_id"] for r in started] == ["ada"]
    assert stored.requested_by == "ada"
    # The MCP request is a SERVER span like an /api request, and the run's trace starts there.
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {api.keys['ada']}"}) as h:
        traced = await h.get(f"{api.base}/api/orgs/{api.org}/tasks/{stored.id}/trace")
    assert traced.status_code == 200, traced.text
    request = traced.json()["spans"][0]
    assert (request["name"], request["kind"]) == ("POST /mcp/{org}", "SERVER"), request


async def test_send_message_opens_and_continues_a_session(api: Api) -> None:
    progress: list[str | None] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(message)

    async with api.client("ada") as client:
        first = await client.call_tool(
            "send_message", {"agent": "chat", "message": "hello"}, progress_callback=on_progress
        )
        assert not first.is_error, _text(first)
        turn = first.structured_content
        assert turn["status"] == "DONE" and turn["reply"] == "You said: hello"
        session = turn["sessionId"]
        second = await client.call_tool(
            "send_message", {"session_id": session, "message": "and again"}
        )
    assert progress == ["reply"]  # the turn's events as they happened
    assert second.structured_content["sessionId"] == session
    assert second.structured_content["ordinal"] == 1
    history = await api.runtime.conversation(api.org, second.structured_content["sessionId"])
    assert [m.content for m in history] == ["hello", "You said: hello", "and again",
                                            "You said: and again"]  # fmt: skip
    rows = await api.runtime.store.audit_rows(api.org)
    opened = [r for r in rows if r["tool"] == "sessions.open"]
    assert [r["principal_id"] for r in opened] == ["ada"]


async def test_refusals_and_bad_requests_are_tool_errors(api: Api) -> None:
    async with api.client("eve") as client:
        denied = await client.call_tool("knowledge_search", {"query": "zebra"})
        unknown = await client.call_tool("run_task", {"agent": "nobody", "goal": "x"})
        both = await client.call_tool(
            "send_message", {"agent": "chat", "session_id": api.source_id, "message": "x"}
        )
        invalid = await client.call_tool("knowledge_search", {"query": ""})
    assert denied.is_error and "forbidden (403)" in _text(denied)
    assert unknown.is_error and "not_found (404)" in _text(unknown), _text(unknown)
    assert "nobody" in _text(unknown)
    assert both.is_error and "either agent" in _text(both)
    assert invalid.is_error and "query" in _text(invalid)
    rows = await api.runtime.store.audit_rows(api.org)
    refused = [r for r in rows if r["tool"] == "knowledge.search" and r["status"] == "REFUSED"]
    assert [r["principal_id"] for r in refused] == ["eve"]


async def test_the_endpoint_authenticates_as_the_api_and_keeps_no_session(api: Api) -> None:
    ping = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    accept = {"Accept": "application/json, text/event-stream"}
    async with httpx2.AsyncClient() as http:
        missing = await http.post(api.url(), json=ping, headers=accept)
        wrong = await http.post(
            api.url(), json=ping, headers={**accept, "Authorization": "Bearer crx_nope_nope"}
        )
        foreign = await http.post(
            api.url(), json=ping, headers={**accept, "Authorization": f"Bearer {api.keys['oscar']}"}
        )
        valid = await http.post(
            api.url(), json=ping, headers={**accept, "Authorization": f"Bearer {api.keys['eve']}"}
        )
    # Stateless: answered without an initialize and without a session to come back to.
    assert valid.status_code == 200 and "run_task" in valid.text
    assert "mcp-session-id" not in valid.headers
    for response, status in ((missing, 401), (wrong, 401), (foreign, 404)):
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["code"] and error["message"] and error["correlationId"]
    assert missing.headers["WWW-Authenticate"] == "Bearer"
    assert "unknown or revoked" in wrong.json()["error"]["message"]
    assert api.org in foreign.json()["error"]["message"]


async def test_the_openai_agents_sdk_lists_and_calls_the_tools(api: Api) -> None:
    agents_mcp = pytest.importorskip("agents.mcp")
    server = agents_mcp.MCPServerStreamableHttp(
        params={"url": api.url(), "headers": {"Authorization": f"Bearer {api.keys['mia']}"}},
        name="cortex-ray",
    )
    async with server:
        tools = await server.list_tools()
        assert {t.name for t in tools} == set(TOOL_NAMES)
        result = await server.call_tool("knowledge_search", {"query": "zebra timetable"})
    assert not result.is_error
    payload = json.loads(result.content[0].text)
    assert payload["hits"][0]["sourceId"] == api.source_id
    rows = await api.runtime.store.audit_rows(api.org)
    assert any(r["tool"] == "knowledge.search" and r["principal_id"] == "mia" for r in rows)


async def test_graph_and_memory_search_read_what_the_store_holds(api: Api) -> None:
    from cortex_ray.graph import Triple

    ada = await api.runtime.authenticate(api.keys["ada"])
    assert ada is not None
    fact = Triple(
        subject_type="service",
        subject="payments-db",
        predicate="replicates_to",
        object_type="service",
        object="nightingale",
    )
    await api.runtime.submit_triples(api.org, [fact], principal=ada)
    async with api.client("ada") as client:
        ran = await client.call_tool("run_task", {"agent": "worker", "goal": "what time is it"})
        assert ran.structured_content["status"] == "COMPLETED"
        recalled = await client.call_tool(
            "memory_search", {"agent": "worker", "query": "what time is it", "k": 3}
        )
    async with api.client("mia") as client:
        graph = await client.call_tool("graph_search", {"terms": ["payments-db"]})
        refused = await client.call_tool("memory_search", {"agent": "worker", "query": "time"})
    assert not graph.is_error, _text(graph)
    (found,) = graph.structured_content["facts"]
    assert (found["subject"]["name"], found["predicate"], found["object"]["name"]) == (
        "payments-db", "replicates_to", "nightingale",
    )  # fmt: skip
    assert found["citation"] == "submitted by ada"

    assert not recalled.is_error, _text(recalled)
    results = recalled.structured_content["results"]
    _, direct = await api.runtime.search_memory(
        api.org, "worker", "what time is it", k=3, principal=ada
    )
    assert [r["memory"]["id"] for r in results] == [str(h.memory.id) for h in direct]
    assert results and any("time" in r["memory"]["content"].lower() for r in results)
    # memory_search is decided with the agent: its grant (current_time) ∩ the caller's.
    assert refused.is_error and "forbidden (403)" in _text(refused)


# --- through Ray Serve ----------------------------------------------------------------------


async def open_replica_runtime(settings: Settings) -> Runtime:
    """The Serve replica's runtime: the test database, the scripted model."""
    return await Runtime.open(
        settings,
        model=ScriptedModelClient(responder=respond),
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
    )


@pytest.fixture(scope="module")
def serve_url(ray_cluster: Any, settings: Settings, db: Database) -> Any:
    """The API as a Ray Serve application (its replica another process) behind Serve's HTTP
    proxy: the MCP endpoint is a route of the ingress, started by the replica's lifespan."""
    from ray import serve as ray_serve

    port = _free_port()
    ray_serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        replica = settings.model_copy(
            update={"database_url": db.dsn, "embedding_backend": "hash", "candidates": 1}
        )
        factory = functools.partial(open_replica_runtime, replica)
        ray_serve.run(build_api(factory), name="cortex-mcp-test", route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        ray_serve.shutdown()


async def test_through_ray_serve(
    serve_url: str, scripted_runtime: Callable[..., Any], org: str
) -> None:
    runtime: Runtime = await scripted_runtime(None)
    await runtime.store.ensure_org(org)
    await runtime.create_agent(org, "worker", mode=AgentMode.AUTONOMOUS, tools=["current_time"])
    admin = Principal(id="ada", org_id=org, is_admin=True, grant=Grant(tools=frozenset({"*"})))
    key, _ = await runtime.store.create_api_key(admin, "ada")
    progress: list[str | None] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(message)

    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}) as http:
        transport = streamable_http_client(f"{serve_url}/mcp/{org}", http_client=http)
        async with mcp_client.Client(transport, mode="legacy") as client:
            listed = await client.list_tools()
            result = await client.call_tool(
                "run_task",
                {"agent": "worker", "goal": "what time is it", "wait_s": 30},
                progress_callback=on_progress,
            )
        missing = await http.post(
            f"{serve_url}/mcp/{org}", json={}, headers={"Authorization": "Bearer nope"}
        )
    assert {t.name for t in listed.tools} == set(TOOL_NAMES)
    assert not result.is_error, _text(result)
    stored = await runtime.store.get_run(org, result.structured_content["id"])
    assert stored.result == result.structured_content["result"] == "It is time."
    assert progress[0] == "step 1: current_time"
    assert missing.status_code == 401 and missing.json()["error"]["correlationId"]
