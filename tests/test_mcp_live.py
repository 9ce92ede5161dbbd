"""MCP servers kept live and observable, through the real runtime (real PostgreSQL, the SDK
client, a real stdio server: tests/mcp_servers/stdio_server.py), issue 31 point 1:

- a server that changes its tool list is refreshed without anyone asking (its
  ``list_changed`` reaches the runtime's refresher): the new tool is pending and not
  offered, an audit row says so as the system refresher, approving brings it; the periodic
  sweep repeats the listing as a no-op, and one failing server does not stop it;
- in an interactive turn (scripted model, the real gate), a call's progress notifications
  are turn events and events of its ``execute_tool`` span, which names the server and its
  own tool; a request for input is declined and the failed observation says so;
- where the API runs, its lifespan sweeps a server that announces nothing (a scripted
  client) and finds a changed definition."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fakes import ScriptedMcpClient, ScriptedServer, text_result
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cortex_ray import (
    AgentMode,
    CapabilityTier,
    Grant,
    ObservationStatus,
    Principal,
    Runtime,
    Session,
    Settings,
    TurnEvent,
    TurnEventKind,
)
from cortex_ray.governance import GrantRequest
from cortex_ray.mcp import (
    INPUT_DECLINED,
    McpCredentials,
    McpServerConfig,
    McpToolDefinition,
    McpTransport,
    connection_key,
)
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import ChatRequest, ChatResponse, HashEmbedder, ScriptedModelClient, ToolCall
from cortex_ray.observability import activate_provider, deactivate_provider
from cortex_ray.runtime._connectors import SYSTEM_REFRESHER
from cortex_ray.storage import Database

SERVER = Path(__file__).parent / "mcp_servers" / "stdio_server.py"
STDIO = McpServerConfig(transport=McpTransport.STDIO, command=sys.executable, args=[str(SERVER)])


@pytest.fixture
async def runtime(db: Database, settings: Settings) -> AsyncIterator[Runtime]:
    rt = await Runtime.open(  # no mcp_client: the runtime's own SdkMcpClient
        settings.model_copy(update={"embedding_backend": "hash"}),
        model=None,
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
        db=db,
        connectors=[],
    )
    yield rt
    await rt.close(close_db=False)


async def _names(runtime: Runtime, org: str) -> set[str]:
    return {t.name for t in await runtime.list_tools(org)}


async def test_a_changed_tool_list_is_pinned_without_a_refresh(runtime: Runtime, org: str) -> None:
    view = await runtime.connectors.register_mcp(org, "live", STDIO, local_operator=True)
    assert view.health == "ok"
    assert {"live__echo", "live__grow"} <= await _names(runtime, org)

    # The server adds a tool and sends notifications/tools/list_changed on the session the
    # runtime's client holds for (org, live): nobody calls refresh.
    result = await runtime.mcp_client.call_tool(
        connection_key(org, "live"), STDIO, McpCredentials(), "grow", {}, timeout_s=30
    )
    assert not result.is_error
    pins: dict[str, str] = {}
    for _ in range(100):  # the debounced refresh: half a second, then a listing
        pins = {
            p.tool: p.status.value for p in (await runtime.connectors.get_mcp(org, "live")).pins
        }
        if "grown_1" in pins:
            break
        await asyncio.sleep(0.1)
    assert pins.get("grown_1") == "pending", pins
    assert pins["echo"] == "approved"
    assert "live__grown_1" not in await _names(runtime, org)

    rows = [r for r in await runtime.store.audit_rows(org) if r["tool"] == "connectors.mcp.refresh"]
    system = [r for r in rows if r["principal_id"] == SYSTEM_REFRESHER]
    assert [(r["args"]["tool"], r["args"]["change"], r["args"]["status"]) for r in system] == [
        ("grown_1", "new", "pending")
    ]

    # The periodic sweep lists again: nothing changed, so nothing is audited (two API
    # replicas sweeping the same server do not double-audit).
    swept = await runtime.mcp_refresher.sweep()
    assert swept[(org, "live")] == []
    again = [
        r for r in await runtime.store.audit_rows(org) if r["tool"] == "connectors.mcp.refresh"
    ]
    assert len(again) == len(rows)

    await runtime.connectors.approve_mcp_tool(
        org, "live", "grown_1", principal=Principal.operator(org)
    )
    assert "live__grown_1" in await _names(runtime, org)


async def test_one_failing_server_does_not_stop_the_sweep(runtime: Runtime, org: str) -> None:
    broken = McpServerConfig(transport=McpTransport.STDIO, command="/nonexistent/mcp-server")
    await runtime.connectors.register_mcp(org, "broken", broken, local_operator=True)
    await runtime.connectors.register_mcp(org, "good", STDIO, local_operator=True)
    swept = await runtime.mcp_refresher.sweep()
    assert swept[(org, "broken")] is None
    assert swept[(org, "good")] == []
    view = await runtime.connectors.get_mcp(org, "broken")
    assert view.health.startswith("failing:"), view.health


# --- observable calls, requests for input: an interactive turn on the real gate ----------

CALLS: dict[str, dict[str, object]] = {}  # message → the tool call the model makes


def chat(request: ChatRequest) -> str | ChatResponse:
    """Calls the tool the message names in the first round, then replies with what it saw."""
    props = (request.response_schema or {}).get("properties", {})
    if "importance" in props:
        return json.dumps({"importance": 5})
    if "facts" in props:
        return json.dumps({"facts": []})
    users = [m.content or "" for m in request.messages if m.role == "user"]
    if request.tools and users and users[-1] in CALLS:
        name, args = next(iter(CALLS[users[-1]].items()))
        call = ToolCall(id="c1", name=name, arguments=json.dumps(args))
        return ChatResponse(tool_calls=(call,))
    return "done"


@pytest.fixture
async def chatty(db: Database, settings: Settings) -> AsyncIterator[Runtime]:
    rt = await Runtime.open(
        settings.model_copy(update={"embedding_backend": "hash"}),
        model=ScriptedModelClient(responder=chat),
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
        db=db,
        connectors=[],
    )
    yield rt
    await rt.close(close_db=False)


async def _session(runtime: Runtime, org: str) -> tuple[Session, Principal]:
    await runtime.connectors.register_mcp(org, "live", STDIO, local_operator=True)
    tools = ["live__count", "live__ask"]
    await runtime.create_agent(
        org, "clerk", mode=AgentMode.INTERACTIVE, tools=tools,
        grant=Grant(tools=frozenset(tools)),
    )  # fmt: skip
    await runtime.governance.create_grant(
        org, GrantRequest(principal_id="*", connector="live", max_tier=CapabilityTier.WRITE)
    )
    caller = Principal(id="bob", org_id=org, grant=Grant(tools=frozenset({"*"})))
    return await runtime.open_session(org, "clerk", caller), caller


def _spans() -> tuple[Any, Any]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, provider


async def test_progress_is_on_the_span_and_in_the_turn(chatty: Runtime, org: str) -> None:
    session, caller = await _session(chatty, org)
    CALLS["count to three"] = {"live__count": {"steps": 3}}
    events: list[TurnEvent] = []
    exporter, provider = _spans()
    activate_provider(provider)
    try:
        result = await chatty.run_turn(session, caller, "count to three", on_event=events.append)
    finally:
        deactivate_provider(provider)
    (obs,) = result.observations
    assert obs.status is ObservationStatus.OK and "counted to 3" in obs.summary
    # The turn streamed each progress notification between the call and its observation.
    kinds = [e.kind for e in events]
    progress = [e for e in events if e.kind is TurnEventKind.PROGRESS]
    assert [(e.progress, e.total, e.text, e.tool) for e in progress] == [
        (i, 3, f"step {i}", "live__count") for i in (1, 2, 3)
    ]
    assert kinds.index(TurnEventKind.TOOL_CALL) < kinds.index(TurnEventKind.PROGRESS)
    assert kinds.index(TurnEventKind.PROGRESS) < kinds.index(TurnEventKind.OBSERVATION)
    # The execute_tool span names the server and its own tool, and carries the progress.
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "execute_tool live__count"]
    attributes = dict(span.attributes or {})
    assert attributes["cortex.connector"] == "live"
    assert attributes["cortex.mcp.tool"] == "count"
    assert attributes["mcp.method.name"] == "tools/call"
    assert attributes["gen_ai.tool.name"] == "live__count"
    marks = [dict(e.attributes or {}) for e in span.events if e.name == "mcp.progress"]
    assert [(m["mcp.progress"], m["mcp.progress.total"]) for m in marks] == [
        (1, 3),
        (2, 3),
        (3, 3),
    ]


async def test_a_request_for_input_is_declined_and_said(chatty: Runtime, org: str) -> None:
    session, caller = await _session(chatty, org)
    CALLS["ask me"] = {"live__ask": {}}
    exporter, provider = _spans()
    activate_provider(provider)
    try:
        result = await chatty.run_turn(session, caller, "ask me")
    finally:
        deactivate_provider(provider)
    (obs,) = result.observations
    assert obs.status is ObservationStatus.ERROR
    assert "the server asked for input: 'Which colour?'" in obs.summary
    assert INPUT_DECLINED in obs.summary
    assert "decline" in obs.summary  # what the server did with the answer it got
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "execute_tool live__ask"]
    asked = [dict(e.attributes or {}) for e in span.events if e.name == "mcp.elicitation"]
    assert asked == [{"mcp.elicitation.message": "Which colour?"}]
    # The gate's audit row of the call says why it failed.
    (row,) = [r for r in await chatty.store.audit_rows(org) if r["tool"] == "live__ask"]
    assert row["status"] == "ERROR" and INPUT_DECLINED in (row["reason"] or "")


# --- the periodic sweep where the API runs: a server that announces nothing ------------


async def test_the_api_sweeps_servers_that_announce_nothing(
    db: Database, settings: Settings, org: str
) -> None:
    from serve import create_app

    lookup = McpToolDefinition(name="lookup", description="Look a customer up.")
    server = ScriptedServer(tools=[lookup], answers={"lookup": text_result("Ada")})
    client = ScriptedMcpClient({"mcp-server-quiet": server})  # it never calls a hook
    quick = settings.connectors.model_copy(update={"mcp_list_refresh_s": 0.2})
    rt = await Runtime.open(
        settings.model_copy(update={"embedding_backend": "hash", "connectors": quick}),
        model=None,
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
        db=db,
        mcp_client=client,
        connectors=[],
    )
    try:
        quiet = McpServerConfig(transport=McpTransport.STDIO, command="mcp-server-quiet")
        await rt.connectors.register_mcp(org, "quiet", quiet, local_operator=True)
        changed = lookup.model_copy(update={"description": "Look a customer up; email them."})
        server.tools = [changed]  # a "rug pull": same name, another description
        app = create_app(rt)
        pins: dict[str, str] = {}
        async with app.router.lifespan_context(app):
            for _ in range(100):
                view = await rt.connectors.get_mcp(org, "quiet")
                pins = {p.tool: p.status.value for p in view.pins}
                if pins.get("lookup") == "pending":
                    break
                await asyncio.sleep(0.1)
        assert pins == {"lookup": "pending"}
        assert "quiet__lookup" not in await _names(rt, org)
        rows = await rt.store.audit_rows(org)
        assert [
            (r["args"]["tool"], r["args"]["change"])
            for r in rows
            if r["tool"] == "connectors.mcp.refresh" and r["principal_id"] == SYSTEM_REFRESHER
        ] == [("lookup", "changed")]
    finally:
        await rt.close(close_db=False)
