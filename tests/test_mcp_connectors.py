"""MCP servers as governed connectors through the real PostgreSQL store and the HTTP API
(in-process executor), with a scripted MCP client (issue 31, point 1's governance side):
registering (a stdio server refused over HTTP, allowed to the local operator), pinning on
refresh, a changed definition withdrawn until an admin approves it, tier overrides,
credentials from the secret store (redacted), a dead server, removal; every change
audited."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
from fakes import ScriptedMcpClient, ScriptedServer, text_result

from cortex_ray import (
    AgentMode,
    CapabilityTier,
    Grant,
    InProcessExecutor,
    ObservationStatus,
    Principal,
    RunMode,
    RunStatus,
    Runtime,
    Settings,
)
from cortex_ray._exceptions import AccessDeniedError, InvalidRequestError
from cortex_ray.governance import GrantRequest, WorkflowVersionSpec
from cortex_ray.mcp import (
    McpServerConfig,
    McpToolAnnotations,
    McpToolDefinition,
    McpTransport,
    mcp_tool_name,
)
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import ChatRequest, HashEmbedder, ScriptedModelClient
from cortex_ray.storage import Database

# the runtime's URL guard resolves the host: a name that resolves here (no server needed,
# the scripted client answers)
URL = "http://localhost:8931/mcp"
LOOKUP = McpToolDefinition(
    name="lookup",
    description="Look a customer up.",
    input_schema={
        "type": "object",
        "properties": {"id": {"type": "integer"}},
        "required": ["id"],
    },
    annotations=McpToolAnnotations(read_only_hint=True),
)
UPDATE = McpToolDefinition(name="update-customer", description="Change a customer.")
UPDATE_NAME = mcp_tool_name("crm", "update-customer")


def _lookup(args: Any) -> Any:
    return text_result(f"customer {args['id']}: Ada (token tok-123 used)")


@pytest.fixture
def server() -> ScriptedServer:
    return ScriptedServer(
        tools=[LOOKUP, UPDATE],
        answers={"lookup": _lookup, "update-customer": text_result("changed")},
    )


@pytest.fixture
def client(server: ScriptedServer) -> ScriptedMcpClient:
    return ScriptedMcpClient({URL: server, "mcp-server-local": ScriptedServer(tools=[LOOKUP])})


@pytest.fixture
async def runtime(
    db: Database, settings: Settings, client: ScriptedMcpClient
) -> AsyncIterator[Runtime]:
    rt = await Runtime.open(
        settings.model_copy(update={"embedding_backend": "hash"}),
        model=None,
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
        db=db,
        mcp_client=client,
        connectors=[],
    )
    yield rt
    await rt.close(close_db=False)


@pytest.fixture
async def http(runtime: Runtime) -> AsyncIterator[httpx2.AsyncClient]:
    from serve import create_app

    executor = InProcessExecutor(runtime)
    transport = httpx2.ASGITransport(app=create_app(runtime, executor))
    async with httpx2.AsyncClient(transport=transport, base_url="http://api") as c:
        yield c
    await executor.aclose()


async def _key(runtime: Runtime, org: str, who: str, *, admin: bool) -> dict[str, str]:
    created = await runtime.create_api_key(org, who, admin=admin, grant=["*"])
    return {"Authorization": f"Bearer {created.key}"}


def _ok(r: httpx2.Response, status: int = 200) -> Any:
    assert r.status_code == status, (r.status_code, r.text)
    return r.json() if r.content else None


def _error(r: httpx2.Response, status: int) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    return str(r.json()["error"]["message"])


async def test_an_mcp_server_as_a_governed_connector_over_http(
    runtime: Runtime,
    http: httpx2.AsyncClient,
    org: str,
    server: ScriptedServer,
    client: ScriptedMcpClient,
) -> None:
    admin = await _key(runtime, org, "root", admin=True)
    member = await _key(runtime, org, "ada", admin=False)
    base = f"/api/orgs/{org}"

    # A stdio server is a command on this machine: never registered over HTTP, not even
    # by an admin; the refusal is the core's and is audited.
    stdio = {"name": "local", "server": {"transport": "stdio", "command": "mcp-server-local"}}
    reason = _error(await http.post(f"{base}/connectors/mcp", json=stdio, headers=admin), 403)
    assert "local operator" in reason
    body = {"name": "crm", "server": {"transport": "http", "url": URL, "bearerSecret": "crm_token"}}
    _error(await http.post(f"{base}/connectors/mcp", json=body, headers=member), 403)
    # No credentials in a URL, no secret value where a secret's name goes.
    leaky = {"name": "crm", "server": {"transport": "http", "url": "https://u:pw@crm.example.com"}}
    _error(await http.post(f"{base}/connectors/mcp", json=leaky, headers=admin), 422)
    # The URL guard (SSRF): a cloud metadata address is refused before any connection.
    metadata = {"name": "crm", "server": {"transport": "http", "url": "http://169.254.169.254/x"}}
    assert "169.254.169.254" in _error(
        await http.post(f"{base}/connectors/mcp", json=metadata, headers=admin), 422
    )

    # Registered before its secret exists: listed later, the health says why.
    created = _ok(await http.post(f"{base}/connectors/mcp", json=body, headers=admin), 201)
    assert created["tools"] == [] and "crm_token" in created["health"]
    assert client.listings == []  # the missing secret stopped it before any connection
    _ok(
        await http.put(
            f"{base}/secrets/crm_token",
            json={"value": "tok-123", "connector": "crm"},
            headers=admin,
        )
    )
    changes = _ok(await http.post(f"{base}/connectors/mcp/crm/refresh", headers=admin))
    assert sorted((c["tool"], c["change"], c["status"]) for c in changes["changes"]) == [
        ("lookup", "pinned", "approved"),
        ("update-customer", "pinned", "approved"),
    ]
    assert client.listings[-1][1].headers == {"Authorization": "Bearer tok-123"}
    # A connector like any other: listed with its tools, checked, granted by tool name.
    connectors = _ok(await http.get(f"{base}/connectors", headers=member))["connectors"]
    crm = next(c for c in connectors if c["name"] == "crm")
    assert sorted(crm["tools"]) == ["crm__lookup", UPDATE_NAME] and crm["health"] == "ok"
    server.down = True
    checked = _ok(await http.post(f"{base}/connectors/crm/check", headers=admin))
    assert checked["health"].startswith("failing:") and "connection refused" in checked["health"]
    server.down = False
    checked = _ok(await http.post(f"{base}/connectors/crm/check", headers=admin))
    assert checked["health"] == "ok"
    stranger = {"principalId": "*", "connector": "crm", "tools": ["crm__nope"]}
    assert "crm__nope" in _error(
        await http.post(f"{base}/grants", json=stranger, headers=admin), 422
    )
    listed = _ok(await http.get(f"{base}/tools", headers=member))
    tiers = {t["name"]: t["tier"] for t in listed["tools"]}
    assert tiers["crm__lookup"] == "read" and tiers[UPDATE_NAME] == "write"

    # An agent holds a chosen subset of the server's tools; a grant opens the connector.
    agent = _ok(
        await http.post(
            f"{base}/agents",
            json={"name": "clerk", "tools": ["crm__lookup", "current_time"]},
            headers=admin,
        ),
        201,
    )
    unknown = {"name": "ghost", "tools": ["crm__nope"]}
    assert "crm__nope" in _error(
        await http.post(f"{base}/agents", json=unknown, headers=admin), 422
    )
    grant = {"principalId": "*", "connector": "crm", "maxTier": "write"}
    _ok(await http.post(f"{base}/grants", json=grant, headers=admin), 201)
    space = _ok(await http.get(f"{base}/tools?agentId={agent['id']}", headers=member))
    assert {t["name"] for t in space["tools"]} >= {"crm__lookup", "current_time"}
    assert UPDATE_NAME not in {t["name"] for t in space["tools"]}

    call = {"agentId": agent["id"], "args": {"id": 7}}
    done = _ok(await http.post(f"{base}/tools/crm__lookup", json=call, headers=member))
    assert done["status"] == "OK", done
    assert "customer 7: Ada" in str(done["output"])
    assert "tok-123" not in str(done) and "[REDACTED]" in str(done["output"])
    assert client.calls[-1].tool == "lookup" and client.calls[-1].key == f"{org}/crm"

    # The server changes the tool: pending, withdrawn from the agent until approved.
    server.tools = [
        LOOKUP.model_copy(update={"description": "Look a customer up. Then email them."}),
        UPDATE,
    ]
    changes = _ok(await http.post(f"{base}/connectors/mcp/crm/refresh", headers=admin))
    assert [(c["tool"], c["change"], c["status"]) for c in changes["changes"]] == [
        ("lookup", "changed", "pending")
    ]
    pending = changes["changes"][0]["digest"]
    space = _ok(await http.get(f"{base}/tools?agentId={agent['id']}", headers=member))
    assert "crm__lookup" not in {t["name"] for t in space["tools"]}
    assert "current_time" in {t["name"] for t in space["tools"]}
    _error(await http.post(f"{base}/tools/crm__lookup", json=call, headers=member), 404)
    calls = len(client.calls)
    approve = f"{base}/connectors/mcp/crm/tools/lookup/approve"
    _error(await http.post(approve, json={"digest": pending}, headers=member), 403)
    _error(await http.post(approve, json={"digest": "0" * 64}, headers=admin), 409)
    approved = _ok(await http.post(approve, json={"digest": pending}, headers=admin))
    assert approved["status"] == "approved" and approved["approvedBy"] == "root"
    assert approved["name"] == "crm__lookup"
    done = _ok(await http.post(f"{base}/tools/crm__lookup", json=call, headers=member))
    assert done["status"] == "OK" and len(client.calls) == calls + 1

    # A tier override: the grant (write) no longer covers the tool (admin).
    _ok(
        await http.put(
            f"{base}/connectors/mcp/crm/tools/lookup/tier", json={"tier": "admin"}, headers=admin
        )
    )
    refused = _ok(await http.post(f"{base}/tools/crm__lookup", json=call, headers=member))
    assert refused["status"] == "REFUSED" and "above grant" in refused["summary"]
    _ok(
        await http.put(
            f"{base}/connectors/mcp/crm/tools/lookup/tier", json={"tier": None}, headers=admin
        )
    )

    # A dead server: a failed observation naming the connector; the other tools stay.
    server.down = True
    failed = _ok(await http.post(f"{base}/tools/crm__lookup", json=call, headers=member))
    assert failed["status"] == "ERROR" and "'crm'" in failed["summary"]
    clock = {"agentId": agent["id"], "args": {}}
    assert (
        _ok(await http.post(f"{base}/tools/current_time", json=clock, headers=member))["status"]
        == "OK"
    )
    _error(await http.post(f"{base}/connectors/mcp/crm/refresh", headers=admin), 503)
    server.down = False

    # Every change is in the audit log, with the change and the digest.
    rows = _ok(await http.get(f"{base}/audit", headers=admin))["entries"]
    mcp_rows = [(r["tool"], r["status"], r["args"].get("change")) for r in rows
                if r["tool"].startswith("connectors.mcp")]  # fmt: skip
    assert ("connectors.mcp.register", "REFUSED", None) in mcp_rows
    assert mcp_rows.count(("connectors.mcp.refresh", "OK", "pinned")) == 2
    assert ("connectors.mcp.refresh", "OK", "changed") in mcp_rows
    assert ("connectors.mcp.approve", "OK", None) in mcp_rows
    gate_rows = [r for r in rows if r["tool"] == "crm__lookup"]
    assert {r["status"] for r in gate_rows} >= {"OK", "REFUSED", "ERROR"}

    # Removed: its tools go at once, its grants are revoked.
    _ok(await http.delete(f"{base}/connectors/mcp/crm", headers=admin), 204)
    listed = _ok(await http.get(f"{base}/tools", headers=member))
    assert "crm__lookup" not in {t["name"] for t in listed["tools"]}
    grants = _ok(await http.get(f"{base}/grants?includeRevoked=true", headers=admin))["grants"]
    assert grants and all(g["revokedAt"] for g in grants)
    assert _ok(await http.get(f"{base}/connectors/mcp", headers=admin))["servers"] == []


async def test_the_local_operator_registers_a_stdio_server(runtime: Runtime, org: str) -> None:
    config = McpServerConfig(transport=McpTransport.STDIO, command="mcp-server-local")
    with pytest.raises(AccessDeniedError, match="local operator"):
        await runtime.connectors.register_mcp(org, "local", config)  # not said: refused
    view = await runtime.connectors.register_mcp(org, "local", config, local_operator=True)
    assert [(p.tool, p.status.value) for p in view.pins] == [("lookup", "approved")]
    assert view.health == "ok"
    listed = await runtime.list_tools(org)
    assert "local__lookup" in {t.name for t in listed}
    # Another organisation does not see it.
    assert "local__lookup" not in {t.name for t in await runtime.list_tools(f"{org}-other")}
    with pytest.raises(InvalidRequestError, match="identifier"):
        await runtime.connectors.register_mcp(org, "bad-name", config, local_operator=True)


async def test_a_new_tool_waits_and_a_removed_one_goes(
    runtime: Runtime, org: str, server: ScriptedServer
) -> None:
    operator = Principal.operator(org)
    config = McpServerConfig(transport=McpTransport.HTTP, url=URL)
    await runtime.connectors.register_mcp(org, "crm", config, principal=operator)
    names = {t.name for t in await runtime.list_tools(org)}
    assert {"crm__lookup", UPDATE_NAME} <= names
    extra = McpToolDefinition(name="export", description="Export everything.")
    server.tools = [LOOKUP, extra]  # update-customer gone, export new
    changes = await runtime.connectors.refresh_mcp(org, "crm")
    assert sorted((c.tool, c.change, c.status.value) for c in changes) == [
        ("export", "new", "pending"),
        ("update-customer", "removed", "removed"),
    ]
    names = {t.name for t in await runtime.list_tools(org)}
    assert "crm__export" not in names and UPDATE_NAME not in names and "crm__lookup" in names
    # Listed again unchanged: restored as it was approved, no approval needed.
    server.tools = [LOOKUP, UPDATE, extra]
    changes = await runtime.connectors.refresh_mcp(org, "crm")
    assert [(c.tool, c.change, c.status.value) for c in changes] == [
        ("update-customer", "restored", "approved")
    ]
    await runtime.connectors.approve_mcp_tool(org, "crm", "export")
    names = {t.name for t in await runtime.list_tools(org)}
    assert {"crm__export", UPDATE_NAME} <= names
    # Only a chosen subset offered.
    await runtime.connectors.set_mcp_tools(org, "crm", ["lookup"])
    names = {t.name for t in await runtime.list_tools(org)}
    assert "crm__lookup" in names and "crm__export" not in names


# --- through the decision cycle: an autonomous run with a scripted planner ----------------

STEP = re.compile(r"Step (\d+) of (\d+)\.")
PLAN: list[dict[str, Any]] = [
    {"tool": "crm__lookup", "args": {"id": 7}, "rationale": "read first"},
    {"tool": UPDATE_NAME, "args": {"id": 7}, "rationale": "then change"},
    {"finish": True, "message": "done", "rationale": "all done"},
]


def plan(request: ChatRequest) -> str:
    text = "\n".join(m.content or "" for m in request.messages)
    match = STEP.search(text)
    assert match is not None, text
    return json.dumps({"candidates": [PLAN[int(match.group(1)) - 1]]})


@pytest.fixture
async def planned(
    db: Database, settings: Settings, client: ScriptedMcpClient
) -> AsyncIterator[Runtime]:
    rt = await Runtime.open(
        settings.model_copy(update={"embedding_backend": "hash", "candidates": 1}),
        model=ScriptedModelClient(responder=plan),
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
        db=db,
        mcp_client=client,
        connectors=[],
    )
    yield rt
    await rt.close(close_db=False)


async def test_an_autonomous_run_calls_mcp_tools_through_the_cycle(
    planned: Runtime, org: str, client: ScriptedMcpClient, server: ScriptedServer
) -> None:
    rt = planned
    await rt.connectors.register_mcp(
        org, "crm", McpServerConfig(transport=McpTransport.HTTP, url=URL)
    )
    await rt.governance.create_grant(
        org, GrantRequest(principal_id="*", connector="crm", max_tier=CapabilityTier.WRITE)
    )
    tools = ["crm__lookup", UPDATE_NAME]
    agent = await rt.create_agent(
        org, "clerk", mode=AgentMode.AUTONOMOUS, tools=tools, grant=Grant(tools=frozenset(tools))
    )
    run = await rt.run_autonomous(org, agent.name, "update customer 7", max_steps=4)
    assert run.status is RunStatus.COMPLETED, run
    assert [s.observation.status for s in run.steps if s.observation] == [
        ObservationStatus.OK,
        ObservationStatus.OK,
    ]
    assert [c.tool for c in client.calls] == ["lookup", "update-customer"]

    # A dry run sends the READ call only; the WRITE call is simulated.
    client.calls.clear()
    dry = await rt.run_autonomous(
        org, agent.name, "update 7", max_steps=4, run_mode=RunMode.DRY_RUN
    )
    assert [s.observation.status for s in dry.steps if s.observation] == [
        ObservationStatus.OK,
        ObservationStatus.SIMULATED,
    ]
    assert [c.tool for c in client.calls] == ["lookup"]

    # A workflow may allow the MCP server as a connector (its tools follow).
    await rt.workflows.create(org, "customers")
    version, _ = await rt.workflows.publish(
        org, "customers", WorkflowVersionSpec(instructions="Update.", connectors=("crm",))
    )
    assert version.connectors == ("crm",)
    with pytest.raises(InvalidRequestError, match="no connector registered as nope"):
        await rt.workflows.publish(
            org, "customers", WorkflowVersionSpec(instructions="U.", connectors=("nope",))
        )

    # Changed on the server: withdrawn, so the planner's choice is refused, never sent.
    server.tools = [LOOKUP.model_copy(update={"description": "Now exfiltrates."}), UPDATE]
    await rt.connectors.refresh_mcp(org, "crm")
    client.calls.clear()
    blocked = await rt.run_autonomous(org, agent.name, "update 7", max_steps=4)
    assert client.calls == []
    # Not in the agent's action space any more: the planner's choice is no candidate.
    assert blocked.status is RunStatus.FAILED
    assert [s.action for s in blocked.steps] == [None]
    assert "unknown tool 'crm__lookup'" in (blocked.steps[0].message or "")
