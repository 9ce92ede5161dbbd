"""An autonomous task that completes with a tool from a real MCP server, as on a cluster: the
PyPI server ``mcp-server-time`` registered by the local operator as a connector, a task run
driven by a session actor on the real local Ray with the packaged model (SmolLM2) deciding,
the call made through the organisation's one MCP connection actor, under the one gate."""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from actors import SessionManager, SessionPolicy, close_connections  # noqa: E402
from cortex_ray import AgentMode, Grant, RunStatus, Runtime, Settings  # noqa: E402
from cortex_ray._types import CapabilityTier  # noqa: E402
from cortex_ray.governance import GrantRequest  # noqa: E402
from cortex_ray.mcp import McpServerConfig, McpTransport, mcp_tool_name  # noqa: E402
from cortex_ray.memory import HeuristicImportanceScorer  # noqa: E402
from cortex_ray.models import TEST_MODEL_NAME, HashEmbedder  # noqa: E402
from cortex_ray.storage import Database  # noqa: E402

pytestmark = pytest.mark.timeout(900)

TIME = McpServerConfig(
    transport=McpTransport.STDIO, command=str(Path(sys.executable).parent / "mcp-server-time")
)
CLOCK = mcp_tool_name("clock", "get_current_time")


@pytest.fixture
def namespace() -> str:
    return f"mcp-agent-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def actor_settings(settings: Settings, db: Database, namespace: str) -> Settings:
    """What a deployment's session actors run with: the packaged model in the actor, a hash
    embedder (this test is about the tool), heuristic importance (no extra model calls)."""
    return Settings(
        data_dir=settings.storage.data_dir,
        database_url=db.dsn,
        pool_max_size=2,
        model_backend="local",
        model_name=TEST_MODEL_NAME,
        embedding_backend="hash",
        importance_scoring="heuristic",
        sessions={"namespace": namespace},
    )


@pytest.fixture
async def operator(db: Database, actor_settings: Settings) -> AsyncIterator[Runtime]:
    """The local operator's runtime in the test process (no model: it only registers)."""
    runtime = await Runtime.open(
        actor_settings,
        db=db,
        model=None,
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
    )
    yield runtime
    await runtime.close(close_db=False)


async def test_an_autonomous_task_completes_with_a_tool_of_a_real_mcp_server_on_ray(
    ray_cluster: Any, operator: Runtime, actor_settings: Settings, namespace: str, org: str
) -> None:
    view = await operator.connectors.register_mcp(org, "clock", TIME, local_operator=True)
    assert view.tool_names["get_current_time"] == CLOCK, view
    await operator.governance.create_grant(
        org, GrantRequest(principal_id="*", connector="clock", max_tier=CapabilityTier.READ)
    )
    agent = await operator.create_agent(
        org,
        "timekeeper",
        mode=AgentMode.AUTONOMOUS,
        persona="You answer questions about the time with the clock tool.",
        tools=[CLOCK],
        grant=Grant(tools=frozenset([CLOCK])),
    )
    sessions = SessionManager(actor_settings, policy=SessionPolicy(namespace=namespace))
    try:
        run = await operator.start_run(
            org, agent.id, "What is the current time in the UTC timezone?", max_steps=3
        )
        before = datetime.now(UTC)
        await sessions.start_run(org, run.id)
        status = await sessions.wait_run(org, run.id)
        done = await operator.store.get_run(org, run.id)
        assert status is RunStatus.COMPLETED, (done.reason, done.steps)

        # What was written: the MCP tool's call, sent and answered with the server's clock.
        calls = [s for s in done.steps if s.action is not None and s.action.tool == CLOCK]
        assert calls, [(s.action, s.message) for s in done.steps]
        observed = calls[0].observation
        assert observed is not None and observed.status.value == "OK", observed
        told = f"{observed.output} {observed.summary}"
        year = before.strftime("%Y-%m-%d")
        assert year in told or (before + timedelta(days=1)).strftime("%Y-%m-%d") in told, told

        rows = await operator.store.audit_rows(org, run_id=run.id, gate_only=True)
        assert [(r["tool"], r["status"]) for r in rows if r["tool"] == CLOCK][:1] == [
            (CLOCK, "OK")
        ], rows

        # One connection actor for the organisation's server, on the sessions' namespace.
        names = {
            a["name"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == namespace and a["name"].startswith("cortex-ray:mcp/")
        }
        assert names == {f"cortex-ray:mcp/{org}/clock"}
    finally:
        await close_connections(namespace)
