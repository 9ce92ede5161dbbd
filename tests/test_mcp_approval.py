"""A destructive MCP tool through the decision cycle (real PostgreSQL, scripted planner and MCP
client): its annotation makes it ADMIN, a grant that asks approval for writes pauses the run
before anything is sent, a person's approval sends it once, and a dry run never sends it."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator

import pytest
from fakes import ScriptedMcpClient, ScriptedServer, text_result

from cortex_ray import (
    AgentMode,
    CapabilityTier,
    Grant,
    ObservationStatus,
    Principal,
    RunMode,
    RunStatus,
    Runtime,
    Settings,
)
from cortex_ray.governance import ApprovalPolicy, ApprovalStatus, GrantRequest
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

URL = "http://localhost:8932/mcp"
PURGE = McpToolDefinition(
    name="purge",
    description="Delete every record of a customer.",
    input_schema={"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
    annotations=McpToolAnnotations(destructive_hint=True),
)
PURGE_NAME = mcp_tool_name("crm", "purge")
STEP = re.compile(r"Step (\d+) of (\d+)\.")


def plan(request: ChatRequest) -> str:
    text = "\n".join(m.content or "" for m in request.messages)
    match = STEP.search(text)
    assert match is not None, text
    if match.group(1) == "1":
        action = {"tool": PURGE_NAME, "args": {"id": 7}, "rationale": "as asked"}
    else:
        action = {"finish": True, "message": "purged", "rationale": "done"}
    return json.dumps({"candidates": [action]})


@pytest.fixture
def client() -> ScriptedMcpClient:
    server = ScriptedServer(tools=[PURGE], answers={"purge": text_result("purged customer 7")})
    return ScriptedMcpClient({URL: server})


@pytest.fixture
async def runtime(
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


async def test_a_destructive_mcp_tool_waits_for_a_person_and_a_dry_run_never_sends_it(
    runtime: Runtime, client: ScriptedMcpClient, org: str
) -> None:
    view = await runtime.connectors.register_mcp(
        org, "crm", McpServerConfig(transport=McpTransport.HTTP, url=URL)
    )
    assert [(p.tool, p.status.value) for p in view.pins] == [("purge", "approved")]
    tools = {t.name: t for t in await runtime.list_tools(org)}
    assert tools[PURGE_NAME].tier is CapabilityTier.ADMIN  # destructiveHint
    await runtime.connectors.refresh_mcp(org, "crm")
    await runtime.governance.create_grant(
        org,
        GrantRequest(principal_id="*", connector="crm", max_tier=CapabilityTier.ADMIN,
                     approval=ApprovalPolicy.WRITES),
    )  # fmt: skip
    agent = await runtime.create_agent(
        org, "janitor", mode=AgentMode.AUTONOMOUS, tools=[PURGE_NAME],
        grant=Grant(tools=frozenset([PURGE_NAME])),
    )  # fmt: skip

    # A dry run simulates the call: nothing reaches the server.
    dry = await runtime.run_autonomous(org, agent.name, "purge 7", max_steps=3,
                                       run_mode=RunMode.DRY_RUN)  # fmt: skip
    assert [s.observation.status for s in dry.steps if s.observation] == [
        ObservationStatus.SIMULATED
    ]
    assert client.calls == []

    # A real run pauses on a row before the call, holding nothing.
    run = await runtime.run_autonomous(
        org, agent.name, "purge 7", max_steps=3, principal=Principal(id="bob", org_id=org)
    )
    assert run.status is RunStatus.AWAITING_APPROVAL
    assert client.calls == []
    [request] = await runtime.governance.list_approvals(org, status=ApprovalStatus.PENDING)
    assert (request.tool, request.tier, request.args) == (PURGE_NAME, "admin", {"id": 7})

    # A person approves: the call is sent once, and the run ends with it.
    admin = Principal(id="root", org_id=org, is_admin=True)
    await runtime.governance.decide_approval(org, request.id, approve=True, principal=admin)
    final = await runtime.drive_run(org, run.id)
    assert final.status is RunStatus.COMPLETED, final.reason
    assert [(c.tool, c.arguments) for c in client.calls] == [("purge", {"id": 7})]
    observed = final.steps[0].observation
    assert observed is not None and observed.status is ObservationStatus.OK
    assert "purged customer 7" in observed.summary
